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


def enqueue(name: str, data) -> tuple[int, dict]:
    cfg = queue_config(name)
    bodies, batch = validation.enqueue_request(data, cfg)
    now = datetime.now(timezone.utc).timestamp()
    ids = service.enqueue(name, [StoredMessage(b, now) for b in bodies])
    return 201, ({"ids": ids} if batch else {"id": ids[0]})


def dequeue(name: str, data) -> tuple[int, dict]:
    queue_config(name)
    max_messages, visibility, wait = validation.dequeue_request(data)
    deliveries = service.dequeue(name, max_messages, visibility, wait)
    return 200, {"messages": [
        {"id": d.id, "receipt": d.receipt, "body": d.message.body,
         "receive_count": d.receive_count, "enqueued_at": _iso(d.message.enqueued_at)}
        for d in deliveries
    ]}


def ack(name: str, data) -> tuple[int, dict]:
    cfg = queue_config(name)
    items = validation.ack_request(data, cfg)
    result = service.ack(name, items)
    return 200, {"acked": result.acked, "not_found": result.not_found}


def visibility(name: str, data) -> tuple[int, dict]:
    cfg = queue_config(name)
    mid, receipt, timeout = validation.visibility_request(data, cfg)
    service.change_visibility(name, mid, receipt, timeout)
    return 200, {"id": str(mid), "visibility_timeout": timeout}


#: The calls the fast path serves, by the last segment of their path.
CALLS = {"enqueue": enqueue, "dequeue": dequeue, "ack": ack, "visibility": visibility}
