"""How ``runnode`` serves a node with several processes (``runnode --processes N``).

Each process is a full member of the cluster: a :class:`~queues.cluster.node.NodeRuntime` with its own
``Node`` row, leases, fences and partition managers, exactly as a one-process node. What the
processes share is the node's public port: granian starts ``N`` workers that each bind it with
``SO_REUSEPORT``, so the kernel spreads a client's connections over them and a client that
knows only that address gets the whole machine. What each has alone is a private port: a
second listener of the same worker, served by granian's embedded server on the worker's event
loop (``queues.http.front``), bound on the node's host to a port the kernel picks, which is the
address the process registers (``Node.address``). Calls that must reach the owner of a
partition (forwarded calls of the siblings and of other nodes, the SDK's calls straight to an
owner) go there, so reaching a sibling costs one loopback call into granian, signed like any
peer call, and never more hops than between two machines.

Each worker may run on a CPU of its own (:func:`cpu_plan`; the worker takes it in
:func:`load_app`, before granian starts its threads): granian's threads and the request
threads of one process then hand calls and the GIL to each other without waking another CPU.

Everything here uses granian's public interface (``Granian.serve``'s target loader, the RSGI
protocol, ``granian.server.embed``) and the operating system's (``SO_REUSEPORT``,
``sched_setaffinity``).
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import sys
from collections.abc import Collection
from typing import Any


def private_host(host: str, advertise: str) -> tuple[str, str]:
    """Where a process binds its private port, and the host it advertises with it: the public
    bind host and the advertised one (``0.0.0.0`` advertised as the host's name)."""
    adv_host = advertise.rpartition(":")[0] if advertise else host
    if adv_host in ("", "0.0.0.0", "::"):  # noqa: S104 - recognises a bind-all address, binds nothing
        adv_host = socket.gethostname()
    return host, adv_host


#: The socket that holds this worker's private port for it (bound, not listening: granian's
#: embedded server binds the same port beside it, ``SO_REUSEPORT``), kept for the process's life.
_PORT_HELD: socket.socket | None = None


def hold_private_port(host: str) -> int:
    """A port of ``host`` for this process's private listener, held so that no other program
    takes it before granian binds it."""
    global _PORT_HELD
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), 0))
    _PORT_HELD = sock
    return int(sock.getsockname()[1])


def claim_slot(folder: str) -> int:
    """This worker's number among the runnode's workers (0, 1, ...): the first free slot file
    in ``folder`` (made with ``O_EXCL``, so two workers never take one)."""
    slot = 0
    while True:
        try:
            os.close(os.open(os.path.join(folder, f"worker-{slot}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return slot
        except FileExistsError:
            slot += 1


def _resolve(name: str) -> Any:
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_app(
    target: str,
    front: str,
    threads: int,
    private: tuple[str, str] | None,
    cpus: list[int] | None,
    slots: str,
) -> Any:
    """granian's target loader in a worker (``Granian.serve(target_loader=...)``): take this
    worker's CPU (``cpus``, by its slot in ``slots``), hold its private port when the node has
    several processes (``private``: bind host and advertised host) so that the node runtime
    (started by importing ``target``'s module) registers that address, and return the front
    (``front``, ``module:attribute`` of a class such as ``queues.http.front.Front``) that serves
    the WSGI application ``target`` (``module:attribute``) on ``threads`` request threads."""
    slot = claim_slot(slots)
    if cpus:
        cpu = cpus[slot % len(cpus)]
        try:
            pin_this_process(cpu)
        except OSError as exc:
            print(f"runnode: worker {slot + 1} stays unpinned: CPU {cpu}: {exc}", file=sys.stderr, flush=True)
    listen: tuple[str, int] | None = None
    if private is not None:
        bind_host, adv_host = private
        port = hold_private_port(bind_host)
        listen = (bind_host.strip("[]"), port)
        os.environ["NODE_ADDRESS"] = f"[{adv_host}]:{port}" if ":" in adv_host else f"{adv_host}:{port}"
    return _resolve(front)(_resolve(target), threads=threads, private=listen)


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
