#!/usr/bin/env python
"""Dashboards job benchmark: the Spark job's run time for 10^5 and 10^6 attempt records.

It MEASURES AND PRINTS; it never passes or fails. The goal (issue 6) is under 60 s for 10^6
records on ``local[2]``.

It needs PostgreSQL (the production path: Spark reads the attempt log over JDBC). It works in
its own database, ``<name of DATABASE_URL's database>_bench_spark`` on the same server, which it
creates and migrates, and drops at the end (``--keep`` keeps it), so a real attempt log and
real dashboards are never touched.

For each size N (default 10^5 and 10^6):
  1. generate: N attempt records written by PostgreSQL itself (INSERT ... SELECT FROM
     generate_series), spread over ``--hours`` hours across ``--queues`` queues, ``--workers``
     workers and 1,000 groups per queue; sizes 1..1000, processing time 10 ms + 0.5 ms per unit
     of size (+ noise), pre-processing a fifth of that; 3 % failed, 1 % timed out, 0.5 %
     abandoned, 5 % retries. Not timed.
  2. run the job ``--repeat`` times exactly as ``refresh_dashboards`` does (``job.run``), over
     a window holding all N records, in 60 s buckets. Timed by the job itself:
       - read: the JDBC read of the window and the prepared frame cached (a count forces it);
       - transforms: per-bucket, per-worker and per-group figures and the size regression,
         each collected;
       - write: the results written back with Django (bulk_create) in one transaction;
       - total: the whole run, including the run record and the session lookup.
The SparkSession is started once before the first run (its start-up is printed apart).
Medians over the repeats are printed per size.

Example:
  eval "$(scripts/services.sh env)"; python bench/spark_job.py --sizes 100000,1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

#: the end of the generated window (a fixed, recent-enough time, so history pruning keeps it)
END = datetime.now(UTC).replace(microsecond=0)


def bench_database(url: str) -> tuple[str, str]:
    """(admin URL on the same server, the bench database's URL)."""
    import dj_database_url

    cfg = dj_database_url.parse(url)
    if "postgresql" not in cfg["ENGINE"]:
        raise SystemExit(
            f'bench/spark_job.py needs PostgreSQL (DATABASE_URL={url!r}): eval "$(scripts/services.sh env)" first'
        )
    base = url.rsplit("/", 1)[0]
    return url, f"{base}/{cfg['NAME']}_bench_spark"


def create_database(admin_url: str, name: str, drop_first: bool) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists and drop_first:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            exists = None
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


GENERATE = """
INSERT INTO {table} (message_id, queue, partition, "group", worker_id, attempt, enqueued_at,
                     preprocess_started_at, preprocess_ended_at, process_started_at, process_ended_at,
                     outcome, error, traceback, size, recorded_at)
SELECT 'bench-' || q || '/' || (i %% 4) || '/00000000-' || lpad(to_hex(i / 256), 16, '0') || '/' || (i %% 256),
       'bench-' || q, i %% 4, 'g' || ((i / %(queues)s) %% 1000), 'worker-' || (i %% %(workers)s),
       CASE WHEN r1 < 0.05 THEN 2 ELSE 1 END,
       t - make_interval(secs => 0.2 + 3 * r2),
       t - make_interval(secs => pre), t,
       t, t + make_interval(secs => proc),
       CASE WHEN r3 < 0.03 THEN 'failed' WHEN r3 < 0.04 THEN 'timed_out'
            WHEN r3 < 0.045 THEN 'abandoned' ELSE 'succeeded' END,
       '', '', sz, t + make_interval(secs => proc + 0.3)
FROM (
  SELECT i, i %% %(queues)s AS q, random() AS r1, random() AS r2, random() AS r3, sz,
         %(start)s::timestamptz + make_interval(secs => (i::float8 / %(n)s) * %(seconds)s) AS t,
         (0.010 + 0.0005 * sz) * (0.9 + 0.2 * random()) AS proc,
         (0.002 + 0.0001 * sz) * (0.9 + 0.2 * random()) AS pre
  FROM (SELECT i, 1 + floor(random() * 1000)::int AS sz FROM generate_series(0, %(n)s - 1) AS i) AS g
) AS s
"""


def generate(n: int, queues: int, workers: int, hours: float) -> float:
    from django.db import connection

    from workers.models import AttemptLog

    t0 = time.perf_counter()
    table = AttemptLog._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {table} RESTART IDENTITY")
        cur.execute(
            GENERATE.format(table=table),
            # ends a minute before END: every record is recorded (a few seconds later) inside the window
            {
                "n": n,
                "queues": queues,
                "workers": workers,
                "seconds": hours * 3600 - 60,
                "start": END - timedelta(hours=hours),
            },
        )
        cur.execute(f"ANALYZE {table}")
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--sizes", default="100000,1000000", help="attempt records per run, comma-separated")
    p.add_argument("--repeat", type=int, default=3, help="runs per size (medians are printed)")
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--hours", type=float, default=6.0, help="hours the records are spread over")
    p.add_argument("--bucket", type=int, default=60, help="seconds per bucket")
    p.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.repeat < 1 or not sizes or min(sizes) < 1:
        p.error("--repeat and every size must be at least 1")

    admin_url, url = bench_database(os.environ.get("DATABASE_URL", ""))
    name = url.rsplit("/", 1)[1]
    create_database(admin_url, name, drop_first=True)
    os.environ["DATABASE_URL"] = url
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from consoles.spark import job

    try:
        call_command("migrate", verbosity=0)
        print(
            f"database {name}; Spark master {settings.SPARK_MASTER}, driver memory {settings.SPARK_DRIVER_MEMORY}, "
            f"shuffle partitions {settings.SPARK_SHUFFLE_PARTITIONS}, JDBC partitions <= {settings.SPARK_JDBC_PARTITIONS}"
        )
        t0 = time.perf_counter()
        spark = job.spark_session()
        print(f"Spark session started in {time.perf_counter() - t0:.1f} s (once, not counted below)\n")
        window = int(args.hours * 3600) + 2 * args.bucket
        results = []
        for n in sizes:
            gen = generate(n, args.queues, args.workers, args.hours)
            print(
                f"{n:>9,} records generated in {gen:.1f} s ({args.queues} queues, {args.workers} workers, "
                f"{args.hours:g} h)"
            )
            runs = []
            for k in range(args.repeat):
                t1 = time.perf_counter()
                run = job.run(
                    job.Options(bucket_seconds=args.bucket, window_seconds=window, now=END, apply_estimates=False),
                    trigger="bench",
                    spark=spark,
                )
                total = time.perf_counter() - t1
                assert run.attempts_read == n, f"read {run.attempts_read} of {n}"
                runs.append((run.read_seconds, run.transform_seconds, run.write_seconds, total))
                print(
                    f"    run {k + 1}: read {run.read_seconds:6.2f} s  transforms {run.transform_seconds:6.2f} s  "
                    f"write {run.write_seconds:5.2f} s  total {total:6.2f} s   "
                    f"({run.queues} queues, {run.fits} fits)"
                )
            med = [statistics.median(r[i] for r in runs) for i in range(4)]
            results.append((n, *med))
        print(f"\nmedians of {args.repeat} run(s), local mode = {settings.SPARK_MASTER}")
        print(
            f"{'records':>10}  {'read s':>8}  {'transforms s':>12}  {'write s':>8}  {'total s':>8}  {'records/s':>10}"
        )
        for n, read, transform, write, total in results:
            print(f"{n:>10,}  {read:8.2f}  {transform:12.2f}  {write:8.2f}  {total:8.2f}  {n / total:10,.0f}")
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(admin_url, name)


if __name__ == "__main__":
    main()
