"""Real node processes on loopback, for the tests and the benchmarks.

:func:`free_ports` / :func:`free_port`, :func:`kv_url` and :func:`node_env` for a node's
environment, :class:`NodeProcess` (``manage.py runnode`` in a process group of its own: readiness
wait on ``/api/v1/healthz``, log file, graceful stop, SIGKILL), :func:`wait_until`.

It needs no Django set up and imports nothing of the project: the benchmarks (``bench/``) import
it before any settings exist.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: The repository root (where ``manage.py`` is).
ROOT = Path(__file__).resolve().parents[1]

#: The key-value backends a node can run on (``KV_URL``).
KV_BACKENDS = ("file", "redis", "redis-cluster", "postgres")

#: Called before a node starts; it raises to refuse the start. The test session sets it, so that
#: only a test marked ``cluster`` starts node processes (tests/conftest.py); None: no check (the
#: benchmarks).
start_check: Callable[[], None] | None = None


# ---------------------------------------------------------------------------------- environment


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports, below the ephemeral range (32768+), so
    that the client connections of earlier runs cannot be sitting on them; within
    ``MQ_TEST_NODE_PORTS`` (``LOW-HIGH``, HIGH excluded; 20000-32000 by default), which
    ``make test`` gives each of its shards apart, so that no two shards pick one port between
    this check and a node's bind."""
    low, _, high = os.environ.get("MQ_TEST_NODE_PORTS", "20000-32000").partition("-")
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(int(low), int(high) - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def free_port() -> int:
    return free_ports(1)


def with_redis_db(url: str, db: int) -> str:
    """``url`` with its database number set to ``db`` (``redis://host:port/db``)."""
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, f"/{db}", u.query, u.fragment))


def kv_url(backend: str, *, redis_url: str, redis_db: int, directory: Path | str, redis_cluster_url: str = "") -> str:
    """A node's ``KV_URL`` on ``backend``: database ``redis_db`` of ``redis_url``, the Redis
    Cluster ``redis_cluster_url`` names, the PostgreSQL database the node uses, or files under
    ``directory`` (file backend only)."""
    if backend == "redis":
        return with_redis_db(redis_url, redis_db)
    if backend == "redis-cluster":
        if not redis_cluster_url:
            raise ValueError("the redis-cluster backend needs redis_cluster_url (redis-cluster://host:port,...)")
        return redis_cluster_url
    if backend == "postgres":
        return "postgres"
    if backend == "file":
        return f"file://{directory}"
    raise ValueError(f"unknown key-value backend {backend!r} (one of {', '.join(KV_BACKENDS)})")


def node_env(*, database_url: str, data_dir: Path | str, kv: str, **extra: str) -> dict[str, str]:
    """The variables a node needs on top of the caller's environment; ``extra`` adds others
    (``NODE_HEARTBEAT``, ``REDIS_URL``, ...).

    A test's node waits up to 15 s for a database call (``DB_CALL_TIMEOUT``, 5 s by default): on
    a loaded two-core CI machine a commit's fsync can stall past 5 s, and the node then answers
    503 for a moment, which is right for a node and wrong for a test of something else. The
    tests of outages set their own deadlines."""
    return {
        "DATABASE_URL": database_url,
        "MQ_DATA_DIR": str(data_dir),
        "KV_URL": kv,
        "DB_CALL_TIMEOUT": "15",
        **extra,
    }


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; the seconds it took. AssertionError after ``timeout``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


# ------------------------------------------------------------------------------------- launcher


class NodeFailed(RuntimeError):
    """The node exited, or did not answer ``/api/v1/healthz`` in time (the log's tail says why)."""


class NodeProcess:
    """``manage.py runnode`` on 127.0.0.1, started in a session of its own so that signals
    reach the server and its worker together; output appended to ``node-<port>.log`` in
    ``log_dir``.

    ``env`` is added to this process's environment; ``heartbeat`` (seconds) is the default
    ``NODE_HEARTBEAT`` when ``env`` does not set one (None: the node's own default);
    ``host``: the address it binds (a network namespace's, with ``prefix`` the command that
    runs it there: ``ip netns exec NS``); ``processes`` is ``runnode --processes`` (default :attr:`default_processes`: 1, so a test
    that means several says so); ``NODE_CPU_AFFINITY`` is :attr:`default_cpu_affinity` when
    neither ``env`` nor this process's environment sets it. Killing the node kills every process
    of it (its group).
    """

    #: ``--processes`` of nodes started without ``processes`` (tests of several set it).
    default_processes = 1
    #: ``NODE_CPU_AFFINITY`` of nodes whose ``env`` does not set it (None: the node's own, as the
    #: benchmarks want; the test session sets "off", tests/conftest.py).
    default_cpu_affinity: str | None = None

    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path | str,
        port: int | None = None,
        *,
        heartbeat: float | None = 0.5,
        python: str = sys.executable,
        cwd: Path | str = ROOT,
        processes: int | None = None,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
    ):
        self.port = port or free_port()
        self.processes = processes or self.default_processes
        self.host, self.prefix = host, list(prefix)
        self.url = f"http://{host}:{self.port}"
        self.env = {**os.environ, **env}
        if heartbeat is not None:
            self.env.setdefault("NODE_HEARTBEAT", str(heartbeat))
        if self.default_cpu_affinity is not None:
            self.env.setdefault("NODE_CPU_AFFINITY", self.default_cpu_affinity)
        self.python, self.cwd = python, cwd
        self.log_path = Path(log_dir) / f"node-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._asked_to_stop = False
        #: called with runnode's pid (its process group's ID) as soon as it is spawned, before
        #: it serves anything (the nemesis run names the processes that report by it).
        self.on_spawn: Callable[[int], None] | None = None

    def start(self, timeout: float = 30) -> NodeProcess:
        """Start the node and wait until ``/api/v1/healthz`` answers 200."""
        if start_check is not None:
            start_check()
        self._asked_to_stop = False
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    self.python,
                    "manage.py",
                    "runnode",
                    "--host",
                    self.host,
                    "--port",
                    str(self.port),
                    "--processes",
                    str(self.processes),
                ],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # runnode and its worker: signals go to the whole group
            )
        if self.on_spawn is not None:
            self.on_spawn(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NodeFailed(f"node exited with {self.proc.returncode}; {self.log_path}:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.1)
        raise NodeFailed(f"node on {self.port} did not answer within {timeout}s; {self.log_path}:\n{self.log_tail()}")

    def healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1)
        try:
            conn.request("GET", "/api/v1/healthz")
            return conn.getresponse().status == 200
        except OSError:  # refused, reset or timed out: not serving yet
            return False
        finally:
            conn.close()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def member_pids(self) -> list[int]:
        """The pids of the processes that serve (granian's workers; each registers a ``Node``
        row with its pid): runnode's children."""
        if self.proc is None:
            return []
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(c) for c in children.split()]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the node's process group (the server and its worker)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no leases released, no buffers flushed by us."""
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(timeout=10)

    def ask_to_stop(self) -> None:
        """SIGTERM, once (a paused node is woken first): the node releases its leases and exits;
        :meth:`stop` waits for it. Several nodes asked at once stop in the time of one."""
        if self.proc is None or self.proc.poll() is not None or self._asked_to_stop:
            return
        self._asked_to_stop = True
        self.signal(signal.SIGCONT)  # a paused node cannot handle SIGTERM
        self.proc.terminate()

    def stop(self, timeout: float = 20) -> None:
        """Graceful stop (SIGTERM: leases released); SIGKILL to what is left after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.ask_to_stop()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
