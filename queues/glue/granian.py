"""granian's private names, used to serve one more listener in each WSGI worker.

A node of several processes (``runnode --processes N``, :mod:`queues.cluster.serving`) has every
worker serve the public port (granian's own ``SO_REUSEPORT`` socket) and a private port of its
own. granian has no API for a second listener, so the worker's spawn target here is granian's
own WSGI worker target (``MPServer._spawn_wsgi_worker``) serving one more socket with the same
callback, threads and shutdown signal.

On a granian upgrade, check (checked against granian==2.8.7, pinned in requirements.txt):

- ``granian.server.mp.MPServer._spawn_wsgi_worker``: its parameters, which
  :func:`spawn_wsgi_worker` repeats, and its body, which :func:`spawn_wsgi_worker` follows;
- ``granian.server.mp.WorkerProcess.wrap_target`` (the decorator of spawn targets) and
  ``granian.server.common.WORKERS_METHODS``;
- ``granian._granian``: ``SocketHolder(fd, is_uds, backlog)``, ``WorkerSignal`` and
  ``WSGIWorker``'s positional arguments;
- ``granian._futures._new_cbscheduler``, ``granian.wsgi._callback_wrapper``,
  ``granian._signals.set_sync_signals`` and ``granian._internal.load_target``.

``tests/unit/test_glue.py`` fails if any of them is gone or its parameters changed; the
integration tests that start nodes of two processes (``test_metrics``, ``test_crash_safety``)
exercise the target itself.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from granian._futures import _new_cbscheduler
from granian._granian import SocketHolder as _SocketHolder
from granian._granian import WorkerSignal
from granian._granian import WSGIWorker as _WSGIWorker
from granian._internal import load_target as _load_target
from granian._signals import set_sync_signals
from granian.constants import TaskImpl
from granian.server.common import WORKERS_METHODS
from granian.server.mp import MPServer, WorkerProcess
from granian.wsgi import _callback_wrapper

# granian's stubs lag its binary (granian passes these arguments itself: server/mp.py).
SocketHolder: Any = _SocketHolder
WSGIWorker: Any = _WSGIWorker

#: granian's own spawn target for a WSGI worker (one listener: the public socket).
WSGI_SPAWN_TARGET: Callable[..., None] = MPServer._spawn_wsgi_worker

#: the extra listener of this worker process (:func:`serve_also`, served by the target).
_EXTRA: socket.socket | None = None
_EXTRA_BACKLOG = 2048


def load_target(target: str) -> Any:
    """granian's loader of a ``module:attribute`` callback (its target loader's default)."""
    return _load_target(target)


def serve_also(sock: socket.socket, backlog: int) -> None:
    """Have :func:`spawn_wsgi_worker`, in this worker process, serve the listening ``sock`` too."""
    global _EXTRA, _EXTRA_BACKLOG
    _EXTRA, _EXTRA_BACKLOG = sock, backlog


@WorkerProcess.wrap_target  # type: ignore[untyped-decorator]  # granian's internals are unannotated
def spawn_wsgi_worker(
    worker_id: int,
    callback: Any,
    sock: Any,
    ipc: Any,
    loop: Any,
    runtime_mode: Any,
    runtime_threads: int,
    runtime_blocking_threads: int | None,
    blocking_threads: int,
    blocking_threads_idle_timeout: int,
    backpressure: int,
    task_impl: Any,
    http_mode: Any,
    http1_settings: Any,
    http2_settings: Any,
    websockets: bool,
    static_path: Any,
    log_access_fmt: str | None,
    ssl_ctx: Any,
    scope_opts: dict[str, Any],
    metrics: Any,
) -> None:
    """granian's spawn target for a WSGI worker that serves the public socket and the one
    given to :func:`serve_also` (module level: picklable)."""
    wcallback = _callback_wrapper(callback, scope_opts, log_access_fmt)
    shutdown_event = set_sync_signals()  # type: ignore[no-untyped-call]  # (granian's: unannotated)
    done = threading.Event()
    # A worker consumes its signal: the extra listener gets one of its own, set with the first.
    extra_event = WorkerSignal()

    def stop() -> None:  # one callback: granian keeps the last one added
        extra_event.set()
        done.set()

    shutdown_event.add_cb(stop)
    assert _EXTRA is not None, "serve_also names the extra listener before the worker serves"
    extra = (None, SocketHolder(_EXTRA.fileno(), False, _EXTRA_BACKLOG))
    for listener, event in ((sock, shutdown_event), (extra, extra_event)):
        worker = WSGIWorker(
            worker_id,
            listener,
            ipc,
            runtime_threads,
            runtime_blocking_threads,
            blocking_threads,
            blocking_threads_idle_timeout,
            backpressure,
            http_mode,
            http1_settings,
            http2_settings,
            static_path,
            *ssl_ctx,
            metrics,
        )
        serve = getattr(worker, WORKERS_METHODS[runtime_mode][(listener[0] or listener[1]).is_uds()])
        scheduler = _new_cbscheduler(loop, wcallback, impl_asyncio=task_impl == TaskImpl.asyncio)  # type: ignore[no-untyped-call]
        serve(scheduler, loop, event)
    done.wait()
