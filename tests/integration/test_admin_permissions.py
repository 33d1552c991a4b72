"""Each console action needs its own Django permission, and then the service's grant on the queue.

A staff user who may only view queues, partitions or the archive is offered no action, and a
posted action does nothing; one given the action's permission runs it through the service as
itself, so a queue it has no grant on stays untouched.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from archive.models import ArchivedMessage
from queues import service
from queues.access import SYSTEM, Caller
from queues.models import Partition, Queue
from queues.service.types import MessageDraft

pytestmark = pytest.mark.usefixtures("purge_kv")


def _staff(user, *codenames: str) -> Client:
    """Log ``user`` in to the console as staff with exactly these permissions."""
    user.is_staff = True
    user.set_password("pw")
    user.save()
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    assert client.login(username=user.username, password="pw")
    return client


def _offered(client: Client, url: str) -> set[str]:
    html = client.get(url).content.decode()
    select = re.search(r'<select name="action".*?</select>', html, re.S)
    return set(re.findall(r'<option value="([^"]+)"', select.group(0))) - {""} if select else set()


def _filled(api, make_queue) -> str:
    name = make_queue(partitions=1)
    for _ in range(3):
        assert api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json").status_code == 201
    return name


def _depth(api, name: str) -> int:
    return api.get(f"/api/v1/queues/{name}/stats").json()["depth"]


def test_a_staff_user_who_may_only_view_queues_cannot_purge_one_it_manages(api, make_queue, user):
    # given a queue this user created (the service lets it manage it) and view rights only
    name = _filled(api, make_queue)
    client = _staff(user, "view_queue")
    # then the console offers it no action on queues
    assert _offered(client, "/admin/queues/queue/") & {"purge", "redrive"} == set()
    # and a posted purge or redrive changes nothing
    pk = Queue.objects.get(name=name).pk
    for action in ("purge", "redrive"):
        r = client.post("/admin/queues/queue/", {"action": action, "_selected_action": [pk]}, follow=True)
        assert r.status_code == 200 and "purged" not in r.content.decode()
    assert _depth(api, name) == 3


def test_the_purge_permission_offers_purge_on_the_queues_the_user_may_see(api, make_queue, user, django_user_model):
    # given a staff user with the purge permission, the creator of one queue but not of another
    mine = _filled(api, make_queue)
    someone_else = Caller.of(django_user_model.objects.create(username="someone-else"))
    other = service.create_queue(name=f"{mine}-other", partitions=1, caller=someone_else).name
    service.enqueue(other, [MessageDraft("x")] * 3, caller=someone_else)
    client = _staff(user, "view_queue", "purge_queue")
    assert "purge" in _offered(client, "/admin/queues/queue/")
    assert "redrive" not in _offered(client, "/admin/queues/queue/")
    # when it posts a purge of both
    pks = list(Queue.objects.filter(name__in=[mine, other]).values_list("pk", flat=True))
    r = client.post("/admin/queues/queue/", {"action": "purge", "_selected_action": pks}, follow=True)
    # then its own queue is purged; the other one (no grant) is not in its list, so the action
    # never reaches it, and the page does not name it
    html = r.content.decode().lower()
    assert f"{mine}: purged 3 messages" in html and other not in html
    assert _depth(api, mine) == 0
    assert service.queue_stats(other, caller=SYSTEM)["depth"] == 3


def test_releasing_a_lease_needs_its_own_permission(api, make_queue, user, runtime):
    # given a partition this node owns, and a staff user who may only view partitions
    name = make_queue(partitions=1)
    p = Partition.objects.get(queue__name=name)
    assert p.owner_id == runtime.node_id
    client = _staff(user, "view_partition")
    # then release is not offered, and a posted one leaves the lease where it is
    assert "release_lease" not in _offered(client, "/admin/queues/partition/")
    client.post("/admin/queues/partition/", {"action": "release_lease", "_selected_action": [p.pk]})
    p.refresh_from_db()
    assert p.owner_id == runtime.node_id and p.epoch == Partition.objects.get(pk=p.pk).epoch
    # and with the permission it is offered
    client = _staff(user, "view_partition", "release_partition")
    assert "release_lease" in _offered(client, "/admin/queues/partition/")


def test_replaying_the_archive_needs_its_own_permission(api, make_queue, user):
    # given an archived message of a queue this user manages, and view rights on the archive
    name = make_queue(partitions=1)
    row = ArchivedMessage.objects.create(
        message_id=f"{name}-m1",
        queue=name,
        incarnation=Queue.objects.get(name=name).pk,
        partition=0,
        body="old",
        enqueued_at=timezone.now(),
    )
    client = _staff(user, "view_archivedmessage")
    # then replay is not offered, and a posted one replays nothing
    assert "replay_into_source" not in _offered(client, "/admin/archive/archivedmessage/")
    client.post("/admin/archive/archivedmessage/", {"action": "replay_into_source", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.replay_count == 0 and _depth(api, name) == 0
    # and with the permission it is offered and replays through the service
    client = _staff(user, "view_archivedmessage", "replay_archivedmessage")
    assert "replay_into_source" in _offered(client, "/admin/archive/archivedmessage/")
    r = client.post(
        "/admin/archive/archivedmessage/",
        {"action": "replay_into_source", "_selected_action": [row.pk]},
        follow=True,
    )
    assert "1 message(s) replayed" in r.content.decode(), r.content.decode()[-3000:]
    assert _depth(api, name) == 1
