"""Handler registration: ``@handler("queue", preprocess=fetch)`` on ``process(message, prepared)``.

Applications register handlers in their own modules; ``WORKER_HANDLERS`` names the modules
(comma-separated) the worker imports at start, as Celery imports task modules. This module
imports nothing from Django, so an application module can import it at any time.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Preprocess = Callable[[Any], Any]
Process = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Handler:
    #: the queue (or ``topic/subscription``) it consumes.
    queue: str
    #: ``process(message, prepared)``: the work that must follow the group's order.
    process: Process
    #: ``preprocess(message) -> prepared``: work with no ordering needs (fetching input...).
    preprocess: Preprocess | None = None
    #: seconds after which an attempt counts as timed out (its result is discarded).
    timeout: float | None = None


_registry: dict[str, Handler] = {}


def handler(
    queue: str, *, preprocess: Preprocess | None = None, timeout: float | None = None
) -> Callable[[Process], Process]:
    """Register the decorated function as the processing function of ``queue``."""
    if not isinstance(queue, str) or not queue:
        raise ValueError("handler() needs a queue name")

    def register(process: Process) -> Process:
        existing = _registry.get(queue)
        if existing is not None and existing.process is not process:
            raise ValueError(f"queue {queue!r} already has a handler: {existing.process.__qualname__}")
        _registry[queue] = Handler(queue, process, preprocess, timeout)
        return process

    return register


def handlers() -> dict[str, Handler]:
    return dict(_registry)


def discover(modules: str | None = None) -> dict[str, Handler]:
    """Import the handler modules named in ``WORKER_HANDLERS`` (or ``modules``)."""
    names = modules if modules is not None else os.environ.get("WORKER_HANDLERS", "")
    for name in (n.strip() for n in names.split(",")):
        if name:
            importlib.import_module(name)
    return handlers()


def configured_queues(found: dict[str, Handler]) -> list[str]:
    """``WORKER_QUEUES`` (comma-separated), or every queue with a handler."""
    wanted = [q.strip() for q in os.environ.get("WORKER_QUEUES", "").split(",") if q.strip()]
    if not wanted:
        return sorted(found)
    missing = [q for q in wanted if q not in found]
    if missing:
        raise ValueError(f"WORKER_QUEUES names queues without a handler: {', '.join(missing)}")
    return wanted
