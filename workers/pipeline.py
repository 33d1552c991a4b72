"""The queue client's pipeline (the strict-queue seed): pre-process the next message while the
current one is processed, heartbeat while holding messages, and log every attempt.

Each of ``concurrency`` slots works one message at a time. When message k's processing starts,
the slot takes message k+1 from the queue and schedules its pre-processing to start
``estimate.process(k) - estimate.preprocess(k+1)`` seconds later, so that it is ready just as
k is done (and not earlier, which would only hold the message longer). A slot holds at most
two messages, the one it processes and the next: a long task never parks others behind it,
and the heartbeat keeps both hidden while the worker lives. Messages of one group are never
processed at once: the service hands out one message of a group at a time.

**Short tasks.** Where a queue's processing takes less time than a dequeue call (both measured,
a moving average each), one message a call would leave the slots waiting on calls: the worker
then receives ahead what its slots process in about one call's time (at most ``MAX_AHEAD``
messages), and a slot takes its next from them first, so none waits there much longer than a
call takes. They are held like the others (the heartbeat keeps them hidden; ``stop`` gives them
back). A queue whose messages carry groups is never received ahead (a message waiting here would
hold its group from every other consumer), nor a queue whose processing takes longer than the
call (pipelining hides the call there). Without a tracer, the acks of all slots go through one
:class:`mq_client.Acker`, as few calls, and a slot goes on to its next message without waiting
for the answer (at most ``MAX_ACKS_WAITING`` acks wait for theirs, and their messages stay held
until then); with a tracer, each ack is made inside its attempt's span, one call each.

**What a worker holds** is listed whole in its heartbeat, which the service refuses past its
``WORKER_MAX_HELD`` (``max_held``, 1,000 by default): two messages a slot, and in what is left,
the messages received ahead (of all its queues together) and the acks waiting for their answers.
A worker of more than ``max_held / 2`` slots is refused at its start (``ValueError``).

The client is anything with the SDK's ``dequeue``, ``ack``, ``change_visibility``,
``send_logs`` and ``heartbeat`` methods, so the pipeline is tested without a server too.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mq_client import Acker, tracing
from queues.public import isoformat
from workers.handlers import Handler

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from mq_client import Client

log = logging.getLogger(__name__)

_UNSET = object()
#: The weight of the newest sample in the moving averages of processing and dequeue times.
_NEWEST = 0.2
#: Messages of a queue received ahead of the slots at most (waiting or asked for).
MAX_AHEAD = 100
#: Acks made and not yet answered at most (their messages stay held meanwhile): room for the acks
#: of many ack calls' time. What a worker holds, ``2 * concurrency + MAX_AHEAD + MAX_ACKS_WAITING``
#: at most, is what its heartbeat lists: the service takes up to ``WORKER_MAX_HELD`` (1,000 by
#: default) in one, so a pipeline of many slots receives ahead and leaves acks waiting for less.
MAX_ACKS_WAITING = 100
#: The most messages one heartbeat may list: the service's ``WORKER_MAX_HELD`` by default.
DEFAULT_MAX_HELD = 1000


def _iso(ts: float | None) -> str | None:
    """An attempt's time, to the microsecond the clock gave."""
    return isoformat(ts, "microseconds")


def _iso_of(value: Any) -> str | None:
    """A message's ``enqueued_at`` as ISO 8601: the SDK gives a datetime, fakes may give text."""
    if isinstance(value, datetime):
        return isoformat(value, "microseconds")
    return value if isinstance(value, str) and value else None


def _estimate(message: object, kind: str) -> float:
    estimates = getattr(message, "estimates", None) or {}
    # a mapping (``{"preprocess": s, "process": s}``) or the SDK's ``Estimates`` (attributes)
    value = estimates.get(kind) if isinstance(estimates, Mapping) else getattr(estimates, kind, None)
    try:
        return max(0.0, float(value or 0.0))
    except (TypeError, ValueError):
        return 0.0


def _average(averages: dict[str, float], queue: str, sample: float) -> None:
    """Fold ``sample`` into ``queue``'s moving average in ``averages``."""
    before = averages.get(queue)
    averages[queue] = sample if before is None else before + _NEWEST * (sample - before)


def heartbeat_every(visibility_timeouts: list[float]) -> float:
    """Seconds between two heartbeats of a worker of queues with these visibility timeouts:
    three beats per (shortest) timeout, so one lost beat never lets a message go."""
    return max(0.2, min(10.0, min(visibility_timeouts) / 3)) if visibility_timeouts else 5.0


@contextmanager
def _current(span: Span | None) -> Iterator[None]:
    """``span`` (None: nothing) current inside, ended after."""
    if span is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        yield


@dataclass
class Work:
    """A held message and what the pipeline knows of it."""

    queue: str
    message: Any
    handler: Handler
    #: what the handler's pre-processing gave (the application's own value)
    prepared: Future[Any] = field(default_factory=Future)
    preprocess_started: float | None = None
    preprocess_ended: float | None = None
    #: set when the previous message finishes early: start pre-processing now.
    go: threading.Event = field(default_factory=threading.Event)
    #: the service said another worker holds it now: drop it, never ack it.
    lost: bool = False


class Pipeline:
    def __init__(
        self,
        client: Client,
        handlers: dict[str, Handler],
        queues: list[str] | None = None,
        *,
        concurrency: int = 1,
        pipelining: bool = True,
        visibility_timeout: float | None = None,
        heartbeat_every: float = 5.0,
        wait: float = 1.0,
        retry_backoff: float = 1.0,
        consumer_id: str | None = None,
        name: str | None = None,
        receive_ahead: bool = True,
        batch_acks: bool = True,
        max_held: int = DEFAULT_MAX_HELD,
    ):
        if 2 * concurrency > max_held:
            # each slot holds its message and the next; the heartbeat that keeps them hidden
            # lists them all, and the service refuses a list longer than its WORKER_MAX_HELD
            raise ValueError(
                f"{concurrency} slots hold up to {2 * concurrency} messages, more than the {max_held} a "
                "heartbeat may list (the service's WORKER_MAX_HELD): run fewer slots a worker, or more workers"
            )
        self.client = client
        self.handlers = handlers
        self.queues = queues or sorted(handlers)
        self.concurrency = concurrency
        self.pipelining = pipelining
        self.visibility_timeout = visibility_timeout
        self.heartbeat_every = heartbeat_every
        self.wait = wait
        self.retry_backoff = retry_backoff
        self.consumer_id = consumer_id or uuid.uuid4().hex
        self.name = name or f"worker@{socket.gethostname()}"
        self._stop = threading.Event()
        self._held: dict[str, Work] = {}
        self._held_lock = threading.Lock()
        self._logs: list[dict[str, Any]] = []  # attempt records, as the SDK's send_logs takes them
        self._logs_lock = threading.Lock()
        self._sleep_until = 0.0
        #: queue -> owner nodes of the partitions the service asked this worker to take.
        self._assigned: dict[str, list[str]] = {}
        self._rr = 0
        self._preprocessors = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="preprocess")
        self._takers = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="take-next")
        self._threads: list[threading.Thread] = []
        self.processed = 0
        self.busy = 0
        #: the client's OpenTelemetry tracer (None: no spans): each attempt is a ``process``
        #: span, a child of the context the message was created in (its ``traceparent``)
        self.tracer: Tracer | None = getattr(client, "tracer", None)
        #: what the heartbeat may list beside the slots' own two each: shared by the messages
        #: received ahead and the acks waiting for their answers
        room = max_held - 2 * concurrency
        #: messages of a queue received ahead of the slots at most (waiting or asked for)
        self.max_ahead = min(MAX_AHEAD, room // 2)
        #: whether short tasks' messages are received ahead (see the module's docstring)
        self.receive_ahead = receive_ahead and self.max_ahead > 1
        max_acks = min(MAX_ACKS_WAITING, room - self.max_ahead if self.receive_ahead else room)
        self._ahead: dict[str, deque[Work]] = {}  # held, received ahead, no slot's yet
        self._asking: dict[str, int] = {}  # messages asked for ahead by the dequeues in flight
        self._grouped: set[str] = set()  # queues whose messages carry groups
        self._process_s: dict[str, float] = {}  # moving average of a processing, seconds
        self._dequeue_s: dict[str, float] = {}  # ... of a dequeue call answered with messages
        #: the acks of all slots as few calls (none with a tracer: each ack in its attempt's span)
        #: (at most ``MAX_ACKS_WAITING`` acks wait to be answered: a slot's next ack waits for room)
        self._acker: Acker | None = (
            Acker(client, max_buffered=max_acks) if batch_acks and self.tracer is None and max_acks > 0 else None
        )

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> Pipeline:
        for i in range(self.concurrency):
            self._threads.append(threading.Thread(target=self._slot, name=f"slot-{i}", daemon=True))
        self._threads.append(threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True))
        self._threads.append(threading.Thread(target=self._flusher, name="log-flush", daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the messages being processed, give back those not started, flush the logs."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=timeout)
        self._preprocessors.shutdown(wait=False, cancel_futures=True)
        self._takers.shutdown(wait=False, cancel_futures=True)
        if self._acker is not None:
            self._acker.close(timeout)  # the acks made: sent and answered
        with self._held_lock:
            leftover = list(self._held.values())
            self._held.clear()
            self._ahead.clear()
        for work in leftover:
            self._give_back(work)
        for _ in range(100):  # everything, 1,000 a call, while the service takes them
            with self._logs_lock:
                pending = len(self._logs)
            if not pending:
                break
            self._flush_logs()
            with self._logs_lock:
                if len(self._logs) >= pending:
                    break  # the service refuses them now: nothing more to do here

    # --- taking messages ----------------------------------------------------------------------
    def _take(self) -> Work | None:
        """One message from the configured queues (round robin), or None after a long poll."""
        if time.monotonic() < self._sleep_until:
            self._stop.wait(min(self._sleep_until - time.monotonic(), 1.0))
            return None
        for _ in range(len(self.queues)):
            queue = self.queues[self._rr % len(self.queues)]
            self._rr += 1
            with self._held_lock:
                ahead = self._ahead.get(queue)
                if ahead:
                    return ahead.popleft()
                # beside what waits received ahead and what other slots' calls ask for, of every
                # queue (what a worker holds is bounded as a whole: its heartbeat lists it all)
                waiting = sum(map(len, self._ahead.values())) + sum(self._asking.values())
                extra = self._extra(queue, waiting)
                self._asking[queue] = self._asking.get(queue, 0) + extra
            hint = {}
            nodes = self._assigned.get(queue)
            if nodes:  # the service asked us to take these partitions: their owners first
                hint["node"] = nodes[self._rr % len(nodes)]
            called = time.monotonic()
            try:
                got = self.client.dequeue(
                    queue,
                    1 + extra,
                    visibility_timeout=self.visibility_timeout,
                    wait=self.wait if len(self.queues) == 1 else 0,
                    **hint,
                )
            except Exception as exc:  # noqa: BLE001 - the SDK already retried; wait and go on
                log.warning("dequeue %s: %s", queue, exc)
                self._stop.wait(1.0)
                return None
            finally:
                with self._held_lock:
                    self._asking[queue] -= extra
            if got:
                _average(self._dequeue_s, queue, time.monotonic() - called)
                if any(getattr(m, "group", None) is not None for m in got):
                    self._grouped.add(queue)
                works = [Work(queue, m, self.handlers[queue]) for m in got]
                with self._held_lock:
                    for work in works:
                        self._held[work.message.id] = work
                    if len(works) > 1:
                        self._ahead.setdefault(queue, deque()).extend(works[1:])
                return works[0]
        if len(self.queues) > 1:
            self._stop.wait(self.wait)
        return None

    def _extra(self, queue: str, waiting: int) -> int:
        """How many messages of ``queue`` a dequeue asks for beside the slot's own: none, or
        where its processing is shorter than a call, what the slots process in one call's time
        (at most :attr:`max_ahead`) less the ``waiting`` ones (received ahead or asked for)."""
        process, call = self._process_s.get(queue), self._dequeue_s.get(queue)
        if not self.receive_ahead or queue in self._grouped or process is None or call is None or process >= call:
            return 0
        most = self.max_ahead
        target = min(most, self.concurrency * math.ceil(call / max(process, 1e-6)))
        return max(0, min(most - 1, target - waiting))

    def _schedule_preprocess(self, work: Work, delay: float) -> None:
        """Start pre-processing ``work`` after ``delay`` seconds, on the pre-processing pool."""

        def run() -> None:
            if delay > 0:
                work.go.wait(delay)
            if self._stop.is_set():
                work.prepared.cancel()
                return
            work.preprocess_started = time.time()
            try:
                result = work.handler.preprocess(work.message) if work.handler.preprocess else None
            except BaseException as exc:  # noqa: BLE001 - recorded as the attempt's failure
                work.preprocess_ended = time.time()
                work.prepared.set_exception(exc)
                return
            work.preprocess_ended = time.time()
            work.prepared.set_result(result)

        if work.handler.preprocess is None:
            work.prepared.set_result(None)
            return
        try:
            self._preprocessors.submit(run)
        except RuntimeError:  # shutting down
            work.prepared.cancel()

    # --- a slot -------------------------------------------------------------------------------
    def _slot(self) -> None:
        current: Work | None = None
        while not self._stop.is_set():
            if current is None:
                current = self._take()
                if current is None:
                    continue
                self._schedule_preprocess(current, 0.0)
            nxt = self._work_on(current)
            current = nxt

    def _attempt_span(self, work: Work) -> Span:
        """The span of one attempt at ``work`` (OpenTelemetry's ``process`` operation), a child
        of the context its message was created in, started now; made current by
        :func:`_current` while its handler runs and its message is acked or given back."""
        from opentelemetry.trace import SpanKind

        assert self.tracer is not None  # (asked for only when the client has one)
        message = work.message
        attributes = tracing.messaging_attributes(
            "process", "process", work.queue, message_id=getattr(message, "id", None)
        )
        attributes["messaging.consumer.group.name"] = self.name
        attributes["mq.receive_count"] = getattr(message, "receive_count", 0)
        return self.tracer.start_span(
            f"process {work.queue}",
            context=tracing.context_of(getattr(message, "attributes", None)),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )

    def _work_on(self, work: Work) -> Work | None:
        """Process ``work``; meanwhile take the next message and time its pre-processing."""
        try:
            prepared = work.prepared.result()
        except CancelledError:  # stopping before it started: give it back untouched
            self._give_back(work)
            self._forget(work)
            return None
        except BaseException as exc:  # noqa: BLE001 - pre-processing failed: an attempt that failed
            span = self._attempt_span(work) if self.tracer is not None else None
            with _current(span):
                if span is not None:
                    span.set_attribute("mq.outcome", "failed")
                    tracing.record_error(span, exc)
                self._finish(work, "failed", exc, None, None)
            return None
        if work.lost:
            self._forget(work)
            return None
        nxt: Work | None = None
        taken: Future[Work | None] | None = None
        #: set when ``work``'s processing ends: the next one's pre-processing need not wait longer.
        done = threading.Event()
        started = time.time()
        self.busy += 1
        if self.pipelining and not self._stop.is_set():
            taken = self._take_next(work, started, done)
        outcome, error = "succeeded", None
        span = self._attempt_span(work) if self.tracer is not None else None
        with _current(span):
            try:
                work.handler.process(work.message, prepared)
            except BaseException as exc:  # noqa: BLE001 - recorded, the message comes back later
                outcome, error = "failed", exc
            ended = time.time()
            self.busy -= 1
            _average(self._process_s, work.queue, ended - started)
            done.set()  # done earlier than estimated: the next one need not wait any longer
            if outcome == "succeeded" and work.handler.timeout and ended - started > work.handler.timeout:
                outcome = "timed_out"
            if span is not None:
                span.set_attribute("mq.outcome", outcome)
                if error is not None:
                    tracing.record_error(span, error)
            self._finish(work, outcome, error, started, ended)
        if taken is not None:
            nxt = taken.result()
        if not self.pipelining and not self._stop.is_set():
            nxt = self._take()
            if nxt is not None:
                self._schedule_preprocess(nxt, 0.0)
        return nxt

    def _take_next(self, work: Work, started: float, done: threading.Event) -> Future[Work | None]:
        """Take the next message beside ``work``'s processing, on another thread: the
        dequeue (a long poll when the queue is empty) must not delay the processing. Its
        pre-processing starts ``process(work) - preprocess(next)`` seconds after ``started``,
        or when ``done`` is set, whichever comes first."""

        def run() -> Work | None:
            nxt = self._take()
            if nxt is not None:
                nxt.go = done
                lead = _estimate(work.message, "process") - _estimate(nxt.message, "preprocess")
                self._schedule_preprocess(nxt, max(0.0, lead - (time.time() - started)))
            return nxt

        try:
            # a pool, not a new thread: Thread.start() waits for the thread to run, and the
            # thread's dequeue then holds the GIL, delaying the processing by a millisecond or so.
            return self._takers.submit(run)
        except RuntimeError:  # shutting down
            taken: Future[Work | None] = Future()
            taken.set_result(None)
            return taken

    def _finish(
        self, work: Work, outcome: str, error: BaseException | None, started: float | None, ended: float | None
    ) -> None:
        message = work.message
        self._log(work, outcome, error, started, ended)
        if work.lost:
            self._forget(work)
            return
        try:
            if outcome == "succeeded" and self._acker is not None:
                acked = self._acker.ack(message, work.queue)
                acked.add_done_callback(lambda future: self._acked(work, future))
                return  # (forgotten once answered: the heartbeat keeps it hidden meanwhile)
            if outcome == "succeeded":
                self.client.ack(work.queue, [(message.id, message.receipt)])
                self.processed += 1
            else:
                # Visible again after a backoff that grows with the attempts; the dead-letter
                # rule of the queue takes it from there.
                backoff = min(self.retry_backoff * 2 ** max(0, message.receive_count - 1), 300.0)
                self.client.change_visibility(work.queue, message, backoff)
        except Exception as exc:  # noqa: BLE001 - a stale receipt or a lost node: it comes back
            log.warning("%s %s: %s", "ack" if outcome == "succeeded" else "retry later", message.id, exc)
        self._forget(work)

    def _acked(self, work: Work, future: Future[Any]) -> None:
        """``work``'s ack through the acker answered (an acker's thread)."""
        error = future.exception()
        if error is None:
            self.processed += 1
        else:  # a stale receipt or a lost node: it comes back
            log.warning("ack %s: %s", work.message.id, error)
        self._forget(work)

    def _give_back(self, work: Work) -> None:
        try:
            self.client.change_visibility(work.queue, work.message, 0)
        except Exception:  # noqa: BLE001, S110 - it comes back after its timeout anyway
            pass

    def _forget(self, work: Work) -> None:
        with self._held_lock:
            self._held.pop(work.message.id, None)

    # --- log data -----------------------------------------------------------------------------
    def _log(
        self, work: Work, outcome: str, error: BaseException | None, started: float | None, ended: float | None
    ) -> None:
        message = work.message
        record = {
            "message_id": message.id,
            "group": getattr(message, "group", None),
            "worker": self.consumer_id,
            "attempt": message.receive_count,
            "outcome": outcome,
            "enqueued_at": _iso_of(getattr(message, "enqueued_at", None)),
            "preprocess_started_at": _iso(work.preprocess_started),
            "preprocess_ended_at": _iso(work.preprocess_ended),
            "process_started_at": _iso(started),
            "process_ended_at": _iso(ended),
            "size": getattr(message, "size", None),
        }
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"[:10_000]
            record["traceback"] = "".join(traceback.format_exception(error))[-100_000:]
        with self._logs_lock:
            self._logs.append(record)

    def _flush_logs(self) -> None:
        with self._logs_lock:
            batch, self._logs = self._logs[:1000], self._logs[1000:]
        if not batch:
            return
        try:
            self.client.send_logs(batch)
        except Exception as exc:  # noqa: BLE001 - keep them for the next flush
            status = getattr(exc, "status", 0)  # the SDK's errors' HTTP status
            if 400 <= status < 500 and status not in (408, 429):
                # refused for good (a queue deleted meanwhile, a right taken away): sending the
                # same batch again would be refused again and hold every later record behind it
                log.error("dropping %d log records the service refused: %s", len(batch), exc)
                return
            log.warning("sending %d log records: %s", len(batch), exc)
            with self._logs_lock:
                self._logs[:0] = batch

    def _flusher(self) -> None:
        while not self._stop.wait(0.5):
            self._flush_logs()

    # --- heartbeats ---------------------------------------------------------------------------
    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_every):
            self.heartbeat_once()

    def heartbeat_once(self) -> dict[str, Any] | None:
        with self._held_lock:
            held = list(self._held.values())
        payload = {
            "consumer": self.consumer_id,
            "name": self.name,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "capacity": self.concurrency,
            "load": min(1.0, self.busy / self.concurrency),
            "held": [{"id": w.message.id, "receipt": w.message.receipt, "queue": w.queue} for w in held],
        }
        try:
            answer = self.client.heartbeat(payload)
        except Exception as exc:  # noqa: BLE001 - try again at the next beat
            log.warning("heartbeat: %s", exc)
            return None
        lost = set(answer.get("lost", []))
        for w in held:
            if w.message.id in lost:
                w.lost = True  # redelivered elsewhere: finish quietly, never ack
        if answer.get("instruction") == "sleep":
            self._sleep_until = time.monotonic() + float(answer.get("sleep", 0))
        assigned: dict[str, list[str]] = {}
        for item in answer.get("take") or ():
            if item.get("queue") in self.handlers and item.get("node"):
                assigned.setdefault(item["queue"], []).append(item["node"])
        self._assigned = assigned
        return answer
