"""Middleware: what attaches to the service's message operations from outside them (spans,
figures), as hooks around each call rather than code threaded through the path.

A :class:`Middleware` overrides the hooks it needs; every hook here does nothing. ``before_*``
runs before the operation (after nothing: the rights are checked inside it), ``after_*`` after
it, with its ``result`` or the ``exception`` it raised, in the reverse order of the ``before_*``
hooks. :data:`MIDDLEWARE` is the registry the service reads: the node's metrics always, its
tracing while spans are made (``queues.tracing`` adds and removes itself).

The hooks run once a call, never once a message, and only for the middleware that override
them: an operation none attaches to pays one attribute read (:class:`Registry` keeps a tuple
per operation).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from queues import metrics
from queues.engine.ids import MessageId
from queues.engine.partition import Delivery
from queues.service.types import AckResult, MessageDraft

#: The operations that have hooks (``before_<op>`` and ``after_<op>``; the dead-letter move
#: has only its ``after_``).
OPERATIONS = ("enqueue", "dequeue", "ack", "dead_letters")


class Middleware:
    """Hooks around the service's message operations (``dramatiq``'s middleware is the model).
    ``hops``: how often the call was forwarded before it came here (0: from a client)."""

    def before_enqueue(self, queue: str, drafts: Sequence[MessageDraft], hops: int) -> Sequence[MessageDraft]:
        """Before an enqueue (not its ``check_only`` form); the drafts to store (the same, or
        others in their place: as many, in the same order, since the answer names each message
        the client sent by its position, and a forwarding node refuses an answer of another
        length)."""
        return drafts

    def after_enqueue(
        self,
        queue: str,
        drafts: Sequence[MessageDraft],
        hops: int,
        *,
        result: list[str] | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """After an enqueue: the IDs it gave, or what it raised."""

    def before_dequeue(self, target: str, hops: int) -> None:
        """Before a dequeue."""

    def after_dequeue(
        self,
        target: str,
        hops: int,
        *,
        result: list[Delivery] | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """After a dequeue: the deliveries, or what it raised."""

    def before_ack(self, target: str, items: Sequence[tuple[MessageId, str | None]], hops: int) -> None:
        """Before an ack (not its ``check_only`` form)."""

    def after_ack(
        self,
        target: str,
        items: Sequence[tuple[MessageId, str | None]],
        hops: int,
        *,
        result: AckResult | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """After an ack: its counts, or what it raised."""

    def after_dead_letters(self, source: str, *, moved: int = 0, failed: int = 0) -> None:
        """Dead letters of ``source`` (a queue, or ``topic/subscription``): ``moved`` to its dead-letter queue, ``failed`` to move
        (kept in the source, tried again at a later dequeue)."""


def _overrides(m: Middleware, hook: str) -> bool:
    return getattr(type(m), hook, None) is not getattr(Middleware, hook, None)


class Registry:
    """The middleware attached, in order, and for each operation the ones that hook it."""

    enqueue: tuple[Middleware, ...] = ()
    dequeue: tuple[Middleware, ...] = ()
    ack: tuple[Middleware, ...] = ()
    dead_letters: tuple[Middleware, ...] = ()

    def __init__(self, *middleware: Middleware) -> None:
        self._lock = threading.Lock()
        self.all: tuple[Middleware, ...] = ()
        for m in middleware:
            self.add(m)

    def add(self, m: Middleware) -> None:
        """Attach ``m`` (after those attached already); once, however often it is added."""
        with self._lock:
            if m not in self.all:
                self._set((*self.all, m))

    def remove(self, m: Middleware) -> None:
        with self._lock:
            self._set(tuple(x for x in self.all if x is not m))

    def _set(self, middleware: tuple[Middleware, ...]) -> None:
        self.all = middleware
        for op in OPERATIONS:
            hooked = tuple(m for m in middleware if _overrides(m, f"before_{op}") or _overrides(m, f"after_{op}"))
            setattr(self, op, hooked)


class Metrics(Middleware):
    """The service's own figures (Prometheus, ``queues.metrics``): dead letters moved, and
    those that failed to move. (The partitions count their messages themselves.)"""

    def after_dead_letters(self, source: str, *, moved: int = 0, failed: int = 0) -> None:
        queue, _, sub = source.partition("/")
        if moved:
            metrics.DEAD_LETTERED.labels(queue, sub).inc(moved)
        if failed:
            metrics.DEAD_LETTER_MOVES_FAILED.labels(queue, sub).inc(failed)


#: The middleware of this process: the metrics always; ``queues.tracing`` adds its own while
#: it makes spans.
MIDDLEWARE = Registry(Metrics())
