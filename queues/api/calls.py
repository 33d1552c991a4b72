"""The message calls, independent of the transport.

Each function takes the queue name and the parsed JSON body and returns ``(status, payload)``,
raising the API's exceptions for errors. The DRF views and the fast path (``fastpath``) both
call these, so the two cannot drift apart in what they accept or answer.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .. import service
from ..messages import StoredMessage
from ..models import QUEUE_NAME_RE
from ..partition import NotServedHere
from ..router import MAX_HOPS, Forwarded
from . import validation


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def checked_name(name: str) -> str:
    """A name no queue can have (NUL, '/', too long...) is unknown, not a database error."""
    if not QUEUE_NAME_RE.fullmatch(name):
        raise service.QueueNotFound(name)
    return name


def queue_config(name: str):
    return service.get_runtime().queue(checked_name(name))


def _local_or_forward(name: str, call: str, data, hops: int, local):
    """Run ``local``; if this node does not serve the call, pass it to a node that does."""
    try:
        return local()
    except NotServedHere:
        if hops >= MAX_HOPS:
            raise
    rt = service.get_runtime()
    cfg = rt.queue(name)
    last: Exception | None = None
    for address in rt.router.other_nodes(cfg.id, name):
        try:
            status, payload = rt.router.forward(address, name, call, data, hops)
        except Exception as exc:  # noqa: BLE001 - try the next owner
            last = exc
            continue
        if status < 500:
            return status, payload
    if call == "enqueue" and rt.local_managers(name):
        # Nobody else could take it: a cooling node still serves rather than refuse.
        return local(even_if_cooling=True)
    raise NotServedHere(f"no node serves queue {name!r} now ({last or 'no owner'}); retry")


def enqueue(name: str, data, hops: int = 0) -> tuple[int, dict]:
    cfg = queue_config(name)
    bodies, batch = validation.enqueue_request(data, cfg)
    now = datetime.now(timezone.utc).timestamp()

    def local(even_if_cooling: bool = False):
        ids = service.enqueue(name, [StoredMessage(b, now) for b in bodies],
                              even_if_cooling=even_if_cooling or hops >= MAX_HOPS)
        return 201, ({"ids": ids} if batch else {"id": ids[0]})

    return _local_or_forward(name, "enqueue", data, hops, local)


def _deliveries(deliveries) -> list[dict]:
    return [
        {"id": d.id, "receipt": d.receipt, "body": d.message.body,
         "receive_count": d.receive_count, "enqueued_at": _iso(d.message.enqueued_at)}
        for d in deliveries
    ]


def dequeue(name: str, data, hops: int = 0) -> tuple[int, dict]:
    """Here first; if nothing here, from the other owners (deepest first); then wait here."""
    cfg = queue_config(name)
    max_messages, visibility, wait = validation.dequeue_request(data)
    rt = service.get_runtime()
    got = _deliveries(service.dequeue(name, max_messages, visibility, 0))
    if got or hops >= MAX_HOPS:
        if not got and wait:
            got = _deliveries(service.dequeue(name, max_messages, visibility, wait))
        return 200, {"messages": got}
    remote = {**data, "wait": 0}
    for address in rt.router.other_nodes(cfg.id, name):
        try:
            status, payload = rt.router.forward(address, name, "dequeue", remote, hops)
        except Exception:  # noqa: BLE001 - that owner is unreachable: try the next
            continue
        if status == 200 and payload.get("messages"):
            return 200, payload
    if wait:
        got = _deliveries(service.dequeue(name, max_messages, visibility, wait))
    return 200, {"messages": got}


def ack(name: str, data, hops: int = 0) -> tuple[int, dict]:
    """Local partitions here; the rest at their owners, one call per owner.

    Receipts are all checked before anything is removed on each node; across nodes the
    calls are separate, so a 409 from one owner leaves the other owners' acks done.
    """
    cfg = queue_config(name)
    items = validation.ack_request(data, cfg)
    rt = service.get_runtime()
    local = [(mid, r) for mid, r in items if (name, mid.partition) in rt.managers]
    remote: dict[str, list] = {}
    for mid, receipt in items:
        if (name, mid.partition) in rt.managers:
            continue
        address = rt.router.owner_of(cfg.id, name, mid.partition) if hops < MAX_HOPS else None
        if address is None:
            raise NotServedHere(f"partition {name}/{mid.partition} has no live owner now; retry")
        remote.setdefault(address, []).append({"id": str(mid), "receipt": receipt})
    acked = not_found = 0
    if local:
        result = service.ack(name, local)
        acked, not_found = result.acked, result.not_found
    for address, batch in remote.items():
        status, payload = rt.router.forward(address, name, "ack", {"messages": batch}, hops)
        if status != 200:
            raise Forwarded(status, payload)
        acked += payload.get("acked", 0)
        not_found += payload.get("not_found", 0)
    return 200, {"acked": acked, "not_found": not_found}


def visibility(name: str, data, hops: int = 0) -> tuple[int, dict]:
    cfg = queue_config(name)
    mid, receipt, timeout = validation.visibility_request(data, cfg)
    rt = service.get_runtime()
    if (name, mid.partition) not in rt.managers and hops < MAX_HOPS:
        address = rt.router.owner_of(cfg.id, name, mid.partition)
        if address is not None:
            status, payload = rt.router.forward(address, name, "visibility", data, hops)
            if status != 200:
                raise Forwarded(status, payload)
            return status, payload
    service.change_visibility(name, mid, receipt, timeout)
    return 200, {"id": str(mid), "visibility_timeout": timeout}


#: The calls the fast path serves, by the last segment of their path.
CALLS = {"enqueue": enqueue, "dequeue": dequeue, "ack": ack, "visibility": visibility}
