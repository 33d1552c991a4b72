"""This process's node runtime, started on first use (``runnode`` starts it explicitly)."""

from __future__ import annotations

import threading

from django.conf import settings

from queues.cluster.node import NodeRuntime

_runtime: NodeRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> NodeRuntime:
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                address = settings.NODE_ADDRESS or "in-process"
                _runtime = NodeRuntime(
                    address, heartbeat=settings.NODE_HEARTBEAT, cache_bytes=settings.NODE_BODY_CACHE_BYTES
                ).start()
    return _runtime


def set_runtime(runtime: NodeRuntime | None) -> None:
    global _runtime
    with _runtime_lock:
        _runtime = runtime


def current_runtime() -> NodeRuntime | None:
    """This process's runtime if one was started, without starting one (for figures)."""
    return _runtime
