"""SQS's actions over the service: one function per action, ``(params, ctx) -> result``.

``params`` and the result are the AWS JSON 1.0 protocol's shapes (what boto3 sends and reads);
the query protocol is translated to and from them. Every call goes through ``queues.service``
as the access key's user (``ctx.caller``), so the REST API's permissions apply unchanged:
a queue the user may not read does not exist (QueueDoesNotExist), one it may read but not act
on answers AccessDenied. Refusals raise :class:`SQSError`.

How SQS's model maps onto the service's (the README's compatibility table says the same):

- A queue name ``x.fifo`` is the strict queue ``x-fifo`` of the service (its names have no
  dots); the REST API sees that name. A FIFO queue's MessageGroupId is the group, its
  deduplication ID (given, or the body's SHA-256 with ContentBasedDeduplication) the service's
  dedup ID, remembered five minutes (the queue's ``dedup_window``).
- VisibilityTimeout, MessageRetentionPeriod, DelaySeconds, MaximumMessageSize and RedrivePolicy
  are the queue's own fields; ReceiveMessageWaitTimeSeconds, ContentBasedDeduplication, tags
  and the attributes with no effect here live in ``models.QueueSettings``.
- A receipt handle carries the message ID and the service's receipt of that delivery.
- Message attributes are stored with the message's ``attributes`` (name -> text, so the REST
  API reads them too); the data types other than ``String`` and what SQS reports about the
  sender under the one key ``sqs:meta``, a string (``meta``: its form, and why the sender in it
  is sealed).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError

from queues import service
from queues.access import Caller

from . import meta as sqs_meta
from . import service as sqs_service
from .errors import SQSError
from .models import QueueSettings
from .service import OPAQUE

#: SQS's limits.
MAX_BATCH = 10
MAX_RECEIVE = 10
MAX_WAIT = 20
MAX_MESSAGE_ATTRIBUTES = 10
#: what a batch's bodies may add up to (SQS: the queue's maximum message size, 256 KiB by default).
MAX_BATCH_BYTES = 256 * 1024
FIFO_SUFFIX = ".fifo"
#: the service's name of a FIFO queue ends so (its names have no dots).
SERVICE_FIFO_SUFFIX = "-fifo"
#: the key of a message's ``attributes`` that keeps what SQS knows beyond name -> text.
META = sqs_meta.KEY

_SQS_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
_BAD_CHARS = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")

#: SQS attribute -> (queue field, lowest, highest): integer attributes stored on the queue row.
QUEUE_FIELDS = {
    "VisibilityTimeout": ("visibility_timeout", 0, 12 * 3600),
    "MessageRetentionPeriod": ("retention", 60, 14 * 24 * 3600),
    "DelaySeconds": ("delay", 0, 15 * 60),
    "MaximumMessageSize": ("max_message_size", 1024, 1024 * 1024),
}
READ_ONLY = {
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
}
SETTABLE = set(QUEUE_FIELDS) | OPAQUE | {"ReceiveMessageWaitTimeSeconds", "RedrivePolicy", "ContentBasedDeduplication"}
SYSTEM_ATTRIBUTES = {
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
}


@dataclass(frozen=True)
class Context:
    """Who calls, and how queue URLs and ARNs are spelled for them."""

    caller: Caller
    #: ``http://<host>/sqs``: queue URLs are ``<base_url>/<account>/<name>``.
    base_url: str
    account: str
    region: str
    #: the caller's SenderId: an opaque ID of its user (never a credential of theirs).
    sender_id: str = ""


# --- names, URLs, errors ------------------------------------------------------------------------
def service_name(sqs_name: str) -> str:
    if sqs_name.endswith(FIFO_SUFFIX):
        return sqs_name[: -len(FIFO_SUFFIX)] + SERVICE_FIFO_SUFFIX
    return sqs_name


def sqs_name(name: str, strict: bool) -> str:
    if strict and name.endswith(SERVICE_FIFO_SUFFIX):
        return name[: -len(SERVICE_FIFO_SUFFIX)] + FIFO_SUFFIX
    return name


def queue_url(ctx: Context, name: str, strict: bool) -> str:
    return f"{ctx.base_url}/{ctx.account}/{sqs_name(name, strict)}"


def queue_arn(ctx: Context, name: str, strict: bool) -> str:
    return f"arn:aws:sqs:{ctx.region}:{ctx.account}:{sqs_name(name, strict)}"


def _missing(name: str) -> SQSError:
    return SQSError("MissingParameter", f"The request must contain the parameter {name}.")


def _invalid(message: str) -> SQSError:
    return SQSError("InvalidParameterValue", message)


def _no_queue() -> SQSError:
    return SQSError("QueueDoesNotExist", "The specified queue does not exist.")


def _by_status(exc: service.ServiceError) -> SQSError:
    """A service error in SQS's terms by its status (another node's answer passed on, and any
    error :data:`_AWS_ERRORS` does not name)."""
    if exc.status == 404:
        return _no_queue()
    if exc.status == 403:
        return SQSError("AccessDenied", exc.detail)
    if exc.status == 409:
        return SQSError("ReceiptHandleIsInvalid", exc.detail)
    if exc.status == 429:  # SQS's throttling error, which SDKs back off from
        return SQSError("RequestThrottled", exc.detail, retry_after=exc.retry_after or 1)
    if exc.status < 500:
        return _invalid(exc.detail)
    return SQSError("ServiceUnavailable", exc.detail, retry_after=1)


#: The service errors whose SQS answer is not the one of their status, by class (the nearest
#: class in an error's MRO counts). None: not the service's to map (answered as it is).
_AWS_ERRORS: dict[type[service.ServiceError], Callable[[Any], SQSError | None]] = {
    SQSError: lambda exc: None,
    service.Fault: lambda exc: None,
    # 404 for the path's resource in the REST API; a parameter's value here.
    service.InvalidRequest: lambda exc: _invalid(exc.detail),
    service.ReceiptMismatch: lambda exc: SQSError(
        "ReceiptHandleIsInvalid", f"The receipt handle is not valid now: {exc}"
    ),
    # SQS has no conflict of state; the calls that meet one (a partition no live node holds)
    # may succeed on a retry.
    service.Conflict: lambda exc: SQSError("ServiceUnavailable", f"{exc.detail}; retry", retry_after=1),
    service.Unavailable: lambda exc: SQSError("ServiceUnavailable", f"unavailable now, retry: {exc}", retry_after=1),
}


def sqs_error(exc: service.ServiceError) -> SQSError | None:
    """``exc`` in SQS's terms; None where it is to be raised as it is."""
    for cls in type(exc).__mro__:
        if cls in _AWS_ERRORS:
            return _AWS_ERRORS[cls](exc)
    return _by_status(exc)


@contextmanager
def service_errors() -> Iterator[None]:
    """The service's exceptions as SQS's errors (the one place they are mapped)."""
    try:
        yield
    except service.ServiceError as exc:
        mapped = sqs_error(exc)
        if mapped is None:
            raise
        raise mapped from None
    except ValidationError as exc:
        raise SQSError("InvalidAttributeValue", "; ".join(exc.messages)) from None
    except DatabaseError as exc:
        raise SQSError("ServiceUnavailable", f"unavailable now, retry: {exc}", retry_after=1) from None


def _text(params: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise _missing(name)
        return None
    if not isinstance(value, str):
        raise _invalid(f"{name} must be a string")
    return value


def _integer(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(f"Value {value} for parameter {name} is invalid. Reason: must be between {low} and {high}.")
    return value


def _queue(params: dict[str, Any], ctx: Context) -> Any:
    """The queue row named by ``QueueUrl`` (any host: only the name counts), if readable."""
    url = _text(params, "QueueUrl", required=True)
    assert url is not None
    name = url.rstrip("/").rsplit("/", 1)[-1]
    with service_errors():
        try:
            q = service.get_queue(service_name(name), caller=ctx.caller)
        except service.QueueNotFound:
            raise _no_queue() from None
    if name.endswith(FIFO_SUFFIX) and not q.strict:
        raise _no_queue()
    return q


def _settings(q: Any) -> QueueSettings:
    return QueueSettings.objects.filter(queue_id=q.pk).first() or QueueSettings(queue_id=q.pk)


# --- queue attributes ---------------------------------------------------------------------------
def _redrive_policy(value: str, ctx: Context) -> tuple[Any, int]:
    """(dead-letter queue row, maxReceiveCount) of a RedrivePolicy."""
    try:
        policy = json.loads(value)
        arn = policy["deadLetterTargetArn"]
        count = int(policy["maxReceiveCount"])
    except (ValueError, KeyError, TypeError):
        raise SQSError(
            "InvalidAttributeValue",
            "RedrivePolicy must be JSON with deadLetterTargetArn and maxReceiveCount",
        ) from None
    if not isinstance(arn, str) or not 1 <= count <= 1000:
        raise SQSError("InvalidAttributeValue", "maxReceiveCount must be 1 to 1000")
    target = arn.rsplit(":", 1)[-1]
    with service_errors():
        try:
            dlq = service.get_queue(service_name(target), caller=ctx.caller)
        except service.QueueNotFound:
            raise SQSError(
                "InvalidAttributeValue", f"Value {value} for parameter RedrivePolicy is invalid. Reason: no {arn}."
            ) from None
    return dlq, count


def _attribute_integer(name: str, value: str, low: int, high: int) -> int:
    if not value.strip().isdigit() or not low <= int(value) <= high:
        raise SQSError("InvalidAttributeValue", f"Invalid value for the parameter {name}: {low} to {high}.")
    return int(value)


def _checked_attributes(attrs: Any, ctx: Context, *, fifo: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(queue fields, QueueSettings fields) of CreateQueue's or SetQueueAttributes' attributes."""
    if attrs is None:
        return {}, {}
    if not isinstance(attrs, dict) or not all(isinstance(v, str) for v in attrs.values()):
        raise _invalid("Attributes must map names to strings")
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    opaque: dict[str, str] = {}
    for name, value in attrs.items():
        if name in QUEUE_FIELDS:
            field, low, high = QUEUE_FIELDS[name]
            fields[field] = _attribute_integer(name, value, low, high)
        elif name == "ReceiveMessageWaitTimeSeconds":
            extra["receive_wait"] = _attribute_integer(name, value, 0, MAX_WAIT)
        elif name == "RedrivePolicy":
            if value == "":
                fields["dead_letter_queue"], fields["max_receives"] = None, None
            else:
                dlq, fields["max_receives"] = _redrive_policy(value, ctx)
                if dlq.strict != fifo:  # SQS: a FIFO queue's dead letters go to a FIFO queue
                    raise SQSError(
                        "InvalidParameterValue", "the dead-letter queue's type (FIFO or standard) must match"
                    )
                fields["dead_letter_queue"] = dlq
        elif name == "FifoQueue":
            if value.lower() not in ("true", "false") or (value.lower() == "true") != fifo:
                raise SQSError(
                    "InvalidAttributeValue", "FifoQueue is 'true' exactly for a queue whose name ends in .fifo"
                )
        elif name == "ContentBasedDeduplication":
            if value.lower() not in ("true", "false"):
                raise SQSError("InvalidAttributeValue", "ContentBasedDeduplication must be true or false")
            if not fifo and value.lower() == "true":
                raise SQSError("InvalidAttributeName", "ContentBasedDeduplication is for FIFO queues only")
            extra["content_based_dedup"] = value.lower() == "true"
        elif name in OPAQUE:
            opaque[name] = value
        elif name in READ_ONLY:
            raise SQSError("InvalidAttributeName", f"Attribute {name} cannot be set.")
        else:
            raise SQSError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if opaque:
        extra["opaque"] = opaque
    return fields, extra


def _attributes_of(q: Any, s: QueueSettings, ctx: Context) -> dict[str, str]:
    """Every attribute GetQueueAttributes answers but the message counts."""
    out = {
        "QueueArn": queue_arn(ctx, q.name, q.strict),
        "VisibilityTimeout": str(q.visibility_timeout),
        "MessageRetentionPeriod": str(q.retention),
        "DelaySeconds": str(q.delay),
        "MaximumMessageSize": str(q.max_message_size),
        "ReceiveMessageWaitTimeSeconds": str(s.receive_wait),
        "CreatedTimestamp": str(int(q.created_at.timestamp())),
        "LastModifiedTimestamp": str(
            int(max(q.updated_at, s.modified_at).timestamp() if s.modified_at else q.updated_at.timestamp())
        ),
        "SqsManagedSseEnabled": "false",
    }
    if q.dead_letter_queue_id is not None:
        dlq = q.dead_letter_queue
        out["RedrivePolicy"] = json.dumps(
            {"deadLetterTargetArn": queue_arn(ctx, dlq.name, dlq.strict), "maxReceiveCount": q.max_receives},
            separators=(",", ":"),
        )
    if q.strict:
        out["FifoQueue"] = "true"
        out["ContentBasedDeduplication"] = "true" if s.content_based_dedup else "false"
        out["DeduplicationScope"] = "queue"
        out["FifoThroughputLimit"] = "perQueue"
    out.update(s.opaque or {})
    return out


def _same(given: dict[str, str], current: dict[str, str]) -> bool:
    """CreateQueue of an existing queue: are the attributes it gives the queue's?"""
    for name, value in given.items():
        have = current.get(name)
        if name == "RedrivePolicy":
            try:
                a, b = json.loads(value), json.loads(have or "{}")
            except ValueError:
                return False
            if a.get("deadLetterTargetArn", "").rsplit(":", 1)[-1] != b.get("deadLetterTargetArn", "").rsplit(":", 1)[
                -1
            ] or int(a.get("maxReceiveCount", 0)) != int(b.get("maxReceiveCount", -1)):
                return False
        elif name in ("FifoQueue", "ContentBasedDeduplication"):
            if value.lower() != (have or "false"):
                return False
        elif have != value:
            return False
    return True


def _save_settings(q: Any, extra: dict[str, Any], ctx: Context, tags: dict[str, str] | None = None) -> None:
    if not extra and not tags:
        return
    with service_errors():
        sqs_service.update_queue_settings(q, caller=ctx.caller, **extra, **({"tags": tags} if tags else {}))


def _tags(value: Any, name: str = "Tags") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _invalid(f"{name} must map keys to strings")
    if len(value) > 50 or any(not 1 <= len(k) <= 128 or len(v) > 256 for k, v in value.items()):
        raise _invalid("at most 50 tags, keys of 1 to 128 characters, values of at most 256")
    return value


# --- queue actions ------------------------------------------------------------------------------
def create_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Idempotent as SQS: an existing queue of the name with the same attributes answers its
    URL; other attributes answer QueueNameExists (query code QueueAlreadyExists)."""
    name = _text(params, "QueueName", required=True)
    assert name is not None
    fifo = name.endswith(FIFO_SUFFIX)
    bare = name[: -len(FIFO_SUFFIX)] if fifo else name
    if not _SQS_NAME.fullmatch(bare) or len(name) > 80 or not bare[0].isalnum():
        raise _invalid(
            "Can only include alphanumeric characters, hyphens, or underscores (starting with a letter or "
            "digit here), 1 to 80 in length, .fifo at the end for a FIFO queue."
        )
    attrs = params.get("Attributes") or {}
    fields, extra = _checked_attributes(attrs, ctx, fifo=fifo)
    tags = _tags(params.get("tags"), "tags")
    target = service_name(name)

    def existing() -> dict[str, Any] | None:
        with service_errors():
            try:
                q = service.get_queue(target, caller=ctx.caller)
            except service.QueueNotFound:
                return None
        if q.strict != fifo or not _same(attrs, _attributes_of(q, _settings(q), ctx)):
            raise SQSError(
                "QueueNameExists", "A queue already exists with the same name and a different value for an attribute"
            )
        return {"QueueUrl": queue_url(ctx, q.name, q.strict)}

    found = existing()
    if found is not None:
        return found
    if fifo:
        fields.setdefault("dedup_window", 300)  # SQS's deduplication interval
    with service_errors():
        try:
            q = service.create_queue(caller=ctx.caller, name=target, strict=fifo, **fields)
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
    name = _text(params, "QueueName", required=True)
    q = _queue({"QueueUrl": name}, ctx)
    return {"QueueUrl": queue_url(ctx, q.name, q.strict)}


def _page(names: list[str], params: dict[str, Any]) -> tuple[list[str], str | None]:
    """SQS's pagination: MaxResults 1..1000 and an opaque NextToken (the last name answered)."""
    limit = _integer(params, "MaxResults", 1, 1000)
    token = _text(params, "NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise _invalid("Invalid NextToken value.") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:1000], None
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
    prefix = _text(params, "QueueNamePrefix") or ""
    with service_errors():
        rows = service.list_queues(caller=ctx.caller)
    by_name = {sqs_name(q.name, q.strict): q for q in rows}
    names = sorted(n for n in by_name if n.startswith(prefix))
    page, token = _page(names, params)
    return _result_page("QueueUrls", [queue_url(ctx, by_name[n].name, by_name[n].strict) for n in page], token)


def delete_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    with service_errors():
        service.delete_queue(q, caller=ctx.caller)
    return {}


def purge_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    with service_errors():
        service.purge(q.name, caller=ctx.caller)
    return {}


def get_queue_attributes(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    wanted = params.get("AttributeNames") or []
    if not isinstance(wanted, list) or not all(isinstance(n, str) for n in wanted):
        raise _invalid("AttributeNames must be a list of names")
    known = SETTABLE | READ_ONLY | {"FifoQueue"}
    for n in wanted:
        if n != "All" and n not in known:
            raise SQSError("InvalidAttributeName", f"Unknown Attribute {n}.")
    every = "All" in wanted
    out = _attributes_of(q, _settings(q), ctx)
    if every or {"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"} & set(wanted):
        with service_errors():
            stats = service.queue_stats(q.name, caller=ctx.caller)
        out["ApproximateNumberOfMessages"] = str(stats["depth"])
        out["ApproximateNumberOfMessagesNotVisible"] = str(stats["in_flight"])
    # The service counts delayed messages in the depth (it has no separate figure).
    out["ApproximateNumberOfMessagesDelayed"] = "0"
    if not every:
        out = {k: v for k, v in out.items() if k in wanted}
    return {"Attributes": out} if out else {}


def set_queue_attributes(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    attrs = params.get("Attributes")
    if attrs is None:
        raise _missing("Attributes")
    fields, extra = _checked_attributes(attrs, ctx, fifo=q.strict)
    with service_errors():
        # Checked for every change, even one of QueueSettings only: it needs ``manage``.
        q = service.update_queue(q, caller=ctx.caller, **fields)
    _save_settings(q, extra, ctx)
    return {}


def tag_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    tags = _tags(params.get("Tags"))
    if not tags:
        raise _missing("Tags")
    with service_errors():
        sqs_service.update_queue_settings(q, caller=ctx.caller, tags=tags)
    return {}


def untag_queue(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    keys = params.get("TagKeys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise _missing("TagKeys")
    with service_errors():
        sqs_service.update_queue_settings(q, caller=ctx.caller, remove_tags=keys)
    return {}


def list_queue_tags(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    tags = _settings(q).tags or {}
    return {"Tags": tags} if tags else {}


def list_dead_letter_source_queues(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    dlq = _queue(params, ctx)
    with service_errors():
        rows = service.list_queues(caller=ctx.caller)
    by_name = {sqs_name(q.name, q.strict): q for q in rows if q.dead_letter_queue_id == dlq.pk}
    page, token = _page(sorted(by_name), params)
    return _result_page("queueUrls", [queue_url(ctx, by_name[n].name, by_name[n].strict) for n in page], token)


#: the move tasks this process ran: handle -> ListMessageMoveTasks' entry.
_MOVE_TASKS: dict[str, dict[str, Any]] = {}


def start_message_move_task(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The service's redrive, run to the end before answering: every dead letter back to the
    queue it came from. Only that destination (no DestinationArn) is supported."""
    source = _text(params, "SourceArn", required=True)
    assert source is not None
    if params.get("DestinationArn"):
        raise SQSError("UnsupportedOperation", "dead letters move back to their source queues only (no DestinationArn)")
    q = _queue({"QueueUrl": source.rsplit(":", 1)[-1]}, ctx)
    started = int(time.time() * 1000)
    moved = 0
    with service_errors():
        while True:
            result = service.redrive(q.name, 1000, caller=ctx.caller)
            moved += result.moved
            if result.moved + result.skipped == 0 or result.moved == 0:
                break
    handle = base64.urlsafe_b64encode(json.dumps({"queue": q.name, "at": started}).encode()).decode()
    _MOVE_TASKS[handle] = {
        "TaskHandle": handle,
        "Status": "COMPLETED",
        "SourceArn": source,
        "ApproximateNumberOfMessagesMoved": moved,
        "ApproximateNumberOfMessagesToMove": moved,
        "StartedTimestamp": started,
    }
    return {"TaskHandle": handle}


def list_message_move_tasks(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    source = _text(params, "SourceArn", required=True)
    assert source is not None
    q = _queue({"QueueUrl": source.rsplit(":", 1)[-1]}, ctx)
    tasks = [
        t for t in _MOVE_TASKS.values() if json.loads(base64.urlsafe_b64decode(t["TaskHandle"]))["queue"] == q.name
    ]
    return {"Results": sorted(tasks, key=lambda t: -t["StartedTimestamp"])[:10]}


def unsupported(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    raise SQSError("UnsupportedOperation", "not supported here: grants are managed in the admin or the REST API")


# --- message attributes and digests -------------------------------------------------------------
def _digest_part(h: Any, data: bytes) -> None:
    h.update(len(data).to_bytes(4, "big"))
    h.update(data)


def md5_of_attributes(attrs: dict[str, tuple[str, str | bytes]]) -> str:
    """SQS's MD5 of message attributes: by name, each as length-prefixed name, data type, a
    transport byte (1 string/number, 2 binary) and length-prefixed value."""
    h = hashlib.md5()
    for name in sorted(attrs):
        data_type, value = attrs[name]
        _digest_part(h, name.encode("utf-8"))
        _digest_part(h, data_type.encode("utf-8"))
        if isinstance(value, bytes):
            h.update(b"\x02")
            _digest_part(h, value)
        else:
            h.update(b"\x01")
            _digest_part(h, value.encode("utf-8"))
    return h.hexdigest()


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8")).hexdigest()


def _message_attributes(value: Any, where: str = "") -> dict[str, tuple[str, str | bytes]]:
    """MessageAttributes checked: name -> (data type, text or bytes)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"{where}MessageAttributes must be a map")
    if len(value) > MAX_MESSAGE_ATTRIBUTES:
        raise _invalid(f"{where}Number of message attributes [{len(value)}] exceeds the allowed maximum [10].")
    out: dict[str, tuple[str, str | bytes]] = {}
    for name, attr in value.items():
        low = name.lower()
        if (
            not _ATTRIBUTE_NAME.fullmatch(name)
            or low.startswith(("aws.", "amazon."))
            or name.startswith(".")
            or name.endswith(".")
            or ".." in name
        ):
            raise _invalid(f"{where}Message attribute name '{name}' is invalid.")
        if not isinstance(attr, dict):
            raise _invalid(f"{where}Message attribute '{name}' must be a structure")
        data_type = attr.get("DataType")
        if not isinstance(data_type, str) or not data_type:
            raise _invalid(f"{where}The message attribute '{name}' must contain a non-empty message attribute type.")
        base = data_type.split(".", 1)[0]
        if base not in ("String", "Number", "Binary") or len(data_type) > 256:
            raise _invalid(f"{where}The type of message attribute '{name}' is invalid ({data_type}).")
        if base == "Binary":
            raw = attr.get("BinaryValue")
            if isinstance(raw, str):
                try:
                    raw = base64.b64decode(raw, validate=True)
                except (binascii.Error, ValueError):
                    raise _invalid(f"{where}Message attribute '{name}' has a BinaryValue that is not base64") from None
            if not isinstance(raw, bytes) or not raw:
                raise _invalid(f"{where}The message attribute '{name}' must contain a non-empty value of type Binary")
            out[name] = (data_type, raw)
        else:
            text = attr.get("StringValue")
            if not isinstance(text, str) or not text:
                raise _invalid(f"{where}The message attribute '{name}' must contain a non-empty value of type {base}")
            if base == "Number" and not _NUMBER.fullmatch(text.strip()):
                raise _invalid(f"{where}Message attribute '{name}' is not a number: {text!r}")
            if _BAD_CHARS.search(text):
                raise SQSError("InvalidMessageContents", f"{where}Message attribute '{name}' has invalid characters")
            out[name] = (data_type, text)
    return out


def _stored_attributes(
    attrs: dict[str, tuple[str, str | bytes]], meta: dict[str, Any], *, queue: str, body: str
) -> dict[str, Any] | None:
    """As the service stores them: name -> text (binary as base64), the rest under ``META``
    (a string: ``meta.encode``) for a message of ``queue`` with ``body``."""
    if not attrs and not meta:
        return None
    out: dict[str, Any] = {}
    types = {}
    for name, (data_type, value) in attrs.items():
        out[name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
        if data_type != "String":
            types[name] = data_type
    if types:
        meta = {**meta, "types": types}
    if meta:
        out[META] = sqs_meta.encode(out, meta, queue=queue, body=body)
    return out


def _read_attributes(
    stored: dict[str, Any] | None, *, body: str, queues: tuple[str, ...]
) -> tuple[dict[str, tuple[str, str | bytes]], dict[str, Any]]:
    """A stored message's attributes as SQS's, and its ``META`` (``meta.decode``: its sender
    only if sealed for one of ``queues``); a REST message's numbers are Number, its booleans
    String."""
    if not stored:
        return {}, {}
    meta = sqs_meta.decode(stored, body=body, queues=queues)
    types = meta.get("types") or {}
    out: dict[str, tuple[str, str | bytes]] = {}
    for name, value in stored.items():
        if name == META:
            continue
        data_type = types.get(name) if isinstance(value, str) else None
        if data_type is None:
            if isinstance(value, bool):
                data_type, value = "String", "true" if value else "false"
            elif isinstance(value, (int, float)):
                data_type, value = "Number", str(value)
            else:
                data_type, value = "String", str(value)
        if data_type.startswith("Binary"):
            try:
                out[name] = (data_type, base64.b64decode(value))
            except (binascii.Error, ValueError):
                out[name] = ("String", str(value))
        else:
            out[name] = (data_type, str(value))
    return out, meta


def _attributes_json(attrs: dict[str, tuple[str, str | bytes]]) -> dict[str, Any]:
    out = {}
    for name, (data_type, value) in attrs.items():
        if isinstance(value, bytes):
            out[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(value).decode()}
        else:
            out[name] = {"DataType": data_type, "StringValue": value}
    return out


def _attributes_size(attrs: dict[str, tuple[str, str | bytes]]) -> int:
    return sum(
        len(n.encode()) + len(t.encode()) + len(v if isinstance(v, bytes) else v.encode())
        for n, (t, v) in attrs.items()
    )


# --- messages -----------------------------------------------------------------------------------
@dataclass
class _Draft:
    draft: service.MessageDraft
    md5_body: str
    md5_attributes: str | None
    md5_system: str | None


def _draft(entry: dict[str, Any], q: Any, settings: QueueSettings, ctx: Context, now: float) -> _Draft:
    """One SendMessage(Batch) entry as the service's draft. Raises SQSError."""
    body = _text(entry, "MessageBody", required=True)
    assert body is not None
    if body == "":
        raise _invalid("The request must contain a non-empty message body.")
    if _BAD_CHARS.search(body):
        raise SQSError("InvalidMessageContents", "Invalid characters found in the message body.")
    attrs = _message_attributes(entry.get("MessageAttributes"))
    system = _message_attributes(entry.get("MessageSystemAttributes"))
    if set(system) - {"AWSTraceHeader"}:
        raise _invalid("Only AWSTraceHeader is a message system attribute one may send")
    size = len(body.encode("utf-8")) + _attributes_size(attrs)
    if size > q.max_message_size:
        raise _invalid(
            f"One or more parameters are invalid. Reason: Message must be shorter than {q.max_message_size} bytes."
        )
    delay = _integer(entry, "DelaySeconds", 0, 15 * 60)
    group = _text(entry, "MessageGroupId")
    dedup = _text(entry, "MessageDeduplicationId")
    for name, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
        if value is not None and not (1 <= len(value) <= 128 and re.fullmatch(r"[!-~]+", value)):
            raise _invalid(f"{name} must be 1 to 128 printable ASCII characters")
    meta: dict[str, Any] = {}
    if q.strict:
        if group is None:
            raise _missing("MessageGroupId")
        if delay:
            raise _invalid(
                "Value for parameter DelaySeconds is invalid. Reason: The request include parameter that is "
                "not valid for this queue type."
            )
        if dedup is None:
            if not settings.content_based_dedup:
                raise _invalid(
                    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
                    "provided explicitly"
                )
            dedup = hashlib.sha256(body.encode("utf-8")).hexdigest()
        meta["dedup"] = dedup
        scoped = f"{group}\x00{dedup}" if (settings.opaque or {}).get("DeduplicationScope") == "messageGroup" else dedup
    else:
        if dedup is not None:
            raise _invalid(
                "Value for parameter MessageDeduplicationId is invalid. Reason: The request include parameter "
                "that is not valid for this queue type."
            )
        # A standard queue keeps no order: a group would order the service's delivery.
        group, scoped = None, None
    if ctx.sender_id:
        meta["sender"] = ctx.sender_id
    if "AWSTraceHeader" in system:
        meta["trace"] = system["AWSTraceHeader"][1]
    wait = q.delay if delay is None else delay
    draft = service.MessageDraft(
        body,
        group=group,
        dedup_id=scoped,
        not_before=now + wait if wait else None,
        attributes=_stored_attributes(attrs, meta, queue=q.name, body=body),
    )
    return _Draft(
        draft,
        md5_of_body(body),
        md5_of_attributes(attrs) if attrs else None,
        md5_of_attributes(system) if system else None,
    )


def _sent(d: _Draft, message_id: str) -> dict[str, Any]:
    out = {"MessageId": message_id, "MD5OfMessageBody": d.md5_body}
    if d.md5_attributes:
        out["MD5OfMessageAttributes"] = d.md5_attributes
    if d.md5_system:
        out["MD5OfMessageSystemAttributes"] = d.md5_system
    return out


def send_message(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    d = _draft(params, q, _settings(q), ctx, time.time())
    with service_errors():
        (message_id,) = service.enqueue(q.name, [d.draft], caller=ctx.caller)
    return _sent(d, message_id)


def _entries(params: dict[str, Any], key: str = "Entries") -> list[dict[str, Any]]:
    """A batch's entries, checked as a whole (SQS refuses the call for these)."""
    entries = params.get(key)
    if entries is None:
        raise _missing(key)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _invalid(f"{key} must be a list of structures")
    if not entries:
        raise SQSError("EmptyBatchRequest", "There should be at least one entry in the request.")
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
                f"A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long: {entry_id!r}",
            )
        if entry_id in seen:
            raise SQSError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failed(entry_id: str, err: SQSError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": err.sender_fault, "Code": err.code, "Message": err.message}


def _batch_result(ok: list[dict[str, Any]], failed: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Successful": ok, "Failed": failed}


def send_message_batch(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    entries = _entries(params)
    settings = _settings(q)
    now = time.time()
    drafts: list[tuple[str, _Draft]] = []
    failed = []
    total = 0
    for e in entries:
        try:
            d = _draft(e, q, settings, ctx, now)
        except SQSError as err:
            failed.append(_failed(e["Id"], err))
            continue
        total += len(d.draft.body.encode("utf-8"))
        drafts.append((e["Id"], d))
    if total > max(MAX_BATCH_BYTES, q.max_message_size):
        raise SQSError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {max(MAX_BATCH_BYTES, q.max_message_size)} bytes.",
        )
    ok = []
    if drafts:
        with service_errors():
            ids = service.enqueue(q.name, [d.draft for _, d in drafts], caller=ctx.caller)
        ok = [{"Id": entry_id, **_sent(d, mid)} for (entry_id, d), mid in zip(drafts, ids)]
    return _batch_result(ok, failed)


def _receipt_handle(message_id: str, receipt: str) -> str:
    return base64.urlsafe_b64encode(f"{message_id}\n{receipt}".encode()).decode()


def _parse_handle(handle: Any, q: Any) -> tuple[service.MessageId, str]:
    """(message ID, receipt) of a receipt handle of queue ``q``. Raises ReceiptHandleIsInvalid."""
    if not isinstance(handle, str) or not handle:
        raise SQSError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
    try:
        message_id, _, receipt = base64.urlsafe_b64decode(handle.encode()).decode().partition("\n")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise SQSError(
            "ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt handle.'
        ) from None
    mid = service.parse_message_id(message_id)
    if mid is None or mid.queue != q.name or not receipt:
        raise SQSError("ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt handle.')
    return mid, receipt


def _names(params: dict[str, Any], key: str) -> list[str]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise _invalid(f"{key} must be a list of names")
    return value


def _wanted_attribute(name: str, wanted: list[str]) -> bool:
    for w in wanted:
        if w in ("All", ".*") or w == name or (w.endswith(".*") and name.startswith(w[:-1])):
            return True
    return False


def receive_message(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    settings = _settings(q)
    max_messages = _integer(params, "MaxNumberOfMessages", 1, MAX_RECEIVE) or 1
    visibility = _integer(params, "VisibilityTimeout", 0, 12 * 3600)
    wait = _integer(params, "WaitTimeSeconds", 0, MAX_WAIT)
    if wait is None:
        wait = settings.receive_wait
    system = set(_names(params, "AttributeNames")) | set(_names(params, "MessageSystemAttributeNames"))
    unknown = system - SYSTEM_ATTRIBUTES - {"All"}
    if unknown:
        raise SQSError("InvalidAttributeName", f"Unknown Attribute {sorted(unknown)[0]}.")
    if "All" in system:
        system = set(SYSTEM_ATTRIBUTES)
    wanted = _names(params, "MessageAttributeNames")
    with service_errors():
        found = service.dequeue(
            q.name,
            caller=ctx.caller,
            max_messages=max_messages,
            visibility=float(visibility) if visibility is not None else None,
            wait=float(wait),
        )
    now_ms = str(int(time.time() * 1000))
    messages = []
    for d in found:
        m = d.message
        assert m is not None
        source = (m.history or {}).get("source")
        # A dead letter's sender was sealed for the queue it came from.
        attrs, meta = _read_attributes(m.attributes, body=m.body, queues=(q.name, str(source or "")))
        item: dict[str, Any] = {
            "MessageId": d.id,
            "ReceiptHandle": _receipt_handle(d.id, d.receipt),
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
            every["SequenceNumber"] = str(m.sequence)
            if m.group is not None:
                every["MessageGroupId"] = m.group
            if meta.get("dedup"):
                every["MessageDeduplicationId"] = meta["dedup"]
        if meta.get("trace"):
            every["AWSTraceHeader"] = meta["trace"]
        if source:
            every["DeadLetterQueueSourceArn"] = queue_arn(ctx, source, source.endswith(SERVICE_FIFO_SUFFIX))
        chosen = {k: v for k, v in every.items() if k in system}
        if chosen:
            item["Attributes"] = chosen
        selected = {n: a for n, a in attrs.items() if _wanted_attribute(n, wanted)}
        if selected:
            item["MessageAttributes"] = _attributes_json(selected)
            item["MD5OfMessageAttributes"] = md5_of_attributes(selected)
        messages.append(item)
    return {"Messages": messages} if messages else {}


#: the service's reason for a receipt whose message is not in flight: acknowledged already.
_NOT_IN_FLIGHT = "not in flight"


def _ack(q: Any, ctx: Context, items: list[tuple[service.MessageId, str]]) -> None:
    """Acknowledge; one message deleted already succeeds (SQS: a repeated delete does), one
    received again since is ReceiptHandleIsInvalid. A batch refused as a whole is retried
    entry by entry by the caller."""
    with service_errors():
        try:
            service.ack(q.name, items, caller=ctx.caller)
        except service.ReceiptMismatch as exc:
            if len(items) == 1 and exc.reason.startswith(_NOT_IN_FLIGHT):
                return
            raise
        except service.RemoteError as exc:
            if len(items) == 1 and exc.status == 409 and _NOT_IN_FLIGHT in json.dumps(exc.payload):
                return
            raise


def delete_message(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Deleting a message deleted already succeeds (as SQS); a receipt of an earlier delivery
    of a message received again since is ReceiptHandleIsInvalid (the service's receipts)."""
    q = _queue(params, ctx)
    _ack(q, ctx, [_parse_handle(params.get("ReceiptHandle"), q)])
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
    q = _queue(params, ctx)
    entries = _entries(params)
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
            ok, more = _per_entry([e for e, _ in parsed], lambda e: _ack(q, ctx, [items[e["Id"]]]))
            failed += more
    else:
        ok = []
    return _batch_result(ok, failed)


def _change_visibility(q: Any, ctx: Context, handle: Any, timeout_value: Any) -> None:
    mid, receipt = _parse_handle(handle, q)
    timeout = _integer({"VisibilityTimeout": timeout_value}, "VisibilityTimeout", 0, 12 * 3600)
    if timeout is None:
        raise _missing("VisibilityTimeout")
    try:
        with service_errors():
            service.change_visibility(q.name, mid, receipt, float(timeout), caller=ctx.caller)
    except SQSError as err:
        if err.code == "ReceiptHandleIsInvalid":
            raise SQSError("MessageNotInflight", "The message referred to isn't in flight.") from None
        raise


def change_message_visibility(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    _change_visibility(q, ctx, params.get("ReceiptHandle"), params.get("VisibilityTimeout"))
    return {}


def change_message_visibility_batch(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _queue(params, ctx)
    entries = _entries(params)
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
    "CancelMessageMoveTask": unsupported,
    "AddPermission": unsupported,
    "RemovePermission": unsupported,
}


def run(action: str, params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Run one action. Raises SQSError (InvalidAction for an unknown one)."""
    fn = ACTIONS.get(action)
    if fn is None:
        raise SQSError("InvalidAction", f"The action {action} is not valid for this endpoint.")
    return fn(params, ctx)
