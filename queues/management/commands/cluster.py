"""Start K nodes on consecutive ports on loopback, for development and tests.

Each node is an ordinary ``runnode`` process sharing this environment's database and
key-value store; they find each other through the database and split the partitions between
them by their leases. Ctrl-C (or SIGTERM) stops them all, gracefully, so their leases are
handed back at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Run K queue nodes on consecutive ports (--processes each, default 1); Ctrl-C stops them all."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--nodes", type=int, default=3)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--base-port", type=int, default=8000)
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            help="runnode --processes of each node (default 1: the K nodes share one machine)",
        )

    def handle(self, *args: Any, nodes: int, host: str, base_port: int, processes: int, **options: Any) -> None:
        if not 1 <= nodes <= 64:
            raise CommandError("--nodes must be between 1 and 64")
        manage = os.path.join(settings.BASE_DIR, "manage.py")
        procs: list[subprocess.Popen[bytes]] = []
        for i in range(nodes):
            port = base_port + i
            procs.append(
                subprocess.Popen(  # noqa: S603 - this interpreter and manage.py, with our own arguments
                    [
                        sys.executable,
                        manage,
                        "runnode",
                        "--host",
                        host,
                        "--port",
                        str(port),
                        "--processes",
                        str(processes),
                    ],
                    start_new_session=True,  # a Ctrl-C reaches us once; we stop each node ourselves
                )
            )
            self.stdout.write(f"node {i + 1}: http://{host}:{port}/ (pid {procs[-1].pid})")
        stopping = False

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for i, p in enumerate(procs):
                    if p.poll() is not None:
                        self.stderr.write(f"node {i + 1} exited with {p.returncode}; stopping the others")
                        stopping = True
                time.sleep(0.2)
        finally:
            self.stdout.write("stopping all nodes (leases are released)")
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + 20
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
