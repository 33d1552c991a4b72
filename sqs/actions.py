"""SQS's actions over the service: one function per action, ``(params, ctx) -> result``.

``params`` and the result are the AWS JSON 1.0 protocol's shapes (what boto3 sends and reads);
the query protocol is translated to and from them. Every call goes through ``queues.service``
as the access key's user (``ctx.caller``), so the REST API's permissions apply unchanged:
a queue the user may not read does not exist (QueueDoesNotExist), one it may read but not act
on answers AccessDenied. Refusals raise :class:`SQSError`.

How SQS's model maps onto the service's (docs/reference/sqs.md's compatibility table says the same):

- A queue name ``x.fifo`` is the strict queue ``x-fifo`` of the service (its names have no
  dots); the REST API sees that name. A FIFO queue's MessageGroupId is the group, its
  deduplication ID (given, or the body's SHA-256 with ContentBasedDeduplication) the service's
  dedup ID, remembered five minutes (the queue's ``dedup_window``).
- VisibilityTimeout, MessageRetentionPeriod, DelaySeconds, MaximumMessageSize and RedrivePolicy
  are the queue's own fields; ReceiveMessageWaitTimeSeconds, ContentBasedDeduplication, tags
  and the attributes with no effect here live in ``models.QueueSettings`` (``attributes``).
- A MessageId is the service's message ID spelled without ``/``, a receipt handle carries it
  and the service's receipt of that delivery; a FIFO message's SequenceNumber is its position
  (``ids``). A dead letter answers the MessageId it had where it came from.
- Message attributes are stored with the message's ``attributes`` (``message_attributes``).
- A message move task is the service's redrive, or a move to its DestinationArn
  (``move_tasks``); AddPermission and RemovePermission are grants (``permissions``).

What every action shares (the call's context, queue names and URLs, its parameters, the
service's errors as SQS's) is in ``context``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mq_client.tracing import MAX_XRAY_HEADER, TRACEPARENT, valid_xray, xray_of_traceparent
from queues import service
from queues.public import LIMITS
from sqs import ids, move_tasks, permissions, receive_attempts
from sqs import service as sqs_service
from sqs.attributes import (
    DEDUP_INTERVAL,
    DEFAULT_MESSAGE_SIZE,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_RECEIVE,
    MAX_RECEIVE_WAIT,
    MAX_RESULTS,
    READ_ONLY,
    SETTABLE,
    attributes_of,
    checked_attributes,
    checked_tags,
    same_attributes,
    served_settings,
    settings_of,
)
from sqs.context import (
    FIFO_SUFFIX,
    SERVICE_FIFO_SUFFIX,
    Context,
    integer_param,
    invalid,
    message_queue_param,
    missing,
    queue_arn,
    queue_param,
    queue_url,
    service_errors,
    service_name,
    sqs_name,
    text_param,
)
from sqs.errors import SQSError
from sqs.message_attributes import (
    SYSTEM_ATTRIBUTES,
    attributes_json,
    attributes_size,
    checked_message_attributes,
    md5_of_attributes,
    md5_of_body,
    read_attributes,
    stored_attributes,
    wanted_attribute,
)
from sqs.models import QueueSettings
from sqs.query import valid_text

_SQS_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def _save_settings(q: Any, extra: dict[str, Any], ctx: Context, tags: dict[str, str] | None = None) -> None:
    if not extra and not tags:
        return
    if tags:
        extra = {**extra, "tags": tags}
    with service_errors():
        sqs_service.update_queue_settings(q, caller=ctx.caller, **extra)


# --- queue actions ------------------------------------------------------------------------------
def create_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Idempotent as SQS: an existing queue of the name with the same attributes answers its
    URL; other attributes answer QueueNameExists (query code QueueAlreadyExists)."""
    name = text_param(params, "QueueName", required=True)
    assert name is not None
    fifo = name.endswith(FIFO_SUFFIX)
    bare = name[: -len(FIFO_SUFFIX)] if fifo else name
    if not _SQS_NAME.fullmatch(bare) or len(name) > 80 or not bare[0].isalnum():
        raise invalid(
            "Can only include alphanumeric characters, hyphens, or underscores (starting with a letter or "
            "digit here), 1 to 80 in length, .fifo at the end for a FIFO queue."
        )
    attrs = params.get("Attributes") or {}
    if fifo and not (isinstance(attrs, dict) and str(attrs.get("FifoQueue", "")).lower() == "true"):
        # SQS: a name with a dot is a FIFO queue's, and only with FifoQueue=true.
        raise invalid("Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length")
    target = service_name(name)
    fields, extra = checked_attributes(attrs, ctx, fifo=fifo, queue=target)
    tags = checked_tags(params.get("tags"), "tags")
    if "max_message_size" not in fields:
        # SQS's default, or the dead-letter queue's MaximumMessageSize where that is less: every
        # dead letter fits its dead-letter queue (queues.models.dead_letter_mismatch)
        dlq = fields.get("dead_letter_queue")
        fields["max_message_size"] = min(DEFAULT_MESSAGE_SIZE, dlq.max_message_size if dlq else DEFAULT_MESSAGE_SIZE)

    def existing() -> dict[str, Any] | None:
        with service_errors():
            try:
                q = service.get_queue(target, caller=ctx.caller)
            except service.QueueNotFound:
                return None
        if q.strict != fifo or not same_attributes(attrs, attributes_of(q, settings_of(q), ctx)):
            raise SQSError(
                "QueueNameExists", "A queue already exists with the same name and a different value for an attribute"
            )
        return {"QueueUrl": queue_url(ctx, q.name, q.strict)}

    found = existing()
    if found is not None:
        return found
    if fifo:
        fields.setdefault("dedup_window", DEDUP_INTERVAL)
    # A FIFO queue's receive takes as many of a group as it has room for, as SQS's.
    fields["strict"] = fields["group_batch"] = fifo
    with service_errors():
        try:
            q = service.create_queue(caller=ctx.caller, name=target, **fields)
        except service.Conflict as exc:
            if exc.code != "already_exists":
                raise
            found = existing()  # created meanwhile by another call
            if found is None:
                raise SQSError("QueueNameExists", str(exc.detail)) from None
            return found
    _save_settings(q, extra, ctx, tags)
    return {"QueueUrl": queue_url(ctx, q.name, q.strict)}


def get_queue_url(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    name = text_param(params, "QueueName", required=True)
    q = queue_param({"QueueUrl": name}, ctx)
    return {"QueueUrl": queue_url(ctx, q.name, q.strict)}


def _page(names: list[str], params: dict[str, Any]) -> tuple[list[str], str | None]:
    """SQS's pagination: MaxResults 1..``MAX_RESULTS`` and an opaque NextToken (the last name answered)."""
    limit = integer_param(params, "MaxResults", 1, MAX_RESULTS)
    token = text_param(params, "NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise invalid("Invalid NextToken value.") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:MAX_RESULTS], None
    page = names[:limit]
    more = len(names) > limit
    return page, (base64.urlsafe_b64encode(page[-1].encode()).decode() if more and page else None)


def _result_page(key: str, urls: list[str], token: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if urls:
        out[key] = urls
    if token:
        out["NextToken"] = token
    return out


def list_queues(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    prefix = text_param(params, "QueueNamePrefix") or ""
    with service_errors():
        rows = service.list_queues(caller=ctx.caller)
    by_name = {sqs_name(q.name, q.strict): q for q in rows}
    names = sorted(n for n in by_name if n.startswith(prefix))
    page, token = _page(names, params)
    return _result_page("QueueUrls", [queue_url(ctx, by_name[n].name, by_name[n].strict) for n in page], token)


def delete_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    with service_errors():
        service.delete_queue(q, caller=ctx.caller)
    return {}


def purge_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    with service_errors():
        # SQS forgets a FIFO queue's deduplication IDs with its messages.
        service.purge(q.name, caller=ctx.caller, forget_dedup=True)
    return {}


#: the attributes the service's figures answer.
_COUNTS = frozenset(
    {"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"}
)


def get_queue_attributes(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    wanted = params.get("AttributeNames") or []
    if not isinstance(wanted, list) or not all(isinstance(n, str) for n in wanted):
        raise invalid("AttributeNames must be a list of names")
    known = SETTABLE | READ_ONLY | {"FifoQueue"}
    for n in wanted:
        if n != "All" and n not in known:
            raise SQSError("InvalidAttributeName", f"Unknown Attribute {n}.")
    every = "All" in wanted
    out = attributes_of(q, settings_of(q), ctx)
    if every or _COUNTS & set(wanted):
        with service_errors():
            stats = service.queue_stats(q.name, caller=ctx.caller)
        # The service's depth counts delayed messages; SQS's ApproximateNumberOfMessages does not.
        out["ApproximateNumberOfMessages"] = str(max(stats["depth"] - stats["delayed"], 0))
        out["ApproximateNumberOfMessagesNotVisible"] = str(stats["in_flight"])
        out["ApproximateNumberOfMessagesDelayed"] = str(stats["delayed"])
    if not every:
        out = {k: v for k, v in out.items() if k in wanted}
    return {"Attributes": out} if out else {}


def set_queue_attributes(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    attrs = params.get("Attributes")
    if attrs is None:
        raise missing("Attributes")
    fields, extra = checked_attributes(attrs, ctx, fifo=q.strict, queue=q.name)
    with service_errors():
        # Checked for every change, even one of QueueSettings only: it needs ``manage``.
        q = service.update_queue(q, caller=ctx.caller, **fields)
    _save_settings(q, extra, ctx)
    return {}


def tag_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    tags = checked_tags(params.get("Tags"))
    if not tags:
        raise missing("Tags")
    with service_errors():
        sqs_service.update_queue_settings(q, caller=ctx.caller, tags=tags)
    return {}


def untag_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    keys = params.get("TagKeys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise missing("TagKeys")
    if not all(valid_text(k) for k in keys):  # (none is a key: a NUL would reach the audit's JSON)
        raise invalid("Invalid characters found in TagKeys.")
    with service_errors():
        sqs_service.update_queue_settings(q, caller=ctx.caller, remove_tags=keys)
    return {}


def list_queue_tags(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = queue_param(params, ctx)
    tags = settings_of(q).tags or {}
    return {"Tags": tags} if tags else {}


def list_dead_letter_source_queues(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    dlq = queue_param(params, ctx)
    with service_errors():
        rows = service.list_queues(caller=ctx.caller)
    by_name = {sqs_name(q.name, q.strict): q for q in rows if q.dead_letter_queue_id == dlq.pk}
    page, token = _page(sorted(by_name), params)
    return _result_page("queueUrls", [queue_url(ctx, by_name[n].name, by_name[n].strict) for n in page], token)


# --- message move tasks -------------------------------------------------------------------------
def _queue_of_arn(params: dict[str, Any], name: str, ctx: Context, *, required: bool = False) -> Any:
    """The queue an ARN parameter names (``arn:aws:sqs:<region>:<account>:<name>``), or None."""
    arn = text_param(params, name, required=required)
    if arn is None:
        return None
    parts = arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
        raise invalid(f"Value {arn} for parameter {name} is invalid. Reason: not the ARN of a queue.")
    return queue_param({"QueueUrl": parts[5]}, ctx)


def start_message_move_task(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Without a DestinationArn the service's redrive, every dead letter back to the queue it
    came from; with one, every message of the source moved there (a queue of the same type).
    Answered once the task has ended or after a few seconds; a task with a rate at once
    (``move_tasks``). One task of a source runs at a time."""
    q = _queue_of_arn(params, "SourceArn", ctx, required=True)
    dest = _queue_of_arn(params, "DestinationArn", ctx)
    rate = integer_param(params, "MaxNumberOfMessagesPerSecond", 1, move_tasks.MAX_RATE)
    if dest is not None and dest.strict != q.strict:
        raise invalid("The source queue and the destination queue must be of the same type (FIFO or standard).")
    if dest is not None and dest.pk == q.pk:
        raise invalid("The destination queue must not be the source queue.")
    # SQS: "This action is currently limited to supporting message redrive from queues that
    # are configured as dead-letter queues (DLQs) of other Amazon SQS queues only."
    if not (q.dead_letter_sources.exclude(pk=q.pk).exists() or q.dead_letter_subscriptions.exists()):
        raise invalid("Source queue must be configured as a Dead Letter Queue.")
    source, destination = params["SourceArn"], params.get("DestinationArn")
    return {"TaskHandle": move_tasks.start(q, source, ctx, dest, destination, rate)}


def list_message_move_tasks(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The ``MaxResults`` (1 by default, 10 at the most) most recent tasks of the source."""
    q = _queue_of_arn(params, "SourceArn", ctx, required=True)
    limit = integer_param(params, "MaxResults", 1, 10) or 1
    return {"Results": move_tasks.recent(q, limit)}


def cancel_message_move_task(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Stop the running task of ``TaskHandle``: what it moved stays moved. The caller needs
    the right that starting it needs (``manage`` on the source for a redrive, ``consume`` on
    it for a move to a DestinationArn). ResourceNotFoundException for a task not running."""
    handle = text_param(params, "TaskHandle", required=True)
    assert handle is not None
    task = move_tasks.parse_task_handle(handle)
    if task is None:
        raise SQSError("ResourceNotFoundException", "No task of that TaskHandle is running.")
    q = _queue_of_arn({"SourceArn": task["sourceArn"]}, "SourceArn", ctx, required=True)
    return {"ApproximateNumberOfMessagesMoved": move_tasks.cancel(q, handle, ctx)}


# --- messages -----------------------------------------------------------------------------------
@dataclass(slots=True)
class _Draft:
    draft: service.MessageDraft
    md5_body: str
    md5_attributes: str | None
    md5_system: str | None
    #: bytes of the body and the message attributes (what SQS's size limits count).
    size: int


_BAD_TRACE_HEADER = (
    "Value for parameter AWSTraceHeader is invalid. Reason: it must be a String holding an X-Ray trace header "
    f"(Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=<0|1|?>) of at most {MAX_XRAY_HEADER} characters."
)
_NO_DEDUP = (
    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly"
)
#: a MessageGroupId's or MessageDeduplicationId's form: 1 to 128 printable ASCII characters.
_GROUP_OR_DEDUP = re.compile(r"[!-~]{1,128}")


def _draft(entry: dict[str, Any], q: Any, settings: QueueSettings, ctx: Context, now: float) -> _Draft:
    """One SendMessage(Batch) entry as the service's draft. Raises SQSError.

    Runs for every message sent: each check once, the body encoded once, and each digest made
    once from those bytes (what a message without attributes needs: its MD5, and the SHA-256
    its sender's seal and a content-based deduplication ID share)."""
    body = entry.get("MessageBody")
    if not isinstance(body, str):
        body = text_param(entry, "MessageBody", required=True)  # (raises: missing, or not a string)
        assert body is not None
    if body == "":
        raise invalid("The request must contain a non-empty message body.")
    if not valid_text(body):
        raise SQSError("InvalidMessageContents", "Invalid characters found in the message body.")
    given = entry.get("MessageAttributes")
    attrs = checked_message_attributes(given) if given is not None else {}
    given = entry.get("MessageSystemAttributes")
    system = checked_message_attributes(given) if given is not None else {}
    if system and set(system) - {"AWSTraceHeader"}:
        raise invalid("Only AWSTraceHeader is a message system attribute one may send")
    if system:
        # SQS: a String holding an X-Ray trace header. Not counted in the message's size, so
        # bounded here (the value is not echoed: it may be long).
        data_type, header = system["AWSTraceHeader"]
        if data_type != "String" or not isinstance(header, str) or not valid_xray(header):
            raise invalid(_BAD_TRACE_HEADER)
    raw = body.encode("utf-8")  # (no surrogate: valid_text)
    size = len(raw) + attributes_size(attrs) if attrs else len(raw)
    if size > q.max_message_size:
        raise invalid(
            f"One or more parameters are invalid. Reason: Message must be shorter than {q.max_message_size} bytes."
        )
    delay = integer_param(entry, "DelaySeconds", *LIMITS["delay"]) if "DelaySeconds" in entry else None
    group = text_param(entry, "MessageGroupId")
    dedup = text_param(entry, "MessageDeduplicationId")
    if group is not None and not _GROUP_OR_DEDUP.fullmatch(group):
        raise invalid("MessageGroupId must be 1 to 128 printable ASCII characters")
    if dedup is not None and not _GROUP_OR_DEDUP.fullmatch(dedup):
        raise invalid("MessageDeduplicationId must be 1 to 128 printable ASCII characters")
    meta: dict[str, Any] = {}
    body_hash = None
    fairness_key = None
    if q.strict:
        if group is None:
            raise missing("MessageGroupId")
        if delay:
            raise invalid(
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request include parameter "
                "that is not valid for this queue type."
            )
        # SQS: a FIFO queue takes DelaySeconds only on the queue; a message's 0 is no delay of
        # its own, so the queue's applies
        delay = None
        if dedup is None:
            if not settings.content_based_dedup:
                raise invalid(_NO_DEDUP)
            dedup = body_hash = hashlib.sha256(raw).hexdigest()
        meta["dedup"] = dedup
        scoped = f"{group}\x00{dedup}" if (settings.opaque or {}).get("DeduplicationScope") == "messageGroup" else dedup
    else:
        if dedup is not None:
            raise invalid(
                "Value for parameter MessageDeduplicationId is invalid. Reason: The request include parameter "
                "that is not valid for this queue type."
            )
        # SQS fair queues: on a standard queue the group ID is a fairness key, not an order
        # (a group would order the service's delivery)
        fairness_key, group, scoped = group, None, None
    if ctx.sender_id:
        meta["sender"] = ctx.sender_id
        if body_hash is None:
            body_hash = hashlib.sha256(raw).hexdigest()  # (the sender's seal covers the body)
    # X-Ray: the request's header is the trace of every message it sends (one that is not an
    # X-Ray header was dropped as the call came in); the message system attribute, when given,
    # overrides it.
    if "AWSTraceHeader" in system:
        meta["trace"] = system["AWSTraceHeader"][1]
    elif ctx.trace_header:
        meta["trace"] = ctx.trace_header
    wait = q.delay if delay is None else delay
    draft = service.MessageDraft(
        body,
        group,
        scoped,
        now + wait if wait else None,
        stored_attributes(attrs, meta, queue=q.name, body=body, body_hash=body_hash),
        fairness_key=fairness_key,
    )
    return _Draft(
        draft,
        hashlib.md5(raw, usedforsecurity=False).hexdigest(),  # (md5_of_body, of the bytes at hand)
        md5_of_attributes(attrs) if attrs else None,
        md5_of_attributes(system) if system else None,
        size,
    )


def _sent(d: _Draft, message_id: str, fifo: bool) -> dict[str, Any]:
    out = {"MessageId": ids.issued_sqs_id(message_id), "MD5OfMessageBody": d.md5_body}
    if fifo:
        out["SequenceNumber"] = ids.sequence_number(message_id)
    if d.md5_attributes:
        out["MD5OfMessageAttributes"] = d.md5_attributes
    if d.md5_system:
        out["MD5OfMessageSystemAttributes"] = d.md5_system
    return out


def send_message(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = message_queue_param(params, ctx)
    d = _draft(params, q, served_settings(q), ctx, time.time())
    with service_errors():
        (message_id,) = service.enqueue(q.name, [d.draft], caller=ctx.caller)
    return _sent(d, message_id, q.strict)


def _entries(params: dict[str, Any], entry: str, key: str = "Entries") -> list[dict[str, Any]]:
    """A batch's entries, checked as a whole (SQS refuses the call for these). ``entry``: the
    entry's shape, which SQS names when there is none."""
    entries = params.get(key)
    if entries is None:
        raise missing(key)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid(f"{key} must be a list of structures")
    if not entries:
        raise SQSError("EmptyBatchRequest", f"There should be at least one {entry} in the request.")
    if len(entries) > MAX_BATCH:
        raise SQSError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are 10. You have sent {len(entries)}.",
        )
    seen = set()
    for e in entries:
        entry_id = e.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID.fullmatch(entry_id):
            raise SQSError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SQSError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failed(entry_id: str, err: SQSError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": err.sender_fault, "Code": err.code, "Message": err.message}


def _batch_result(ok: list[dict[str, Any]], failed: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Successful": ok, "Failed": failed}


def _fifo_batch(entries: list[dict[str, Any]], settings: QueueSettings) -> None:
    """SQS refuses a FIFO queue's batch as a whole (not entry by entry) when an entry has no
    MessageGroupId (MissingParameter), or no MessageDeduplicationId on a queue without
    ContentBasedDeduplication (InvalidParameterValue)."""
    if any(e.get("MessageGroupId") is None for e in entries):
        raise missing("MessageGroupId")
    if not settings.content_based_dedup and any(e.get("MessageDeduplicationId") is None for e in entries):
        raise invalid(_NO_DEDUP)


def send_message_batch(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Entries fail one by one, but for what SQS refuses the whole call for: the batch's size
    (bodies and message attributes over ``MAX_BATCH_BYTES``: BatchRequestTooLong) and a FIFO
    entry without its group or deduplication ID (:func:`_fifo_batch`). Nothing is stored then."""
    q = message_queue_param(params, ctx)
    entries = _entries(params, "SendMessageBatchRequestEntry")
    settings = served_settings(q)
    if q.strict:
        _fifo_batch(entries, settings)
    now = time.time()
    drafts: list[tuple[str, _Draft]] = []
    failed = []
    total = 0
    for e in entries:
        try:
            d = _draft(e, q, settings, ctx, now)
        except SQSError as err:
            failed.append(_failed(e["Id"], err))
            body = e.get("MessageBody")
            total += len(body.encode("utf-8", "surrogatepass")) if isinstance(body, str) else 0
            continue
        total += d.size
        drafts.append((e["Id"], d))
    if total > MAX_BATCH_BYTES:
        raise SQSError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. You have sent {total} bytes.",
        )
    ok = []
    if drafts:
        with service_errors():
            ids = service.enqueue(q.name, [d.draft for _, d in drafts], caller=ctx.caller)
        ok = [{"Id": entry_id, **_sent(d, mid, q.strict)} for (entry_id, d), mid in zip(drafts, ids)]
    return _batch_result(ok, failed)


#: ``base64.urlsafe_b64encode``'s alphabet from the standard one's (what it does, one call less).
_URLSAFE = bytes.maketrans(b"+/", b"-_")


#: SQS: a message's visibility timeout totals at most 12 hours from the receive, extensions
#: included (API reference, ChangeMessageVisibility).
MAX_TOTAL_VISIBILITY = 43200


def _receipt_handle(message_id: str, receipt: str, deadline: float, received: float) -> str:
    """The message ID, the service's receipt of this delivery, the wall-clock time (ms) its
    visibility timeout runs out, as first given (a FIFO receipt expires then), and the time
    (ms) it was received (the 12 hours a visibility may total count from it)."""
    raw = f"{message_id}\n{receipt}\n{int(deadline * 1000)}\n{int(received * 1000)}".encode()
    return binascii.b2a_base64(raw, newline=False).translate(_URLSAFE).decode()


def _handle_field(handle: Any, index: int) -> int | None:
    """A well-formed handle's time field (ms): 2 the first deadline, 3 the receive; else None."""
    try:
        return int(base64.urlsafe_b64decode(str(handle).encode()).decode().split("\n")[index])
    except (binascii.Error, UnicodeDecodeError, ValueError, IndexError):
        return None


def _expired(handle: Any) -> bool:
    """Whether a well-formed handle's visibility timeout, as first given, has run out."""
    deadline = _handle_field(handle, 2)
    return deadline is not None and deadline < time.time() * 1000


def _expired_error(handle: Any) -> SQSError:
    return invalid(f"Value {handle} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.")


def _parse_handle(handle: Any, q: Any) -> tuple[service.MessageId, str]:
    """(message ID, receipt) of a receipt handle of queue ``q``. Raises ReceiptHandleIsInvalid."""
    if not isinstance(handle, str) or not handle:
        raise SQSError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
    parsed = ids.parse_receipt_handle(handle, q.name)
    if parsed is None:
        raise SQSError("ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt handle.')
    return parsed


def _names(params: dict[str, Any], key: str) -> list[str]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise invalid(f"{key} must be a list of names")
    return value


#: the system attributes a message's stored SQS metadata holds (``meta``).
_FROM_META = frozenset({"SenderId", "MessageDeduplicationId", "AWSTraceHeader"})


def receive_message(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Up to ``MaxNumberOfMessages`` (1..10) messages, waiting up to ``WaitTimeSeconds`` (0..20)
    for the first; on a FIFO queue, a ``ReceiveRequestAttemptId`` seen within five minutes
    answers that receive's messages again while they are in flight (``sqs.receive_attempts``).
    Raises InvalidParameterValue, InvalidAttributeName, QueueDoesNotExist, AccessDenied,
    ServiceUnavailable."""
    q = message_queue_param(params, ctx)
    settings = served_settings(q)
    max_messages = integer_param(params, "MaxNumberOfMessages", 1, MAX_RECEIVE) or 1
    visibility = integer_param(params, "VisibilityTimeout", *LIMITS["visibility_timeout"])
    wait = integer_param(params, "WaitTimeSeconds", 0, MAX_RECEIVE_WAIT)
    if wait is None:
        wait = settings.receive_wait
    system = set(_names(params, "AttributeNames")) | set(_names(params, "MessageSystemAttributeNames"))
    unknown = system - SYSTEM_ATTRIBUTES - {"All"}
    if unknown:
        raise SQSError("InvalidAttributeName", f"Unknown Attribute {sorted(unknown)[0]}.")
    if "All" in system:
        system = set(SYSTEM_ATTRIBUTES)
    wanted = _names(params, "MessageAttributeNames")
    attempt = receive_attempts.attempt_param(params)
    if attempt is not None and q.strict:  # SQS: it applies only to FIFO queues
        again = receive_attempts.retried(q, ctx, attempt)
        if again is not None:
            return {"Messages": again}
    messages = _received(q, ctx, max_messages, visibility, wait, system, wanted)
    if attempt is not None and q.strict and messages:
        receive_attempts.remember(
            q, ctx, attempt, messages, visibility if visibility is not None else q.visibility_timeout
        )
    return {"Messages": messages} if messages else {}


def _received(
    q: Any, ctx: Context, max_messages: int, visibility: int | None, wait: int, system: set[str], wanted: list[str]
) -> list[dict[str, Any]]:
    """A receive's messages, as answered."""
    with service_errors():
        found = service.dequeue(
            q.name,
            caller=ctx.caller,
            max_messages=max_messages,
            visibility_timeout=float(visibility) if visibility is not None else None,
            wait=float(wait),
        )
    now = time.time()
    now_ms = str(int(now * 1000))
    deadline = now + (visibility if visibility is not None else q.visibility_timeout)
    messages = []
    for d in found:
        m = d.message
        assert m is not None
        history = m.history or {}
        source = history.get("source")
        # A dead letter keeps the MessageId it had where it came from (``history.id``, which
        # only a node writes); one moved back is a new message (SQS: a new MessageId).
        message_id = ids.sqs_message_id(str(history.get("id") or d.id)) if source else ids.issued_sqs_id(d.id)
        if not system and not wanted:
            # Nothing asked for but the message itself (most receives): its four fields only.
            messages.append(
                {
                    "MessageId": message_id,
                    "ReceiptHandle": _receipt_handle(d.id, d.receipt, deadline, now),
                    "MD5OfBody": md5_of_body(m.body),
                    "Body": m.body,
                }
            )
            continue
        # A dead letter's sender was sealed for the queue it came from. The seal is checked only
        # when the SenderId is asked for (no queue to check it for: no sender).
        sealed_for = (q.name, str(source or "")) if "SenderId" in system else ()
        if wanted or system & _FROM_META:
            attrs, meta = read_attributes(m.attributes, body=m.body, queues=sealed_for)
        else:  # nothing asked for that the stored attributes hold
            attrs, meta = {}, {}
        item: dict[str, Any] = {
            "MessageId": message_id,
            "ReceiptHandle": _receipt_handle(d.id, d.receipt, deadline, now),
            "MD5OfBody": md5_of_body(m.body),
            "Body": m.body,
        }
        every = {
            "SentTimestamp": str(int(m.enqueued_at * 1000)),
            "ApproximateReceiveCount": str(d.receive_count),
            # Not stored by the service: this receive's time for a first receive, else the
            # time it was sent (documented as approximate).
            "ApproximateFirstReceiveTimestamp": now_ms if d.receive_count == 1 else str(int(m.enqueued_at * 1000)),
        }
        if meta.get("sender"):
            every["SenderId"] = meta["sender"]
        if q.strict:
            every["SequenceNumber"] = ids.sequence_number(d.id)
            if m.group is not None:
                every["MessageGroupId"] = m.group
            if source:
                # SQS: a dead letter's deduplication ID is the original message's ID.
                every["MessageDeduplicationId"] = message_id
            elif meta.get("dedup"):
                every["MessageDeduplicationId"] = meta["dedup"]
        elif m.fairness_key is not None:  # a fair queue's message group ID
            every["MessageGroupId"] = m.fairness_key
        if meta.get("trace"):
            every["AWSTraceHeader"] = meta["trace"]
        elif "AWSTraceHeader" in system and isinstance(m.attributes, dict):
            # A message sent with W3C trace context (REST, the SDK): its traceparent as X-Ray's.
            parent = m.attributes.get(TRACEPARENT)
            xray = xray_of_traceparent(parent) if isinstance(parent, str) else None
            if xray:
                every["AWSTraceHeader"] = xray
        if source:
            every["DeadLetterQueueSourceArn"] = queue_arn(ctx, source, source.endswith(SERVICE_FIFO_SUFFIX))
        chosen = {k: v for k, v in every.items() if k in system}
        if chosen:
            item["Attributes"] = chosen
        selected = {n: a for n, a in attrs.items() if wanted_attribute(n, wanted)}
        if selected:
            item["MessageAttributes"] = attributes_json(selected)
            item["MD5OfMessageAttributes"] = md5_of_attributes(selected)
        messages.append(item)
    return messages


#: the service's reasons for a receipt that is not current: its message is not in flight
#: (acknowledged already, or visible again), or it was received again since.
_NOT_IN_FLIGHT = "not in flight"
_EARLIER = "earlier delivery"
_EXPIRED = "receipt expired"


def _mismatch(exc: service.ServiceError) -> str | None:
    """The service's reason why a receipt is not current (here or at another node), else None."""
    if isinstance(exc, service.ReceiptMismatch):
        return exc.reason
    if isinstance(exc, service.RemoteError) and exc.status == 409:
        return json.dumps(exc.payload)
    return None


def _ack(q: Any, ctx: Context, items: list[tuple[service.MessageId, str]], handle: Any = None) -> None:
    """Acknowledge; one message deleted already succeeds (SQS: a repeated delete does), one
    received again since is ReceiptHandleIsInvalid. On a FIFO queue a receipt whose
    visibility timeout ran out (the service's ``unexpired``; or, the message received again
    or no longer in flight, the one item's ``handle``) is refused as SQS refuses it
    (InvalidParameterValue), not taken. A batch refused as a whole is retried entry by entry
    by the caller."""
    with service_errors():
        try:
            service.ack(q.name, items, caller=ctx.caller, unexpired=q.strict)
        except (service.ReceiptMismatch, service.RemoteError) as exc:
            reason = _mismatch(exc)
            if reason is None or len(items) != 1:
                raise
            if q.strict and (_EXPIRED in reason or (handle is not None and _expired(handle))):
                raise _expired_error(handle) from None
            if _NOT_IN_FLIGHT in reason:
                return
            raise


def delete_message(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Deleting a message deleted already succeeds (as SQS); a receipt of an earlier delivery
    of a message received again since is ReceiptHandleIsInvalid (the service's receipts)."""
    q = message_queue_param(params, ctx)
    handle = params.get("ReceiptHandle")
    _ack(q, ctx, [_parse_handle(handle, q)], handle)
    return {}


def _per_entry(
    entries: list[dict[str, Any]], run: Callable[[dict[str, Any]], None]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ok, failed = [], []
    for e in entries:
        try:
            run(e)
        except SQSError as err:
            if err.code in ("QueueDoesNotExist", "AccessDenied", "ServiceUnavailable"):
                raise
            failed.append(_failed(e["Id"], err))
        else:
            ok.append({"Id": e["Id"]})
    return ok, failed


def delete_message_batch(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """One ack for the well-formed handles; if the service refuses it (a stale receipt changes
    nothing), each entry on its own, so the others still go and the stale one fails alone."""
    q = message_queue_param(params, ctx)
    entries = _entries(params, "DeleteMessageBatchRequestEntry")
    parsed: list[tuple[dict[str, Any], tuple[service.MessageId, str]]] = []
    failed = []
    for e in entries:
        try:
            parsed.append((e, _parse_handle(e.get("ReceiptHandle"), q)))
        except SQSError as err:
            failed.append(_failed(e["Id"], err))
    if parsed:
        try:
            _ack(q, ctx, [item for _, item in parsed])
            ok = [{"Id": e["Id"]} for e, _ in parsed]
        except SQSError as err:
            if err.code != "ReceiptHandleIsInvalid":
                raise
            items = {e["Id"]: item for e, item in parsed}
            ok, more = _per_entry(
                [e for e, _ in parsed],
                lambda e: _ack(q, ctx, [items[e["Id"]]], e.get("ReceiptHandle")),
            )
            failed += more
    else:
        ok = []
    return _batch_result(ok, failed)


def _change_visibility(q: Any, ctx: Context, handle: Any, timeout_value: Any) -> None:
    """Set the visibility timeout of the message a handle received, counted from now.

    Raises ReceiptHandleIsInvalid (a handle of no message of ``q``); InvalidParameterValue for
    a timeout past 12 hours from the handle's receive in total (SQS: "Total VisibilityTimeout
    for the message is beyond the limit"), for a message not in flight (deleted, or visible
    again: SQS's "not available for visibility timeout change"; on a FIFO queue an expired
    handle says so), or for a FIFO handle of an earlier delivery."""
    mid, receipt = _parse_handle(handle, q)
    timeout = integer_param({"VisibilityTimeout": timeout_value}, "VisibilityTimeout", *LIMITS["visibility_timeout"])
    if timeout is None:
        raise missing("VisibilityTimeout")
    received = _handle_field(handle, 3)
    # whole seconds since the receive: 43200 at once after a receive is taken, as SQS takes it
    if received is not None and int(time.time() - received / 1000) + timeout > MAX_TOTAL_VISIBILITY:
        raise invalid(
            f"Value {timeout} for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the "
            f"message is beyond the limit [{MAX_TOTAL_VISIBILITY} seconds]"
        )
    with service_errors():
        try:
            service.change_visibility(q.name, mid, receipt, float(timeout), caller=ctx.caller)
        except (service.ReceiptMismatch, service.RemoteError) as exc:
            reason = _mismatch(exc)
            if reason is None:
                raise
            if _EARLIER in reason and not q.strict:
                # SQS takes a standard queue's earlier receipt of a message in flight.
                service.change_visibility(q.name, mid, None, float(timeout), caller=ctx.caller)
                return
            if q.strict and _expired(handle):
                raise _expired_error(handle) from None
            raise invalid(
                f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not "
                "available for visibility timeout change."
            ) from None


def change_message_visibility(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = message_queue_param(params, ctx)
    _change_visibility(q, ctx, params.get("ReceiptHandle"), params.get("VisibilityTimeout"))
    return {}


def change_message_visibility_batch(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = message_queue_param(params, ctx)
    entries = _entries(params, "ChangeMessageVisibilityBatchRequestEntry")
    ok, failed = _per_entry(
        entries, lambda e: _change_visibility(q, ctx, e.get("ReceiptHandle"), e.get("VisibilityTimeout"))
    )
    return _batch_result(ok, failed)


ACTIONS: dict[str, Callable[[dict[str, Any], Context], dict[str, Any]]] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": permissions.add_permission,
    "RemovePermission": permissions.remove_permission,
}


def run(action: str, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Run one action. Raises SQSError (InvalidAction for an unknown one)."""
    fn = ACTIONS.get(action)
    if fn is None:
        raise SQSError("InvalidAction", f"The action {action} is not valid for this endpoint.")
    return fn(params, ctx)
