"""The console writes through the service layer: a subscription's and a queue's SQS settings are
changed with the same checks and audit entry as the API's calls, and no registered ModelAdmin
writes the service's state by itself (the enforcement walk at the end)."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from django.contrib.admin.sites import all_sites
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from queues import service
from queues.access import Caller
from queues.models import AuditEntry, Queue, Subscription
from sqs.models import QueueSettings
from tests.integration.test_grants_admin import change_form_data

pytestmark = pytest.mark.usefixtures("purge_kv")


def _staff(user: User, *codenames: str) -> Client:
    """Log ``user`` in to the console as staff with exactly these permissions."""
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


# ------------------------------------------------------------------------------- subscriptions


@pytest.fixture
def alice(db):
    return User.objects.create(username="alice")


def _topic_with_subscription(alice: User, unique_name) -> Subscription:
    owner = Caller.of(alice)
    topic = service.create_queue(caller=owner, name=unique_name("t"), kind="topic", partitions=1)
    return service.create_subscription(topic, caller=owner, name="payroll")


def _post_subscription(client: Client, sub: Subscription, dlq: Queue, max_receives: int = 1):
    return client.post(
        f"/admin/queues/subscription/{sub.pk}/change/",
        {"visibility_timeout": "", "dead_letter_queue": str(dlq.pk), "max_receives": str(max_receives)},
        follow=True,
    )


def test_a_subscription_change_needs_manage_on_the_topic_and_produce_on_its_dead_letter_queue(
    alice, user, unique_name, runtime
):
    # given Alice's topic and subscription, and a staff user who may change subscriptions in
    # the console and has a queue of their own to read dead letters from
    sub = _topic_with_subscription(alice, unique_name)
    mallory = Caller.of(user)
    own = service.create_queue(caller=mallory, name=unique_name("mine"), partitions=1)
    client = _staff(user, "view_subscription", "change_subscription")
    for grant in (None, "read"):
        if grant:
            service.grant(caller=Caller.of(alice), user=user, queue=sub.topic, action=grant)
        # when they point Alice's subscription's dead letters to their own queue, after one
        # receive: with no grant on the topic, then with read only
        r = _post_subscription(client, sub, own)
        # then nothing changes: with no grant the console has no such subscription for them
        # (its page answers as if it did not exist); with read, the service wants manage
        sub.refresh_from_db()
        assert (sub.dead_letter_queue_id, sub.max_receives) == (None, None), grant
        if grant is None:
            assert [status for _, status in r.redirect_chain] == [302] and "exist" in r.content.decode()
        else:
            assert "may not" in r.content.decode(), r.content.decode()[-3000:]
        assert not AuditEntry.objects.filter(action="change", target=f"{sub.topic.name}/payroll").exists()

    # given manage on the topic, and a dead-letter queue of someone else they may only read
    service.grant(caller=Caller.of(alice), user=user, queue=sub.topic, action="manage")
    theirs = service.create_queue(caller=Caller.of(alice), name=unique_name("alices"), partitions=1)
    service.grant(caller=Caller.of(alice), user=user, queue=theirs, action="read")
    # when they point the dead letters there
    r = _post_subscription(client, sub, theirs)
    # then it is refused too: naming a dead-letter queue is writing to it (produce)
    sub.refresh_from_db()
    assert sub.dead_letter_queue_id is None
    assert "may not produce" in r.content.decode(), r.content.decode()[-3000:]

    # when they point them to their own queue (manage on the topic, produce on the queue)
    r = _post_subscription(client, sub, own, max_receives=3)
    # then it is changed, recorded in the audit trail as their change, and the topic's owner
    # (this node) serves the new rule
    assert r.status_code == 200
    sub.refresh_from_db()
    assert (sub.dead_letter_queue_id, sub.max_receives) == (own.pk, 3)
    entry = AuditEntry.objects.get(action="change", target=f"{sub.topic.name}/payroll")
    assert entry.actor == user.username
    assert entry.detail == {"fields": {"dead_letter_queue": own.name, "max_receives": 3}}
    spec = runtime.queues[sub.topic.name].subscription("payroll")
    assert (spec.dead_letter_queue, spec.max_receives) == (own.name, 3)


def test_update_subscription_refuses_its_fixed_settings(alice, unique_name, runtime):
    sub = _topic_with_subscription(alice, unique_name)
    with pytest.raises(service.InvalidRequest) as exc:
        service.update_subscription(sub, caller=Caller.of(alice), name="renamed")
    assert exc.value.code == "read_only_setting"
    sub.refresh_from_db()
    assert sub.name == "payroll"


# ------------------------------------------------------------------------------- SQS settings


def _fifo_with_settings(alice: User, unique_name) -> Queue:
    q = service.create_queue(caller=Caller.of(alice), name=unique_name("pay") + "-fifo", strict=True, partitions=1)
    QueueSettings.objects.create(queue=q, opaque={"DeduplicationScope": "queue"})
    return q


def _post_settings(client: Client, q: Queue, opaque: dict):
    return client.post(
        f"/admin/sqs/queuesettings/{q.pk}/change/",
        {"receive_wait": "0", "tags": "{}", "opaque": json.dumps(opaque)},
        follow=True,
    )


def test_a_staff_user_without_manage_cannot_switch_a_fifo_queues_deduplication_scope(alice, user, unique_name):
    # given Alice's FIFO queue, deduplicated per queue, and a staff user who may change SQS
    # settings in the console but has no grant on it (then only read)
    q = _fifo_with_settings(alice, unique_name)
    client = _staff(user, "view_queuesettings", "change_queuesettings")
    for grant in (None, "read"):
        if grant:
            service.grant(caller=Caller.of(alice), user=user, queue=q, action=grant)
        # when they switch it to per message group
        r = _post_settings(client, q, {"DeduplicationScope": "messageGroup"})
        # then it stays as it was
        assert QueueSettings.objects.get(queue=q).opaque == {"DeduplicationScope": "queue"}, grant
        assert r.status_code in (200, 403, 404)
    assert "may not manage" in r.content.decode(), r.content.decode()[-3000:]
    assert not AuditEntry.objects.filter(action="change", target=q.name, actor=user.username).exists()


def test_the_queues_manager_changes_its_sqs_settings_in_the_console_recorded(alice, unique_name):
    # given Alice, staff with the permission, who manages her FIFO queue (its creator)
    q = _fifo_with_settings(alice, unique_name)
    client = _staff(alice, "view_queuesettings", "change_queuesettings")
    # when she switches its deduplication scope
    r = _post_settings(client, q, {"DeduplicationScope": "messageGroup"})
    # then it is changed through the service, and recorded
    assert r.status_code == 200
    assert QueueSettings.objects.get(queue=q).opaque == {"DeduplicationScope": "messageGroup"}
    entry = AuditEntry.objects.get(action="change", target=q.name, actor="alice")
    assert entry.detail == {"sqs": {"opaque": {"DeduplicationScope": "messageGroup"}}}
    # and what the SQS API would refuse, the console refuses too
    r = _post_settings(client, q, {"FifoQueue": "false"})
    assert "not an SQS attribute kept as given: FifoQueue" in r.content.decode()
    assert QueueSettings.objects.get(queue=q).opaque == {"DeduplicationScope": "messageGroup"}


# ------------------------------------------------------------------------------- the Spark job


def test_the_dashboards_job_applies_learned_estimates_through_the_service(alice, unique_name):
    from consoles.models import DashboardRun, EstimateFit
    from consoles.spark import job

    q = service.create_queue(caller=Caller.of(alice), name=unique_name(), partitions=1)
    record = DashboardRun.objects.create(trigger="test", master="local", bucket_seconds=60, window_start=timezone.now())
    fit = {
        "queue": q.name,
        "stage": "process",
        "n": 40,
        "intercept": 0.01,
        "slope": 0.001,
        "r2": 0.9,
        "rmse": 0.001,
        "median_size": 30.0,
        "estimate": 0.04,
    }
    with service_writes() as writes:
        job.write(record, job.Results(fits=[fit]), job.Options(apply_estimates=True))
    assert Queue.objects.get(pk=q.pk).process_estimate == pytest.approx(0.04)
    assert EstimateFit.objects.get(queue=q.name).applied
    assert writes.outside("queues_") == []
    assert any(table == "queues_queue" for table, _ in writes.inside)


# ------------------------------------------------------------------------------- enforcement

#: The modules whose functions are the service layer: the core's, and the apps' own writes that
#: follow its contract (``sqs.service``: keys and SQS settings; ``archive.replay``: replays).
SERVICE_MODULES = ("queues.service", "sqs.service", "archive.replay")
#: The tables that hold the service's state: the project's apps' and the API tokens'.
SERVICE_TABLES = ("queues_", "sqs_", "archive_", "workers_", "consoles_", "authtoken_")
#: Registered admins that are not the service's: Django's own accounts. (A user's delete takes
#: its tokens, keys and grants with it: who may delete users is Django's permission, not a
#: queue's grant.)
NOT_THE_SERVICES = {"auth.User", "auth.Group"}
PROJECT_PACKAGES = ("queues", "sqs", "archive", "workers", "consoles", "config")


@dataclass
class Writes:
    #: (table, statement) of every INSERT, UPDATE or DELETE, by whether a service function ran it.
    inside: list[tuple[str, str]] = field(default_factory=list)
    all_outside: list[tuple[str, str]] = field(default_factory=list)

    def outside(self, *prefixes: str) -> list[tuple[str, str]]:
        return [w for w in self.all_outside if w[0].startswith(prefixes or SERVICE_TABLES)]


def _written_table(sql: str) -> str | None:
    words = sql.lstrip().split(None, 4)
    if not words:
        return None
    verb = words[0].upper()
    if verb == "INSERT" and len(words) > 2:
        name = words[2]
    elif verb == "UPDATE" and len(words) > 1:
        name = words[1]
    elif verb == "DELETE" and len(words) > 2:
        name = words[2]
    else:
        return None
    return name.strip('"').split("(")[0].strip('"')


def _in_service() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(SERVICE_MODULES):
            return True
        frame = frame.f_back
    return False


@contextmanager
def service_writes():
    """Every statement that writes a table, each with whether a service function is on the
    stack that runs it (this thread's connection: the test client serves in this thread)."""
    writes = Writes()

    def wrapper(execute, sql, params, many, context):
        table = _written_table(sql)
        if table is not None:
            (writes.inside if _in_service() else writes.all_outside).append((table, sql[:120]))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield writes


def _defined_in(cls: type, name: str) -> str:
    """The module of the class in ``cls``'s MRO that defines attribute ``name``."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass.__module__
    return ""


def _project(cls: type, name: str) -> bool:
    return _defined_in(cls, name).startswith(PROJECT_PACKAGES)


def _registered():
    for site in all_sites:
        for model, model_admin in site._registry.items():
            if model._meta.label not in NOT_THE_SERVICES:
                yield site, model, model_admin


def test_every_admin_write_path_is_the_projects_own(db):
    """Static half of the enforcement: for every ModelAdmin of every admin site (the console is
    the default one, ``consoles.admin_site``), each way Django's admin would write through it
    for a superuser is a method the project defines, not Django's default, which saves or
    deletes the row itself: ``save_model`` (add, change), ``delete_model`` / ``delete_queryset``
    (delete, the ``delete_selected`` action), ``save_formset`` (an inline a superuser may add
    to, change or delete from), and every other action. A new admin, or a new permission on an
    old one, fails here until its writes are routed through the service (or refused). The
    dynamic half (below) then checks that these methods do go through the service."""
    su = User.objects.create(username="root-static", is_staff=True, is_superuser=True)
    request = RequestFactory().get("/admin/")
    request.user = su
    problems = []
    for _site, model, ma in _registered():
        label, cls = model._meta.label, type(ma)
        if (ma.has_add_permission(request) or ma.has_change_permission(request)) and not _project(cls, "save_model"):
            problems.append(f"{label}: save_model is Django's (it saves the form's row itself)")
        actions = ma.get_actions(request)
        if ma.has_delete_permission(request) or "delete_selected" in actions:
            for name in ("delete_model", "delete_queryset"):
                if not _project(cls, name):
                    problems.append(f"{label}: {name} is Django's (it deletes the rows itself)")
        inlines = {type(i): i for i in ma.get_inline_instances(request, None)}
        inlines.update({i: i(model, ma.admin_site) for i in getattr(ma, "inlines", ()) if i not in inlines})
        for inline in inlines.values():
            editable = bool(inline.get_formset(request, None).form.base_fields)
            writable = (
                inline.has_add_permission(request, None)
                or (inline.has_change_permission(request, None) and editable)
                or (inline.can_delete and inline.has_delete_permission(request, None))
            )
            if writable and not _project(cls, "save_formset"):
                problems.append(f"{label}: its inline {type(inline).__name__} is saved by Django's save_formset")
        for name, (func, _, _) in actions.items():
            if name != "delete_selected" and not getattr(func, "__module__", "").startswith(PROJECT_PACKAGES):
                problems.append(f"{label}: action {name} is not the project's")
    assert problems == []


#: A value for each model's add form where the console may add one, over the form's initial
#: values (``None``: the console adds none). Keys are model labels.
def _add_data(model_label: str, ctx: dict) -> dict | None:
    return {
        "queues.Queue": {"name": ctx["new_name"]},
        "queues.Grant": {"user": str(ctx["carol"].pk), "queue": str(ctx["queue"].pk), "action": "read"},
        "sqs.AccessKey": {"user": str(ctx["carol"].pk), "description": "walk"},
        "sqs.QueueSettings": {"queue": str(ctx["bare"].pk), "receive_wait": "5", "tags": "{}", "opaque": "{}"},
        "authtoken.TokenProxy": {"user": str(ctx["carol"].pk)},
    }.get(model_label)


def _samples(runtime, unique_name) -> tuple[dict, dict]:
    """One row of every model the console registers (label -> row), and what the add forms name."""
    from rest_framework.authtoken.models import Token, TokenProxy

    from archive.models import ArchivedMessage, ArchiverLock
    from consoles.models import DashboardRun, EstimateFit
    from queues.access import SYSTEM
    from queues.models import AuditEntry, Node, Partition
    from sqs.models import AccessKey
    from workers.models import AttemptLog, Consumer

    bob = User.objects.create(username=f"bob-{unique_name()}")
    queue = service.create_queue(caller=SYSTEM, name=unique_name(), partitions=1)
    bare = service.create_queue(caller=SYSTEM, name=unique_name(), partitions=1)
    topic = service.create_queue(caller=SYSTEM, name=unique_name("t"), kind="topic", partitions=1)
    sub = service.create_subscription(topic, caller=SYSTEM, name="s1")
    grant, _ = service.grant(caller=SYSTEM, user=bob, queue=queue, action="consume")
    run = DashboardRun.objects.create(trigger="test", master="local", bucket_seconds=60, window_start=timezone.now())
    consumer = Consumer.objects.create(id="c-walk", name="walker", last_heartbeat=timezone.now())
    rows = {
        "queues.Queue": queue,
        "queues.Partition": Partition.objects.filter(queue=queue).first(),
        "queues.Node": Node.objects.get(pk=runtime.node_id),
        "queues.Grant": grant,
        "queues.AuditEntry": AuditEntry.objects.first(),
        "queues.Subscription": sub,
        "sqs.AccessKey": AccessKey.issue(bob, "walk"),
        "sqs.QueueSettings": QueueSettings.objects.create(queue=queue, receive_wait=1),
        "archive.ArchivedMessage": ArchivedMessage.objects.create(
            message_id=f"{queue.name}/0/x/0", queue=queue.name, partition=0, body="old", enqueued_at=timezone.now()
        ),
        "archive.ArchiverLock": ArchiverLock.objects.create(
            queue=queue.name, holder="walker", expires_at=timezone.now()
        ),
        "workers.Consumer": consumer,
        "workers.AttemptLog": AttemptLog.objects.create(
            message_id=f"{queue.name}/0/x/0",
            queue=queue.name,
            partition=0,
            attempt=1,
            outcome="succeeded",
            worker=consumer,
        ),
        "consoles.DashboardRun": run,
        "consoles.EstimateFit": EstimateFit.objects.create(
            run=run,
            queue=queue.name,
            stage="process",
            n=2,
            intercept=0,
            slope=0,
            r2=1,
            rmse=0,
            median_size=1,
            estimate=0.1,
            previous=0,
            applied=False,
            created_at=timezone.now(),
        ),
        "authtoken.TokenProxy": TokenProxy.objects.get(pk=Token.objects.create(user=bob).pk),
    }
    ctx = {"carol": User.objects.create(username=f"carol-{unique_name()}"), "queue": queue, "bare": bare}
    ctx["new_name"] = unique_name("added")
    return rows, ctx


def test_every_admin_writes_only_through_the_service(runtime, unique_name):
    """Dynamic half of the enforcement: a superuser drives every registered ModelAdmin through
    the Django test client (its list, its add form where one is offered, its change form posted
    back unchanged, every action on a row, its delete), while every SQL statement that writes a
    table of the service's state (the project's apps', the API tokens') is checked: a service
    function (``SERVICE_MODULES``) must be on the Python stack that runs it. Whatever a ModelAdmin
    writes by itself, by ``obj.save()``, a queryset's ``update()``/``delete()`` or a cascade, is
    caught at the database's door, so no way of writing is missed. A registered model with no
    sample row below fails the test: add one, with its add form's values if it has one."""
    rows, ctx = _samples(runtime, unique_name)
    su = User.objects.create(username="root-walk", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(su)
    request = RequestFactory().get("/admin/")
    request.user = su
    missing = [model._meta.label for _, model, _ in _registered() if model._meta.label not in rows]
    assert missing == [], "no sample row for these registered models: add one to _samples"
    admins = sorted(_registered(), key=lambda r: r[1]._meta.label == "queues.Queue")  # its delete cascades: last
    with service_writes() as writes:
        for site, model, ma in admins:
            label = model._meta.label
            base = reverse(f"{site.name}:{model._meta.app_label}_{model._meta.model_name}_changelist")
            obj = rows[label]
            object_id = obj.user_id if label == "authtoken.TokenProxy" else obj.pk
            assert client.get(base).status_code == 200, label
            if ma.has_add_permission(request):
                page = client.get(base + "add/")
                data = change_form_data(page)
                extra = _add_data(label, ctx)
                assert extra is not None, f"{label}: the console adds one: give _add_data its values"
                data.update(extra)
                r = client.post(base + "add/", data)
                assert r.status_code == 302, (label, r.context["errors"] if r.context else r)
            page = client.get(f"{base}{object_id}/change/")
            assert page.status_code == 200, label
            if ma.has_change_permission(request, obj):
                r = client.post(f"{base}{object_id}/change/", change_form_data(page))
                assert r.status_code in (200, 302), label
            for action in ma.get_actions(request):
                if action != "delete_selected":
                    client.post(base, {"action": action, "_selected_action": [str(obj.pk)]})
        for site, model, ma in admins:  # then the deletes, the queue's last
            label = model._meta.label
            base = reverse(f"{site.name}:{model._meta.app_label}_{model._meta.model_name}_changelist")
            obj = rows[label]
            object_id = obj.user_id if label == "authtoken.TokenProxy" else obj.pk
            if "delete_selected" in ma.get_actions(request):
                client.post(base, {"action": "delete_selected", "_selected_action": [str(obj.pk)], "post": "yes"})
            if ma.has_delete_permission(request, obj):
                client.post(f"{base}{object_id}/delete/", {"post": "yes"})
    assert writes.outside() == []
    # and the walk wrote through the service (it is not a walk that changed nothing)
    written = {table for table, _ in writes.inside}
    assert {"queues_queue", "queues_grant", "sqs_accesskey", "sqs_queuesettings", "authtoken_token"} <= written
