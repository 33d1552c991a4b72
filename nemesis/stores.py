"""The run's own PostgreSQL and Redis (never a suite's or an operator's): ``scripts/services.sh``
with a directory and ports of the run's, and the faults done to them.

A run's stores live under ``<run directory>/services``; ``start`` creates them (a fresh
PostgreSQL cluster and Redis with an append-only file, and the three-primary Redis Cluster),
``stop`` stops every server it started, also after a failed run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "scripts" / "services.sh"


class StoreError(RuntimeError):
    """A store did not start, stop or come back as asked (services.sh's output says why)."""


@dataclass
class Stores:
    """PostgreSQL on ``pg_port``, Redis on ``redis_port``, the Redis Cluster on ``cluster_port``
    and the two ports after it (and their bus ports, three more), under ``directory``.

    ``host``: an address besides 127.0.0.1 the servers also listen on (a network namespace's
    nodes reach them there), or None."""

    directory: Path
    pg_port: int
    redis_port: int
    cluster_port: int
    host: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """What services.sh needs to act on these stores."""
        env = {
            **os.environ,
            "MQ_SERVICES_DIR": str(self.directory),
            "MQ_PG_PORT": str(self.pg_port),
            "MQ_REDIS_PORT": str(self.redis_port),
            "MQ_REDIS_CLUSTER_PORT": str(self.cluster_port),
            # A killed server loses nothing the operating system holds; no call waits on a disk.
            "MQ_PG_FSYNC": "off",
            "MQ_REDIS_FSYNC": "no",
        }
        if self.host:
            env["MQ_SERVICES_HOST"] = self.host
        return env

    def _services(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            ["bash", str(SERVICES), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise StoreError(f"services.sh {' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
        return done.stdout

    def start(self) -> Stores:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._services("start", timeout=300)
        return self

    def stop(self) -> None:
        for kind, port in [("redis", None), ("pg", None), *(("redis", self.cluster_port + i) for i in range(3))]:
            self._cont(kind, port)  # a paused server cannot stop
        self._services("stop")

    def address(self, host: str = "127.0.0.1") -> dict[str, str]:
        """The URLs a node uses, reaching the stores at ``host``."""
        cluster = ",".join(f"{host}:{self.cluster_port + i}" for i in range(3))
        return {
            "database": f"postgres://mq:mq@{host}:{self.pg_port}/mq",
            "redis": f"redis://{host}:{self.redis_port}/0",
            "kv-redis": f"redis://{host}:{self.redis_port}/1",
            "kv-redis-cluster": f"redis-cluster://{cluster}",
        }

    # ------------------------------------------------------------------------------- faults

    def restart_redis(self, cluster_port: int | None = None) -> None:
        """SIGKILL the Redis server (or the Redis Cluster's primary on ``cluster_port``), start
        it again: it comes back with what its AOF holds."""
        with self._lock:
            if cluster_port is None:
                self._services("redis-restart")
            else:
                self._services("redis-cluster-restart", str(cluster_port))

    def restart_pg(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut."""
        with self._lock:
            self._services("pg-restart")

    def pause(self, kind: str, cluster_port: int | None = None) -> None:
        """SIGSTOP the server (``redis``, or the Redis Cluster's primary on ``cluster_port``, or
        ``pg``, every process of it): calls to it hang."""
        for pid in self._pids(kind, cluster_port):
            _signal(pid, signal.SIGSTOP)

    def resume(self, kind: str, cluster_port: int | None = None) -> None:
        self._cont(kind, cluster_port)

    def _cont(self, kind: str, cluster_port: int | None = None) -> None:
        for pid in self._pids(kind, cluster_port):
            _signal(pid, signal.SIGCONT)

    def _pids(self, kind: str, cluster_port: int | None = None) -> list[int]:
        if kind == "redis":
            folder = "redis" if cluster_port is None else f"redis-cluster-{cluster_port}"
            try:
                return [int((self.directory / folder / "redis.pid").read_text().split()[0])]
            except (OSError, ValueError, IndexError):
                return []
        if kind == "pg":
            return _pg_pids(self.directory / "pg")
        raise ValueError(f"no store {kind!r} (redis or pg)")


def _pg_pids(pgdata: Path) -> list[int]:
    """The postmaster and every backend of the cluster in ``pgdata`` (their cwd is it)."""
    pids = []
    target = str(pgdata.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd") == target:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_for(predicate: object, timeout: float) -> bool:
    """Poll ``predicate`` (a callable) until true or ``timeout`` seconds; whether it came true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.1)
    return False
