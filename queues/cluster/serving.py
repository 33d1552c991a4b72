"""How ``runnode`` serves a node with several processes (``runnode --processes N``).

Each process is a full member of the cluster: a :class:`~queues.cluster.node.NodeRuntime` with its own
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

Granian has no API for a second listener: :mod:`queues.glue.granian` serves it, through
granian's private names (what to check on a granian upgrade is listed there).
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Callable, Collection
from typing import Any

from queues.glue import granian as granian_glue

# granian's spawn targets, as runnode names them: its own (the public port only), and one that
# serves the process's private port too.
WSGI_SPAWN_TARGET = granian_glue.WSGI_SPAWN_TARGET
spawn_wsgi_worker = granian_glue.spawn_wsgi_worker


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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(backlog)
    sock.set_inheritable(True)
    granian_glue.serve_also(sock, backlog)
    port = sock.getsockname()[1]
    os.environ["NODE_ADDRESS"] = f"[{adv_host}]:{port}" if ":" in adv_host else f"{adv_host}:{port}"
    return granian_glue.load_target(target)


# --- one CPU a worker process ---------------------------------------------------------------
_CPU_LIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")


def cpu_plan(setting: str, allowed: Collection[int], processes: int, seed: int) -> list[int] | None:
    """The CPU of each worker process (worker ``i``: the ``i``-th), or None to leave them
    where the kernel puts their threads.

    ``setting``: "auto" pins them over ``allowed`` (the CPUs runnode may use: a cgroup's or
    ``taskset``'s), whatever their number: a node of as many processes as those CPUs or fewer
    has a CPU of its own for each, and more processes than CPUs share them, so that every CPU
    gets as many workers of the node as any other. "off": left to the kernel, which moves
    threads away from whatever else keeps a CPU busy (nodes that share a machine with each
    other, one-process nodes on one port as containers without a cpuset are, would all start
    on the same CPU under "auto": give them "off" or CPUs of their own). A list of CPUs
    ("0-3,6", each one of ``allowed``): the workers on those, however many. Round robin from
    the CPU ``seed`` (the node's port) picks.

    Why: a call crosses threads (granian's I/O thread hands it to a request thread, which takes
    the GIL from the others of its process) and each hand-off to a thread on another CPU is a
    wake-up there (an interrupt between CPUs, a VM exit in a virtual machine) and a cold cache.
    With every thread of a process on one CPU, ``bench/throughput.py`` measures less node CPU a
    message and more messages a second (``docs/explanation/performance.md``). A process's Python runs on
    one core at a time anyway (the GIL).
    """
    text = setting.strip().lower()
    if text == "off":
        return None
    if text == "auto":
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
