"""The benchmarks still run: every script of bench/ with tiny sizes, against nodes on the test
services, each to the end of its summary, and every module of bench/ imports. A figure is
checked to be there and sane (a number where one is printed, every message accounted for),
never against a speed (a benchmark measures and prints, it never fails on one): it keeps the
scripts from rotting unseen, as an import broken by a rename once did.

bench/spark_job.py is the exception: its own SparkSession takes about a minute to start on two
cores, past what this suite can spend, so it only imports here; the job it times
(``consoles.spark.job.run``) runs on a real session in tests/integration/test_dashboards.py.

The benchmarks' nodes use the test database (migrated already, and emptied after the test
as every transactional test's is) and a Redis database of their own, emptied after.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from tests.launcher import free_port

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

BENCH = Path(__file__).resolve().parents[2] / "bench"
#: the Redis database of the benchmarks' key-value store (the tests' nodes use 5, this process 1).
BENCH_REDIS_DB = 6


@pytest.fixture
def stores():
    """(database URL, Redis URL) for a benchmark's node; its Redis database emptied after."""
    import redis

    redis_url = os.environ.get("MQ_TEST_REDIS_URL", "")
    if not redis_url:
        pytest.skip("MQ_TEST_REDIS_URL is not set (make test sets it)")
    s = connection.settings_dict
    database_url = f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"
    yield database_url, redis_url
    kv = redis.Redis.from_url(f"{redis_url}/{BENCH_REDIS_DB}")
    try:
        kv.flushdb()
    finally:
        kv.close()


def _run(*argv: str) -> str:
    r = subprocess.run(
        [sys.executable, *argv], cwd=BENCH.parent, capture_output=True, text=True, timeout=240, check=False
    )
    assert r.returncode == 0, f"{argv[0]} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def _figure(pattern: str, out: str) -> list[float]:
    m = re.search(pattern, out, re.MULTILINE)
    assert m, f"{pattern!r} not in:\n{out[-3000:]}"
    return [float(g.replace(",", "")) for g in m.groups()]


def _client_batching(out: str) -> None:
    for case in ("producer 0 ms, not waiting", "producer 0 ms, each waits", "producer 5 ms, each waits"):
        ratio, p99, bound, added, failed = _figure(
            rf"^{case}: ([\d.]+)x enqueue; p99 ([\d.]+) ms against linger \+ batch call p99 ([\d.]+) ms; "
            r"added p99 (-?[\d.]+) ms; failed (\d+)$",
            out,
        )
        assert ratio > 0 and p99 > 0 and bound > 0 and added < p99 and failed == 0, (case, out[-3000:])
    for case in ("prefetching \\+ Acker", "receive one, ack one"):
        rate, twice, _ = _figure(rf"^{case}\s+([\d,.]+)\s+(\d+)\s+(\d+)$", out)
        assert rate > 0 and twice == 0, (case, out[-3000:])
    sync_us, async_us = (
        _figure(r"^sync client, \d+ threads: ([\d.]+) µs/msg", out)[0],
        _figure(r"^asyncio client, one loop: ([\d.]+) µs/msg", out)[0],
    )
    assert sync_us > 0 and async_us > 0, out[-3000:]


def _console_tree(out: str) -> None:
    live, drawn, calls, read, render = _figure(
        r"(\d+) live blocks .*drawing: (\d+) blocks, (\d+) store calls, read ([\d.]+) ms, render ([\d.]+) ms", out
    )
    assert live == 40 and drawn > 0 and calls > 0 and read > 0 and render > 0, out


def _failover(out: str) -> None:
    # depth, blocks allocated and live, height ... ms to enq, ms to deq ... first=oldest
    depth, alloc, live, height, *_ = _figure(r"^\s+(100)\s+(\d+)\s+(\d+)\s+(\d+)\s", out)
    assert depth == 100 and alloc >= live >= 1 and height >= 1, out
    enq, deq = _figure(r"^\s+100(?:\s+\S+){7}\s+([\d.]+)\s+([\d.]+)\s", out)
    assert enq > 0 and deq > 0, out
    assert re.search(r"^\s+100\s.*\s1/1\s", out, re.MULTILINE), out  # the first dequeue got the oldest


def _housekeeping(out: str) -> None:
    total, *steps = _figure(
        r"one pass ([\d.]+) ms of thread CPU \(update_cooling ([\d.]+), renew ([\d.]+), refresh_queues ([\d.]+), "
        r"drop_stale ([\d.]+), claim_partitions ([\d.]+), publish_stats ([\d.]+) ms",
        out,
    )
    assert total > 0 and all(s >= 0 for s in steps), out


def _inprocess(out: str) -> None:
    per_message, per_call = _figure(r"n=100: node CPU ([\d.]+) µs/msg, ([\d.]+) µs/call", out)
    assert per_message > 0 and per_call > 0, out


def _compiled(out: str) -> None:
    pure, compiled, ratio = _figure(
        r"^median: pure ([\d.]+), compiled ([\d.]+) µs a message; compiled / pure ([\d.]+)x$", out
    )
    assert pure > 0 and compiled > 0 and ratio > 0, out
    assert re.search(r"^compiled with mypyc: keys$", out, re.MULTILINE), out


def _hostile(out: str) -> None:
    # each phase answered as it should: taken, refused unread (413), heartbeats and long polls served
    for line in ("large attributes .*: 201: 1", "maximal bodies .*: 201: 1", "nothing sent: 413: 5", "held: 200: 2"):
        assert re.search(line, out), (line, out[-3000:])
    assert re.search(r"long polls \(wait 1 s\): 200: 2", out), out
    start, peak, ratio = (
        _figure(r"RSS after start\s+([\d.]+) MiB", out)[0],
        _figure(r"peak RSS \(VmHWM\)\s+([\d.]+) MiB", out)[0],
        _figure(r"peak / bound\s+([\d.]+)", out)[0],
    )
    assert 0 < start <= peak and ratio > 0, out
    # the cheap callers: trickles cut or refused, big bodies refused, every next request answered
    assert re.search(r"6 no-grant token, 4 trickled bodies: answered (408|429)", out), out[-3000:]
    assert re.search(r"7 key ID \+ made-up signature, 4 trickled SQS calls: answered (400|408)", out), out[-3000:]
    assert re.search(r"8 no-grant token, 1 x 2 bodies of 8 MiB: answered (400|429)", out), out[-3000:]
    assert "9 a request after a body left unread, 4 connections: {'answered': 4, 'dropped': 0}" in out, out[-3000:]
    assert "failures 0" in out and "failures 1" not in out, out[-3000:]


def _latency(out: str) -> None:
    assert "## summary" in out, out
    p50, p99, worst = _figure(r"1 process: median p50 ([\d.]+) ms, median p99 ([\d.]+) ms, worst p99 ([\d.]+) ms", out)
    assert 0 < p50 <= p99 <= worst, out
    messages, lost = _figure(r"^\| 1 \| [^|]+\| [^|]+\| [^|]+\| (\d+) \| (\d+) \|", out)
    assert messages > 0 and lost == 0, out


def _fair_queue(out: str) -> None:
    for case in ("baseline", "fair", "fifo"):
        quiet_p50, quiet_p99, flood_p99, offered, lost = _figure(
            rf"^{case}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$", out
        )
        assert 0 < quiet_p50 <= quiet_p99 and flood_p99 > 0 and offered > 0 and lost == 0, (case, out[-3000:])
    for case in ("fair", "fifo"):
        assert _figure(rf"^quiet p99, {case} / baseline: ([\d.]+)x", out)[0] > 0, out


def _peers(out: str) -> None:
    for transport in ("pycurl \\(now\\)", "urllib3 \\(before\\)"):
        cpu, wall = _figure(rf"^{transport}\s+([\d.]+)\s+([\d.]+)$", out)
        assert cpu > 0 and wall > 0, out
    assert _figure(r"ratio CPU now / before: ([\d.]+)x", out)[0] > 0, out


def _pipeline(out: str) -> None:
    for mode in ("pipeline \\(pipelining=True\\)", "no pipelining"):
        (rate,) = _figure(rf"^{mode}\s+([\d.]+)\s", out)
        assert rate > 0, out
        assert re.search(rf"^{mode}\s.*\s4/4$", out, re.MULTILINE), out  # every message's attempt logged


def _serving(out: str) -> None:
    rate, per_call = _figure(r"^wsgi-threads\s+([\d.]+)\s+([\d.]+)\s+1\.00x$", out)
    assert rate > 0 and per_call > 0, out


#: The rest of bench/'s scripts at tiny sizes: name -> (its arguments, the Redis database of its
#: node's store or None, a check of its output). Each runs in a process of its own, all at once
#: (most of their time is Python and Django starting, and waiting for their nodes).
SMOKE: dict[str, tuple[str, int | None, Callable[[str], None]]] = {
    "client_batching": (
        (
            "--threads 4 --seconds 0.5 --consume 100 --consumer-threads 2 --cpu-messages 40 --cpu-rounds 1 "
            "--partitions 1 --kv-redis-db {db} --pg-url {database} --redis-url {redis}"
        ),
        13,
        _client_batching,
    ),
    "console_tree": ("--blocks 40 --repeat 1 --kv memory", None, _console_tree),
    "failover": ("--backend memory --depths 100 --repeat 1", None, _failover),
    "housekeeping": ("--kv file --partitions 2 --passes 2", None, _housekeeping),
    "inprocess": ("--kv file --n 100 --batch 10 --repeat 1 --partitions 1", None, _inprocess),
    # one small module: mypyc's compile of the default ones takes about a minute here
    "compiled": (
        "--modules keys --runs 1 -- --kv file --n 100 --batch 10 --repeat 1 --partitions 1",
        None,
        _compiled,
    ),
    "hostile": (
        (
            "--producers 1 --attribute-batches 1 --body-batches 1 --consumers 2 --long-polls 2 --poll-wait 1 "
            "--dribblers 4 --big-at-once 2 --big-rounds 1 --settle 0.5 "
            "--kv-redis-db {db} --database-url {database} --redis-url {redis}"
        ),
        7,
        _hostile,
    ),
    "latency": (
        (
            "--rate 20 --seconds 1 --warmup 0 --runs 1 --node-processes 1 --partitions 1 "
            "--kv-redis-db {db} --pg-url {database} --redis-url {redis}"
        ),
        8,
        _latency,
    ),
    "peers": ("--calls 20 --repeat 1 --kv-redis-db {db}", 9, _peers),
    "fair_queue": (
        (
            "--runs 1 --seconds 2 --warmup 0.5 --groups 3 --consumers 2 --calibrate 0.2 "
            "--kv-redis-db {db} --pg-url {database} --redis-url {redis}"
        ),
        12,
        _fair_queue,
    ),
    "pipeline": (
        (
            "--messages 4 --repeat 1 --warmup 0 --scale 0.01 --wait 0.2 --partitions 1 "
            "--kv-redis-db {db} --database-url {database} --redis-url {redis}"
        ),
        10,
        _pipeline,
    ),
    "serving": ("--models wsgi-threads --clients 2 --calls 200 --repeat 1 --redis-url {redis}/{db}", 11, _serving),
}
#: scripts not run here (only imported), and why (the module's docstring says more).
NOT_RUN = {"spark_job": "its own SparkSession takes about a minute to start"}


def test_every_bench_script_is_smoked_or_said_why_not():
    runnable = {p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text()}
    assert runnable == set(SMOKE) | set(NOT_RUN) | {"sqs", "throughput"}


def test_every_other_bench_script_runs_to_its_summary(stores):
    import psycopg
    import redis

    database_url, redis_url = stores
    # Each script gets a database of its own: nodes sharing one would be one cluster, each
    # claiming the others' partitions (and signing with another cluster's secret).
    server, test_db = database_url.rsplit("/", 1)
    own = {name: f"{test_db}_bench_{name}" for name in SMOKE}
    admin = psycopg.connect(database_url, autocommit=True)
    for db_name in own.values():
        admin.execute(f'DROP DATABASE IF EXISTS "{db_name}"')
        admin.execute(f'CREATE DATABASE "{db_name}"')
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    env.pop("MQBENCH_MIGRATED", None)  # each migrates its own database
    running: dict[str, subprocess.Popen] = {}
    failed: list[str] = []
    with contextlib.ExitStack() as files:
        try:
            outs = {}
            for name, (argv, db, _) in SMOKE.items():
                database = f"{server}/{own[name]}"
                args = [a.format(db=db, database=database, redis=redis_url) for a in argv.split()]
                if name == "serving":
                    args += ["--first-port", str(free_port())]
                outs[name] = files.enter_context(tempfile.TemporaryFile(mode="w+"))
                running[name] = subprocess.Popen(
                    [sys.executable, f"bench/{name}.py", *args],
                    cwd=BENCH.parent,
                    env={**env, "DATABASE_URL": database},
                    stdout=outs[name],
                    stderr=subprocess.STDOUT,
                )
            for name, proc in running.items():
                rc = proc.wait(timeout=300)
                outs[name].seek(0)
                text = outs[name].read()
                if rc != 0:
                    failed.append(f"{name} exited {rc}:\n{text[-3000:]}")
                else:
                    SMOKE[name][2](text)
        finally:
            for proc in running.values():
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=30)
            for _, db, _ in SMOKE.values():
                if db is not None:
                    kv = redis.Redis.from_url(f"{redis_url}/{db}")
                    kv.flushdb()
                    kv.close()
            for db_name in own.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            admin.close()
    assert not failed, "\n\n".join(failed)


def test_every_bench_script_imports():
    names = sorted(p.stem for p in BENCH.glob("*.py"))
    code = f"import importlib, sys; sys.path.insert(0, {str(BENCH)!r})\nfor n in {names!r}: importlib.import_module(n)"
    _run("-c", code)


def test_bench_sqs_runs_to_its_summary(stores):
    database_url, redis_url = stores
    out = _run(
        "bench/sqs.py",
        *("--n", "20", "--repeat", "1", "--idle", "0.1"),
        *("--pg-url", database_url, "--redis-url", redis_url, "--kv-redis-db", str(BENCH_REDIS_DB)),
    )
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("sqs (boto3)", "REST API", "sqs / rest"))]
    assert rows == ["sqs", "REST", "sqs"], out


def test_bench_throughput_runs_to_its_summary(stores):
    database_url, redis_url = stores
    out = _run(
        "bench/throughput.py",
        *("--n", "20", "--repeat", "1", "--warmup", "0", "--clients", "1", "--modes", "single,batch10"),
        *("--backends", "redis", "--skip-baselines"),
        *("--database-url", database_url, "--pg-url", database_url, "--redis-url", redis_url),
        *("--kv-redis-db", str(BENCH_REDIS_DB)),
    )
    assert "SUMMARY" in out, out
    assert "| one message per call (single) |" in out and "| 10 per call (batch10) |" in out, out
