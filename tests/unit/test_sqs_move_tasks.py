"""The message move tasks a process remembers (StartMessageMoveTask, ListMessageMoveTasks):
at most the most recent ones of each source queue, and of the sources that moved last, so a
long-running node's memory does not grow with every task it ever ran.

The service is stubbed (a queue named by any ARN, a redrive that moves one message): what is
tested is what the SQS actions keep of the tasks, not the redrive.
"""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest

from queues import service
from queues.access import SYSTEM
from sqs import actions
from sqs.context import Context
from sqs.move_tasks import TASKS

#: what SQS's ListMessageMoveTasks answers at the most for a source queue.
PER_SOURCE = 10
#: the source queues whose tasks are remembered at the most (those that ran one last).
SOURCES = 1000

CTX = Context(caller=SYSTEM, base_url="http://node/sqs", account="000000000000", region="eu-west-1")


def _arn(name: str) -> str:
    return f"arn:aws:sqs:eu-west-1:000000000000:{name}"


@pytest.fixture(autouse=True)
def stubbed_service(monkeypatch):
    """Every queue exists; a redrive moves one message, then none; a clock a second a call."""
    TASKS.clear()
    moved = itertools.cycle([1, 0])
    clock = itertools.count(1_700_000_000)
    monkeypatch.setattr(service, "get_queue", lambda name, *, caller: SimpleNamespace(name=name, strict=False))
    monkeypatch.setattr(
        service, "redrive", lambda queue, n, *, caller: service.RedriveResult(moved=next(moved), skipped=0)
    )
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))
    yield
    TASKS.clear()


def _start(source: str) -> str:
    return actions.run("StartMessageMoveTask", {"SourceArn": _arn(source)}, CTX)["TaskHandle"]


def _listed(source: str) -> list[dict]:
    return actions.run("ListMessageMoveTasks", {"SourceArn": _arn(source)}, CTX)["Results"]


def test_a_source_keeps_its_most_recent_tasks_only():
    handles = [_start("dlq") for _ in range(3 * PER_SOURCE)]
    listed = _listed("dlq")
    assert [t["TaskHandle"] for t in listed] == handles[::-1][:PER_SOURCE]
    assert all(t["Status"] == "COMPLETED" and t["ApproximateNumberOfMessagesMoved"] == 1 for t in listed)
    assert len(TASKS) == PER_SOURCE


def test_the_sources_that_moved_last_are_remembered_the_others_forgotten():
    first = _start("dlq-first")
    for i in range(SOURCES + 100):
        _start(f"dlq-{i}")
    assert len(TASKS) == SOURCES
    assert _listed("dlq-first") == []
    assert [t["TaskHandle"] for t in _listed(f"dlq-{SOURCES + 99}")] != []
    # a source that runs a task again is among the recent ones again
    again = _start("dlq-first")
    assert [t["TaskHandle"] for t in _listed("dlq-first")] == [again]
    assert first != again
    assert len(TASKS) == SOURCES
