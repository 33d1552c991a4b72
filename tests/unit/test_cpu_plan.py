"""Where runnode runs its worker processes (``queues.cluster.serving.cpu_plan``): one CPU each, spread
round robin from one the node's port picks, over the CPUs it may use or those it is given; a CPU of
its own each while they are no more than those CPUs."""

from __future__ import annotations

import pytest

from queues.cluster.serving import cpu_plan


def test_auto_puts_each_worker_on_a_cpu_of_its_own_when_the_node_has_one_a_cpu():
    assert cpu_plan("auto", {0, 1, 2, 3}, 4, 8000) == [0, 1, 2, 3]
    assert cpu_plan("auto", {0, 1, 2, 3}, 4, 8001) == [1, 2, 3, 0]  # from the CPU the port picks
    assert cpu_plan("auto", {5}, 1, 8000) == [5]


def test_auto_pins_a_node_of_fewer_processes_than_cpus_each_on_a_cpu_of_its_own():
    assert cpu_plan("auto", {0, 1, 2, 3}, 2, 8000) == [0, 1]
    assert cpu_plan("auto", {0, 1, 2, 3}, 3, 8003) == [3, 0, 1]
    assert cpu_plan("auto", {0, 1}, 1, 8000) == [0]
    assert cpu_plan("auto", {0, 1}, 1, 8001) == [1]
    assert cpu_plan("auto", {2, 5, 7}, 2, 8002) == [5, 7]  # the allowed CPUs, in order, not 0..n
    plan = cpu_plan("auto", set(range(16)), 8, 8013)
    assert plan is not None and len(set(plan)) == 8  # never two on one CPU while they fit


def test_auto_shares_the_cpus_round_robin_when_the_node_has_more_processes_than_cpus():
    assert cpu_plan("AUTO ", {4, 6}, 3, 1) == [6, 4, 6]
    assert cpu_plan("auto", {0, 1}, 5, 8000) == [0, 1, 0, 1, 0]


def test_a_list_pins_a_node_of_any_size():
    assert cpu_plan("0-1", {0, 1}, 1, 8001) == [1]
    assert cpu_plan("3", {0, 1, 2, 3}, 2, 8000) == [3, 3]


def test_off_or_no_cpu_to_choose_from_leaves_the_workers_alone():
    assert cpu_plan("off", {0, 1}, 2, 8000) is None
    assert cpu_plan("auto", set(), 2, 8000) is None  # (no sched_setaffinity on this platform)


def test_a_list_of_cpus_is_spread_over_in_order():
    assert cpu_plan("0,2", {0, 2}, 2, 8000) == [0, 2]
    assert cpu_plan("2-3", {0, 1, 2, 3}, 2, 8000) == [2, 3]
    assert cpu_plan("0,2-3", {0, 1, 2, 3}, 3, 8002) == [2, 3, 0]
    assert cpu_plan("1,1,1", {0, 1}, 2, 8000) == [1, 1]


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ("", "give auto, off"),
        ("on", "give auto, off"),
        ("0-", "give auto, off"),
        ("0,,1", "give auto, off"),
        ("-1", "give auto, off"),
        ("0 1", "give auto, off"),
        ("3-1", "runs backwards"),
        ("0-2", "CPU 2 is not among"),
        ("7", "CPU 7 is not among"),
        ("0-99999999999", "CPU 99999999999 is not among"),
    ],
)
def test_a_setting_that_names_no_cpus_it_may_use_is_refused(setting, error):
    with pytest.raises(ValueError, match=error):
        cpu_plan(setting, {0, 1}, 1, 8000)


def test_cpus_between_allowed_ones_are_refused():
    with pytest.raises(ValueError, match=r"CPUs \[1\] are not among"):
        cpu_plan("0-2", {0, 2}, 1, 8000)
