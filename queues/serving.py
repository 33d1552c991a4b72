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

Each worker may run on a CPU of its own (:func:`cpu_plan`, :func:`spawn_pinned`): granian's
threads and the request threads of one process then hand calls and the GIL to each other
without waking another CPU.

Granian has no API for a second listener, so the worker target here is granian's own WSGI
worker (``granian.server.mp.MPServer._spawn_wsgi_worker``, 2.8) serving one more socket with
the same callback, threads and shutdown signal (granian is pinned in requirements.txt; the
tests that start nodes of two processes, e.g. ``test_metrics`` and ``test_crash_safety``,
fail at once if an upgrade changes that target's arguments).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Collection
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
    if adv_host in ("", "0.0.0.0", "::"):  # noqa: S104 - recognises a bind-all address, binds nothing
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


# --- one CPU a worker process ---------------------------------------------------------------
_CPU_LIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")


def cpu_plan(setting: str, allowed: Collection[int], processes: int, seed: int) -> list[int] | None:
    """The CPU of each worker process (worker ``i``: the ``i``-th), or None to leave them
    where the kernel puts their threads.

    ``setting``: "auto" spreads them over ``allowed`` (the CPUs runnode may use: a cgroup's or
    ``taskset``'s) when they are at least as many as those CPUs (the default: one process a
    core), so that every CPU gets as many workers of the node as any other; a node of fewer
    processes shares its machine, and is left to the kernel, which moves its threads away from
    whatever else keeps a CPU busy (with pinning, one-process nodes sharing a machine, all on
    one port as containers are, would all have started on its first CPU). "off": left to the
    kernel. A list of CPUs ("0-3,6", each one of ``allowed``): the workers on those, however
    many. Round robin from the CPU ``seed`` (the node's port) picks; more processes than CPUs
    share them.

    Why: a call crosses threads (granian's I/O thread hands it to a request thread, which takes
    the GIL from the others of its process) and each hand-off to a thread on another CPU is a
    wake-up there (an interrupt between CPUs, a VM exit in a virtual machine) and a cold cache.
    With every thread of a process on one CPU, ``bench/throughput.py`` (Redis, 1 process, this
    2-core VM, runs alternating) measured 18.5-19.0 against 23.0-23.5 µs of node CPU a message
    in batches of 100 (cycle 49.4-49.8k against 39.8-40.6k msg/s) and 180-183 against 250-253
    µs a single call. A process's Python runs on one core at a time anyway (the GIL).
    """
    text = setting.strip().lower()
    if text == "off":
        return None
    if text == "auto":
        if processes < len(allowed):
            return None
        cpus = sorted(allowed)
    elif _CPU_LIST.fullmatch(text):
        cpus = []
        highest = max(allowed, default=-1)
        for part in text.split(","):
            first, _, last = part.partition("-")
            low, high = int(first), int(last or first)
            if high < low:
                raise ValueError(f"CPU range {part!r} runs backwards")
            if high > highest:  # (before the range is made: "0-99999999999" is a typo, not a plan)
                raise ValueError(f"CPU {high} is not among those this process may use ({sorted(allowed)})")
            cpus += range(low, high + 1)
        outside = sorted(set(cpus) - set(allowed))
        if outside:
            raise ValueError(f"CPUs {outside} are not among those this process may use ({sorted(allowed)})")
        cpus = sorted(set(cpus))
    else:
        raise ValueError(f"{setting!r}: give auto, off, or a list of CPUs such as 0-3,6")
    if not cpus:
        return None
    start = seed % len(cpus)
    return [cpus[(start + i) % len(cpus)] for i in range(max(1, processes))]


def pin_this_process(cpu: int) -> None:
    """Every thread of this process on ``cpu``; threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def spawn_pinned(inner: Callable[..., None], cpus: list[int], worker_id: int, *args: Any, **kwargs: Any) -> None:
    """granian's spawn target for a worker on its CPU of ``cpus`` (:func:`cpu_plan`), before
    anything else runs in it: ``inner`` is the target it would have had (granian numbers
    workers from 1). A CPU refused (a container's rules) leaves the worker where it is."""
    cpu = cpus[(worker_id - 1) % len(cpus)]
    try:
        pin_this_process(cpu)
    except OSError as exc:  # (granian's logging starts in ``inner``)
        print(f"runnode: worker {worker_id} stays unpinned: CPU {cpu}: {exc}", file=sys.stderr, flush=True)
    inner(worker_id, *args, **kwargs)
