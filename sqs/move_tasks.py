"""SQS's message move tasks (StartMessageMoveTask, ListMessageMoveTasks) over the service's
redrive: a task runs to the end before it is answered, moving every dead letter back to the
queue it came from (or every message to the ``DestinationArn``), and is remembered by the
process that ran it, a bounded number of them. Its handle is SQS's: the base64 of a JSON object
with its ``taskId`` and ``sourceArn``.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

from queues import service
from sqs.context import Context, service_errors

#: dead letters one call of the service's redrive moves at the most.
_ROUND = 1000
#: how long a message being moved to a DestinationArn stays hidden (seconds).
_HOLD = 60.0


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


def task_handle(source_arn: str) -> str:
    """A new task's handle, as SQS makes one: the base64 of ``{"taskId": <UUID>, "sourceArn": ...}``."""
    task = {"taskId": str(uuid.uuid4()), "sourceArn": source_arn}
    return base64.b64encode(json.dumps(task, separators=(",", ":")).encode()).decode()


def parse_task_handle(handle: str) -> dict[str, str] | None:
    """The ``taskId`` and ``sourceArn`` of a task handle, or None if it is not one."""
    try:
        task = json.loads(base64.b64decode(handle.encode(), validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(task, dict) or not all(isinstance(task.get(k), str) for k in ("taskId", "sourceArn")):
        return None
    return {"taskId": task["taskId"], "sourceArn": task["sourceArn"]}


def _move_to(q: Any, dest: Any, ctx: Context) -> int:
    """Move every message of queue ``q`` to queue ``dest`` as ``ctx.caller`` (``consume`` on
    ``q``, ``produce`` on ``dest``): received, stored there in its group, then deleted here, a
    batch at a time (a failure between the two leaves a copy in both: at least once, as SQS's
    move). At most as many rounds as ``q`` held messages when it started (a FIFO queue gives
    one a group a round), so messages that keep coming do not keep it running."""
    moved = 0
    with service_errors():
        depth = int(service.queue_stats(q.name, caller=ctx.caller)["depth"])
        for _ in range(depth + 2):
            found = service.dequeue(q.name, caller=ctx.caller, max_messages=service.MAX_BATCH, visibility_timeout=_HOLD)
            if not found:
                break
            drafts = []
            for d in found:
                m = d.message
                assert m is not None
                drafts.append(service.MessageDraft(m.body, group=m.group, attributes=m.attributes, size=m.size))
            service.enqueue(dest.name, drafts, caller=ctx.caller)
            items = [(service.parse_message_id(d.id), d.receipt) for d in found]
            service.ack(q.name, [(mid, receipt) for mid, receipt in items if mid is not None], caller=ctx.caller)
            moved += len(found)
    return moved


def run_task(q: Any, source_arn: str, ctx: Context, dest: Any = None, destination_arn: str | None = None) -> str:
    """Move every dead letter of queue ``q`` (named by ``source_arn``) back to where it came
    from, or every message of it to queue ``dest`` (named by ``destination_arn``), as
    ``ctx.caller``, and remember the task: its handle. Raises SQSError."""
    started = int(time.time() * 1000)
    moved = 0
    if dest is not None:
        moved = _move_to(q, dest, ctx)
    else:
        with service_errors():
            while True:
                result = service.redrive(q.name, _ROUND, caller=ctx.caller)
                moved += result.moved
                if result.moved + result.skipped == 0 or result.moved == 0:
                    break
    handle = task_handle(source_arn)
    task: dict[str, Any] = {
        "TaskHandle": handle,
        "Status": "COMPLETED",
        "SourceArn": source_arn,
        "ApproximateNumberOfMessagesMoved": moved,
        "ApproximateNumberOfMessagesToMove": moved,
        "StartedTimestamp": started,
    }
    if destination_arn:
        task["DestinationArn"] = destination_arn
    TASKS.add(q.name, task)
    return handle
