"""``manage.py mq_tasks_worker``: run the application's ``django.tasks`` tasks from the service's queues.

    QUEUE_API_URL=http://10.0.0.1:8000 QUEUE_API_TOKEN=... python manage.py mq_tasks_worker -c 4

It consumes the queues of a ``TASKS`` backend of :class:`workers.tasks_backend.QueueTaskBackend`
(``--backend``, ``"default"``; ``--queue`` for some of them) with the queue-client pipeline the
Celery step uses (:mod:`workers.pipeline`): ``-c`` slots, each pre-fetching its next message
while it runs one, heartbeats that keep held messages hidden, one attempt-log record per
attempt, a backoff before a failed task runs again and the queue's dead-letter rule after
``max_receives``. It runs the tasks registered for the queue a message came from, which it
learns by importing the backend's task modules (``OPTIONS["modules"]``) at start, and refuses to
start when none of its queues has one. Beside them it relays the outbox rows their writers left
unsent, each as its writer (:func:`workers.outbox.relay`), never with the worker's token, and
sends the messages of held tasks once they are due within the service's delay limit, each as
its writer too (:meth:`~workers.tasks_backend.QueueTaskBackend.release_held`). SIGTERM or SIGINT: the tasks
under way finish, the messages not started are given back, the last attempt records are sent.
"""

from __future__ import annotations

import signal
import threading
import uuid
from argparse import ArgumentParser
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from mq_client import NotFound
from workers import outbox
from workers.handlers import Handler
from workers.pipeline import Pipeline, heartbeat_every
from workers.tasks_backend import QueueTaskBackend, TaskRunner


class Command(BaseCommand):
    help = "Run django.tasks tasks from this service's queues (the TASKS backend's queues)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default: default)")
        parser.add_argument("--queue", action="append", help="a queue of the backend (repeat; default: all of them)")
        parser.add_argument("-c", "--concurrency", type=int, default=1, help="tasks run at once (default 1)")
        parser.add_argument("--no-pipelining", action="store_true", help="take the next message only when one ends")
        parser.add_argument("--wait", type=float, default=2.0, help="long-poll seconds of a dequeue (default 2)")
        parser.add_argument(
            "--retry-backoff",
            type=float,
            default=1.0,
            help="seconds before a failed task runs again, doubled per attempt, at most 300 (default 1)",
        )
        parser.add_argument(
            "--relay-every",
            type=float,
            default=2.0,
            help="seconds between two relays of the outbox and of held tasks (default 2; 0: none)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if TYPE_CHECKING:  # typed against what requirements.txt pins: Django 5.2 with the backport
            from django_tasks import task_backends
        else:
            try:  # Django 6.0 and later: the backends the rest of the app uses (tasks_backend)
                from django.tasks import task_backends
            except ImportError:  # Django 5.2 with the django-tasks backport
                from django_tasks import task_backends

        backend = task_backends[options["backend"]]
        if not isinstance(backend, QueueTaskBackend):
            raise CommandError(f"TASKS[{options['backend']!r}] is {type(backend).__name__}, not QueueTaskBackend")
        queues = options["queue"] or sorted(backend.queues)
        unknown = sorted(set(queues) - backend.queues)
        if unknown:
            raise CommandError(f"not queues of TASKS[{options['backend']!r}]: {', '.join(unknown)}")
        try:
            registered = backend.load_tasks()
        except ImportError as exc:
            raise CommandError(f"TASKS[{options['backend']!r}]['OPTIONS']['modules']: {exc}") from exc
        runnable = {
            name: sorted(set(q) & set(queues)) for name, q in sorted(registered.items()) if set(q) & set(queues)
        }
        if not runnable:
            raise CommandError(
                f"no task is registered for {', '.join(queues)}: list the modules that declare the tasks "
                f"(@task) in TASKS[{options['backend']!r}]['OPTIONS']['modules'] (this project: TASKS_MODULES)"
            )
        client = backend.client
        timeouts = []
        for name in queues:
            try:
                timeouts.append(client.get_queue(name).visibility_timeout)
            except NotFound:
                raise CommandError(
                    f"no queue {name!r} in the service: create it (POST /api/v1/queues) with the rules its tasks "
                    "need (visibility_timeout, max_receives, dead_letter_queue)"
                ) from None
        worker_id = uuid.uuid4().hex
        runner = TaskRunner(backend, worker_id)
        try:
            pipeline = Pipeline(
                client,
                {name: Handler(name, runner) for name in queues},
                queues,
                concurrency=max(1, options["concurrency"]),
                pipelining=not options["no_pipelining"],
                heartbeat_every=heartbeat_every(timeouts),
                wait=options["wait"],
                retry_backoff=options["retry_backoff"],
                consumer_id=worker_id,
                name=f"mq_tasks_worker@{options['backend']}",
                max_held=settings.WORKER_MAX_HELD,
            )
        except ValueError as exc:  # more slots than one heartbeat may list
            raise CommandError(str(exc)) from None
        pipeline.start()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        for name, on in runnable.items():
            self.stdout.write(f"task {name} from {', '.join(on)}")
        self.stdout.write(f"consuming {queues} with {pipeline.concurrency} slots as {worker_id}", ending="\n")
        self.stdout.flush()
        relay_every = options["relay_every"]
        while not stop.wait(relay_every if relay_every > 0 else 3600):
            try:
                outbox.relay(using=backend.database, older_than=backend.relay_after)
            except Exception as exc:  # noqa: BLE001 - the next relay tries again
                self.stderr.write(f"outbox relay: {exc}")
            try:
                backend.release_held()
            except Exception as exc:  # noqa: BLE001 - the next relay tries again
                self.stderr.write(f"held tasks: {exc}")
        pipeline.stop()
        self.stdout.write(f"stopped after {pipeline.processed} tasks")
