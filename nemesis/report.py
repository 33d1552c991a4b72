"""The report of a run: a JSON summary and one picture, written beside the history.

The summary is the checker's result (``valid``, the anomaly counts and their first examples,
duplicates and deliveries after an ack by fault) with the run's shape: how long, which faults
when, throughput and latency. Times in the examples are the history's own (nanoseconds of the
run's monotonic clock); ``start_ns`` says where the run began, the fault windows are in seconds
from there. The picture is drawn by ``nemesis.picture``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemesis.checker import Faults, Result
from nemesis.history import History, Operation
from nemesis.picture import draw

SECOND = 1_000_000_000


def percentile(values: list[int], q: float) -> int | None:
    """The ``q``-th percentile (0 < q <= 100) by nearest rank: the smallest value with at least
    q% of the values at or below it; ``None`` for no values. O(n log n)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Series:
    """Per time bucket, by when calls were answered: the picture's curves."""

    #: each bucket's start, in seconds from the run's start
    seconds: list[float]
    #: calls answered ok, per second
    throughput: list[float]
    #: 99th percentile of the ok calls' latency, in milliseconds (``None``: no ok call)
    p99_ms: list[float | None]
    #: calls answered fail or given up (info), per second
    errors: list[float]


def series(operations: list[Operation], start: int, end: int, bucket_ns: int = SECOND) -> Series:
    """Bucket the answered calls of ``[start, end]`` by ``bucket_ns``. O(n log n)."""
    count = max(1, math.ceil((end - start) / bucket_ns))
    latencies: list[list[int]] = [[] for _ in range(count)]
    errors = [0] * count
    for op in operations:
        if op.completed is None:
            continue
        bucket = min(count - 1, max(0, (op.completed - start) // bucket_ns))
        if op.type == "ok":
            latencies[bucket].append(op.completed - op.invoked)
        else:
            errors[bucket] += 1
    # the last bucket may be cut short by the end of the run: its rate is over what it lasted
    widths = [bucket_ns] * (count - 1) + [max(1, end - start - (count - 1) * bucket_ns)]
    p99s = [percentile(bucket, 99) for bucket in latencies]
    return Series(
        seconds=[i * bucket_ns / SECOND for i in range(count)],
        throughput=[len(bucket) * SECOND / w for bucket, w in zip(latencies, widths)],
        p99_ms=[None if p is None else p / 1e6 for p in p99s],
        errors=[e * SECOND / w for e, w in zip(errors, widths)],
    )


def summary(history: History, result: Result, **run: Any) -> dict[str, Any]:
    """The JSON summary; ``run`` adds what the run knows about itself (seed, commit, nodes)."""
    start, end = history.start, history.end
    operations = history.operations()
    ok_latencies = [op.completed - op.invoked for op in operations if op.type == "ok" and op.completed is not None]
    duration = (end - start) / SECOND
    return {
        **run,
        **result.to_json(),
        "start_ns": start,
        "duration_s": round(duration, 3),
        "faults": [
            {
                "fault": kind,
                "target": target,
                "start_s": round((s - start) / SECOND, 3),
                "stop_s": round((e - start) / SECOND, 3),
            }
            for s, e, kind, target in Faults(history.faults, end).windows
        ],
        "throughput_ok_per_s": round(len(ok_latencies) / duration, 1) if duration > 0 else None,
        "latency_ms": {
            name: None if (p := percentile(ok_latencies, q)) is None else round(p / 1e6, 3)
            for name, q in (("p50", 50), ("p99", 99), ("max", 100))
        },
    }


def write(history: History, result: Result, directory: str | Path, **run: Any) -> tuple[Path, Path]:
    """Write ``summary.json`` and ``picture.png`` into ``directory``; returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summary_path = directory / "summary.json"
    summary_path.write_text(json.dumps(summary(history, result, **run), indent=2) + "\n", encoding="utf-8")
    picture_path = directory / "picture.png"
    start, end = history.start, history.end
    draw(
        series(history.operations(), start, end),
        [((s - start) / SECOND, (e - start) / SECOND, kind) for s, e, kind, _ in Faults(history.faults, end).windows],
        picture_path,
        title="valid" if result.valid else "INVALID: " + ", ".join(a for a, n in result.anomalies.items() if n),
    )
    return summary_path, picture_path
