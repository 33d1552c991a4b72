"""The nemesis report (nemesis/report.py, nemesis/picture.py): the curves under the picture are
bucketed as said, the summary carries the checker's verdict with the run's shape, and the picture
is a PNG drawn without a display."""

from __future__ import annotations

import json

from nemesis.checker import check
from nemesis.history import FaultEvent, History, Op
from nemesis.report import SECOND, percentile, series, summary, write

MS = 1_000_000


def test_percentile_is_by_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 99) == 99
    assert percentile(values, 50) == 50
    assert percentile(values, 100) == 100
    assert percentile([7], 99) == 7
    assert percentile([3, 1, 2], 1) == 1
    assert percentile([], 99) is None


def _call(process: str, f: str, invoked: int, completed: int, type: str = "ok", **learnt) -> list[Op]:
    value = f"m{invoked}" if f == "enqueue" else None
    return [
        Op(process=process, type="invoke", f=f, time=invoked, queue="q", value=value),
        Op(process=process, type=type, f=f, time=completed, **learnt),
    ]


def _history() -> History:
    # given: 2.5 s; second 0: 3 ok calls of 10, 20, 30 ms and a fail; second 1: nothing;
    # the last half second: 1 ok of 40 ms and an unknown; a kill from 0.5 s to 1.5 s
    records: list = []
    records += _call("a", "enqueue", 0, 10 * MS, ids=["q/0"])
    records += _call("a", "enqueue", 100 * MS, 120 * MS, ids=["q/1"])
    records += _call("b", "dequeue", 200 * MS, 230 * MS)
    records += _call("b", "dequeue", 300 * MS, 301 * MS, type="fail", status=503, retry_after="1")
    records += _call("a", "enqueue", 2_000 * MS, 2_040 * MS, ids=["q/2"])
    records += _call("b", "dequeue", 2_100 * MS, 2_500 * MS, type="info", error="timeout")
    records += [
        FaultEvent(fault="kill", event="start", time=500 * MS, target="n1"),
        FaultEvent(fault="kill", event="stop", time=1_500 * MS, target="n1"),
    ]
    return History.of(records)


def test_the_curves_are_per_second_by_when_calls_were_answered():
    history = _history()
    curves = series(history.operations(), history.start, history.end)
    assert curves.seconds == [0.0, 1.0, 2.0]
    # the last bucket lasted half a second: one ok in it is 2 per second
    assert curves.throughput == [3.0, 0.0, 2.0]
    assert curves.p99_ms == [30.0, None, 40.0]
    assert curves.errors == [1.0, 0.0, 2.0]


def test_the_summary_has_the_verdict_the_faults_and_the_latencies():
    history = _history()
    result = check(history)
    data = summary(history, result, seed=42)
    assert data["seed"] == 42
    # the three confirmed enqueues were never delivered
    assert (data["valid"], data["anomalies"]["lost"]) == (False, 3)
    assert data["duration_s"] == 2.5 and data["start_ns"] == 0
    assert data["faults"] == [{"fault": "kill", "target": "n1", "start_s": 0.5, "stop_s": 1.5}]
    assert data["latency_ms"] == {"p50": 20.0, "p99": 40.0, "max": 40.0}
    assert data["throughput_ok_per_s"] == 1.6
    json.dumps(data)  # all of it is JSON


def test_the_report_is_written_beside_the_history_as_json_and_a_png(tmp_path):
    history = _history()
    summary_path, picture_path = write(history, check(history), tmp_path / "run-1", seed=7)
    assert json.loads(summary_path.read_text())["seed"] == 7
    png = picture_path.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000  # 1200 x 800 of axes, bands and curves, not an empty canvas


def test_an_empty_history_still_has_a_report(tmp_path):
    history = History()
    data = summary(history, check(history))
    assert data["valid"] and data["duration_s"] == 0 and data["throughput_ok_per_s"] is None
    curves = series([], 0, 0)
    assert curves.seconds == [0.0] and curves.throughput == [0.0]
    _, picture_path = write(history, check(history), tmp_path)
    assert picture_path.read_bytes().startswith(b"\x89PNG")
    assert SECOND == 10**9
