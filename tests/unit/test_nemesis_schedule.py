"""The nemesis's schedule: a pure function of the seed, within the run, one fault per target at
a time, pauses and cuts past the lease, upgrades one node at a time."""

from __future__ import annotations

import pytest

from nemesis.faults import KINDS, schedule

NODES = ["n1", "n2", "n3"]


def test_a_seed_names_one_schedule_and_another_seed_another():
    one = schedule(7, 300, list(KINDS), NODES, lease=3)
    assert one == schedule(7, 300, list(KINDS), NODES, lease=3)
    assert one != schedule(8, 300, list(KINDS), NODES, lease=3)


@pytest.mark.parametrize("seed", range(20))
def test_faults_fit_the_run_and_never_share_a_target(seed):
    faults = schedule(seed, 300, list(KINDS), NODES, lease=3)
    assert len(faults) > 30
    assert {f.kind for f in faults} == set(KINDS)
    held: dict[str, float] = {}
    upgrade_until = 0.0
    for f in faults:  # in order of start
        assert f.at >= 5 and f.at + f.duration <= 295
        assert held.get(f.target, 0.0) <= f.at, f"{f.describe()} while its target is still under a fault"
        held[f.target] = f.at + f.duration
        if f.kind in ("pause", "partition-stores", "partition-peers"):
            assert f.duration > 3  # past the lease: another node takes over
        if f.kind == "upgrade":
            assert upgrade_until <= f.at, "two nodes upgraded at once"
            upgrade_until = f.at + f.duration
        if f.kind == "drift":
            assert 0.9 <= f.rate <= 1.1 and abs(f.offset) <= 300
        # never every node down at once
        down = [g for g in faults if KINDS[g.kind] == "node" and g.at <= f.at < g.at + g.duration]
        assert len({g.target for g in down}) < len(NODES)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown fault kinds"):
        schedule(1, 60, ["kill", "meteor"], NODES, lease=3)
