"""The queue client's pipeline (the strict-queue seed): pre-process the next message while the
current one is processed, heartbeat while holding messages, and log every attempt.

Each of ``concurrency`` slots works one message at a time. When message k's processing starts,
the slot takes message k+1 from the queue and schedules its pre-processing to start
``estimate.process(k) - estimate.preprocess(k+1)`` seconds later, so that it is ready just as
k is done (and not earlier, which would only hold the message longer). A slot holds at most
two messages, the one it processes and the next: a long task never parks others behind it,
and the heartbeat keeps both hidden while the worker lives. Messages of one group are never
processed at once: the service hands out one message of a group at a time.

The client is anything with the SDK's ``dequeue``, ``ack``, ``change_visibility``,
``send_logs`` and ``heartbeat`` methods, so the pipeline is tested without a server too.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mq_client import tracing
from queues.public import isoformat
from workers.handlers import Handler

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from mq_client import Client

log = logging.getLogger(__name__)

_UNSET = object()


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
    ):
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
        with self._held_lock:
            leftover = list(self._held.values())
            self._held.clear()
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
            hint = {}
            nodes = self._assigned.get(queue)
            if nodes:  # the service asked us to take these partitions: their owners first
                hint["node"] = nodes[self._rr % len(nodes)]
            try:
                got = self.client.dequeue(
                    queue,
                    1,
                    visibility_timeout=self.visibility_timeout,
                    wait=self.wait if len(self.queues) == 1 else 0,
                    **hint,
                )
            except Exception as exc:  # noqa: BLE001 - the SDK already retried; wait and go on
                log.warning("dequeue %s: %s", queue, exc)
                self._stop.wait(1.0)
                return None
            if got:
                work = Work(queue, got[0], self.handlers[queue])
                with self._held_lock:
                    self._held[work.message.id] = work
                return work
        if len(self.queues) > 1:
            self._stop.wait(self.wait)
        return None

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
