"""Which tasks framework the workers app's task backend runs on: Django's own (``django.tasks``,
Django 6.0 and later) when there is one, else the django-tasks backport that Django 5.2 needs.

Django 6 names the backport's ``InvalidTaskError`` ``InvalidTask``: the backend and the registry
take it under the old name, and the worker command finds the same backends as they do. Django
6 is stood in for by modules of its names, in a process of their own (the backend's modules are
imported there first).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_DJANGO_6 = textwrap.dedent(
    """
    import sys, types

    import django_tasks
    import django_tasks.backends.base
    import django_tasks.base
    import django_tasks.exceptions
    import django_tasks.signals


    def module(name, **names):
        made = types.ModuleType(name)
        made.__dict__.update(names)
        sys.modules[name] = made
        return made


    class InvalidTask(django_tasks.exceptions.InvalidTaskError):
        "Django 6's name of the error."


    backends = {"elsewhere": object()}
    module(
        "django.tasks",
        TaskContext=django_tasks.TaskContext,
        TaskResult=django_tasks.TaskResult,
        TaskResultStatus=django_tasks.TaskResultStatus,
        task_backends=backends,
    )
    module("django.tasks.base", Task=django_tasks.base.Task, TaskError=django_tasks.base.TaskError)
    module(
        "django.tasks.exceptions",
        InvalidTask=InvalidTask,
        TaskException=django_tasks.exceptions.TaskException,
        TaskResultDoesNotExist=django_tasks.exceptions.TaskResultDoesNotExist,
    )
    module("django.tasks.backends")
    module("django.tasks.backends.base", BaseTaskBackend=django_tasks.backends.base.BaseTaskBackend)
    module(
        "django.tasks.signals",
        task_enqueued=django_tasks.signals.task_enqueued,
        task_finished=django_tasks.signals.task_finished,
        task_started=django_tasks.signals.task_started,
    )

    import django

    django.setup()

    from django.core.management.base import CommandError

    from workers import task_registry, tasks_backend
    from workers.management.commands.mq_tasks_worker import Command

    print("registry:", task_registry.InvalidTaskError is InvalidTask)
    print("backend:", tasks_backend.InvalidTaskError is InvalidTask)
    try:
        Command().handle(backend="elsewhere", queue=[])
    except CommandError as exc:
        print("command:", exc)
    """
)


def test_django_6_tasks_framework_is_taken_when_there_is_one(tmp_path: Path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "MQ_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _DJANGO_6], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "registry: True" in lines
    assert "backend: True" in lines
    # Django's backends, not the backport's: the stand-in's backend is no QueueTaskBackend.
    assert "command: TASKS['elsewhere'] is object, not QueueTaskBackend" in lines
