"""Run one node: granian (a Rust HTTP server) serving the API and the admin from one worker.

The worker process imports ``config.node``, which starts the node runtime (registration,
partition leases, housekeeping). One worker, because a node is one owner of its leases;
scale out by starting more nodes. Requests run on ``--threads`` Python threads (default
``settings.NODE_THREADS``); a long poll holds one for up to 20 s.
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run one queue node: registers it, takes partition leases, serves the API and the admin."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--threads",
            type=int,
            default=settings.NODE_THREADS,
            help="request threads (a long poll holds one; default %(default)s: settings.NODE_THREADS)",
        )
        parser.add_argument(
            "--advertise", default="", help="address other nodes and clients use to reach this one (default host:port)"
        )

    def handle(self, *args, host, port, threads, advertise, **options):
        from django.db import connections
        from granian import Granian
        from granian.constants import Interfaces

        # The worker process reads its address from the environment it inherits.
        os.environ["NODE_ADDRESS"] = advertise or f"{host}:{port}"
        connections.close_all()  # the worker is forked: it must open its own
        server = Granian(
            "config.node:application",
            address=host,
            port=port,
            interface=Interfaces.WSGI,
            workers=1,
            blocking_threads=threads,
            backpressure=threads * 4,
            backlog=2048,
            log_access=False,
            workers_kill_timeout=15,
        )
        server.serve()
