"""Who sees and does what in the console: every registered admin times every role, like the API's
``test_permissions.py``.

Roles: the superuser; a staff user with each single permission of a registered model (the
dashboards' own ``consoles.view_dashboards`` included) and no grant; ``reader`` and ``manager``:
staff with every ``view_*`` permission and the dashboards', and a ``read`` / ``manage`` grant on
the queue and the topic named ``shown-...``; ``no_grant``: the same permissions, no grant.

Cells, generated from the admin registry (a newly registered admin fails here until it has a row
in the tables below): its list, the page of an object (``view``), ``add``, ``change`` (the page
is editable), ``delete`` (the confirmation page) and each action (offered on the list); plus the
dashboards page, the overview (and a topic's page), a tree block's messages and the index. Each test builds the same rows: for every model one object that
belongs to the role (a row of ``shown-...``, or the role's own key, token or worker) and one that
does not (a row of ``hidden-...``, another user's key, token or worker), one object for tables no
grant governs (nodes, users, the dashboards job's runs). A model permission opens a list; the grants
(``queues.service.permitted_queues``) choose its rows; outside the superuser's pages, no page
names a ``hidden-...`` queue, and an action posted on a hidden row reaches nothing.

The expected values are the tables below: what the admin offers a holder of each permission
(``OFFERS``, ``ACTIONS``) and whose rows each admin shows (``SCOPE``): one line per model.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.authtoken.models import Token, TokenProxy

from archive import archiver
from archive.models import ArchivedMessage, ArchiverLock
from consoles.models import DashboardRun, EstimateFit, QueueBucketStats
from queues import service
from queues.access import Caller
from queues.models import AuditEntry, Grant, Node, Partition, Queue, Subscription
from sqs.models import AccessKey, QueueSettings
from workers.models import AttemptLog, Consumer

SUPERUSER = "superuser"

# fmt: off
#: model -> whose rows its admin shows a non-superuser: "all" (no grant governs them), "own"
#: (the user's own), "read" / "manage" (of the queues and topics it has that right on).
SCOPE: dict[str, str] = {
    "auth.group":              "all",
    "auth.user":               "all",
    "authtoken.tokenproxy":    "own",
    "queues.queue":            "read",
    "queues.partition":        "read",
    "queues.subscription":     "read",
    "queues.node":             "all",
    "queues.grant":            "manage",
    "queues.auditentry":       "manage",
    "workers.consumer":        "own",
    "workers.attemptlog":      "read",
    "consoles.dashboardrun":   "all",
    "consoles.estimatefit":    "read",
    "archive.archivedmessage": "read",
    "archive.archiverlock":    "read",
    "sqs.accesskey":           "own",
    "sqs.queuesettings":       "read",
}

#: model -> (add, change, delete): whether its admin offers each to a holder of that permission
#: (``SUPERUSER``: to a superuser only). What the service or a process writes (partitions, nodes,
#: workers, attempts, the job's runs and fits, the archive and its locks) is shown, never edited;
#: a token is issued or revoked, never edited; an access key is revoked (an action), and a
#: queue's SQS settings go with the queue: neither is deleted.
OFFERS: dict[str, tuple[bool | str, bool | str, bool | str]] = {
    #                          add    change delete
    "auth.group":              (True,  True,  True),
    "auth.user":               (True,  True,  True),
    "authtoken.tokenproxy":    (True,  False, True),
    "queues.queue":            (True,  True,  True),
    "queues.partition":        (False, False, False),
    "queues.subscription":     (False, True,  True),
    "queues.node":             (False, False, False),
    "queues.grant":            (True,  False, True),
    "queues.auditentry":       (False, False, False),
    "workers.consumer":        (False, False, False),
    "workers.attemptlog":      (False, False, False),
    "consoles.dashboardrun":   (False, False, False),
    "consoles.estimatefit":    (False, False, False),
    "archive.archivedmessage": (False, False, False),
    "archive.archiverlock":    (False, False, False),
    "sqs.accesskey":           (True,  True,  False),
    "sqs.queuesettings":       (True,  True,  False),
}

#: model -> its own actions -> the permission that offers each (None: offered with the list;
#: ``SUPERUSER``: to a superuser only);
#: ``delete_selected`` goes with the delete cell. None: the admin offers no action at all.
ACTIONS: dict[str, dict[str, str | None] | None] = {
    "authtoken.tokenproxy":    None,
    "queues.queue":            {"purge": "queues.purge_queue", "redrive": "queues.redrive_queue"},
    "queues.partition":        {"release_lease": "queues.release_partition"},
    "archive.archivedmessage": {"replay_into_source": "archive.replay_archivedmessage"},
    "sqs.accesskey":           {"revoke": "sqs.change_accesskey"},
}
# fmt: on

#: model -> cell -> the other permission it needs besides its own (Django's user admin: adding
#: a user needs ``change_user`` too).
ALSO: dict[str, dict[str, str]] = {"auth.user": {"add": "change"}}

DASHBOARDS = "consoles.view_dashboards"
GRANT_ROLES = {"reader": "read", "manager": "manage"}


def _label(model) -> str:
    return model._meta.label_lower


REGISTERED = {_label(m): m for m in admin.site._registry}


def _model_permissions() -> dict[str, str]:
    """Every permission of a registered model, as ``app.codename`` -> the model's label (read
    from the models: no database at collection)."""
    perms = {}
    for model in admin.site._registry:
        opts = model._meta
        for codename in [f"{a}_{opts.model_name}" for a in opts.default_permissions] + [c for c, _ in opts.permissions]:
            perms[f"{opts.app_label}.{codename}"] = _label(model)
    return dict(sorted(perms.items()))


PERMISSIONS = _model_permissions()
ROLES = ["superuser", "reader", "manager", "no_grant", *(f"perm:{p}" for p in PERMISSIONS)]
VIEWS = [p for p in PERMISSIONS if p.split(".")[1].startswith("view_")] + [DASHBOARDS]


def test_every_registered_admin_has_a_line_in_each_table():
    assert set(REGISTERED) == set(SCOPE) == set(OFFERS)
    for label, model_admin in admin.site._registry.items():
        expected = ACTIONS.get(_label(label), {})
        assert (model_admin.actions is None) == (expected is None), _label(label)
        assert set(model_admin.actions or ()) == set(expected or ()), _label(label)
    assert DASHBOARDS in PERMISSIONS


# ------------------------------------------------------------------------------------ the rows


class World:
    """The rows every cell looks at: per model ``mine`` (visible to a role with the right) and
    ``theirs`` (visible to the superuser only, unless its scope is ``all``)."""

    def __init__(self, role: str):
        h = uuid.uuid4().hex[:8]
        self.shown, self.hidden = f"shown-{h}", f"hidden-{h}"
        self.other = User.objects.create(username=f"other-{h}")
        carol = User.objects.create(username=f"carol-{h}")
        self.user = User.objects.create(username=f"role-{h}", is_staff=True, is_superuser=role == "superuser")
        if role.startswith("perm:"):
            app, codename = role[5:].split(".")
            self.user.user_permissions.set(Permission.objects.filter(content_type__app_label=app, codename=codename))
        elif role in ("reader", "manager", "no_grant"):
            self.user.user_permissions.set(
                Permission.objects.get(content_type__app_label=p.split(".")[0], codename=p.split(".")[1]) for p in VIEWS
            )
        now = timezone.now()
        node = Node.objects.create(id=f"n-{h}", address=f"node-{h}:8000", started_at=now, heartbeat_at=now)
        rows: dict[str, list] = {label: [] for label in REGISTERED}
        run = DashboardRun.objects.create(
            status=DashboardRun.Status.SUCCEEDED, bucket_seconds=60, window_start=now - timedelta(hours=1)
        )
        for name, owner in ((self.shown, self.user), (self.hidden, self.other)):
            q = Queue.objects.create(name=name, partitions=1, created_by=self.other)
            topic = Queue.objects.create(name=f"{name}-t", kind=Queue.Kind.TOPIC, partitions=1, created_by=self.other)
            if name == self.shown and role in GRANT_ROLES:
                for target in (q, topic):
                    Grant.objects.create(user=self.user, queue=target, action=GRANT_ROLES[role])
            stats = dict.fromkeys(("attempts", "succeeded", "failed", "timed_out", "abandoned", "retries"), 1)
            stats |= {"failure_rate": 0.0, "retry_rate": 0.0, "throughput": 1.0}
            QueueBucketStats.objects.create(
                run=run, queue=name, bucket_seconds=60, bucket_start=now - timedelta(minutes=5), **stats
            )
            consumer = Consumer.objects.create(
                id=f"c-{name}", name=f"worker of {name}", queues=[name], last_heartbeat=now, user=owner
            )
            found = {
                "queues.queue": q,
                "queues.partition": Partition.objects.create(queue=q, index=0),
                "queues.subscription": Subscription.objects.create(topic=topic, name="s"),
                "queues.grant": Grant.objects.create(user=carol, queue=q, action="consume"),
                "queues.auditentry": AuditEntry.objects.create(actor=self.other.username, action="purge", target=name),
                "workers.consumer": consumer,
                "workers.attemptlog": AttemptLog.objects.create(
                    message_id=f"{name}/0/b/0",
                    queue=name,
                    incarnation=q.pk,
                    partition=0,
                    worker=consumer,
                    attempt=1,
                    outcome=AttemptLog.Outcome.FAILED,
                    error=f"boom in {name}",
                    traceback=f"trace of {name}",
                ),
                "consoles.estimatefit": EstimateFit.objects.create(
                    run=run, queue=name, stage="process", n=3, intercept=0, slope=0, median_size=1, estimate=0.5
                ),
                "archive.archivedmessage": ArchivedMessage.objects.create(
                    message_id=f"{name}/0/b/1",
                    queue=name,
                    incarnation=q.pk,
                    partition=0,
                    body=f"secret body of {name}",
                    enqueued_at=now,
                ),
                "archive.archiverlock": ArchiverLock.objects.create(queue=name, expires_at=now),
                "sqs.accesskey": AccessKey.issue(owner, f"key of {name}"),
                "authtoken.tokenproxy": TokenProxy.objects.get(pk=Token.objects.create(user=owner).pk),
                "sqs.queuesettings": QueueSettings.objects.create(queue=q),
            }
            for label, obj in found.items():
                rows[label].append(obj)
        everyone = {
            "auth.group": Group.objects.create(name=f"group-{h}"),
            "auth.user": self.other,
            "queues.node": node,
            "consoles.dashboardrun": run,
        }
        for label, obj in everyone.items():
            rows[label] = [obj, obj]
        missing = [label for label, objs in rows.items() if len(objs) != 2]
        assert not missing, f"no rows for {missing}: add them here"
        self.mine = {label: objs[0] for label, objs in rows.items()}
        self.theirs = {label: objs[1] for label, objs in rows.items()}
        self.client = Client()
        self.client.force_login(self.user)


@pytest.fixture
def world_for(runtime):
    return World


# ------------------------------------------------------------------------- the expected values


def has(role: str, perm: str) -> bool:
    if role == "superuser":
        return True
    if role.startswith("perm:"):
        return role[5:] == perm
    return perm in VIEWS


def may(role: str, label: str, action: str) -> bool:
    """Whether the role holds the model permission ``action`` (view, add, change, delete)."""
    app, model = label.split(".")
    return has(role, f"{app}.{action}_{model}")


def sees(role: str, label: str, mine: bool) -> bool:
    """Whether the role may see the model's ``mine`` row (else the other one), given it may open
    the list at all."""
    if role == "superuser" or SCOPE[label] == "all":
        return True
    if not mine:
        return False
    return {"own": True, "read": role in GRANT_ROLES, "manage": role == "manager"}[SCOPE[label]]


def offers(role: str, label: str, cell: str) -> bool:
    """Whether the admin offers ``cell`` (add, change, delete) to the role."""
    offered = OFFERS[label][("add", "change", "delete").index(cell)]
    if offered == SUPERUSER:
        return role == "superuser"
    needs = [cell, *([ALSO[label][cell]] if cell in ALSO.get(label, {}) else [])]
    return bool(offered) and all(may(role, label, a) for a in needs)


def offered_actions(role: str, label: str) -> set[str]:
    actions = ACTIONS.get(label, {})
    if actions is None:
        return set()
    out = {a for a, perm in actions.items() if perm is None or has(role, perm)}
    if offers(role, label, "delete"):
        out.add("delete_selected")
    return out


# -------------------------------------------------------------------------------------- cells


def _url(label: str, view: str, *args) -> str:
    app, model = label.split(".")
    return reverse(f"admin:{app}_{model}_{view}", args=args)


def _offered(html: str) -> set[str]:
    select = re.search(r'<select name="action".*?</select>', html, re.S)
    return set(re.findall(r'<option value="([^"]+)"', select.group(0))) - {""} if select else set()


def _check_model(w: World, role: str, label: str) -> None:
    client = w.client
    mine, theirs = w.mine[label], w.theirs[label]
    opens = may(role, label, "view") or may(role, label, "change")

    def page(url: str, status: int):
        r = client.get(url)
        assert r.status_code == status, f"{role} {url}: {r.status_code}, expected {status}"
        if status == 302:
            client.get(r["Location"])  # the index, with the message that echoes the ID asked for
            return r
        if role != "superuser":
            assert w.hidden not in r.content.decode(), f"{role} {url} names {w.hidden}"
        return r

    # list: opens with view or change; its rows are those the role may see
    r = page(_url(label, "changelist"), 200 if opens else 403)
    if opens:
        shown = {obj.pk for obj in r.context["cl"].result_list}
        assert (mine.pk in shown) == sees(role, label, True), f"{role} {label} list: mine"
        assert (theirs.pk in shown) == sees(role, label, False), f"{role} {label} list: theirs"
        assert _offered(r.content.decode()) == offered_actions(role, label), f"{role} {label} actions"
    # view: the object's page; one it may not see answers as if it did not exist (302 to the index)
    for obj, is_mine in ((mine, True), (theirs, False)):
        r = page(_url(label, "change", obj.pk), (200 if sees(role, label, is_mine) else 302) if opens else 403)
        # change: the page is a form it may post
        if r.status_code == 200:
            assert r.context["has_change_permission"] == offers(role, label, "change"), f"{role} {label} change"
    # add
    page(_url(label, "add"), 200 if offers(role, label, "add") else 403)
    # delete: the confirmation page
    if offers(role, label, "delete"):
        page(_url(label, "delete", mine.pk), 200 if sees(role, label, True) else 302)
        page(_url(label, "delete", theirs.pk), 200 if sees(role, label, False) else 302)
    else:
        page(_url(label, "delete", mine.pk), 403)
    # an action posted on a row the role may not see reaches nothing
    if opens and not sees(role, label, False):
        model = type(theirs)
        before = (list(model.objects.filter(pk=theirs.pk).values()), AuditEntry.objects.count())
        for action in offered_actions(role, label):
            data = {"action": action, "_selected_action": [theirs.pk], "post": "yes"}
            r = client.post(_url(label, "changelist"), data, follow=True)
            assert w.hidden not in r.content.decode(), f"{role} {label} {action} names {w.hidden}"
            after = (list(model.objects.filter(pk=theirs.pk).values()), AuditEntry.objects.count())
            assert after == before, f"{role} {label} {action} reached a hidden row"


def _check_dashboards(w: World, role: str) -> None:
    opens = has(role, DASHBOARDS)
    r = w.client.get(reverse("admin:dashboards"))
    assert r.status_code == (200 if opens else 403), f"{role} dashboards"
    if opens:
        html = r.content.decode()
        assert (w.shown in html) == (role == "superuser" or role in GRANT_ROLES), f"{role} dashboards: shown"
        if role != "superuser":
            assert w.hidden not in html, f"{role} dashboards name {w.hidden}"
            assert w.client.get(reverse("admin:dashboards"), {"queue": w.hidden}).status_code == 404
    index = w.client.get(reverse("admin:index")).content.decode()
    assert ('id="dashboards-link"' in index) == opens, f"{role} index: dashboards link"


def _check_overview(w: World, role: str) -> None:
    """The overview opens for every staff user and shows the queues and topics it may read (none
    without a grant), with the nodes when it may view nodes; a topic's page is its readers' only."""
    assert w.client.get(reverse("admin:overview")).status_code == 200, f"{role} overview"
    figures = w.client.get(reverse("admin:overview_json")).json()
    names = {q["name"] for q in figures["queues"]}
    owned = {name for n in figures["nodes"] for name in n["owns"]}
    sees = role == "superuser" or role in GRANT_ROLES
    assert ({w.shown, f"{w.shown}-t"} <= names) == sees, f"{role} overview: {names}"
    if role != "superuser":
        assert not any(n.startswith("hidden-") for n in names | owned), f"{role} overview: {names | owned}"
        assert w.client.get(reverse("admin:topic", args=[f"{w.hidden}-t"])).status_code == 404
    assert bool(figures["nodes"]) == has(role, "queues.view_node"), f"{role} overview: nodes"
    topic = w.client.get(reverse("admin:topic", args=[f"{w.shown}-t"]))
    assert topic.status_code == (200 if sees else 404), f"{role} topic page"


def _check_tree_block(w: World, role: str) -> None:
    """A block of a partition's tree (the JSON the drawing's panel reads): with the partitions'
    view permission, of a partition the role may see (its queue's ``read``). Past every check
    it is asked of the owner: 200 (this process took the partition) or 409 (none has yet)."""
    label = "queues.partition"
    for obj, is_mine in ((w.mine[label], True), (w.theirs[label], False)):
        r = w.client.get(reverse("admin:queues_partition_block", args=[obj.pk, "00000000-0123456789abcdef"]))
        opens = may(role, label, "view") or may(role, label, "change")  # (as its page: Django's view)
        expected = ({200, 409} if sees(role, label, is_mine) else {404}) if opens else {403}
        assert r.status_code in expected, f"{role} tree block ({'mine' if is_mine else 'theirs'}): {r.content!r}"
        if role != "superuser":
            assert w.hidden not in r.content.decode(), f"{role} tree block names {w.hidden}"


def _check_index(w: World, role: str, label: str) -> None:
    """A single permission lists its model on the index, and no other."""
    r = w.client.get(reverse("admin:index"))
    listed = {f"{app['app_label']}.{m['object_name'].lower()}" for app in r.context["app_list"] for m in app["models"]}
    # listed where a list or page of it opens: view or change (either opens the list), add, delete
    add, _, delete = (offered is True for offered in OFFERS[label])
    opens = may(role, label, "view") or may(role, label, "change")
    model_perm = opens or (add and may(role, label, "add")) or (delete and may(role, label, "delete"))
    assert listed == ({label} if model_perm else set()), f"{role} index lists {listed}"


@pytest.mark.parametrize("role", ROLES)
def test_console_cell(world_for, role):
    w = world_for(role)
    if role.startswith("perm:"):
        labels = [PERMISSIONS[role[5:]]]  # every other model's list is closed to it: the index shows
        _check_index(w, role, labels[0])
    else:
        labels = list(REGISTERED)
    for label in labels:
        _check_model(w, role, label)
    _check_dashboards(w, role)
    _check_overview(w, role)
    _check_tree_block(w, role)


# ------------------------------------------------------------- rules the matrix does not show


def _staff(username: str, *perms: str, grants: dict | None = None) -> tuple[User, Client]:
    user = User.objects.create(username=username, is_staff=True)
    user.user_permissions.set(
        Permission.objects.get(content_type__app_label=p.split(".")[0], codename=p.split(".")[1]) for p in perms
    )
    for q, action in (grants or {}).items():
        Grant.objects.create(user=user, queue=q, action=action)
    client = Client()
    client.force_login(user)
    return user, client


def test_who_else_may_act_on_a_queue_is_shown_to_its_managers_only(runtime, unique_name):
    # given a queue with a grant to carol, a reader of it and a manager of it
    q = Queue.objects.create(name=unique_name(), partitions=1)
    carol = User.objects.create(username=f"carol-{uuid.uuid4().hex[:6]}")
    Grant.objects.create(user=carol, queue=q, action="consume")
    perms = ("queues.view_queue", "queues.view_grant")
    reader, as_reader = _staff("reader", *perms, grants={q: "read"})
    _, as_manager = _staff("manager", *perms, grants={q: "manage"})
    page = _url("queues.queue", "change", q.pk)
    # then the reader sees the queue, not its grants nor its effective access
    html = as_reader.get(page).content.decode()
    assert q.name in html and 'class="effective-access"' not in html and carol.username not in html
    # and in the grants list only its own grant
    rows = as_reader.get(_url("queues.grant", "changelist")).context["cl"].result_list
    assert [(g.user, g.action) for g in rows] == [(reader, "read")]
    # while the manager sees both, and carol's row in the effective access
    html = as_manager.get(page).content.decode()
    assert 'class="effective-access"' in html and f'data-principal="user:{carol.username}"' in html
    rows = as_manager.get(_url("queues.grant", "changelist")).context["cl"].result_list
    assert {g.user.username for g in rows} == {carol.username, "reader", "manager"}


def test_a_worker_is_shown_to_its_user_and_to_readers_of_every_queue_it_consumes(runtime, unique_name):
    mine, other = Queue.objects.create(name=unique_name(), partitions=1), Queue.objects.create(name=unique_name())
    owner = User.objects.create(username="worker-owner")
    now = timezone.now()
    only_mine = Consumer.objects.create(id="c1", queues=[f"{mine.name}/0"], last_heartbeat=now, user=owner)
    both = Consumer.objects.create(id="c2", queues=[mine.name, other.name], last_heartbeat=now, user=owner)
    user, client = _staff("reader", "workers.view_consumer", grants={mine: "read"})
    own = Consumer.objects.create(id="c3", queues=[other.name], last_heartbeat=now, user=user)
    rows = client.get(_url("workers.consumer", "changelist")).context["cl"].result_list
    assert {c.pk for c in rows} == {only_mine.pk, own.pk}
    assert client.get(_url("workers.consumer", "change", both.pk)).status_code == 302


def test_the_audit_trail_shows_a_user_its_own_actions_and_those_on_queues_it_manages(runtime, unique_name):
    managed, read_only = Queue.objects.create(name=unique_name()), Queue.objects.create(name=unique_name())
    _user, client = _staff("auditor", "queues.view_auditentry", grants={managed: "manage", read_only: "read"})
    entries = {
        "on its queue": AuditEntry.objects.create(actor="x", action="change", target=managed.name),
        "on its subscription": AuditEntry.objects.create(actor="x", action="subscribe", target=f"{managed.name}/s"),
        "on its partition": AuditEntry.objects.create(actor="x", action="release", target=f"{managed.name}/0"),
        "by it": AuditEntry.objects.create(actor="auditor", action="purge", target="elsewhere"),
    }
    AuditEntry.objects.create(actor="x", action="purge", target=read_only.name)
    AuditEntry.objects.create(actor="x", action="grant", target=f"{managed.name}x")  # a longer name, not its queue
    AuditEntry.objects.create(actor="x", action="grant", target="billing-*")
    rows = client.get(_url("queues.auditentry", "changelist")).context["cl"].result_list
    assert {e.pk for e in rows} == {e.pk for e in entries.values()}


def test_a_queue_choice_offers_only_the_queues_the_user_may_use(runtime, unique_name):
    mine, read_only = Queue.objects.create(name=unique_name()), Queue.objects.create(name=unique_name())
    hidden = Queue.objects.create(name=unique_name())
    _, client = _staff(
        "chooser", "queues.view_queue", "queues.change_queue", "queues.add_grant", "queues.view_grant",
        grants={mine: "manage", read_only: "read"},
    )  # fmt: skip
    # the dead-letter queue of its queue: the queues it may read
    html = client.get(_url("queues.queue", "change", mine.pk)).content.decode()
    assert read_only.name in html and hidden.name not in html
    # a grant: on the queues it manages
    html = client.get(_url("queues.grant", "add")).content.decode()
    assert mine.name in html and read_only.name not in html and hidden.name not in html


def test_a_queue_made_again_under_a_deleted_ones_name_shows_none_of_its_history(api, purge_kv, unique_name):
    # given Alice's queue, archiving everything, whose messages failed once in a worker
    name = unique_name("payroll")
    r = api.post("/api/v1/queues", {"name": name, "partitions": 1, "archive": "all"}, format="json")
    assert r.status_code == 201, r.content
    r = api.post(f"/api/v1/queues/{name}/enqueue", {"messages": [{"body": "salary"}]}, format="json")
    assert r.status_code == 201, r.content
    (held,) = api.post(f"/api/v1/queues/{name}/dequeue", {"max": 10}, format="json").json()["messages"]
    report = {"message_id": held["id"], "attempt": 1, "outcome": "failed", "error": "secret", "traceback": "pin"}
    assert api.post("/api/v1/logs", {"records": [report]}, format="json").status_code == 201
    ack = {"messages": [{"id": held["id"], "receipt": held["receipt"]}]}
    assert api.post(f"/api/v1/queues/{name}/ack", ack, format="json").status_code == 200
    archiver.run(name, store=service.get_runtime().store)
    old_archive = list(ArchivedMessage.objects.filter(message_id=held["id"]).values_list("pk", flat=True))
    old_attempts = list(AttemptLog.objects.filter(message_id=held["id"]).values_list("pk", flat=True))
    assert len(old_archive) == len(old_attempts) == 1
    # when Alice deletes it, and Mallory, staff who may view the archive and the attempt log,
    # with no grant, creates a queue of that name, with history of its own
    assert api.delete(f"/api/v1/queues/{name}").status_code == 204
    mallory, as_mallory = _staff(
        f"mallory-{uuid.uuid4().hex[:6]}", "archive.view_archivedmessage", "workers.view_attemptlog"
    )
    new = service.create_queue(caller=Caller.of(mallory), name=name, partitions=1)
    own = {
        "archive.archivedmessage": ArchivedMessage.objects.create(
            message_id=f"{name}/0/b/9", queue=name, incarnation=new.pk, partition=0, body="mine",
            enqueued_at=timezone.now(),
        ).pk,
        "workers.attemptlog": AttemptLog.objects.create(
            message_id=f"{name}/0/b/9", queue=name, incarnation=new.pk, partition=0, attempt=1,
            outcome=AttemptLog.Outcome.FAILED, error="mine",
        ).pk,
    }  # fmt: skip
    as_root = Client()
    as_root.force_login(User.objects.create(username=f"root-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True))
    for label, old in (("archive.archivedmessage", old_archive), ("workers.attemptlog", old_attempts)):
        # then her lists show her queue's rows and none of the old queue's, nor do its pages open
        rows = as_mallory.get(_url(label, "changelist")).context["cl"].result_list
        assert [row.pk for row in rows] == [own[label]], label
        assert as_mallory.get(_url(label, "change", old[0])).status_code == 302, label
        # while a superuser still sees both
        rows = as_root.get(_url(label, "changelist")).context["cl"].result_list
        assert {row.pk for row in rows} >= {own[label], *old}, label
        assert as_root.get(_url(label, "change", old[0])).status_code == 200, label


def test_the_dashboards_list_no_queue_deleted_since(purge_kv, unique_name):
    # given the dashboards job's figures of two queues, one of which is then deleted (as SQS's
    # DeleteQueue does it: through the service)
    from queues.access import SYSTEM

    now = timezone.now()
    run = DashboardRun.objects.create(
        status=DashboardRun.Status.SUCCEEDED, bucket_seconds=60, window_start=now - timedelta(hours=1)
    )
    kept, gone = unique_name("kept"), unique_name("gone")
    for name in (kept, gone):
        service.create_queue(caller=SYSTEM, name=name, partitions=1)
        stats = dict.fromkeys(("attempts", "succeeded", "failed", "timed_out", "abandoned", "retries"), 1)
        stats |= {"failure_rate": 0.0, "retry_rate": 0.0, "throughput": 1.0}
        QueueBucketStats.objects.create(
            run=run, queue=name, bucket_seconds=60, bucket_start=now - timedelta(minutes=5), **stats
        )
    service.delete_queue(Queue.objects.get(name=gone), caller=SYSTEM)
    # when a superuser opens the dashboards
    root = Client()
    root.force_login(User.objects.create(username=f"root-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True))
    r = root.get(reverse("admin:dashboards"))
    # then the queue table and the queue choice name the queue that exists, not the deleted one
    assert [t["queue"] for t in r.context["overview"]] == [kept]
    assert r.context["queues"] == [kept]
    assert gone not in r.content.decode()
    assert root.get(reverse("admin:dashboards"), {"queue": gone}).status_code == 404
