"""Calls one message at a time, sent as batches: the buffered :class:`Producer` and :class:`Acker`.

The service is fast in batches and slow one message a call; an application often holds one
message at a time (a web request sends one, a handler acks one). Both classes take single
messages from any number of threads, return a :class:`concurrent.futures.Future` at once, and
send what they gathered for a queue as one call when the batch is full (``max_batch`` messages or
``max_batch_bytes`` of JSON) or when its oldest message has waited ``linger`` seconds, from
background threads (``senders``; one batch of a queue in flight at a time, so a queue's messages
are sent in the order given).

Each future is resolved exactly once: with the message's ID (an ack: None), with its own error,
or, for a message whose call may have stored it (no answer, a timeout, 5xx after the client's
retries), with :class:`~mq_client.errors.DeliveryUnknown`.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from mq_client.checks import Refusal, check_message, refused_index
from mq_client.errors import ApiError, BadRequest, BufferFull, Conflict, DeliveryUnknown, ServerError, Unavailable
from mq_client.transport import dumps
from mq_client.types import Estimates, Message, NewMessage, VisibilityResult

if TYPE_CHECKING:
    from mq_client.client import Client

__all__ = [
    "DEFAULT_LINGER",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_BUFFERED",
    "Acker",
    "Producer",
    "Splitter",
    "message_item",
    "split_refused",
]

#: Seconds the oldest message of a queue waits for others before its batch is sent. 0: at once,
#: unless the queue's previous batch is still in flight (one at a time, in order), and the
#: messages that come meanwhile make the next batch: batches grow with the load by themselves.
#: With 32 threads each waiting for its own message, a linger of 5 ms gave 2.5x the messages a
#: second of enqueue a call each and 0 gave 6.5x, with a lower p99 too (6.2 ms against 9.7;
#: bench/client_batching.py, docs/explanation/performance.md). A linger saves calls (and the
#: node's CPU a call) when messages come slower than calls return.
DEFAULT_LINGER = 0.0
#: A batch's JSON at most, bytes: 1 MiB is under the smallest request limit of any queue (a
#: batch of 1,000 messages of the smallest max_message_size, 1 KiB, may take 2 MiB).
DEFAULT_MAX_BATCH_BYTES = 1 << 20
#: Messages buffered (not yet answered) at most before ``send`` pushes back.
DEFAULT_MAX_BUFFERED = 10_000

_R = TypeVar("_R")


@dataclass(slots=True)
class _Entry(Generic[_R]):
    item: Any
    size: int
    future: Future[_R]
    at: float = field(default_factory=time.monotonic)


class _Coalescer(Generic[_R]):
    """Single items from many threads, sent in batches per key by background threads."""

    _name = "mq-batcher"

    def __init__(
        self,
        client: Client,
        *,
        linger: float,
        max_batch: int,
        max_batch_bytes: int,
        max_buffered: int,
        block: bool,
        block_timeout: float | None,
        senders: int,
    ) -> None:
        from mq_client.client import MAX_BATCH

        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be 1..{MAX_BATCH}")
        if linger < 0 or max_batch_bytes < 1 or max_buffered < 1 or senders < 1:
            raise ValueError("linger must be >= 0; max_batch_bytes, max_buffered and senders >= 1")
        self.client = client
        self.linger = linger
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self.max_buffered = max_buffered
        self.block = block
        self.block_timeout = block_timeout
        self.senders = senders
        self._fresh_state()
        self._closed = False
        _LIVE.add(self)

    def _fresh_state(self) -> None:
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._pending: dict[Any, deque[_Entry[_R]]] = {}
        self._pending_bytes: dict[Any, int] = {}
        self._busy: set[Any] = set()
        self._unresolved: set[Future[_R]] = set()
        self._resolving: set[Future[_R]] = set()  # out of the buffer, their callbacks running
        self._flushing = 0
        self._flush_before = -math.inf
        self._threads: list[threading.Thread] = []
        self._pid = os.getpid()

    # ------------------------------------------------------------------ adding

    def _add(self, key: Any, item: Any, size: int) -> Future[_R]:
        future: Future[_R] = Future()
        deadline = None if self.block_timeout is None else time.monotonic() + self.block_timeout
        if self._pid != os.getpid():  # forked without the hook (a fork from C): start afresh
            self._forked()
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            while len(self._unresolved) >= self.max_buffered:
                if not self.block:
                    raise BufferFull(f"{len(self._unresolved)} messages buffered, the most allowed (max_buffered)")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise BufferFull(f"still {len(self._unresolved)} messages buffered after {self.block_timeout}s")
                self._cv.wait(left)
                if self._closed:
                    raise RuntimeError(f"{type(self).__name__} is closed")
            self._unresolved.add(future)
            queue = self._pending.get(key)
            if queue is None:
                queue = self._pending[key] = deque()
                self._pending_bytes[key] = 0
            queue.append(_Entry(item, size, future))
            self._pending_bytes[key] += size
            if not self._threads:
                self._start_threads()
            if len(queue) == 1 or len(queue) >= self.max_batch or self._pending_bytes[key] >= self.max_batch_bytes:
                self._cv.notify()
        return future

    def _start_threads(self) -> None:
        for i in range(self.senders):
            t = threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    # ---------------------------------------------------------------- sending

    def _ready(self, now: float) -> tuple[Any, float | None]:
        """A key whose batch may go now (else None), and the seconds until the next one may."""
        soonest: float | None = None
        for key, queue in self._pending.items():
            if not queue or key in self._busy:
                continue
            if (
                self._flushing
                or self._closed
                or len(queue) >= self.max_batch
                or self._pending_bytes[key] >= self.max_batch_bytes
            ):
                return key, None
            due = queue[0].at + self.linger - now
            if due <= 0 or queue[0].at <= self._flush_before:
                return key, None
            soonest = due if soonest is None else min(soonest, due)
        return None, soonest

    def _take(self, key: Any) -> list[_Entry[_R]]:
        """The next batch of ``key``: up to ``max_batch`` entries and ``max_batch_bytes`` (at
        least one entry); cancelled futures are dropped unsent."""
        queue = self._pending[key]
        batch: list[_Entry[_R]] = []
        size = 0
        while queue and len(batch) < self.max_batch:
            entry = queue[0]
            if batch and size + entry.size > self.max_batch_bytes:
                break
            queue.popleft()
            self._pending_bytes[key] -= entry.size
            if not entry.future.set_running_or_notify_cancel():
                self._unresolved.discard(entry.future)
                continue
            batch.append(entry)
            size += entry.size
        if not queue:
            del self._pending[key], self._pending_bytes[key]
        return batch

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                if me not in self._threads:  # a fork's child replaced the threads
                    return
                key, wait = self._ready(time.monotonic())
                if key is None:
                    if self._closed and not self._pending:
                        return
                    self._cv.wait(wait)
                    continue
                batch = self._take(key)
                self._busy.add(key)
            answers: list[_Answer] = []
            error: BaseException = RuntimeError("no answer for this message in its batch's")
            try:
                if batch:
                    self._deliver(key, batch, answers)
            except BaseException as exc:  # noqa: BLE001 - resolved, never lost: a thread that died would leave them pending
                error = exc
            finally:
                answered = {id(a[0]) for a in answers}
                answers += [
                    (e.future, None, self._unknown(key, e, error)) for e in batch if id(e.future) not in answered
                ]
                # free the slots and the queue first, then resolve outside the lock: a future's
                # callback may send() on a full buffer, or to this queue, without waiting on us
                futures = [entry.future for entry in batch]
                with self._cv:
                    self._busy.discard(key)
                    self._unresolved.difference_update(futures)
                    self._resolving.update(futures)
                    self._cv.notify_all()
                for future, result, failure in answers:
                    _resolve(future, result, failure)
                with self._cv:
                    self._resolving.difference_update(futures)

    def _deliver(self, key: Any, batch: list[_Entry[_R]], answers: list[_Answer]) -> None:
        """Send ``batch``; append each entry's answer to ``answers`` (resolved by the caller)."""
        raise NotImplementedError

    def _unknown(self, key: Any, entry: _Entry[_R], exc: BaseException) -> BaseException:
        return exc

    def _send_isolating(
        self,
        key: Any,
        batch: list[_Entry[_R]],
        answers: list[_Answer],
        call: Callable[[list[_Entry[_R]]], list[Any]],
        refused: tuple[type[ApiError], ...],
        unknown: tuple[type[ApiError], ...],
    ) -> None:
        """Send ``batch`` with ``call`` (its results, one an entry), part after part: a part the
        API refuses whole (``refused``) is split by :class:`Splitter` and its parts sent again;
        ``unknown`` errors (or any but an ``ApiError``) make the part's entries unknown, another
        ``ApiError`` fails them. Never recursive, at most about ``2 * len(batch)`` calls."""
        splitter: Splitter[_Entry[_R]] = Splitter(batch, lambda e: e.item)
        while (part := splitter.next()) is not None:
            try:
                results = call(part)
            except refused as exc:
                failed = splitter.refused(part, exc)
                if failed is not None:
                    answers.append((failed.future, None, exc))
            except unknown as exc:  # (ConnectionFailed too) it may be stored
                answers += [(e.future, None, self._unknown(key, e, exc)) for e in part]
            except ApiError as exc:  # 401, 403, 404: nothing of it stored, nor would it be
                answers += [(e.future, None, exc) for e in part]
            except Exception as exc:  # noqa: BLE001 - a bug or a library's error: the call may have gone out
                answers += [(e.future, None, self._unknown(key, e, exc)) for e in part]
            else:
                answers += [(e.future, r, None) for e, r in zip(part, results)]

    # ------------------------------------------------------------ flush, close

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything buffered now, without waiting for the linger, and wait until each of
        those messages is answered; False if some were not within ``timeout`` seconds.

        Called from one of its own sender threads (a future's done-callback), it only starts
        the sending and does not wait: those threads answer the messages it would wait for. It
        returns True then only if nothing was buffered."""
        with self._cv:
            waiting = set(self._unresolved)
            if not waiting:
                return True
            if threading.current_thread() in self._threads:
                self._flush_before = time.monotonic()  # what is buffered now goes without the linger
                self._cv.notify_all()
                return False
            waiting |= self._resolving
            self._flushing += 1
            self._cv.notify_all()
        try:
            _, not_done = wait_futures(waiting, timeout)
            return not not_done
        finally:
            with self._cv:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> bool:
        """Send what is buffered, wait for its answers (up to ``timeout`` seconds), stop the
        threads. ``send`` refuses afterwards. False if some answers were not in within ``timeout``."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        done = self.flush(timeout)
        _LIVE.discard(self)
        return done

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def buffered(self) -> int:
        """Messages taken and not yet answered."""
        with self._lock:
            return len(self._unresolved)

    def _forked(self) -> None:
        """In a forked child: an empty buffer (the parent sends what it held) and new threads,
        started at the first message."""
        self._fresh_state()


_S = TypeVar("_S", bound="_Coalescer[Any]")
#: A future's answer: (future, result, error), resolved once the batch's slots are free.
_Answer = tuple[Future[Any], Any, "BaseException | None"]


_E = TypeVar("_E")


def split_refused(batch: list[_E], exc: ApiError, item_of: Callable[[_E], Any]) -> tuple[int | None, list[list[_E]]]:
    """What to do with a batch the API refused whole (a 4xx): the index of the message to fail
    with ``exc`` (the one the answer names: ``messages[i]``, or a stale receipt's ``id``; the
    only one left), or None, and the parts to send again, in order (the rest of the batch as one,
    or its two halves when the answer names no message)."""
    index = refused_index(exc.detail)
    if isinstance(exc, Conflict) and exc.message_id is not None:
        index = next((i for i, e in enumerate(batch) if _id_of(item_of(e)) == exc.message_id), None)
    if index is not None and index < len(batch):
        rest = batch[:index] + batch[index + 1 :]
        return index, [rest] if rest else []
    if len(batch) == 1:
        return 0, []
    half = len(batch) // 2
    return None, [batch[:half], batch[half:]]


#: Refusals naming a message, one after the other, before the rest of a part is split in halves.
HALVE_AFTER = 4


class Splitter(Generic[_E]):
    """The parts of a batch to send, in order, as the API refuses some (iterative: a batch of
    any number of bad messages needs no recursion).

    A refusal naming a message fails it and sends the rest again; after ``halve_after`` such
    refusals in a row the rest goes as two halves (a half without a bad message is stored in
    one call), and a refusal naming none splits in halves down to the message at fault. A
    message the answer names, or left alone in a refused part, is refused for certain; the
    others are sent again. A batch of n messages takes at most about 2n calls.
    """

    def __init__(self, batch: list[_E], item_of: Callable[[_E], Any], halve_after: int = HALVE_AFTER) -> None:
        self._work: deque[list[_E]] = deque([batch]) if batch else deque()
        self._item_of = item_of
        self._halve_after = halve_after
        self._in_row = 0

    def next(self) -> list[_E] | None:
        """The next part to send, or None when all are sent."""
        return self._work.popleft() if self._work else None

    def refused(self, part: list[_E], exc: ApiError) -> _E | None:
        """``part`` was refused whole with ``exc``: the entry refused for certain, if one is
        (fail it with ``exc``); what to send again comes from :meth:`next`."""
        failed, parts = split_refused(part, exc, self._item_of)
        if failed is None:
            self._in_row = 0
        else:
            self._in_row += 1
            if self._in_row >= self._halve_after and parts and len(parts[0]) > 1:
                rest = parts[0]
                parts = [rest[: len(rest) // 2], rest[len(rest) // 2 :]]
                self._in_row = 0
        self._work.extendleft(reversed(parts))
        return part[failed] if failed is not None else None


def _id_of(item: Any) -> str | None:
    return item.get("id") if isinstance(item, Mapping) else None


def _resolve(future: Future[Any], result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve a future once (a second resolution is a bug elsewhere, not worth a dead thread)."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class Producer(_Coalescer[str]):
    """A buffered producer: :meth:`send` returns at once with a future of the message's ID.

    ::

        with Producer(client) as producer:
            future = producer.send("orders", "hello", group="customer-42")
            ...
            print(future.result())   # the message ID, or its error raised

    :param client: the :class:`~mq_client.client.Client` that sends (its retries apply to each batch)
    :param linger: seconds a queue's oldest message waits for more before its batch is sent
    :param max_batch: messages per enqueue call at most (1..1,000)
    :param max_batch_bytes: bytes of JSON per enqueue call at most (a larger message goes alone)
    :param max_buffered: messages taken and not yet answered at most; past it :meth:`send`
        blocks (``block=True``, up to ``block_timeout`` seconds, then raises) or raises
        :class:`~mq_client.errors.BufferFull` at once (``block=False``)
    :param senders: background threads sending batches (one batch per queue at a time)
    :param dedup_ids: give each message without a ``dedup_id`` a random one, so that the
        client's own retries of a batch, and the application's retry of a message reported
        :class:`~mq_client.errors.DeliveryUnknown`, store it once (within the queue's
        ``dedup_window``). Off by default: the service reserves and confirms each dedup ID in its
        store, which makes a batch call many times slower (``bench/client_batching.py``; figures
        in docs/explanation/performance.md); give ``dedup_id`` to the messages that need it
    :param max_message_size: the queue's ``max_message_size``, if known: a larger body fails at once

    What it can, it checks before buffering (:func:`mq_client.checks.check_message`): a bad
    message's future fails at once and no batch carries it. When the API refuses a batch anyway
    (a 4xx), the message it names fails alone and the rest are sent again (after
    ``HALVE_AFTER`` such refusals in a row, as two halves); a refusal that names none (a request
    too large) is split in halves down to the message at fault (:class:`Splitter`: no
    recursion, at most about 2n calls for n messages).

    Futures are resolved in a sender thread after their batch's room in the buffer is freed, so
    a done-callback may :meth:`send` again; :meth:`flush` or :meth:`close` from a callback
    starts the sending and returns without waiting for it.

    A clean exit flushes every producer (``atexit``); a forked child starts with an empty buffer
    and its own threads (the parent sends what was buffered before the fork).
    """

    _name = "mq-producer"

    def __init__(
        self,
        client: Client,
        *,
        linger: float = DEFAULT_LINGER,
        max_batch: int = 1000,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        block: bool = True,
        block_timeout: float | None = None,
        senders: int = 4,
        dedup_ids: bool = False,
        max_message_size: int | None = None,
    ) -> None:
        super().__init__(
            client,
            linger=linger,
            max_batch=max_batch,
            max_batch_bytes=max_batch_bytes,
            max_buffered=max_buffered,
            block=block,
            block_timeout=block_timeout,
            senders=senders,
        )
        self.dedup_ids = dedup_ids
        self.max_message_size = max_message_size

    def send(
        self,
        queue: str,
        body: str,
        *,
        group: str | None = None,
        dedup_id: str | None = None,
        delay: float | None = None,
        not_before: float | str | datetime | None = None,
        attributes: Mapping[str, Any] | None = None,
        size: int | None = None,
        estimates: Estimates | Mapping[str, float] | None = None,
        fairness_key: str | None = None,
    ) -> Future[str]:
        """Buffer one message for ``queue`` (the options are :meth:`Client.enqueue`'s); a future
        of its ID. A message the API would refuse fails its future at once (``BadRequest``)."""
        try:
            item = message_item(
                body,
                self.max_message_size,
                self.dedup_ids,
                group=group,
                dedup_id=dedup_id,
                delay=delay,
                not_before=not_before,
                attributes=attributes,
                size=size,
                estimates=estimates,
                fairness_key=fairness_key,
            )
        except BadRequest as exc:
            failed: Future[str] = Future()
            failed.set_exception(exc)
            return failed
        return self._add(queue, item, len(dumps(item)) + 1)

    def _deliver(self, key: Any, batch: list[_Entry[str]], answers: list[_Answer]) -> None:
        self._send_isolating(
            key,
            batch,
            answers,
            lambda part: self.client.enqueue_batch(key, [e.item for e in part]),
            refused=(BadRequest,),
            unknown=(Unavailable, ServerError),
        )

    def _unknown(self, key: Any, entry: _Entry[str], exc: BaseException) -> BaseException:
        return DeliveryUnknown(key, entry.item, exc)


def message_item(body: str, max_message_size: int | None, dedup_ids: bool, **options: Any) -> dict[str, Any]:
    """A message to buffer as the API's JSON, checked (:func:`~mq_client.checks.check_message`:
    raises ``BadRequest`` as the API would answer), with a random ``dedup_id`` if asked and none
    was given."""
    item = NewMessage(body, **options).to_json()
    try:
        check_message(item, max_message_size)
    except Refusal as refusal:
        raise BadRequest(400, refusal.code, f"message: {refusal.detail}") from None
    if dedup_ids and options.get("dedup_id") is None:
        item["dedup_id"] = uuid.uuid4().hex
    return item


class Acker(_Coalescer[Any]):
    """Acknowledgements (and visibility changes) from many handler threads, sent as batches.

    ``ack(message)`` returns a future at once; the acks of a queue gathered within ``linger``
    go as one ack call (by owner node, as :meth:`Client.ack` sends them). Each future resolves to
    None when the message is acknowledged (or was no longer stored), or to its own error: a stale
    receipt's :class:`~mq_client.errors.Conflict` fails that message alone, the rest are sent
    again. An ack whose answer was lost fails with the client's error; acking again is safe.

    The API changes one message's visibility a call: :meth:`change_visibility` sends those
    from the background threads, one call each, so that a handler does not wait for them.
    """

    _name = "mq-acker"

    def __init__(
        self,
        client: Client,
        *,
        linger: float = DEFAULT_LINGER,
        max_batch: int = 1000,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        block: bool = True,
        block_timeout: float | None = None,
        senders: int = 2,
    ) -> None:
        super().__init__(
            client,
            linger=linger,
            max_batch=max_batch,
            max_batch_bytes=1 << 19,  # the API's ack body limit, 512 KiB
            max_buffered=max_buffered,
            block=block,
            block_timeout=block_timeout,
            senders=senders,
        )

    def ack(self, message: Message, queue: str | None = None) -> Future[None]:
        """Acknowledge a delivered message (``queue``: its queue, or ``topic/subscription``;
        default the queue its ID names)."""
        item = {"id": message.id, "receipt": message.receipt}
        return self._add(("ack", queue or message.queue), item, len(message.id) + len(message.receipt) + 32)

    def change_visibility(
        self, message: Message, visibility_timeout: float, queue: str | None = None
    ) -> Future[VisibilityResult]:
        """Change a delivered message's visibility (0: give it back), from a background thread."""
        return self._add(("visibility", queue or message.queue), (message, visibility_timeout), 64)

    def _deliver(self, key: Any, batch: list[_Entry[Any]], answers: list[_Answer]) -> None:
        kind, queue = key
        if kind == "visibility":
            for entry in batch:
                message, seconds = entry.item
                try:
                    answers.append((entry.future, self.client.change_visibility(queue, message, seconds), None))
                except Exception as exc:  # noqa: BLE001 - its own answer, the next ones still go
                    answers.append((entry.future, None, exc))
            return

        def ack(part: list[_Entry[Any]]) -> list[None]:
            self.client.ack(queue, [e.item for e in part])
            return [None] * len(part)

        # an ack whose answer was lost fails with the client's error (acking again is safe)
        self._send_isolating(key, batch, answers, ack, refused=(BadRequest, Conflict), unknown=())


# Every producer and acker of this process: flushed at a clean exit, emptied in a forked child.
_LIVE: weakref.WeakSet[_Coalescer[Any]] = weakref.WeakSet()

#: Seconds a clean exit waits, at most, for each producer's buffered messages to be answered.
EXIT_FLUSH_TIMEOUT = 30.0


def _close_all() -> None:
    for coalescer in list(_LIVE):
        coalescer.close(EXIT_FLUSH_TIMEOUT)


def _renew_in_child() -> None:
    for coalescer in list(_LIVE):
        coalescer._forked()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_in_child)
