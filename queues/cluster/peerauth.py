"""How one node proves to another that a forwarded call is its own: an HMAC, never the secret.

A forwarded call carries, beside the usual request, ``X-MQ-Hops``, ``X-MQ-On-Behalf-Of`` (the
user it acts for; absent: the node's own call), ``X-MQ-Cluster-Timestamp`` (Unix seconds),
``X-MQ-Cluster-Nonce`` (random), ``X-MQ-Cluster-Content-SHA256`` (the body's SHA-256, hex) and
``X-MQ-Cluster-Signature``: HMAC-SHA256 under ``settings.CLUSTER_SECRET`` of ::

    MQ-HMAC-SHA256-v2 \\n METHOD \\n /path?query \\n sha256(body) hex \\n hops \\n on-behalf-of \\n timestamp \\n nonce \\n to

so a signature fits one request only: another method, path, body, hop count or user breaks it.
The body enters through its hash, which travels in a header: the receiver checks the signature
(:func:`verify_headers`) before it reads a byte of the body, and then the body against the
signed hash (:func:`check_body`). A caller that only claims to be a node (a forged or replayed
signature) is refused without its body being read, so it cannot make a node buffer or wait for
one.
``to`` (``X-MQ-Cluster-To``) is the address the call was sent to, the ``Node.address`` of the
process meant to answer it; a node process refuses a call signed for another address
(:data:`ADDRESS`), so a captured call replayed to another process, of this node (its siblings
share the public port: ``queues.cluster.serving``) or of another, is refused there, and the one process
it may reach remembers it.
The receiver (:func:`verify`) refuses a bad signature, a timestamp more than
``settings.CLUSTER_CLOCK_SKEW`` (30 s) off its clock, and a signature it has already accepted
(a replay), and one whose timestamp is earlier than this process's start (:data:`STARTED`, on the cluster's clock):
a restarted process has forgotten what it accepted before, so a call captured before the
restart is refused, not replayed. Accepted signatures are remembered by this process (:class:`SeenSignatures`) until
their timestamp has left the window, after which the timestamp check refuses a replay anyway;
so the set holds at most the calls of about twice the window. A signature is accepted by one
process only (``to``), so this process's set sees every acceptance of it. It is bounded
(``SEEN_MAX``): full of live entries, a call is refused as retryable (503) rather than a
signature forgotten.

Headers a client sends without a valid signature carry no weight: its ``X-MQ-Hops`` is
ignored (hop 0) and ``X-MQ-On-Behalf-Of`` is never read. The pre-HMAC header
``X-MQ-Cluster-Secret`` is refused outright, so a node of an older version fails loudly.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from django.conf import settings

from queues.cluster import clock
from queues.errors import Refused, Unavailable

#: beside a forwarded call: the HMAC (hex) over the request; see the module docstring.
SIGNATURE_HEADER = "X-MQ-Cluster-Signature"
#: the Unix time (seconds, as a decimal) the call was signed at.
TIMESTAMP_HEADER = "X-MQ-Cluster-Timestamp"
#: random, so two identical calls within a second are two signatures.
NONCE_HEADER = "X-MQ-Cluster-Nonce"
HOPS_HEADER = "X-MQ-Hops"
#: the user (id, or ``system``) a forwarded call acts for; absent: the node's own call.
ON_BEHALF_HEADER = "X-MQ-On-Behalf-Of"
#: the address (``Node.address``) the call is meant for.
TO_HEADER = "X-MQ-Cluster-To"
#: the body's SHA-256 (hex), under the signature.
CONTENT_HEADER = "X-MQ-Cluster-Content-SHA256"
#: the header of the old scheme (the secret itself in clear): refused.
LEGACY_SECRET_HEADER = "X-MQ-Cluster-Secret"  # noqa: S105 - a header name, not a secret

#: signatures remembered at most, so their memory is bounded (its size: docs/explanation/performance.md);
#: 100,000 in 60 s (twice the default window) is 1,666 forwarded calls a second into one node.
SEEN_MAX = 100_000
_SCHEME = b"MQ-HMAC-SHA256-v2"
_HEX64 = re.compile(r"[0-9a-f]{64}")

#: Signatures made before this (Unix seconds on this node's wall clock, read on the cluster's
#: clock: when this module was loaded, before the process serves or registers its address) are refused: the replay guard (:data:`SEEN`) lives in this
#: process's memory, so it cannot know what an earlier process at this address accepted. A
#: peer's clock behind this one by more than the time between this process's start and its
#: first call would see that first call refused (401), as a clock off by more than the window.
STARTED = time.time()

#: where :func:`verify_headers` leaves its answer in the request's environ (checked once).
VERIFIED_KEY = "mq.peer_call"

#: This process's node address, set when its runtime starts serving (``config.node``): a call
#: signed for another address is refused. None (in-process tests): any ``to`` is accepted.
ADDRESS: str | None = None


def meta_key(header: str) -> str:
    """A header's key in a WSGI environ / ``request.META``."""
    return "HTTP_" + header.upper().replace("-", "_")


SIGNATURE_META = meta_key(SIGNATURE_HEADER)
LEGACY_SECRET_META = meta_key(LEGACY_SECRET_HEADER)


class PeerAuthFailed(Refused):
    """A call that claims to come from a node and does not prove it (401)."""

    code = "authentication_failed"
    status = 401


class PeerAuthBusy(Unavailable):
    """The replay guard is full of live signatures: retry soon (503)."""

    node_failure = False


@dataclass(frozen=True)
class PeerCall:
    """What a verified forwarded call says about itself."""

    #: the hop count it was signed with (0..MAX_HOPS after ``router.hops_of``)
    hops: str
    #: the user it acts for (``X-MQ-On-Behalf-Of``), None: the node's own call
    on_behalf: str | None
    #: the SHA-256 (hex) of the body it was signed with (:func:`check_body`)
    content_sha256: str = field(default="", compare=False)


def _message(
    method: str, path: str, content_sha256: str, hops: str, on_behalf: str, timestamp: str, nonce: str, to: str
) -> bytes:
    parts = (method.upper(), path, content_sha256, hops, on_behalf, timestamp, nonce, to)
    return b"\n".join((_SCHEME, *(p.encode("utf-8", "surrogateescape") for p in parts)))


def _mac(message: bytes) -> str:
    return hmac.new(settings.CLUSTER_SECRET.encode(), message, hashlib.sha256).hexdigest()


def sign(
    method: str,
    path: str,
    body: bytes,
    hops: int,
    on_behalf: str | None,
    *,
    now: float | None = None,
    nonce: str | None = None,
    to: str = "",
) -> dict[str, str]:
    """The headers that authenticate ``method path`` (``path`` with its query string, as sent)
    with ``body`` to the node process at ``to`` (its ``Node.address``): hop count, user,
    timestamp, nonce, recipient and signature."""
    timestamp = f"{clock.time_s() if now is None else now:.3f}"
    nonce = nonce or secrets.token_hex(12)
    content = hashlib.sha256(body).hexdigest()
    headers = {
        HOPS_HEADER: str(hops),
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        TO_HEADER: to,
        CONTENT_HEADER: content,
    }
    if on_behalf is not None:
        headers[ON_BEHALF_HEADER] = on_behalf
    message = _message(method, path, content, str(hops), on_behalf or "", timestamp, nonce, to)
    headers[SIGNATURE_HEADER] = _mac(message)
    return headers


class SeenSignatures:
    """Signatures accepted within the window, to refuse a replay. Entries are kept
    ``2 * skew`` from acceptance (at least until their timestamp, at most ``skew`` ahead of
    this clock, has left the window); kept in acceptance order, so expiry is from the left."""

    def __init__(self, limit: int = SEEN_MAX):
        self.limit = limit
        self._seen: set[str] = set()
        self._order: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()

    def add(self, signature: str, now: float, keep: float) -> bool:
        """Remember ``signature``; False if it was already there (a replay). PeerAuthBusy when full."""
        with self._lock:
            while self._order and self._order[0][0] <= now:
                self._seen.discard(self._order.popleft()[1])
            if signature in self._seen:
                return False
            if len(self._seen) >= self.limit:
                raise PeerAuthBusy(f"more than {self.limit} forwarded calls in {keep:.0f} s")
            self._seen.add(signature)
            self._order.append((now + keep, signature))
            return True

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._order.clear()


SEEN = SeenSignatures()


def verify_headers(environ: Mapping[str, str], method: str, path: str, *, now: float | None = None) -> PeerCall | None:
    """The forwarded call the request ``environ`` proves it is by its headers alone (``path``:
    with its query string), or None when it does not claim to be one; its body is still to be
    checked (:func:`check_body`) once read. PeerAuthFailed: it claims to be one (a signature,
    or the old secret header) and is not; PeerAuthBusy: retry later. The answer is kept in the
    environ (a dict), so a request is checked once, whoever asks first (the replay guard would
    take a second check for a replay)."""
    done = environ.get(VERIFIED_KEY)
    if isinstance(done, PeerCall):
        return done
    if LEGACY_SECRET_META in environ:
        raise PeerAuthFailed(f"{LEGACY_SECRET_HEADER} is not accepted: nodes sign forwarded calls")
    signature = environ.get(SIGNATURE_META)
    if signature is None:
        return None
    timestamp = environ.get(meta_key(TIMESTAMP_HEADER), "")
    nonce = environ.get(meta_key(NONCE_HEADER), "")
    hops = environ.get(meta_key(HOPS_HEADER), "")
    on_behalf = environ.get(meta_key(ON_BEHALF_HEADER))
    to = environ.get(meta_key(TO_HEADER), "")
    content = environ.get(meta_key(CONTENT_HEADER), "")
    if not timestamp or not nonce or not _HEX64.fullmatch(content):
        raise PeerAuthFailed(f"a signed call needs {TIMESTAMP_HEADER}, {NONCE_HEADER} and {CONTENT_HEADER}")
    expected = _mac(_message(method, path, content, hops, on_behalf or "", timestamp, nonce, to))
    if not hmac.compare_digest(signature.encode("latin-1", "replace"), expected.encode()):
        raise PeerAuthFailed("bad cluster signature")
    if ADDRESS is not None and to != ADDRESS:
        raise PeerAuthFailed(f"cluster signature is for {to!r}, not this node process ({ADDRESS})")
    now = clock.time_s() if now is None else now
    skew = settings.CLUSTER_CLOCK_SKEW
    try:
        signed_at = float(timestamp)
    except ValueError:
        signed_at = math.nan
    if not abs(now - signed_at) <= skew:  # NaN too
        raise PeerAuthFailed(f"cluster signature timestamp {timestamp!r} is more than {skew:g} s off this node's clock")
    if signed_at < STARTED + clock.offset():
        raise PeerAuthFailed(f"cluster signature timestamp {timestamp!r} is from before this node process started")
    if not SEEN.add(expected, time.monotonic(), 2 * skew):
        raise PeerAuthFailed("replayed cluster signature")
    call = PeerCall(hops, on_behalf or None, content)
    if isinstance(environ, dict):
        environ[VERIFIED_KEY] = call
    return call


def check_body(call: PeerCall, body: bytes) -> None:
    """PeerAuthFailed unless ``body`` is the one ``call`` was signed with."""
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), call.content_sha256):
        raise PeerAuthFailed("bad cluster signature: the body is not the one signed")


def verify(
    environ: Mapping[str, str], method: str, path: str, body: bytes, *, now: float | None = None
) -> PeerCall | None:
    """:func:`verify_headers` and :func:`check_body` of a request whose body is at hand."""
    call = verify_headers(environ, method, path, now=now)
    if call is not None:
        check_body(call, body)
    return call


def request_path(environ: Mapping[str, str]) -> str:
    """The path a signature covers: the request's path and its query string, as received."""
    path = environ.get("PATH_INFO", "")
    path = path.encode("latin-1", "replace").decode("utf-8", "surrogateescape")  # WSGI: bytes as latin-1
    query = environ.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path
