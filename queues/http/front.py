"""The node's front: an RSGI application (granian's own protocol) in front of the WSGI app.

A request's body is read here, on the worker's event loop, where waiting for a slow client costs
a coroutine and no thread; the WSGI application (Django, the fast path) then runs in a bounded
pool of request threads with the body already in memory. So no request thread ever waits for a
client's body, and what a client may hold while it sends one is bounded here:

- **Size.** A body over ``API_MAX_REQUEST_BYTES`` (by its ``Content-Length``, or as a chunked
  body grows past it) is refused with 413, unread.
- **Rate.** A body must arrive at ``API_BODY_MIN_BYTES_PER_SECOND`` or faster once
  ``API_BODY_READ_GRACE`` seconds have passed; a slower one is cut with 408.
- **Shares.** A body being read counts against its sender: its client address and the credential
  its headers present (a token, an access key ID, a session; not yet checked) together, one
  share (``API_BODY_READS_PER_CALLER`` bodies at once and a quarter of the process's bytes); the
  address alone, whatever credentials it presents (twice that); callers without credentials, all
  together (``API_ANONYMOUS_BODY_READERS`` bodies); and the process (``API_BODY_BYTES_IN_FLIGHT``
  bytes, held until the answer is sent). Past any of them: 429 with ``Retry-After``, unread.
  The pair is the share, so a stranger who knows a key ID (key IDs are not secret) uses up the
  share of that key at the stranger's address only, never its owner's.
- **Before the body.** An app may refuse a request on its headers alone
  (:func:`register_pre_body_check`): the SQS endpoint refuses a signature that cannot be valid
  (wrong shape, a payload left unsigned, a date outside the window) with 403 before the body.
  A body that does not come at once (within ``AT_ONCE``), and every body over ``SMALL_BODY``
  bytes, waits meanwhile for the request's caller to be looked up in a request thread
  (``queues.http.bodies.before_body``): a token or a node's signature that fails, a body to the
  REST API without credentials and an anonymous body over its limit are refused then, unread.

Every refusal made before the body is read whole says ``Connection: close``, so no next request
is read from the rest of an unread body. Each is counted in ``/metrics``
(``mq_front_refusals_total`` by reason).

Once the last body of ``TRIM_AFTER_BYTES`` or more held is answered, the process hands the
freed memory back to the operating system (glibc's ``malloc_trim``), and at start-up the process has large
allocations served by ``mmap`` (``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc from
raising that threshold as large blocks are freed): a burst of large bodies leaves the
process's RSS where it was.

The request threads are ``NODE_THREADS``; past four times as many requests waiting for one,
the next is answered 503 at once. The WSGI environ is built as a WSGI server builds it (PEP 3333);
a header whose name holds ``_`` is dropped (it would read as the ``-`` one in the environ).

A node of several processes also serves each process's private port (``queues.cluster.serving``)
from the same event loop, through granian's embedded server (``granian.server.embed``).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import io
import logging
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from django.conf import settings
from granian.rsgi import ProtocolClosed  # type: ignore[attr-defined]  # (public, re-exported without __all__)
from prometheus_client import Counter

from queues.errors import ServiceError
from queues.http import bodies

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

log = logging.getLogger(__name__)

REFUSALS = Counter(
    "mq_front_refusals",
    "Requests refused by the node's front before the application saw them, by reason "
    "(slow_body 408, too_large 413, over_share 429, busy 503, caller: refused on its credentials, "
    "pre_body: an app's check of the headers)",
    ["reason"],
)

#: Once no body is held after one of this many bytes or more, ``malloc_trim`` runs.
TRIM_AFTER_BYTES = 1024 * 1024
#: A body of at most this many bytes is read in one go (larger ones: chunk by chunk).
SMALL_BODY = 65536
#: Seconds a small body may take to come before its caller is looked up meanwhile.
AT_ONCE = 0.005
#: Seconds after that when it runs again, while no body is held.
TRIM_AGAIN_AFTER = (1.0, 5.0)
#: Allocations of this many bytes or more are served by ``mmap`` (so freed at once).
MMAP_THRESHOLD = 256 * 1024
#: How many requests may wait for a request thread, per thread, before the next is refused (503).
WAITING_PER_THREAD = 4


@dataclass(frozen=True)
class Refusal:
    """An answer made before the application sees the request."""

    #: HTTP status.
    status: int
    #: headers, in order (``Connection: close`` is added to it).
    headers: list[tuple[str, str]]
    #: the body.
    body: bytes


#: ``(method, path, query_string, headers) -> Refusal | None``: an app's check of a request's
#: headers before its body is read (``headers`` has ``get(name)`` with lower-case names).
PreBodyCheck = Callable[[str, str, str, Any], Refusal | None]
_PRE_BODY: list[PreBodyCheck] = []

#: ``(path, headers, status, reason, detail, retry_after) -> Refusal | None``: an app's rendering
#: of the front's own refusals in its protocol (the SQS endpoint's error shapes).
RefusalRenderer = Callable[[str, Any, int, str, str, float | None], Refusal | None]
_RENDERERS: list[RefusalRenderer] = []


def register_pre_body_check(check: PreBodyCheck) -> None:
    """Have ``check`` look at every request with a body before the body is read."""
    if check not in _PRE_BODY:
        _PRE_BODY.append(check)


def register_refusal_renderer(render: RefusalRenderer) -> None:
    """Have ``render`` word the front's refusals for the requests it recognises."""
    if render not in _RENDERERS:
        _RENDERERS.append(render)


# --- whose body: the credential a request presents -------------------------------------------
_AWS_KEY = re.compile(r"AWS4-HMAC-SHA256\s.*?Credential=([^/,\s]{1,128})/")
_QUERY_KEY = re.compile(r"(?:^|&)X-Amz-Credential=([^%/&]{1,128})")
#: the most characters of a credential kept as its share's key
_CRED_CHARS = 128
ANONYMOUS = "anonymous"


def credential_of(headers: Any, query: str) -> str:
    """The credential a request presents, as a share's key: ``token:…``, ``aws:<key ID>``,
    ``peer:…``, ``session:…``, or :data:`ANONYMOUS`. Not checked: a forged one gets a share of
    its own at its sender's address."""
    auth: str | None = headers.get("authorization")
    if auth:
        scheme, _, rest = auth.partition(" ")
        if scheme.lower() == "token":
            return "token:" + rest.strip()[:_CRED_CHARS]
        match = _AWS_KEY.match(auth)
        if match is not None:
            return "aws:" + match[1]
        return "auth:" + auth[:_CRED_CHARS]
    if "X-Amz-Credential" in query:
        match = _QUERY_KEY.search(query)
        if match is not None:
            return "aws:" + match[1]
    if headers.get("x-mq-cluster-signature") is not None:
        return "peer"
    cookie: str | None = headers.get("cookie")
    if cookie:
        name = settings.SESSION_COOKIE_NAME + "="
        at = cookie.find(name)
        if at >= 0:
            return "session:" + cookie[at + len(name) :].partition(";")[0][:_CRED_CHARS]
    return ANONYMOUS


@dataclass
class _Held:
    bodies: int = 0
    bytes: int = 0


@dataclass
class Shares:
    """What the bodies being read, and the bytes held, of each sender add up to (event loop only:
    no lock). ``take`` reserves ``size`` bytes and one body being read, or says which share is
    full; ``read`` ends the body's read (the bytes stay held); ``release`` gives the bytes back."""

    per_caller: int
    per_address: int
    anonymous: int
    bytes_total: int
    by_caller: dict[tuple[str, str], _Held] = field(default_factory=dict)
    by_address: dict[str, _Held] = field(default_factory=dict)
    anonymous_reading: int = 0
    bytes_held: int = 0

    def take(self, address: str, credential: str, size: int) -> str | None:
        """None when taken, else the share that is full (for the answer's detail)."""
        caller = self.by_caller.get((address, credential))
        at = self.by_address.get(address)
        if caller is not None and (
            caller.bodies >= self.per_caller or caller.bytes + size > max(self.bytes_total // 4, size)
        ):
            return "this caller's"
        if at is not None and (at.bodies >= self.per_address or at.bytes + size > max(self.bytes_total // 2, size)):
            return "this address's"
        if credential == ANONYMOUS and self.anonymous_reading >= self.anonymous:
            return "the unauthenticated callers'"
        if self.bytes_held and self.bytes_held + size > self.bytes_total:
            return "this process's"
        if caller is None:
            caller = self.by_caller[(address, credential)] = _Held()
        if at is None:
            at = self.by_address[address] = _Held()
        caller.bodies += 1
        caller.bytes += size
        at.bodies += 1
        at.bytes += size
        self.bytes_held += size
        if credential == ANONYMOUS:
            self.anonymous_reading += 1
        return None

    def read(self, address: str, credential: str) -> None:
        self.by_caller[(address, credential)].bodies -= 1
        self.by_address[address].bodies -= 1
        if credential == ANONYMOUS:
            self.anonymous_reading -= 1

    def release(self, address: str, credential: str, size: int) -> None:
        key = (address, credential)
        caller, at = self.by_caller[key], self.by_address[address]
        caller.bytes -= size
        at.bytes -= size
        self.bytes_held -= size
        if not caller.bodies and not caller.bytes:
            del self.by_caller[key]
        if not at.bodies and not at.bytes:
            del self.by_address[address]


class SlowBody(ServiceError):
    """The client sent its body slower than the minimum rate (408)."""

    code, status = "request_timeout", 408


class BodyTooLarge(ServiceError):
    """A body over the limit, by its Content-Length or as it grew (413)."""

    code, status = "payload_too_large", 413


class BadLength(ServiceError):
    """A Content-Length that is no number (400)."""

    code, status = "bad_request", 400


class SharesTaken(ServiceError):
    """A share of bodies being read or held is full (429: retry)."""

    code, status, retry_after = "throttled", 429, 1


class ThreadsBusy(ServiceError):
    """Every request thread is busy and enough requests wait for one (503: retry)."""

    code, status, retry_after = "unavailable", 503, 1


class CallerRefused(ServiceError):
    """The request's headers alone refuse it (``queues.http.bodies.before_body``): a token or a
    node's signature that fails, a body to the REST API without credentials, an anonymous body
    over its limit."""

    def __init__(self, status_line: str, code: str, detail: str, extra: list[tuple[str, str]]):
        super().__init__(detail)
        self.status, self.code, self.extra = int(status_line[:3]), code, extra

    def headers(self) -> dict[str, str]:
        return dict(self.extra)


class BodyIncomplete(ServiceError):
    """The client stopped before the length it declared (nobody is left to answer)."""

    code, status = "incomplete_body", 400


_REASONS: dict[type[ServiceError], str] = {SlowBody: "slow_body", BodyTooLarge: "too_large", CallerRefused: "caller"}


# --- memory ------------------------------------------------------------------------------------
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def tune_malloc() -> None:
    """Large allocations by ``mmap``, at a fixed threshold (glibc only; elsewhere nothing)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim_malloc() -> None:
    """Free what only reference cycles still hold (a refused request's exception keeps its frames,
    and with them its body, until the collector runs, which a serving process runs rarely:
    ``config.node``), then hand the heap's free memory back to the operating system (glibc only)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


# --- WSGI ----------------------------------------------------------------------------------------
#: header name -> environ key ("": dropped); bounded (names are the clients' to choose).
_KEYS: dict[str, str] = {"content-type": "CONTENT_TYPE", "content-length": "CONTENT_LENGTH"}
_MAX_KEYS = 4096


def _environ_key(name: str) -> str:
    key = _KEYS.get(name)
    if key is None:
        key = "" if "_" in name else "HTTP_" + name.upper().replace("-", "_")
        if len(_KEYS) < _MAX_KEYS:
            _KEYS[name] = key
    return key


def _host_port(address: str) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def run_wsgi(app: WSGIApplication, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    """Call ``app`` (in a request thread): its status, headers and whole body."""
    started: list[Any] = []
    chunks: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [status, headers]
        return chunks.append

    result = app(environ, start_response)
    try:
        chunks.extend(chunk for chunk in result if chunk)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    return int(status[:3]), list(headers), b"".join(chunks)


class Front:
    """The RSGI application granian serves: see the module docstring. ``app``: the WSGI
    application; ``threads``: its request threads; ``private``: ``(host, port)`` of this
    process's private port, served too (a node of several processes), or None."""

    def __init__(self, app: WSGIApplication, *, threads: int, private: tuple[str, int] | None = None):
        self.app = app
        self.threads = max(1, threads)
        self.private = private
        self.max_bytes = settings.API_MAX_REQUEST_BYTES
        self.grace = settings.API_BODY_READ_GRACE
        self.rate = settings.API_BODY_MIN_BYTES_PER_SECOND
        self.shares = Shares(
            per_caller=settings.API_BODY_READS_PER_CALLER,
            per_address=2 * settings.API_BODY_READS_PER_CALLER,
            anonymous=settings.API_ANONYMOUS_BODY_READERS,
            bytes_total=settings.API_BODY_BYTES_IN_FLIGHT,
        )
        self.max_waiting = self.threads * (1 + WAITING_PER_THREAD)
        self.running = 0
        self._trim_due = False
        self.pool: ThreadPoolExecutor | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the embedded server of the private port (held for the process's life)
        self._servers: list[Any] = []
        self._multiprocess = settings.NODE_PROCESSES > 1

    # -- granian's hooks --
    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="request")
        tune_malloc()
        if self.private is not None:
            from granian.constants import Interfaces
            from granian.server.embed import Server

            host, port = self.private
            server = Server(_Served(self), address=host, port=port, interface=Interfaces.RSGI, backlog=2048)
            self._servers.append(server)
            task = loop.create_task(server.serve())
            task.add_done_callback(self._private_ended)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _private_ended(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the private port %s stopped serving: %s", self.private, task.exception())

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        try:
            await self._serve(scope, proto)
        except ProtocolClosed:
            pass  # the client hung up (mid-body, or before its answer): nobody to answer

    async def _serve(self, scope: Any, proto: Any) -> None:
        headers = scope.headers
        length = headers.get("content-length")
        chunked = "chunked" in (headers.get("transfer-encoding") or "").lower()
        if not chunked and (not length or length == "0"):
            await self._respond(scope, proto, headers, b"", 0)
            return
        if chunked:
            size, declared = self.max_bytes, None
        elif length.isascii() and length.isdigit():
            size = declared = int(length)
            if size > self.max_bytes:
                refused = BodyTooLarge(f"request body of {size} bytes is over the limit of {self.max_bytes} bytes")
                self._refuse(scope, proto, headers, refused, "too_large")
                return
        else:
            self._refuse(scope, proto, headers, BadLength("Content-Length must be a number of bytes"), "bad_length")
            return
        for check in _PRE_BODY:
            refusal = check(scope.method, scope.path, scope.query_string, headers)
            if refusal is not None:
                REFUSALS.labels("pre_body").inc()
                proto.response_bytes(refusal.status, [*refusal.headers, ("Connection", "close")], refusal.body)
                return
        address = _host_port(scope.client)[0]
        credential = credential_of(headers, scope.query_string)
        full = self.shares.take(address, credential, size)
        if full is not None:
            taken = SharesTaken(f"{full} share of bodies being read or held is taken; retry")
            self._refuse(scope, proto, headers, taken, "over_share")
            return
        try:
            try:
                body, learnt = await self._read(scope, proto, headers, declared)
            finally:
                self.shares.read(address, credential)
            await self._respond(scope, proto, headers, body, len(body), learnt)
        except (SlowBody, BodyTooLarge, CallerRefused) as refused:
            self._refuse(scope, proto, headers, refused, _REASONS[type(refused)])
        except BodyIncomplete:
            pass  # the client is gone: nobody to answer
        finally:
            # (whatever ended the request: a client gone mid-body, a cancellation)
            self._release(address, credential, size)

    def _release(self, address: str, credential: str, size: int) -> None:
        self.shares.release(address, credential, size)
        if size >= TRIM_AFTER_BYTES:
            self._trim_due = True
        if self._trim_due and not self.shares.bytes_held:
            # The last large body is gone: what the reads and the parsing freed goes back to the
            # system now, and again once the connections refused meanwhile have closed (granian
            # frees their buffers in its own threads' arenas), not at some later request.
            self._trim_due = False
            trim_malloc()
            assert self.loop is not None
            for delay in TRIM_AGAIN_AFTER:
                self.loop.call_later(delay, self._trim_if_idle)

    def _trim_if_idle(self) -> None:
        if not self.shares.bytes_held:
            trim_malloc()

    # -- the body --
    async def _read(self, scope: Any, proto: Any, headers: Any, declared: int | None) -> tuple[bytes, dict[str, Any]]:
        """The body, read while it keeps to the rate; if it does not come at once, whether its
        caller is refused on the headers (``bodies.before_body``, in a request thread) is asked
        meanwhile, and a refused caller's body is left unread. Raises SlowBody, BodyTooLarge,
        BodyIncomplete, CallerRefused. With the body, what the caller's check learnt (see
        :meth:`_check_caller`; empty when none was made)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        learnt: dict[str, Any] = {}
        if declared is not None and declared <= SMALL_BODY:
            # One read: a small body comes whole with its headers, nearly always.
            reading = asyncio.ensure_future(proto())
            try:
                async with asyncio.timeout(AT_ONCE):
                    body: bytes = await asyncio.shield(reading)
            except TimeoutError:
                due = start + self.grace + declared / self.rate
                body, learnt = await self._read_while_checked(scope, headers, reading, due)
            if len(body) != declared:
                raise BodyIncomplete(f"{len(body)} of {declared} bytes came")
            return body, learnt
        # A large or chunked body: its caller first (one request thread's turn, against the time
        # such a body takes to come).
        learnt = await self._check_caller(scope, headers)
        chunks: list[bytes] = []
        received = 0
        try:
            async with asyncio.timeout_at(start + self.grace + 1 / self.rate) as deadline:
                async for chunk in proto:
                    received += len(chunk)
                    if received > self.max_bytes:
                        raise BodyTooLarge(f"request body over the limit of {self.max_bytes} bytes")
                    chunks.append(chunk)
                    # the next byte is due by when the bytes so far would still be on time
                    deadline.reschedule(start + self.grace + (received + 1) / self.rate)
        except TimeoutError:
            raise SlowBody(f"the body came slower than {self.rate} bytes a second") from None
        if declared is not None and received != declared:
            raise BodyIncomplete(f"{received} of {declared} bytes came")
        return b"".join(chunks), learnt

    async def _read_while_checked(
        self, scope: Any, headers: Any, reading: asyncio.Future[Any], due: float
    ) -> tuple[bytes, dict[str, Any]]:
        checking = asyncio.ensure_future(self._check_caller(scope, headers))
        try:
            async with asyncio.timeout_at(due):
                done, _ = await asyncio.wait({reading, checking}, return_when=asyncio.FIRST_COMPLETED)
                if checking in done:
                    learnt: dict[str, Any] = checking.result()  # (raises CallerRefused)
                    body: bytes = await reading
                    return body, learnt
                body = await reading
                # the check has begun (it may have taken a node's nonce): its answer is wanted
                return body, await checking
        except TimeoutError:
            raise SlowBody(f"the body came slower than {self.rate} bytes a second") from None
        finally:
            reading.cancel()
            checking.cancel()

    async def _check_caller(self, scope: Any, headers: Any) -> dict[str, Any]:
        """Raise CallerRefused when the request's headers alone refuse it (``bodies``); else
        what the check learnt and left in its environ (a node's signature checked: the replay
        guard takes a second check for a replay), for the application's environ."""
        environ = self._environ(scope, headers, b"", 0)
        before = set(environ)
        for name in ("content-length", "transfer-encoding"):
            value = headers.get(name)
            if value is not None:
                environ[_environ_key(name)] = value
            else:
                environ.pop(_environ_key(name), None)
        assert self.pool is not None
        _, refused = await asyncio.get_running_loop().run_in_executor(self.pool, bodies.before_body, environ)
        if refused is not None:
            raise CallerRefused(*refused)
        return {k: v for k, v in environ.items() if k not in before}

    # -- answers --
    def _refuse(self, scope: Any, proto: Any, headers: Any, refused: ServiceError, reason: str) -> None:
        """Answer ``refused`` (its status, code, detail and Retry-After), worded by an app's
        renderer where one recognises the request; the connection closes after it."""
        REFUSALS.labels(reason).inc()
        for render in _RENDERERS:
            refusal = render(scope.path, headers, refused.status, refused.code, refused.detail, refused.retry_after)
            if refusal is not None:
                proto.response_bytes(refusal.status, [*refusal.headers, ("Connection", "close")], refusal.body)
                return
        extra = list(refused.headers().items())
        proto.response_bytes(
            refused.status,
            [("Content-Type", "application/json"), *extra, ("Connection", "close")],
            orjson.dumps(refused.body()),
        )

    async def _respond(
        self, scope: Any, proto: Any, headers: Any, body: bytes, size: int, learnt: dict[str, Any] | None = None
    ) -> None:
        if self.running >= self.max_waiting:
            self._refuse(scope, proto, headers, ThreadsBusy("every request thread is busy; retry"), "busy")
            return
        environ = self._environ(scope, headers, body, size)
        if learnt:
            environ.update(learnt)
        assert self.loop is not None and self.pool is not None
        self.running += 1
        try:
            status, out, content = await self.loop.run_in_executor(self.pool, run_wsgi, self.app, environ)
        except Exception:
            log.exception("the application failed outside its own error handling")
            status, out, content = 500, [("Content-Type", "application/json")], b'{"error": "server_error"}'
        finally:
            self.running -= 1
        proto.response_bytes(status, out, content)

    def _environ(self, scope: Any, headers: Any, body: bytes, size: int) -> dict[str, Any]:
        server_host, server_port = _host_port(scope.server)
        client_host, client_port = _host_port(scope.client)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": scope.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": scope.path.encode("utf-8", "surrogateescape").decode("latin-1"),
            "QUERY_STRING": scope.query_string,
            "SERVER_NAME": server_host,
            "SERVER_PORT": server_port,
            "SERVER_PROTOCOL": "HTTP/" + scope.http_version,
            "REMOTE_ADDR": client_host,
            "REMOTE_PORT": client_port,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": scope.scheme,
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": self._multiprocess,
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,
        }
        for name, value in headers.items():
            key = _environ_key(name)
            if not key:
                continue
            if key in environ:
                environ[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                environ[key] = value
        if size or "CONTENT_LENGTH" in environ:
            environ["CONTENT_LENGTH"] = str(size)
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        return environ


class _Served:
    """The front as the private port's embedded server calls it (no second ``__rsgi_init__``)."""

    def __init__(self, front: Front):
        self.front = front

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        await self.front.__rsgi__(scope, proto)
