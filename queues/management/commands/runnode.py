"""Run one node: granian (a Rust HTTP server) serving the API and the admin.

With ``--processes 1`` the node is one worker process; it imports ``config.node``, which
starts the node runtime (registration, partition leases, housekeeping), and registers the
node's address.

With ``--processes N`` (default ``settings.NODE_PROCESSES``: the machine's cores, 1 on SQLite)
granian starts N workers sharing the node's port (``SO_REUSEPORT``): each is a full member of
the cluster with its own runtime, leases and a private port it registers as its address
(``queues.cluster.serving``); the siblings reach each other there, like any two nodes. Every
per-process bound is the node's divided by N (the body cache, a user's long polls, a rate
counted in local memory), and one scrape of ``/metrics`` is the node's: the counters add up in
``PROMETHEUS_MULTIPROC_DIR`` (a fresh folder when unset), the figures are asked of the
siblings (listed in ``NODE_SIBLINGS_DIR``, a fresh folder).

Each worker process may run on one CPU (``--cpu-affinity``, default ``settings.NODE_CPU_AFFINITY``:
``auto``, each process on a CPU of its own among those runnode may use while there are enough, round
robin past that; see ``queues.cluster.serving.cpu_plan``), every thread of it, so a request's
hand-offs between granian's threads and the GIL's stay on that CPU.

Requests run on ``--threads`` Python threads per process (default ``settings.NODE_THREADS``);
a long poll holds one for up to 20 s. Every process (each a node) is in runnode's process
group; a worker whose runnode is gone exits at once (``config.node``). A port something
already listens on is refused (:func:`check_port_free`).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import socket
import sys
import tempfile
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

#: What serves the node's WSGI application in each worker (read there: see queues.http.front).
FRONT = "queues.http.front:Front"
#: the folders this runnode made before it restarted itself (removed when it stops).
_OWN_DIRS = "MQ_RUNNODE_OWN_DIRS"


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on (CommandError).

    granian binds with ``SO_REUSEPORT`` (its workers share the port), so a second node started
    on the port of a running one would bind too, and the kernel would split the clients'
    connections between the two without a word. A plain bind (``SO_REUSEADDR`` only: a
    closed connection's TIME_WAIT does not count) fails where anything listens.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise CommandError(f"cannot serve on {host}:{port}: {exc.strerror}") from exc
            raise CommandError(
                f"{host}:{port} is in use: another node (or another program) listens there. "
                "Stop it, or give this node another --port."
            ) from exc


class Command(BaseCommand):
    help = "Run one queue node: registers it, takes partition leases, serves the API and the admin."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--threads",
            type=int,
            default=settings.NODE_THREADS,
            help="request threads per process (a long poll holds one; default %(default)s: settings.NODE_THREADS)",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=settings.NODE_PROCESSES or settings.NODE_PROCESSES_AUTO,
            help="server processes, each a member of the cluster behind the one port "
            "(default %(default)s: settings.NODE_PROCESSES, else the machine's cores, 1 on SQLite)",
        )
        parser.add_argument(
            "--advertise", default="", help="address other nodes and clients use to reach this one (default host:port)"
        )
        parser.add_argument(
            "--cpu-affinity",
            default=settings.NODE_CPU_AFFINITY,
            help="auto: each process on a CPU of its own (shared round robin when there are more processes "
            "than CPUs); off: wherever the kernel puts it; "
            "or CPUs to pin the processes to, e.g. 0-3,6 (default %(default)s: settings.NODE_CPU_AFFINITY)",
        )

    def handle(
        self,
        *args: Any,
        host: str,
        port: int,
        threads: int,
        processes: int,
        advertise: str,
        cpu_affinity: str,
        **options: Any,
    ) -> None:
        from django.db import connections
        from granian import Granian
        from granian.constants import Interfaces
        from granian.server.mp import MPServer

        processes = max(1, processes)
        check_port_free(host, port)  # before anything is made (again after a restart below: harmless)
        from queues.cluster import serving

        cpus = None
        if hasattr(os, "sched_setaffinity"):
            try:
                cpus = serving.cpu_plan(cpu_affinity, os.sched_getaffinity(0), processes, port)
            except ValueError as exc:
                raise CommandError(f"--cpu-affinity: {exc}") from exc
        elif cpu_affinity.strip().lower() not in ("auto", "off"):
            raise CommandError("--cpu-affinity: this platform cannot pin a process to CPUs; give auto or off")
        # The workers read these from the environment and the settings they inherit.
        os.environ["NODE_PROCESSES"] = str(processes)
        os.environ["NODE_PUBLIC_PORT"] = str(port)  # the processes' shared port (queues.cluster.balance)
        settings.NODE_PROCESSES = processes
        own_dirs = [d for d in os.environ.pop(_OWN_DIRS, "").split(os.pathsep) if d]
        if processes > 1 and not os.environ.get("NODE_SIBLINGS_DIR"):
            # each process lists itself here (its pid, its address): the siblings' /metrics
            own_dirs.append(tempfile.mkdtemp(prefix="mq-node-"))
            os.environ["NODE_SIBLINGS_DIR"] = own_dirs[-1]
            if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                own_dirs.append(tempfile.mkdtemp(prefix="mq-metrics-"))
                os.environ["PROMETHEUS_MULTIPROC_DIR"] = own_dirs[-1]
            # prometheus_client chose where it keeps values when Django imported it, before the
            # folder existed; the workers are forked from here: start again with it set.
            os.environ[_OWN_DIRS] = os.pathsep.join(own_dirs)
            os.execv(sys.executable, [sys.executable, *sys.argv])  # noqa: S606 - itself again, same arguments
        connections.close_all()  # the workers are forked: each must open its own
        # Each worker takes a slot here (its CPU of the plan): removed when runnode stops.
        own_dirs.append(tempfile.mkdtemp(prefix="mq-slots-"))
        server = Granian(
            "config.node:application",
            address=host,
            port=port,
            # The front (queues.http.front) reads bodies on the event loop and runs the WSGI
            # application on ``threads`` request threads of its own.
            interface=Interfaces.RSGI,
            workers=processes,
            websockets=False,
            backlog=2048,
            log_access=False,
            workers_kill_timeout=15,
            # A worker that dies is a node that died: its leases go to whoever takes them over
            # (a sibling included); a fresh worker would join as a new node.
            respawn_failed_workers=False,
        )
        if not isinstance(server, MPServer):
            cpus = None  # (workers as threads, a free-threaded build: one CPU for all would not do)
        private = None
        if processes == 1:
            os.environ["NODE_ADDRESS"] = advertise or f"{host}:{port}"
        else:
            private = serving.private_host(host, advertise)
        loader = functools.partial(
            serving.load_app, "config.node:application", FRONT, threads, private, cpus, own_dirs[-1]
        )
        try:
            server.serve(target_loader=loader, wrap_loader=False)
        finally:
            for folder in own_dirs:
                shutil.rmtree(folder, ignore_errors=True)
