"""SQS's message move tasks (StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask)
over the service's redrive: a task moves every dead letter back to the queue it came from (or
every message to the ``DestinationArn``), in rounds, on a thread of the process that started
it, at most ``MaxNumberOfMessagesPerSecond`` a second when given. StartMessageMoveTask answers
once the task has ended or after ``ANSWER_WITHIN`` seconds, whichever is first (a task with a
rate answers at once), so a small redrive has ended when it is answered.

A task is a row (``models.MoveTask``): whichever process of the node a ListMessageMoveTasks or
a CancelMessageMoveTask lands on reads or changes that row. :func:`start` and :func:`cancel`
check the caller's rights themselves and record ``move_start`` and ``move_cancel`` in the
audit trail; a task that ends records ``move_end`` with what it moved, as its user. A cancel
turns ``RUNNING`` into ``CANCELLING``; the running thread reads the status between rounds (and
every ``_POLL`` seconds while it waits for its rate), stops, and writes ``CANCELLED``: what it
moved stays moved. A running task whose process has written nothing for ``STALE`` seconds (the
process ended) is ``FAILED``: the next read of its row marks it so and records its
``move_end`` as ``system``. Its handle is SQS's: the base64 of a JSON object with its
``taskId`` and ``sourceArn``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from queues import service
from queues.access import SYSTEM, audit, require
from queues.service.rows import queue_name, start_queue_job
from sqs import wire
from sqs.context import Context, service_errors
from sqs.errors import SQSError
from sqs.models import MoveTask

log = logging.getLogger(__name__)

#: dead letters one round moves at the most (no rate given).
_ROUND = 1000
#: how long a message being moved to a DestinationArn stays hidden (seconds).
_HOLD = 60.0
#: how often a task waiting for its rate reads whether it was cancelled (seconds).
_POLL = 0.2
#: how long StartMessageMoveTask waits for a task with no rate to end (seconds).
ANSWER_WITHIN = 5.0
#: a running task whose process wrote nothing for this long is listed FAILED (seconds).
STALE = 120.0
#: a task's FailureReason when its process ended while it ran.
LOST = "The process running the task stopped before it ended."
#: a task's FailureReason when a store it needed did not answer (the node's log names the error).
UNAVAILABLE = "ServiceUnavailable: a store the task needed did not answer; the node's log names the error."
#: a task's FailureReason when it stopped on an error of ours (the node's log has the error).
BROKEN = "The task stopped on an internal error; the node's log names it."
#: MaxNumberOfMessagesPerSecond's range (SQS's).
MAX_RATE = 500

_ACTIVE = (MoveTask.RUNNING, MoveTask.CANCELLING)


def task_handle(source_arn: str) -> str:
    """A new task's handle, as SQS makes one: the base64 of ``{"taskId": <UUID>, "sourceArn": ...}``."""
    task = {"taskId": str(uuid.uuid4()), "sourceArn": source_arn}
    return base64.b64encode(json.dumps(task, separators=(",", ":")).encode()).decode()


def parse_task_handle(handle: str) -> dict[str, str] | None:
    """The ``taskId`` and ``sourceArn`` of a task handle, or None if it is not one."""
    try:
        task = wire.loads(base64.b64decode(handle.encode(), validate=True))  # (bounded: any caller's text)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(task, dict) or not all(isinstance(task.get(k), str) for k in ("taskId", "sourceArn")):
        return None
    return {"taskId": task["taskId"], "sourceArn": task["sourceArn"]}


# --- the rows -------------------------------------------------------------------------------------
def _status(task_id: int) -> str | None:
    return MoveTask.objects.filter(pk=task_id).values_list("status", flat=True).first()


def _progress(task_id: int, moved: int) -> None:
    MoveTask.objects.filter(pk=task_id).update(moved=moved, beat_at=timezone.now())


def _end(task_id: int, moved: int, status: str, reason: str = "") -> str | None:
    """``status`` (COMPLETED or FAILED) if the task still runs; CANCELLED if it was cancelled:
    the status written, or None if a read found the task silent too long and ended it first
    (or its queue was deleted, and the row with it)."""
    now = timezone.now()
    fields: dict[str, Any] = {"moved": moved, "beat_at": now, "failure_reason": reason[:300]}
    if MoveTask.objects.filter(pk=task_id, status=MoveTask.RUNNING).update(status=status, **fields):
        return status
    if MoveTask.objects.filter(pk=task_id, status=MoveTask.CANCELLING).update(status=MoveTask.CANCELLED, **fields):
        return MoveTask.CANCELLED
    return None  # neither: a read ended it (and recorded its end), or its queue is gone


def _stale(task: MoveTask) -> bool:
    """Whether ``task`` is listed as running but its process wrote nothing for ``STALE``
    seconds; if so, its row is marked FAILED (``LOST``) now, its ``move_end`` recorded as
    ``system``, and ``task`` marked with it."""
    if task.status not in _ACTIVE or timezone.now() - task.beat_at <= timedelta(seconds=STALE):
        return False
    with transaction.atomic():  # the row marked and its end recorded, or neither
        if MoveTask.objects.filter(pk=task.pk, status__in=_ACTIVE, beat_at=task.beat_at).update(
            status=MoveTask.FAILED, failure_reason=LOST
        ):
            # the process that would have recorded its end is gone: the read that marked the
            # row records it, as the node
            name = queue_name(task.queue_id)
            detail = {"task": task.pk, "status": MoveTask.FAILED, "moved": task.moved}
            audit.record(SYSTEM, "move_end", name or task.source_arn, **detail)
            task.status, task.failure_reason = MoveTask.FAILED, LOST
            return True
    try:
        task.refresh_from_db()  # its process wrote meanwhile (or it ended): as the row says now
    except MoveTask.DoesNotExist:  # its queue deleted meanwhile
        task.status = MoveTask.FAILED
        return False
    return _stale(task)


def entry(task: MoveTask) -> dict[str, Any]:
    """ListMessageMoveTasks' entry of ``task``: its TaskHandle only while it runs, its
    FailureReason only when it failed, DestinationArn and MaxNumberOfMessagesPerSecond only
    when it was started with them (SQS's)."""
    _stale(task)
    status, reason = task.status, task.failure_reason
    out: dict[str, Any] = {
        "Status": status,
        "SourceArn": task.source_arn,
        "ApproximateNumberOfMessagesMoved": task.moved,
        "StartedTimestamp": task.started_ms,
    }
    if task.to_move is not None:
        out["ApproximateNumberOfMessagesToMove"] = task.to_move
    if status == MoveTask.RUNNING:
        out["TaskHandle"] = task.handle
    if task.destination_arn:
        out["DestinationArn"] = task.destination_arn
    if task.rate is not None:
        out["MaxNumberOfMessagesPerSecond"] = task.rate
    if status == MoveTask.FAILED:
        out["FailureReason"] = reason or "The task failed."
    return out


def recent(q: Any, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` most recent tasks of source queue ``q``, newest first."""
    return [entry(t) for t in MoveTask.objects.filter(queue_id=q.pk).order_by("-started_ms", "-pk")[:limit]]


def running(q: Any, handle: str | None = None) -> MoveTask | None:
    """The task of source queue ``q`` (of ``handle``, when given) that is running or being
    cancelled, if any."""
    tasks = MoveTask.objects.filter(queue_id=q.pk, status__in=_ACTIVE)
    if handle is not None:
        tasks = tasks.filter(handle=handle)
    for task in tasks:
        if not _stale(task):
            return task
    return None


def _require_rights(q: Any, dest: Any, ctx: Context) -> None:
    """The rights a task of source ``q`` needs: ``manage`` on it for a redrive, ``consume`` on
    it and ``produce`` on the destination for a move to a DestinationArn."""
    with service_errors():
        if dest is None:
            require(ctx.caller, "manage", q.pk, q.name, q.created_by_id)
        else:
            require(ctx.caller, "consume", q.pk, q.name, q.created_by_id)
            require(ctx.caller, "produce", dest.pk, dest.name, dest.created_by_id)


def cancel(q: Any, handle: str, ctx: Context) -> int:
    """Cancel the running task of ``handle`` (of source queue ``q``) as ``ctx.caller``, who
    needs the rights that starting it needs: its ApproximateNumberOfMessagesMoved so far.
    ResourceNotFoundException if no task of that handle is running. Recorded as ``move_cancel``."""
    task = running(q, handle)
    if task is None:
        raise SQSError("ResourceNotFoundException", "No task of that TaskHandle is running.")
    with service_errors():
        require(ctx.caller, "consume" if task.destination_arn else "manage", q.pk, q.name, q.created_by_id)
    with transaction.atomic():
        if not MoveTask.objects.filter(pk=task.pk, status=MoveTask.RUNNING).update(status=MoveTask.CANCELLING):
            raise SQSError("ResourceNotFoundException", "No task of that TaskHandle is running.")
        moved = int(MoveTask.objects.filter(pk=task.pk).values_list("moved", flat=True).first() or 0)
        audit.record(ctx.caller, "move_cancel", q.name, task=task.pk, moved=moved)
    return moved


# --- running a task -------------------------------------------------------------------------------
class _Runner:
    """One task's rounds, on its own thread: each round moves at most ``rate`` messages (when
    given) and is followed by the rest of its second, the status read every ``_POLL`` seconds."""

    def __init__(self, task_id: int, q: Any, ctx: Context, dest: Any, rate: int | None, to_move: int):
        self.task_id, self.q, self.ctx, self.dest, self.rate, self.to_move = task_id, q, ctx, dest, rate, to_move
        self.moved = 0

    def run(self) -> None:
        try:
            try:
                rounds_end = self._rounds()
            except SQSError as exc:
                if exc.code == "ServiceUnavailable":  # its message names the store's error
                    log.warning("message move task %s stopped: %s", self.task_id, exc.message)
                    reason = UNAVAILABLE
                else:
                    reason = f"{exc.code}: {exc.message}"
                ended = _end(self.task_id, self.moved, MoveTask.FAILED, reason)
            except Exception:  # the log has the error; the task's row says only that it failed
                log.exception("message move task %s failed", self.task_id)
                ended = _end(self.task_id, self.moved, MoveTask.FAILED, BROKEN)
            else:
                ended = _end(self.task_id, self.moved, rounds_end)
            if ended is not None:
                audit.record(
                    self.ctx.caller, "move_end", self.q.name, task=self.task_id, status=ended, moved=self.moved
                )
        except Exception:  # the rows' store is gone: the task is listed FAILED once STALE passes
            log.exception("message move task %s could not record its end", self.task_id)
        finally:
            connection.close()

    def _running(self) -> bool:
        """Whether the task is still to run (False: it was cancelled)."""
        return _status(self.task_id) == MoveTask.RUNNING

    def _check_rights(self) -> None:
        """The task's user may still take what each round takes (read now: a user made
        inactive, or a grant revoked, since the start stops the task, which then fails)."""
        with service_errors():
            if self.dest is None:
                allowed = service.allowed_now(self.q.name, "manage", caller=self.ctx.caller)
            else:
                allowed = service.allowed_now(self.q.name, "consume", caller=self.ctx.caller) and (
                    service.allowed_now(self.dest.name, "produce", caller=self.ctx.caller)
                )
        if not allowed:
            raise SQSError("AccessDenied", "The task's user may no longer move these messages.")

    def _pace(self, started: float, n: int) -> bool:
        """Wait out the round's share of the rate, reading the status meanwhile; False when
        the task was cancelled."""
        if self.rate is None:
            return True
        until = started + n / self.rate
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(_POLL, left))
            if not self._running():
                return False
        return True

    def _rounds(self) -> str:
        """Move round after round; the status the task ends in (completed or cancelled)."""
        batch = min(self.rate or _ROUND, _ROUND)
        # at most as many rounds as the source held messages when it started (a FIFO queue
        # gives one a group a round), so messages that keep coming do not keep it running
        for _ in range(self.to_move + 2):
            if not self._running():
                return MoveTask.CANCELLED
            self._check_rights()
            started = time.monotonic()
            n = self._round(batch)
            if n == 0:
                break
            self.moved += n
            _progress(self.task_id, self.moved)
            if not self._pace(started, n):
                return MoveTask.CANCELLED
        return MoveTask.COMPLETED

    def _round(self, batch: int) -> int:
        with service_errors():
            if self.dest is None:
                result = service.redrive(self.q.name, batch, caller=self.ctx.caller)
                return result.moved
            return self._move_to(min(batch, service.MAX_BATCH))

    def _move_to(self, batch: int) -> int:
        """Messages of the source to ``dest`` as the caller (``consume`` on the source,
        ``produce`` there): received, stored there in their group, then deleted here (a failure
        between the two leaves a copy in both: at least once, as SQS's move)."""
        found = service.dequeue(self.q.name, caller=self.ctx.caller, max_messages=batch, visibility_timeout=_HOLD)
        if not found:
            return 0
        drafts = []
        for d in found:
            m = d.message
            assert m is not None
            drafts.append(
                service.MessageDraft(
                    m.body, group=m.group, attributes=m.attributes, size=m.size, fairness_key=m.fairness_key
                )
            )
        service.enqueue(self.dest.name, drafts, caller=self.ctx.caller)
        items = [(service.parse_message_id(d.id), d.receipt) for d in found]
        service.ack(self.q.name, [(mid, receipt) for mid, receipt in items if mid is not None], caller=self.ctx.caller)
        return len(found)


def start(
    q: Any,
    source_arn: str,
    ctx: Context,
    dest: Any = None,
    destination_arn: str | None = None,
    rate: int | None = None,
) -> str:
    """Start a task moving the dead letters of queue ``q`` (named by ``source_arn``) back to
    where they came from, or every message of it to queue ``dest`` (named by
    ``destination_arn``), as ``ctx.caller``, who needs ``manage`` on ``q`` for a redrive, or
    ``consume`` on it and ``produce`` on ``dest``: its handle. Recorded as ``move_start``.
    Raises SQSError."""
    _require_rights(q, dest, ctx)
    with service_errors():
        to_move = int(service.queue_stats(q.name, caller=ctx.caller)["depth"])
    handle = task_handle(source_arn)

    def make() -> tuple[MoveTask, dict[str, Any]]:
        # One task a source at a time: the service holds the source's row, so two starts at
        # once queue on it, and the second finds the first's task.
        if running(q) is not None:
            raise SQSError(
                "UnsupportedOperation", "A message move task of this source queue is running: one at a time."
            )
        task = MoveTask.objects.create(
            handle=handle,
            queue_id=q.pk,
            source_arn=source_arn,
            destination_arn=destination_arn or "",
            to_move=to_move,
            rate=rate,
            started_ms=int(time.time() * 1000),
        )
        return task, {"task": task.pk, "destination": destination_arn or None, "rate": rate, "to_move": to_move}

    task = start_queue_job(q, caller=ctx.caller, action="move_start", start=make)
    old = MoveTask.objects.filter(queue_id=q.pk).order_by("-started_ms", "-pk").values_list("pk", flat=True)
    MoveTask.objects.filter(pk__in=list(old[MoveTask.KEEP :])).exclude(status__in=_ACTIVE).delete()
    runner = _Runner(task.pk, q, ctx, dest, rate, to_move)
    thread = threading.Thread(target=runner.run, name=f"sqs-move-task-{task.pk}", daemon=True)
    thread.start()
    if rate is None:
        thread.join(ANSWER_WITHIN)
    return handle
