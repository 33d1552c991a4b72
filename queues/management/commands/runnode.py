"""Run one node: a multi-threaded HTTP server (waitress) serving the API and the admin."""

from __future__ import annotations

import logging
import os
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

log = logging.getLogger("queues.runnode")


class Command(BaseCommand):
    help = "Run one queue node: registers it, takes partition leases, serves the API and the admin."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--threads", type=int, default=int(os.environ.get("NODE_THREADS", "48")),
                            help="request threads (long polls hold one each)")
        parser.add_argument("--advertise", default="",
                            help="address other nodes use to reach this one (default host:port)")

    def handle(self, *args, host, port, threads, advertise, **options):
        from waitress.server import create_server

        from config.wsgi import application
        from queues import service
        from queues.node import NodeRuntime

        address = advertise or f"{host}:{port}"
        settings.NODE_ADDRESS = address
        server = create_server(application, host=host, port=port, threads=threads,
                               connection_limit=1000, channel_timeout=120, ident="mq-node",
                               backlog=2048, clear_untrusted_proxy_headers=True)
        runtime = NodeRuntime(address, heartbeat=settings.NODE_HEARTBEAT,
                              cache_bytes=settings.NODE_BODY_CACHE_BYTES)
        service.set_runtime(runtime)
        runtime.start()
        stopping = threading.Event()

        def stop(signum, frame):
            if stopping.is_set():
                return
            stopping.set()
            log.info("signal %s: stopping node %s", signum, runtime.node_id)
            server.close()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"node {runtime.node_id} serving on http://{address}/ ({threads} threads)")
        self.stdout.flush()
        try:
            server.run()
        except (OSError, ValueError):
            if not stopping.is_set():
                raise
        finally:
            runtime.stop(release=True)
            self.stdout.write("node stopped; leases released")
