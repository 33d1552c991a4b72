"""Receiving ahead of the handlers: the :class:`Prefetcher` and the threaded :class:`Consumer`.

A handler that receives one message, handles it and acknowledges it waits for two calls per
message. The prefetcher receives in batches into a small buffer from a background thread, so a
handler finds its next message waiting; the consumer's acks go through an
:class:`~mq_client.producer.Acker`, in batches too.

**Nothing waits in the buffer past its visibility.** A message received is hidden from other
consumers for its visibility timeout; if it waited in the buffer until that ran out, another
consumer would receive it too and it would be handled twice. So the buffer holds about what the
handlers take in ``fill`` (half) of the visibility timeout, measured (messages handed out over
the last ``RATE_WINDOW`` seconds, so it starts small and grows with a sustained rate), never
more than ``max_prefetch``, and at first only what the handlers waiting ask for. A message's
visibility is counted from when its receive was answered. A buffered message that would have
less than ``margin`` of its visibility left when handed out is given back at once (visibility
0) instead.

**Strict queues.** A strict queue delivers a group's messages one at a time: while one is
delivered and not acknowledged, nobody receives the group's next. A message held in a buffer is
therefore a group held from every other consumer, for nothing. On a strict queue (or with
``strict=True``, for a queue whose messages carry groups) the prefetcher receives only for the
handlers already waiting, so it holds nothing that a handler is not ready for: the saving left
is that a handler's ack does not wait for its answer (the acker sends it), and a message that
arrives when no handler waits any more (its ``get`` timed out) is given back at once.

A forked child starts with an empty buffer (the parent's messages stay the parent's) and its
own receiving thread.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mq_client.errors import ApiError
from mq_client.producer import Acker
from mq_client.types import Message

if TYPE_CHECKING:
    from mq_client.client import Client

__all__ = ["RATE_WINDOW", "Consumer", "Prefetcher"]

log = logging.getLogger(__name__)

#: Seconds over which the handlers' rate is measured (hand-outs in the window over its length).
RATE_WINDOW = 5.0
#: Seconds a receive answered late is assumed to have taken back (the answer's way back to us).
_ANSWER_SLACK = 0.5


@dataclass(slots=True)
class _Held:
    message: Message
    deadline: float  # time.monotonic() when it becomes visible to others again


class Prefetcher:
    """Messages of ``queue`` received ahead into a bounded buffer by a background thread.

    :param client: the client that receives
    :param queue: a queue's name or ``topic/subscription``
    :param visibility_timeout: seconds each message is hidden (default: the queue's)
    :param max_prefetch: messages held in the buffer at most
    :param strict: receive only for handlers waiting (default: whether the queue is strict)
    :param fill: the part of the visibility timeout the buffer may hold, at the measured rate
    :param margin: seconds of visibility a message must have left to be handed out (default:
        a tenth of the visibility timeout, at least 1 s)
    :param wait: the long poll of each receive, seconds
    """

    def __init__(
        self,
        client: Client,
        queue: str,
        *,
        visibility_timeout: float | None = None,
        max_prefetch: int = 100,
        strict: bool | None = None,
        fill: float = 0.5,
        margin: float | None = None,
        wait: float = 2.0,
    ) -> None:
        if max_prefetch < 1 or not 0 < fill <= 1:
            raise ValueError("max_prefetch must be >= 1 and 0 < fill <= 1")
        self.client = client
        self.queue = queue
        if visibility_timeout is None or strict is None:
            settings = client.get_queue(queue)
            visibility_timeout = settings.visibility_timeout if visibility_timeout is None else visibility_timeout
            strict = settings.strict if strict is None else strict
        self.visibility_timeout = float(visibility_timeout)
        self.strict = strict
        self.max_prefetch = max_prefetch
        self.fill = fill
        self.margin = max(1.0, self.visibility_timeout / 10) if margin is None else margin
        self.wait = wait
        self._closed = False
        #: messages given back because they would have expired in the buffer (a figure to watch)
        self.given_back = 0
        self._fresh_state()
        _LIVE.add(self)

    def _fresh_state(self) -> None:
        """An empty buffer and a new receiving thread (at first, and in a forked child)."""
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._buffer: deque[_Held] = deque()
        self._waiting = 0
        self._handed: deque[float] = deque(maxlen=1024)  # when messages were handed out
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name=f"mq-prefetch-{self.queue}", daemon=True)
        if not self._closed:
            self._thread.start()

    # --------------------------------------------------------------- handing out

    def get(self, timeout: float | None = None) -> _Held | None:
        """The next message with its visibility deadline (``time.monotonic()``), or None when
        none came within ``timeout`` seconds or the prefetcher is closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        expired: list[Message] = []
        if self._pid != os.getpid():  # forked without the hook: the parent's messages are not ours
            self._fresh_state()
        try:
            with self._cv:
                self._waiting += 1
                self._cv.notify_all()
                try:
                    while True:
                        now = time.monotonic()
                        while self._buffer:
                            held = self._buffer.popleft()
                            if held.deadline - now >= self.margin:
                                self._handed.append(now)
                                self._cv.notify_all()
                                return held
                            expired.append(held.message)
                        if self._closed:
                            return None
                        left = None if deadline is None else deadline - now
                        if left is not None and left <= 0:
                            return None
                        self._cv.wait(left)
                finally:
                    self._waiting -= 1
        finally:
            self._give_back(expired)

    def __iter__(self) -> Iterator[Message]:
        """Messages as they come, until :meth:`close`."""
        while True:
            held = self.get()
            if held is None:
                return
            yield held.message

    def target(self) -> int:
        """How many messages the buffer should hold now (without the lock: a figure)."""
        if self.strict:
            return 0
        since = time.monotonic() - RATE_WINDOW
        recent = sum(1 for at in list(self._handed) if at >= since)
        # over the whole window: a burst of hand-outs (handlers starting together) counts as a
        # burst, not as a rate; a sustained rate fills the window
        rate = recent / RATE_WINDOW
        return min(self.max_prefetch, math.floor(rate * self.visibility_timeout * self.fill))

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._buffer)

    # ----------------------------------------------------------------- receiving

    def _run(self) -> None:
        while True:
            expired: list[Message] = []
            with self._cv:
                while not self._closed:
                    room = min(self.max_prefetch, max(self._waiting, self.target())) - len(self._buffer)
                    if room > 0:
                        break
                    self._cv.wait(self.margin)
                    expired = self._expiring(time.monotonic())
                    if expired:
                        break
                if self._closed:
                    return
            if expired:
                self._give_back(expired)
                continue
            started = time.monotonic()
            try:
                messages = self.client.dequeue(
                    self.queue, room, visibility_timeout=self.visibility_timeout, wait=self.wait
                )
            except Exception as exc:
                if not isinstance(exc, ApiError):
                    log.exception("mq prefetch of %s: receive failed", self.queue)
                time.sleep(min(1.0, self.wait) or 0.1)  # the client retried already; try again shortly
                continue
            # the visibility runs from when the node took them: at the latest when it answered
            # (a long poll answers when messages arrive), less the answer's way back
            answered = time.monotonic()
            taken = max(started, answered - _ANSWER_SLACK)
            extra: list[Message] = []
            with self._cv:
                closed = self._closed
                if not closed:
                    if self.strict:  # hold nothing nobody waits for: a held group blocks others
                        keep = max(0, self._waiting - len(self._buffer))
                        messages, extra = messages[:keep], messages[keep:]
                    self._buffer.extend(_Held(m, taken + self.visibility_timeout) for m in messages)
                    self._cv.notify_all()
            if closed:
                self._give_back(messages)
                return
            if extra:
                self._give_back(extra)
                self.given_back -= len(extra)

    def _expiring(self, now: float) -> list[Message]:
        """Take out the buffered messages that could no longer be handed out in time (locked)."""
        out = [h.message for h in self._buffer if h.deadline - now < self.margin]
        if out:
            self._buffer = deque(h for h in self._buffer if h.deadline - now >= self.margin)
        return out

    def _give_back(self, messages: list[Message]) -> None:
        for m in messages:
            self.given_back += 1
            try:
                self.client.give_back(self.queue, m)
            except Exception:
                log.debug("mq give back of %s failed", m.id, exc_info=True)

    def close(self) -> None:
        """Stop receiving and give back what is buffered (visibility 0: delivered again at once)."""
        with self._cv:
            self._closed = True
            left = [h.message for h in self._buffer]
            self._buffer.clear()
            self._cv.notify_all()
        self._give_back(left)
        self.given_back -= len(left)  # given back on close, not because they would expire
        _LIVE.discard(self)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.wait + self.client.timeout + 1)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """``threads`` handler threads over one queue: each message is passed to ``handler``,
    acknowledged when it returns, given back (visibility 0) when it raises.

    With ``prefetch`` (the default) the messages come from a :class:`Prefetcher` and the acks go
    through an :class:`~mq_client.producer.Acker`; without, each thread receives one message and
    acknowledges it itself, a call each. A heartbeat extends the visibility of every message a
    handler still holds when less than half of it is left; it beats more often than the
    prefetcher's ``margin`` (the least visibility a message is handed out with), so no message
    runs out between two beats.

    A handler that raises anything, an ``Exception`` or not (``CancelledError``), fails its
    message: it is given back and no longer extended. ``SystemExit`` and ``KeyboardInterrupt``
    end the thread after that; other errors do not.
    """

    def __init__(
        self,
        client: Client,
        queue: str,
        handler: Callable[[Message], object],
        *,
        threads: int = 8,
        prefetch: bool = True,
        max_prefetch: int = 100,
        visibility_timeout: float | None = None,
        strict: bool | None = None,
    ) -> None:
        self.client = client
        self.queue = queue
        self.handler = handler
        self.threads = threads
        self.prefetch = prefetch
        if visibility_timeout is None or strict is None:
            settings = client.get_queue(queue)
            visibility_timeout = settings.visibility_timeout if visibility_timeout is None else visibility_timeout
            strict = settings.strict if strict is None else strict
        self.visibility_timeout = float(visibility_timeout)
        self.prefetcher = (
            Prefetcher(client, queue, visibility_timeout=visibility_timeout, strict=strict, max_prefetch=max_prefetch)
            if prefetch
            else None
        )
        self.acker = Acker(client) if prefetch else None
        self._stop = threading.Event()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        #: messages handled (the handler returned) and failed (it raised)
        self.handled = 0
        self.failed = 0
        self._workers: list[threading.Thread] = []

    def start(self) -> Consumer:
        for i in range(self.threads):
            t = threading.Thread(target=self._work, name=f"mq-consumer-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        beat = threading.Thread(target=self._heartbeat, name="mq-consumer-heartbeat", daemon=True)
        beat.start()
        self._workers.append(beat)
        return self

    def stop(self) -> None:
        """Stop taking messages, let the handlers finish theirs, send the acks, give back the
        prefetched rest."""
        self._stop.set()
        if self.prefetcher is not None:
            self.prefetcher.close()
        for t in self._workers:
            t.join()
        if self.acker is not None:
            self.acker.close()

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next(self) -> _Held | None:
        if self.prefetcher is not None:
            return self.prefetcher.get(timeout=0.5)
        started = time.monotonic()
        try:
            got = self.client.dequeue(self.queue, 1, visibility_timeout=self.visibility_timeout, wait=0.5)
        except Exception as exc:  # the worker must go on: try again shortly
            if not isinstance(exc, ApiError):
                log.exception("mq receive of %s failed", self.queue)
            time.sleep(0.1)
            return None
        return _Held(got[0], started + self.visibility_timeout) if got else None

    def _work(self) -> None:
        while not self._stop.is_set():
            held = self._next()
            if held is None:
                continue
            message = held.message
            with self._lock:
                self._held[message.id] = held
            fatal: BaseException | None = None
            try:
                self.handler(message)
            except BaseException as exc:  # noqa: BLE001 - the handler's failure: the message goes back
                ok = False
                if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                    fatal = exc
            else:
                ok = True
            try:
                self._settle(message, ok=ok)
            finally:
                with self._lock:
                    self._held.pop(message.id, None)
                    if ok:
                        self.handled += 1
                    else:
                        self.failed += 1
            if fatal is not None:
                raise fatal

    def _settle(self, message: Message, *, ok: bool) -> None:
        try:
            if self.acker is not None:
                if ok:
                    self.acker.ack(message, self.queue)
                else:
                    self.acker.change_visibility(message, 0, self.queue)
            elif ok:
                self.client.ack(self.queue, [message])
            else:
                self.client.give_back(self.queue, message)
        except Exception:
            log.debug("mq settling %s failed", message.id, exc_info=True)

    def _heartbeat(self) -> None:
        # more often than the margin a message may be handed out with (else it could run out
        # between two beats), and than a quarter of the visibility timeout
        margin = self.prefetcher.margin if self.prefetcher is not None else max(1.0, self.visibility_timeout / 10)
        period = max(0.1, min(self.visibility_timeout / 4, margin / 2))
        while not self._stop.wait(period):
            now = time.monotonic()
            with self._lock:
                due = [h for h in self._held.values() if h.deadline - now < self.visibility_timeout / 2]
            for held in due:
                try:
                    self.client.change_visibility(self.queue, held.message, self.visibility_timeout)
                    held.deadline = time.monotonic() + self.visibility_timeout
                except Exception:
                    log.debug("mq heartbeat of %s failed", held.message.id, exc_info=True)


# Every open prefetcher of this process: emptied in a forked child.
_LIVE: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


def _renew_in_child() -> None:
    for prefetcher in list(_LIVE):
        prefetcher._fresh_state()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_in_child)
