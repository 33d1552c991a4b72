"""HTTP to the nodes: sessions, the auth headers, the round robin, retries and backoff.

A 4xx other than 408 and 429 is never retried (the call was wrong and changed nothing). A 429 (a
node's cap on concurrent long polls or consumers) and a 408 (the node timed out reading the
request: nothing wrong with it) are retried like a 5xx. A 5xx (503 means "this
partition is not served here right now") and a connection error are retried up to ``retries``
times with exponential backoff and full jitter, honouring ``Retry-After``, each time on the next
node of the round robin. A node that refused a connection is skipped for a short while.

A call may name an ``owner`` (``scheme://host:port``) to try first: that try is a shortcut, so
when it fails the call goes round robin at once with all its retries, the owner is left alone
for a moment, and ``on_owner_failed`` is told (the client drops its cached owners).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Any

import requests

from mq_client import tracing
from mq_client.errors import ApiError, ConnectionFailed, error_from_answer

try:  # the service's own JSON codec when present; the standard library otherwise
    import orjson

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(raw: bytes) -> Any:
        return orjson.loads(raw)
except ImportError:  # pragma: no cover - orjson is in the service's requirements

    def dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")

    def loads(raw: bytes) -> Any:
        return json.loads(raw)


__all__ = ["API_PREFIX", "Answer", "Done", "Step", "Transport", "answer_json", "dumps", "loads", "retry_after"]

API_PREFIX = "/api/v1"


def retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delta seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def answer_json(status: int, content: bytes) -> Any:
    """An answer's JSON; None when empty; the API's error shape around what is not JSON."""
    if not content:
        return None
    try:
        return loads(content)
    except ValueError:
        return {"error": f"http_{status}", "detail": content[:500].decode("utf-8", "replace")}


class Done:
    """The end of a call's tries (:meth:`Transport.attempts`): the answer's JSON."""

    __slots__ = ("answer",)

    def __init__(self, answer: Any) -> None:
        self.answer = answer


#: What a call's tries ask of their driver: send to a base URL, sleep seconds, or done.
Step = str | float | Done  # (an int sleeps too)
#: An answer: status, JSON (or None), headers.
Answer = tuple[int, Any, Mapping[str, str]]


class _Node:
    """One base URL of the round robin and how it has been doing."""

    __slots__ = ("down_until", "failures", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.failures = 0
        self.down_until = 0.0


class Transport:
    """Calls of the API on a set of nodes, retried as the module says. Thread-safe: each thread
    gets its own ``requests.Session`` (connection pool); the round robin and the node health are
    shared under a lock.

    :param urls: base URLs of the nodes (``http://host:port``; ``host:port`` means http)
    :param token: the API token, sent as ``Authorization: Token <token>``
    :param on_owner_failed: told the path of a call whose direct try on its owner failed
    """

    def __init__(
        self,
        urls: Sequence[str],
        token: str,
        *,
        timeout: float,
        retries: int,
        backoff: float,
        max_backoff: float,
        node_quarantine: float,
        user_agent: str,
        on_owner_failed: Callable[[str], None] = lambda path: None,
    ) -> None:
        cleaned = [u.strip().rstrip("/") for u in urls if u and u.strip()]
        if not cleaned:
            raise ValueError("give at least one node URL")
        cleaned = [u if "://" in u else f"http://{u}" for u in cleaned]
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("retries and backoff must be >= 0, timeout > 0")
        self.nodes = [_Node(u) for u in dict.fromkeys(cleaned)]
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.node_quarantine = node_quarantine
        self.scheme = cleaned[0].split("://", 1)[0]
        self.headers = {
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": user_agent,
        }
        self.on_owner_failed = on_owner_failed
        #: whether each request carries the current trace context (``traceparent``): set by the
        #: client when an OpenTelemetry SDK is configured
        self.traced = False
        #: how the backoff waits (tests replace it to record the delays)
        self.sleep: Callable[[float], None] = time.sleep
        self._lock = threading.Lock()
        self._next = 0
        self._unreachable: dict[str, float] = {}  # owner URL -> monotonic time to try it again
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        _LIVE.add(self)

    @property
    def urls(self) -> list[str]:
        """The nodes of the round robin, in order."""
        return [n.url for n in self.nodes]

    def owner_url(self, address: str | None) -> str | None:
        """``scheme://address``, unless that owner could not be reached a moment ago."""
        if not address:
            return None
        url = f"{self.scheme}://{address}"
        with self._lock:
            until = self._unreachable.get(url)
        return None if until is not None and until > time.monotonic() else url

    def session(self) -> requests.Session:
        """This thread's session."""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update(self.headers)
            session.trust_env = False  # no proxies or .netrc from the environment between nodes
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        """Close every thread's connections. The transport stays usable (new sessions open)."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
        self._local = threading.local()

    def once(
        self, method: str, base: str, path: str, payload: Any, timeout: float
    ) -> tuple[int, Any, Mapping[str, str]]:
        """One HTTP request: ``(status, JSON or None, headers)``; raises requests' exceptions."""
        data = None if payload is None else dumps(payload)
        headers: dict[str, str] | None = None
        if self.traced:  # the current span's context, for the node's spans to join its trace
            headers = {}
            tracing.inject(headers)
        r = self.session().request(
            method, f"{base}{API_PREFIX}/{path}", data=data, headers=headers, timeout=(min(timeout, 5.0), timeout)
        )
        return r.status_code, answer_json(r.status_code, r.content), r.headers

    def call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        owner: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> Any:
        """The call on ``owner`` first if given, else round robin; retried as the module says.
        The answer's JSON (``{}`` when empty), or the typed :class:`ApiError`."""
        timeout = self.timeout if timeout is None else timeout
        plan = self.attempts(path, owner, retries)
        step = next(plan)
        while True:
            if isinstance(step, Done):
                return step.answer
            if not isinstance(step, str):
                self.sleep(step)
                step = plan.send(None)
                continue
            try:
                outcome: Answer | str = self.once(method, step, path, payload, timeout)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                outcome = str(exc)
            step = plan.send(outcome)

    def attempts(self, path: str, owner: str | None, retries: int | None) -> Generator[Step, Answer | str | None, None]:
        """The tries of one call, as a generator that the synchronous :meth:`call` and the asyncio
        client (:mod:`mq_client.aio`) both drive, so that they route and retry alike: it yields a
        base URL to send the request to (and is sent back the answer ``(status, JSON, headers)``,
        or the text of a connection error), a float to sleep that many seconds (sent back None),
        and :class:`Done` with the answer's JSON; it raises the typed :class:`ApiError`."""
        retries = self.retries if retries is None else retries
        if owner is not None:
            retries += 1  # the direct try is a shortcut: the round robin keeps all its tries
        tried: set[str] = set()
        last: ApiError | None = None
        for attempt in range(retries + 1):
            direct = owner is not None and attempt == 0
            base = owner if direct and owner is not None else self._pick_node(tried).url
            tried.add(base)
            outcome = yield base
            if isinstance(outcome, str):  # no answer: refused, reset, timed out
                last = ConnectionFailed(0, "connection_failed", f"{base}: {outcome}", url=base)
                if direct:
                    self.on_owner_failed(path)
                    with self._lock:
                        self._unreachable[base] = time.monotonic() + self.node_quarantine
                else:
                    self._node_failed(base)
                # A node not tried yet in this call is tried at once; else back off.
                if not direct and attempt < retries and not self._untried(tried):
                    yield self._delay(attempt, None)
                continue
            assert outcome is not None
            status, body, headers = outcome
            if status < 400:
                if not direct:
                    self._node_ok(base)
                yield Done(body if body is not None else {})
                return
            error = error_from_answer(status, body if isinstance(body, dict) else {"detail": body}, base)
            if status < 500 and status not in (408, 429):
                raise error
            last = error  # 5xx, 429 (a node's cap on long polls or consumers), 408: later may do
            if direct:  # the owner moved or is failing: the round robin, at once
                self.on_owner_failed(path)
            elif attempt < retries:
                yield self._delay(attempt, retry_after(headers.get("Retry-After")))
        assert last is not None
        raise last

    def after_fork(self) -> None:
        """In a child process: new locks and no connections of the parent's (a socket shared
        with the parent would interleave two processes' requests)."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions = []

    def _pick_node(self, tried: set[str]) -> _Node:
        """The next node of the round robin, preferring ones up and not tried in this call."""
        now = time.monotonic()
        with self._lock:
            n = len(self.nodes)
            order = [self.nodes[(self._next + i) % n] for i in range(n)]
            choice = (
                next((x for x in order if x.down_until <= now and x.url not in tried), None)
                or next((x for x in order if x.down_until <= now), None)
                or next((x for x in order if x.url not in tried), None)
                or min(order, key=lambda x: x.down_until)
            )
            self._next = (self.nodes.index(choice) + 1) % n
            return choice

    def _node_ok(self, url: str) -> None:
        for node in self.nodes:
            if node.url == url and node.failures:
                with self._lock:
                    node.failures, node.down_until = 0, 0.0

    def _node_failed(self, url: str) -> None:
        for node in self.nodes:
            if node.url == url:
                with self._lock:
                    node.failures += 1
                    node.down_until = time.monotonic() + self.node_quarantine * min(8, 2 ** (node.failures - 1))

    def _untried(self, tried: set[str]) -> bool:
        now = time.monotonic()
        return any(n.url not in tried and n.down_until <= now for n in self.nodes)

    def _delay(self, attempt: int, at_least: float | None) -> float:
        """Full jitter: uniform in [0, backoff * 2^attempt], at least Retry-After, at most max_backoff."""
        delay = random.uniform(0, self.backoff * (2**attempt))  # noqa: S311 - jitter, not a secret
        if at_least is not None:
            delay = max(delay, at_least)
        return min(delay, self.max_backoff)


#: Every transport of this process, renewed in a forked child (:meth:`Transport.after_fork`).
_LIVE: weakref.WeakSet[Transport] = weakref.WeakSet()


def _renew_in_child() -> None:
    for transport in list(_LIVE):
        transport.after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_in_child)
