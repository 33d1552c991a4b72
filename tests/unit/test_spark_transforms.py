"""The dashboards' transforms, each on a few hand-made attempts with figures worked out by hand.

One SparkSession (local mode) serves the module: starting the JVM is the expensive part.
"""

from __future__ import annotations

import pytest
from pyspark.testing import assertDataFrameEqual

from consoles.spark import transforms as tf

# Starting the JVM takes seconds: `make test` runs these, `make test-unit` leaves them out.
pytestmark = pytest.mark.slow

T0 = 1_700_000_040.0  # a multiple of 60: the start of a minute bucket


def attempt(
    id,
    *,
    queue="q",
    group="",
    worker="w1",
    attempt=1,
    outcome="succeeded",
    size=None,
    enqueued=None,
    pre=None,
    start=None,
    process=None,
    recorded=None,
):
    """A row of ATTEMPT_SCHEMA: ``pre`` is (start, seconds), ``start``/``process`` the processing."""
    pre_start, pre_end = (pre[0], pre[0] + pre[1]) if pre else (None, None)
    end = start + process if start is not None and process is not None else None
    return (
        id,
        queue,
        group,
        worker,
        attempt,
        outcome,
        size,
        enqueued,
        pre_start,
        pre_end,
        start,
        end,
        recorded if recorded is not None else (end or start or T0) + 0.2,
    )


def frame(spark, rows):
    return spark.createDataFrame(rows, tf.ATTEMPT_SCHEMA)


PREPARED_DDL = (
    "queue string, group string, worker string, attempt int, outcome string, size bigint, "
    "bucket_start bigint, wait double, preprocess double, process double, is_succeeded int, "
    "is_failed int, is_timed_out int, is_abandoned int, is_retry int"
)


def test_prepare_computes_durations_flags_and_buckets(spark):
    rows = [
        # waited 3 s, pre-processed 0.5 s, processed 2 s, finished at T0 + 5 (bucket T0)
        attempt(1, group="g", size=10, enqueued=T0 - 1, pre=(T0 + 1.5, 0.5), start=T0 + 2, process=3.0),
        # a retry that failed; its worker's clock is 0.25 s behind the node's: the wait is 0, not negative
        attempt(2, attempt=2, outcome="failed", enqueued=T0 + 60.25, start=T0 + 60, process=1.0),
        # abandoned by the service: no times but when it was recorded (bucket T0 + 120)
        attempt(3, worker=None, outcome="abandoned", recorded=T0 + 150),
        # timed out, no enqueue time known (an old worker): no wait
        attempt(4, outcome="timed_out", start=T0 + 10, process=30.0),
    ]
    expected = spark.createDataFrame(
        [
            ("q", "g", "w1", 1, "succeeded", 10, int(T0), 3.0, 0.5, 3.0, 1, 0, 0, 0, 0),
            ("q", None, "w1", 2, "failed", None, int(T0) + 60, 0.0, None, 1.0, 0, 1, 0, 0, 1),
            ("q", None, None, 1, "abandoned", None, int(T0) + 120, None, None, None, 0, 0, 0, 1, 0),
            ("q", None, "w1", 1, "timed_out", None, int(T0), None, None, 30.0, 0, 0, 1, 0, 0),
        ],
        PREPARED_DDL,
    )
    assertDataFrameEqual(tf.prepare(frame(spark, rows), 60), expected)


def test_prepare_refuses_an_empty_bucket(spark):
    with pytest.raises(ValueError, match="positive"):
        tf.prepare(frame(spark, []), 0)


def test_queue_bucket_stats_percentiles_rates_and_throughput(spark):
    # bucket T0: ten attempts processing 1..10 s (one failed, one timed out, two retries),
    # waits 0.1..1.0 s; bucket T0+60: two succeeded attempts of 4 s; queue "other": one attempt.
    rows = []
    for k in range(1, 11):
        outcome = "failed" if k == 3 else "timed_out" if k == 7 else "succeeded"
        rows.append(
            attempt(
                k, outcome=outcome, attempt=2 if k in (2, 9) else 1, enqueued=T0 - k / 10, start=T0, process=float(k)
            )
        )
    rows += [attempt(20 + k, start=T0 + 60, process=4.0) for k in range(2)]
    rows.append(attempt(30, queue="other", start=T0, process=0.5, pre=(T0 - 1, 0.25)))
    stats = tf.queue_bucket_stats(tf.prepare(frame(spark, rows), 60), 60)
    b = int(T0)
    expected = spark.createDataFrame(
        [
            # attempts succeeded failed timed_out abandoned retries throughput failure retry
            ("q", b, 10, 8, 1, 1, 0, 2, 8 / 60, 0.2, 0.2, 0.5, 1.0, 1.0, None, None, None, 5.0, 10.0, 10.0),
            ("q", b + 60, 2, 2, 0, 0, 0, 0, 2 / 60, 0.0, 0.0, None, None, None, None, None, None, 4.0, 4.0, 4.0),
            ("other", b, 1, 1, 0, 0, 0, 0, 1 / 60, 0.0, 0.0, None, None, None, 0.25, 0.25, 0.25, 0.5, 0.5, 0.5),
        ],
        "queue string, bucket_start bigint, attempts bigint, succeeded bigint, failed bigint, timed_out bigint, "
        "abandoned bigint, retries bigint, throughput double, failure_rate double, retry_rate double, "
        "wait_p50 double, wait_p95 double, wait_p99 double, preprocess_p50 double, preprocess_p95 double, "
        "preprocess_p99 double, process_p50 double, process_p95 double, process_p99 double",
    )
    assertDataFrameEqual(stats, expected)
    # buckets before the window's start are left out (attempts finished before it, recorded after)
    later = tf.queue_bucket_stats(tf.prepare(frame(spark, rows), 60), 60, since=T0 + 60)
    assert [(r.queue, r.bucket_start) for r in later.collect()] == [("q", b + 60)]


def test_worker_stats_per_queue_and_worker(spark):
    rows = [
        attempt(1, worker="w1", pre=(T0, 0.5), start=T0 + 1, process=2.0),
        attempt(2, worker="w1", outcome="failed", start=T0 + 70, process=4.0),
        attempt(3, worker="w2", start=T0, process=1.0),
        attempt(4, worker=None, outcome="abandoned"),  # nobody's: not a worker's figure
    ]
    got = tf.worker_stats(tf.prepare(frame(spark, rows), 60)).select(
        "queue",
        "worker",
        "attempts",
        "succeeded",
        "failure_rate",
        "process_p50",
        "process_p99",
        "busy_seconds",
        "first_bucket",
        "last_bucket",
    )
    expected = spark.createDataFrame(
        [
            ("q", "w1", 2, 1, 0.5, 2.0, 4.0, 6.5, int(T0), int(T0) + 60),
            ("q", "w2", 1, 1, 0.0, 1.0, 1.0, 1.0, int(T0), int(T0)),
        ],
        "queue string, worker string, attempts bigint, succeeded bigint, failure_rate double, "
        "process_p50 double, process_p99 double, busy_seconds double, first_bucket bigint, last_bucket bigint",
    )
    assertDataFrameEqual(got, expected)


def test_group_stats_leave_out_ungrouped_messages(spark):
    rows = [
        attempt(1, group="a", enqueued=T0 - 2, start=T0, process=1.0),
        attempt(2, group="a", attempt=2, enqueued=T0 - 4, start=T0, process=3.0),
        attempt(3, group="b", outcome="timed_out", start=T0, process=9.0),
        attempt(4, group="", start=T0, process=5.0),
    ]
    got = tf.group_stats(tf.prepare(frame(spark, rows), 60)).select(
        "queue", "group", "attempts", "failure_rate", "retry_rate", "wait_p50", "wait_p99", "process_p50"
    )
    expected = spark.createDataFrame(
        [
            ("q", "a", 2, 0.0, 0.5, 2.0, 4.0, 1.0),
            ("q", "b", 1, 1.0, 0.0, None, None, 9.0),
        ],
        "queue string, group string, attempts bigint, failure_rate double, retry_rate double, "
        "wait_p50 double, wait_p99 double, process_p50 double",
    )
    assertDataFrameEqual(got, expected)


def test_regression_samples_take_succeeded_attempts_with_a_size(spark):
    rows = [
        attempt(1, size=100, pre=(T0, 0.5), start=T0 + 1, process=2.0),
        attempt(2, size=50, start=T0, process=1.0),  # no pre-processing stage
        attempt(3, size=70, outcome="failed", start=T0, process=0.1),  # failed: not a sample
        attempt(4, size=None, start=T0, process=3.0),  # no size: not a sample
    ]
    got = tf.regression_samples(tf.prepare(frame(spark, rows), 60))
    expected = spark.createDataFrame(
        [
            ("q", "preprocess", 100.0, 0.5),
            ("q", "process", 100.0, 2.0),
            ("q", "process", 50.0, 1.0),
        ],
        "queue string, stage string, size double, seconds double",
    )
    assertDataFrameEqual(got, expected)


def test_fit_size_regression_learns_the_line_and_the_estimate_at_the_median(spark):
    samples = [("q", "process", float(s), 0.5 + 0.01 * s) for s in range(10, 310, 10)]  # 30 on a line
    samples += [("q", "preprocess", float(s), 0.2) for s in range(10, 310, 10)]  # flat
    samples += [("flat", "process", 64.0, t) for t in (1.0, 2.0, 3.0) * 8]  # one size only
    samples += [("few", "process", float(s), 1.0 + s) for s in range(5)]  # too few
    samples += [("neg", "process", float(s), 50.0 - s) for s in range(0, 200, 5)]  # < 0 at median
    frame_ = spark.createDataFrame(samples, "queue string, stage string, size double, seconds double")
    got = tf.fit_size_regression(frame_, min_samples=20)
    expected = spark.createDataFrame(
        [
            # queue stage n intercept slope r2 rmse median estimate
            ("flat", "process", 24, 2.0, 0.0, 0.0, (2 / 3) ** 0.5, 64.0, 2.0),  # a flat line explains nothing
            ("neg", "process", 40, 50.0, -1.0, 1.0, 0.0, 95.0, 0.0),
            ("q", "preprocess", 30, 0.2, 0.0, None, 0.0, 150.0, 0.2),
            ("q", "process", 30, 0.5, 0.01, 1.0, 0.0, 150.0, 2.0),
        ],
        tf.FIT_SCHEMA,
    )
    assertDataFrameEqual(got, expected, rtol=1e-6, atol=1e-7)


def test_latency_bucket_stats_per_queue_and_ack_bucket(spark):
    archived = spark.createDataFrame(
        [
            # queue q: three acked in the first minute after 1, 2 and 4 s; one in the next after 10 s
            (1, "q", T0 - 1.0, T0 + 0.0),
            (2, "q", T0 + 1.0, T0 + 3.0),
            (3, "q", T0 + 6.0, T0 + 10.0),
            (4, "q", T0 + 55.0, T0 + 65.0),
            # queue r: a clock a little behind: never a negative latency
            (5, "r", T0 + 5.25, T0 + 5.0),
        ],
        tf.ARCHIVE_SCHEMA,
    )
    stats = tf.latency_bucket_stats(archived, 60)
    assertDataFrameEqual(
        stats,
        spark.createDataFrame(
            [
                ("q", int(T0), 3, 2.0, 4.0, 4.0),
                ("q", int(T0) + 60, 1, 10.0, 10.0, 10.0),
                ("r", int(T0), 1, 0.0, 0.0, 0.0),
            ],
            "queue string, bucket_start bigint, acked bigint, latency_p50 double, latency_p95 double, latency_p99 double",
        ),
    )
    assert tf.latency_bucket_stats(archived, 60, since=T0 + 60).count() == 1
    with pytest.raises(ValueError):
        tf.latency_bucket_stats(archived, 0)
