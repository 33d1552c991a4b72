"""The workers app's operations: the attempt log and consumer heartbeats.

Typed arguments in, typed results out, no HTTP: the DRF views (``workers/api.py``) parse and
shape, the receivers of the core's signals (``workers/receivers.py``) and the Celery tasks
(``workers/tasks.py``) call these. Each docstring says what it locks (mostly nothing: attempt
records are appended, heartbeats are advisory) and what it raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from queues import service
from queues.access import Caller
from queues.public import MessageId, parse_message_id
from queues.service.rows import queue_fields, served_partitions, total_depth
from workers import metrics
from workers.models import AttemptLog, Consumer, HeldMessage

if TYPE_CHECKING:
    from queues.service.types import Delivery

#: The most attempt records one call stores or lists.
MAX_RECORDS = 1000
#: A consumer whose last heartbeat is older than this is not counted as covering the load.
CONSUMER_ALIVE = timedelta(seconds=30)
#: How long an idle worker is told to sleep while others cover its queues.
SLEEP_SECONDS = 5
#: The consumer of a message the service logs is looked for among consumers heard from this recently.
CONSUMER_HEARD = timedelta(hours=1)
#: The error text of an attempt the service logs for a worker that did not report it.
ABANDONED_ERROR = "visibility timeout ran out without an ack"
GIVEN_BACK_ERROR = "given back (visibility 0) without a report"


class InvalidAttempt(service.Refused, ValueError):
    """An attempt report the log cannot store (not a message ID, times out of order)."""


class LimitOutOfRange(service.Refused, ValueError):
    """A listing asked for fewer than one or more than :data:`MAX_RECORDS` records."""

    code = "out_of_range"


class TooManyHeld(service.Refused, ValueError):
    """A heartbeat lists more messages in flight than ``WORKER_MAX_HELD`` (nothing recorded)."""

    code = "too_many_held"


class TooManyConsumers(service.Refused):
    """A new consumer of a user that has ``WORKER_MAX_CONSUMERS_PER_USER`` heard from within
    ``CONSUMER_RETENTION`` already (nothing recorded; the oldest expire): 429, retry in a minute."""

    code = "throttled"
    status = 429
    retry_after = 60


# --- the attempt log ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """One processing attempt as a worker reports it."""

    #: ``<queue>/<partition>/<block>/<index>``; the queue and partition are taken from it.
    message_id: str
    #: the delivery's receive count.
    attempt: int
    #: one of :class:`AttemptLog.Outcome`.
    outcome: str
    group: str | None = None
    #: the consumer's ID (its heartbeat's ``consumer``).
    worker: str | None = None
    enqueued_at: datetime | None = None
    preprocess_started_at: datetime | None = None
    preprocess_ended_at: datetime | None = None
    process_started_at: datetime | None = None
    process_ended_at: datetime | None = None
    error: str = ""
    traceback: str = ""
    size: int | None = None


def record_attempts(reports: Sequence[AttemptReport], *, caller: Caller) -> int:
    """Store a worker's attempt reports; returns how many were stored.

    All or none: every report is checked, then the caller's right to ``consume`` each queue the
    reports name (a worker reports attempts on what it consumed; nobody else writes a queue's
    log), then one bulk INSERT (a single statement, so no transaction is needed around it). No
    lock: attempt records are only ever appended.

    Raises :class:`InvalidAttempt` (nothing stored) when a report names no message ID, has an
    unknown outcome, or ends a phase before it starts; ``QueueNotFound`` (a queue that does not
    exist, or that the caller may not read) and ``access.Forbidden`` (it lacks ``consume``).
    """
    rows = []
    for r in reports:
        mid = parse_message_id(r.message_id)
        if mid is None:
            raise InvalidAttempt(f"{r.message_id!r} is not a message ID (<queue>/<partition>/<block>/<index>)")
        if r.outcome not in AttemptLog.Outcome.values:
            raise InvalidAttempt(f"{r.outcome!r} is not an outcome")
        for start, end in (
            (r.preprocess_started_at, r.preprocess_ended_at),
            (r.process_started_at, r.process_ended_at),
        ):
            if start and end and end < start:
                raise InvalidAttempt(f"{r.message_id}: a phase ends before it starts")
        rows.append(
            AttemptLog(
                message_id=r.message_id,
                queue=mid.queue,
                partition=mid.partition,
                group=r.group or "",
                worker_id=r.worker or None,
                attempt=r.attempt,
                enqueued_at=r.enqueued_at,
                preprocess_started_at=r.preprocess_started_at,
                preprocess_ended_at=r.preprocess_ended_at,
                process_started_at=r.process_started_at,
                process_ended_at=r.process_ended_at,
                outcome=r.outcome,
                error=r.error,
                traceback=r.traceback,
                size=r.size,
            )
        )
    incarnations: dict[str, int] = {}
    for queue in sorted({row.queue for row in rows}):
        cfg, _ = service.authorize(queue, "consume", caller=caller)
        incarnations[queue] = cfg.id
    for row in rows:  # the queue of the name now: the one the caller was allowed to report on
        row.incarnation = incarnations[row.queue]
    stored = AttemptLog.objects.bulk_create(rows)
    metrics.count_attempts(stored)
    return len(stored)


def list_attempts(
    *,
    caller: Caller,
    queue: str | None = None,
    message_id: str | None = None,
    worker: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
) -> list[AttemptLog]:
    """Attempt records of the queues ``caller`` may read, newest first, filtered by whichever
    of the arguments are given. A record belongs to the queue row it was written for: a queue
    deleted and created again under its name does not show the old one's records to the new
    one's readers, and those of a deleted queue are read by unrestricted callers only.

    One read, no lock. Raises :class:`LimitOutOfRange` unless ``1 <= limit <= MAX_RECORDS``.
    """
    if not 1 <= limit <= MAX_RECORDS:
        raise LimitOutOfRange(f"limit must be between 1 and {MAX_RECORDS}")
    rows = AttemptLog.objects.all()
    readable = service.readable_queue_ids(caller)
    if readable is not None:
        rows = rows.filter(incarnation__in=readable)
    for column, value in (("queue", queue), ("message_id", message_id), ("worker_id", worker), ("outcome", outcome)):
        if value:
            rows = rows.filter(**{column: value})
    return list(rows[:limit])


def _consumers_of(message_ids: Sequence[str]) -> dict[str, str]:
    """Message ID -> the consumer that listed it in flight in its latest heartbeat, for
    ``message_ids`` only: one indexed read (it loaded every consumer's list before, on every
    dequeue with a redelivery)."""
    rows = HeldMessage.objects.filter(
        message_id__in=list(message_ids), consumer__last_heartbeat__gte=timezone.now() - CONSUMER_HEARD
    ).values_list("message_id", "consumer_id")
    return dict(rows)


def _parsed(message_id: str) -> MessageId:
    """The parts of a message ID the core delivered (well formed: ValueError otherwise)."""
    parsed = parse_message_id(message_id)
    if parsed is None:
        raise ValueError(f"{message_id!r} is no message ID")
    return parsed


def record_redeliveries(deliveries: Iterable[Delivery]) -> int:
    """Log the attempt before each redelivery as abandoned, unless it was reported already.

    A delivery with ``receive_count > 1`` means the previous attempt (``receive_count - 1``)
    ended without an ack: its visibility ran out (a consumer that gave it back was logged
    ``given_back`` then, by :func:`record_given_back`, and counts as reported). The row names
    the consumer whose latest heartbeat listed the message. Returns how many rows were written.

    Reads then one bulk INSERT, no lock: there is one delivery per receive count, so only a
    worker's report arriving meanwhile can race with it (the attempt is then logged twice,
    which the log tolerates). Raises nothing of its own (database errors pass through).
    """
    again = [d for d in deliveries if d.receive_count > 1]
    if not again:
        return 0
    reported = set(AttemptLog.objects.filter(message_id__in=[d.id for d in again]).values_list("message_id", "attempt"))
    consumers = _consumers_of([d.id for d in again])
    current = service.current_queue_ids({_parsed(d.id).queue for d in again})
    rows = []
    for d in again:
        if (d.id, d.receive_count - 1) in reported:
            continue
        mid = _parsed(d.id)
        rows.append(
            AttemptLog(
                message_id=d.id,
                queue=mid.queue,
                incarnation=current.get(mid.queue),
                partition=mid.partition,
                group=(d.message.group if d.message is not None else None) or "",
                worker_id=consumers.get(d.id),
                attempt=d.receive_count - 1,
                outcome=AttemptLog.Outcome.ABANDONED,
                error=ABANDONED_ERROR,
                size=d.message.size if d.message is not None else None,
            )
        )
    AttemptLog.objects.bulk_create(rows)
    metrics.count_attempts(rows)
    return len(rows)


def record_given_back(message_id: str, attempt: int) -> bool:
    """Log attempt ``attempt`` of ``message_id`` as given back, unless its worker reported it.

    A consumer that sets a message's visibility to 0 gives it back on purpose; this record
    keeps the redelivery that follows from logging the attempt as abandoned. The row names the
    consumer whose latest heartbeat listed the message; group and size are not known here.
    Returns whether a row was written or corrected.

    The core announces a give back after releasing the partition lock, so a consumer long
    polling the queue may be handed the message, and :func:`record_redeliveries` log the
    attempt abandoned, first. Only a give back can make the message visible before its
    deadline, so that row is corrected here rather than left standing beside this one.

    Read then UPDATE or INSERT, no lock (as :func:`record_redeliveries`). Raises
    :class:`InvalidAttempt` when ``message_id`` is not a message ID.
    """
    mid = parse_message_id(message_id)
    if mid is None:
        raise InvalidAttempt(f"{message_id!r} is not a message ID")
    rows = AttemptLog.objects.filter(message_id=message_id, attempt=attempt)
    if rows.exclude(outcome=AttemptLog.Outcome.ABANDONED).exists():
        return False
    if rows.update(outcome=AttemptLog.Outcome.GIVEN_BACK, error=GIVEN_BACK_ERROR):
        return True
    row = AttemptLog.objects.create(
        message_id=message_id,
        queue=mid.queue,
        incarnation=service.current_queue_ids([mid.queue]).get(mid.queue),
        partition=mid.partition,
        worker_id=_consumers_of([message_id]).get(message_id),
        attempt=attempt,
        outcome=AttemptLog.Outcome.GIVEN_BACK,
        error=GIVEN_BACK_ERROR,
    )
    metrics.count_attempts([row])
    return True


def trim_attempt_logs(keep: timedelta, *, now: datetime | None = None) -> int:
    """Delete the attempt records older than ``keep``; returns how many.

    One DELETE statement, no lock (records are never updated). Raises nothing of its own.
    """
    cutoff = (now or timezone.now()) - keep
    deleted, _ = AttemptLog.objects.filter(recorded_at__lt=cutoff).delete()
    return deleted


# --- heartbeats --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InFlight:
    """A message in flight at a consumer (pre-processing or processing), as its heartbeat lists it."""

    id: str
    receipt: str
    #: what it was dequeued from: the queue, or ``"topic/subscription"`` (None: the ID's queue).
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a consumer says about itself each beat."""

    #: chosen by the worker (a UUID).
    consumer: str
    name: str = ""
    hostname: str = ""
    pid: int | None = None
    #: the queues (or ``"topic/subscription"``) it consumes.
    queues: tuple[str, ...] = ()
    #: busy share of its capacity, 0..1.
    load: float = 0.0
    capacity: int = 1
    #: its messages in flight (the heartbeat's ``held``).
    in_flight: tuple[InFlight, ...] = ()


@dataclass(frozen=True, slots=True)
class Take:
    """A partition a consumer should dequeue from first, at its owner."""

    queue: str
    partition: int
    #: the owner's address.
    node: str
    depth: int


@dataclass(frozen=True, slots=True)
class Instructions:
    """The answer to a heartbeat."""

    instruction: Literal["continue", "take", "sleep"]
    #: seconds to sleep (0 unless told to sleep).
    sleep: int
    take: list[Take] = field(default_factory=list)
    #: messages in flight whose visibility was pushed out.
    extended: list[str] = field(default_factory=list)
    #: messages in flight no longer the consumer's (redelivered, or their queue is gone): do not ack.
    lost: list[str] = field(default_factory=list)


def heartbeat(beat: Heartbeat, *, caller: Caller, now: datetime | None = None) -> Instructions:
    """A consumer is alive: extend its messages in flight, record it, and say what it should do next.

    Every message in flight's visibility is pushed out by its queue's timeout at the partition's
    owner (:func:`extend_in_flight`); then the consumer is told to sleep (idle while others cover its
    queues), to take some partitions first (the queues' non-empty partitions spread over their
    live consumers), or to continue. The consumer's row is upserted last.

    Call it outside any transaction: extending calls other nodes, and a database transaction
    must not stay open across them. The reads of other consumers are not locked: assignment
    and sleep are advice (anyone may still dequeue from anywhere), so a stale read costs at
    most one beat of imbalance; two beats of one consumer racing leave the later row.

    Messages in flight are extended as ``caller`` (the worker's user: ``consume`` on their queues;
    one it may not consume is lost to it).

    Raises nothing of its own: a message in flight that cannot be extended now is left for the
    next beat (database errors pass through).
    """
    now = now or timezone.now()
    _check_bounds(beat, caller, now)
    extended, lost = extend_in_flight(beat.in_flight, caller=caller)
    # Depths and owners only of the queues the worker's user may read.
    readable = service.readable_names(caller)
    queues = tuple(q for q in beat.queues if readable is None or q.partition("/")[0] in readable)
    decided, sleep = _decide(beat.consumer, queues, bool(beat.in_flight), now)
    take = _assign(beat.consumer, queues, now) if decided == "continue" else []
    instruction: Literal["continue", "take", "sleep"] = "take" if take else decided
    with transaction.atomic():
        consumer, _ = Consumer.objects.update_or_create(
            pk=beat.consumer,
            defaults={
                "name": beat.name,
                "hostname": beat.hostname,
                "pid": beat.pid,
                "queues": list(beat.queues),
                "load": beat.load,
                "capacity": beat.capacity,
                "held": [m.id for m in beat.in_flight],
                "last_heartbeat": now,
                "asleep_until": now + timedelta(seconds=sleep) if sleep else None,
                "user_id": caller.user_id,
            },
        )
        HeldMessage.objects.filter(consumer=consumer).delete()
        HeldMessage.objects.bulk_create(HeldMessage(consumer=consumer, message_id=m.id) for m in beat.in_flight)
    return Instructions(instruction, sleep, take, extended, lost)


def _check_bounds(beat: Heartbeat, caller: Caller, now: datetime) -> None:
    """A heartbeat's bounds (issue 14: rows under any ID, never deleted, 1,000 held IDs each):
    at most ``WORKER_MAX_HELD`` messages in flight; a consumer ID taken by another user is not
    overwritten (``Conflict``); a user's new consumer past ``WORKER_MAX_CONSUMERS_PER_USER``
    live ones is refused (:class:`TooManyConsumers`). Reads only, no lock: two new consumers
    racing may pass the count together, by one each (a bound, not an exact quota)."""
    if len(beat.in_flight) > settings.WORKER_MAX_HELD:
        raise TooManyHeld(
            f"a heartbeat lists at most {settings.WORKER_MAX_HELD} held messages, got {len(beat.in_flight)}"
        )
    if caller.user_id is None:
        return  # the service itself
    owner = Consumer.objects.filter(pk=beat.consumer).values_list("user_id", flat=True).first()
    if owner is not None and owner != caller.user_id:
        raise service.Conflict(f"consumer {beat.consumer!r} belongs to another user", "consumer_taken")
    if owner is None and not Consumer.objects.filter(pk=beat.consumer).exists():
        cap = settings.WORKER_MAX_CONSUMERS_PER_USER
        alive = Consumer.objects.filter(
            user_id=caller.user_id, last_heartbeat__gte=now - timedelta(seconds=settings.CONSUMER_RETENTION)
        ).count()
        if alive >= cap:
            raise TooManyConsumers(
                f"this user has {alive} consumers heard from in the last {settings.CONSUMER_RETENTION} s "
                f"(at most {cap}); reuse a consumer ID, or wait for idle ones to expire"
            )


def forget_silent_consumers(*, now: datetime | None = None) -> int:
    """Delete the consumers not heard from in ``CONSUMER_RETENTION`` seconds (and their
    messages in flight); returns how many. One DELETE, no lock: a consumer that beats again is recreated."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.CONSUMER_RETENTION)
    _deleted, per_model = Consumer.objects.filter(last_heartbeat__lt=cutoff).delete()
    return per_model.get(Consumer._meta.label, 0)


def extend_in_flight(in_flight: Sequence[InFlight], *, caller: Caller) -> tuple[list[str], list[str]]:
    """Push each message in flight's visibility out by its queue's timeout, at its owner:
    ``(extended, lost)`` IDs.

    A message is lost to its consumer when its receipt is no longer current (redelivered to
    someone else), when it does not belong to what it was dequeued from, or when that queue
    or subscription is gone: the worker should abandon it rather than ack a message another
    worker has in flight. A message whose owner cannot be reached now is in neither list (the next
    beat tries again). No database lock; one read per queue; a call to the owner per message.
    """
    extended: list[str] = []
    lost: list[str] = []
    queues: dict[str, tuple[int, int] | None] = {}
    for h in in_flight:
        mid = parse_message_id(h.id)
        # A topic's message is read through a subscription ("topic/subscription").
        target = h.target or (mid.queue if mid is not None else "")
        if mid is None or target.partition("/")[0] != mid.queue:
            lost.append(h.id)
            continue
        if mid.queue not in queues:
            queues[mid.queue] = queue_fields(mid.queue, "visibility_timeout", "partitions")
        found = queues[mid.queue]
        if found is None or mid.partition >= found[1]:
            lost.append(h.id)
            continue
        try:
            service.change_visibility(target, mid, h.receipt, max(found[0], 1), caller=caller)
        except service.ServiceError as exc:  # here or the owner's answer; an outage: try again next beat
            if exc.status in (403, 404, 409):  # not this caller's, gone, or received again since
                lost.append(h.id)
        except Exception:  # noqa: BLE001, S112 - partition unavailable or owner unreachable now: try again next beat
            continue
        else:
            extended.append(h.id)
    return extended, lost


def _decide(
    consumer: str, queues: Sequence[str], busy: bool, now: datetime
) -> tuple[Literal["continue", "sleep"], int]:
    """Sleep when this worker has nothing in flight, its queues are empty, and other live workers
    consume them (the seed's consumer sleep): fewer idle polls against the nodes."""
    if busy or not queues:
        return "continue", 0
    # A subscription ("topic/name") counts its topic's depth: an upper bound of its own.
    names = {q.partition("/")[0] for q in queues}
    depth = total_depth(names)
    if depth:
        return "continue", 0
    others = Consumer.objects.filter(last_heartbeat__gte=now - CONSUMER_ALIVE).exclude(pk=consumer)
    covering = [c for c in others if set(c.queues) & set(queues) and not (c.asleep_until and c.asleep_until > now)]
    return ("sleep", SLEEP_SECONDS) if covering else ("continue", 0)


def _assign(consumer: str, queues: Sequence[str], now: datetime) -> list[Take]:
    """Spread the queues' non-empty partitions over their live consumers (the seed's
    consumer assignment): this consumer takes every n-th, by its rank among them, and
    dequeues from their owners first. Everyone may still take from anywhere."""
    if not queues:
        return []
    live = sorted(
        {c.pk for c in Consumer.objects.filter(last_heartbeat__gte=now - CONSUMER_ALIVE) if set(c.queues) & set(queues)}
        | {consumer}
    )
    rank, n = live.index(consumer), len(live)
    rows = served_partitions(queues)
    return [Take(p.queue, p.index, p.owner, p.depth) for k, p in enumerate(rows) if k % n == rank]
