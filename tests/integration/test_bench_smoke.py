"""The benchmarks still run: bench/sqs.py and bench/throughput.py, with tiny sizes, against
nodes on the test services, each to the end of its summary; and every script of bench/
imports. Nothing here reads a figure (a benchmark measures and prints, it never fails on
one): it keeps the scripts from rotting unseen, as an import broken by a rename once did.

The benchmarks' nodes use the test database (migrated already, and emptied after the test
as every transactional test's is) and a Redis database of their own, emptied after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

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
