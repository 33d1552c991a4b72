"""Consumer rows and dedup rows are bounded and expire.

Issue 14: heartbeats created ``Consumer`` rows under any ID with up to 1,000 held IDs each,
never deleted, and every dequeue with a redelivery loaded them all; dedup rows were never
deleted.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db.models.signals import post_init
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from queues import tasks
from queues.cluster import dedup
from queues.models import DedupEntry
from queues.service.types import Delivery
from workers import services
from workers import tasks as worker_tasks
from workers.models import AttemptLog, Consumer, HeldMessage

pytestmark = pytest.mark.django_db

BEAT = "/api/v1/consumers/heartbeat"


def _client_of(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_a_user_has_a_bounded_number_of_consumers(api, settings):
    # given a user with as many live consumers as it may have
    settings.WORKER_MAX_CONSUMERS_PER_USER = 3
    for i in range(3):
        assert api.post(BEAT, {"consumer": f"c-{i}"}, format="json").status_code == 200

    # when it heartbeats under a new ID, and under one of its own
    r = api.post(BEAT, {"consumer": "c-new"}, format="json")
    again = api.post(BEAT, {"consumer": "c-1"}, format="json")

    # then the new one is refused (saying when to retry) and recorded nowhere; its own beat is fine
    assert r.status_code == 429, r.content
    assert r.json()["error"] == "throttled" and "consumers" in r.json()["detail"]
    assert "Retry-After" in r
    assert not Consumer.objects.filter(pk="c-new").exists()
    assert again.status_code == 200


def test_a_consumer_id_of_another_user_is_not_overwritten(api):
    # given another user's consumer
    other = User.objects.create(username=f"o-{uuid.uuid4().hex[:8]}")
    assert _client_of(other).post(BEAT, {"consumer": "theirs", "name": "mine"}, format="json").status_code == 200

    # when this user heartbeats under its ID
    r = api.post(BEAT, {"consumer": "theirs", "name": "hijacked"}, format="json")

    # then 409, and the row is unchanged
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "consumer_taken"
    assert Consumer.objects.get(pk="theirs").name == "mine"


def test_held_messages_per_heartbeat_are_bounded(api, settings):
    # given
    settings.WORKER_MAX_HELD = 2
    held = [{"id": f"q/0/00000001-{i:016x}/0", "receipt": "r"} for i in range(3)]

    # when
    r = api.post(BEAT, {"consumer": "greedy", "held": held}, format="json")

    # then
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "too_many_held"
    assert not Consumer.objects.filter(pk="greedy").exists()


def test_consumers_not_heard_from_expire(api, settings):
    # given a consumer heard from just now and one silent for longer than the retention
    settings.CONSUMER_RETENTION = 600
    assert api.post(BEAT, {"consumer": "alive"}, format="json").status_code == 200
    assert api.post(BEAT, {"consumer": "gone"}, format="json").status_code == 200
    Consumer.objects.filter(pk="gone").update(last_heartbeat=timezone.now() - timedelta(seconds=601))

    # when the periodic task runs
    removed = worker_tasks.forget_silent_consumers()

    # then only the silent one is deleted
    assert removed == 1
    assert set(Consumer.objects.values_list("pk", flat=True)) >= {"alive"}
    assert not Consumer.objects.filter(pk="gone").exists()


def test_a_redelivery_does_not_load_every_consumer():
    # given 50 live consumers, each holding 20 messages, one of them the redelivered one
    now = timezone.now()
    for c in range(50):
        consumer = Consumer.objects.create(
            pk=f"w-{c}", last_heartbeat=now, held=[f"q/0/00000001-{c:016x}/{i}" for i in range(20)]
        )
        HeldMessage.objects.bulk_create(
            HeldMessage(consumer=consumer, message_id=f"q/0/00000001-{c:016x}/{i}") for i in range(20)
        )
    redelivered = Delivery("q/0/00000001-0000000000000007/3", "receipt", 2)
    loaded = []

    def count(sender, instance, **kwargs):
        loaded.append(instance.pk)

    # when the redelivery is logged
    post_init.connect(count, sender=Consumer)
    try:
        assert services.record_redeliveries([redelivered]) == 1
    finally:
        post_init.disconnect(count, sender=Consumer)

    # then its holder is found without loading the consumers (before: all 50, on every dequeue)
    assert loaded == []
    assert AttemptLog.objects.get(message_id=redelivered.id).worker_id == "w-7"


def test_dedup_rows_past_their_window_are_deleted(monkeypatch, runtime):
    # given the database's dedup store with one row past its window and one within it
    monkeypatch.setattr(dedup, "_store", dedup.DatabaseDedup())
    now = timezone.now()
    DedupEntry.objects.create(queue="q", dedup_id="old", message_id="q/0/x/0", expires_at=now - timedelta(seconds=1))
    DedupEntry.objects.create(queue="q", dedup_id="new", message_id="q/0/x/1", expires_at=now + timedelta(hours=1))

    # when the retention task runs
    tasks.expire()

    # then the row past its window is gone
    assert list(DedupEntry.objects.filter(queue="q").values_list("dedup_id", flat=True)) == ["new"]
