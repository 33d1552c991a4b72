"""The REST API's tokens in the console: the project's admin in place of DRF's, issuing and
revoking through the service, a key shown once and then only by its first characters."""

from __future__ import annotations

import uuid

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from rest_framework.authtoken.models import Token, TokenProxy

from queues.admin.tokens import TokenAdmin
from queues.models import AuditEntry

pytestmark = pytest.mark.django_db


def _user(prefix: str, **flags) -> User:
    return User.objects.create(username=f"{prefix}-{uuid.uuid4().hex[:6]}", **flags)


def _staff(*codenames: str) -> tuple[User, Client]:
    user = _user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return user, client


def test_drfs_token_admin_is_replaced():
    assert type(admin.site._registry[TokenProxy]) is TokenAdmin


def test_a_staff_user_who_may_view_tokens_sees_their_own_by_its_prefix_only():
    # given two users' tokens, and a staff user whose one permission is to view tokens, with a
    # token of their own
    tokens = [Token.objects.create(user=_user("app")) for _ in range(2)]
    staff, client = _staff("view_tokenproxy")
    own = Token.objects.create(user=staff)
    # when they open the token list and each token's page
    listing = client.get("/admin/authtoken/tokenproxy/")
    assert listing.status_code == 200
    assert [t.key for t in listing.context["cl"].result_list] == [own.key]
    page = client.get(f"/admin/authtoken/tokenproxy/{staff.pk}/change/")
    # then their own token is shown by its first characters only
    assert page.status_code == 200
    for html in (listing.content.decode(), page.content.decode()):
        assert own.key[:8] in html and own.key not in html and own.key[8:24] not in html
    # and another user's is neither listed nor opened: its page answers as if it did not exist
    for t in tokens:
        r = client.get(f"/admin/authtoken/tokenproxy/{t.user_id}/change/", follow=True)
        assert r.redirect_chain and r.redirect_chain[0][1] == 302
        for html in (listing.content.decode(), r.content.decode()):
            assert t.key[:8] not in html and t.key[8:24] not in html


def test_a_superuser_sees_every_token_by_its_prefix_only():
    tokens = [Token.objects.create(user=_user("app")) for _ in range(2)]
    su = Client()
    su.force_login(_user("root", is_staff=True, is_superuser=True))
    pages = [su.get("/admin/authtoken/tokenproxy/")]
    pages += [su.get(f"/admin/authtoken/tokenproxy/{t.user_id}/change/") for t in tokens]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        for t in tokens:
            assert t.key not in html and t.key[8:24] not in html
    assert all(t.key[:8] in pages[0].content.decode() for t in tokens)


def test_only_a_superuser_issues_a_token_for_another_user_and_never_for_a_superuser():
    root = _user("root", is_staff=True, is_superuser=True)
    other_root = _user("root2", is_staff=True, is_superuser=True)
    app = _user("app")
    staff, client = _staff("add_tokenproxy", "view_tokenproxy")
    # a staff user who may add tokens cannot make one for a superuser or for another user
    for target in (root, app):
        client.post("/admin/authtoken/tokenproxy/add/", {"user": target.pk})
        assert not Token.objects.filter(user=target).exists(), target
    # a superuser cannot make one for another superuser
    su = Client()
    su.force_login(other_root)
    su.post("/admin/authtoken/tokenproxy/add/", {"user": root.pk})
    assert not Token.objects.filter(user=root).exists()
    assert not AuditEntry.objects.filter(action="issue_token").exists()
    # a superuser makes one for another user: the key is shown once, in the message after it
    r = su.post("/admin/authtoken/tokenproxy/add/", {"user": app.pk}, follow=True)
    token = Token.objects.get(user=app)
    shown = [str(m) for m in r.context["messages"]]
    assert sum(token.key in m for m in shown) == 1, shown
    # and then never again: not elsewhere on the page it lands on, not in the list, not in the
    # admin's log
    assert r.content.decode().count(token.key) == 1
    assert token.key not in su.get("/admin/authtoken/tokenproxy/").content.decode()
    assert token.key not in su.get("/admin/").content.decode()
    assert not LogEntry.objects.filter(object_repr__contains=token.key).exists()
    entry = AuditEntry.objects.get(action="issue_token")
    assert (entry.actor, entry.target) == (other_root.username, f"user:{app.username}")
    # and a staff user makes one for themselves
    client.post("/admin/authtoken/tokenproxy/add/", {"user": staff.pk})
    assert Token.objects.filter(user=staff).exists()


def test_a_token_is_revoked_by_its_holder_or_a_superuser_only():
    app = _user("app")
    token = Token.objects.create(user=app)
    _, client = _staff("view_tokenproxy", "delete_tokenproxy")
    client.post(f"/admin/authtoken/tokenproxy/{app.pk}/delete/", {"post": "yes"})
    assert Token.objects.filter(pk=token.pk).exists()
    root = _user("root", is_staff=True, is_superuser=True)
    su = Client()
    su.force_login(root)
    su.post(f"/admin/authtoken/tokenproxy/{app.pk}/delete/", {"post": "yes"})
    assert not Token.objects.filter(pk=token.pk).exists()
    entry = AuditEntry.objects.get(action="revoke_token")
    assert (entry.actor, entry.target) == (root.username, f"user:{app.username}")
    assert token.key not in str(entry.detail)


@pytest.mark.django_db(transaction=True)
def test_a_token_revoked_in_the_console_is_refused_at_once_though_it_was_kept():
    """The process keeps a token it checked for a few seconds; a revocation it commits is an
    access change, so the very next call reads the token again and is refused."""
    from rest_framework.test import APIClient

    app = _user("app")
    token = Token.objects.create(user=app)
    root = _user("root", is_staff=True, is_superuser=True)
    su = Client()
    su.force_login(root)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert api.get("/api/v1/queues").status_code == 200  # checked, and kept
    su.post(f"/admin/authtoken/tokenproxy/{app.pk}/delete/", {"post": "yes"})
    assert not Token.objects.filter(pk=token.pk).exists()
    assert api.get("/api/v1/queues").status_code == 401
