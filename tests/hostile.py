"""Hostile callers that hold something cheap, and the users beside them: what the tests of the
node's front (``tests/integration/test_hostile_callers.py``) and ``bench/hostile.py`` drive.

Every attack is bounded in connections and seconds, goes only to 127.0.0.1, and comes from
another loopback address (``ATTACKER``, 127.0.0.2: the whole of 127.0.0.0/8 is this machine),
as a stranger's calls come from an address of their own. Each returns what it was answered
(status counts; ``None``: no answer before it gave up).
"""

from __future__ import annotations

import collections
import http.client
import socket
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import requests

#: The address hostile clients send from.
ATTACKER = "127.0.0.2"
MiB = 1024 * 1024


def _status_of(sock: socket.socket) -> int | None:
    try:
        head = sock.recv(64)
    except OSError:
        return None
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _request_head(path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def dribble(
    port: int,
    path: str,
    headers: dict[str, str],
    *,
    connections: int = 100,
    length: int = 1000,
    every: float = 2.0,
    seconds: float = 20.0,
) -> collections.Counter[int | None]:
    """``connections`` clients that each declare ``length`` bytes and send one every ``every``
    seconds, until answered or ``seconds`` pass: what each was answered."""

    def one(_: int) -> int | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=every, source_address=(ATTACKER, 0))
        except OSError:
            return None
        with sock:
            try:
                sock.sendall(_request_head(path, headers, length))
            except OSError:
                return None
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                try:
                    answer = sock.recv(64)
                except TimeoutError:
                    try:
                        sock.sendall(b" ")
                    except OSError:
                        return None
                    continue
                except OSError:
                    return None
                parts = answer.split(b" ", 2)
                return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        return None

    with ThreadPoolExecutor(connections) as pool:
        return collections.Counter(pool.map(one, range(connections)))


def abandon(port: int, path: str, headers: dict[str, str], *, connections: int = 40) -> None:
    """``connections`` clients that each declare 1000 bytes, send 10 and hang up."""
    for _ in range(connections):
        with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0)) as sock:
            sock.sendall(_request_head(path, headers, 1000) + b"{" * 10)


def send_as_attacker(port: int, path: str, headers: dict[str, str], body: bytes) -> int | None:
    """One whole request from :data:`ATTACKER`; its status."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0)) as sock:
        sock.sendall(_request_head(path, headers, len(body)) + body)
        return _status_of(sock)


def large_bodies(
    port: int, path: str, headers: dict[str, str], *, at_once: int = 48, rounds: int = 3, size: int = 8 * MiB
) -> collections.Counter[int | None]:
    """``rounds`` of ``at_once`` clients each sending a ``size``-byte body whole (unless the node
    hangs up first): what each was answered."""
    body = b"x" * size
    head = _request_head(path, headers, size)

    def one(_: int) -> int | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(ATTACKER, 0))
        except OSError:
            return None
        with sock:
            try:
                sock.sendall(head)
                sock.sendall(body)
            except OSError:
                pass  # hung up on: its answer may be in already
            return _status_of(sock)

    answered: collections.Counter[int | None] = collections.Counter()
    with ThreadPoolExecutor(at_once) as pool:
        for _ in range(rounds):
            answered.update(pool.map(one, range(at_once)))
    return answered


def keep_alive_after_unread(port: int, token: str, *, rounds: int = 50) -> dict[str, int]:
    """On one connection each time: a call answered without its body being used (405, 403,
    413, 415), then ``GET /api/v1/healthz``. How many of those next requests were answered, and
    how many were dropped."""
    cases = [
        ("POST", "/api/v1/healthz", {"Authorization": f"Token {token}", "Content-Type": "application/json"}, 2000),
        ("POST", "/api/v1/queues", {"Authorization": "Token nope", "Content-Type": "application/json"}, 2000),
        ("POST", "/api/v1/queues", {"Authorization": f"Token {token}", "Content-Type": "application/json"}, 9 * MiB),
        ("POST", "/api/v1/queues", {"Authorization": f"Token {token}", "Content-Type": "text/csv"}, 2000),
    ]
    out = {"answered": 0, "dropped": 0}
    for i in range(rounds):
        method, path, headers, length = cases[i % len(cases)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.putrequest(method, path)
            for k, v in {**headers, "Content-Length": str(length)}.items():
                conn.putheader(k, v)
            conn.endheaders()
            if length < MiB:
                conn.send(b"{" + b" " * (length - 2) + b"}")
            first = conn.getresponse()
            first.read()
            try:
                conn.request("GET", "/api/v1/healthz")
                second = conn.getresponse()
                second.read()
                out["answered" if second.status == 200 else "dropped"] += 1
            except (OSError, http.client.HTTPException):
                # a connection the node closed (it said Connection: close) is a new one for
                # the client, as any client does: never a next request lost on it
                if first.getheader("Connection", "").lower() == "close":
                    out["answered"] += 1
                else:
                    out["dropped"] += 1
        finally:
            conn.close()
    return out


def sqs_dribble_headers(key_id: str, *, json_protocol: bool = True) -> dict[str, str]:
    """The headers of an SQS call signed with ``key_id`` in the right shape, signature made up:
    it cannot be told from a real one before its body."""
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    headers = {
        "Authorization": (
            f"AWS4-HMAC-SHA256 Credential={key_id}/{now[:8]}/us-east-1/sqs/aws4_request, "
            f"SignedHeaders=content-type;host;x-amz-date, Signature={'0' * 64}"
        ),
        "X-Amz-Date": now,
    }
    if json_protocol:
        headers |= {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage"}
    else:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    return headers


class Users:
    """Other users' calls while an attack runs: each of ``calls`` in a loop (a call returns its
    status), with the client's 5 s timeout, until :meth:`stop`. Records the worst latency and
    every call that failed or timed out."""

    def __init__(self, calls: dict[str, Callable[[], int]], *, pause: float = 0.05):
        self.calls, self.pause = calls, pause
        self.latencies: dict[str, list[float]] = {name: [] for name in calls}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(name,), daemon=True) for name in calls]

    def _run(self, name: str) -> None:
        call = self.calls[name]
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status = call()
            except requests.RequestException as exc:
                self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
                status = 0
            took = time.monotonic() - started
            self.latencies[name].append(took)
            if status and status >= 400:
                self.failures.append(f"{name}: {status}")
            self._stop.wait(self.pause)

    def __enter__(self) -> Users:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    @property
    def worst(self) -> float:
        return max((max(v) for v in self.latencies.values() if v), default=0.0)

    def summary(self) -> str:
        parts = []
        for name, took in self.latencies.items():
            if took:
                parts.append(
                    f"{name}: {len(took)} calls, median {statistics.median(took) * 1000:.1f} ms, "
                    f"worst {max(took) * 1000:.1f} ms"
                )
        return "; ".join(parts)
