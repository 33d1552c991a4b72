"""``make run`` starts from an empty data folder every time, and hands out an ordinary user's
token, not the superuser's: the token that applications copy from its banner can enqueue and
dequeue, and has no staff rights."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
import requests
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from queues import service
from queues.access import SYSTEM, Caller
from queues.service.types import MessageDraft
from tests.launcher import ROOT, free_port, wait_until

#: What `make run` does not take from the shell: it runs on the embedded defaults.
_SERVICES_ENV = ("DATABASE_URL", "KV_URL", "REDIS_URL", "CELERY_BROKER_URL", "MQ_ENV", "DJANGO_SETTINGS_MODULE")
#: A beat task the worker ran: what shows that the worker consumes from its broker.
_BEAT_TASK_RAN = re.compile(r"Task (archive\.run_archiver|workers\.relay_outbox)\[[^\]]+\] succeeded")
#: Beat tasks to see run before stopping: the first ones, with beat writing to the broker
#: every second meanwhile (kombu's own filesystem transport lost its worker right there).
_BEAT_TASKS = 2


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT as a terminal's shell leaves it: a test run in the background of a script has it
    ignored, and a shell started with SIGINT ignored cannot trap it (run.sh's Ctrl-C handling)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class MakeRun:
    """``scripts/run.sh`` (what ``make run`` runs) on the embedded defaults, from a data folder
    of its own that does not exist yet, on a port of its own; output in ``run.log`` beside it."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        self.data = folder / "data"
        self.log = folder / "run.log"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in _SERVICES_ENV}
        # beat every second, so that the worker's first seconds see it write to the broker
        env.update(PORT=str(self.port), MQ_DATA_DIR=str(self.data), ADMIN_PASSWORD="quickstart-pw-1")
        env.update(ARCHIVE_EVERY="1", OUTBOX_RELAY_EVERY="1")
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(ROOT / "scripts" / "run.sh")],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=_ctrl_c_as_in_a_terminal,
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_started(self) -> None:
        """Until the node answers healthz and the worker has run beat's first tasks."""

        def up() -> bool:
            assert self.proc.poll() is None, f"make run exited ({self.proc.returncode}):\n{self.tail()}"
            try:
                return requests.get(f"{self.base}/api/v1/healthz", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        def worked() -> bool:
            assert self.proc.poll() is None, f"make run exited ({self.proc.returncode}):\n{self.tail()}"
            return len(_BEAT_TASK_RAN.findall(self.log.read_text(errors="replace"))) >= _BEAT_TASKS

        wait_until(up, 120, "make run's node answers")
        wait_until(worked, 60, f"make run's worker runs {_BEAT_TASKS} beat tasks")

    def stop(self, sig: signal.Signals) -> int:
        """Ctrl-C (SIGINT) or SIGTERM to the script, as a terminal or a supervisor sends it; its exit code."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def start_make_run(tmp_path):
    """Start ``make run`` (``start(name)``) in ``tmp_path/name``; every one is stopped at the end."""
    runs: list[MakeRun] = []

    def start(name: str) -> MakeRun:
        runs.append(MakeRun(tmp_path / name))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.cluster
def test_make_run_prints_an_ordinary_users_token_that_can_enqueue_and_dequeue(start_make_run):
    # given `make run` on the embedded defaults, in a data folder of its own
    run = start_make_run("first")
    run.wait_started()
    base = run.base
    # when an application takes the API token from the banner
    found = re.search(r"API token: (\w+)", run.log.read_text())
    assert found, run.tail()
    token = found.group(1)
    # then the token is an ordinary user's: not staff, not a superuser, not the admin
    with sqlite3.connect(run.data / "db.sqlite3") as db:
        row = db.execute(
            "SELECT u.username, u.is_staff, u.is_superuser FROM authtoken_token t "
            "JOIN auth_user u ON u.id = t.user_id WHERE t.key = ?",
            (token,),
        ).fetchone()
    assert row is not None and row[0] != "admin" and (row[1], row[2]) == (0, 0), row
    # and it can create a queue, enqueue, dequeue and ack
    auth = {"Authorization": f"Token {token}"}
    assert requests.post(f"{base}/api/v1/queues", json={"name": "orders"}, headers=auth, timeout=30).ok
    sent = requests.post(f"{base}/api/v1/queues/orders/enqueue", json={"body": "hi"}, headers=auth, timeout=30)
    assert sent.status_code == 201, sent.text
    got = requests.post(f"{base}/api/v1/queues/orders/dequeue", json={"max": 1}, headers=auth, timeout=30)
    messages = got.json()["messages"]
    assert [m["body"] for m in messages] == ["hi"]
    acked = requests.post(
        f"{base}/api/v1/queues/orders/ack",
        json={"messages": [{"id": messages[0]["id"], "receipt": messages[0]["receipt"]}]},
        headers=auth,
        timeout=30,
    )
    assert acked.status_code == 200, acked.text
    # and a TERM (a supervisor's stop) stops node and worker, and the script exits 0
    assert run.stop(signal.SIGTERM) == 0, run.tail()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.cluster
def test_make_run_starts_from_an_empty_data_folder_every_time(start_make_run):
    # given two more starts of `make run`, one after the other, each from a data folder that is not there
    for start in ("second", "third"):
        run = start_make_run(start)
        # when its node answers and its worker has run beat's first tasks
        run.wait_started()
        # then neither died on the way, and Ctrl-C stops both and the script exits 0
        assert run.stop(signal.SIGINT) == 0, run.tail()
        log = run.log.read_text(errors="replace")
        assert "run: stopped" in log, run.tail()
        assert "Unrecoverable error" not in log and "JSONDecodeError" not in log, run.tail()


@pytest.fixture
def quickstart(runtime, capsys, monkeypatch):
    """``manage.py quickstart`` as ``make run`` calls it; its printed lines as a dict."""

    def run(**options) -> dict[str, str]:
        monkeypatch.setenv("ADMIN_PASSWORD", "admin-pw-1")
        call_command("quickstart", **options)
        lines = capsys.readouterr().out.splitlines()
        return dict(line.split(" ", 1) for line in lines)

    return run


def test_the_app_user_may_produce_and_consume_on_others_queues_but_not_manage(quickstart, api, unique_name):
    # given a queue someone else made (not the app user)
    name = unique_name()
    assert api.post("/api/v1/queues", {"name": name}, format="json").status_code == 201
    service.enqueue(name, [MessageDraft("x")], caller=SYSTEM)
    # when make run sets up its users
    out = quickstart()
    app = APIClient()
    app.credentials(HTTP_AUTHORIZATION=f"Token {out['MQ_APP_TOKEN']}")
    # then the app's token enqueues and dequeues on it, but may not purge or delete it
    assert app.post(f"/api/v1/queues/{name}/enqueue", {"body": "y"}, format="json").status_code == 201
    got = app.post(f"/api/v1/queues/{name}/dequeue", {"max": 10}, format="json")
    assert got.status_code == 200 and len(got.json()["messages"]) == 2
    refused = app.post(f"/api/v1/queues/{name}/purge", {}, format="json")
    assert refused.status_code == 403 and refused.json()["missing"] == "manage"
    assert app.delete(f"/api/v1/queues/{name}").status_code == 403
    user = Token.objects.get(key=out["MQ_APP_TOKEN"]).user
    assert not user.is_staff and not user.is_superuser and not user.has_usable_password()
    assert out["MQ_ADMIN"] == "created given"


def test_quickstart_is_idempotent_and_takes_the_admins_old_token_away(quickstart, django_user_model):
    # given an admin that an earlier make run gave an API token
    admin = django_user_model.objects.create_superuser("admin", "admin@localhost", "old")
    Token.objects.create(user=admin)
    # when make run starts (twice)
    first = quickstart()
    second = quickstart()
    # then the admin has no token any more, and the app keeps its one token
    assert first["MQ_ADMIN_TOKEN"] == "revoked" and "MQ_ADMIN_TOKEN" not in second
    assert not Token.objects.filter(user=admin).exists()
    assert first["MQ_APP_TOKEN"] == second["MQ_APP_TOKEN"]
    assert Caller.of(admin).is_superuser
