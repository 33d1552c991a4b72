"""``make run`` hands out an ordinary user's token, not the superuser's: the token that
applications copy from its banner can enqueue and dequeue, and has no staff rights."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess

import pytest
import requests
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from queues import service
from queues.access import SYSTEM, Caller
from queues.service.types import MessageDraft
from tests.launcher import ROOT, free_port, wait_until


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.cluster
def test_make_run_prints_an_ordinary_users_token_that_can_enqueue_and_dequeue(tmp_path):
    # given `make run` on the embedded defaults, in a data folder of its own
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "KV_URL", "REDIS_URL", "CELERY_BROKER_URL", "MQ_ENV", "DJANGO_SETTINGS_MODULE")
    }
    env.update(PORT=str(port), MQ_DATA_DIR=str(tmp_path / "data"), ADMIN_PASSWORD="quickstart-pw-1")
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        run = subprocess.Popen(
            [str(ROOT / "scripts" / "run.sh")], cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert run.poll() is None, log.read_text()[-3000:]
            try:
                return requests.get(f"{base}/api/v1/healthz", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(up, 120, "make run's node answers")
        # when an application takes the API token from the banner
        found = re.search(r"API token: (\w+)", log.read_text())
        assert found, log.read_text()[-3000:]
        token = found.group(1)
        # then the token is an ordinary user's: not staff, not a superuser, not the admin
        with sqlite3.connect(tmp_path / "data" / "db.sqlite3") as db:
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
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)  # run.sh stops its node and worker, then exits
            try:
                run.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(10)


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
