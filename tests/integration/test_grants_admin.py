"""Grants in the admin (inline on a queue's and a topic's page, the grants list, each queue's
effective access), the audit trail's read-only list, and ``manage.py grant`` / ``revoke``."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import CommandError, call_command

from queues import access
from queues.models import AuditEntry, Grant, Queue
from tests.integration.nodes import database_url
from tests.launcher import ROOT, node_env

#: Who ``admin_client`` (pytest-django's) is signed in as: its ``admin_user``.
OPERATOR = "admin"


@pytest.fixture
def make(runtime, unique_name):
    """A queue's (or topic's, ``kind="topic"``) row: what the admin's pages show and the
    grants name (no node serves it: these tests send no messages). Saving a queue page
    tells this process's runtime (the fixture's, without housekeeping) that it changed."""

    def create(name: str | None = None, **fields) -> Queue:
        return Queue.objects.create(name=name or unique_name(), partitions=1, **fields)

    return create


def _value(bf):
    v = bf.value()
    if v is None or v is False:
        return None
    if v is True:
        return "on"
    return v


def change_form_data(page) -> dict:
    """What the browser would post back from an admin change page unchanged: the main form's
    values and every inline's management form and rows (from the page's context)."""
    data = {}
    for bf in page.context["adminform"].form:
        if (v := _value(bf)) is not None:
            data[bf.html_name] = v
    for inline in page.context["inline_admin_formsets"]:
        formset = inline.formset
        for bf in formset.management_form:
            data[bf.html_name] = bf.value()
        for form in formset.initial_forms:
            for bf in form:
                if (v := _value(bf)) is not None:
                    data[bf.html_name] = v
    return data


def access_row(html: str, principal: str) -> dict[str, bool] | None:
    """The effective-access table's row for ``principal`` (``user:bob``, ``group:ops``,
    ``superusers``): action -> granted; None when the table has no such row."""
    m = re.search(rf'<tr data-principal="{re.escape(principal)}">(.*?)</tr>', html, re.S)
    if m is None:
        return None
    return {a: g == "yes" for a, g in re.findall(r'class="action-(\w+)" data-granted="(yes|no)"', m.group(1))}


def only(*actions: str) -> dict[str, bool]:
    return {a: a in actions for a in access.ACTIONS}


# ------------------------------------------------------------------------ the queue page's inline


def test_a_grant_made_on_the_queue_page_is_recorded_and_shown_in_its_effective_access(admin_client, make):
    # given a queue and a user with no grant
    q = make()
    bob = User.objects.create(username="bob")
    url = f"/admin/queues/queue/{q.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    assert access_row(page.content.decode(), "superusers") == only(*access.ACTIONS)
    assert access_row(page.content.decode(), "user:bob") is None
    # when the operator adds a grant row (bob: consume) on the queue's page and saves
    data = change_form_data(page)
    data.update({"grants-TOTAL_FORMS": "1", "grants-0-user": str(bob.pk), "grants-0-action": "consume"})
    r = admin_client.post(url, data)
    assert r.status_code == 302, r.context["errors"] if r.context else r
    # then the grant exists, made by the operator, and the audit trail says so
    g = Grant.objects.get(queue=q)
    assert (g.user, g.group, g.pattern, g.action, g.created_by.username) == (bob, None, "", "consume", OPERATOR)
    entry = AuditEntry.objects.get(action="grant")
    assert (entry.actor, entry.target, entry.detail) == (
        OPERATOR,
        q.name,
        {"principal": "user:bob", "action": "consume"},
    )
    # and the page's effective access shows bob may read and consume, not produce or manage
    html = admin_client.get(url).content.decode()
    assert access_row(html, "user:bob") == only("read", "consume")
    assert "consume on this queue" in html

    # when the operator deletes the row
    page = admin_client.get(url)
    data = change_form_data(page)
    data["grants-0-DELETE"] = "on"
    r = admin_client.post(url, data)
    assert r.status_code == 302
    # then it is revoked, recorded, and bob is gone from the table
    assert not Grant.objects.filter(queue=q).exists()
    entry = AuditEntry.objects.get(action="revoke")
    assert (entry.actor, entry.target, entry.detail) == (
        OPERATOR,
        q.name,
        {"principal": "user:bob", "action": "consume"},
    )
    assert access_row(admin_client.get(url).content.decode(), "user:bob") is None


def test_a_grant_row_needs_one_user_or_one_group(admin_client, make):
    q = make()
    bob, ops = User.objects.create(username="bob"), Group.objects.create(name="ops")
    url = f"/admin/queues/queue/{q.pk}/change/"
    data = change_form_data(admin_client.get(url))
    data.update(
        {
            "grants-TOTAL_FORMS": "1",
            "grants-0-user": str(bob.pk),
            "grants-0-group": str(ops.pk),
            "grants-0-action": "read",
        }
    )
    r = admin_client.post(url, data)
    assert r.status_code == 200 and "a grant is for one user or one group" in r.content.decode()
    assert "Constraint" not in r.content.decode()  # said once, in words
    assert not Grant.objects.exists() and not AuditEntry.objects.exists()


def test_a_topic_page_has_grants_and_effective_access_with_groups_and_the_creator(admin_client, make):
    # given a topic made by alice, a group granted produce on it, bob in the group and granted
    # consume himself, carol in the group only
    alice, bob, carol = (User.objects.create(username=n) for n in ("alice", "bob", "carol"))
    ops = Group.objects.create(name="ops")
    bob.groups.add(ops)
    carol.groups.add(ops)
    topic = make(kind=Queue.Kind.TOPIC, created_by=alice)
    Grant.objects.create(group=ops, queue=topic, action="produce")
    Grant.objects.create(user=bob, queue=topic, action="consume")
    # when the operator opens the topic's page
    page = admin_client.get(f"/admin/queues/queue/{topic.pk}/change/")
    html = page.content.decode()
    # then it has the grants inline and the effective access: the creator manages, the group
    # produces, bob consumes himself and produces through the group; carol has no row of her own
    assert 'id="grants-group"' in html and 'id="subscriptions-group"' in html
    assert access_row(html, "user:alice") == only(*access.ACTIONS)
    assert access_row(html, "group:ops") == only("read", "produce")
    assert access_row(html, "user:bob") == only("read", "produce", "consume")
    assert access_row(html, "user:carol") is None
    row = re.search(r'<tr data-principal="user:bob">(.*?)</tr>', html, re.S).group(1)
    assert "consume on this topic" in row and "group ops" in row
    assert "creator" in re.search(r'<tr data-principal="user:alice">(.*?)</tr>', html, re.S).group(1)


# ------------------------------------------------------------------------------- the grants list


def test_a_pattern_grant_made_in_the_grants_list_covers_queues_made_later(admin_client, make):
    bob = User.objects.create(username="bob")
    # when the operator grants bob produce on billing-* in the grants list
    r = admin_client.post("/admin/queues/grant/add/", {"user": bob.pk, "pattern": "billing-*", "action": "produce"})
    assert r.status_code == 302, r.context["adminform"].form.errors if r.context else r
    g = Grant.objects.get()
    assert (g.user, g.queue, g.pattern, g.action, g.created_by.username) == (
        bob,
        None,
        "billing-*",
        "produce",
        OPERATOR,
    )
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.target, entry.detail) == (
        OPERATOR,
        "grant",
        "billing-*",
        {"principal": "user:bob", "action": "produce"},
    )
    # then a queue made afterwards whose name matches shows bob as a producer; another does not
    billing, orders = make("billing-eu"), make()
    html = admin_client.get(f"/admin/queues/queue/{billing.pk}/change/").content.decode()
    assert access_row(html, "user:bob") == only("read", "produce")
    assert "produce on billing-*" in html
    html = admin_client.get(f"/admin/queues/queue/{orders.pk}/change/").content.decode()
    assert access_row(html, "user:bob") is None
    # and the rules the API applies agree
    bob_caller = access.Caller.of(bob)
    assert access.granted(bob_caller, billing.pk, billing.name, None) == {"read", "produce"}
    assert access.granted(bob_caller, orders.pk, orders.name, None) == set()


@pytest.mark.parametrize(
    "form, error",
    [
        ({"pattern": "billing/*", "action": "produce"}, "bad pattern &#x27;billing/*&#x27;: a queue name"),
        ({"pattern": "", "action": "produce"}, "a grant is on one queue or on one name pattern"),
        ({"pattern": "billing-*", "action": "own"}, "Select a valid choice"),
    ],
)
def test_the_grants_list_refuses_a_bad_grant(admin_client, form, error):
    bob = User.objects.create(username="bob")
    r = admin_client.post("/admin/queues/grant/add/", {"user": bob.pk, **form})
    assert r.status_code == 200 and error in r.content.decode()
    assert not Grant.objects.exists() and not AuditEntry.objects.exists()


def test_the_grants_list_says_when_a_grant_exists_already(admin_client):
    bob = User.objects.create(username="bob")
    form = {"user": bob.pk, "pattern": "billing-*", "action": "produce"}
    assert admin_client.post("/admin/queues/grant/add/", form).status_code == 302
    r = admin_client.post("/admin/queues/grant/add/", form)
    assert r.status_code == 200 and "this grant exists already" in r.content.decode()
    assert "Constraint" not in r.content.decode()
    assert Grant.objects.count() == 1 and AuditEntry.objects.count() == 1


def test_a_staff_user_may_grant_only_on_what_it_manages(client, make):
    # given a staff user with the admin's grant permissions, who created one queue
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["add_grant", "view_grant", "delete_grant"]))
    bob = User.objects.create(username="bob")
    mine, other = make(created_by=staff), make()
    client.login(username="staff", password="pw")
    # then it may grant on its queue, not on another's (not even offered), nor on a pattern
    r = client.post("/admin/queues/grant/add/", {"user": bob.pk, "queue": mine.pk, "action": "consume"})
    assert r.status_code == 302
    for form, error in (
        ({"queue": other.pk}, "Select a valid choice"),
        ({"pattern": "billing-*"}, "you may not grant"),
    ):
        r = client.post("/admin/queues/grant/add/", {"user": bob.pk, "action": "consume", **form})
        assert r.status_code == 200 and error in r.content.decode()
        assert other.name not in r.content.decode()
    assert [(g.queue, g.action) for g in Grant.objects.all()] == [(mine, "consume")]
    assert AuditEntry.objects.get().actor == "staff"


def test_the_grants_list_filters_by_user_group_and_action_and_searches_names(admin_client, make):
    bob, ops = User.objects.create(username="bob"), Group.objects.create(name="ops")
    orders = make("orders-x")
    Grant.objects.create(user=bob, pattern="billing-*", action="produce")
    Grant.objects.create(group=ops, queue=orders, action="consume")

    def listed(**params) -> str:
        r = admin_client.get("/admin/queues/grant/", params)
        assert r.status_code == 200
        return r.content.decode()

    everything = listed()
    assert "billing-*" in everything and "orders-x" in everything
    by_user = listed(user__id__exact=bob.pk)
    assert "billing-*" in by_user and "orders-x</a>" not in by_user
    by_group = listed(group__id__exact=ops.pk)
    assert "orders-x</a>" in by_group and "billing-*" not in by_group
    by_action = listed(action="consume")
    assert "orders-x</a>" in by_action and "billing-*" not in by_action
    assert "billing-*" in listed(q="billing") and "orders-x</a>" not in listed(q="billing")
    assert "orders-x</a>" in listed(q="orders") and "billing-*" not in listed(q="orders")


def test_deleting_grants_in_the_list_revokes_them_and_records_it(admin_client):
    bob = User.objects.create(username="bob")
    g = Grant.objects.create(user=bob, pattern="billing-*", action="produce")
    r = admin_client.post(
        "/admin/queues/grant/", {"action": "delete_selected", "_selected_action": [g.pk], "post": "yes"}
    )
    assert r.status_code == 302
    assert not Grant.objects.exists()
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.target, entry.detail) == (
        OPERATOR,
        "revoke",
        "billing-*",
        {"principal": "user:bob", "action": "produce"},
    )


# ------------------------------------------------------------------------------ the audit trail


def test_the_audit_trail_is_a_read_only_list_newest_first(admin_client):
    from django.utils import timezone

    a = AuditEntry.objects.create(actor="alice", action="purge", target="orders", detail={"removed": 3})
    b = AuditEntry.objects.create(actor="bob", action="grant", target="billing-*", detail={})
    AuditEntry.objects.filter(pk=a.pk).update(at=timezone.now() - timezone.timedelta(hours=1))
    html = admin_client.get("/admin/queues/auditentry/").content.decode()
    assert html.index("billing-*") < html.index("orders")  # newest first
    assert 'href="/admin/queues/auditentry/add/"' not in html
    # filters by action and actor, search by target
    assert "orders" not in admin_client.get("/admin/queues/auditentry/", {"action": "grant"}).content.decode()
    assert "billing-*" not in admin_client.get("/admin/queues/auditentry/", {"actor": "alice"}).content.decode()
    found = admin_client.get("/admin/queues/auditentry/", {"q": "orde"}).content.decode()
    assert "orders" in found and "billing-*" not in found
    # nothing can be added, changed or deleted
    assert admin_client.get("/admin/queues/auditentry/add/").status_code == 403
    r = admin_client.post(f"/admin/queues/auditentry/{b.pk}/change/", {"actor": "mallory"})
    assert r.status_code == 403
    assert admin_client.post(f"/admin/queues/auditentry/{b.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditEntry.objects.get(pk=b.pk).actor == "bob" and AuditEntry.objects.count() == 2
    # a page shows one entry read-only
    page = admin_client.get(f"/admin/queues/auditentry/{b.pk}/change/")
    assert page.status_code == 200 and "bob" in page.content.decode() and 'name="actor"' not in page.content.decode()


# ------------------------------------------------------------------ manage.py grant / revoke


def run(command: str, *args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue().strip()


def test_manage_py_grant_and_revoke_are_idempotent_and_recorded(make):
    bob, ops = User.objects.create(username="bob"), Group.objects.create(name="ops")
    q = make("orders-y")
    # grant on a pattern to a user, twice: one row, one audit entry
    assert run("grant", "--action", "produce", "--user", "bob", "--pattern", "billing-*") == (
        "granted produce on pattern billing-* to user bob"
    )
    assert run("grant", "--action", "produce", "--user", "bob", "--pattern", "billing-*") == (
        "already granted: produce on pattern billing-* to user bob"
    )
    # grant on a queue to a group
    assert run("grant", "--action", "consume", "--group", "ops", "--queue", "orders-y") == (
        "granted consume on queue orders-y to group ops"
    )
    assert {(g.user, g.group, g.queue, g.pattern, g.action) for g in Grant.objects.all()} == {
        (bob, None, None, "billing-*", "produce"),
        (None, ops, q, "", "consume"),
    }
    assert list(AuditEntry.objects.order_by("id").values_list("actor", "action", "target", "detail")) == [
        ("manage.py", "grant", "billing-*", {"principal": "user:bob", "action": "produce"}),
        ("manage.py", "grant", "orders-y", {"principal": "group:ops", "action": "consume"}),
    ]
    # revoke, twice: gone, one more audit entry
    assert run("revoke", "--action", "produce", "--user", "bob", "--pattern", "billing-*") == (
        "revoked produce on pattern billing-* from user bob"
    )
    assert run("revoke", "--action", "produce", "--user", "bob", "--pattern", "billing-*") == (
        "not granted, nothing to revoke: produce on pattern billing-* from user bob"
    )
    assert [(g.group, g.action) for g in Grant.objects.all()] == [(ops, "consume")]
    assert AuditEntry.objects.filter(action="revoke").count() == 1
    # revoking one grant leaves another: consume stays when a manage it never had is revoked
    run("revoke", "--action", "manage", "--group", "ops", "--queue", "orders-y")
    assert Grant.objects.filter(group=ops, queue=q, action="consume").exists()


@pytest.mark.parametrize("command", ["grant", "revoke"])
@pytest.mark.parametrize(
    "args, error",
    [
        (["--user", "nobody", "--pattern", "billing-*"], "no user named 'nobody'"),
        (["--group", "nobody", "--pattern", "billing-*"], "no group named 'nobody'"),
        (["--user", "bob", "--queue", "no-such-queue"], "no queue or topic named 'no-such-queue'"),
        (["--user", "bob", "--pattern", "billing/*"], "bad pattern 'billing/*'"),
    ],
)
def test_manage_py_grant_and_revoke_refuse_what_names_nothing(db, command, args, error):
    User.objects.create(username="bob")
    with pytest.raises(CommandError, match=re.escape(error)):
        call_command(command, "--action", "produce", *args)
    assert not Grant.objects.exists() and not AuditEntry.objects.exists()


def test_manage_py_grant_from_the_shell_exits_non_zero_on_an_error(transactional_db, tmp_path):
    from django.conf import settings

    User.objects.create(username="bob")
    env = {
        **__import__("os").environ,
        **node_env(database_url=database_url(), data_dir=tmp_path, kv=settings.KV_URL),
    }

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )

    bad = manage("grant", "--action", "produce", "--user", "nobody", "--pattern", "billing-*")
    assert bad.returncode == 1 and "no user named 'nobody'" in bad.stderr, bad
    good = manage("grant", "--action", "produce", "--user", "bob", "--pattern", "billing-*")
    assert good.returncode == 0 and "granted produce on pattern billing-* to user bob" in good.stdout, good
    assert Grant.objects.filter(user__username="bob", pattern="billing-*", action="produce").exists()
    assert AuditEntry.objects.get().actor == "manage.py"


def test_a_pattern_with_a_trailing_newline_is_no_pattern(db):
    # (a form strips it; the service, which every entrance calls, must not let it through:
    # "$" in a regex also matches before a trailing newline)
    from queues.service.errors import InvalidRequest
    from queues.service.grants import check_grant

    root = User.objects.create(username="root-nl", is_superuser=True)
    bob = User.objects.create(username="bob")
    check_grant(caller=access.Caller.of(root), action="produce", user=bob, pattern="billing-*")
    with pytest.raises(InvalidRequest):
        check_grant(caller=access.Caller.of(root), action="produce", user=bob, pattern="billing-*\n")
