"""The workers' side of the API: attempt logs, heartbeats that keep messages hidden, sleep."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from workers.models import AttemptLog, Consumer, HeldMessage

pytestmark = pytest.mark.django_db


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def _deliver(api, name, **kw):
    r = api.post(f"/api/v1/queues/{name}/dequeue", kw, format="json")
    assert r.status_code == 200, r.content
    return r.json()["messages"]


def test_logs_round_trip_with_filters(api, make_queue):
    # given a delivered message and two reported attempts
    name = make_queue(partitions=1)
    mid = api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x", "size": 7}, format="json").json()["id"]
    t0 = datetime.now(UTC)
    records = [
        {
            "message_id": mid,
            "worker": "w1",
            "attempt": 1,
            "outcome": "failed",
            "error": "boom",
            "traceback": "Traceback...",
            "process_started_at": _iso(t0),
            "process_ended_at": _iso(t0 + timedelta(seconds=1)),
        },
        {
            "message_id": mid,
            "worker": "w1",
            "attempt": 2,
            "outcome": "succeeded",
            "size": 7,
            "preprocess_started_at": _iso(t0),
            "preprocess_ended_at": _iso(t0),
        },
    ]
    # when they are sent in one batch
    r = api.post("/api/v1/logs", {"records": records}, format="json")
    # then both are stored, with queue and partition taken from the message ID
    assert r.status_code == 201 and r.json() == {"stored": 2}
    got = api.get(f"/api/v1/logs?message={mid}").json()["records"]
    assert [(g["attempt"], g["outcome"], g["queue"], g["partition"]) for g in got] == [
        (2, "succeeded", name, 0),
        (1, "failed", name, 0),
    ]
    assert api.get("/api/v1/logs?outcome=failed&queue=" + name).json()["records"][0]["error"] == "boom"
    assert api.get("/api/v1/logs?worker=nobody").json()["records"] == []


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"records": []}, "records"),
        ({"records": [{"message_id": "not-an-id", "attempt": 1, "outcome": "failed"}]}, "records"),
        (
            {"records": [{"message_id": "q/0/00000000-0000000000000000/0", "attempt": 0, "outcome": "failed"}]},
            "records",
        ),
        ({"records": [{"message_id": "q/0/00000000-0000000000000000/0", "attempt": 1, "outcome": "maybe"}]}, "records"),
        (
            {
                "records": [
                    {
                        "message_id": "q/0/00000000-0000000000000000/0",
                        "attempt": 1,
                        "outcome": "failed",
                        "colour": "red",
                    }
                ]
            },
            "records",
        ),
        ({"rows": []}, "rows"),
        (
            {
                "records": [
                    {
                        "message_id": "q/0/00000000-0000000000000000/0",
                        "attempt": 1,
                        "outcome": "failed",
                        "process_started_at": "2026-01-01T00:00:01Z",
                        "process_ended_at": "2026-01-01T00:00:00Z",
                    }
                ]
            },
            "records",
        ),
    ],
)
def test_bad_log_batches_are_refused_whole(api, payload, field):
    before = AttemptLog.objects.count()
    r = api.post("/api/v1/logs", payload, format="json")
    assert r.status_code == 400 and r.json()["error"] == "invalid" and field in r.json()["detail"]
    assert AttemptLog.objects.count() == before


def test_bad_log_filters_are_refused(api):
    assert api.get("/api/v1/logs?limit=0").status_code == 400
    assert api.get("/api/v1/logs?limit=x").status_code == 400
    assert api.get("/api/v1/logs?colour=red").status_code == 400
    # schemathesis (seed 1281883058): a NUL in a text filter reached PostgreSQL, which answered 500
    for name in ("queue", "message", "worker"):
        r = api.get(f"/api/v1/logs?{name}=a%00b")
        assert r.status_code == 400 and r.json()["error"] == "invalid_text", (name, r.content)


def test_heartbeats_keep_a_long_task_hidden(api, make_queue):
    # given a message delivered with a one-second visibility timeout
    name = make_queue(partitions=1, visibility_timeout=1)
    api.post(f"/api/v1/queues/{name}/enqueue", {"body": "long job"}, format="json")
    (m,) = _deliver(api, name)
    consumer = uuid.uuid4().hex
    # when its worker heartbeats for three times the timeout
    for _ in range(6):
        r = api.post(
            "/api/v1/consumers/heartbeat",
            {
                "consumer": consumer,
                "name": "celery@test",
                "queues": [name],
                "load": 1.0,
                "capacity": 1,
                "held": [{"id": m["id"], "receipt": m["receipt"]}],
            },
            format="json",
        )
        assert r.status_code == 200 and r.json()["extended"] == [m["id"]] and r.json()["instruction"] == "continue"
        assert _deliver(api, name) == [], "delivered twice while its worker heartbeats"
        time.sleep(0.5)
    # then it is still the worker's, and the admin-side record says what it holds
    assert (
        api.post(
            f"/api/v1/queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]}]}, format="json"
        ).json()["acked"]
        == 1
    )
    c = Consumer.objects.get(pk=consumer)
    assert c.held == [m["id"]] and c.load == 1.0


def test_a_stale_receipt_is_reported_lost_and_the_abandoned_attempt_logged(api, make_queue):
    # given a message whose first delivery ran out of visibility and was delivered again
    name = make_queue(partitions=1)
    api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json")
    (first,) = _deliver(api, name, visibility_timeout=0)
    (second,) = _deliver(api, name, visibility_timeout=30)
    assert second["receive_count"] == 2
    # when the first worker heartbeats with its old receipt
    r = api.post(
        "/api/v1/consumers/heartbeat",
        {"consumer": "w-old", "queues": [name], "held": [{"id": first["id"], "receipt": first["receipt"]}]},
        format="json",
    )
    # then it is told the message is lost to it, and the service logged attempt 1 as abandoned
    assert r.json()["lost"] == [first["id"]] and r.json()["extended"] == []
    logs = AttemptLog.objects.filter(message_id=first["id"])
    assert [(a.attempt, a.outcome) for a in logs] == [(1, "abandoned")]


def test_a_reported_failure_is_not_logged_again_as_abandoned(api, make_queue):
    name = make_queue(partitions=1)
    api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json")
    (first,) = _deliver(api, name, visibility_timeout=30)
    api.post(
        "/api/v1/logs",
        {"records": [{"message_id": first["id"], "attempt": 1, "outcome": "failed", "error": "boom"}]},
        format="json",
    )
    api.post(
        f"/api/v1/queues/{name}/visibility",
        {"id": first["id"], "receipt": first["receipt"], "visibility_timeout": 0},
        format="json",
    )
    (second,) = _deliver(api, name)
    assert second["receive_count"] == 2
    assert [(a.attempt, a.outcome) for a in AttemptLog.objects.filter(message_id=first["id"])] == [(1, "failed")]


def test_an_idle_worker_sleeps_while_another_covers_the_queue(api, make_queue):
    name = make_queue(partitions=1)
    beat = {"queues": [name], "held": []}
    # a lone idle worker keeps polling
    assert (
        api.post("/api/v1/consumers/heartbeat", {"consumer": "a", **beat}, format="json").json()["instruction"]
        == "continue"
    )
    # a second idle worker on the same empty queue is told to sleep
    r = api.post("/api/v1/consumers/heartbeat", {"consumer": "b", **beat}, format="json").json()
    assert r["instruction"] == "sleep" and r["sleep"] > 0
    # with work in the queue nobody sleeps
    api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json")
    from queues import service

    service.get_runtime().tick()  # publishes the partition's depth
    assert (
        api.post("/api/v1/consumers/heartbeat", {"consumer": "b", **beat}, format="json").json()["instruction"]
        == "continue"
    )


def test_heartbeat_bad_input(api):
    assert api.post("/api/v1/consumers/heartbeat", {"queues": []}, format="json").status_code == 400
    assert api.post("/api/v1/consumers/heartbeat", {"consumer": "x", "load": 2}, format="json").status_code == 400
    assert not Consumer.objects.filter(pk="x").exists()


def test_workers_are_told_which_partitions_to_take(api, make_queue, runtime):
    # given a queue with messages in four partitions and two live workers
    name = make_queue(partitions=4)
    for i in range(40):
        api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x", "group": f"g{i}"}, format="json")
    runtime.tick()  # publishes the depths
    beat = {"queues": [name], "held": []}
    for consumer in ("w-a", "w-b"):  # both known to the service
        api.post("/api/v1/consumers/heartbeat", {"consumer": consumer, **beat}, format="json")
    # when both heartbeat
    a = api.post("/api/v1/consumers/heartbeat", {"consumer": "w-a", **beat}, format="json").json()
    b = api.post("/api/v1/consumers/heartbeat", {"consumer": "w-b", **beat}, format="json").json()
    # then the non-empty partitions are split between them, each with its owner's address
    assert a["instruction"] == b["instruction"] == "take"
    taken_a = {t["partition"] for t in a["take"]}
    taken_b = {t["partition"] for t in b["take"]}
    assert taken_a and taken_b and not taken_a & taken_b
    assert taken_a | taken_b == {0, 1, 2, 3}
    assert all(t["node"] == runtime.address for t in a["take"] + b["take"])


# --- the attempt log belongs to a queue's incarnation ------------------------------------------------


def _client_of(user):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_a_name_used_again_does_not_show_the_old_queues_attempt_log(api, make_queue):
    from django.contrib.auth.models import User

    # given Alice's queue: a failure her worker reported, and an attempt the service logged abandoned
    name = make_queue(partitions=1)
    api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json")
    (first,) = _deliver(api, name, visibility_timeout=0)
    (_second,) = _deliver(api, name, visibility_timeout=30)
    report = {"message_id": first["id"], "attempt": 2, "outcome": "failed", "error": "pin 1234", "traceback": "tb"}
    assert api.post("/api/v1/logs", {"records": [report]}, format="json").status_code == 201
    assert {r["outcome"] for r in api.get(f"/api/v1/logs?queue={name}").json()["records"]} == {"abandoned", "failed"}
    # when she deletes it and Mallory, with no grant, creates a queue of that name
    assert api.delete(f"/api/v1/queues/{name}").status_code == 204
    mallory = _client_of(User.objects.create(username=f"mallory-{uuid.uuid4().hex[:6]}"))
    assert mallory.post("/api/v1/queues", {"name": name, "partitions": 1}, format="json").status_code == 201
    # then none of the old records is hers to read, by queue, message or outcome
    for query in (f"queue={name}", f"message={first['id']}", "outcome=failed", "outcome=abandoned", ""):
        assert mallory.get(f"/api/v1/logs?{query}").json()["records"] == [], query
    # while what her own worker reports, and what the service logs for her queue, is hers
    mine = mallory.post(f"/api/v1/queues/{name}/enqueue", {"body": "y"}, format="json").json()["id"]
    _deliver(mallory, name, visibility_timeout=0)
    _deliver(mallory, name, visibility_timeout=30)
    done = {"message_id": mine, "attempt": 2, "outcome": "succeeded"}
    assert mallory.post("/api/v1/logs", {"records": [done]}, format="json").status_code == 201
    got = mallory.get(f"/api/v1/logs?queue={name}").json()["records"]
    assert [(r["message_id"], r["attempt"], r["outcome"]) for r in got] == [
        (mine, 2, "succeeded"),
        (mine, 1, "abandoned"),
    ]
    # and a superuser still reads both queues' records
    root = _client_of(User.objects.create(username=f"root-{uuid.uuid4().hex[:6]}", is_superuser=True))
    assert {r["message_id"] for r in root.get(f"/api/v1/logs?queue={name}").json()["records"]} == {first["id"], mine}


def test_the_migration_ties_each_record_to_the_queue_of_its_name_since_it_was_created(make_queue):
    import importlib

    from django.apps import apps

    from queues.models import Queue

    # given records written by name only: of the queue now of the name, of an earlier queue of
    # that name (recorded before the current one was created), and of a queue gone
    name = make_queue(partitions=1)
    q = Queue.objects.get(name=name)
    now, before = (
        AttemptLog.objects.create(message_id=_mid(name, 1), queue=name, partition=0, attempt=1, outcome="failed"),
        AttemptLog.objects.create(message_id=_mid(name, 2), queue=name, partition=0, attempt=1, outcome="failed"),
    )
    AttemptLog.objects.filter(pk=before.pk).update(recorded_at=q.created_at - timedelta(seconds=1))
    gone = AttemptLog.objects.create(message_id=_mid("gone", 1), queue="gone", partition=0, attempt=1, outcome="failed")
    AttemptLog.objects.update(incarnation=None)
    # when the migration's backfill runs
    importlib.import_module("workers.migrations.0005_attempts_by_incarnation").backfill(apps, None)
    # then only the record written since the queue was created is its
    got = dict(AttemptLog.objects.filter(pk__in=[now.pk, before.pk, gone.pk]).values_list("pk", "incarnation"))
    assert got == {now.pk: q.pk, before.pk: None, gone.pk: None}


# --- the attempt log kept from the core's signals (workers/receivers.py) ----------------------


def _mid(queue: str, index: int) -> str:
    return f"{queue}/0/00000000-0000000000000000/{index}"


def _holding(consumer: str, *mids: str) -> None:
    """What a heartbeat of ``consumer`` holding ``mids`` records."""
    c = Consumer.objects.create(pk=consumer, held=list(mids), last_heartbeat=datetime.now(UTC))
    HeldMessage.objects.bulk_create(HeldMessage(consumer=c, message_id=m) for m in mids)


def _rows(mid: str) -> list[tuple[int, str, str | None]]:
    return [(a.attempt, a.outcome, a.worker_id) for a in AttemptLog.objects.filter(message_id=mid).order_by("attempt")]


def test_redeliveries_announced_by_the_core_are_logged_abandoned_unless_reported(db):
    # given three deliveries: a first one, a redelivery nobody reported, one whose worker reported
    from queues import signals
    from queues.engine.ids import StoredMessage
    from queues.service.types import Delivery

    first, dropped, reported = _mid("sig", 1), _mid("sig", 2), _mid("sig", 3)
    _holding("w-holder", dropped)
    AttemptLog.objects.create(message_id=reported, queue="sig", partition=0, attempt=2, outcome="failed")
    msg = StoredMessage("body", 0.0, group="g7", size=11)
    deliveries = [Delivery(first, "r1", 1, msg), Delivery(dropped, "r2", 3, msg), Delivery(reported, "r3", 3, msg)]
    # when the core announces them
    signals.redelivered.send(sender=None, target="sig", deliveries=deliveries)
    # then only the unreported attempt before the redelivery is logged, as abandoned, by its holder
    assert _rows(first) == []
    assert _rows(dropped) == [(2, "abandoned", "w-holder")]
    row = AttemptLog.objects.get(message_id=dropped)
    assert (row.queue, row.partition, row.group, row.size) == ("sig", 0, "g7", 11)
    assert row.error == "visibility timeout ran out without an ack"
    assert _rows(reported) == [(2, "failed", None)]


def test_a_give_back_announced_by_the_core_is_logged_and_its_redelivery_is_not_abandoned(db):
    # given a message its consumer holds, and another whose worker reported the attempt
    from queues import signals
    from queues.engine.ids import StoredMessage
    from queues.service.types import Delivery

    given, reported = _mid("sig", 4), _mid("sig", 5)
    _holding("w-giver", given)
    AttemptLog.objects.create(message_id=reported, queue="sig", partition=0, attempt=1, outcome="failed")
    # when the core announces both given back, then redelivers them
    for mid in (given, reported):
        signals.given_back.send(sender=None, target="sig", message_id=mid, receive_count=1)
    msg = StoredMessage("body", 0.0)
    signals.redelivered.send(
        sender=None, target="sig", deliveries=[Delivery(given, "r2", 2, msg), Delivery(reported, "r2", 2, msg)]
    )
    # then the first attempt is logged once, as given back by its holder; a reported one is left alone
    assert _rows(given) == [(1, "given_back", "w-giver")]
    assert _rows(reported) == [(1, "failed", None)]


def test_a_give_back_announced_after_its_redelivery_corrects_the_abandoned_row(db):
    # given a message given back that a long poll delivered again before the give back was announced
    from queues import signals
    from queues.engine.ids import StoredMessage
    from queues.service.types import Delivery

    given = _mid("sig", 6)
    _holding("w-racer", given)
    signals.redelivered.send(sender=None, target="sig", deliveries=[Delivery(given, "r2", 2, StoredMessage("b", 0.0))])
    assert _rows(given) == [(1, "abandoned", "w-racer")]
    # when the give back is announced
    signals.given_back.send(sender=None, target="sig", message_id=given, receive_count=1)
    # then the attempt is logged once, as given back
    assert _rows(given) == [(1, "given_back", "w-racer")]
    assert AttemptLog.objects.get(message_id=given).error == "given back (visibility 0) without a report"


def test_the_core_gives_back_and_the_log_says_given_back_not_abandoned(api, make_queue):
    """End to end through the core: needs the core to send ``queues.signals``."""
    # given a delivered message its consumer holds (it says so in a heartbeat)
    name = make_queue(partitions=1)
    api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x", "size": 3}, format="json")
    (first,) = _deliver(api, name, visibility_timeout=30)
    held = [{"id": first["id"], "receipt": first["receipt"]}]
    beat = api.post(
        "/api/v1/consumers/heartbeat", {"consumer": "w-give", "queues": [name], "held": held}, format="json"
    )
    assert beat.json()["extended"] == [first["id"]]
    # when the consumer gives it back (visibility 0) and it is delivered again
    r = api.post(
        f"/api/v1/queues/{name}/visibility",
        {"id": first["id"], "receipt": first["receipt"], "visibility_timeout": 0},
        format="json",
    )
    assert r.status_code == 200, r.content
    (second,) = _deliver(api, name, visibility_timeout=0)
    assert second["id"] == first["id"] and second["receive_count"] == 2
    # then attempt 1 is logged once, given back by that consumer, and nothing is abandoned
    assert _rows(first["id"]) == [(1, "given_back", "w-give")]
    # and when that second delivery's visibility simply runs out, attempt 2 is abandoned
    (third,) = _deliver(api, name, visibility_timeout=30)
    assert third["receive_count"] == 3
    assert _rows(first["id"]) == [(1, "given_back", "w-give"), (2, "abandoned", "w-give")]


def test_trimming_the_attempt_log_keeps_what_its_setting_allows(db, settings):
    # given one record older than ATTEMPT_LOG_RETENTION_DAYS and one recent
    from workers.tasks import trim_attempt_logs

    settings.ATTEMPT_LOG_RETENTION_DAYS = 2
    old, new = (
        AttemptLog.objects.create(message_id=_mid("exp", i), queue="exp", partition=0, attempt=1, outcome="succeeded")
        for i in (1, 2)
    )
    AttemptLog.objects.filter(pk=old.pk).update(recorded_at=datetime.now(UTC) - timedelta(days=3))
    # when the beat task runs
    trimmed = trim_attempt_logs()
    # then only the old one is gone
    assert trimmed == 1
    assert list(AttemptLog.objects.filter(queue="exp").values_list("pk", flat=True)) == [new.pk]
