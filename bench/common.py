"""What the benchmarks share: logging, medians, and one node started for a benchmark.

A benchmark node (:class:`BenchNode`) is what ``bench/throughput.py`` and ``bench/pipeline.py``
run against: a temp dir of its own (data, file KV, log), ``manage.py migrate`` (left out when
``MQBENCH_MIGRATED=1``: a database known to be migrated, as the smoke test's), a staff user with
an API token, then ``manage.py runnode`` started and stopped by ``tests.launcher.NodeProcess``
(the launcher the integration tests use too).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as `python bench/x.py`: the project's packages are one up
    sys.path.insert(0, str(REPO))

from tests.launcher import NodeFailed, NodeProcess, free_port, kv_url, node_env


class BenchError(RuntimeError):
    pass


def exit_on_sigterm() -> None:
    """A SIGTERM (``kill``, ``timeout``) ends the benchmark as Ctrl-C does: through its
    ``finally`` blocks, which stop the nodes it started. Killed outright, it left them serving:
    a later run's node then shared their port (``SO_REUSEPORT``), and its calls went to them.
    """

    def stop(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def box_speed(redis_url: str | None = None) -> dict[str, float]:
    """How fast this machine is right now, to set figures of different runs side by side.

    The same code on this 2-core VM measured 36 µs/msg one day and 50-67 the next, with the
    box idle both times: the host's load moves under us. Printed beside the figures, these
    say whether a difference between two runs is the code's or the box's:

    - ``python_us``: thread CPU of a fixed pure-Python loop (100,000 additions), best of 5;
    - ``ping_cpu_us`` / ``ping_wall_us``: thread CPU and wall time of one redis-py PING to
      ``redis_url``, medians of 2,000 (a store round trip: syscalls, a sleep and a wake-up).
    """

    def loop() -> float:
        t, s = time.thread_time(), 0
        for i in range(100_000):
            s += i
        return time.thread_time() - t

    out = {"python_us": min(loop() for _ in range(5)) * 1e6}
    if redis_url:
        import redis

        r = redis.Redis.from_url(redis_url)
        try:
            r.ping()
            cpu, wall = [], []
            for _ in range(2000):
                t, w = time.thread_time(), time.perf_counter()
                r.ping()
                cpu.append(time.thread_time() - t)
                wall.append(time.perf_counter() - w)
            out |= {"ping_cpu_us": statistics.median(cpu) * 1e6, "ping_wall_us": statistics.median(wall) * 1e6}
        except redis.RedisError as exc:
            log(f"box speed: no PING to {redact(redis_url)}: {exc}")
        finally:
            r.close()
    return out


def fmt_box_speed(speed: dict[str, float]) -> str:
    text = f"Python loop {speed['python_us'] / 1000:.2f} ms"
    if "ping_cpu_us" in speed:
        text += f", Redis PING {speed['ping_cpu_us']:.0f} µs thread CPU ({speed['ping_wall_us']:.0f} µs wall)"
    return text


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs):
    """The median of the numbers in ``xs`` (None and NaN left out); None if there are none."""
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def fmt_rate(x) -> str:
    """A rate per second as printed: whole numbers from 100 up, one decimal below."""
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def fmt_cores(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def fmt_fwd(x) -> str:
    """Forwarded calls per message as printed; ``-`` where not counted (not our node)."""
    return "-" if x is None else f"{x:.3f}"


def fmt_ratio(a, b) -> str:
    if a is None or b in (None, 0):
        return "n/a"
    return f"{a / b:.3f}x"


def redact(url: str) -> str:
    """``url`` with its password hidden, for printing."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


class BenchNode:
    """One node for a benchmark on the key-value ``backend`` (file, redis, postgres), or on the
    store ``kv`` names (a ``KV_URL``, e.g. ``redis-cluster://...``) when given.

    ``start()`` migrates the database, creates (or reuses) the staff user ``user`` and its
    token, and starts the node (``manage.py runnode``, with ``--processes processes`` when
    given) on ``port`` (0: a free one) with ``extra_env`` (``KEY=VALUE`` items) added;
    ``stop()`` stops it and removes the temp dir unless ``keep_tmp``.
    """

    def __init__(
        self,
        name: str,
        backend: str,
        *,
        database_url: str,
        redis_url: str,
        kv_redis_db: int,
        python: str = sys.executable,
        repo: Path | str = REPO,
        port: int = 0,
        user: str = "mqbench",
        extra_env: Sequence[str] = (),
        startup_timeout: float = 90,
        keep_tmp: bool = False,
        kv: str | None = None,
        processes: int | None = None,
    ) -> None:
        self.name, self.backend = name, backend
        self.database_url, self.redis_url, self.kv_redis_db = database_url, redis_url, kv_redis_db
        self.python, self.repo, self.user = python, repo, user
        self.extra_env = list(extra_env)
        self.startup_timeout, self.keep_tmp = startup_timeout, keep_tmp
        self.kv, self.processes = kv, processes
        self.tmp: str | None = None  # made by start()
        self.port = port
        self.token = ""
        self.process: NodeProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    # -- process ----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The node's variables (on top of this process's environment)."""
        kv_dir = os.path.join(self.tmp, "kv")
        if self.backend == "file":
            os.makedirs(kv_dir, exist_ok=True)
        try:
            kv = self.kv or kv_url(self.backend, redis_url=self.redis_url, redis_db=self.kv_redis_db, directory=kv_dir)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
        data_dir = os.path.join(self.tmp, "data")
        os.makedirs(data_dir, exist_ok=True)
        env = node_env(
            database_url=self.database_url, data_dir=data_dir, kv=kv, REDIS_URL=self.redis_url, PYTHONUNBUFFERED="1"
        )
        for item in self.extra_env:
            k, _, v = item.partition("=")
            env[k] = v
        return env

    def manage(self, *argv: str, timeout: float = 300, env_extra: dict | None = None) -> str:
        """``manage.py argv`` with the node's environment; its output. BenchError if it fails."""
        env = {**os.environ, **self.env(), **(env_extra or {})}
        cmd = [self.python, "manage.py", *argv]
        r = subprocess.run(cmd, cwd=self.repo, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if r.returncode != 0:
            raise BenchError(f"`manage.py {argv[0]}` exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
        return r.stdout + r.stderr

    def sqs_key(self, description: str) -> tuple[str, str]:
        """(access key ID, secret) of a new SQS access key of the node's user."""
        out = self.manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            "from sqs.models import AccessKey\n"
            f"k = AccessKey.issue(get_user_model().objects.get(username={self.user!r}), {description!r})\n"
            "print('KEY=' + k.access_key_id + ':' + k.secret)\n",
        )
        m = re.search(r"KEY=(\w+):(\S+)", out)
        if m is None:
            raise BenchError(f"no access key made:\n{out[-500:]}")
        return m.group(1), m.group(2)

    def _create_token(self) -> str:
        user = self.user
        code = (
            "from django.contrib.auth import get_user_model\n"
            "from rest_framework.authtoken.models import Token\n"
            f"u, _ = get_user_model().objects.get_or_create(username={user!r})\n"
            "u.is_staff = u.is_superuser = True\n"
            "u.set_unusable_password(); u.save()\n"
            "t, _ = Token.objects.get_or_create(user=u)\n"
            "print('MQBENCH_TOKEN=' + t.key)\n"
        )
        try:
            out = self.manage("shell", "-c", code, timeout=120)
            m = re.search(r"MQBENCH_TOKEN=(\w+)", out)
            if m:
                return m.group(1)
        except BenchError as exc:
            log(f"{self.name}: shell -c failed, falling back to createsuperuser + drf_create_token ({exc})")
        try:
            self.manage(
                "createsuperuser",
                "--noinput",
                "--username",
                user,
                "--email",
                f"{user}@example.invalid",
                timeout=120,
                env_extra={"DJANGO_SUPERUSER_PASSWORD": uuid.uuid4().hex},
            )
        except BenchError as exc:
            if "already" not in str(exc).lower():
                raise
        out = self.manage("drf_create_token", user, timeout=120)
        m = re.search(r"Generated token (\w+) for user", out)
        if not m:
            raise BenchError(f"no token in drf_create_token output: {out[-500:]}")
        return m.group(1)

    def start(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix=f"mqbench-{self.backend}-")
        self.port = self.port or free_port()
        if os.environ.get("MQBENCH_MIGRATED") != "1":  # the smoke test's database is migrated already
            log(f"{self.name}: migrate")
            self.manage("migrate", "--noinput", timeout=600)
        self.token = self._create_token()
        options = {} if self.processes is None else {"processes": self.processes}
        self.process = NodeProcess(
            self.env(), self.tmp, self.port, heartbeat=None, python=self.python, cwd=self.repo, **options
        )
        extra = "" if self.processes is None else f" --processes {self.processes}"
        log(f"{self.name}: runnode{extra} on 127.0.0.1:{self.port} (KV {self.backend}, log {self.process.log_path})")
        try:
            self.process.start(timeout=self.startup_timeout)
        except NodeFailed as exc:
            raise BenchError(str(exc)) from exc
        log(f"{self.name}: healthy")

    def log_tail(self) -> str:
        return "(no log)" if self.process is None else self.process.log_tail()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=15)
        if self.tmp and not self.keep_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        elif self.tmp:
            log(f"{self.name}: kept {self.tmp}")

    # -- API -------------------------------------------------------------------------------
    def connection(self, timeout: float = 30) -> http.client.HTTPConnection:
        """A keep-alive connection to the node, for :meth:`api` calls in a timed loop."""
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def api(
        self,
        method: str,
        path: str,
        payload=None,
        auth: bool = True,
        timeout: float = 30,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, bytes]:
        """One call; on ``conn`` (kept open) if given, else on a connection of its own."""
        own = conn is None
        conn = conn or self.connection(timeout)
        headers = {"Accept": "application/json"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            headers["Authorization"] = f"Token {self.token}"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            if own:
                conn.close()
