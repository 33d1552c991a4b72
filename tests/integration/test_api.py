"""The REST API end to end, happy paths: queues, enqueue, dequeue, ack, visibility, stats, docs.

Runs in-process against the configured database and key-value store (PostgreSQL + Redis under
``make test``; SQLite + the filesystem store with no environment at all). The node runtime has no
housekeeping thread here; every partition is claimed at queue creation.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from rest_framework.test import APIClient

from queues import service
from queues.access import SYSTEM
from queues.engine.ids import parse_message_id
from queues.service import MessageDraft
from tests.integration.wsgi_client import make_client

#: Every test through DRF's test client (straight to Django) and through the node's WSGI
#: application, whose fast path serves the message calls.
pytestmark = [pytest.mark.django_db, pytest.mark.transports, pytest.mark.usefixtures("purge_kv")]

API = "/api/v1/queues"


def url(name: str, action: str = "") -> str:
    return f"{API}/{name}/{action}" if action else f"{API}/{name}"


def enqueue(api, name, *bodies):
    """Enqueue one body (single form) or several (batch form); returns the IDs."""
    if len(bodies) == 1:
        r = api.post(url(name, "enqueue"), {"body": bodies[0]}, format="json")
        assert r.status_code == 201, r.content
        return [r.json()["id"]]
    r = api.post(url(name, "enqueue"), {"messages": [{"body": b} for b in bodies]}, format="json")
    assert r.status_code == 201, r.content
    return r.json()["ids"]


def dequeue(api, name, **params):
    r = api.post(url(name, "dequeue"), params, format="json")
    assert r.status_code == 200, r.content
    return r.json()["messages"]


def stats(api, name):
    r = api.get(url(name, "stats"))
    assert r.status_code == 200, r.content
    return r.json()


# --- queues -----------------------------------------------------------------------------------
def test_queue_lifecycle_create_list_get_patch_delete(api, unique_name):
    # given
    name = unique_name()
    fields = {
        "name": name,
        "partitions": 3,
        "block_size": 16,
        "lease_period": 20,
        "visibility_timeout": 45,
        "max_message_size": 2048,
        "retention": 3600,
    }

    # when
    created = api.post(API, fields, format="json")

    # then
    assert created.status_code == 201, created.content
    body = created.json()
    assert {k: body[k] for k in fields} == fields
    assert body["created_at"] and body["updated_at"]

    # when
    listed = api.get(API)
    got = api.get(url(name))

    # then
    assert listed.status_code == 200
    assert name in [q["name"] for q in listed.json()]
    assert got.status_code == 200
    assert {k: got.json()[k] for k in fields} == fields
    assert len(stats(api, name)["partitions"]) == 3

    # when: settings change, partitions grow
    patched = api.patch(url(name), {"visibility_timeout": 5, "partitions": 5, "retention": 7200}, format="json")

    # then
    assert patched.status_code == 200, patched.content
    assert patched.json()["visibility_timeout"] == 5
    assert patched.json()["partitions"] == 5
    assert api.get(url(name)).json()["retention"] == 7200
    assert [p["index"] for p in stats(api, name)["partitions"]] == [0, 1, 2, 3, 4]
    assert service.get_runtime().queue(name).visibility_timeout == 5

    # when
    deleted = api.delete(url(name))

    # then
    assert deleted.status_code == 204
    missing = api.get(url(name))
    assert missing.status_code == 404
    assert missing.json()["error"] == "queue_not_found"
    assert name not in [q["name"] for q in api.get(API).json()]


def test_create_with_defaults(api, unique_name):
    # given
    name = unique_name()

    # when
    r = api.post(API, {"name": name}, format="json")

    # then
    assert r.status_code == 201, r.content
    assert r.json()["partitions"] == 4
    assert r.json()["visibility_timeout"] == 30


def test_delete_then_recreate_same_name_is_empty(api, make_queue):
    # given
    name = make_queue(partitions=2)
    enqueue(api, name, *[f"old-{i}" for i in range(10)])
    assert len(dequeue(api, name, max=3)) == 3

    # when
    assert api.delete(url(name)).status_code == 204
    r = api.post(API, {"name": name, "partitions": 2}, format="json")

    # then
    assert r.status_code == 201, r.content
    s = stats(api, name)
    assert (s["depth"], s["in_flight"], s["oldest_age"]) == (0, 0, None)
    assert dequeue(api, name, max=10) == []
    new_id = enqueue(api, name, "new")[0]
    assert [(m["id"], m["body"], m["receive_count"]) for m in dequeue(api, name, max=10)] == [(new_id, "new", 1)]


# --- messages ---------------------------------------------------------------------------------
def test_enqueue_single_and_dequeue_fields(api, make_queue):
    # given
    name = make_queue(partitions=1)
    before = time.time()

    # when
    r = api.post(url(name, "enqueue"), {"body": "héllo ✓"}, format="json")

    # then
    assert r.status_code == 201, r.content
    mid = r.json()["id"]
    parsed = parse_message_id(mid)
    assert parsed is not None and parsed.queue == name and parsed.partition == 0

    # when
    msgs = dequeue(api, name, max=5, visibility_timeout=30)

    # then
    assert len(msgs) == 1
    m = msgs[0]
    assert set(m) == {
        "id",
        "receipt",
        "body",
        "receive_count",
        "enqueued_at",
        "sequence",
        "group",
        "attributes",
        "size",
        "estimates",
    }
    assert (m["id"], m["body"], m["receive_count"]) == (mid, "héllo ✓", 1)
    assert isinstance(m["receipt"], str) and m["receipt"]
    assert m["enqueued_at"].endswith("Z")
    from datetime import datetime

    at = datetime.fromisoformat(m["enqueued_at"].replace("Z", "+00:00")).timestamp()
    assert before - 1 <= at <= time.time() + 1


def test_a_null_estimate_is_the_queues_and_a_delivery_answers_numbers(api, make_queue):
    # the schema lets a message's estimate be null ("not given") and says a delivery's
    # estimates are numbers: a null was stored and delivered as null
    name = make_queue(partitions=1, preprocess_estimate=2.5, process_estimate=7.0)
    sent = [
        {"body": "both null", "estimates": {"preprocess": None, "process": None}},
        {"body": "process null", "estimates": {"process": None}},
        {"body": "one given", "estimates": {"preprocess": 1.0, "process": None}},
        {"body": "none"},
    ]
    r = api.post(f"{API}/{name}/enqueue", {"messages": sent}, format="json")
    assert r.status_code == 201, r.content
    r = api.post(f"{API}/{name}/dequeue", {"max": 10}, format="json")
    got = {m["body"]: m["estimates"] for m in r.json()["messages"]}
    assert got == {
        "both null": {"preprocess": 2.5, "process": 7.0},
        "process null": {"preprocess": 2.5, "process": 7.0},
        "one given": {"preprocess": 1.0, "process": 7.0},
        "none": {"preprocess": 2.5, "process": 7.0},
    }


def test_batch_of_1000_ids_in_order_and_fifo_dequeue(api, make_queue):
    # given: one partition, small blocks so the batch spans several (each twice the one before:
    # they fill at once, see queues.engine.tree.next_block_size)
    name = make_queue(partitions=1, block_size=64)
    bodies = [f"m{i:04d}" for i in range(1000)]

    # when
    ids = enqueue(api, name, *bodies)

    # then: 1000 distinct IDs in order of position
    assert len(ids) == 1000 == len(set(ids))
    parsed = [parse_message_id(i) for i in ids]
    assert all(p is not None and p.queue == name and p.partition == 0 for p in parsed)
    blocks_in_order = list(dict.fromkeys(p.block for p in parsed))
    positions = [(blocks_in_order.index(p.block), p.index) for p in parsed]
    assert positions == sorted(positions)
    per_block = [sum(1 for p in parsed if p.block == b) for b in blocks_in_order]
    assert per_block == [64, 128, 256, 512, 40]
    assert stats(api, name)["depth"] == 1000

    # when
    first = dequeue(api, name, max=600)
    rest = dequeue(api, name, max=1000)

    # then: FIFO within the partition, each body with its ID
    got = first + rest
    assert [m["id"] for m in got] == ids
    assert [m["body"] for m in got] == bodies
    assert dequeue(api, name, max=10) == []


def test_ack_removes_and_stats_track_it(api, make_queue):
    # given
    name = make_queue(partitions=2)
    s0 = stats(api, name)
    assert (s0["depth"], s0["in_flight"], s0["oldest_age"]) == (0, 0, None)
    assert len(s0["partitions"]) == 2
    ids = enqueue(api, name, *[f"b{i}" for i in range(5)])

    # when
    s1 = stats(api, name)
    msgs = dequeue(api, name, max=3, visibility_timeout=60)
    s2 = stats(api, name)

    # then
    assert (s1["depth"], s1["in_flight"]) == (5, 0)
    assert s1["oldest_age"] is not None and s1["oldest_age"] >= 0
    assert sum(p["depth"] for p in s1["partitions"]) == 5
    assert len(msgs) == 3
    assert (s2["depth"], s2["in_flight"]) == (2, 3)

    # when: ack two by receipt and one by bare ID
    r = api.post(
        url(name, "ack"), {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in msgs[:2]]}, format="json"
    )
    r2 = api.post(url(name, "ack"), {"ids": [msgs[2]["id"]]}, format="json")

    # then
    assert r.status_code == 200, r.content
    assert r.json() == {"acked": 2, "not_found": 0}
    assert r2.json() == {"acked": 1, "not_found": 0}
    s3 = stats(api, name)
    assert (s3["depth"], s3["in_flight"]) == (2, 0)
    assert sum(p["acked"] for p in s3["partitions"]) == 3
    left = dequeue(api, name, max=10)
    assert sorted(m["id"] for m in left) == sorted(set(ids) - {m["id"] for m in msgs})

    # when: acking again finds nothing
    again = api.post(url(name, "ack"), {"ids": [msgs[0]["id"]]}, format="json")

    # then
    assert again.status_code == 200
    assert again.json() == {"acked": 0, "not_found": 1}

    # when: the rest is acked
    api.post(url(name, "ack"), {"ids": [m["id"] for m in left]}, format="json")

    # then
    s4 = stats(api, name)
    assert (s4["depth"], s4["in_flight"], s4["oldest_age"]) == (0, 0, None)


def test_visibility_timeout_expiry_redelivers_with_new_receipt(api, make_queue):
    # given
    name = make_queue(partitions=1)
    (mid,) = enqueue(api, name, "again")
    (first,) = dequeue(api, name, visibility_timeout=0.2)
    assert dequeue(api, name) == []

    # when
    time.sleep(0.3)
    second = dequeue(api, name, visibility_timeout=30)

    # then
    assert len(second) == 1
    assert second[0]["id"] == mid
    assert second[0]["body"] == "again"
    assert (first["receive_count"], second[0]["receive_count"]) == (1, 2)
    assert second[0]["receipt"] != first["receipt"]
    assert sum(p["redelivered"] for p in stats(api, name)["partitions"]) == 1


def test_visibility_call_zero_makes_visible_and_extension_hides(api, make_queue):
    # given
    name = make_queue(partitions=1)
    (mid,) = enqueue(api, name, "v")
    (d1,) = dequeue(api, name, visibility_timeout=0.3)

    # when: extended to 60 s before it expires
    r = api.post(
        url(name, "visibility"), {"id": mid, "receipt": d1["receipt"], "visibility_timeout": 60}, format="json"
    )
    time.sleep(0.4)

    # then
    assert r.status_code == 200, r.content
    assert r.json() == {"id": mid, "visibility_timeout": 60}
    assert dequeue(api, name) == []
    assert stats(api, name)["in_flight"] == 1

    # when: shortened to 0
    r = api.post(url(name, "visibility"), {"id": mid, "receipt": d1["receipt"], "visibility_timeout": 0}, format="json")

    # then
    assert r.status_code == 200, r.content
    (d2,) = dequeue(api, name)
    assert (d2["id"], d2["receive_count"]) == (mid, 2)
    assert d2["receipt"] != d1["receipt"]


def test_a_receipt_whose_visibility_ran_out_hides_nothing_again(api, make_queue):
    # given: a message whose visibility timeout ran out, received by nobody since
    name = make_queue(partitions=1)
    (mid,) = enqueue(api, name, "v")
    (d1,) = dequeue(api, name, visibility_timeout=0.2)
    time.sleep(0.4)

    # when
    r = api.post(
        url(name, "visibility"), {"id": mid, "receipt": d1["receipt"], "visibility_timeout": 60}, format="json"
    )

    # then: refused, and it stays visible
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "receipt_mismatch" and "visible again" in r.json()["detail"]
    (d2,) = dequeue(api, name)
    assert (d2["id"], d2["receive_count"]) == (mid, 2)


def test_stale_receipt_is_409_on_ack_and_visibility_and_changes_nothing(api, make_queue):
    # given: a message delivered twice; d1's receipt is stale
    name = make_queue(partitions=1)
    (mid,) = enqueue(api, name, "s")
    (d1,) = dequeue(api, name, visibility_timeout=30)
    api.post(url(name, "visibility"), {"id": mid, "receipt": d1["receipt"], "visibility_timeout": 0}, format="json")
    (d2,) = dequeue(api, name, visibility_timeout=30)
    assert d2["receipt"] != d1["receipt"]
    before = stats(api, name)

    # when
    ack = api.post(url(name, "ack"), {"messages": [{"id": mid, "receipt": d1["receipt"]}]}, format="json")
    vis = api.post(
        url(name, "visibility"), {"id": mid, "receipt": d1["receipt"], "visibility_timeout": 0}, format="json"
    )

    # then
    assert ack.status_code == 409, ack.content
    assert ack.json()["error"] == "receipt_mismatch" and ack.json()["detail"]
    assert vis.status_code == 409, vis.content
    assert vis.json()["error"] == "receipt_mismatch"
    after = stats(api, name)
    assert (after["depth"], after["in_flight"]) == (before["depth"], before["in_flight"]) == (0, 1)
    assert after["partitions"][0]["acked"] == 0
    assert dequeue(api, name) == []  # the stale visibility call did not make it visible

    # when: the current receipt works
    ok = api.post(url(name, "ack"), {"messages": [{"id": mid, "receipt": d2["receipt"]}]}, format="json")

    # then
    assert ok.status_code == 200
    assert ok.json() == {"acked": 1, "not_found": 0}


def test_long_poll_returns_promptly_when_a_message_arrives(api, make_queue):
    # given: the head block exists (so the enqueue from the other thread needs no database)
    name = make_queue(partitions=1)
    (warm,) = enqueue(api, name, "warm-up")
    (_d,) = dequeue(api, name)
    api.post(url(name, "ack"), {"ids": [warm]}, format="json")
    sent: list[str] = []

    def later():
        time.sleep(0.3)
        sent.extend(service.enqueue(name, [MessageDraft("late")], caller=SYSTEM))

    t = threading.Thread(target=later)

    # when
    t0 = time.monotonic()
    t.start()
    msgs = dequeue(api, name, wait=2)
    elapsed = time.monotonic() - t0
    t.join()

    # then
    assert [m["body"] for m in msgs] == ["late"]
    assert [m["id"] for m in msgs] == sent
    assert 0.25 <= elapsed < 1.5


def test_long_poll_times_out_empty(api, make_queue):
    # given
    name = make_queue(partitions=2)

    # when
    t0 = time.monotonic()
    msgs = dequeue(api, name, wait=0.4)
    elapsed = time.monotonic() - t0

    # then
    assert msgs == []
    assert 0.35 <= elapsed < 2


def test_long_poll_wakes_for_a_redelivery(api, make_queue):
    # given
    name = make_queue(partitions=1)
    (mid,) = enqueue(api, name, "x")
    dequeue(api, name, visibility_timeout=0.3)

    # when
    t0 = time.monotonic()
    msgs = dequeue(api, name, wait=3)
    elapsed = time.monotonic() - t0

    # then
    assert [(m["id"], m["receive_count"]) for m in msgs] == [(mid, 2)]
    assert elapsed < 1.5


def test_each_transport_serves_the_message_calls(api, make_queue):
    """Guards the parametrization: through the WSGI application the four message calls take the
    fast path (Django never sees them) and the other calls go to Django."""
    # given
    name = make_queue(partitions=1)

    # when
    calls = {
        "enqueue": api.post(url(name, "enqueue"), {"body": "x"}, format="json"),
        "dequeue": api.post(url(name, "dequeue"), {"max": 1}, format="json"),
    }
    (m,) = calls["dequeue"].json()["messages"]
    calls["visibility"] = api.post(
        url(name, "visibility"), {"id": m["id"], "receipt": m["receipt"], "visibility_timeout": 5}, format="json"
    )
    calls["ack"] = api.post(url(name, "ack"), {"ids": [m["id"]]}, format="json")
    other = api.get(url(name))

    # then
    assert {k: r.status_code for k, r in calls.items()} == {
        "enqueue": 201,
        "dequeue": 200,
        "visibility": 200,
        "ack": 200,
    }
    assert calls["ack"].json() == {"acked": 1, "not_found": 0}
    assert other.status_code == 200
    if api.transport == "fastpath":
        assert {k: r.served_by for k, r in calls.items()} == dict.fromkeys(calls, "fastpath")
        assert other.served_by == "django"


# --- docs and health --------------------------------------------------------------------------
def test_schema_and_docs_answer(api, runtime):
    # given
    anonymous = make_client(api.transport)

    # when
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    docs = anonymous.get("/api/docs/")
    anon_schema = anonymous.get("/api/schema/")

    # then
    assert schema.status_code == 200, schema.content[:300]
    import json

    paths = json.loads(schema.content)["paths"]
    for p in (
        "/api/v1/queues",
        "/api/v1/queues/{name}",
        "/api/v1/queues/{name}/enqueue",
        "/api/v1/queues/{name}/dequeue",
        "/api/v1/queues/{name}/ack",
        "/api/v1/queues/{name}/visibility",
        "/api/v1/queues/{name}/stats",
    ):
        assert p in paths
    # and without a login the schema answers 401, the docs page sends the browser to the login
    assert docs.status_code == 302 and docs["Location"] == "/admin/login/?next=/api/docs/"
    assert anon_schema.status_code == 401
    page = api.get("/api/docs/")
    assert page.status_code == 200 and b"swagger-ui-bundle.js" in page.content


def test_a_partitions_owner_is_named_by_id_and_address_in_every_answer(api, make_queue, runtime, monkeypatch):
    """``owner_id`` and ``owner_address`` mean the same in the partitions' answer and in the
    stats (live, and as published); the old ``owner`` stays as each answered it before."""
    # given
    name = make_queue(partitions=2)
    me = (runtime.node_id, runtime.address)

    # when
    owners = api.get(url(name, "partitions")).json()["partitions"]
    live = stats(api, name)["partitions"]
    monkeypatch.setattr(runtime, "local_managers", lambda queue: [])  # as another node answers
    published = stats(api, name)["partitions"]

    # then
    for answer in (owners, live, published):
        assert [(p["owner_id"], p["owner_address"]) for p in answer] == [me, me]
    assert [p["live"] for p in live + published] == [True, True, False, False]
    # and the deprecated field keeps its old meaning in each answer, for one release
    assert [(p["owner"], p["address"]) for p in owners] == [me, me]
    assert [p["owner"] for p in live + published] == [runtime.address] * 4


def test_the_schema_marks_the_old_owner_field_deprecated(api):
    # when
    r = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = json.loads(r.content)["paths"]

    # then
    for path in ("/api/v1/queues/{name}/partitions", "/api/v1/queues/{name}/stats"):
        body = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        part = body["properties"]["partitions"]["items"]
        assert {"owner_id", "owner_address"} <= set(part["required"]), path
        assert part["properties"]["owner"]["deprecated"] is True, path
        assert "deprecated" not in part["properties"]["owner_id"], path


def test_healthz_needs_no_auth(runtime):
    # given
    anonymous = APIClient()

    # when
    r = anonymous.get("/api/v1/healthz")

    # then
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}  # liveness only: nothing about the node (test_node_identity)


def test_the_root_maps_the_node_and_post_stays_the_sqs_endpoint(api):
    # given a client without credentials, of the same entrance as the api fixture's
    anonymous = make_client(api.transport)

    # when it opens the node's address, asks for its headers only, and posts an unsigned SQS call there
    page = anonymous.get("/")
    head = anonymous.generic("HEAD", "/")
    sqs = anonymous.post("/", data="Action=ListQueues", content_type="application/x-www-form-urlencoded")
    wrong = anonymous.delete("/")

    # then the map names the console, the API's docs and schema, the SQS endpoint and the checks
    assert page.status_code == 200 and page["Content-Type"] == "application/json"
    assert page.json() == {
        "service": "mq: a partitioned, at-least-once message queue",
        "console": "/admin/",
        "api_docs": "/api/docs/",
        "api_schema": "/api/schema/",
        "sqs": "/sqs",
        "healthz": "/api/v1/healthz",
        "readyz": "/api/v1/readyz",
        "metrics": "/metrics",
    }
    assert head.status_code == 200
    # and each path it names is served (the docs and the schema ask for a login first)
    for path, status in [("/admin/", 302), ("/api/docs/", 302), ("/api/schema/", 401), ("/api/v1/healthz", 200)]:
        assert anonymous.get(path).status_code == status, path
    # and POST / is still SQS's: an unsigned call is refused in SQS's words
    assert sqs.status_code == 403 and b"MissingAuthenticationToken" in sqs.content, sqs.content
    assert wrong.status_code == 405 and wrong["Allow"] == "GET, HEAD, POST"


def test_the_schema_documents_readyz(api):
    # when
    r = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    op = json.loads(r.content)["paths"]["/api/v1/readyz"]["get"]

    # then: no authentication, 200 ready, 503 with the failing checks and Retry-After
    assert op["security"] == [{}]
    ready = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert ready["properties"]["status"]["enum"] == ["ready"]
    not_ready = op["responses"]["503"]
    assert not_ready["content"]["application/json"]["schema"]["required"] == ["status", "not_ready"]
    assert "Retry-After" in not_ready["headers"]


def test_a_fairness_key_takes_turns_with_the_others_and_is_answered(api, make_queue):
    # given: a tenant that floods a queue of one partition, then two quiet ones and a keyless message
    name = make_queue(partitions=1)
    noisy = [{"body": f"noisy{i}", "fairness_key": "noisy"} for i in range(20)]
    r = api.post(url(name, "enqueue"), {"messages": noisy}, format="json")
    assert r.status_code == 201, r.content
    quiet = [{"body": "quiet-a", "fairness_key": "a"}, {"body": "quiet-b", "fairness_key": "b"}, {"body": "plain"}]
    r = api.post(url(name, "enqueue"), {"messages": quiet}, format="json")
    assert r.status_code == 201, r.content

    # when
    got = dequeue(api, name, max=4)

    # then: one of the flood's, then each of the others: nobody waits for the backlog
    assert [m["body"] for m in got] == ["noisy0", "quiet-a", "quiet-b", "plain"]
    assert [m.get("fairness_key") for m in got] == ["noisy", "a", "b", None]


def test_a_fairness_key_flooding_one_partition_does_not_fill_a_receive(api, make_queue):
    # given: a flood in one partition (a call's messages go into one), a quiet tenant's message
    # in the other (the next call goes to the next partition)
    name = make_queue(partitions=2)
    noisy = [{"body": f"noisy{i}", "fairness_key": "noisy"} for i in range(20)]
    assert api.post(url(name, "enqueue"), {"messages": noisy}, format="json").status_code == 201
    r = api.post(url(name, "enqueue"), {"messages": [{"body": "quiet", "fairness_key": "q"}]}, format="json")
    assert r.status_code == 201, r.content

    # when: a receive of 4, whichever partition it starts with
    bodies = [m["body"] for m in dequeue(api, name, max=4)]

    # then: it takes a share of each partition, so the quiet tenant is in it
    assert len(bodies) == 4 and "quiet" in bodies, bodies


@pytest.mark.parametrize("key", ["", "k" * 129, 7])
def test_a_bad_fairness_key_is_400_and_stores_nothing(api, make_queue, key):
    name = make_queue(partitions=1)
    r = api.post(
        url(name, "enqueue"), {"messages": [{"body": "ok"}, {"body": "x", "fairness_key": key}]}, format="json"
    )
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_fairness_key"
    assert stats(api, name)["depth"] == 0
