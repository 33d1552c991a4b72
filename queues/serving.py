"""How ``runnode`` serves a node with several processes (``runnode --processes N``).

Each process is a full member of the cluster: a :class:`~queues.node.NodeRuntime` with its own
``Node`` row, leases, fences and partition managers, exactly as a one-process node. What the
processes share is the node's public port: granian starts ``N`` workers that each bind it with
``SO_REUSEPORT``, so the kernel spreads a client's connections over them and a client that
knows only that address gets the whole machine. What each has alone is a private port: a
second granian listener in the same worker, bound on the node's host to a port the kernel
picks, which is the address the process registers (``Node.address``). Calls that must reach
the owner of a partition (forwarded calls of the siblings and of other nodes, the SDK's calls
straight to an owner) go there, so reaching a sibling costs one loopback call into granian,
signed like any peer call, and never more hops than between two machines.

Granian has no API for a second listener, so the worker target here is granian's own WSGI
worker (``granian.server.mp.MPServer._spawn_wsgi_worker``, 2.8) serving one more socket with
the same callback, threads and shutdown signal (granian is pinned in requirements.txt; the
tests that start nodes of two processes, e.g. ``test_metrics`` and ``test_crash_safety``,
fail at once if an upgrade changes that target's arguments).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from granian._futures import _new_cbscheduler
from granian._granian import SocketHolder as _SocketHolder
from granian._granian import WorkerSignal
from granian._granian import WSGIWorker as _WSGIWorker
from granian.constants import TaskImpl
from granian.server.common import WORKERS_METHODS
from granian.server.mp import WorkerProcess
from granian.wsgi import _callback_wrapper

# granian's stubs lag its binary (granian passes these arguments itself: server/mp.py).
SocketHolder: Any = _SocketHolder
WSGIWorker: Any = _WSGIWorker

#: the private listener of this worker process (bound in :func:`load_app`, served by the target).
_PRIVATE: socket.socket | None = None
_PRIVATE_BACKLOG = 2048


def private_host(host: str, advertise: str) -> tuple[str, str]:
    """Where a process binds its private port, and the host it advertises with it: the public
    bind host and the advertised one (``0.0.0.0`` advertised as the host's name)."""
    adv_host = advertise.rpartition(":")[0] if advertise else host
    if adv_host in ("", "0.0.0.0", "::"):
        adv_host = socket.gethostname()
    return host, adv_host


def load_app(target: str, host: str, adv_host: str, backlog: int) -> Any:
    """granian's callback loader in a worker: bind this process's private port first, so the
    node runtime (started by importing ``config.node``) registers that address."""
    global _PRIVATE, _PRIVATE_BACKLOG
    from granian._internal import load_target

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(backlog)
    sock.set_inheritable(True)
    _PRIVATE, _PRIVATE_BACKLOG = sock, backlog
    port = sock.getsockname()[1]
    os.environ["NODE_ADDRESS"] = f"[{adv_host}]:{port}" if ":" in adv_host else f"{adv_host}:{port}"
    return load_target(target)


@WorkerProcess.wrap_target
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
    """granian's spawn target for a WSGI worker that serves the public socket and this
    process's private one (module level: picklable)."""
    from granian._signals import set_sync_signals

    wcallback = _callback_wrapper(callback, scope_opts, log_access_fmt)
    shutdown_event = set_sync_signals()
    done = threading.Event()
    # A worker consumes its signal: the private listener gets one of its own, set with the first.
    private_event = WorkerSignal()

    def stop() -> None:  # one callback: granian keeps the last one added
        private_event.set()
        done.set()

    shutdown_event.add_cb(stop)
    assert _PRIVATE is not None, "load_app binds the private port before the worker serves"
    private = (None, SocketHolder(_PRIVATE.fileno(), False, _PRIVATE_BACKLOG))
    for listener, event in ((sock, shutdown_event), (private, private_event)):
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
        scheduler = _new_cbscheduler(loop, wcallback, impl_asyncio=task_impl == TaskImpl.asyncio)
        serve(scheduler, loop, event)
    done.wait()
