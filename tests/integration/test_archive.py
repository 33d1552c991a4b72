"""The archive end to end: journal -> archiver -> table -> lookup / list / replay.

In-process tests run a node runtime over each key-value backend (filesystem in ``tmp_path``,
Redis db 5, the SQL table in the test database) and call the API through DRF's test client;
the crash test kills a real node process mid-load and archives what it left in the store.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import orjson
import pytest
from django.conf import settings
from rest_framework.test import APIClient

import archive
from archive import archiver
from archive.models import ArchivedMessage, ArchiverLock
from queues import service
from queues.engine import archive_journal
from queues.engine import format as stored_format
from queues.engine.keys import incarnation
from tests.integration.nodes import Client, backend_store, node_info, wait_until

BACKENDS = ["file", "redis", "postgres"]


def pytest_generate_tests(metafunc):
    """Each in-process test on each backend: the shared ``runtime`` parametrized (a test that
    names its backends itself keeps them)."""
    if "runtime" in metafunc.fixturenames and not any(
        "runtime" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")
    ):
        metafunc.parametrize("runtime", BACKENDS, indirect=True)


@pytest.fixture
def make_archived_queue(api, unique_name):
    def make(**fields) -> str:
        fields.setdefault("name", unique_name("arch"))
        fields.setdefault("partitions", 2)
        r = api.post("/api/v1/queues", fields, format="json")
        assert r.status_code == 201, r.content
        assert r.json()["archive"] == fields.get("archive", "none")
        return fields["name"]

    return make


def enqueue(api, name, messages) -> list[str]:
    r = api.post(f"/api/v1/queues/{name}/enqueue", {"messages": messages}, format="json")
    assert r.status_code == 201, r.content
    return r.json()["ids"]


def drain(api, name, *, ack=True) -> list[dict]:
    out = []
    while True:
        r = api.post(f"/api/v1/queues/{name}/dequeue", {"max": 100, "visibility_timeout": 60}, format="json")
        assert r.status_code == 200, r.content
        got = r.json()["messages"]
        if not got:
            return out
        out.extend(got)
        if ack:
            ack_ids(api, name, got)


def consume(api, name, n) -> list[dict]:
    """Dequeue and acknowledge ``n`` messages (groups give one at a time)."""
    done: list[dict] = []
    while len(done) < n:
        r = api.post(f"/api/v1/queues/{name}/dequeue", {"max": n - len(done), "visibility_timeout": 60}, format="json")
        got = r.json()["messages"]
        assert got, "ran dry"
        ack_ids(api, name, got)
        done.extend(got)
    return done


def ack_ids(api, name, messages) -> None:
    r = api.post(
        f"/api/v1/queues/{name}/ack",
        {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in messages]},
        format="json",
    )
    assert r.status_code == 200, r.content


def journal_size(store, name, partitions=2) -> int:
    """Entries in the journal of queue ``name`` (its current incarnation's keys)."""
    from queues.models import Queue

    store = store.within(incarnation(Queue.objects.get(name=name).pk))
    return sum(len(store.scan(archive_journal.bucket(name, p))) for p in range(partitions))


# --- modes --------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_mode_all_archives_every_message_and_marks_acks(api, runtime, make_archived_queue):
    # given a queue archiving every message, and 60 enqueued through the API
    name = make_archived_queue(archive="all")
    bodies = [f"body-{i}" for i in range(60)]
    ids = enqueue(api, name, [{"body": b, "group": f"g{i % 3}", "attributes": {"i": i}} for i, b in enumerate(bodies)])
    # when the archiver runs
    report = archiver.run(name, store=runtime.store)
    # then 60 rows hold the bodies, none acknowledged, and the journal is empty
    assert report[name]["archived"] == 60
    rows = {r.message_id: r for r in ArchivedMessage.objects.filter(queue=name)}
    assert set(rows) == set(ids)
    assert [rows[i].body for i in ids] == bodies
    assert rows[ids[4]].group == "g1" and rows[ids[4]].attributes == {"i": 4}
    assert all(r.acked_at is None for r in rows.values())
    assert journal_size(runtime.store, name) == 0
    # when some are acknowledged and the archiver runs again
    acked = consume(api, name, 25)
    report = archiver.run(name, store=runtime.store)
    # then exactly those rows have acked_at, nothing was copied twice, the journal is empty
    assert report[name] == {"archived": 0, "acked": 25, "removed": 25}
    marked = set(
        ArchivedMessage.objects.filter(queue=name, acked_at__isnull=False).values_list("message_id", flat=True)
    )
    assert marked == {m["id"] for m in acked}
    assert ArchivedMessage.objects.filter(queue=name).count() == 60
    assert journal_size(runtime.store, name) == 0
    # and a run with nothing to do reports nothing
    assert archiver.run(name, store=runtime.store) == {}


@pytest.mark.django_db
def test_mode_acked_archives_only_acknowledged_messages(api, runtime, make_archived_queue):
    # given a queue archiving acknowledged messages, 30 enqueued and 12 of them acknowledged
    name = make_archived_queue(archive="acked")
    enqueue(api, name, [{"body": f"m{i}"} for i in range(30)])
    assert journal_size(runtime.store, name) == 0
    got = drain(api, name, ack=False)
    ack_ids(api, name, got[:12])
    # when the archiver runs
    archiver.run(name, store=runtime.store)
    # then only those 12 are archived, with their ack time and body
    rows = list(ArchivedMessage.objects.filter(queue=name))
    assert {r.message_id for r in rows} == {m["id"] for m in got[:12]}
    assert all(r.acked_at is not None and r.acked_at >= r.enqueued_at for r in rows)
    assert {r.body for r in rows} == {m["body"] for m in got[:12]}


@pytest.mark.django_db
def test_retention_is_not_an_ack(api, runtime, make_archived_queue):
    # given an "acked" queue whose messages are removed by the retention rule
    name = make_archived_queue(archive="acked")
    enqueue(api, name, [{"body": f"m{i}"} for i in range(5)])
    expired = sum(m.expire(time.time() + 3600) for m in runtime.local_managers(name))
    assert expired == 5
    # then nothing is archived
    archiver.run(name, store=runtime.store)
    assert not ArchivedMessage.objects.filter(queue=name).exists()


@pytest.mark.django_db
def test_archive_mode_can_be_changed_through_the_api(api, make_archived_queue):
    name = make_archived_queue()
    r = api.patch(f"/api/v1/queues/{name}", {"archive": "acked"}, format="json")
    assert r.status_code == 200 and r.json()["archive"] == "acked"
    r = api.patch(f"/api/v1/queues/{name}", {"archive": "sometimes"}, format="json")
    assert r.status_code == 400 and r.json()["error"] == "invalid"
    assert api.get(f"/api/v1/queues/{name}").json()["archive"] == "acked"


@pytest.mark.django_db
def test_a_journal_entry_of_a_later_stored_format_is_kept_not_dropped(api, runtime, make_archived_queue, caplog):
    from queues.models import Queue

    # given a queue archiving every message, 6 in its 2 partitions, and one journal entry as a
    # node of a newer release would store it (queues.engine.format)
    name = make_archived_queue(archive="all")
    ids = enqueue(api, name, [{"body": f"m{i}"} for i in range(6)])
    view = runtime.store.within(incarnation(Queue.objects.get(name=name).pk))
    target = ids[0]
    index = int(target.split("/")[1])
    [(entry, _)] = archive_journal.entries(name, index, [(target, b"")])
    later = stored_format.envelope(2, orjson.loads(view.get(entry)))
    view.put(entry, later)
    journaled = len(view.scan(archive_journal.bucket(name, index)))
    # when the archiver runs
    with caplog.at_level("ERROR"):
        archiver.run(name, store=runtime.store)
    # then that partition's journal is left whole for an archiver that reads it (nothing
    # dropped as unreadable), the refusal logged with the key and the version; the other
    # partition is archived
    assert view.get(entry) == later
    assert len(view.scan(archive_journal.bucket(name, index))) == journaled
    assert any(target in r.getMessage() and "version 2" in r.getMessage() for r in caplog.records)
    archived = set(ArchivedMessage.objects.filter(queue=name).values_list("message_id", flat=True))
    assert archived == {m for m in ids if int(m.split("/")[1]) != index}


# --- lookup and listing ---------------------------------------------------------------------------
@pytest.mark.django_db
def test_lookup_gives_back_the_stored_records(api, runtime, make_archived_queue):
    name = make_archived_queue(archive="all")
    ids = enqueue(
        api,
        name,
        [
            {"body": "plain", "group": "g", "attributes": {"k": "v", "n": 2}, "size": 7},
            {"body": "with\x00nul", "attributes": {"x": "ab"}},
        ],
    )
    stored = {mid: runtime.manager(name, int(mid.split("/")[1])).cache.get(mid) for mid in ids}
    archiver.run(name, store=runtime.store)
    found = archive.lookup([*ids, f"{name}/0/00000000-0000000000000000/0"])
    assert set(found) == set(ids)
    for mid in ids:
        assert found[mid].body == stored[mid].body
        assert found[mid].group == stored[mid].group
        assert found[mid].attributes == stored[mid].attributes
        assert found[mid].sequence == stored[mid].sequence
        assert abs(found[mid].enqueued_at - stored[mid].enqueued_at) < 1e-5


@pytest.mark.django_db
def test_listing_pages_through_the_archive(api, runtime, make_archived_queue):
    name = make_archived_queue(archive="all")
    ids = enqueue(api, name, [{"body": f"m{i}"} for i in range(25)])
    archiver.run(name, store=runtime.store)
    seen, after = [], None
    while True:
        r = api.get(f"/api/v1/archive?queue={name}&limit=10" + ("" if after is None else f"&after={after}"))
        assert r.status_code == 200, r.content
        page = r.json()
        seen.extend(m["id"] for m in page["messages"])
        if page["next"] is None:
            break
        after = page["next"]
    assert sorted(seen) == sorted(ids)
    assert api.get(f"/api/v1/archive?queue={name}&acked=true").json()["messages"] == []
    for bad in ("limit=0", "after=", "since=yesterday", "acked=maybe", "acked=", "queue=a/b", "colour=red"):
        r = api.get(f"/api/v1/archive?{bad}")
        assert r.status_code == 400, bad
        assert set(r.json()) == {"error", "detail"}


# --- replay ---------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_replay_round_trip_into_another_queue(api, runtime, make_archived_queue):
    # given archived messages of a source queue, in groups, with attributes
    src, dst = make_archived_queue(archive="all"), make_archived_queue()
    sent = [{"body": f"b{i}", "group": f"g{i % 4}", "attributes": {"i": i}, "size": i + 1} for i in range(40)]
    ids = enqueue(api, src, sent)
    drain(api, src)  # consumed and acknowledged at the source
    archiver.run(src, store=runtime.store)
    rows = ArchivedMessage.objects.filter(queue=src).order_by("enqueued_at")
    since = rows.first().enqueued_at.isoformat()
    # when they are replayed into another queue by time range
    r = api.post("/api/v1/archive/replay", {"queue": src, "into": dst, "since": since}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["replayed"] == 40 and len(r.json()["ids"]) == 40
    # then a drain of the target gives the same bodies, groups and attributes, in group order
    got = drain(api, dst)
    assert sorted((m["body"], m.get("group"), m["attributes"]["i"]) for m in got) == sorted(
        (s["body"], s["group"], s["attributes"]["i"]) for s in sent
    )
    for g in range(4):
        in_group = [int(m["body"][1:]) for m in got if m.get("group") == f"g{g}"]
        assert in_group == sorted(in_group)
    # and the rows are marked replayed; a replay by ids into the source itself works too
    assert set(ArchivedMessage.objects.filter(queue=src).values_list("replay_count", flat=True)) == {1}
    r = api.post("/api/v1/archive/replay", {"queue": src, "ids": ids[:3]}, format="json")
    assert r.status_code == 200 and r.json()["replayed"] == 3 and r.json()["into"] == src
    assert sorted(m["body"] for m in drain(api, src)) == ["b0", "b1", "b2"]


@pytest.mark.django_db
def test_bad_replay_input_is_a_4xx_and_enqueues_nothing(api, runtime, make_archived_queue):
    src, dst = make_archived_queue(archive="all"), make_archived_queue()
    strict = make_archived_queue(strict=True)
    ids = enqueue(api, src, [{"body": f"m{i}"} for i in range(5)])
    archiver.run(src, store=runtime.store)
    cases = [
        ([1, 2], 400),
        ({}, 400),
        ({"queue": "bad/name"}, 400),
        ({"queue": src, "into": 7}, 400),
        ({"queue": src, "colour": "red"}, 400),
        ({"queue": src, "max": 0}, 400),
        ({"queue": src, "max": 10001}, 400),
        ({"queue": src, "since": "soon"}, 400),
        ({"queue": src, "since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"}, 400),
        ({"queue": src, "ids": ids[:1], "since": "2020-01-01T00:00:00Z"}, 400),
        ({"queue": src, "ids": []}, 400),
        ({"queue": src, "ids": ["nope"]}, 400),
        ({"queue": src, "ids": [ids[0].replace(src, dst, 1)]}, 400),
        ({"queue": src, "into": strict}, 400),  # the copies have no group: the strict queue refuses
        ({"queue": src, "into": "no-such-queue"}, 404),
    ]
    for payload, status in cases:
        r = api.post("/api/v1/archive/replay", payload, format="json")
        assert r.status_code == status, (payload, r.content)
        assert set(r.json()) == {"error", "detail"}, payload
    for name in (src, dst, strict):
        assert drain(api, name, ack=False) == [] or name == src
    assert set(ArchivedMessage.objects.filter(queue=src).values_list("replay_count", flat=True)) == {0}
    stranger = APIClient()
    assert stranger.post("/api/v1/archive/replay", {"queue": src}, format="json").status_code == 401
    assert stranger.get(f"/api/v1/archive?queue={src}", HTTP_AUTHORIZATION="Token wrong").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("runtime", ["file"], indirect=True)  # the failure is the service's answer, whatever the store
def test_a_replay_stopped_part_way_answers_503_with_what_was_replayed(api, runtime, make_archived_queue, monkeypatch):
    # given five archived messages, replayed in batches of two, the second of which fails
    src, dst = make_archived_queue(archive="all"), make_archived_queue()
    enqueue(api, src, [{"body": f"m{i}"} for i in range(5)])
    archiver.run(src, store=runtime.store)
    monkeypatch.setattr(service, "MAX_BATCH", 2)
    real, calls = service.enqueue, []

    def enqueue_twice(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise service.PartitionUnavailable(f"{dst}/0: the store does not answer")
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "enqueue", enqueue_twice)
    # when they are replayed
    r = api.post("/api/v1/archive/replay", {"queue": src, "into": dst}, format="json")
    # then the answer is a 503 to retry, naming the two that were replayed
    assert r.status_code == 503 and r["Retry-After"] == "1", r.content
    body = r.json()
    assert body["error"] == "unavailable" and body["detail"].startswith("stopped part-way, retry the rest: ")
    assert (body["queue"], body["into"], body["replayed"]) == (src, dst, 2)
    assert len(body["ids"]) == 2 and sorted(m["id"] for m in drain(api, dst)) == sorted(body["ids"])


def _client_of(user) -> APIClient:
    from rest_framework.authtoken.models import Token

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


# --- history belongs to a queue's incarnation -----------------------------------------------------
@pytest.mark.django_db
def test_a_name_used_again_does_not_hand_over_the_old_queues_history(api, runtime, unique_name):
    from django.contrib.auth.models import User

    # given Alice's queue, archiving everything, whose messages failed once in a worker
    name = unique_name("payroll")
    assert (
        api.post("/api/v1/queues", {"name": name, "partitions": 2, "archive": "all"}, format="json").status_code == 201
    )
    old_ids = enqueue(api, name, [{"body": f"salary {i}", "attributes": {"iban": f"DE{i}"}} for i in range(3)])
    held = drain(api, name, ack=False)
    report = [
        {"message_id": m["id"], "attempt": 1, "outcome": "failed", "error": "secret", "traceback": "Traceback: pin"}
        for m in held
    ]
    assert api.post("/api/v1/logs", {"records": report}, format="json").status_code == 201
    ack_ids(api, name, held)
    archiver.run(name, store=runtime.store)
    assert len(api.get(f"/api/v1/archive?queue={name}").json()["messages"]) == 3
    assert len(api.get(f"/api/v1/logs?queue={name}").json()["records"]) == 3
    # when Alice deletes it, and Mallory, with no grant, creates a queue of that name
    assert api.delete(f"/api/v1/queues/{name}").status_code == 204
    mallory = _client_of(User.objects.create(username=f"mallory-{uuid.uuid4().hex[:6]}"))
    r = mallory.post("/api/v1/queues", {"name": name, "partitions": 2, "archive": "all"}, format="json")
    assert r.status_code == 201, r.content
    # then she reads none of the old queue's archived messages, nor its attempt log
    assert mallory.get(f"/api/v1/archive?queue={name}").json()["messages"] == []
    assert mallory.get("/api/v1/archive").json()["messages"] == []
    assert mallory.get(f"/api/v1/logs?queue={name}").json()["records"] == []
    assert mallory.get(f"/api/v1/logs?message={old_ids[0]}").json()["records"] == []
    # and replays none of them into her queue, by time or by ID
    for payload in ({"queue": name}, {"queue": name, "ids": old_ids}, {"queue": name, "since": 0}):
        r = mallory.post("/api/v1/archive/replay", payload, format="json")
        assert r.status_code == 200 and r.json()["replayed"] == 0, (payload, r.content)
    assert drain(mallory, name) == []
    assert set(ArchivedMessage.objects.filter(message_id__in=old_ids).values_list("replay_count", flat=True)) == {0}
    # while her own queue's history is hers
    mine = enqueue(mallory, name, [{"body": "mine"}])
    archiver.run(name, store=runtime.store)
    assert [m["id"] for m in mallory.get(f"/api/v1/archive?queue={name}").json()["messages"]] == mine
    r = mallory.post("/api/v1/archive/replay", {"queue": name}, format="json")
    assert r.status_code == 200 and r.json()["replayed"] == 1, r.content
    # and a superuser still reads and replays the old queue's history
    root = _client_of(User.objects.create(username=f"root-{uuid.uuid4().hex[:6]}", is_superuser=True))
    seen = [m["id"] for m in root.get(f"/api/v1/archive?queue={name}").json()["messages"]]
    assert set(old_ids) <= set(seen) and set(mine) <= set(seen)
    logged = root.get(f"/api/v1/logs?queue={name}").json()["records"]
    assert sorted(r["message_id"] for r in logged) == sorted(old_ids)
    assert {(r["error"], r["traceback"]) for r in logged} == {("secret", "Traceback: pin")}
    r = root.post("/api/v1/archive/replay", {"queue": name, "ids": old_ids[:1]}, format="json")
    assert r.status_code == 200 and r.json()["replayed"] == 1, r.content


@pytest.mark.django_db
@pytest.mark.parametrize("runtime", ["postgres"], indirect=True)
def test_the_migration_ties_each_row_to_the_queue_of_its_name_since_it_was_created(api, runtime, make_archived_queue):
    import importlib
    from datetime import timedelta

    from django.apps import apps

    from queues.models import Queue

    # given rows kept by name only: of the queue now of the name, of an earlier queue of that
    # name (enqueued before the current one was created), and of a queue gone
    name = make_archived_queue(archive="all")
    enqueue(api, name, [{"body": "now"}])
    archiver.run(name, store=runtime.store)
    q = Queue.objects.get(name=name)
    now = ArchivedMessage.objects.get(queue=name)
    before = ArchivedMessage.objects.create(
        message_id=f"{name}/0/00000000-0000000000000000/9", queue=name, partition=0, body="old",
        enqueued_at=q.created_at - timedelta(seconds=1),
    )  # fmt: skip
    gone = ArchivedMessage.objects.create(
        message_id="gone/0/00000000-0000000000000000/9", queue="gone", partition=0, body="gone",
        enqueued_at=q.created_at,
    )  # fmt: skip
    ArchivedMessage.objects.update(incarnation=None)
    # when the migration's backfill runs
    importlib.import_module("archive.migrations.0003_history_by_incarnation").backfill(apps, None)
    # then only the row enqueued since the queue was created is its
    got = dict(ArchivedMessage.objects.filter(pk__in=[now.pk, before.pk, gone.pk]).values_list("pk", "incarnation"))
    assert got == {now.pk: q.pk, before.pk: None, gone.pk: None}


# --- since / until -------------------------------------------------------------------------------
#: Times a client may send: valid ones in any offset are read as UTC; what is no time, or no
#: time in years 1 to 9999 once in UTC, is a 400 (never a 500 from the database).
TIMES = [
    ({"since": -1.1, "until": "5381-10-21T05:57:41-17:55"}, 200),
    ({"since": "2020-01-01T00:00:00+23:59", "until": "2020-01-02T00:00:00-23:59"}, 200),
    ({"since": "2020-01-01T00:00:00-00:30:15.5"}, 200),
    ({"until": "9999-12-31T23:59:59-17:55"}, 400),
    ({"since": "0001-01-01T00:00:00+05:00"}, 400),
    ({"since": 1e300}, 400),
    ({"since": -1e20}, 400),
    ({"since": "1e300"}, 400),
    ({"since": "nan"}, 400),
    ({"since": "-inf"}, 400),
    ({"since": "2020-13-01T00:00:00Z"}, 400),
    ({"until": "2020-01-01T00:00:00+24:00"}, 400),
    ({"since": True}, 400),
    ({"until": [1]}, 400),
    ({"until": {"t": 1}}, 400),
]


@pytest.mark.django_db
@pytest.mark.parametrize("runtime", ["postgres"], indirect=True)  # the database is what refused such times
def test_any_since_or_until_is_a_200_or_a_400(api, runtime, make_archived_queue):
    # given three archived messages
    src, dst = make_archived_queue(archive="all"), make_archived_queue()
    enqueue(api, src, [{"body": f"m{i}"} for i in range(3)])
    archiver.run(src, store=runtime.store)
    replayed = 0
    for times, status in TIMES:
        # when a replay and a listing name the time range
        r = api.post("/api/v1/archive/replay", {"queue": src, "into": dst, **times}, format="json")
        # then a valid time is read as UTC (the range selects what it holds), any other is a 400
        assert r.status_code == status, (times, r.content)
        if status == 400:
            assert r.json()["error"] == "invalid_time", (times, r.content)
        else:
            replayed += r.json()["replayed"]
        if any(isinstance(v, (list, dict, bool)) for v in times.values()):
            continue  # a query string carries text only
        r = api.get("/api/v1/archive", {"queue": src, **{k: str(v) for k, v in times.items()}})
        assert r.status_code == status, (times, r.content)
    # the fuzzer's range (1969 to 5381) holds all three, as does "since 2020"; 2019-12-31 to
    # 2020-01-02 holds none
    listed = api.get("/api/v1/archive", {"queue": src, "since": "-1.1", "until": "5381-10-21T05:57:41-17:55"})
    assert len(listed.json()["messages"]) == 3
    assert replayed == 6 and len(drain(api, dst)) == 6


@pytest.mark.django_db
@pytest.mark.parametrize("runtime", ["file"], indirect=True)
def test_an_empty_or_odd_limit_is_a_400(api, make_archived_queue):
    # schemathesis: `limit=` (given, empty) was read as the default; the schema says integer
    src = make_archived_queue(archive="all")
    for limit in ("", "x", "0", "1.5"):
        r = api.get("/api/v1/archive", {"queue": src, "limit": limit})
        assert r.status_code == 400, (limit, r.content)
    assert api.get("/api/v1/archive", {"queue": src, "limit": "5"}).status_code == 200
    assert api.get("/api/v1/archive", {"queue": src}).status_code == 200


def test_every_authenticated_call_documents_429_with_retry_after():
    # schemathesis: the heartbeat's consumer limit answered 429, which the schema did not name;
    # every call with credentials may be throttled (API_THROTTLE_USER) or meet such a limit
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    throttled = [
        op["responses"]["429"]
        for ops in paths.values()
        for op in ops.values()
        if isinstance(op, dict) and op.get("security") not in (None, [{}])
    ]
    assert throttled and all("Retry-After" in r["headers"] for r in throttled)
    assert "429" in paths["/api/v1/consumers/heartbeat"]["post"]["responses"]


def test_the_schema_documents_a_400_for_the_archive_calls():
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    assert "400" in paths["/api/v1/archive/replay"]["post"]["responses"]
    assert "400" in paths["/api/v1/archive"]["get"]["responses"]
    replay = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]["ReplayRequest"]
    assert "years 1 to 9999" in replay["properties"]["since"]["description"]


# --- replay through a cooling node -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.cluster
def test_a_replay_through_a_cooling_node_goes_elsewhere_whatever_hops_the_client_claims(node_factory, token):
    import requests

    from queues.models import Queue

    def partitions(c: Client, name: str) -> list[dict]:
        r = c.get(f"queues/{name}/partitions")
        assert r.status_code == 200, r.text
        return r.json()["partitions"]

    try:
        # given two nodes, one of which cools as soon as it has a message in flight
        hot, cold = node_factory(NODE_COOLING_IN_FLIGHT="0"), node_factory()
        ch = Client(hot.url, token)
        src, dst = f"src-{uuid.uuid4().hex[:8]}", f"dst-{uuid.uuid4().hex[:8]}"
        assert ch.post("queues", {"name": src, "partitions": 1}).status_code == 201
        assert ch.post("queues", {"name": dst, "partitions": 2, "lease_period": 3}).status_code == 201
        wait_until(lambda: len({p["owner"] for p in partitions(ch, dst)} - {None}) == 2, 30, "two owners")
        owned = {p["owner"]: p["index"] for p in partitions(ch, dst)}
        hot_partition, cold_partition = owned[node_info(hot.url)["node"]], owned[node_info(cold.url)["node"]]
        # and archived messages of a source queue
        src_row = Queue.objects.get(name=src)
        ArchivedMessage.objects.bulk_create(
            ArchivedMessage(
                message_id=f"{src}/0/00000000-{i:016x}/0",
                queue=src,
                incarnation=src_row.pk,
                partition=0,
                body=f"old {i}",
                enqueued_at=src_row.created_at,
                sequence=i,
            )
            for i in range(6)
        )
        # when the hot node holds a message in flight, and cools
        for _ in range(50):
            assert ch.post(f"queues/{dst}/enqueue", {"body": "heat"}).status_code == 201
            got = ch.post(f"queues/{dst}/dequeue", {"max": 10, "visibility_timeout": 120}).json()["messages"]
            if any(int(m["id"].split("/")[1]) == hot_partition for m in got):
                break
        wait_until(lambda: any(p["cooling"] for p in partitions(ch, dst)), 15, "the hot node to cool")
        # and a client replays through it, claiming the hops a forwarded call has made
        r = requests.post(
            f"{hot.url}/api/v1/archive/replay",
            json={"queue": src, "into": dst},
            headers={"Authorization": f"Token {token}", "X-MQ-Hops": "2"},
            timeout=30,
        )
        # then the count is not believed: the copies go to the other node's partition
        assert r.status_code == 200 and r.json()["replayed"] == 6, r.text
        assert {int(mid.split("/")[1]) for mid in r.json()["ids"]} == {cold_partition}, r.json()["ids"]
    finally:
        node_factory.stop()


# --- one archiver per queue -----------------------------------------------------------------------
@pytest.mark.django_db
def test_a_held_lock_keeps_a_second_archiver_out(api, runtime, make_archived_queue):
    name = make_archived_queue(archive="all")
    enqueue(api, name, [{"body": f"m{i}"} for i in range(10)])
    assert archiver.claim(name, "other")
    assert archiver.run(name, store=runtime.store) == {name: {"busy": True}}
    assert not ArchivedMessage.objects.filter(queue=name).exists()
    assert journal_size(runtime.store, name) == 10
    archiver.release(name, "other")
    assert archiver.run(name, store=runtime.store)[name]["archived"] == 10
    # an expired holder is replaced
    assert archiver.claim(name, "stale", seconds=-1)
    assert archiver.claim(name, "fresh") and not archiver.claim(name, "stale")


@pytest.mark.django_db(transaction=True)
def test_two_archivers_at_once_one_works_no_duplicates(api, runtime, make_archived_queue, monkeypatch):
    # given 3,000 journaled messages in one partition
    name = make_archived_queue(archive="all", partitions=1)
    ids = []
    for k in range(3):
        ids += enqueue(api, name, [{"body": f"{k}-{i}"} for i in range(1000)])
    # when two archivers start together (each round slowed down, so they surely overlap)
    real = archiver.archive_partition
    monkeypatch.setattr(archiver, "archive_partition", lambda *a, **kw: (time.sleep(0.5), real(*a, **kw))[1])
    barrier = threading.Barrier(2)
    reports = []

    def one():
        from django.db import connection

        barrier.wait()
        try:
            reports.append(archiver.run(name, store=runtime.store))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # then one archived everything and the other found the queue busy
    assert sorted(bool(r[name].get("busy")) for r in reports) == [False, True], reports
    worker = next(r[name] for r in reports if not r[name].get("busy"))
    assert worker["archived"] == 3000
    assert ArchivedMessage.objects.filter(queue=name).count() == 3000
    assert ArchiverLock.objects.get(queue=name).holder == ""


# --- a node killed mid-load -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.cluster
def test_every_confirmed_message_of_a_killed_node_is_archived(kind, node_factory, token, request, tmp_path):
    node = node_factory(backend=kind)
    name = f"archcrash-{uuid.uuid4().hex[:6]}"
    confirmed: set[str] = set()
    lock = threading.Lock()
    try:
        c = Client(node.url, token)
        r = c.post("queues", {"name": name, "partitions": 4, "block_size": 64, "archive": "all"})
        assert r.status_code == 201, r.text

        def producer(k):
            pc = Client(node.url, token)
            for b in range(200):
                try:
                    resp = pc.post(
                        f"queues/{name}/enqueue", {"messages": [{"body": f"{k}:{b}:{i}"} for i in range(50)]}
                    )
                except Exception:  # noqa: BLE001 - the node is being killed
                    return
                if resp.status_code == 201:
                    with lock:
                        confirmed.update(resp.json()["ids"])

        threads = [threading.Thread(target=producer, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        # when the node is killed with SIGKILL while producers are still sending
        while len(confirmed) < 2000 and any(t.is_alive() for t in threads):
            time.sleep(0.01)
        node.kill()
        for t in threads:
            t.join(30)
    finally:
        node.stop()
    # then the archiver (no node needed) finds every confirmed message in the journal
    store = backend_store(kind, request, tmp_path) if kind != "redis" else _redis_store()
    archiver.run(name, store=store)
    archived = set(ArchivedMessage.objects.filter(queue=name).values_list("message_id", flat=True))
    assert len(confirmed) >= 2000
    assert confirmed <= archived
    store.delete_prefix(name)


def _redis_store():
    import redis

    from queues.kv.redis import RedisStore

    return RedisStore(redis.Redis.from_url(os.environ["MQ_TEST_REDIS_URL"] + "/5")).within(settings.KV_PREFIX)


@pytest.mark.django_db
def test_admin_lists_and_replays_archived_messages(api, runtime, make_archived_queue, client):
    from django.contrib.auth.models import User

    name = make_archived_queue(archive="all")
    enqueue(api, name, [{"body": f"m{i}"} for i in range(3)])
    drain(api, name)
    archiver.run(name, store=runtime.store)
    client.force_login(User.objects.create(username=f"a-{uuid.uuid4().hex[:6]}", is_staff=True, is_superuser=True))
    page = client.get("/admin/archive/archivedmessage/", {"queue": name, "acked": "yes"})
    assert page.status_code == 200 and b"m2" in page.content
    pks = list(ArchivedMessage.objects.filter(queue=name).values_list("pk", flat=True))
    r = client.post("/admin/archive/archivedmessage/", {"action": "replay_into_source", "_selected_action": pks})
    assert r.status_code == 302
    assert sorted(m["body"] for m in drain(api, name)) == ["m0", "m1", "m2"]
    assert set(ArchivedMessage.objects.filter(queue=name).values_list("replay_count", flat=True)) == {1}
