"""The message calls in the API's shapes, shared by the DRF views and the fast path.

Each function takes the name in the URL, the parsed JSON body, the hop count, whether the
request comes from a node, and the ``caller`` it acts as; it checks the caller's right first
(``service.authorize``: a queue it may not see is not found, whatever the body), then the body
(``validation``), calls the service, and returns ``(status, payload)``. A message call checks
the right once: ``checked`` (what :func:`checked_limit` found before the body was read, or this
call's own check) is handed to the service, which then does not check again. The rules live in ``queues.service``; the JSON lives here, so the two
entrances cannot drift apart in what they accept or answer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from queues import service
from queues.access import Caller
from queues.http import validation
from queues.public import LIMITS
from queues.service import Checked
from queues.service.types import Delivery, QueueConfig

Answer = tuple[int, dict[str, Any]]


def queue_estimates(cfg: QueueConfig) -> dict[str, Any]:
    """The queue's estimates, as a delivery without its own answers them."""
    return {"preprocess": cfg.preprocess_estimate, "process": cfg.process_estimate}


def delivery_json(d: Delivery, cfg: QueueConfig, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """A delivery as the dequeue call answers it. ``defaults``: :func:`queue_estimates` of
    ``cfg``, made once for a whole batch (shared, never changed, by the messages without
    estimates of their own, rather than one dict a message)."""
    m = d.message
    assert m is not None
    estimates = defaults if defaults is not None else queue_estimates(cfg)
    if m.estimates:  # (a null stored by an older node is the queue's, as a missing one)
        estimates = {**estimates, **{k: v for k, v in m.estimates.items() if v is not None}}
    item = {
        "id": d.id,
        "receipt": d.receipt,
        "body": m.body,
        "receive_count": d.receive_count,
        "enqueued_at": service.iso(m.enqueued_at),
        "sequence": m.sequence,
        "group": m.group,
        "attributes": m.attributes or {},
        "size": m.size,
        "estimates": estimates,
    }
    if m.history:
        item["history"] = m.history
    if m.fairness_key is not None:
        item["fairness_key"] = m.fairness_key
    if d.from_archive:
        item["archived"] = True  # retention had moved it to the archive: read from there
    return item


def check_only(data: Any, trusted: bool) -> tuple[Any, bool]:
    """A node's call may ask only to check (``"check_only": true``: the receipts of an ack, the
    messages of an enqueue, as this node sees them; nothing changes); the body without it."""
    if trusted and isinstance(data, dict) and "check_only" in data:
        data = dict(data)
        return data, data.pop("check_only") is True
    return data, False


def _checked(checked: Checked | None, name: str, action: str, caller: Caller, reading: bool = False) -> Checked:
    """``checked`` if it is the check of this call, else the check made now."""
    if (
        checked is not None
        and checked.caller is caller
        and checked.target == name
        and checked.action == action
        and checked.reading == reading
    ):
        return checked
    return service.check(name, action, caller=caller, reading=reading)


def enqueue(
    name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller, checked: Checked | None = None
) -> Answer:
    """``trusted``: the request comes from a node (it may carry a dead letter's history, or
    ask only to check)."""
    checked = _checked(checked, name, "produce", caller)
    cfg = checked.cfg
    data, checking = check_only(data, trusted)
    drafts, batch = validation.enqueue_request(data, cfg, datetime.now(UTC).timestamp(), trusted)
    if checking:
        service.enqueue(name, drafts, caller=caller, hops=hops, check_only=True, checked=checked)
        return 200, {"checked": len(drafts)}
    ids = service.enqueue(name, drafts, caller=caller, hops=hops, checked=checked)
    return 201, ({"ids": ids} if batch else {"id": ids[0]})


def publish(
    name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller, checked: Checked | None = None
) -> Answer:
    cfg = service.queue_config(name)
    if cfg.kind != "topic":
        raise service.QueueNotFound(name)
    checked = _checked(checked, name, "produce", caller)
    drafts, batch = validation.enqueue_request(data, cfg, datetime.now(UTC).timestamp(), trusted)
    ids = service.publish(name, drafts, caller=caller, hops=hops, checked=checked)
    return 201, ({"ids": ids} if batch else {"id": ids[0]})


def dequeue(
    name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller, checked: Checked | None = None
) -> Answer:
    checked = _checked(checked, name, "consume", caller, reading=True)
    cfg = checked.cfg
    max_messages, visibility_timeout, wait = validation.dequeue_request(data)
    found = service.dequeue(
        name,
        caller=caller,
        max_messages=max_messages,
        visibility_timeout=visibility_timeout,
        wait=wait,
        hops=hops,
        checked=checked,
    )
    defaults = queue_estimates(cfg)
    return 200, {"messages": [delivery_json(d, cfg, defaults) for d in found]}


def ack(
    name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller, checked: Checked | None = None
) -> Answer:
    """``trusted``: the request comes from a node (it may ask only to check, or that receipts
    whose visibility timeout ran out be refused: ``"unexpired": true``)."""
    checked = _checked(checked, name, "consume", caller, reading=True)
    cfg = checked.cfg
    data, checking = check_only(data, trusted)
    unexpired = False
    if trusted and isinstance(data, dict) and "unexpired" in data:
        data = dict(data)
        unexpired = data.pop("unexpired") is True
    items = validation.ack_request(data, cfg)
    if checking:
        service.ack(name, items, caller=caller, hops=hops, check_only=True, unexpired=unexpired, checked=checked)
        return 200, {"checked": len(items)}
    result = service.ack(name, items, caller=caller, hops=hops, unexpired=unexpired, checked=checked)
    return 200, {"acked": result.acked, "not_found": result.not_found}


def visibility(
    name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller, checked: Checked | None = None
) -> Answer:
    checked = _checked(checked, name, "consume", caller, reading=True)
    mid, receipt, visibility_timeout = validation.visibility_request(data, checked.cfg)
    service.change_visibility(name, mid, receipt, visibility_timeout, caller=caller, hops=hops, checked=checked)
    return 200, {"id": str(mid), "visibility_timeout": visibility_timeout}


def redrive(name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller) -> Answer:
    service.authorize(name, "manage", caller=caller)
    data = validation.object_of(data)
    validation.no_extra(data, {"max"}, "the request")
    limit = validation.number(data, "max", 1, service.MAX_BATCH, 100, integer=True)
    result = service.redrive(name, limit, caller=caller, hops=hops)
    return 200, {"moved": result.moved, "skipped": result.skipped, "sources": result.sources}


def expire(name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller) -> Answer:
    cfg, _ = service.authorize(name, "manage", caller=caller)
    data = validation.object_of(data)
    validation.no_extra(data, {"older_than"}, "the request")
    older_than = validation.number(data, "older_than", 0, LIMITS["retention"][1], cfg.retention)
    result = service.expire(name, older_than, caller=caller)
    payload: dict[str, Any] = {"expired": result.expired, "archived": result.archived}
    if result.deferred:
        payload["deferred"] = result.deferred
    return 200, payload


def purge(name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller) -> Answer:
    """``{"close_only": true}`` (from nodes only): another node purged; drop the managers here."""
    service.authorize(name, "manage", caller=caller)
    data = validation.object_of(data)
    validation.no_extra(data, {"close_only"} if trusted else set(), "the request")
    if data.get("close_only") is True:
        service.close_purged(name, caller=caller)
        return 200, {"closed": True}
    return 200, {"purged": service.purge(name, caller=caller)}


def release_partition(name: str, index: int, hops: int = 0, *, caller: Caller) -> Answer:
    return 200, {"released": True, "node": service.release_partition(name, index, caller=caller, hops=hops)}


def block_messages(name: str, index: int, block: str, data: Any, hops: int = 0, *, caller: Caller) -> Answer:
    """``{"limit": n}`` (optional): a block's messages and their states, read at the owner."""
    data = validation.object_of(data)
    validation.no_extra(data, {"limit"}, "the request")
    limit = data.get("limit", service.BLOCK_LISTING_MAX)
    if type(limit) is not int or not 1 <= limit <= service.BLOCK_LISTING_MAX:
        raise service.InvalidRequest(f"limit must be an integer from 1 to {service.BLOCK_LISTING_MAX}")
    return 200, dict(service.block_messages(name, index, block, caller=caller, hops=hops, limit=limit))


def refresh(name: str, data: Any, hops: int = 0, trusted: bool = False, *, caller: Caller) -> Answer:
    service.reload(name, caller=caller)
    return 200, {"refreshed": True}


#: Bytes a message may take in a batch beside its body: its JSON keys, group, dedup_id, times,
#: size, estimates and a few attributes (16 attributes of 1 KB fit one message, not a batch).
MESSAGE_ENVELOPE = 1024
#: Bytes one message of at most ``max_message_size`` may always take: its body JSON-escaped at
#: worst (``\u00XX``: 6 bytes a byte) and its attributes at their largest.
SINGLE_ENVELOPE = 24 * 1024
#: The most bytes of a call that names no messages (dequeue, visibility, redrive, ...).
SMALL_BODY = 64 * 1024
#: The most bytes of an ack: 1,000 IDs of up to 200 characters and receipts of up to 64.
ACK_BODY = 512 * 1024

_ACTIONS = {
    "enqueue": ("produce", False),
    "publish": ("produce", False),
    "dequeue": ("consume", True),
    "ack": ("consume", True),
    "visibility": ("consume", True),
}


#: The message calls: their body limits depend on the queue.
MESSAGE_CALLS = frozenset(_ACTIONS)


def body_limit(call: str, name: str, *, caller: Caller | None) -> int:
    """:func:`checked_limit`'s limit."""
    return checked_limit(call, name, caller=caller)[0]


def checked_limit(call: str, name: str, *, caller: Caller | None) -> tuple[int, Checked | None]:
    """The most bytes the request body of ``call`` on ``name`` may have, checked against its
    ``Content-Length`` before a byte is read: the queue's own limits, under the node's
    ``API_MAX_REQUEST_BYTES``. An enqueue may take a batch of ``MAX_BATCH`` messages of
    ``max_message_size`` each with :data:`MESSAGE_ENVELOPE` beside each, or a single message
    of ``max_message_size`` escaped at worst (:data:`SINGLE_ENVELOPE`), whichever is more.

    Checks the caller's right first (as every call does, before its body): raises
    QueueNotFound, Forbidden, SubscriptionNotFound as the call itself would; the check, to be
    handed to the call (its ``checked``), beside the limit. ``caller`` may be None for a call
    not in :data:`MESSAGE_CALLS` (its limit names no queue; no check then).
    """
    cap = settings.API_MAX_REQUEST_BYTES
    action = _ACTIONS.get(call)
    if action is None or caller is None:
        return min(cap, SMALL_BODY), None
    checked = service.check(name, action[0], caller=caller, reading=action[1])
    if call == "ack":
        return min(cap, ACK_BODY), checked
    if call in ("dequeue", "visibility"):
        return min(cap, SMALL_BODY), checked
    cfg = checked.cfg
    batch = service.MAX_BATCH * (cfg.max_message_size + MESSAGE_ENVELOPE) + SMALL_BODY
    single = 6 * cfg.max_message_size + SINGLE_ENVELOPE
    return min(cap, max(batch, single)), checked


#: The calls the fast path serves, by the last segment of their path.
CALLS = {"enqueue": enqueue, "dequeue": dequeue, "ack": ack, "visibility": visibility, "publish": publish}
