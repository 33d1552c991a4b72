"""Django's tasks framework on this service's queues: a ``django.tasks`` backend and its runner.

``TASKS = {"default": {"BACKEND": "workers.tasks_backend.QueueTaskBackend", "QUEUES": [...],
"OPTIONS": {...}}}`` (Django 6's ``django.tasks``, or the ``django-tasks`` backport on Django 5.2).

- A task's ``queue_name`` is the name of one of the service's queues; the queue must exist
  (``mq_tasks_worker`` refuses to start without it, and a relay keeps the messages until it
  does): its rules (visibility timeout, ``max_receives``, dead-letter queue) are the operator's.
- The enqueue is one message on that queue, sent through the SDK like any client's, on commit
  of the caller's transaction (:mod:`workers.outbox`: an outbox row on PostgreSQL).
  ``run_after`` is the message's ``not_before``; ``priority`` is kept in the result and the
  message's attributes but orders nothing (the service has no priorities: give urgent tasks a
  queue of their own).
- The result (:class:`~workers.models.TaskRecord`) is written with the enqueue and updated by
  the worker; :meth:`QueueTaskBackend.get_result` reads it from any process of the application,
  with the attempts from the service's attempt log.
- ``manage.py mq_tasks_worker`` runs them with the queue-client pipeline (:mod:`workers.pipeline`):
  a task that raises is a failed attempt, tried again after a backoff until the queue's
  ``max_receives`` sends it to the dead-letter queue.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from mq_client import Client
from workers.models import AttemptLog, TaskRecord
from workers.outbox import enqueue_on_commit

try:  # Django 6.0 and later
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

log = logging.getLogger(__name__)

#: The message attribute that names the task (the console shows attributes with each message).
TASK_ATTRIBUTE = "task"


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueTaskResult(TaskResult):
    #: the service's attempt log of the task's message, oldest first: one dict per attempt
    #: (``attempt``, ``outcome``, ``worker``, ``error``, ``started_at``, ``ended_at``)
    attempt_log: tuple[dict[str, Any], ...] = ()


def _json(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples become lists); TypeError/ValueError if it is not JSON."""
    return json.loads(json.dumps(value))


def _module_path(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


class QueueTaskBackend(BaseTaskBackend):
    """``OPTIONS``: ``url`` and ``token`` of the service (default ``QUEUE_API_URL`` and
    ``QUEUE_API_TOKEN``), ``database`` (the alias whose transaction an enqueue joins and where
    results live; ``"default"``), ``outbox`` (None: on PostgreSQL; True or False to force it),
    ``relay_after`` (seconds before the worker's relay sends an outbox row; 10)."""

    supports_defer = True
    supports_get_result = True
    #: accepted and recorded; the service delivers in its own order (see the module's docstring)
    supports_priority = True
    #: a coroutine task runs in the worker's slot thread (``async_to_sync``)
    supports_async_task = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("database", "default")
        self.outbox: bool | None = self.options.get("outbox")
        self.relay_after: float = float(self.options.get("relay_after", 10.0))
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The SDK client of the service (made on first use)."""
        if self._client is None:
            env = {}
            if self.options.get("url"):
                env["QUEUE_API_URL"] = self.options["url"]
            if self.options.get("token"):
                env["QUEUE_API_TOKEN"] = self.options["token"]
            self._client = Client.from_env({**os.environ, **env})
        return self._client

    # --- enqueue ------------------------------------------------------------------------------
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        now = timezone.now()
        args, kwargs = _json(list(args)), _json(dict(kwargs))
        record = TaskRecord.objects.using(self.database).create(
            id=uuid.uuid4().hex,
            task_path=task.module_path,
            backend=self.alias,
            queue=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
            args=args,
            kwargs=kwargs,
            status=TaskResultStatus.READY,
            enqueued_at=now,
        )
        body = {"id": record.id, "task": record.task_path, "backend": self.alias, "args": args, "kwargs": kwargs}
        message: dict[str, Any] = {
            "body": json.dumps(body, separators=(",", ":")),
            "dedup_id": record.id,
            "attributes": {TASK_ATTRIBUTE: record.task_path, "priority": task.priority},
        }
        if task.run_after is not None:
            message["not_before"] = task.run_after.isoformat()
        enqueue_on_commit(task.queue_name, [message], client=self.client, using=self.database, outbox=self.outbox)
        result = self._result(record, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    # --- results ------------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        record = TaskRecord.objects.using(self.database).filter(pk=result_id).first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(record, load_task(record.task_path), with_log=True)

    def _result(self, record: TaskRecord, task: Task, *, with_log: bool = False) -> QueueTaskResult:
        attempts: list[AttemptLog] = []
        if with_log and record.message_id:
            attempts = _one_per_attempt(
                AttemptLog.objects.using(self.database)
                .filter(message_id=record.message_id)
                .order_by("attempt", "recorded_at", "id")
            )
        # The attempt log is the record of what happened to the message (an attempt whose worker
        # died is there, as abandoned); the task's own list has the attempt under way, which the
        # worker reports when it ends.
        worker_ids = [a.worker_id or "" for a in attempts] + list(record.worker_ids[len(attempts) :])
        if task.queue_name != record.queue or task.priority != record.priority or task.run_after != record.run_after:
            task = task.using(queue_name=record.queue, priority=record.priority, run_after=record.run_after)
        result = QueueTaskResult(
            task=task,
            id=record.id,
            status=TaskResultStatus(record.status),
            enqueued_at=record.enqueued_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            last_attempted_at=record.last_attempted_at,
            args=record.args,
            kwargs=record.kwargs,
            backend=record.backend,
            errors=[
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in record.errors
            ],
            worker_ids=worker_ids,
            attempt_log=tuple(_attempt(a) for a in attempts),
        )
        object.__setattr__(result, "_return_value", record.return_value)
        return result


def _one_per_attempt(records: Any) -> list[AttemptLog]:
    """One record per attempt: the service logs an attempt as abandoned when the message comes
    back before its worker's report arrived (a retry sooner than the worker's next log flush);
    the worker's report, when there is one, is what happened."""
    by_attempt: dict[int, AttemptLog] = {}
    for a in records:
        kept = by_attempt.get(a.attempt)
        if kept is None or (kept.outcome in _SERVICE_OUTCOMES and a.outcome not in _SERVICE_OUTCOMES):
            by_attempt[a.attempt] = a
    return [by_attempt[n] for n in sorted(by_attempt)]


#: outcomes the service records for attempts its worker did not report
_SERVICE_OUTCOMES = frozenset({AttemptLog.Outcome.ABANDONED, AttemptLog.Outcome.GIVEN_BACK})


def _attempt(a: AttemptLog) -> dict[str, Any]:
    return {
        "attempt": a.attempt,
        "outcome": a.outcome,
        "worker": a.worker_id or "",
        "error": a.error,
        "started_at": a.process_started_at,
        "ended_at": a.process_ended_at,
    }


def _drop_stale_connections() -> None:
    """Close this thread's connections the database broke or that outlived CONN_MAX_AGE, as Django
    does around each request (a worker's slot thread lives long); never one inside a transaction."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def load_task(path: str) -> Task:
    """The ``@task`` at ``path``; ValueError for anything else: a message names what runs, and
    only functions declared as tasks may run that way."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ValueError(f"no task {path!r}: {exc}") from exc
    if not isinstance(found, Task):
        raise ValueError(f"{path!r} is not a task (declare it with @task)")
    return found


class TaskRunner:
    """The processing function the worker's pipeline calls for a task message: runs the task and
    records the attempt in its result. Raising makes the attempt a failed one (the pipeline
    logs it with its traceback and makes the message visible again after a backoff)."""

    def __init__(self, backend: QueueTaskBackend, worker_id: str):
        self.backend = backend
        self.worker_id = worker_id

    def __call__(self, message: Any, prepared: Any) -> None:
        _drop_stale_connections()
        try:
            self._run(message)
        finally:
            _drop_stale_connections()

    def _run(self, message: Any) -> None:
        body = json.loads(message.body)
        db = self.backend.database
        record = TaskRecord.objects.using(db).filter(pk=body["id"]).first()
        if record is None:  # enqueued where its record is not visible: keep one here
            record = TaskRecord.objects.using(db).create(
                id=body["id"],
                task_path=body["task"],
                backend=body.get("backend", self.backend.alias),
                queue=message.id.split("/", 1)[0],
                args=body.get("args", []),
                kwargs=body.get("kwargs", {}),
                status=TaskResultStatus.READY,
                enqueued_at=getattr(message, "enqueued_at", None),
            )
        if record.status == TaskResultStatus.SUCCESSFUL:
            log.info("task %s already succeeded: a second delivery of its message is not run again", record.id)
            return
        task = load_task(record.task_path)
        now = timezone.now()
        record.status = TaskResultStatus.RUNNING
        record.started_at = record.started_at or now
        record.last_attempted_at = now
        record.finished_at = None
        record.worker_ids = [*record.worker_ids, self.worker_id]
        record.message_id = message.id
        record.save(using=db)
        result = self.backend._result(record, task)
        task_started.send(type(self.backend), task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *record.args, **record.kwargs)
            else:
                value = task.call(*record.args, **record.kwargs)
            value = _json(value)
        except BaseException as exc:
            record.status = TaskResultStatus.FAILED
            record.errors = [
                *record.errors,
                {
                    "exception_class_path": _module_path(type(exc)),
                    "traceback": "".join(traceback.format_exception(exc)),
                },
            ]
            record.finished_at = timezone.now()
            record.save(using=db)
            task_finished.send(type(self.backend), task_result=self.backend._result(record, task))
            raise
        record.status = TaskResultStatus.SUCCESSFUL
        record.return_value = value
        record.finished_at = timezone.now()
        record.save(using=db)
        task_finished.send(type(self.backend), task_result=self.backend._result(record, task))
