"""runnode runs each worker process on one CPU (``--cpu-affinity auto``, the default): every
thread of a worker, granian's and the node's, on the worker's CPU, and a node's workers on
different CPUs while there are enough; ``off`` leaves them where the kernel puts them. The
plan itself is ``queues.serving.cpu_plan`` (unit-tested)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from queues.testing import NodeFailed, NodeProcess

from .nodes import local_node_env

pytestmark = pytest.mark.django_db(transaction=True)

ALLOWED = os.sched_getaffinity(0)


def _threads_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of ``pid`` may run on."""
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def _node(tmp_path: Path, processes: int, affinity: str | None) -> NodeProcess:
    env = local_node_env(tmp_path)
    if affinity is not None:
        env["NODE_CPU_AFFINITY"] = affinity
    return NodeProcess(env, tmp_path, processes=processes).start(timeout=60)


def test_each_worker_and_all_its_threads_run_on_one_cpu_of_their_own(tmp_path):
    node = _node(tmp_path, 2, None)  # the default: auto
    try:
        workers = node.member_pids()
        assert len(workers) == 2
        cpus = []
        for pid in workers:
            threads = _threads_cpus(pid)
            assert len(threads) > 3  # granian's runtime and request threads, the node's housekeeping
            assert all(len(t) == 1 for t in threads) and len({frozenset(t) for t in threads}) == 1, threads
            cpus.append(next(iter(threads[0])))
        assert set(cpus) <= ALLOWED
        if len(ALLOWED) >= 2:
            assert cpus[0] != cpus[1]
    finally:
        node.stop()


def test_off_leaves_a_worker_where_the_kernel_puts_it(tmp_path):
    node = _node(tmp_path, 1, "off")
    try:
        [worker] = node.member_pids()
        assert all(t == ALLOWED for t in _threads_cpus(worker))
    finally:
        node.stop()


def test_a_list_of_cpus_is_followed_and_a_cpu_outside_the_allowed_ones_is_refused(tmp_path):
    first = min(ALLOWED)
    node = _node(tmp_path, 1, str(first))
    try:
        [worker] = node.member_pids()
        assert all(t == {first} for t in _threads_cpus(worker))
    finally:
        node.stop()
    with pytest.raises(NodeFailed, match="--cpu-affinity: CPU 4096 is not among"):
        _node(tmp_path, 1, "4096")
