"""SQS access keys: created, listed with their last use and revoked in the admin and by
``manage.py sqs_keys``."""

from __future__ import annotations

import re
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from sqs.models import AccessKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner():
    return User.objects.create(username=f"k-{uuid.uuid4().hex[:8]}")


def test_admin_creates_lists_and_revokes_keys(client, owner):
    # given an operator in the admin
    admin_user = User.objects.create(username=f"admin-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    # when they add a key for a user
    r = client.post("/admin/sqs/accesskey/add/", {"user": owner.pk, "description": "ci"}, follow=True)
    assert r.status_code == 200
    (key,) = AccessKey.objects.filter(user=owner)
    # then the secret is shown once, and the key is listed with its last use
    shown = [str(m) for m in r.context["messages"]]
    assert any(key.access_key_id in m and key.secret in m for m in shown), shown
    assert re.fullmatch(r"AKMQ[A-Z0-9]{16}", key.access_key_id) and len(key.secret) == 40
    listing = client.get("/admin/sqs/accesskey/").content.decode()
    assert key.access_key_id in listing and "Last used at" in listing
    assert key.secret not in client.get(f"/admin/sqs/accesskey/{key.pk}/change/").content.decode()
    # when revoked by the action
    r = client.post("/admin/sqs/accesskey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True)
    assert r.status_code == 200
    key.refresh_from_db()
    assert not key.active


def test_command_creates_lists_and_revokes(owner):
    out = StringIO()
    call_command("sqs_keys", "create", owner.username, "--description", "app", stdout=out)
    key_id = re.search(r"aws_access_key_id = (\S+)", out.getvalue())[1]
    secret = re.search(r"aws_secret_access_key = (\S+)", out.getvalue())[1]
    key = AccessKey.objects.get(access_key_id=key_id)
    assert key.secret == secret and key.user == owner and key.active
    second = AccessKey.issue(owner)

    out = StringIO()
    call_command("sqs_keys", "list", owner.username, stdout=out)
    assert key_id in out.getvalue() and "used never" in out.getvalue() and "active" in out.getvalue()

    call_command("sqs_keys", "revoke", key_id, stdout=StringIO())
    key.refresh_from_db()
    second.refresh_from_db()
    assert not key.active and second.active
    call_command("sqs_keys", "revoke", owner.username, stdout=StringIO())  # every key of the user
    second.refresh_from_db()
    assert not second.active
    with pytest.raises(CommandError):
        call_command("sqs_keys", "create", "no-such-user", stdout=StringIO())
