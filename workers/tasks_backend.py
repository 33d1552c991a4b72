"""Django's tasks framework on this service's queues: a ``django.tasks`` backend and its runner.

``TASKS = {"default": {"BACKEND": "workers.tasks_backend.QueueTaskBackend", "QUEUES": [...],
"OPTIONS": {"modules": [...], ...}}}`` (Django 6's ``django.tasks``, or the ``django-tasks``
backport on Django 5.2).

- A task runs only if the application registered it (:mod:`workers.task_registry`): declared
  with ``@task`` in one of the backend's ``modules`` (or a module under one), for the queue its
  message came from. A message names a registered task; the worker never imports what a message
  names, and a message naming anything else fails its attempt.
- A task's ``queue_name`` is the name of one of the service's queues; the queue must exist
  (``mq_tasks_worker`` refuses to start without it, and a relay keeps the messages until it
  does): its rules (visibility timeout, ``max_receives``, dead-letter queue) are the operator's.
- The enqueue is one message on that queue, sent through the SDK like any client's, on commit
  of the caller's transaction (:mod:`workers.outbox`: an outbox row on PostgreSQL).
  ``run_after`` is the message's ``not_before``; a task due further ahead than the service's
  delay limit is held in the database, with its writer (the user of the enqueuing client's
  token), and its message sent by a worker's relay once it is due within ``send_ahead``
  seconds, as that writer, its grants read then; a writer who may no longer send it ends it
  ``FAILED``. ``priority`` is kept in the result and the message's attributes
  but orders nothing (the service has no priorities: give urgent tasks a queue of their own).
- The result (:class:`~workers.models.TaskRecord`) is written with the enqueue and updated by
  the worker; :meth:`QueueTaskBackend.get_result` reads it from any process of the application,
  with the attempts from the service's attempt log. A task that cannot be found or started ends
  ``FAILED`` with its error, as one that raises does.
- ``manage.py mq_tasks_worker`` runs them with the queue-client pipeline (:mod:`workers.pipeline`):
  a task that raises is a failed attempt, tried again after a backoff until the queue's
  ``max_receives`` sends it to the dead-letter queue.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import traceback
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from mq_client import Client
from queues.public import LIMITS
from workers.models import AttemptLog, TaskRecord
from workers.outbox import WriterRefused, enqueue_on_commit, outbox_used, send_as, status_of, writer_of
from workers.task_registry import (
    TaskMessageInvalid,
    TaskNotRegistered,
    declare,
    in_modules,
    registered,
    registered_tasks,
)

if TYPE_CHECKING:  # typed against what requirements.txt pins: Django 5.2 with the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
else:
    try:  # Django 6.0 and later, which names the error InvalidTask
        from django.tasks import TaskContext, TaskResult, TaskResultStatus
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import InvalidTask as InvalidTaskError
        from django.tasks.exceptions import TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: The message attribute that names the task (the console shows attributes with each message).
TASK_ATTRIBUTE = "task"
#: The furthest ahead, in seconds, a message's ``not_before`` may be (the service's delay limit).
MAX_DELAY = LIMITS["delay"][1]
#: Seconds before its ``run_after`` a held task's message is sent, by default: the delay limit
#: less a minute, so that a producer's clock ahead of the node's by up to a minute, or a relay
#: that sends a little late, still gives the node a ``not_before`` within its limit.
SEND_AHEAD = MAX_DELAY - 60.0
#: Seconds a relay's claim on a held task lasts while it sends its message: longer than a send
#: with all the client's retries (about a minute), shorter than a queue's dedup window (300 s by
#: default), so that a task whose relay died mid-send is sent again, and stored once.
RELEASE_CLAIM = 120.0
#: Seconds a held task the service refused (its queue missing...) waits before the next try.
RELEASE_RETRY = 30.0


class QueueTask(Task[P, T]):
    """The backend's ``task_class``: a ``Task`` that, when ``@task`` makes it, declares itself in
    the registry (:func:`workers.task_registry.declare`); the copies ``using()`` makes declare
    nothing."""

    __slots__ = ()

    def __post_init__(self) -> None:
        Task.__post_init__(self)  # the backend's validation (a slots dataclass: no bare super())
        declare(self)


if TYPE_CHECKING:
    _TaskResult = TaskResult[Any]
else:
    _TaskResult = TaskResult


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueTaskResult(_TaskResult):
    #: the service's attempt log of the task's message, oldest first: one dict per attempt
    #: (``attempt``, ``outcome``, ``worker``, ``error``, ``started_at``, ``ended_at``)
    attempt_log: tuple[dict[str, Any], ...] = ()


def _json(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples become lists); TypeError/ValueError if it is not JSON."""
    return json.loads(json.dumps(value))


def _module_path(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _error(exc: BaseException) -> dict[str, str]:
    """``exc`` as the record keeps it (a ``TaskError``'s fields)."""
    return {"exception_class_path": _module_path(type(exc)), "traceback": "".join(traceback.format_exception(exc))}


class QueueTaskBackend(BaseTaskBackend):
    """``OPTIONS``: ``modules`` (the modules that declare the tasks: see
    :mod:`workers.task_registry`), ``url`` and ``token`` of the service (default ``QUEUE_API_URL``
    and ``QUEUE_API_TOKEN``), ``database`` (the alias whose transaction an enqueue joins and
    where results live; ``"default"``), ``outbox`` (None: on PostgreSQL; True or False to force
    it), ``relay_after`` (seconds before the worker's relay sends an outbox row; 10),
    ``send_ahead`` (seconds before its ``run_after`` a held task's message is sent; 840)."""

    task_class = QueueTask
    supports_defer = True
    supports_get_result = True
    #: accepted and recorded; the service delivers in its own order (see the module's docstring)
    supports_priority = True
    #: a coroutine task runs in the worker's slot thread (``async_to_sync``)
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        modules = self.options.get("modules", ())
        if isinstance(modules, str) or not all(isinstance(m, str) and m for m in modules):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['modules'] is a list of module names")
        self.modules: tuple[str, ...] = tuple(modules)
        self.database: str = self.options.get("database", "default")
        self.outbox: bool | None = self.options.get("outbox")
        self.relay_after: float = float(self.options.get("relay_after", 10.0))
        self.send_ahead: float = float(self.options.get("send_ahead", SEND_AHEAD))
        if not 0 < self.send_ahead <= MAX_DELAY:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['send_ahead'] is more than 0 and at most {MAX_DELAY} seconds"
            )
        self._client: Any = None
        self._loaded = False

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

    # --- the registry ---------------------------------------------------------------------------
    def load_tasks(self) -> dict[str, set[str]]:
        """Import the backend's ``modules`` (once; ImportError if one is missing) and answer the
        tasks registered for it, each with its queues."""
        if not self._loaded:
            for name in self.modules:
                importlib.import_module(name)
            self._loaded = True
        return registered_tasks(backend=self.alias, modules=self.modules)

    def registered_task(self, name: str, queue: str) -> Task[..., Any]:
        """The task ``name`` if it is registered to run from ``queue``; TaskNotRegistered if not.
        A lookup in the registry: nothing named here is imported."""
        self.load_tasks()
        found = registered(name, backend=self.alias, modules=self.modules)
        if found is None:
            raise TaskNotRegistered(
                f"no task {name!r} is registered for TASKS[{self.alias!r}] in this process "
                f"(its modules: {', '.join(self.modules) or 'none'})"
            )
        if queue not in found.queues:
            raise TaskNotRegistered(
                f"task {name!r} runs from queue(s) {', '.join(sorted(found.queues))}, not from {queue!r}"
            )
        return found.task

    def _check_registered(self, task: Task[..., Any]) -> None:
        """InvalidTaskError unless a worker configured as this process would run ``task``."""
        if not in_modules(task.func.__module__, self.modules):
            raise InvalidTaskError(
                f"{task.module_path} is not in the task modules of TASKS[{self.alias!r}] "
                f"(OPTIONS['modules']: {', '.join(self.modules) or 'none'}): no worker would run it"
            )
        found = registered(task.module_path, backend=self.alias, modules=self.modules)
        if found is None or found.task.func is not task.func:
            raise InvalidTaskError(f"{task.module_path} is not a task declared with @task for TASKS[{self.alias!r}]")
        if task.queue_name not in found.queues:
            raise InvalidTaskError(
                f"{task.module_path} runs from queue(s) {', '.join(sorted(found.queues))}, not from "
                f"{task.queue_name!r}: workers.task_registry.allow_queues() adds queues"
            )

    # --- enqueue ------------------------------------------------------------------------------
    def enqueue(self, task: Task[..., Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Write the task's result and send its message on commit, or hold it (``run_after``
        beyond ``send_ahead``) with its writer, the user of the client's token. Raises before
        anything is written for a task no worker would run (InvalidTaskError), arguments that
        are not JSON, or, for a task held or sent through the outbox, a client whose token this
        service does not know (ValueError, :func:`workers.outbox.writer_of`); an enqueue that
        raises leaves no result behind."""
        self.validate_task(task)
        self._check_registered(task)
        now = timezone.now()
        args, kwargs = _json(list(args)), _json(dict(kwargs))
        held_until = writer = None
        if task.run_after is not None and task.run_after > now + timedelta(seconds=self.send_ahead):
            # Further ahead than the service may delay a message: held here, sent by a relay
            # once it is due within send_ahead (release_held), as the user of this client's
            # token, read now (ValueError, before anything is written, for a token unknown here).
            held_until = task.run_after - timedelta(seconds=self.send_ahead)
            writer = writer_of(self.client)
        # Whether the caller's transaction is open: then the send is its commit's, after this returns.
        deferred = connections[self.database].in_atomic_block
        with transaction.atomic(using=self.database):
            record = TaskRecord.objects.using(self.database).create(
                id=uuid.uuid4().hex,
                task_path=task.module_path,
                backend=self.alias,
                queue=task.queue_name,
                priority=task.priority,
                run_after=task.run_after,
                held_until=held_until,
                writer_id=writer,
                args=args,
                kwargs=kwargs,
                status=TaskResultStatus.READY,
                enqueued_at=now,
            )
            if held_until is None:
                self._send_on_commit(record, deferred=deferred)
        result = self._result(record, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _message(self, record: TaskRecord) -> dict[str, Any]:
        """The message of ``record``'s task: deduplicated by the result's ID, so that a second
        send (a relay's, after a lost answer) is stored once."""
        body = {
            "id": record.id,
            "task": record.task_path,
            "backend": record.backend,
            "args": record.args,
            "kwargs": record.kwargs,
        }
        message: dict[str, Any] = {
            "body": json.dumps(body, separators=(",", ":")),
            "dedup_id": record.id,
            "attributes": {TASK_ATTRIBUTE: record.task_path, "priority": record.priority},
        }
        if record.run_after is not None:
            message["not_before"] = record.run_after.isoformat()
        return message

    def _send_on_commit(self, record: TaskRecord, *, deferred: bool) -> None:
        message = self._message(record)
        if outbox_used(self.database, self.outbox):
            enqueue_on_commit(record.queue, [message], client=self.client, using=self.database, outbox=True)
            return

        def send() -> None:
            try:
                self.client.enqueue_batch(record.queue, [message])
            except Exception as exc:
                if deferred:
                    # The caller's enqueue() returned a result and its transaction committed:
                    # the result says why the task will not run.
                    self._record_failure(record.id, exc)
                else:  # enqueue() raises: it leaves no result behind
                    TaskRecord.objects.using(self.database).filter(pk=record.id).delete()
                raise

        transaction.on_commit(send, using=self.database)

    def _record_failure(self, record_id: str, exc: BaseException, *, held_under: datetime | None = None) -> None:
        """End task ``record_id`` ``FAILED`` with ``exc``, as the framework reports a failure
        (an error in ``errors``, ``finished_at``, ``task_finished``). ``held_under``: a held
        task's, only while the relay's claim (this ``held_until``) is on it, and held no
        longer; a relay whose claim ran out and passed to another changes nothing."""
        with transaction.atomic(using=self.database):
            found = TaskRecord.objects.using(self.database).select_for_update().filter(pk=record_id)
            if held_under is not None:
                found = found.filter(held_until=held_under)
            record = found.first()
            if record is None:
                return
            record.held_until = None
            record.status = TaskResultStatus.FAILED
            record.errors = [*record.errors, _error(exc)]
            record.finished_at = timezone.now()
            record.save(using=self.database)
        task_finished.send(type(self), task_result=self._result(record, self._task_of(record)))

    # --- held tasks ---------------------------------------------------------------------------
    def release_held(self, *, limit: int = 100) -> int:
        """Send the messages of this backend's held tasks that are due within ``send_ahead``,
        the earliest first, each as its writer (:func:`workers.outbox.send_as`: the writer and
        its grants read now, a node call signed for the writer, never this backend's token);
        how many were sent. Each is claimed for :data:`RELEASE_CLAIM` seconds by one committed
        ``UPDATE`` (of two relays, one has it), sent with no transaction open, then marked sent.

        A task that may not be sent as its writer (deleted, deactivated, or without ``produce``
        on the queue now: WriterRefused) is not sent: its result ends ``FAILED`` with the reason
        and it is held no longer. A send the service refuses otherwise (its queue missing, a
        node's 401 or 403, whose caches may be behind the rows read here) keeps the task held,
        tried again after :data:`RELEASE_RETRY` seconds; no node answering, or the writer over
        its call rate, ends the pass."""
        rows = TaskRecord.objects.using(self.database)
        now = timezone.now()
        due = list(
            rows.filter(backend=self.alias, held_until__lte=now)
            .order_by("held_until")
            .values_list("pk", "held_until")[:limit]
        )
        sent = 0
        for pk, held_until in due:
            claim = now + timedelta(seconds=RELEASE_CLAIM)
            try:
                if not rows.filter(pk=pk, held_until=held_until).update(held_until=claim):
                    continue  # another relay has it
                record = rows.filter(pk=pk).first()
                if record is None:
                    continue
                send_as(record.writer_id, record.queue, [self._message(record)], detail={"task": record.id})
            except WriterRefused as exc:
                assert record is not None  # (send_as refused it)
                self._record_failure(pk, exc, held_under=claim)
                log.error("held task %s to %s not sent, ended FAILED: %s", pk, record.queue, exc)
                continue
            except DatabaseError as exc:
                log.warning("held tasks: %s", exc)
                break
            except Exception as exc:
                rows.filter(pk=pk, held_until=claim).update(held_until=now + timedelta(seconds=RELEASE_RETRY))
                status = status_of(exc)
                if status is None:
                    raise
                if status == 429 or status >= 500:
                    log.warning("held task %s: no node took it now, the next relay tries again: %s", pk, exc)
                    break
                log.error("held task %s: the service refused its message, tried again later: %s", pk, exc)
                continue
            rows.filter(pk=pk, held_until=claim).update(held_until=None)
            sent += 1
        if sent:
            log.info("sent %d held task(s) now due within %.0f s", sent, self.send_ahead)
        return sent

    # --- results ------------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult[Any]:
        record = TaskRecord.objects.using(self.database).filter(pk=result_id).first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(record, self._task_of(record), with_log=True)

    def _task_of(self, record: TaskRecord) -> Task[..., Any]:
        """The registered task ``record`` names, or a stand-in for one this process does not have
        (its name kept); the record's name is never imported."""
        self.load_tasks()
        found = registered(record.task_path, backend=self.alias, modules=self.modules)
        return found.task if found is not None else _stand_in(record)

    def _result(self, record: TaskRecord, task: Task[..., Any], *, with_log: bool = False) -> QueueTaskResult:
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
            task = _unchecked(task, queue_name=record.queue, priority=record.priority, run_after=record.run_after)
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


def _unchecked(task: Task[..., Any], **changes: Any) -> Task[..., Any]:
    """A copy of ``task`` with ``changes``, made without the framework's validation and without
    declaring anything: a result shows its task as it was enqueued, even where the settings have
    changed since (a queue no longer in ``QUEUES``)."""
    copy = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(copy, f.name, changes.get(f.name, getattr(task, f.name)))
    return copy


def _stand_in(record: TaskRecord) -> Task[..., Any]:
    """The task of a result whose task this process has not registered: a ``Task`` whose function
    has the record's name (so ``result.task.module_path`` is the task's) and raises
    TaskNotRegistered if called."""
    path = record.task_path
    module, _, name = path.rpartition(".")

    def not_registered(*args: Any, **kwargs: Any) -> Any:
        raise TaskNotRegistered(f"no task {path!r} is registered in this process")

    not_registered.__module__ = module
    not_registered.__name__ = not_registered.__qualname__ = name
    task = object.__new__(Task)
    values = {"func": not_registered, "backend": record.backend}
    for f in dataclasses.fields(Task):
        object.__setattr__(task, f.name, values.get(f.name, f.default))
    return _unchecked(task, queue_name=record.queue, priority=record.priority, run_after=record.run_after)


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


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """What a task message's body says."""

    #: the result's ID
    id: str
    #: the task's registered name
    task: str
    args: list[Any]
    kwargs: dict[str, Any]


def parse_task_message(body: str) -> TaskMessage:
    """The body of a task message; TaskMessageInvalid for anything else."""
    try:
        data = json.loads(body)
    except ValueError:
        raise TaskMessageInvalid("the message's body is not JSON: not a task message") from None
    if not isinstance(data, dict):
        raise TaskMessageInvalid("the message's body is not a JSON object: not a task message")
    result_id, name = data.get("id"), data.get("task")
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    id_field = TaskRecord._meta.get_field("id")
    name_field = TaskRecord._meta.get_field("task_path")
    if not isinstance(result_id, str) or not result_id or len(result_id) > (id_field.max_length or 0):
        raise TaskMessageInvalid(f"the message's 'id' is not a result ID: {str(result_id)[:100]!r}")
    if not isinstance(name, str) or not name or len(name) > (name_field.max_length or 0):
        raise TaskMessageInvalid(f"the message's 'task' is not a task name: {str(name)[:100]!r}")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TaskMessageInvalid("the message's 'args' is not a list or its 'kwargs' not an object")
    return TaskMessage(id=result_id, task=name, args=args, kwargs=kwargs)


class TaskRunner:
    """The processing function the worker's pipeline calls for a task message: runs the task and
    records the attempt in its result. Raising makes the attempt a failed one (the pipeline
    logs it with its traceback and makes the message visible again after a backoff).

    The task is the registered one the message names, for the queue the message came from
    (:meth:`QueueTaskBackend.registered_task`); a message naming anything else fails its
    attempt, and its result ends ``FAILED`` with the error, as a task that raises does."""

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
        queue = message.id.split("/", 1)[0]
        try:
            body = parse_task_message(message.body)
        except TaskMessageInvalid as exc:
            log.warning("message %s on task queue %s: %s", message.id, queue, exc)
            raise
        db = self.backend.database
        record = TaskRecord.objects.using(db).filter(pk=body.id).first()
        if record is not None and (
            record.task_path != body.task or record.queue != queue or record.backend != self.backend.alias
        ):
            # Not the message of that result: running it would run that result's task from a
            # queue it was not sent to, and failing it would change another task's result.
            invalid = TaskMessageInvalid(
                f"the message names task {body.task!r} on queue {queue!r}, but result {record.id} is task "
                f"{record.task_path!r} on queue {record.queue!r} of TASKS[{record.backend!r}]: not run"
            )
            log.warning("message %s: %s", message.id, invalid)
            raise invalid
        if record is None:  # enqueued where its record is not visible: keep one here
            record = TaskRecord.objects.using(db).create(
                id=body.id,
                task_path=body.task,
                backend=self.backend.alias,
                queue=queue,
                args=body.args,
                kwargs=body.kwargs,
                status=TaskResultStatus.READY,
                enqueued_at=getattr(message, "enqueued_at", None),
            )
        if record.status == TaskResultStatus.SUCCESSFUL:
            log.info("task %s already succeeded: a second delivery of its message is not run again", record.id)
            return
        now = timezone.now()
        record.last_attempted_at = now
        record.finished_at = None
        record.worker_ids = [*record.worker_ids, self.worker_id]
        record.message_id = message.id
        try:
            task = self.backend.registered_task(record.task_path, queue)
        except TaskNotRegistered as exc:
            log.warning("message %s: %s; the attempt fails", message.id, exc)
            self._failed(record, _stand_in(record), exc)
            raise
        record.status = TaskResultStatus.RUNNING
        record.started_at = record.started_at or now
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
            self._failed(record, task, exc)
            raise
        record.status = TaskResultStatus.SUCCESSFUL
        record.return_value = value
        record.finished_at = timezone.now()
        record.save(using=db)
        task_finished.send(type(self.backend), task_result=self.backend._result(record, task))

    def _failed(self, record: TaskRecord, task: Task[..., Any], exc: BaseException) -> None:
        record.status = TaskResultStatus.FAILED
        record.errors = [*record.errors, _error(exc)]
        record.finished_at = timezone.now()
        record.save(using=self.backend.database)
        task_finished.send(type(self.backend), task_result=self.backend._result(record, task))
