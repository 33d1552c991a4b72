"""Real node processes on loopback, for the integration tests.

A test that uses them must commit its data (``django_db(transaction=True)``) so the node
processes, which connect to the same test database, can see it.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports, below the ephemeral range (32768+), so
    that the client connections of earlier tests cannot be sitting on them."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def free_port() -> int:
    return free_ports(1)


def database_url() -> str:
    """The URL of the database this test process uses (the pytest-django test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class NodeProcess:
    def __init__(self, env: dict[str, str], log_dir: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env, "NODE_HEARTBEAT": env.get("NODE_HEARTBEAT", "0.5")}
        self.log_path = log_dir / f"node-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> NodeProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runnode", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # runnode and its worker: signals go to the whole group
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if requests.get(f"{self.url}/api/v1/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"node on {self.port} did not answer within {timeout}s; see {self.log_path}")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the node's process group (the server and its worker)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no leases released, no buffers flushed by us."""
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Graceful stop (SIGTERM: leases released); SIGKILL if it hangs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Client:
    """A thin API client for tests (the SDK proper lives in ``workers``)."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def post(self, path: str, payload: dict, timeout: float = 30) -> requests.Response:
        return self.session.post(f"{self.base}/api/v1/{path}", json=payload, timeout=timeout)

    def get(self, path: str, timeout: float = 30) -> requests.Response:
        return self.session.get(f"{self.base}/api/v1/{path}", timeout=timeout)


def wait_until(predicate, timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; the seconds it took. Fails the test after ``timeout``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def drain(c: Client, path: str, *, batch: int = 100, timeout: float = 60) -> list[dict]:
    """Dequeue from ``path`` (a queue's or a subscription's, ``queues/q`` or ``topics/t/subscriptions/s``)
    and ack, until three empty answers in a row; 503 (a takeover in progress) is retried. The
    messages, in the order they came."""
    out: list[dict] = []
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 3:
        assert time.monotonic() < deadline, f"{path}: still draining after {timeout}s ({len(out)} so far)"
        r = c.post(f"{path}/dequeue", {"max": batch, "visibility_timeout": 120})
        if r.status_code == 503:
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        got = r.json()["messages"]
        if not got:
            quiet += 1
            time.sleep(0.2)
            continue
        quiet = 0
        out.extend(got)
        r = c.post(f"{path}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
        assert r.status_code == 200, r.text
    return out
