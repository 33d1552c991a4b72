"""SQS's message move tasks (StartMessageMoveTask, ListMessageMoveTasks) over the service's
redrive: a task runs to the end before it is answered, moving every dead letter back to the
queue it came from, and is remembered by the process that ran it, a bounded number of them.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import OrderedDict
from typing import Any

from queues import service
from sqs.context import Context, service_errors

#: dead letters one call of the service's redrive moves at the most.
_ROUND = 1000


class MoveTasks:
    """The move tasks this process ran, as ListMessageMoveTasks lists them: the ``per_source``
    most recent of each source queue (SQS lists at most 10), for the ``sources`` queues that
    ran one last; older ones are forgotten, so what a node keeps stays bounded however long it
    runs. Calls are answered on several threads: one lock guards it."""

    def __init__(self, per_source: int = 10, sources: int = 1000) -> None:
        self.per_source = per_source
        self.sources = sources
        self._lock = threading.Lock()
        #: source queue -> its tasks, newest first; the source that ran one last at the end.
        self._by_source: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def add(self, queue: str, task: dict[str, Any]) -> None:
        """Remember ``task`` (ListMessageMoveTasks' entry) of source ``queue``; one of the same
        handle is replaced."""
        with self._lock:
            tasks = [t for t in self._by_source.pop(queue, []) if t["TaskHandle"] != task["TaskHandle"]]
            tasks.append(task)
            tasks.sort(key=lambda t: -t["StartedTimestamp"])
            del tasks[self.per_source :]
            self._by_source[queue] = tasks
            while len(self._by_source) > self.sources:
                self._by_source.popitem(last=False)

    def recent(self, queue: str) -> list[dict[str, Any]]:
        """The tasks of source ``queue`` remembered, newest first."""
        with self._lock:
            return list(self._by_source.get(queue, ()))

    def clear(self) -> None:
        with self._lock:
            self._by_source.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(tasks) for tasks in self._by_source.values())


#: the tasks this process ran.
TASKS = MoveTasks()


def run_task(q: Any, source_arn: str, ctx: Context) -> str:
    """Move every dead letter of queue ``q`` (named by ``source_arn``) back to where it came
    from, as ``ctx.caller``, and remember the task: its handle. Raises SQSError."""
    started = int(time.time() * 1000)
    moved = 0
    with service_errors():
        while True:
            result = service.redrive(q.name, _ROUND, caller=ctx.caller)
            moved += result.moved
            if result.moved + result.skipped == 0 or result.moved == 0:
                break
    handle = base64.urlsafe_b64encode(json.dumps({"queue": q.name, "at": started}).encode()).decode()
    TASKS.add(
        q.name,
        {
            "TaskHandle": handle,
            "Status": "COMPLETED",
            "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": moved,
            "ApproximateNumberOfMessagesToMove": moved,
            "StartedTimestamp": started,
        },
    )
    return handle
