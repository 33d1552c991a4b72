"""A runnode's client connections spread evenly over its processes (``runnode --processes N``:
N sibling nodes behind one port).

Each process listens on the runnode's port (``SO_REUSEPORT``), the kernel hands each new
connection to one of them by a hash of its addresses, and a connection stays with the process
that accepted it. So the spread is chance: four clients on two processes are often split 3:1
or 4:0. A client of a queue service keeps its connection for hours (a Celery worker, an
application's pool), so a 3:1 split leaves one process with three quarters of the work on
one core while the other idles, and the same checkout's throughput varies from run to run
(``bench/throughput.py``; figures in ``docs/explanation/performance.md``).

So each process counts its busy client connections (on the node's public port, that received
data within :data:`ACTIVE_MS`) and writes the count beside its siblings' (``NODE_SIBLINGS_DIR``).
A process with at least two more than the least busy sibling, at two looks running, answers
its next request on the public port with ``Connection: close``: the client reconnects
(HTTP/1.1 clients do, as they do at a server's keep-alive timeout), and the kernel hands the
new connection to one of the processes. Repeated every :data:`settings.NODE_BALANCE_INTERVAL`, a 3:1 split becomes 2:2 and
stays so (a difference of one is never acted on, so there is no ping-pong); the cost is one
new connection per shed, counted in ``mq_node_connections_shed``. The same idea as a load
balancer's maximum connection age (gRPC's ``MAX_CONNECTION_AGE``), made to act only when the
processes are uneven.

An HTTP/2 connection ignores ``Connection: close`` (it multiplexes; the server drops the
header), and a connection's count is its own process's: ``/proc/self/fd`` and ``TCP_INFO``.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from queues import metrics

log = logging.getLogger(__name__)

#: A client connection that received data within this many milliseconds is busy: long enough
#: that a client pausing between bursts still counts where it is (with 2 s, the pauses of
#: ``bench/throughput.py`` between its rounds made counts flip at each round's start, and the
#: processes shed connections that were where they should be).
ACTIVE_MS = 30_000
#: Suffix of the files in ``NODE_SIBLINGS_DIR`` holding a process's busy connections.
SUFFIX = ".conns"

#: This process's busy client connections at its last look (None: it has no balancer), for
#: ``mq_node_client_connections`` (``queues.service.figures``).
LAST_COUNT: int | None = None

_TCP_ESTABLISHED = 1
#: ``struct tcp_info`` (linux/tcp.h): ``tcpi_state`` is its first byte, ``tcpi_last_data_recv``
#: the u32 at offset 52 (after 8 one-byte fields and 11 u32s).
_TCP_INFO = struct.Struct("=B51xI")


def busy_connections(port: int, *, active_ms: int = ACTIVE_MS) -> int:
    """This process's established TCP connections on local ``port`` that received data within
    ``active_ms`` (an idle keep-alive connection costs nothing to keep, so it is not counted)."""
    busy = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:  # closed since listdir
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.getsockname()[1] != port:
                continue
            state, last_recv = _TCP_INFO.unpack(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size))
            if state == _TCP_ESTABLISHED and last_recv < active_ms:
                busy += 1
        except OSError:
            continue
        finally:
            sock.close()  # the duplicate only
    return busy


def should_shed(mine: int, siblings: list[int]) -> bool:
    """Whether a process with ``mine`` busy connections closes one, its siblings having
    ``siblings``: when one of them has at least two fewer (moving one evens them out; a
    difference of one would only move the imbalance)."""
    return bool(siblings) and mine >= min(siblings) + 2


class Balancer:
    """The WSGI application ``app`` of one of a runnode's processes, closing a client connection
    on the public ``port`` when :func:`should_shed` says so (checked by :meth:`run`, a thread).

    ``folder``: ``NODE_SIBLINGS_DIR``, where each process writes its count (``<pid>.conns``).
    """

    def __init__(self, app: WSGIApplication, port: int, folder: str, interval: float):
        self.app, self.port, self.folder, self.interval = app, str(port), Path(folder), interval
        self.shed = False
        self._uneven = False  # the last look found this process the busy one
        self._lock = threading.Lock()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if not self.shed or environ.get("SERVER_PORT") != self.port:
            return self.app(environ, start_response)
        with self._lock:
            close, self.shed = self.shed, False
        if not close:  # another request took it
            return self.app(environ, start_response)
        metrics.CONNECTIONS_SHED.inc()

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            return start_response(status, [*headers, ("Connection", "close")], exc_info)

        return self.app(environ, start)

    def siblings(self) -> list[int]:
        """The busy connections of the other live processes (a count older than three
        intervals is not trusted: that process is stuck or gone)."""
        counts = []
        fresh = time.time() - 3 * self.interval
        for f in self.folder.glob(f"*{SUFFIX}"):
            pid = f.name.removesuffix(SUFFIX)
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                if f.stat().st_mtime < fresh:
                    continue
                os.kill(int(pid), 0)
                counts.append(int(f.read_text()))
            except (OSError, ValueError):
                continue
        return counts

    def publish(self, busy: int) -> None:
        path = self.folder / f"{os.getpid()}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(busy))
        os.replace(tmp, path)  # a reader sees the old count or the new, never half

    def step(self) -> None:
        """One look: publish this process's count; shed one connection if it was the busy one
        at this look and the one before (a count caught while clients connect, or a sibling's
        count from before its client arrived, is not a split)."""
        global LAST_COUNT
        mine = LAST_COUNT = busy_connections(int(self.port))
        self.publish(mine)
        uneven = should_shed(mine, self.siblings())
        self.shed = uneven and self._uneven
        self._uneven = uneven and not self.shed  # after a shed, two fresh looks

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.step()
            except Exception:  # never the end of balancing: the next look may succeed
                log.exception("connection balancing")
            if self.shed:
                # Give the client time to reconnect and the counts time to show it.
                time.sleep(self.interval)

    def start(self) -> Balancer:
        threading.Thread(target=self.run, name="connection-balance", daemon=True).start()
        return self
