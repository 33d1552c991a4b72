"""SQS access keys: created, listed with their last use and revoked in the admin and by
``manage.py sqs_keys``."""

from __future__ import annotations

import re
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client

from queues import service
from queues.access import Caller
from queues.errors import Unavailable
from queues.models import AuditEntry
from sqs import service as sqs_service
from sqs.models import AccessKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def key_owner():
    return User.objects.create(username=f"k-{uuid.uuid4().hex[:8]}")


def test_admin_creates_lists_and_revokes_keys(client, key_owner):
    # given an operator in the admin
    admin_user = User.objects.create(username=f"admin-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    # when they add a key for a user
    r = client.post("/admin/sqs/accesskey/add/", {"user": key_owner.pk, "description": "ci"}, follow=True)
    assert r.status_code == 200
    (key,) = AccessKey.objects.filter(user=key_owner)
    # then the secret is shown once, and the key is listed with its last use
    shown = [str(m) for m in r.context["messages"]]
    assert any(key.access_key_id in m and key.secret in m for m in shown), shown
    assert re.fullmatch(r"AKMQ[A-Z0-9]{16}", key.access_key_id) and len(key.secret) == 40
    listing = client.get("/admin/sqs/accesskey/").content.decode()
    assert key.access_key_id in listing and "Last used" in listing
    assert key.secret not in client.get(f"/admin/sqs/accesskey/{key.pk}/change/").content.decode()
    # when revoked by the action
    r = client.post("/admin/sqs/accesskey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True)
    assert r.status_code == 200
    key.refresh_from_db()
    assert not key.active


def test_command_creates_lists_and_revokes(key_owner):
    out = StringIO()
    call_command("sqs_keys", "create", key_owner.username, "--description", "app", stdout=out)
    key_id = re.search(r"aws_access_key_id = (\S+)", out.getvalue())[1]
    secret = re.search(r"aws_secret_access_key = (\S+)", out.getvalue())[1]
    key = AccessKey.objects.get(access_key_id=key_id)
    assert key.secret == secret and key.user == key_owner and key.active
    second = AccessKey.issue(key_owner)

    out = StringIO()
    call_command("sqs_keys", "list", key_owner.username, stdout=out)
    assert key_id in out.getvalue() and "used never" in out.getvalue() and "active" in out.getvalue()

    call_command("sqs_keys", "revoke", key_id, stdout=StringIO())
    key.refresh_from_db()
    second.refresh_from_db()
    assert not key.active and second.active
    call_command("sqs_keys", "revoke", key_owner.username, stdout=StringIO())  # every key of the user
    second.refresh_from_db()
    assert not second.active
    with pytest.raises(CommandError):
        call_command("sqs_keys", "create", "no-such-user", stdout=StringIO())


def _staff(*codenames: str) -> tuple[User, Client]:
    """A staff user (not a superuser) with exactly these permissions, logged in to the console."""
    user = User.objects.create(username=f"staff-{uuid.uuid4().hex[:6]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return user, client


def test_a_staff_user_who_may_add_keys_issues_them_for_themselves_only(key_owner):
    # given a superuser, and a staff user whose one permission is to add access keys
    root = User.objects.create(username=f"root-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)
    staff, client = _staff("add_accesskey")
    # when they issue a key for the superuser, or for another user
    for target in (root, key_owner):
        r = client.post("/admin/sqs/accesskey/add/", {"user": target.pk, "description": "mine now"}, follow=True)
        # then none is made, and no secret is shown
        assert not AccessKey.objects.filter(user=target).exists(), target
        assert r.status_code == 200 and "secret" not in " ".join(str(m) for m in r.context["messages"])
    assert not AuditEntry.objects.filter(action="issue_key").exists()
    # when they issue one for themselves
    r = client.post("/admin/sqs/accesskey/add/", {"user": staff.pk, "description": "ci"}, follow=True)
    # then it is made, its secret shown once, and the issue recorded
    (key,) = AccessKey.objects.filter(user=staff)
    assert any(key.secret in str(m) for m in r.context["messages"])
    entry = AuditEntry.objects.get(action="issue_key")
    assert (entry.actor, entry.target, entry.detail) == (
        staff.username,
        f"user:{staff.username}",
        {"access_key_id": key.access_key_id},
    )


def test_nobody_but_a_superuser_issues_a_key_for_a_superuser():
    # given two superusers
    root = User.objects.create(username=f"root-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)
    other = User.objects.create(username=f"root2-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(other)
    # then one cannot issue a key for the other, and may for themselves
    client.post("/admin/sqs/accesskey/add/", {"user": root.pk}, follow=True)
    assert not AccessKey.objects.filter(user=root).exists()
    client.post("/admin/sqs/accesskey/add/", {"user": other.pk}, follow=True)
    assert AccessKey.objects.filter(user=other).count() == 1
    # and the service says the same to any entrance
    with pytest.raises(service.CredentialForbidden):
        sqs_service.issue_access_key(root, caller=Caller.of(other))


def test_only_its_holder_or_a_superuser_revokes_a_key(key_owner):
    # given another user's key, and a staff user who may view and change keys
    key = AccessKey.issue(key_owner)
    staff, client = _staff("view_accesskey", "change_accesskey")
    # when they post the revoke action on it in the console
    r = client.post("/admin/sqs/accesskey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True)
    # then it stays active: their list holds their own keys only, so the action never reaches it
    key.refresh_from_db()
    assert key.active and key.access_key_id not in r.content.decode()
    # and the service, which any entrance calls, refuses them too
    with pytest.raises(service.CredentialForbidden):
        sqs_service.revoke_access_key(key, caller=Caller.of(staff))
    key.refresh_from_db()
    assert key.active and not AuditEntry.objects.filter(action="revoke_key").exists()
    # while the staff user revokes a key of their own in the console
    own = AccessKey.issue(staff)
    client.post("/admin/sqs/accesskey/", {"action": "revoke", "_selected_action": [own.pk]})
    own.refresh_from_db()
    assert not own.active
    # and its holder revokes it
    sqs_service.revoke_access_key(key, caller=Caller.of(key_owner))
    key.refresh_from_db()
    assert not key.active
    entry = AuditEntry.objects.get(action="revoke_key", target=f"user:{key_owner.username}")
    assert (entry.actor, entry.detail) == (key_owner.username, {"access_key_id": key.access_key_id})


class _StoreDown:
    def get(self, *args):
        raise Unavailable("the key-value store is not answering")

    put = get


def test_a_user_deleted_in_the_console_while_the_store_is_down_gets_503_and_stays(
    client, key_owner, monkeypatch, runtime
):
    # given an operator in the console, and a user, while the key-value store is down
    from queues.service import credentials

    admin_user = User.objects.create(username=f"admin-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    monkeypatch.setattr(credentials, "get_store", _StoreDown)
    # when the operator deletes the user (no process could be told to stop trusting its keys)
    r = client.post(f"/admin/auth/user/{key_owner.pk}/delete/", {"post": "yes"})
    # then the page answers 503 with Retry-After, not 500, and the user stays
    assert r.status_code == 503, r.content
    assert r.headers["Retry-After"] == "1"
    assert r.json()["error"] == "unavailable"
    assert User.objects.filter(pk=key_owner.pk).exists()
