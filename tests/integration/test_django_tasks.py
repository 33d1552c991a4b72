"""Django's tasks framework on a real node, a real ``manage.py mq_tasks_worker``, and enqueues
that follow the caller's transaction (``workers.tasks_backend``, ``workers.outbox``).

The application here is this project on the test database (PostgreSQL under ``make test``):
the test process enqueues, a worker process runs the tasks, and both read the results.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token

from mq_client import Client as SDK
from mq_client.errors import ApiError
from queues import service
from queues.access import SYSTEM
from queues.errors import QueueNotFound
from queues.models import AuditEntry, Node, Partition, Queue
from queues.service import PeerUnreachable, RemoteError
from tests.integration.nodes import Client, database_url
from tests.integration.tasks_for_tests import email_users, fails
from tests.integration.tasks_not_in_the_worker import left_behind
from tests.launcher import ROOT, wait_until
from workers.models import AttemptLog, OutboxMessage, TaskRecord
from workers.outbox import GIVEN_UP_CLAIM, WriterRefused, enqueue_on_commit, relay, send_row
from workers.task_registry import TaskMessageInvalid, TaskNotRegistered, allow_queues
from workers.tasks_backend import SEND_AHEAD, TaskRunner

try:
    from django.tasks import TaskResultStatus
    from django.tasks.exceptions import InvalidTaskError
    from django.tasks.signals import task_finished
except ImportError:
    from django_tasks import TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError
    from django_tasks.signals import task_finished

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BACKEND = "workers.tasks_backend.QueueTaskBackend"
#: The task modules of this process: ``tasks_not_in_the_worker`` is not the worker's.
MODULES = ["tests.integration.tasks_for_tests", "tests.integration.tasks_not_in_the_worker"]
#: The task modules of the worker: ``tasks_on_plain`` declares a task of the queue ``plain``.
WORKER_MODULES = "tests.integration.tasks_for_tests,tests.integration.tasks_on_plain"


@pytest.fixture
def tasks(settings, node, token):
    """This process's TASKS: the node's queues ``default`` and ``plain``; ``tasks(outbox=...)``
    sets it again with other options."""

    def configure(**options) -> None:
        settings.TASKS = {
            "default": {
                "BACKEND": BACKEND,
                "QUEUES": ["default", "plain"],
                "OPTIONS": {"url": node.url, "token": token, "modules": MODULES, **options},
            }
        }

    configure()
    return configure


@pytest.fixture
def app_env(tmp_path, node, token) -> dict[str, str]:
    """The environment of another process of the application (a worker, a producer)."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MQ_DATA_DIR": str(tmp_path / "app-data"),
        "QUEUE_API_URL": node.url,
        "QUEUE_API_TOKEN": token,
        # the nodes': a relay has them store a row with a call signed for its writer
        "CLUSTER_SECRET": settings.CLUSTER_SECRET,
        "TASKS_QUEUES": "default,plain",
        "TASKS_MODULES": WORKER_MODULES,
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(tmp_path / "mail"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@pytest.fixture
def tasks_worker(tmp_path, app_env):
    """``manage.py mq_tasks_worker --queue default`` on demand (``start(*args, **env)``), killed at the end."""
    procs: list[subprocess.Popen] = []
    log_path = tmp_path / "tasks-worker.log"

    def start(*args: str, **extra_env: str) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "mq_tasks_worker", "--queue", "default", "--wait", "0.5", *args],
                cwd=ROOT,
                env={**app_env, **extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(proc)
        wait_until(lambda: "consuming [" in log_path.read_text() or proc.poll() is not None, 30, "the worker")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        return proc

    yield start
    for proc in procs:  # killed: what it holds comes back after its visibility timeout
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _create_queue(api: Client, **fields) -> None:
    r = api.post("queues", fields)
    assert r.status_code == 201, r.text
    wait_until(
        lambda: all(p["owner"] for p in api.get(f"queues/{fields['name']}/partitions").json()["partitions"]),
        20,
        f"the node to own every partition of {fields['name']}",
    )


def _bodies(api: Client, queue: str) -> list[str]:
    """Every message in ``queue`` now, taken and acked."""
    bodies: list[str] = []
    while True:
        got = api.post(f"queues/{queue}/dequeue", {"max": 100, "wait": 0}).json()["messages"]
        if not got:
            return bodies
        bodies += [m["body"] for m in got]
        r = api.post(f"queues/{queue}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
        assert r.status_code == 200, r.text


def _app_process(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m module``, a process of the application, to its end."""
    return subprocess.run(
        [sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _depth(api: Client, queue: str) -> int:
    return api.get(f"queues/{queue}/stats").json()["depth"]


@pytest.mark.urls("tests.integration.tasks_for_tests")
def test_djangos_example_runs_on_the_worker_and_a_failing_task_ends_in_the_dead_letters(
    node_api, tasks, tasks_worker, client, admin_client, tmp_path
):
    # given the queue "default" (two receives, then its dead-letter queue) and a worker of it
    _create_queue(node_api, name="default-dead")
    _create_queue(node_api, name="default", visibility_timeout=10, max_receives=2, dead_letter_queue="default-dead")
    worker = tasks_worker("--retry-backoff", "0.2")

    # when a view enqueues Django's example task
    r = client.get("/send-email/")
    assert r.status_code == 200, r.content
    result_id = r.json()["result_id"]

    # then the worker ran it, and this process reads its result by ID
    wait_until(lambda: email_users.get_result(result_id).is_finished, 30, "the task to finish")
    result = email_users.get_result(result_id)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == 1  # send_mail's count of messages sent
    assert result.kwargs == {"emails": ["user@example.com"], "subject": "You have a message", "message": "Hello there!"}
    mail = "".join(p.read_text() for p in (tmp_path / "mail").iterdir())
    assert "Subject: You have a message" in mail and "Hello there!" in mail
    # ...and the attempt log's record of it is the result's one attempt
    wait_until(lambda: email_users.get_result(result_id).attempt_log, 10, "the attempt record")
    result = email_users.get_result(result_id)
    assert [(a["attempt"], a["outcome"]) for a in result.attempt_log] == [(1, "succeeded")]
    assert result.attempts == 1 and result.worker_ids == [result.attempt_log[0]["worker"]]

    # when a task raises, at each of the queue's two receives
    failing = fails.enqueue("boom")

    # then it lands in the dead-letter queue...
    wait_until(lambda: _depth(node_api, "default-dead") == 1, 30, "the dead letter")
    assert _depth(node_api, "default") == 0
    # ...its result shows both failures with their tracebacks...
    wait_until(
        lambda: [a["outcome"] for a in fails.get_result(failing.id).attempt_log] == ["failed", "failed"],
        10,
        "two failed attempts in the log",
    )
    result = fails.get_result(failing.id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]
    assert all("ValueError: this task fails: boom" in e.traceback for e in result.errors)
    assert [(a["attempt"], a["outcome"]) for a in result.attempt_log] == [(1, "failed"), (2, "failed")]
    assert result.attempts == 2
    # ...and the console's page of an attempt shows the traceback
    record = AttemptLog.objects.filter(message_id=TaskRecord.objects.get(pk=failing.id).message_id).first()
    page = admin_client.get(f"/admin/workers/attemptlog/{record.pk}/change/").content.decode()
    assert "ValueError: this task fails: boom" in page
    assert "raise ValueError" in page

    # when the worker is told to stop, it stops cleanly
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_enqueue_on_commit_sends_nothing_on_a_rollback_and_loses_nothing_to_a_kill_after_commit(
    node_api, tasks, tasks_worker, app_env
):
    """One node for every part (PostgreSQL with and without the outbox, SQLite, a kill): they
    need the same queues, and a node costs seconds."""
    # given the queues "default" (tasks) and "plain" (the SDK's messages)
    _create_queue(node_api, name="default")
    _create_queue(node_api, name="plain")

    # --- a rollback sends nothing -------------------------------------------------------------
    sdk = SDK(node_api.base, node_api.session.headers["Authorization"].split()[1])
    assert connection.vendor == "postgresql", "the outbox is PostgreSQL's (make test runs on it)"
    for outbox in (True, False):  # PostgreSQL's outbox, and transaction.on_commit alone (other databases)
        tasks(outbox=outbox)
        # when a transaction enqueues a task and a message and rolls back
        with pytest.raises(RuntimeError), transaction.atomic():
            dropped = email_users.enqueue(["a@example.com"], "dropped", "dropped")
            enqueue_on_commit("plain", ["dropped"], client=sdk, outbox=outbox)
            raise RuntimeError("roll back")
        # and another one commits
        with transaction.atomic():
            kept = email_users.enqueue(["a@example.com"], "kept", "kept")
            enqueue_on_commit("plain", [f"kept {outbox}"], client=sdk, outbox=outbox)
            assert _depth(node_api, "plain") == 0, "sent before the commit"

        # then only the committed ones were sent, and nothing of the other is left anywhere
        assert _bodies(node_api, "plain") == [f"kept {outbox}"]
        assert [kept.id in body for body in _bodies(node_api, "default")] == [True]
        assert not TaskRecord.objects.filter(pk=dropped.id).exists()
        assert TaskRecord.objects.filter(pk=kept.id).exists()
        assert not OutboxMessage.objects.exists()

    # --- the same on SQLite (on_commit alone), in a process of its own ---------------------------
    sqlite_env = {**app_env, "DATABASE_URL": f"sqlite:///{app_env['MQ_DATA_DIR']}/app.sqlite3"}
    os.makedirs(app_env["MQ_DATA_DIR"], exist_ok=True)
    proc = _app_process("tests.integration.enqueue_on_sqlite", sqlite_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sqlite_task = proc.stdout.split()[-1]
    assert _bodies(node_api, "plain") == ["kept on sqlite"]
    assert [sqlite_task in body for body in _bodies(node_api, "default")] == [True]

    # --- a process killed after its commit loses nothing --------------------------------------
    # when a process commits a message's and a task's enqueue and dies at once (SIGKILL, from a commit hook)
    proc = _app_process("tests.integration.enqueue_and_die", app_env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    key, task_id = proc.stdout.split()
    # then nothing was sent, and the outbox holds both
    assert _depth(node_api, "plain") == _depth(node_api, "default") == 0
    assert OutboxMessage.objects.count() == 2 and OutboxMessage.objects.filter(pk=key).exists()
    assert TaskRecord.objects.get(pk=task_id).status == TaskResultStatus.READY

    # when a worker starts, its relay sends them (rows older than OUTBOX_RELAY_AFTER)
    tasks_worker("--relay-every", "0.2", OUTBOX_RELAY_AFTER="0.5")

    # then the task ran, the message is in its queue once, and the outbox is empty
    wait_until(lambda: email_users.get_result(task_id).is_finished, 30, "the relayed task")
    assert email_users.get_result(task_id).status == TaskResultStatus.SUCCESSFUL
    wait_until(lambda: _depth(node_api, "plain") == 1, 10, "the relayed message")
    assert _bodies(node_api, "plain") == ["left at the commit"]
    assert not OutboxMessage.objects.exists()


def _token_of_new_user() -> str:
    """The API token of a new user: the writer an outbox row records."""
    return Token.objects.create(user=User.objects.create(username=f"w-{uuid.uuid4().hex[:8]}")).key


def _send_task(sdk: SDK, queue: str, name: str, *args) -> str:
    """A task message sent by a producer of ``queue``, naming ``name``, in the body's format of
    every version (earlier ones named the module to import there); the result's ID."""
    result_id = uuid.uuid4().hex
    body = {"id": result_id, "task": name, "backend": "default", "args": list(args), "kwargs": {}}
    sdk.enqueue(queue, json.dumps(body), dedup_id=result_id)
    return result_id


def test_a_worker_runs_only_the_tasks_registered_for_the_queue_and_the_rest_ends_failed(
    node_api, tasks, tasks_worker, tmp_path
):
    # given the queue "default" (two receives, then its dead-letter queue) and a worker of it, whose
    # task modules register mail_from_plain for the queue "plain" and not this process's left_behind
    _create_queue(node_api, name="default-dead")
    _create_queue(node_api, name="default", visibility_timeout=10, max_receives=2, dead_letter_queue="default-dead")
    imported = tmp_path / "imported"
    worker = tasks_worker("--retry-backoff", "0.2", MQ_TEST_IMPORTED=str(imported))
    sdk = SDK(node_api.base, node_api.session.headers["Authorization"].split()[1])
    backend = email_users.get_backend()

    # when a producer of "default" sends a message naming a module, and one naming a task of "plain"
    by_module = _send_task(sdk, "default", "tests.integration.imported_by_name.run")
    from_plain = _send_task(sdk, "default", "tests.integration.tasks_on_plain.mail_from_plain", "sent through default")
    # ...and this process enqueues a task whose module the worker does not have
    left = left_behind.enqueue(7)

    # then each fails its two attempts and lands in the dead-letter queue
    wait_until(lambda: _depth(node_api, "default-dead") == 3, 60, "three dead letters")
    assert _depth(node_api, "default") == 0
    # ...nothing a message named was imported or run, in the worker or here
    assert not imported.exists(), imported.read_text()
    assert not any("sent from plain" in p.read_text() for p in (tmp_path / "mail").glob("*"))
    assert "tests.integration.imported_by_name" not in sys.modules
    # ...and each result ended FAILED with its error, read from this process
    expected = {
        by_module: ("tests.integration.imported_by_name.run", "no task 'tests.integration.imported_by_name.run'"),
        from_plain: (
            "tests.integration.tasks_on_plain.mail_from_plain",
            "runs from queue(s) plain, not from 'default'",
        ),
        left.id: ("tests.integration.tasks_not_in_the_worker.left_behind", "is registered for TASKS['default']"),
    }
    for result_id, (name, why) in expected.items():
        wait_until(
            lambda result_id=result_id: (
                [a["outcome"] for a in backend.get_result(result_id).attempt_log] == ["failed", "failed"]
            ),
            10,
            f"two failed attempts of {name} in the log",
        )
        result = backend.get_result(result_id)
        assert (result.status, result.is_finished, result.attempts) == (TaskResultStatus.FAILED, True, 2)
        assert result.task.module_path == name
        assert [e.exception_class for e in result.errors] == [TaskNotRegistered, TaskNotRegistered]
        assert all(why in e.traceback for e in result.errors), result.errors[0].traceback
        assert all(why in a["error"] for a in result.attempt_log)
        assert result.started_at is None  # never started
    assert left_behind.get_result(left.id).status == TaskResultStatus.FAILED
    assert "tests.integration.imported_by_name" not in sys.modules

    # when a registered task of the queue is enqueued, the same worker still runs it
    ok = email_users.enqueue(["a@example.com"], "registered", "m")
    wait_until(lambda: email_users.get_result(ok.id).is_finished, 30, "the registered task")
    assert email_users.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_run_after_at_any_time_ahead_is_held_and_sent_when_due_and_a_failed_enqueue_leaves_nothing(
    node_api, tasks, tasks_worker
):
    # --- an enqueue that raised leaves no result; one whose commit raised ends FAILED ---------------
    # given no queue "default" yet, and enqueues sent without the outbox (transaction.on_commit)
    tasks(outbox=False)
    # when an enqueue outside a transaction is refused by the node
    with pytest.raises(ApiError) as refused:
        email_users.enqueue(["a@example.com"], "refused", "m")
    # then it raised the node's error and left nothing behind
    assert refused.value.code == "queue_not_found"
    assert not TaskRecord.objects.exists()
    # when an enqueue inside a transaction is refused at the commit
    with pytest.raises(ApiError), transaction.atomic():
        at_commit = email_users.enqueue(["a@example.com"], "refused at the commit", "m")
    # then the committed result says why the task will not run
    result = email_users.get_result(at_commit.id)
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    assert [e.exception_class_path for e in result.errors] == ["mq_client.errors.NotFound"]

    # --- an hour ahead: no error, held in the database, nothing sent --------------------------------
    _create_queue(node_api, name="default")
    in_an_hour = datetime.now(UTC) + timedelta(hours=1)
    later = []
    for outbox in (True, False):
        tasks(outbox=outbox)
        later.append(email_users.using(run_after=in_an_hour).enqueue(["a@example.com"], "in an hour", "m"))
        with transaction.atomic():
            later.append(email_users.using(run_after=in_an_hour).enqueue(["a@example.com"], "in an hour", "m"))
    for result in later:
        assert email_users.get_result(result.id).status == TaskResultStatus.READY
        assert TaskRecord.objects.get(pk=result.id).held_until == in_an_hour - timedelta(seconds=SEND_AHEAD)
    assert _depth(node_api, "default") == 0 and not OutboxMessage.objects.exists()

    # --- held until due, then sent by whichever worker runs, across a restart ------------------------
    # given a worker, and a backend that sends a held task's message 2 s before its run_after
    first = tasks_worker("--relay-every", "0.2")
    tasks(send_ahead=2)
    run_after = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=7)
    # when a task due in about 7 s is enqueued
    soon = email_users.using(run_after=run_after).enqueue(["a@example.com"], "when due", "m")
    # then it is held, its message not sent
    held_until = TaskRecord.objects.get(pk=soon.id).held_until
    assert held_until == run_after - timedelta(seconds=2)
    assert _depth(node_api, "default") == 0
    # when that worker dies before it is due and another starts
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    tasks_worker("--relay-every", "0.2")
    # then the new worker sent its message once due and it ran at its run_after, not before
    wait_until(lambda: email_users.get_result(soon.id).is_finished, 30, "the held task")
    result = email_users.get_result(soon.id)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.started_at >= run_after
    record = TaskRecord.objects.get(pk=soon.id)
    assert record.held_until is None
    wait_until(lambda: AttemptLog.objects.filter(message_id=record.message_id).exists(), 10, "the attempt record")
    sent_at = AttemptLog.objects.get(message_id=record.message_id).enqueued_at
    assert sent_at >= held_until - timedelta(seconds=0.5), (sent_at, held_until)
    # ...and the tasks due in an hour are still held, nothing of them sent
    assert all(TaskRecord.objects.get(pk=r.id).held_until is not None for r in later)
    assert _depth(node_api, "default") == 0


def test_the_worker_refuses_to_start_without_registered_tasks_or_with_a_missing_module(settings):
    from django.core.management import CommandError, call_command

    # given a backend whose task modules declare nothing, then one naming a module that is not there
    for modules, refusal in (
        (["tests.launcher"], "no task is registered for default"),
        (["tests.integration.no_such_tasks"], "No module named 'tests.integration.no_such_tasks'"),
    ):
        settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"modules": modules}}}
        # then the worker says so and does not start
        with pytest.raises(CommandError, match=re.escape(refusal)):
            call_command("mq_tasks_worker", "--queue", "default")


class _Recorder:
    """A stand-in for the SDK's client that keeps what it is asked to enqueue."""


class _Recorder:
    """A stand-in for the SDK's client that keeps what it is asked to enqueue, with the token of
    a new user (the writer of the outbox rows it writes); called with a row, it is a relay's
    ``send`` that keeps what it is asked to send."""

    def __init__(self, token: str | None = None):
        self.calls: list[tuple[str, list[dict]]] = []
        self.token = token or _token_of_new_user()

    def enqueue_batch(self, queue, items):
        self.calls.append((queue, list(items)))
        return [f"{queue}/0/00000000-0000000000000000/{i}" for i in range(len(items))]

    def __call__(self, row):
        return self.enqueue_batch(row.queue, row.messages)


@pytest.mark.django_db  # in a transaction rolled back at the end: no node sees it
def test_a_task_is_one_message_with_its_arguments_and_run_after_and_runs_once(
    settings, mailoutbox, django_capture_on_commit_callbacks
):
    # given the backend with a recording client
    settings.TASKS = {
        "default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"token": "t", "modules": MODULES}}
    }
    backend = email_users.get_backend()
    backend._client = recorder = _Recorder()
    run_after = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)

    # when a task is enqueued with a priority and run_after (within the service's delay limit)
    with django_capture_on_commit_callbacks(execute=True):
        result = email_users.using(priority=5, run_after=run_after).enqueue(("a@example.com",), "s", message="m")

    # then one message carries it, deduplicated by the result's ID and hidden until run_after
    [(queue, [item])] = recorder.calls
    assert queue == "default"
    assert json.loads(item["body"]) == {
        "id": result.id,
        "task": "tests.integration.tasks_for_tests.email_users",
        "backend": "default",
        "args": [["a@example.com"], "s"],
        "kwargs": {"message": "m"},
    }
    assert item["dedup_id"] == result.id
    assert item["not_before"] == run_after.isoformat()
    assert item["attributes"] == {"task": "tests.integration.tasks_for_tests.email_users", "priority": 5}
    stored = email_users.get_result(result.id)
    assert (stored.status, stored.task.priority, stored.task.run_after) == (TaskResultStatus.READY, 5, run_after)
    assert TaskRecord.objects.get(pk=result.id).held_until is None

    # when a worker runs its message twice (a second delivery)
    message = SimpleNamespace(id="default/0/00000000-0000000000000000/0", body=item["body"], enqueued_at=None)
    TaskRunner(backend, "worker-1")(message, None)
    TaskRunner(backend, "worker-2")(message, None)

    # then it ran once, and its result says so
    assert len(mailoutbox) == 1
    done = email_users.get_result(result.id)
    assert (done.status, done.return_value, done.worker_ids) == (TaskResultStatus.SUCCESSFUL, 1, ["worker-1"])


@pytest.mark.django_db
def test_a_task_is_enqueued_only_where_a_worker_would_run_it(settings):
    # given a backend whose task modules are this test's, with the queues "default" and "other"
    both = {"BACKEND": BACKEND, "QUEUES": ["default", "other"], "OPTIONS": {"token": "t", "modules": MODULES}}
    settings.TASKS = {"default": both}
    email_users.get_backend()._client = recorder = _Recorder()

    # then a queue outside QUEUES is refused as Django refuses it...
    with pytest.raises(InvalidTaskError, match="not valid"):
        email_users.using(queue_name="elsewhere")
    # ...a queue of the backend the task was not declared for is refused at the enqueue...
    with pytest.raises(InvalidTaskError, match=r"runs from queue\(s\) default, not from 'other'"):
        email_users.using(queue_name="other").enqueue(["a@example.com"], "s", "m")
    # ...and so is a task outside the task modules (no worker would run it), and nothing is written
    settings.TASKS = {"default": {**both, "OPTIONS": {"token": "t"}}}
    email_users.get_backend()._client = recorder
    with pytest.raises(InvalidTaskError, match="not in the task modules"):
        email_users.enqueue(["a@example.com"], "s", "m")
    assert not TaskRecord.objects.exists() and recorder.calls == []

    # when the task's module lets it run from another queue too
    settings.TASKS = {"default": both}
    backend = email_users.get_backend()
    backend._client = _Recorder()
    try:
        allow_queues(email_users, "other")
        # then it is enqueued there, and a worker of that queue finds it
        email_users.using(queue_name="other").enqueue(["a@example.com"], "s", "m")
        assert backend.registered_task(email_users.module_path, "other").func is email_users.func
    finally:
        _registered_queues(email_users).discard("other")
    # ...while the copies using() makes declare nothing: the task runs from its own queue only
    assert backend.load_tasks()[email_users.module_path] == {"default"}
    with pytest.raises(TaskNotRegistered, match="not from 'other'"):
        backend.registered_task(email_users.module_path, "other")


def _registered_queues(task) -> set[str]:
    from workers import task_registry

    return task_registry._declared[task.module_path].queues


@pytest.mark.django_db
def test_a_celery_task_delayed_on_commit_is_sent_only_if_the_transaction_commits(
    settings, django_capture_on_commit_callbacks
):
    # given this project's Celery app and its broker (Redis under make test)
    from celery.signals import after_task_publish

    from queues.tasks import expire

    sent: list[str] = []

    def published(sender=None, headers=None, **kwargs):
        sent.append(headers["id"])

    after_task_publish.connect(published, weak=False)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            # when one transaction delays a task on commit and rolls back, and another commits
            with pytest.raises(RuntimeError), transaction.atomic():
                expire.delay_on_commit()
                raise RuntimeError("roll back")
            with transaction.atomic():
                expire.delay_on_commit()
            assert sent == [], "sent before the commit"
    finally:
        after_task_publish.disconnect(published)
        _forget_celery_messages(settings.CELERY_BROKER_URL, sent)
    # then the committed one alone reached the broker
    assert len(sent) == 1


def _forget_celery_messages(broker_url: str, ids: list[str]) -> None:
    """Take the test's messages off a Redis broker's default queue: no worker of this test runs them."""
    if not broker_url.startswith("redis://"):
        return
    import redis

    client = redis.Redis.from_url(broker_url)
    try:
        for raw in client.lrange("celery", 0, -1):
            if any(i.encode() in raw for i in ids):
                client.lrem("celery", 1, raw)
    finally:
        client.close()


class _Refusing(_Recorder):
    """A stand-in client that refuses every message of queue ``gone``, as for a deleted queue
    (as a relay's ``send``, as the service refuses it)."""

    def enqueue_batch(self, queue, items):
        if queue == "gone":
            raise ApiError(404, "queue_not_found", "no queue 'gone'")
        return super().enqueue_batch(queue, items)

    def __call__(self, row):
        if row.queue == "gone":
            raise QueueNotFound("gone")
        return super().__call__(row)


@pytest.mark.django_db
def test_rows_the_service_refuses_do_not_hold_up_the_outbox():
    # given outbox rows left after their commit: three to a queue that is gone, then one to a queue that is there
    old = datetime.now(UTC) - timedelta(minutes=5)
    for i in range(3):
        OutboxMessage.objects.create(
            id=f"gone-{i}", queue="gone", messages=[{"body": "x"}], created_at=old + timedelta(seconds=i)
        )
    OutboxMessage.objects.create(
        id="kept", queue="plain", messages=[{"body": "y"}], created_at=old + timedelta(seconds=9)
    )
    client = _Refusing()
    # when relays that take two rows each run twice
    relay(older_than=0, limit=2, send=client)
    relay(older_than=0, limit=2, send=client)
    # then the row behind the refused ones was sent, and the refused ones are kept with their errors
    assert client.calls == [("plain", [{"body": "y"}])]
    assert sorted(OutboxMessage.objects.values_list("pk", "failures")) == [("gone-0", 1), ("gone-1", 1), ("gone-2", 1)]


class _ProbingSender(_Recorder):
    """A stand-in client that, during its send, looks at the sender's connection and has
    another connection (a thread of its own) lock the row and try to send it too."""

    def __init__(self, key_of):
        super().__init__()
        self.key_of = key_of
        self.seen: dict[str, object] = {}

    def enqueue_batch(self, queue, items):
        import psycopg
        from django.db import connection as mine

        key = self.key_of()
        self.seen["in_atomic_block"] = mine.in_atomic_block
        self.seen["transaction_status"] = mine.connection.info.transaction_status
        other = _Recorder(token="not-a-writer")

        def elsewhere() -> None:
            try:
                with transaction.atomic():
                    # NOWAIT: a lock the sender held would raise here
                    OutboxMessage.objects.select_for_update(nowait=True).get(pk=key)
                    OutboxMessage.objects.filter(pk=key).update(last_error="touched while sending")
                self.seen["second_sender_sent"] = send_row(other, key)
                self.seen["relayed"] = relay(older_than=0, send=other)
            except BaseException as exc:  # noqa: BLE001 - asserted in the test's thread
                self.seen["error"] = exc
            finally:
                connection.close()

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join(30)
        self.seen["other_calls"] = other.calls
        self.seen["idle"] = psycopg.pq.TransactionStatus.IDLE
        return super().enqueue_batch(queue, items)


def test_an_outbox_send_holds_no_transaction_or_lock_and_one_sender_has_the_row():
    # given an enqueue on commit, through the outbox, whose client probes the database during its send
    keys: list[str] = []
    sender = _ProbingSender(lambda: keys[0])

    # when the transaction commits and the row is sent
    with transaction.atomic():
        keys.append(enqueue_on_commit("plain", ["sent once"], client=sender, outbox=True))

    # then the send ran outside any transaction of the sender's connection...
    assert "error" not in sender.seen, sender.seen.get("error")
    assert sender.seen["in_atomic_block"] is False
    assert sender.seen["transaction_status"] == sender.seen["idle"]
    # ...another connection locked and updated the row meanwhile (NOWAIT: no lock was held)...
    # ...and neither a second sender nor a relay sent the claimed row
    assert sender.seen["second_sender_sent"] is False and sender.seen["relayed"] == 0
    assert sender.seen["other_calls"] == []
    assert [(q, [i["body"] for i in items]) for q, items in sender.calls] == [("plain", ["sent once"])]
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_a_failed_send_gives_its_claim_up_for_the_relay():
    # given an outbox row whose writer's send failed
    old = datetime.now(UTC) - timedelta(minutes=5)
    OutboxMessage.objects.create(id="refused", queue="gone", messages=[{"body": "x"}], created_at=old)
    with pytest.raises(ApiError):
        send_row(_Refusing(), "refused")
    # then it is not claimed, its failure is noted, and a relay takes it
    row = OutboxMessage.objects.get(pk="refused")
    assert (row.claimed_until, row.failures) == (None, 1)
    OutboxMessage.objects.filter(pk="refused").update(queue="plain")
    client = _Recorder()
    assert relay(older_than=0, send=client) == 1
    assert client.calls == [("plain", [{"body": "x"}])]


@pytest.mark.django_db
def test_a_relayed_outbox_row_continues_its_writers_trace():
    from opentelemetry.sdk.trace import TracerProvider

    from mq_client import tracing

    # given an enqueue on commit made inside a span, whose writer dies before it sends
    tracer = tracing.tracer(TracerProvider())
    with tracer.start_as_current_span("request") as span, transaction.atomic():
        key = enqueue_on_commit("plain", [{"body": "x", "attributes": {"k": "v"}}], client=_Dead(), outbox=True)
    # when a relay sends the row, outside any span
    client = _Recorder()
    assert relay(older_than=0, send=client) == 1
    # then the message carries the writer's span as its trace context, beside its own attributes
    ((_, items),) = client.calls
    ctx = span.get_span_context()
    assert items[0]["attributes"]["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert items[0]["attributes"]["k"] == "v"
    assert items[0]["dedup_id"] == key


class _Dead(_Recorder):
    """A writer that dies after its commit, before its send reaches the service (``token``: its
    API token; by default a new user's)."""

    def enqueue_batch(self, queue, items):
        raise ConnectionError("the writer died")


@pytest.mark.django_db
def test_a_row_refused_as_its_writer_is_given_up_kept_and_never_sent_again():
    # given two rows left after their commit, the older one refused as its writer
    old = datetime.now(UTC) - timedelta(minutes=5)
    for i, key in enumerate(("refused", "sent")):
        OutboxMessage.objects.create(
            id=key, queue="plain", messages=[{"body": key}], created_at=old + timedelta(seconds=i), writer_id=1
        )
    recorder = _Recorder(token="unused")

    def send(row):
        if row.pk == "refused":
            raise WriterRefused("'w' may not produce 'plain'")
        return recorder(row)

    # when a relay runs
    assert relay(older_than=0, send=send) == 1

    # then the refused row is given up with its reason, and the one behind it was sent
    row = OutboxMessage.objects.get(pk="refused")
    assert row.given_up_reason == "'w' may not produce 'plain'" and row.given_up_at is not None
    assert (row.failures, row.claimed_until) == (0, GIVEN_UP_CLAIM)
    assert recorder.calls == [("plain", [{"body": "sent"}])]
    # and no relay, nor a sender of an earlier version's kind (by the claim alone), takes it again
    assert relay(older_than=0, send=recorder) == 0
    assert send_row(recorder, "refused") is False
    assert recorder.calls == [("plain", [{"body": "sent"}])]


class _Peers:
    """A stand-in for the nodes: answers each enqueue with the next of ``answers`` (an
    exception to raise, or None: stored), and keeps what it was asked."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked: list[tuple] = []

    def enqueue(self, address, queue, drafts, hops, caller):
        self.asked.append((address, queue, [(d.body, d.dedup_id) for d in drafts], hops, caller.user_id))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return [f"{queue}/0/00000000-0000000000000000/{i}" for i in range(len(drafts))]


@pytest.fixture
def peers():
    """``install(peers)``: the service's transport to the nodes for the test."""
    previous = service.get_peers()
    yield service.set_peers
    service.set_peers(previous)


@pytest.mark.django_db
def test_the_relay_asks_a_live_node_for_the_writer_and_its_own_check_alone_gives_a_row_up(peers):
    # given a queue with a partition owned by a live node, another live node and a silent one
    now = timezone.now()
    owner, _, silent = (
        Node.objects.create(
            id=f"n{i}", address=f"10.0.0.{i}:8000", started_at=now, heartbeat_at=now - timedelta(seconds=age)
        )
        for i, age in ((1, 0), (2, 1), (3, 600))
    )
    orders = Queue.objects.create(name="orders", partitions=2)
    Partition.objects.create(queue=orders, index=0, owner=owner)
    Partition.objects.create(queue=orders, index=1, owner=silent)
    # and a writer who may produce to it, with three rows left after their commit
    writer = User.objects.create(username="writer")
    service.grant(caller=SYSTEM, action="produce", user=writer, queue=orders)
    old = now - timedelta(minutes=5)
    for i, key in enumerate(("stored", "refused", "later")):
        OutboxMessage.objects.create(
            id=key,
            queue="orders",
            messages=[{"body": key, "dedup_id": key}],
            created_at=old + timedelta(seconds=i),
            writer_id=writer.pk,
        )

    # when a relay runs while the owner refuses the first row's connection (the other node
    # stores it), then refuses the second row for the writer (its caches behind the rows),
    # then is down for the third
    nodes = _Peers(
        PeerUnreachable("refused", refused=True),
        None,
        RemoteError(403, {"error": "permission_denied", "detail": "writer may not produce 'orders'"}),
        RemoteError(503, {"error": "unavailable", "detail": "no owner"}),
    )
    peers(nodes)
    assert relay(older_than=0) == 1

    # then each call was made for the writer (its user id), to the live owner first, never to the silent node
    assert nodes.asked == [
        ("10.0.0.1:8000", "orders", [("stored", "stored")], 0, writer.pk),
        ("10.0.0.2:8000", "orders", [("stored", "stored")], 0, writer.pk),
        ("10.0.0.1:8000", "orders", [("refused", "refused")], 0, writer.pk),
        ("10.0.0.1:8000", "orders", [("later", "later")], 0, writer.pk),
    ]
    # ...the stored row is gone, recorded in the audit trail as the writer's...
    assert not OutboxMessage.objects.filter(pk="stored").exists()
    [entry] = AuditEntry.objects.filter(action="relayed")
    assert (entry.actor, entry.target, entry.detail) == ("writer", "orders", {"messages": 1, "outbox": "stored"})
    # ...and the node's refusal gave nothing up: both rows are kept for the next relay
    kept = {r.pk: r for r in OutboxMessage.objects.all()}
    assert {k: (r.given_up_at, r.claimed_until, r.failures) for k, r in kept.items()} == {
        "refused": (None, None, 1),
        "later": (None, None, 1),
    }
    assert "writer may not produce 'orders'" in kept["refused"].last_error

    # when the writer's grant is revoked and the next relay runs
    service.revoke(caller=SYSTEM, action="produce", user=writer, queue=orders)
    peers(nodes := _Peers(None))
    assert relay(older_than=0) == 0

    # then its own check gave both rows up with the reason, and no node was asked
    assert nodes.asked == []
    reasons = dict(OutboxMessage.objects.values_list("pk", "given_up_reason"))
    assert reasons == dict.fromkeys(
        ("refused", "later"), "writer may not produce 'orders': it needs the 'produce' permission on it"
    )


def test_the_worker_relays_each_row_as_its_writer_and_gives_up_those_it_may_not_send(node_api, tasks_worker):
    # given the queues "default" (the worker's) and "orders", made by the worker's user: its
    # token may produce to both
    _create_queue(node_api, name="default")
    _create_queue(node_api, name="orders")
    orders = Queue.objects.get(name="orders")
    # and writers: one who may produce to "orders", one who may not, and three who may until the relay runs
    names = ("producer", "stranger", "deleted", "deactivated", "revoked")
    users = {name: User.objects.create(username=f"{name}-{uuid.uuid4().hex[:6]}") for name in names}
    for name in ("producer", "deleted", "deactivated", "revoked"):
        service.grant(caller=SYSTEM, action="produce", user=users[name], queue=orders)

    # when each enqueues on commit with its own token and dies before its send reaches the
    # service, and a row of an earlier version (no writer recorded) is left too
    keys = {}
    for name, user in users.items():
        writer = _Dead(token=Token.objects.create(user=user).key)
        with transaction.atomic():
            keys[name] = enqueue_on_commit("orders", [f"from {name}"], client=writer, outbox=True)
    OutboxMessage.objects.create(
        id="no-writer", queue="orders", messages=[{"body": "unknown"}], created_at=timezone.now()
    )
    assert {OutboxMessage.objects.get(pk=keys[name]).writer_id for name in names} == {u.pk for u in users.values()}
    # and, before the relay runs, a writer is deleted, one deactivated and one loses its grant
    deleted_id = users["deleted"].pk
    users["deleted"].delete()
    users["deactivated"].is_active = False
    users["deactivated"].save()
    service.revoke(caller=SYSTEM, action="produce", user=users["revoked"], queue=orders)
    # and a worker relays what is left
    tasks_worker("--relay-every", "0.2", OUTBOX_RELAY_AFTER="0.5")
    wait_until(lambda: not OutboxMessage.objects.filter(given_up_at=None).exists(), 30, "the relay")

    # then the producer's message is in the queue, sent as the producer: the audit trail names it
    assert _bodies(node_api, "orders") == ["from producer"]
    [entry] = AuditEntry.objects.filter(action="relayed", target="orders")
    assert (entry.actor, entry.detail) == (users["producer"].username, {"messages": 1, "outbox": keys["producer"]})
    # and every other row is given up with its reason, never sent with the worker's own rights
    reasons = dict(OutboxMessage.objects.values_list("pk", "given_up_reason"))
    assert set(reasons) == {keys[name] for name in names if name != "producer"} | {"no-writer"}
    assert f"{users['stranger'].username} may not produce 'orders'" in reasons[keys["stranger"]]
    assert reasons[keys["deleted"]] == f"user {deleted_id} no longer exists"
    assert (
        reasons[keys["deactivated"]]
        == f"user {users['deactivated'].username!r} (id {users['deactivated'].pk}) is deactivated"
    )
    assert f"{users['revoked'].username} may not produce 'orders'" in reasons[keys["revoked"]]
    assert reasons["no-writer"].startswith("no writer recorded")
    assert _depth(node_api, "orders") == 0


def test_a_task_message_is_looked_up_never_imported_and_what_cannot_run_ends_failed(settings):
    # given the backend of this process, and the task_finished signals it sends
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default"],
            # (a user's token: on PostgreSQL an enqueue's outbox row records its writer)
            "OPTIONS": {"token": _token_of_new_user(), "modules": MODULES},
        }
    }
    backend = email_users.get_backend()
    runner = TaskRunner(backend, "worker-1")
    finished: list = []

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result)

    task_finished.connect(on_finished)

    def message(body, queue="default"):
        return SimpleNamespace(id=f"{queue}/0/00000000-0000000000000000/0", body=body, enqueued_at=None)

    def body(result_id, name, *args):
        return json.dumps({"id": result_id, "task": name, "backend": "default", "args": list(args), "kwargs": {}})

    try:
        # when a message names a module's function that no task module declared
        with pytest.raises(TaskNotRegistered, match=re.escape("no task 'tests.integration.imported_by_name.run'")):
            runner(message(body("by-name", "tests.integration.imported_by_name.run")), None)
        # then nothing was imported, and its result ended FAILED with the error, its attempt counted
        assert "tests.integration.imported_by_name" not in sys.modules
        result = backend.get_result("by-name")
        assert (result.status, result.started_at, result.worker_ids) == (TaskResultStatus.FAILED, None, ["worker-1"])
        assert result.finished_at is not None
        assert result.task.module_path == "tests.integration.imported_by_name.run"
        assert [e.exception_class for e in result.errors] == [TaskNotRegistered]
        assert [(r.id, r.status) for r in finished] == [("by-name", TaskResultStatus.FAILED)]
        assert "tests.integration.imported_by_name" not in sys.modules

        # when a registered task's message comes from a queue it is not registered for
        with pytest.raises(TaskNotRegistered, match="not from 'plain'"):
            runner(message(body("from-plain", email_users.module_path, ["a@example.com"], "s", "m"), "plain"), None)
        # then it did not run, and its result says why
        assert backend.get_result("from-plain").status == TaskResultStatus.FAILED

        # when a message's body is no task message, or names another task's result
        for not_a_task in (
            "not json",
            "[1]",
            json.dumps({"id": "", "task": "x"}),
            json.dumps({"id": "x" * 65, "task": "x"}),
        ):
            with pytest.raises(TaskMessageInvalid):
                runner(message(not_a_task), None)
        kept = email_users.enqueue(["a@example.com"], "s", "m")
        with pytest.raises(TaskMessageInvalid, match="not run"):
            runner(message(body(kept.id, fails.module_path, "boom")), None)
        with pytest.raises(TaskMessageInvalid, match="not run"):
            runner(message(body(kept.id, email_users.module_path), "plain"), None)
        # then no result was written for them, and the other task's result is untouched
        assert sorted(TaskRecord.objects.values_list("pk", flat=True)) == sorted(["by-name", "from-plain", kept.id])
        untouched = email_users.get_result(kept.id)
        assert (untouched.status, untouched.worker_ids, untouched.errors) == (TaskResultStatus.READY, [], [])
        assert len(finished) == 2
    finally:
        task_finished.disconnect(on_finished)


def _configure(settings, token: str, **options) -> None:
    """This process's TASKS, with no node: the backend's client has ``token``."""
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default"],
            "OPTIONS": {"token": token, "modules": MODULES, **options},
        }
    }


def _live_queue(name: str) -> Queue:
    """Queue ``name``, its one partition owned by a live node (10.0.0.1:8000) that no process
    runs: a relay's calls go to the ``peers`` stand-in."""
    now = timezone.now()
    node = Node.objects.create(id="n1", address="10.0.0.1:8000", started_at=now, heartbeat_at=now)
    queue = Queue.objects.create(name=name, partitions=1)
    Partition.objects.create(queue=queue, index=0, owner=node)
    return queue


@pytest.mark.django_db
def test_a_held_task_is_sent_once_as_its_writer_when_due_and_a_refused_one_stays_held(settings, peers):
    # given the queue "default", a writer who may produce to it, and a backend with the writer's token
    default = _live_queue("default")
    writer = User.objects.create(username="writer")
    service.grant(caller=SYSTEM, action="produce", user=writer, queue=default)
    _configure(settings, Token.objects.create(user=writer).key, send_ahead=60)
    backend = email_users.get_backend()
    # and held tasks: one due now, one due later, one another relay has claimed
    now = datetime.now(UTC)
    due = email_users.using(run_after=now + timedelta(minutes=5)).enqueue(["a@example.com"], "due", "m")
    later = email_users.using(run_after=now + timedelta(hours=2)).enqueue(["a@example.com"], "later", "m")
    claimed = email_users.using(run_after=now + timedelta(minutes=6)).enqueue(["a@example.com"], "claimed", "m")
    TaskRecord.objects.filter(pk=due.id).update(held_until=now - timedelta(seconds=1))
    TaskRecord.objects.filter(pk=claimed.id).update(held_until=now + timedelta(seconds=100))
    assert set(TaskRecord.objects.values_list("writer_id", flat=True)) == {writer.pk}
    assert not OutboxMessage.objects.exists()
    # and a client of the backend that would send anything with its own token
    backend._client = own = _Recorder()

    # when the node refuses the due one for its writer (its caches behind the rows), then is down
    for refusal in (
        RemoteError(403, {"error": "permission_denied", "detail": "writer may not produce 'default'"}),
        RemoteError(503, {"error": "unavailable", "detail": "no owner"}),
    ):
        peers(nodes := _Peers(refusal))
        assert backend.release_held() == 0
        # then it stays held, tried again later, and its result is untouched
        assert len(nodes.asked) == 1
        assert TaskRecord.objects.get(pk=due.id).held_until > now + timedelta(seconds=20)
        assert email_users.get_result(due.id).status == TaskResultStatus.READY
        TaskRecord.objects.filter(pk=due.id).update(held_until=now - timedelta(seconds=1))

    # when a relay sends it, twice
    peers(nodes := _Peers(None))
    assert backend.release_held() == 1
    assert backend.release_held() == 0
    # then its message went once, for its writer, as an enqueue within the delay limit sends it
    [(address, queue, [(body, dedup_id)], hops, user_id)] = nodes.asked
    assert (address, queue, dedup_id, hops, user_id) == ("10.0.0.1:8000", "default", due.id, 0, writer.pk)
    assert json.loads(body)["id"] == due.id
    assert TaskRecord.objects.get(pk=due.id).held_until is None
    # ...recorded in the audit trail as the writer's, never with the backend's own client
    [entry] = AuditEntry.objects.filter(action="relayed")
    assert (entry.actor, entry.target, entry.detail) == ("writer", "default", {"messages": 1, "task": due.id})
    assert own.calls == []
    # ...and the others wait
    assert TaskRecord.objects.get(pk=later.id).held_until == now + timedelta(hours=2) - timedelta(seconds=60)
    assert TaskRecord.objects.get(pk=claimed.id).held_until == now + timedelta(seconds=100)


@pytest.mark.django_db
def test_a_held_task_whose_writer_may_no_longer_send_it_ends_failed_and_is_never_sent(settings, peers):
    # given the queue "default", and held tasks of writers who may produce to it when they enqueue
    default = _live_queue("default")
    users = {name: User.objects.create(username=name) for name in ("revoked", "deactivated", "deleted")}
    held = {}
    for name, user in users.items():
        service.grant(caller=SYSTEM, action="produce", user=user, queue=default)
        _configure(settings, Token.objects.create(user=user).key, send_ahead=60)
        held[name] = email_users.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue(["a@x"], name, "m")
    # and, before they are due, one writer loses its grant, one is deactivated, one deleted
    service.revoke(caller=SYSTEM, action="produce", user=users["revoked"], queue=default)
    users["deactivated"].is_active = False
    users["deactivated"].save()
    deleted_id = users["deleted"].pk
    users["deleted"].delete()
    TaskRecord.objects.update(held_until=datetime.now(UTC) - timedelta(seconds=1))
    # and a releasing backend whose own token (a superuser's) could send them all
    releasing = User.objects.create_superuser(username="worker")
    _configure(settings, Token.objects.create(user=releasing).key, send_ahead=60)
    backend = email_users.get_backend()
    backend._client = own = _Recorder()
    service.producer_config("default", caller=service.acting_user(releasing.pk))  # it may produce
    finished: list = []

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result)

    task_finished.connect(on_finished)
    try:
        # when a relay runs
        peers(nodes := _Peers())
        assert backend.release_held() == 0
    finally:
        task_finished.disconnect(on_finished)

    # then no node was asked, nothing was sent with the backend's token, nothing recorded as relayed
    assert nodes.asked == [] and own.calls == []
    assert not AuditEntry.objects.filter(action="relayed").exists()
    # ...and each result ended FAILED with the reason, as the framework reports a failure, held no longer
    reasons = {
        "revoked": "revoked may not produce 'default': it needs the 'produce' permission on it",
        "deactivated": f"user 'deactivated' (id {users['deactivated'].pk}) is deactivated",
        "deleted": f"user {deleted_id} no longer exists",
    }
    for name, reason in reasons.items():
        result = email_users.get_result(held[name].id)
        assert (result.status, result.is_finished, result.started_at) == (TaskResultStatus.FAILED, True, None)
        [error] = result.errors
        assert error.exception_class_path == "workers.outbox.WriterRefused"
        assert f"WriterRefused: {reason}" in error.traceback, error.traceback
        assert TaskRecord.objects.get(pk=held[name].id).held_until is None
    assert sorted((r.id, r.status) for r in finished) == sorted((r.id, TaskResultStatus.FAILED) for r in held.values())
    # ...and no later relay takes them again
    assert backend.release_held() == 0 and nodes.asked == []


@pytest.mark.django_db
def test_an_enqueue_sent_later_needs_a_token_this_service_knows_and_else_writes_nothing(settings):
    # given a backend whose token this service does not know (revoked, or another service's)
    in_an_hour = datetime.now(UTC) + timedelta(hours=1)
    # when tasks are enqueued that a relay would send later: held (with and without the outbox,
    # as on SQLite), or through the outbox; inside a transaction and outside one
    for outbox, run_after in ((False, in_an_hour), (True, in_an_hour), (True, None)):
        _configure(settings, "unknown", outbox=outbox)
        for atomic in (False, True):
            with (
                pytest.raises(ValueError, match="not one of this service's"),
                transaction.atomic() if atomic else contextlib.nullcontext(),
            ):
                email_users.using(run_after=run_after).enqueue(["a@example.com"], "s", "m")
    # then each raised before anything was written: no result, no outbox row
    assert not TaskRecord.objects.exists() and not OutboxMessage.objects.exists()


def test_the_worker_sends_each_held_task_as_its_writer_and_fails_those_it_may_not_send(
    node_api, tasks, tasks_worker, token
):
    # given the queue "default", made by the worker's user: its token may produce to it
    _create_queue(node_api, name="default")
    default = Queue.objects.get(name="default")
    worker_user = Token.objects.get(key=token).user
    service.producer_config("default", caller=service.acting_user(worker_user.pk))
    # and writers who may produce to it when they enqueue a task held until it is due
    users = {name: User.objects.create(username=f"{name}-{uuid.uuid4().hex[:6]}") for name in ("ok", "revoked", "off")}
    held = {}
    run_after = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    for name, user in users.items():
        service.grant(caller=SYSTEM, action="produce", user=user, queue=default)
        tasks(token=Token.objects.create(user=user).key, send_ahead=2)
        held[name] = email_users.using(run_after=run_after).enqueue(["a@example.com"], f"from {name}", "m")
    assert _depth(node_api, "default") == 0
    # and, before a worker sends them, one loses its grant and one is deactivated
    service.revoke(caller=SYSTEM, action="produce", user=users["revoked"], queue=default)
    users["off"].is_active = False
    users["off"].save()

    # when a worker runs
    tasks_worker("--relay-every", "0.2")

    # then the task of the writer who may produce ran, sent as its writer: the audit trail names it
    wait_until(lambda: all(email_users.get_result(r.id).is_finished for r in held.values()), 30, "the held tasks")
    assert email_users.get_result(held["ok"].id).status == TaskResultStatus.SUCCESSFUL
    [entry] = AuditEntry.objects.filter(action="relayed", target="default")
    assert (entry.actor, entry.detail) == (users["ok"].username, {"messages": 1, "task": held["ok"].id})
    # ...and the others ended FAILED with the reason, never sent with the worker's own token
    for name, reason in (
        ("revoked", f"{users['revoked'].username} may not produce 'default'"),
        ("off", f"user {users['off'].username!r} (id {users['off'].pk}) is deactivated"),
    ):
        result = email_users.get_result(held[name].id)
        assert (result.status, result.worker_ids, result.started_at) == (TaskResultStatus.FAILED, [], None)
        assert [e.exception_class_path for e in result.errors] == ["workers.outbox.WriterRefused"]
        assert reason in result.errors[0].traceback
        assert TaskRecord.objects.get(pk=held[name].id).held_until is None
    assert _depth(node_api, "default") == 0
    assert AuditEntry.objects.filter(action="relayed").count() == 1
