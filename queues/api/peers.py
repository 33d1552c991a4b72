"""The service's calls to other nodes (``queues.service.peers.Peers``), over the REST API.

A forwarded call is the same REST call a client makes, authenticated as a cluster peer (signed
with the cluster secret by ``queues.cluster.peerauth``; never a user's token, never the secret itself),
naming the user it acts for (``X-MQ-On-Behalf-Of``: the peer checks that user's rights again)
and carrying its hop count, both covered by the signature; the answer is turned back
into the service's types, and a refusal into ``RemoteError`` (status and body, passed on as
they are by whoever called).
"""

from __future__ import annotations

import functools
import io
import logging
import select
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
import pycurl

from queues import metrics, tracing
from queues.access import Caller
from queues.cluster import peerauth
from queues.cluster.router import MAX_HOPS
from queues.engine.ids import MessageId, StoredMessage
from queues.http import served_header
from queues.http.auth import on_behalf_value
from queues.service import (
    AckResult,
    BlockListing,
    ExpireResult,
    MessageDraft,
    PeerUnreachable,
    RedriveResult,
    RemoteError,
    served,
)
from queues.service.types import Delivery

log = logging.getLogger(__name__)

#: In a node's enqueue or ack call: check it, change nothing (``calls.check_only``).
CHECK_ONLY = "check_only"
#: A node's ack that refuses receipts whose visibility timeout ran out (``service.ack``).
UNEXPIRED = "unexpired"

#: Seconds a forwarded call may take in all (a long poll is never forwarded: its wait is 0
#: there), and its connection.
TIMEOUT = 10.0
CONNECT_TIMEOUT = 1.0
#: Easy handles kept for reuse per peer, each with its keep-alive connection (urllib3's
#: ``maxsize``), and the peers they are kept for (its ``num_pools``).
HANDLES_KEPT = 16
PEERS_KEPT = 32


def draft_json(d: MessageDraft) -> dict[str, Any]:
    """A draft as the enqueue call's message object. ``delay: 0`` when it has no ``not_before``:
    the receiver must not apply its queue's default delay a second time."""
    item: dict[str, Any] = {"body": d.body}
    for key, value in (
        ("group", d.group),
        ("fairness_key", d.fairness_key),
        ("dedup_id", d.dedup_id),
        ("attributes", d.attributes),
        ("size", d.size),
        ("estimates", d.estimates),
        ("history", d.history),
        ("subscription", d.subscription),
    ):
        if value is not None:
            item[key] = value  # noqa: PERF403 - a loop keeps the keys in the wire order
    if d.not_before is not None:
        item["not_before"] = d.not_before
    else:
        item["delay"] = 0
    return item


def _unreadable(address: str, call: str, wanted: str) -> PeerUnreachable:
    """A peer's 2xx answer without what the call needs (a bug, a node of another version, a
    middleware that changed a batch's length): the peer may have run the call, so it is not made
    at another node (``routing.local_or_forward``); an enqueue answers 503 with Retry-After and
    the client decides, as after a connection lost mid-call; a dequeue asks no more of that
    node (what it delivered comes back after its visibility timeout)."""
    log.error("node %s answered a forwarded %s without %s", address, call, wanted)
    return PeerUnreachable(f"node {address} answered the {call} without {wanted}; it may have run: retry")


def delivery_of(item: dict[str, Any]) -> Delivery:
    """A delivery from the dequeue call's answer (the inverse of ``calls.delivery_json``)."""
    enqueued_at = datetime.fromisoformat(item["enqueued_at"].replace("Z", "+00:00")).timestamp()
    message = StoredMessage(
        item["body"],
        enqueued_at,
        group=item.get("group"),
        sequence=item.get("sequence", 0),
        attributes=item.get("attributes") or None,
        size=item.get("size"),
        estimates=item.get("estimates"),
        history=item.get("history"),
        fairness_key=item.get("fairness_key"),
    )
    return Delivery(item["id"], item["receipt"], item["receive_count"], message, bool(item.get("archived")))


class CurlHandles:
    """libcurl easy handles for the calls to one peer: one call at a time on a handle (a handle
    is not thread-safe), the most recently used first, so a warm handle, with its keep-alive
    connection, serves the next call.

    Why libcurl: a forwarded call is one more HTTP round trip on the hot path (an ack whose
    message a sibling process owns; any call for another node's partition). urllib3 builds
    the request and parses the answer's headers in Python (``http.client``); libcurl does it
    in C, for a fraction of the forwarding thread's CPU (``bench/peers.py``).
    """

    def __init__(self, kept: int = HANDLES_KEPT) -> None:
        self._free: list[pycurl.Curl] = []
        self._lock = threading.Lock()
        self._kept = kept
        self._closed = False

    def take(self) -> pycurl.Curl:
        with self._lock:
            if self._free:
                return self._free.pop()
        c = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)  # timeouts without SIGALRM: request threads
        c.setopt(pycurl.PROXY, "")  # never an http_proxy from the environment
        c.setopt(pycurl.TCP_NODELAY, 1)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, int(CONNECT_TIMEOUT * 1000))
        c.setopt(pycurl.TIMEOUT_MS, int(TIMEOUT * 1000))
        c.setopt(pycurl.POST, 1)
        # The body is read from a callback that cannot go back: libcurl resends a request whose
        # kept-alive connection died before any answer came, which the peer may have run
        # already (an enqueue stored twice, or a 401 for its signature seen before). Unable
        # to rewind, the call fails instead (PeerUnreachable: 503, the client retries), as
        # it did on urllib3.
        c.setopt(pycurl.SEEKFUNCTION, _cannot_seek)
        return c

    def give_back(self, c: pycurl.Curl) -> None:
        with self._lock:
            if len(self._free) < self._kept and not self._closed:
                self._free.append(c)
                return
        c.close()

    def close(self) -> None:
        with self._lock:
            free, self._free, self._closed = self._free, [], True
        for c in free:
            c.close()


def curl_post(handles: CurlHandles, url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """POST ``data`` to ``url`` with ``headers``; the status and the body. pycurl.error when the
    peer refused, reset or did not answer in time.

    When the call in progress here records who served it (``queues.service.served``), the
    peer's ``X-MQ-Served-By`` is added to that record (the peer has ``SERVED_BY_HEADER`` too:
    it is a cluster-wide setting). Only then are the answer's headers looked at."""
    chunks: list[bytes] = []
    c = handles.take()
    served_by: list[bytes] | None = [] if served.active() else None
    try:
        if served_by is not None:
            c.setopt(pycurl.HEADERFUNCTION, functools.partial(_served_by_line, served_by))
        # A kept-alive connection the peer has closed since (it is readable: its end, or bytes
        # it had no business sending) is not used: libcurl looks at one only once it has been
        # idle a second, and a request sent on it would fail, never to be sent again (see
        # SEEKFUNCTION). urllib3 looked every time, as this does.
        fd = c.getinfo(pycurl.ACTIVESOCKET)  # (the handle's last connection, -1: none kept)
        c.setopt(pycurl.FRESH_CONNECT, fd != -1 and _readable(fd))
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.POSTFIELDSIZE_LARGE, len(data))
        c.setopt(pycurl.READFUNCTION, io.BytesIO(data).read)
        # "Expect:": no 100-continue round trip before a large body
        c.setopt(pycurl.HTTPHEADER, [f"{k}: {v}" for k, v in headers.items()] + ["Expect:"])
        c.setopt(pycurl.WRITEFUNCTION, chunks.append)
        c.perform()
        status = c.getinfo(pycurl.RESPONSE_CODE)
    finally:
        # drop this call's body and answer: the handle waits in the pool for the next call
        c.setopt(pycurl.READFUNCTION, _no_body)
        c.setopt(pycurl.WRITEFUNCTION, _discard)
        if served_by is not None:
            c.unsetopt(pycurl.HEADERFUNCTION)
        handles.give_back(c)
    if served_by:
        served.extend(e for line in served_by for e in served_header.parse(line.decode("latin-1")))
    return status, b"".join(chunks)


_SERVED_BY = served_header.HEADER.lower().encode("ascii") + b":"


def _served_by_line(found: list[bytes], line: bytes) -> None:
    """libcurl's header callback (one line of the answer's head): keep the value of an
    ``X-MQ-Served-By``."""
    if line[: len(_SERVED_BY)].lower() == _SERVED_BY:
        found.append(line[len(_SERVED_BY) :].strip())


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _cannot_seek(offset: int, origin: int) -> int:
    cannot: int = pycurl.SEEKFUNC_CANTSEEK  # pycurl has no type information
    return cannot


def _no_body(size: int) -> bytes:
    return b""


def _discard(_: bytes) -> None:
    return None


class HttpPeers:
    def __init__(self) -> None:
        #: a pool of handles per peer address (as urllib3's PoolManager kept one per host): a
        #: handle's kept connection is to its pool's peer; the pool used least recently goes
        #: past PEERS_KEPT
        self._pools: OrderedDict[str, CurlHandles] = OrderedDict()
        self._lock = threading.Lock()

    def handles(self, address: str) -> CurlHandles:
        with self._lock:
            pool = self._pools.get(address)
            if pool is not None:
                self._pools.move_to_end(address)
                return pool
            pool = self._pools[address] = CurlHandles()
            dropped = self._pools.popitem(last=False)[1] if len(self._pools) > PEERS_KEPT else None
        if dropped is not None:
            dropped.close()  # (a handle out on a call is closed when it comes back)
        return pool

    def post(
        self, address: str, path: str, payload: dict[str, Any], hops: int, caller: Caller | None
    ) -> tuple[int, dict[str, Any]]:
        """POST ``/api/v1/<path>`` at ``address`` for ``caller`` (None: the node's own call);
        its status and JSON answer."""
        full_path = f"/api/v1/{path}"
        data = orjson.dumps(payload)
        on_behalf = on_behalf_value(caller) if caller is not None else None
        headers = {
            "Content-Type": "application/json",
            **peerauth.sign("POST", full_path, data, hops + 1, on_behalf, to=address),
        }
        if tracing.ON:  # the owner's spans join the caller's trace
            tracing.inject(headers)
        try:
            status, raw = curl_post(self.handles(address), f"http://{address}{full_path}", data, headers)
        except pycurl.error as exc:  # refused, reset, timed out
            code, text = exc.args if len(exc.args) == 2 else (0, str(exc))
            raise PeerUnreachable(
                f"node {address} did not answer (curl {code}: {text}); retry", refused=code == pycurl.E_COULDNT_CONNECT
            ) from exc
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            body = {"error": "bad_gateway", "detail": f"{address} answered {status} without JSON"}
        return status, body

    def call(
        self,
        address: str,
        target: str,
        call: str,
        payload: dict[str, Any],
        hops: int,
        caller: Caller | None,
        ok: int = 200,
    ) -> Any:
        """A call on a queue or on a topic's subscription (``"topic/subscription"``)."""
        topic, slash, sub = target.partition("/")
        path = f"topics/{topic}/subscriptions/{sub}/{call}" if slash else f"queues/{target}/{call}"
        metrics.FORWARDED.labels(call).inc()
        if tracing.ON:
            with tracing.forward_span(address, call, target):
                status, body = self.post(address, path, payload, hops, caller)
        else:
            status, body = self.post(address, path, payload, hops, caller)
        if status == 401:
            # The peer refused this node's signature (a cluster secret that differs, a clock off
            # by more than the window): the caller's credentials are not in question and nothing
            # ran there, so the caller is told to retry, as when a node is unreachable.
            log.warning("node %s refused this node's signed call: %s", address, body.get("detail", body))
            raise PeerUnreachable(f"node {address} refused this node's call; retry", refused=True)
        if status != ok:
            raise RemoteError(status, body)
        return body

    def enqueue(self, address: str, queue: str, drafts: Sequence[MessageDraft], hops: int, caller: Caller) -> list[str]:
        payload = {"messages": [draft_json(d) for d in drafts]}
        body = self.call(address, queue, "enqueue", payload, hops, caller, ok=201)
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or len(ids) != len(drafts) or not all(isinstance(i, str) and i for i in ids):
            # (the caller answers IDs by position: a short or odd list would misname its messages)
            raise _unreadable(address, "enqueue", f"an ID for each of its {len(drafts)} messages")
        return ids

    def check_enqueue(
        self, address: str, queue: str, drafts: Sequence[MessageDraft], hops: int, caller: Caller
    ) -> None:
        payload = {"messages": [draft_json(d) for d in drafts], CHECK_ONLY: True}
        self.call(address, queue, "enqueue", payload, hops, caller)

    def dequeue(
        self, address: str, target: str, max_messages: int, visibility_timeout: float | None, hops: int, caller: Caller
    ) -> list[Delivery]:
        payload: dict[str, Any] = {"max": max_messages, "wait": 0}
        if visibility_timeout is not None:
            payload["visibility_timeout"] = visibility_timeout
        body = self.call(address, target, "dequeue", payload, hops, caller)
        try:
            deliveries = [delivery_of(item) for item in body.get("messages", ())]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise _unreadable(address, "dequeue", "its messages") from exc
        if len(deliveries) > max_messages:
            raise _unreadable(address, "dequeue", f"at most {max_messages} messages")
        return deliveries

    def ack(
        self,
        address: str,
        target: str,
        items: Sequence[tuple[MessageId, str | None]],
        hops: int,
        caller: Caller,
        *,
        unexpired: bool = False,
    ) -> AckResult:
        payload: dict[str, Any] = {"messages": [{"id": str(mid), "receipt": receipt} for mid, receipt in items]}
        if unexpired:
            payload[UNEXPIRED] = True
        body = self.call(address, target, "ack", payload, hops, caller)
        return AckResult(body.get("acked", 0), body.get("not_found", 0))

    def check_ack(
        self,
        address: str,
        target: str,
        items: Sequence[tuple[MessageId, str | None]],
        hops: int,
        caller: Caller,
        *,
        unexpired: bool = False,
    ) -> None:
        payload: dict[str, Any] = {
            "messages": [{"id": str(mid), "receipt": receipt} for mid, receipt in items],
            CHECK_ONLY: True,
        }
        if unexpired:
            payload[UNEXPIRED] = True
        self.call(address, target, "ack", payload, hops, caller)

    def change_visibility(
        self,
        address: str,
        target: str,
        mid: MessageId,
        receipt: str | None,
        visibility_timeout: float,
        hops: int,
        caller: Caller,
    ) -> None:
        payload = {"id": str(mid), "receipt": receipt, "visibility_timeout": visibility_timeout}
        self.call(address, target, "visibility", payload, hops, caller)

    def release_partition(self, address: str, queue: str, index: int, hops: int, caller: Caller) -> str:
        node: str = self.call(address, queue, f"partitions/{index}/release", {}, hops, caller)["node"]
        return node

    def block_messages(
        self, address: str, queue: str, index: int, block: str, limit: int, hops: int, caller: Caller
    ) -> BlockListing:
        listing: BlockListing = self.call(
            address, queue, f"partitions/{index}/blocks/{block}", {"limit": limit}, hops, caller
        )
        return listing

    def close_purged(self, address: str, queue: str) -> None:
        self.call(address, queue, "purge", {"close_only": True}, MAX_HOPS - 1, None)

    def reload(self, address: str, name: str) -> None:
        self.call(address, name, "refresh", {}, 1, None)

    def redrive(self, address: str, queue: str, max_messages: int, hops: int, caller: Caller) -> RedriveResult:
        body = self.call(address, queue, "redrive", {"max": max_messages}, hops, caller)
        return RedriveResult(body.get("moved", 0), body.get("skipped", 0), body.get("sources") or {})

    def expire(self, address: str, queue: str) -> ExpireResult:
        body = self.call(address, queue, "expire", {}, MAX_HOPS - 1, None)
        deferred = {int(k): v for k, v in (body.get("deferred") or {}).items()}
        return ExpireResult(body.get("expired", 0), body.get("archived", 0), deferred)
