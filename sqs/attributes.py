"""SQS's queue attributes over the service's queue: which attribute is which field, their
bounds, their check (CreateQueue, SetQueueAttributes) and what GetQueueAttributes answers.

VisibilityTimeout, MessageRetentionPeriod, DelaySeconds, MaximumMessageSize and RedrivePolicy
are the queue's own fields, bounded by the service's ``LIMITS`` (not restated here);
ReceiveMessageWaitTimeSeconds, ContentBasedDeduplication, tags and the attributes with no
effect here (:data:`OPAQUE`) live in ``models.QueueSettings``. The bounds that are SQS's own
(AWS's, whatever the service allows) are the constants below.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from queues import service
from queues.public import LIMITS
from sqs import wire
from sqs.context import Context, integer_of, invalid, queue_arn, service_errors, service_name, shown
from sqs.errors import SQSError
from sqs.models import QueueSettings
from sqs.query import valid_text

# --- SQS's own limits (the service's are its LIMITS) --------------------------------------------
#: entries of a batch call (SendMessageBatch, DeleteMessageBatch, ChangeMessageVisibilityBatch).
MAX_BATCH = 10
#: messages one ReceiveMessage answers.
MAX_RECEIVE = 10
#: a long poll's longest wait: WaitTimeSeconds and ReceiveMessageWaitTimeSeconds.
MAX_RECEIVE_WAIT = 20
#: message attributes of one message.
MAX_MESSAGE_ATTRIBUTES = 10
#: what a batch's messages may add up to, bodies and message attributes (SQS: 1 MiB).
MAX_BATCH_BYTES = 1024 * 1024
#: the smallest MaximumMessageSize (the largest is the service's).
MIN_MESSAGE_SIZE = 1024
#: a queue's MaximumMessageSize when CreateQueue names none (SQS's: 1 MiB, the service's largest;
#: the REST API's default is less).
DEFAULT_MESSAGE_SIZE = 1024 * 1024
#: a FIFO queue's deduplication interval, seconds (the queue's ``dedup_window``).
DEDUP_INTERVAL = 300
#: the most results of a listing (ListQueues, ListDeadLetterSourceQueues).
MAX_RESULTS = 1000
#: a queue's tags: how many, the length of a key (from 1) and of a value.
MAX_TAGS = 50
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256

#: SQS attribute -> (queue field, lowest, highest): integer attributes stored on the queue row.
#: SQS's attribute -> (the queue's setting, its least and greatest value).
QUEUE_FIELDS: dict[str, tuple[Literal["visibility_timeout", "retention", "delay", "max_message_size"], int, int]] = {
    "VisibilityTimeout": ("visibility_timeout", *LIMITS["visibility_timeout"]),
    "MessageRetentionPeriod": ("retention", *LIMITS["retention"]),
    "DelaySeconds": ("delay", *LIMITS["delay"]),
    "MaximumMessageSize": ("max_message_size", MIN_MESSAGE_SIZE, LIMITS["max_message_size"][1]),
}
#: attributes an SQS client may set that the service keeps as given and answers back
#: (SetQueueAttributes, GetQueueAttributes); DeduplicationScope is read by SendMessage.
OPAQUE = frozenset(
    {
        "Policy",
        "KmsMasterKeyId",
        "KmsDataKeyReusePeriodSeconds",
        "SqsManagedSseEnabled",
        "RedriveAllowPolicy",
        "DeduplicationScope",
        "FifoThroughputLimit",
    }
)
#: attributes of FIFO queues only: a standard queue does not know them (InvalidAttributeName).
FIFO_ONLY = frozenset({"ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"})
#: the values SQS takes for these attributes kept as given.
CHOICES = {
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
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


#: SQS's answer to ``FifoQueue=true`` on a name without ``.fifo``.
FIFO_NAME = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, "
    "must end with .fifo suffix and be 1 to 80 in length."
)


def settings_of(q: Any) -> QueueSettings:
    """Queue ``q``'s SQS settings (their defaults if it has none stored)."""
    return QueueSettings.objects.filter(queue_id=q.pk).first() or QueueSettings(queue_id=q.pk)


class _ServedSettings:
    """queue id -> (the description it was read with, its settings): the message actions' SQS
    settings, read once per description of the queue this node serves (``service.authorize``).

    The node reads its queues' descriptions again on every housekeeping pass (a new object
    each time), so settings changed in another process are seen as soon as a change of the
    queue's own fields would be, the REST API's rule; a change made in this process is seen at
    once (its save forgets them, and so does its commit)."""

    _cache: dict[int, tuple[object, QueueSettings]] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, cfg: Any) -> QueueSettings:
        hit = cls._cache.get(cfg.id)
        if hit is not None and hit[0] is cfg:
            return hit[1]
        found = QueueSettings.objects.filter(queue_id=cfg.id).first() or QueueSettings(queue_id=cfg.id)
        with cls._lock:
            if len(cls._cache) > 10_000:
                cls._cache.clear()
            cls._cache[cfg.id] = (cfg, found)
        return found

    @classmethod
    def forget(cls, **_: Any) -> None:
        with cls._lock:
            cls._cache.clear()


def served_settings(cfg: Any) -> QueueSettings:
    """The SQS settings of the queue described by ``cfg`` (a ``QueueConfig`` from
    ``service.authorize``), cached for that description (:class:`_ServedSettings`). Read only."""
    return _ServedSettings.get(cfg)


def _settings_changed(**_: Any) -> None:
    _ServedSettings.forget()
    # (and after the commit: a call that read the rows before it must not keep them)
    transaction.on_commit(_ServedSettings.forget)


post_save.connect(_settings_changed, sender=QueueSettings, dispatch_uid="sqs.attributes.settings_saved")
post_delete.connect(_settings_changed, sender=QueueSettings, dispatch_uid="sqs.attributes.settings_deleted")


def _bad_redrive(value: str, reason: str) -> SQSError:
    """SQS answers a RedrivePolicy it cannot take with InvalidParameterValue."""
    return invalid(f"Value {shown(value, 1024)} for parameter RedrivePolicy is invalid. Reason: {reason}")


def _redrive_policy(value: str, ctx: Context, queue: str | None) -> tuple[Any, int]:
    """(dead-letter queue row, maxReceiveCount) of a RedrivePolicy of queue ``queue`` (the
    service's name; None: not created yet)."""
    try:
        # (bounded: a policy nested thousands deep would recurse past the stack)
        policy = wire.loads(value)
        arn = policy["deadLetterTargetArn"]
        given = policy["maxReceiveCount"]
    except (ValueError, KeyError, TypeError):
        raise _bad_redrive(value, "Redrive policy must be JSON with deadLetterTargetArn and maxReceiveCount.") from None
    low, high = LIMITS["max_receives"]
    # (a whole number in JSON's float form, 5.0, is one too; infinity and NaN are none)
    count = int(given) if isinstance(given, float) and given.is_integer() else integer_of(given)
    if not isinstance(arn, str) or count is None or not low <= count <= high:
        raise _bad_redrive(
            value, f"Invalid value for maxReceiveCount: {shown(given)}, valid values are from {low} to {high}."
        )
    target = service_name(arn.rsplit(":", 1)[-1])
    if target == queue:
        raise _bad_redrive(value, "A queue cannot be its own dead-letter queue.")
    with service_errors():
        try:
            dlq = service.get_queue(target, caller=ctx.caller)
        except service.QueueNotFound:
            raise _bad_redrive(value, "Dead letter target does not exist.") from None
    return dlq, count


def _attribute_integer(name: str, value: str, low: int, high: int) -> int:
    number = integer_of(value)
    if number is None or not low <= number <= high:
        raise SQSError("InvalidAttributeValue", f"Invalid value for the parameter {name}: {low} to {high}.")
    return number


def checked_attributes(
    attrs: Any, ctx: Context, *, fifo: bool, queue: str | None = None
) -> tuple[service.QueueFields, dict[str, Any]]:
    """(queue fields, QueueSettings fields) of CreateQueue's or SetQueueAttributes' attributes
    for queue ``queue`` (the service's name). An attribute of FIFO queues on a standard queue
    is unknown there (InvalidAttributeName); ``FifoQueue=true`` on a name without ``.fifo``
    is an invalid name (InvalidParameterValue); an attribute kept as given set to ``""`` is
    removed (``Policy``)."""
    if attrs is None:
        return {}, {}
    if not isinstance(attrs, dict) or not all(isinstance(v, str) for v in attrs.values()):
        raise invalid("Attributes must map names to strings")
    for name, value in attrs.items():
        if not valid_text(value):  # (kept and answered: in XML too)
            raise SQSError(
                "InvalidAttributeValue", f"Invalid characters found in the value of the parameter {shown(name)}."
            )
    fields: service.QueueFields = {}
    extra: dict[str, Any] = {}
    opaque: dict[str, str] = {}
    for name, value in attrs.items():
        if name in FIFO_ONLY and not fifo:
            raise SQSError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if name in QUEUE_FIELDS:
            field, low, high = QUEUE_FIELDS[name]
            fields[field] = _attribute_integer(name, value, low, high)
        elif name == "ReceiveMessageWaitTimeSeconds":
            extra["receive_wait"] = _attribute_integer(name, value, 0, MAX_RECEIVE_WAIT)
        elif name == "RedrivePolicy":
            if value == "":
                fields["dead_letter_queue"], fields["max_receives"] = None, None
            else:
                dlq, fields["max_receives"] = _redrive_policy(value, ctx, queue)
                if dlq.strict != fifo:  # SQS: a FIFO queue's dead letters go to a FIFO queue
                    raise SQSError(
                        "InvalidParameterValue", "the dead-letter queue's type (FIFO or standard) must match"
                    )
                fields["dead_letter_queue"] = dlq
        elif name == "FifoQueue":
            if value.lower() not in ("true", "false"):
                raise SQSError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            if (value.lower() == "true") != fifo:
                raise invalid(FIFO_NAME if not fifo else "FifoQueue is true on a FIFO queue; it cannot change.")
        elif name == "ContentBasedDeduplication":
            if value.lower() not in ("true", "false"):
                raise SQSError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            extra["content_based_dedup"] = value.lower() == "true"
        elif name in CHOICES and value not in CHOICES[name]:
            raise SQSError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        elif name in OPAQUE:
            opaque[name] = value
        elif name in READ_ONLY:
            raise SQSError("InvalidAttributeName", f"Attribute {name} cannot be set.")
        else:
            raise SQSError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if opaque:
        extra["opaque"] = opaque
    return fields, extra


def attributes_of(q: Any, s: QueueSettings, ctx: Context) -> dict[str, str]:
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


def same_attributes(given: dict[str, str], current: dict[str, str]) -> bool:
    """CreateQueue of an existing queue: are the attributes it gives the queue's?"""
    for name, value in given.items():
        have = current.get(name)
        if name == "RedrivePolicy":
            try:
                a, b = wire.loads(value), wire.loads(have or "{}")
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


def checked_tags(value: Any, name: str = "Tags") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid(f"{name} must map keys to strings")
    if len(value) > MAX_TAGS or any(not 1 <= len(k) <= MAX_TAG_KEY or len(v) > MAX_TAG_VALUE for k, v in value.items()):
        raise invalid(
            f"at most {MAX_TAGS} tags, keys of 1 to {MAX_TAG_KEY} characters, values of at most {MAX_TAG_VALUE}"
        )
    if not all(valid_text(k) and valid_text(v) for k, v in value.items()):  # (kept and answered: in XML too)
        raise invalid(f"Invalid characters found in {name}: a key or a value has a character XML cannot carry.")
    return value
