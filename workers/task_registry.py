"""The tasks a worker may run: the ``@task`` functions the application declared in its task modules.

A task message names its task by the name Django gives it, the function's module path
(``Task.module_path``, e.g. ``shop.tasks.email_users``); the worker looks that name up here and
nowhere else. What a message names is never imported: the registry is filled by the application's
own code, when the modules listed in the backend's ``OPTIONS["modules"]`` are imported (at the
worker's start, and on first need in any other process of the application).

- A task is *declared* when the ``@task`` decorator of a :class:`~workers.tasks_backend.QueueTaskBackend`
  backend makes it (the backend's ``task_class`` calls :func:`declare`); ``task.using(...)`` makes
  copies, which declare nothing.
- It is *registered* for a backend when it is declared with that backend's alias in one of the
  backend's modules or in a module under one (``shop.tasks`` covers ``shop.tasks.emails``), so a
  producer and a worker configured alike agree on what runs, whatever else each has imported.
- It is registered for its ``queue_name`` and for the queues :func:`allow_queues` adds, and runs
  from those queues only: a sender who may use one queue cannot run a task meant for another.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from queues.errors import NotFound, Refused

if TYPE_CHECKING:  # typed against what requirements.txt pins: Django 5.2 with the backport
    from django_tasks.base import Task
    from django_tasks.exceptions import InvalidTaskError, TaskException
else:
    try:  # Django 6.0 and later, which names the error InvalidTask
        from django.tasks.base import Task
        from django.tasks.exceptions import InvalidTask as InvalidTaskError
        from django.tasks.exceptions import TaskException
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks.base import Task
        from django_tasks.exceptions import InvalidTaskError, TaskException


class TaskNotRegistered(NotFound, TaskException):
    """A task message names no task registered for its backend and queue: the attempt fails and
    the task's result ends ``FAILED`` with this error; nothing the message names is imported."""

    code = "task_not_registered"


class TaskMessageInvalid(Refused, TaskException):
    """A message on a task queue that is not a task message (its body is not one), or that names
    another task's result: the attempt fails and no result is touched."""

    code = "invalid_task_message"


@dataclass
class Declaration:
    #: the task as ``@task`` made it
    task: Task[..., Any]
    #: the queues its messages may come from: its ``queue_name`` and those :func:`allow_queues` added
    queues: set[str] = field(default_factory=set)


_declared: dict[str, Declaration] = {}
_lock = threading.Lock()


def declare(task: Task[..., Any]) -> None:
    """Record ``task`` as declared, under its module path (called for every task the backend's
    ``task_class`` makes). A task of the same function is a copy made by ``using()`` and declares
    nothing; another function under the same path (its module imported again) replaces it."""
    path = task.module_path
    with _lock:
        known = _declared.get(path)
        if known is not None and known.task.func is task.func:
            return
        _declared[path] = Declaration(task, {task.queue_name})


def allow_queues(task: Task[..., Any], *queues: str) -> None:
    """Let ``task`` run from ``queues`` too, beside its ``queue_name``, so that
    ``task.using(queue_name=...)`` may send it there. Call it beside the declaration, in the
    task's module, so that every process that imports the module agrees::

        @task(queue_name="emails")
        def email_users(emails, subject, message): ...

        allow_queues(email_users, "emails-bulk")

    InvalidTaskError for a task not declared with a ``QueueTaskBackend`` backend."""
    with _lock:
        known = _declared.get(task.module_path)
        if known is None or known.task.func is not task.func:
            raise InvalidTaskError(f"{task.module_path} is not a task of a QueueTaskBackend backend")
        for queue in queues:
            if not isinstance(queue, str) or not queue:
                raise InvalidTaskError(f"allow_queues({task.module_path}) takes queue names, not {queue!r}")
        known.queues.update(queues)


def in_modules(module: str, modules: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``modules`` or under one of them."""
    return any(module == m or module.startswith(f"{m}.") for m in modules)


def registered(path: str, *, backend: str, modules: tuple[str, ...]) -> Declaration | None:
    """The declaration of the task named ``path``, if it is registered for ``backend`` (whose task
    modules are ``modules``); None otherwise. A lookup: nothing is imported."""
    with _lock:
        known = _declared.get(path)
    if known is None or known.task.backend != backend or not in_modules(known.task.func.__module__, modules):
        return None
    return known


def registered_tasks(*, backend: str, modules: tuple[str, ...]) -> dict[str, set[str]]:
    """The tasks registered for ``backend``: their names and queues."""
    with _lock:
        found = list(_declared.items())
    return {
        path: set(d.queues)
        for path, d in found
        if d.task.backend == backend and in_modules(d.task.func.__module__, modules)
    }
