"""``scripts/test_shards.py``: how ``make test`` splits the suite into shards."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shards(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("test_shards", REPO / "scripts" / "test_shards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "DURATIONS", tmp_path / "durations.json")
    return module


def test_every_module_runs_in_exactly_one_shard(shards):
    plan = shards.plan(3)
    placed = [m for shard in plan for m in shard]
    assert sorted(placed) == shards.modules()
    assert len(placed) == len(set(placed))
    assert "tests/unit/test_shards_plan.py" in placed
    assert all(shard == sorted(shard) for shard in plan)  # the suite's own order within a shard


def test_the_shards_times_are_about_equal(shards):
    modules = shards.modules()
    times = {m: float(1 + (i * 37) % 90) for i, m in enumerate(modules)}
    shards.DURATIONS.write_text(json.dumps(times))
    loads = [sum(times[m] for m in shard) for shard in shards.plan(2)]
    # largest first onto the lighter shard: apart by at most the largest module
    assert abs(loads[0] - loads[1]) <= max(times.values())


def test_a_module_without_a_recorded_time_counts_as_unknown_seconds(shards):
    modules = shards.modules()
    heavy = modules[0]
    shards.DURATIONS.write_text(json.dumps({heavy: shards.UNKNOWN_SECONDS * (len(modules) - 1)}))
    plan = shards.plan(2)
    alone = next(shard for shard in plan if heavy in shard)
    assert alone == [heavy]  # the others, unknown, add up to its time on the other shard


def test_record_sums_each_files_tests_from_junit(shards, tmp_path):
    junit = tmp_path / "shard-0.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_shards_plan" name="a" time="1.25"/>'
        '<testcase classname="tests.unit.test_shards_plan.TestX" name="b" time="2.5"/>'
        '<testcase classname="tests.unit.test_tree" name="c" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    assert shards.record([str(junit)]) == {"tests/unit/test_shards_plan.py": 3.8, "tests/unit/test_tree.py": 0.5}


def test_the_unit_shards_are_the_unit_modules_split_by_their_own_times(shards, tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "UNIT_DURATIONS", tmp_path / "durations-unit.json")
    unit = shards.modules("tests/unit")
    assert unit and all(m.startswith("tests/unit/") for m in unit)
    # the suite's times would put the first module alone; the unit run's own times do not
    shards.DURATIONS.write_text(json.dumps({unit[0]: 1000.0}))
    shards.UNIT_DURATIONS.write_text(json.dumps(dict.fromkeys(unit, 1.0)))
    plan = shards.plan(2, "tests/unit")
    assert sorted(m for shard in plan for m in shard) == unit
    assert abs(len(plan[0]) - len(plan[1])) <= 1
