"""runnode runs each worker process on one CPU (``--cpu-affinity auto``, the default, when the
node has a process for each CPU it may use; a list of CPUs, whatever its size): every thread of
a worker, granian's and the node's, on the worker's CPU, and a node's workers on different CPUs;
``off``, or a node of fewer processes than CPUs under ``auto``, is left where the kernel puts
it. The plan itself is ``queues.cluster.serving.cpu_plan`` (unit-tested)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.nodes import local_node_env
from tests.launcher import NodeFailed, NodeProcess

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

ALLOWED = os.sched_getaffinity(0)


def _threads_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of ``pid`` may run on."""
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def _pinned_cpu(pid: int) -> int:
    """The one CPU every thread of ``pid`` runs on (asserted)."""
    threads = _threads_cpus(pid)
    assert len(threads) > 3  # granian's runtime and request threads, the node's housekeeping
    assert all(len(t) == 1 for t in threads) and len({frozenset(t) for t in threads}) == 1, threads
    return next(iter(threads[0]))


def _node(tmp_path: Path, processes: int, affinity: str | None) -> NodeProcess:
    env = local_node_env(tmp_path)
    if affinity is not None:
        env["NODE_CPU_AFFINITY"] = affinity
    return NodeProcess(env, tmp_path, processes=processes).start(timeout=60)


def test_each_worker_and_all_its_threads_run_on_one_cpu_of_their_own(tmp_path):
    # the default (auto), with a process for each CPU (the default --processes)
    if len(ALLOWED) > 8:
        pytest.skip("a worker for each of this machine's CPUs is too many for a test")
    node = _node(tmp_path, len(ALLOWED), None)
    try:
        workers = node.member_pids()
        assert len(workers) == len(ALLOWED)
        assert sorted(_pinned_cpu(pid) for pid in workers) == sorted(ALLOWED)  # one worker a CPU
    finally:
        node.stop()


@pytest.mark.parametrize("affinity", ["off", None])
def test_off_or_a_node_smaller_than_its_machine_is_left_where_the_kernel_puts_it(tmp_path, affinity):
    if affinity is None and len(ALLOWED) < 2:
        pytest.skip("a one-process node has the one CPU of this machine to itself")
    node = _node(tmp_path, 1, affinity)
    try:
        [worker] = node.member_pids()
        assert all(t == ALLOWED for t in _threads_cpus(worker))
    finally:
        node.stop()


def test_a_list_of_cpus_is_followed_and_a_cpu_outside_the_allowed_ones_is_refused(tmp_path):
    listed = sorted(ALLOWED)[:2]
    node = _node(tmp_path, len(listed), ",".join(map(str, listed)))
    try:
        assert sorted(_pinned_cpu(pid) for pid in node.member_pids()) == listed
    finally:
        node.stop()
    with pytest.raises(NodeFailed, match="--cpu-affinity: CPU 4096 is not among"):
        _node(tmp_path, 1, "4096")
