"""runnode runs each worker process on one CPU (``--cpu-affinity auto``, the node's default, a
CPU of its own each while they are no more than the CPUs it may use; a list of CPUs, whatever
its size): every thread of a worker, granian's and the node's, on the worker's CPU, and a node's
workers on different CPUs; ``off`` is left where the kernel puts it. The plan itself is
``queues.cluster.serving.cpu_plan`` (unit-tested). The tests' other nodes run with ``off``
(tests/conftest.py): these ask for what they test.

A worker is looked at once it serves: registered as a member of the cluster and running its
threads. A node answers its health check from its first worker; its sibling may still be
starting then, a process of one thread."""

from __future__ import annotations

import os

import pytest

from tests.integration.nodes import NodeFactory
from tests.launcher import NodeFailed, NodeProcess, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

ALLOWED = os.sched_getaffinity(0)

#: Threads of a worker that serves at least: granian's runtime and request threads, the node's
#: housekeeping (and the main thread).
SERVING_THREADS = 4


def _threads_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of ``pid`` may run on (a thread that ends meanwhile is left out)."""
    cpus = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpus.append(os.sched_getaffinity(int(tid)))
        except ProcessLookupError:
            pass
    return cpus


def _serving_workers(node: NodeProcess) -> list[int]:
    """The pids of the node's workers once each of them serves (a generous deadline: the
    machine may be busy)."""
    from queues.models import Node

    def serving() -> bool:
        pids = node.member_pids()
        return (
            len(pids) == node.processes
            and Node.objects.filter(pid__in=pids).values("pid").distinct().count() == len(pids)
            and all(len(_threads_cpus(pid)) >= SERVING_THREADS for pid in pids)
        )

    wait_until(serving, 90, f"the {node.processes} workers of {node.url} to serve")
    return node.member_pids()


def _pinned_cpu(pid: int) -> int:
    """The one CPU every thread of ``pid`` runs on (asserted)."""
    threads = _threads_cpus(pid)
    assert len(threads) >= SERVING_THREADS
    assert all(len(t) == 1 for t in threads) and len({frozenset(t) for t in threads}) == 1, threads
    return next(iter(threads[0]))


def _node(node_factory: NodeFactory, processes: int, affinity: str) -> NodeProcess:
    return node_factory(processes=processes, timeout=90, NODE_CPU_AFFINITY=affinity)


@pytest.mark.parametrize("processes", sorted({1, len(ALLOWED)}))
def test_auto_runs_each_worker_and_all_its_threads_on_a_cpu_of_its_own(node_factory, processes):
    # a process for each CPU (the default --processes), and fewer: one
    if processes > 8:
        pytest.skip("a worker for each of this machine's CPUs is too many for a test")
    node = _node(node_factory, processes, "auto")
    try:
        cpus = [_pinned_cpu(pid) for pid in _serving_workers(node)]
        assert len(set(cpus)) == processes and set(cpus) <= ALLOWED  # one worker a CPU
    finally:
        node.stop()


def test_off_is_left_where_the_kernel_puts_it(node_factory):
    node = _node(node_factory, 1, "off")
    try:
        [worker] = _serving_workers(node)
        threads = _threads_cpus(worker)
        assert len(threads) >= SERVING_THREADS and all(t == ALLOWED for t in threads), threads
    finally:
        node.stop()


def test_a_list_of_cpus_is_followed_and_a_cpu_outside_the_allowed_ones_is_refused(node_factory):
    listed = sorted(ALLOWED)[:2]
    node = _node(node_factory, len(listed), ",".join(map(str, listed)))
    try:
        assert sorted(_pinned_cpu(pid) for pid in _serving_workers(node)) == listed
    finally:
        node.stop()
    with pytest.raises(NodeFailed, match="--cpu-affinity: CPU 4096 is not among"):
        _node(node_factory, 1, "4096")
