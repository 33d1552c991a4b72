"""Hostile and clumsy input against every endpoint: an exact 4xx, a JSON error, and no change.

Each case runs against a small world (two queues, messages visible, in flight, and one with a
stale receipt) and compares a full snapshot of it before and after: queue rows and settings,
partition rows, the stats, each partition manager's memory (in-flight entries with receipts and
deadlines, the dequeue order, live positions) and every key the key-value store holds for the
queues. A 5xx is a failure (the test client re-raises server errors).

The calls that must be refused share one world per class (:class:`TestRefused`); the controls
that change it and the random inputs, which may, build their own.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queues import service
from queues.access import SYSTEM
from queues.engine.keys import block_key
from queues.models import Partition, Queue
from queues.service import MessageDraft
from tests.integration.wsgi_client import TRANSPORTS, make_client, token_client

#: Every case through DRF's test client (straight to Django) and through the node's WSGI
#: application, whose fast path serves the message calls (with a token and a JSON body) and
#: hands everything else to Django. Both must answer alike.
pytestmark = [pytest.mark.django_db, pytest.mark.transports]

API = "/api/v1/queues"
ABSENT = object()  # no request body at all


# --- the world and its snapshot ---------------------------------------------------------------
@dataclass
class World:
    q: str
    other: str
    ids: dict = field(default_factory=dict)  # "@name" -> value used in request bodies


#: The world's leases and deliveries outlast a class of tests (nothing renews them there).
LEASE_PERIOD, IN_FLIGHT = 3600, 43200


def build_world(api) -> World:
    def create(prefix: str, **fields) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        r = api.post(API, {"name": name, "lease_period": LEASE_PERIOD, **fields}, format="json")
        assert r.status_code == 201, r.content
        return name

    def post(name, action, body):
        r = api.post(f"{API}/{name}/{action}", body, format="json")
        assert r.status_code in (200, 201), r.content
        return r.json()

    q = create("bad", partitions=2, block_size=8, max_message_size=64)
    other = create("other", partitions=1)
    post(q, "enqueue", {"messages": [{"body": f"m{i}"} for i in range(6)]})
    post(q, "enqueue", {"messages": [{"body": f"n{i}"} for i in range(6)]})
    a, b, c = post(q, "dequeue", {"max": 3, "visibility_timeout": IN_FLIGHT})["messages"]
    # c: delivered twice, so its first receipt is stale
    post(q, "visibility", {"id": c["id"], "receipt": c["receipt"], "visibility_timeout": 0})
    for _ in range(4):  # partitions take turns: the redelivery comes within two calls
        (c2,) = post(q, "dequeue", {"max": 1, "visibility_timeout": IN_FLIGHT})["messages"]
        if c2["id"] == c["id"]:
            break
    assert c2["id"] == c["id"] and c2["receive_count"] == 2
    other_id = post(other, "enqueue", {"body": "theirs"})["id"]
    visible = [m for m in [*_all_positions(q)] if m not in {a["id"], b["id"], c["id"]}]
    head, _part, block, index = a["id"].rsplit("/", 3)
    return World(
        q,
        other,
        {
            "@inflight": a["id"],
            "@receipt": a["receipt"],
            "@inflight2": b["id"],
            "@receipt2": b["receipt"],
            "@redelivered": c["id"],
            "@stale": c["receipt"],
            "@current": c2["receipt"],
            "@visible": visible[0],
            "@other_id": other_id,
            "@p9": f"{head}/9/{block}/{index}",
            "@missing": f"{q}/0/00000000-0000000000000000/0",
        },
    )


@pytest.fixture
def world(api, purge_kv) -> World:
    """A world of the test's own, for the tests that change it (or may); the key-value store
    emptied afterwards (see conftest.purge_kv), as the database rolls back."""
    return build_world(api)


@dataclass
class Still:
    world: World
    token: str


@pytest.fixture(scope="class")
def still(django_db_setup, django_db_blocker) -> Iterator[Still]:
    """One world for a class of tests that only send what must be refused, built once (a world
    costs more than most of those calls): in a transaction around the class's tests, each of
    which runs in a savepoint of it (pytest-django's ``django_db``), on a node runtime of its
    own, all rolled back, stopped and its keys removed at the class's end. Each test compares
    its snapshots before and after its call; the class's end compares the world with the one
    built, so a change that slipped past a test's rollback shows too."""
    from django.contrib.auth.models import User
    from django.db import transaction

    from queues.cluster.node import NodeRuntime
    from queues.http.auth import CachedTokenAuthentication
    from queues.kv import reset_store

    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        rt = None
        try:
            reset_store()
            CachedTokenAuthentication.forget()
            rt = NodeRuntime("test-node", background=False).start()
            service.set_runtime(rt)
            builder = token_client("drf", User.objects.create(username=f"u-{uuid.uuid4().hex[:8]}"))
            world = build_world(builder)
            built = snapshot(world.q, world.other)
        except BaseException:
            _end_still(rt, outer)
            raise
    yield Still(world, builder.token)
    with django_db_blocker.unblock():
        try:
            left = snapshot(world.q, world.other)
        finally:
            _end_still(rt, outer)
    assert left == built


def _end_still(rt, outer) -> None:
    """Remove the class's keys, stop its runtime and roll its transaction back."""
    from django.db import transaction

    from queues.engine.keys import incarnation
    from queues.kv import reset_store

    try:
        if rt is not None:
            for pk, name in Queue.objects.values_list("pk", "name"):
                rt.store.within(incarnation(pk)).delete_prefix(name)
            rt.stop(release=True)
    finally:
        service.set_runtime(None)
        reset_store()
        transaction.set_rollback(True)
        outer.__exit__(None, None, None)


def _all_positions(queue: str) -> list[str]:
    out = []
    for m in service.get_runtime().local_managers(queue):
        with m.lock:
            for bid, state in m.blocks.items():
                out += [f"{queue}/{m.index}/{bid}/{i}" for i in sorted(state.live)]
    return out


def _no_ages(stats: dict) -> dict:
    stats = {k: v for k, v in stats.items() if k != "oldest_age"}
    stats["partitions"] = [{k: v for k, v in p.items() if k != "oldest_age"} for p in stats["partitions"]]
    return stats


def snapshot(*queues: str) -> dict:
    """Everything a call could change, for these queues and for the set of queues."""
    rt = service.get_runtime()
    store = rt.store
    snap: dict = {"queues": list(Queue.objects.order_by("name").values())}
    for name in queues:
        snap[f"partitions:{name}"] = list(
            Partition.objects.filter(queue__name=name)
            .order_by("index")
            .values("index", "owner_id", "epoch", "head_block", "lease_period")
        )
        snap[f"stats:{name}"] = _no_ages(service.queue_stats(name, caller=SYSTEM))
        for m in sorted(rt.local_managers(name), key=lambda m: m.index):
            with m.lock:
                snap[f"mem:{name}/{m.index}"] = {
                    "redelivery": {k: (e.deadline, e.receipt, e.receive_count) for k, e in m.redelivery.by_id.items()},
                    "ready": list(m.ready),
                    "scanned_ready": list(m.scanned_ready),
                    "blocks": {bid: sorted(s.live) for bid, s in m.blocks.items()},
                    "head": m.tree.head.id if m.tree.head else None,
                    "next_index": m.next_index,
                    "totals": (m.enqueued_total, m.acked_total, m.redelivered_total),
                }
                block_ids = list(m.blocks)
            for bid in block_ids:
                bucket = f"{name}/{m.index}/{bid}"
                names = sorted(store.scan(bucket))
                values = store.get_many([f"{bucket}/{n}" for n in names])
                snap[f"kv:{bucket}"] = dict(zip(names, values))
                snap[f"kv:block:{bucket}"] = store.get(block_key(name, m.index, bid))
    return snap


# --- the matrix -------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    method: str
    path: str  # {q}, {other}: the world's queue names
    body: object = ABSENT  # a JSON value (strings "@x" are the world's IDs/receipts), or bytes
    status: int = 400
    code: str | None = None
    auth: str = "token"  # token | none | bad | bearer
    content_type: str = "application/json"


def C(id, method, path, body=ABSENT, status=400, code=None, **kw) -> Case:
    return Case(id, method, path, body, status, code, **kw)


Q, QE, QD, QA, QV, QS = (
    f"{API}/{{q}}",
    f"{API}/{{q}}/enqueue",
    f"{API}/{{q}}/dequeue",
    f"{API}/{{q}}/ack",
    f"{API}/{{q}}/visibility",
    f"{API}/{{q}}/stats",
)
POSTS = {"enqueue": QE, "dequeue": QD, "ack": QA, "visibility": QV, "create": API}
GOOD = {
    QE: {"body": "fine"},
    QD: {"max": 1},
    QA: {"ids": ["@visible"]},
    QV: {"id": "@inflight", "visibility_timeout": 0},
    API: {"name": "brand-new"},
    Q: {"visibility_timeout": 1},
}
ENDPOINTS = [
    ("GET", API),
    ("POST", API),
    ("GET", Q),
    ("PATCH", Q),
    ("DELETE", Q),
    ("POST", QE),
    ("POST", QD),
    ("POST", QA),
    ("POST", QV),
    ("GET", QS),
]

CASES: list[Case] = []

# authentication, on every endpoint (with an otherwise valid request)
for method, path in ENDPOINTS:
    tail = path.removeprefix(API).replace("{q}", "q") or "/"
    for auth, code in (
        ("none", "not_authenticated"),
        ("bad", "authentication_failed"),
        ("bearer", "not_authenticated"),
    ):
        CASES.append(C(f"auth-{auth}-{method}{tail}", method, path, GOOD.get(path, ABSENT), 401, code, auth=auth))

# bodies that are not a JSON object, on every endpoint that takes one
for ep, path in [*POSTS.items(), ("patch", Q)]:
    method = "PATCH" if ep == "patch" else "POST"
    CASES += [
        C(f"{ep}-malformed", method, path, b'{"body": "x",', 400, "malformed_json"),
        C(f"{ep}-trailing-garbage", method, path, b'{"max": 1} x', 400, "malformed_json"),
        C(f"{ep}-nan-literal", method, path, b'{"max": NaN}', 400, "malformed_json"),
        C(f"{ep}-infinite-number", method, path, b'{"max": 1e400}', 400, "malformed_json"),
        C(f"{ep}-lone-surrogate", method, path, b'{"body": "\\ud800"}', 400, "malformed_json"),
        C(f"{ep}-not-utf8", method, path, b'{"body": "\xff\xfe"}', 400, "malformed_json"),
        C(f"{ep}-list", method, path, [{"body": "x"}], 400),
        C(f"{ep}-string", method, path, "body", 400),
        C(f"{ep}-number", method, path, 5, 400),
        C(f"{ep}-null", method, path, None, 400),
        C(f"{ep}-text-plain", method, path, b'{"body": "x"}', 415, "unsupported_media_type", content_type="text/plain"),
        C(
            f"{ep}-form",
            method,
            path,
            b"body=x",
            415,
            "unsupported_media_type",
            content_type="application/x-www-form-urlencoded",
        ),
    ]

CASES += [
    # enqueue
    C("enqueue-unknown-field", "POST", QE, {"body": "x", "priority": 1}, 400, "unknown_field"),
    C("enqueue-body-and-messages", "POST", QE, {"body": "x", "messages": [{"body": "y"}]}, 400, "unknown_field"),
    C("enqueue-missing-body", "POST", QE, {}, 400, "missing_body"),
    C("enqueue-no-request-body", "POST", QE, ABSENT, 400, "missing_body"),
    C("enqueue-empty-request-body", "POST", QE, b"", 400, "missing_body"),
    C("enqueue-empty-body", "POST", QE, {"body": ""}, 400, "empty_body"),
    C("enqueue-body-null", "POST", QE, {"body": None}, 400, "invalid_body"),
    C("enqueue-body-number", "POST", QE, {"body": 5}, 400, "invalid_body"),
    C("enqueue-body-bool", "POST", QE, {"body": True}, 400, "invalid_body"),
    C("enqueue-body-object", "POST", QE, {"body": {"a": 1}}, 400, "invalid_body"),
    C("enqueue-body-list", "POST", QE, {"body": ["a"]}, 400, "invalid_body"),
    # max_message_size is 64 bytes: 33 code points, 65 bytes of UTF-8
    C("enqueue-oversized-2byte", "POST", QE, {"body": "é" * 32 + "a"}, 400, "body_too_large"),
    C("enqueue-oversized-3byte", "POST", QE, {"body": "€" * 21 + "ab"}, 400, "body_too_large"),
    C("enqueue-oversized-4byte", "POST", QE, {"body": "😀" * 16 + "a"}, 400, "body_too_large"),
    C("enqueue-oversized-ascii", "POST", QE, {"body": "a" * 65}, 400, "body_too_large"),
    C("enqueue-oversized-huge", "POST", QE, {"body": "a" * 300_000}, 400, "body_too_large"),
    C("batch-one-oversized", "POST", QE, {"messages": [{"body": "ok"}, {"body": "é" * 33}]}, 400, "body_too_large"),
    C("batch-1001", "POST", QE, {"messages": [{"body": "x"}] * 1001}, 400, "batch_too_large"),
    C("batch-empty", "POST", QE, {"messages": []}, 400, "invalid_messages"),
    C("batch-not-list", "POST", QE, {"messages": {"body": "x"}}, 400, "invalid_messages"),
    C("batch-string", "POST", QE, {"messages": "x"}, 400, "invalid_messages"),
    C("batch-null", "POST", QE, {"messages": None}, 400, "invalid_messages"),
    C("batch-items-strings", "POST", QE, {"messages": ["a", "b"]}, 400, "invalid_messages"),
    C("batch-item-null", "POST", QE, {"messages": [{"body": "a"}, None]}, 400, "invalid_messages"),
    C("batch-item-list", "POST", QE, {"messages": [["a"]]}, 400, "invalid_messages"),
    C("batch-item-missing-body", "POST", QE, {"messages": [{"body": "a"}, {}]}, 400, "missing_body"),
    C("batch-item-unknown-field", "POST", QE, {"messages": [{"body": "a", "colour": "g"}]}, 400, "unknown_field"),
    C("batch-item-empty-body", "POST", QE, {"messages": [{"body": "a"}, {"body": ""}]}, 400, "empty_body"),
    C("batch-item-body-number", "POST", QE, {"messages": [{"body": "a"}, {"body": 1}]}, 400, "invalid_body"),
    C("batch-extra-field", "POST", QE, {"messages": [{"body": "a"}], "wait": 1}, 400, "unknown_field"),
    # dequeue
    C("dequeue-unknown-field", "POST", QD, {"max": 1, "count": 2}, 400, "unknown_field"),
    C("dequeue-max-0", "POST", QD, {"max": 0}, 400, "out_of_range"),
    C("dequeue-max-negative", "POST", QD, {"max": -1}, 400, "out_of_range"),
    C("dequeue-max-1001", "POST", QD, {"max": 1001}, 400, "out_of_range"),
    C("dequeue-max-huge", "POST", QD, {"max": 10**30}, 400),
    C("dequeue-max-string", "POST", QD, {"max": "5"}, 400, "invalid_number"),
    C("dequeue-max-true", "POST", QD, {"max": True}, 400, "invalid_number"),
    C("dequeue-max-fraction", "POST", QD, {"max": 1.5}, 400, "invalid_number"),
    C("dequeue-max-nan-string", "POST", QD, {"max": "NaN"}, 400, "invalid_number"),
    C("dequeue-max-list", "POST", QD, {"max": [1]}, 400, "invalid_number"),
    C("dequeue-wait-21", "POST", QD, {"wait": 21}, 400, "out_of_range"),
    C("dequeue-wait-negative", "POST", QD, {"wait": -1}, 400, "out_of_range"),
    C("dequeue-wait-string", "POST", QD, {"wait": "1"}, 400, "invalid_number"),
    C("dequeue-wait-false", "POST", QD, {"wait": False}, 400, "invalid_number"),
    C("dequeue-visibility-negative", "POST", QD, {"visibility_timeout": -1}, 400, "out_of_range"),
    C("dequeue-visibility-1e9", "POST", QD, {"visibility_timeout": 1e9}, 400, "out_of_range"),
    C("dequeue-visibility-over-12h", "POST", QD, {"visibility_timeout": 43201}, 400, "out_of_range"),
    C("dequeue-visibility-string", "POST", QD, {"visibility_timeout": "30"}, 400, "invalid_number"),
    # ack
    C("ack-neither", "POST", QA, {}, 400, "invalid_ack"),
    C("ack-no-request-body", "POST", QA, ABSENT, 400, "invalid_ack"),
    C("ack-both", "POST", QA, {"ids": ["@visible"], "messages": [{"id": "@inflight"}]}, 400, "invalid_ack"),
    C("ack-ids-not-list", "POST", QA, {"ids": "@visible"}, 400, "invalid_ack"),
    C("ack-ids-empty", "POST", QA, {"ids": []}, 400, "invalid_ack"),
    C("ack-ids-null", "POST", QA, {"ids": None}, 400, "invalid_ack"),
    C("ack-ids-1001", "POST", QA, {"ids": ["@visible"] * 1001}, 400, "batch_too_large"),
    C("ack-ids-malformed", "POST", QA, {"ids": ["not-an-id"]}, 400, "invalid_id"),
    C("ack-ids-number", "POST", QA, {"ids": [12]}, 400, "invalid_id"),
    C("ack-ids-null-item", "POST", QA, {"ids": [None]}, 400, "invalid_id"),
    C("ack-ids-object-item", "POST", QA, {"ids": [{"id": "@visible"}]}, 400, "invalid_id"),
    C("ack-ids-bad-block", "POST", QA, {"ids": ["{q}/0/zzzz/1"]}, 400, "invalid_id"),
    C("ack-ids-negative-index", "POST", QA, {"ids": ["{q}/0/00000000-0000000000000000/-1"]}, 400, "invalid_id"),
    C("ack-ids-trailing-slash", "POST", QA, {"ids": ["@visible/"]}, 400, "invalid_id"),
    C("ack-ids-trailing-newline", "POST", QA, {"ids": ["{q}/0/00000000-0000000000000000/1\n"]}, 400, "invalid_id"),
    C(
        "ack-messages-trailing-newline",
        "POST",
        QA,
        {"messages": [{"id": "{q}/0/00000000-0000000000000000/1\n", "receipt": "r"}]},
        400,
        "invalid_id",
    ),
    C("ack-good-then-malformed", "POST", QA, {"ids": ["@visible", "@inflight", "bad"]}, 400, "invalid_id"),
    C("ack-ids-other-queue", "POST", QA, {"ids": ["@visible", "@other_id"]}, 400, "wrong_queue"),
    C("ack-ids-partition-out-of-range", "POST", QA, {"ids": ["@visible", "@p9"]}, 400, "invalid_id"),
    C("ack-extra-field", "POST", QA, {"ids": ["@visible"], "force": True}, 400, "unknown_field"),
    C("ack-messages-not-list", "POST", QA, {"messages": {"id": "@inflight"}}, 400, "invalid_ack"),
    C("ack-messages-empty", "POST", QA, {"messages": []}, 400, "invalid_ack"),
    C("ack-messages-1001", "POST", QA, {"messages": [{"id": "@visible"}] * 1001}, 400, "batch_too_large"),
    C("ack-messages-item-string", "POST", QA, {"messages": ["@inflight"]}, 400, "invalid_ack"),
    C("ack-messages-item-null", "POST", QA, {"messages": [None]}, 400, "invalid_ack"),
    C("ack-messages-missing-id", "POST", QA, {"messages": [{"receipt": "@receipt"}]}, 400, "invalid_id"),
    C(
        "ack-messages-receipt-number",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": 5}]},
        400,
        "invalid_receipt",
    ),
    C(
        "ack-messages-receipt-empty",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": ""}]},
        400,
        "invalid_receipt",
    ),
    C(
        "ack-messages-receipt-list",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": ["@receipt"]}]},
        400,
        "invalid_receipt",
    ),
    C(
        "ack-messages-receipt-too-long",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "r" * 65}]},
        400,
        "invalid_receipt",
    ),
    C(
        "ack-messages-unknown-field",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt", "ttl": 1}]},
        400,
        "unknown_field",
    ),
    C(
        "ack-messages-good-then-bad-receipt-type",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt"}, {"id": "@inflight2", "receipt": 7}]},
        400,
        "invalid_receipt",
    ),
    C(
        "ack-messages-other-queue",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt"}, {"id": "@other_id"}]},
        400,
        "wrong_queue",
    ),
    C(
        "ack-stale-receipt",
        "POST",
        QA,
        {"messages": [{"id": "@redelivered", "receipt": "@stale"}]},
        409,
        "receipt_mismatch",
    ),
    C(
        "ack-good-then-stale-receipt",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt"}, {"id": "@redelivered", "receipt": "@stale"}]},
        409,
        "receipt_mismatch",
    ),
    C(
        "ack-receipt-of-another-message",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt2"}]},
        409,
        "receipt_mismatch",
    ),
    C(
        "ack-receipt-for-undelivered",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt"}, {"id": "@visible", "receipt": "@receipt"}]},
        409,
        "receipt_mismatch",
    ),
    C(
        "ack-receipt-for-missing",
        "POST",
        QA,
        {"messages": [{"id": "@inflight", "receipt": "@receipt"}, {"id": "@missing", "receipt": "abc"}]},
        409,
        "receipt_mismatch",
    ),
    # visibility
    C("visibility-empty", "POST", QV, {}, 400, "invalid_id"),
    C("visibility-no-request-body", "POST", QV, ABSENT, 400, "invalid_id"),
    C("visibility-missing-timeout", "POST", QV, {"id": "@inflight", "receipt": "@receipt"}, 400, "missing_field"),
    C("visibility-null-timeout", "POST", QV, {"id": "@inflight", "visibility_timeout": None}, 400, "missing_field"),
    C("visibility-negative", "POST", QV, {"id": "@inflight", "visibility_timeout": -1}, 400, "out_of_range"),
    C("visibility-1e9", "POST", QV, {"id": "@inflight", "visibility_timeout": 1e9}, 400, "out_of_range"),
    C("visibility-timeout-string", "POST", QV, {"id": "@inflight", "visibility_timeout": "5"}, 400, "invalid_number"),
    C("visibility-bool", "POST", QV, {"id": "@inflight", "visibility_timeout": True}, 400, "invalid_number"),
    C("visibility-bad-id", "POST", QV, {"id": "nope", "visibility_timeout": 1}, 400, "invalid_id"),
    C("visibility-id-number", "POST", QV, {"id": 1, "visibility_timeout": 1}, 400, "invalid_id"),
    C("visibility-id-list", "POST", QV, {"id": ["@inflight"], "visibility_timeout": 1}, 400, "invalid_id"),
    C("visibility-other-queue", "POST", QV, {"id": "@other_id", "visibility_timeout": 0}, 400, "wrong_queue"),
    C("visibility-partition-out-of-range", "POST", QV, {"id": "@p9", "visibility_timeout": 0}, 400, "invalid_id"),
    C(
        "visibility-unknown-field",
        "POST",
        QV,
        {"id": "@inflight", "visibility_timeout": 0, "max": 1},
        400,
        "unknown_field",
    ),
    C(
        "visibility-receipt-number",
        "POST",
        QV,
        {"id": "@inflight", "receipt": 1, "visibility_timeout": 0},
        400,
        "invalid_receipt",
    ),
    C(
        "visibility-receipt-empty",
        "POST",
        QV,
        {"id": "@inflight", "receipt": "", "visibility_timeout": 0},
        400,
        "invalid_receipt",
    ),
    C(
        "visibility-stale-receipt",
        "POST",
        QV,
        {"id": "@redelivered", "receipt": "@stale", "visibility_timeout": 0},
        409,
        "receipt_mismatch",
    ),
    C(
        "visibility-wrong-receipt",
        "POST",
        QV,
        {"id": "@inflight", "receipt": "@receipt2", "visibility_timeout": 0},
        409,
        "receipt_mismatch",
    ),
    C("visibility-not-in-flight", "POST", QV, {"id": "@visible", "visibility_timeout": 0}, 409, "receipt_mismatch"),
    C("visibility-missing-message", "POST", QV, {"id": "@missing", "visibility_timeout": 0}, 409, "receipt_mismatch"),
    # queue create
    C("create-no-name", "POST", API, {"partitions": 2}, 400, "invalid"),
    C("create-empty-name", "POST", API, {"name": ""}, 400, "invalid"),
    C("create-name-slash", "POST", API, {"name": "a/b"}, 400, "invalid"),
    C("create-name-81", "POST", API, {"name": "x" * 81}, 400, "invalid"),
    C("create-name-umlaut", "POST", API, {"name": "über"}, 400, "invalid"),
    C("create-name-leading-dash", "POST", API, {"name": "-lead"}, 400, "invalid"),
    C("create-name-space", "POST", API, {"name": "a b"}, 400, "invalid"),
    C("create-name-dot", "POST", API, {"name": "a.b"}, 400, "invalid"),
    C("create-name-nul", "POST", API, {"name": "a\x00b"}, 400, "invalid"),
    C("create-name-null", "POST", API, {"name": None}, 400, "invalid"),
    # a taken name is a conflict with what exists (409), as two concurrent creates find it
    C("create-duplicate", "POST", API, {"name": "{q}"}, 409, "already_exists"),
    C("create-duplicate-other-settings", "POST", API, {"name": "{q}", "partitions": 1}, 409, "already_exists"),
    C("create-unknown-field", "POST", API, {"name": "fresh-one", "colour": "red"}, 400, "invalid"),
    C(
        "create-read-only-field",
        "POST",
        API,
        {"name": "fresh-one", "created_at": "2020-01-01T00:00:00Z"},
        400,
        "invalid",
    ),
    *[
        C(f"create-{f}-{label}", "POST", API, {"name": "fresh-one", f: v}, 400, "invalid")
        for f, values in {
            "partitions": [0, 257, -1, 1.5, "many", True, None, [2]],
            "block_size": [0, 10_001],
            "lease_period": [0, 3601],
            "visibility_timeout": [-1, 43_201, 0.5],
            "max_message_size": [0, 1024 * 1024 + 1],
            "retention": [59, 14 * 24 * 3600 + 1],
        }.items()
        for label, v in [(json.dumps(v), v) for v in values]
    ],
    # queue patch
    C("patch-shrink-partitions", "PATCH", Q, {"partitions": 1}, 400, "invalid"),
    C("patch-partitions-zero", "PATCH", Q, {"partitions": 0}, 400, "invalid"),
    C("patch-partitions-257", "PATCH", Q, {"partitions": 257}, 400, "invalid"),
    C("patch-rename", "PATCH", Q, {"name": "renamed"}, 400, "invalid"),
    C("patch-rename-and-change", "PATCH", Q, {"name": "renamed", "retention": 600}, 400, "invalid"),
    C("patch-created-at", "PATCH", Q, {"created_at": "2020-01-01T00:00:00Z"}, 400, "invalid"),
    C("patch-unknown-field", "PATCH", Q, {"retention": 600, "colour": "red"}, 400, "invalid"),
    C("patch-visibility-negative", "PATCH", Q, {"visibility_timeout": -1}, 400, "invalid"),
    C("patch-good-and-bad", "PATCH", Q, {"retention": 600, "block_size": 0}, 400, "invalid"),
    C("patch-max-message-size-string", "PATCH", Q, {"max_message_size": "big"}, 400, "invalid"),
    # unknown queue, on every endpoint that names one
    *[
        C(
            f"unknown-queue-{m}{p.removeprefix(API + '/{q}') or '/'}",
            m,
            p.replace("{q}", "no-such-queue"),
            GOOD.get(p, ABSENT),
            404,
            "queue_not_found",
        )
        for m, p in ENDPOINTS
        if "{q}" in p
    ],
    C("unknown-queue-bad-body", "POST", f"{API}/no-such-queue/enqueue", {"body": ""}, 404, "queue_not_found"),
    C("unknown-queue-nul-name", "GET", f"{API}/a%00b/stats", ABSENT, 404, "queue_not_found"),
    C("unknown-queue-nul-name-enqueue", "POST", f"{API}/a%00b/enqueue", {"body": "x"}, 404, "queue_not_found"),
    C("unknown-queue-long-name", "GET", f"{API}/{'x' * 300}", ABSENT, 404, "queue_not_found"),
    C("unknown-queue-unicode-name", "GET", f"{API}/%C3%BCber/stats", ABSENT, 404, "queue_not_found"),
    C("unknown-queue-delete-nul", "DELETE", f"{API}/%00", ABSENT, 404, "queue_not_found"),
    C("unknown-path", "GET", f"{API}/{{q}}/compact", ABSENT, 404, "not_found"),
    # wrong method
    *[
        C(f"method-{m}-{label}", m, p, ABSENT, 405, "method_not_allowed")
        for m, p, label in [
            ("GET", QE, "enqueue"),
            ("GET", QD, "dequeue"),
            ("GET", QA, "ack"),
            ("GET", QV, "visibility"),
            ("PUT", QE, "enqueue"),
            ("DELETE", QD, "dequeue"),
            ("POST", QS, "stats"),
            ("DELETE", QS, "stats"),
            ("PUT", Q, "detail"),
            ("POST", Q, "detail"),
            ("DELETE", API, "list"),
            ("PATCH", API, "list"),
            ("PUT", API, "list"),
        ]
    ],
]


def _fill(value, world: World):
    if isinstance(value, str):
        if value in world.ids:
            return world.ids[value]
        if value.startswith("@") and value.split("/")[0] in world.ids:  # "@visible/" etc.
            head, _, rest = value.partition("/")
            return f"{world.ids[head]}/{rest}"
        return value.replace("{q}", world.q).replace("{other}", world.other)
    if isinstance(value, list):
        return [_fill(v, world) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, world) for k, v in value.items()}
    return value


def client_for(case: Case, api):
    if case.auth == "token":
        return api
    client = make_client(api.transport)  # the same transport as the test's client
    if case.auth == "bad":
        client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    elif case.auth == "bearer":
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api.token}")
    return client


def send(client, method: str, path: str, body, content_type="application/json"):
    if body is ABSENT:
        return client.generic(method, path)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.generic(method, path, raw, content_type=content_type)


def assert_error(r, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.content[:500])
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    data = json.loads(r.content)
    assert isinstance(data, dict) and set(data) >= {"error", "detail"}, data
    assert isinstance(data["error"], str) and data["error"]
    assert data["detail"], data
    if code is not None:
        assert data["error"] == code, data
    return data


@pytest.mark.parametrize("still_api", TRANSPORTS, indirect=True)
class TestRefused:
    """The calls that must be refused and change nothing, against one world for the class
    (:func:`still`): each test still compares the whole snapshot before and after its call."""

    @pytest.fixture
    def still_api(self, request, still):
        """A client of the class's world, of the test's transport, with the world's token."""
        client = make_client(request.param)
        client.credentials(HTTP_AUTHORIZATION=f"Token {still.token}")
        client.token = still.token
        return client

    @pytest.fixture
    def still_world(self, still) -> World:
        return still.world

    @pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
    def test_bad_input_is_refused_and_changes_nothing(self, case: Case, still_api, still_world):
        # given
        before = snapshot(still_world.q, still_world.other)
        client = client_for(case, still_api)
        path = case.path.replace("{q}", still_world.q).replace("{other}", still_world.other)
        body = case.body if isinstance(case.body, bytes) or case.body is ABSENT else _fill(case.body, still_world)

        # when
        r = send(client, case.method, path, body, case.content_type)

        # then
        assert_error(r, case.status, case.code)
        assert snapshot(still_world.q, still_world.other) == before

    def test_request_over_the_upload_limit_is_413(self, still_api, still_world, settings):
        # given
        settings.API_MAX_REQUEST_BYTES = 1000
        before = snapshot(still_world.q, still_world.other)

        # when
        r = send(still_api, "POST", f"{API}/{still_world.q}/enqueue", {"messages": [{"body": "x" * 20}] * 60})

        # then
        assert_error(r, 413, "payload_too_large")
        assert snapshot(still_world.q, still_world.other) == before

    def test_a_request_over_the_queues_own_limit_is_413_before_parsing(self, still_api, still_world):
        """Issue 14: the limit was 64 MiB for every queue and the body was parsed first (about 24
        times its size in memory). still_world.q takes bodies of 64 bytes: a batch of 1,000 of them with
        their envelopes is about 1.1 MB, so a 2 MB request is refused by its Content-Length alone:
        the body here is not even JSON, and is not read."""
        # given
        before = snapshot(still_world.q, still_world.other)

        # when
        r = send_raw(
            still_api, f"{API}/{still_world.q}/enqueue", b"not json at all", CONTENT_LENGTH=str(2 * 1024 * 1024)
        )

        # then
        data = assert_error(r, 413, "payload_too_large")
        assert "limit" in data["detail"]
        assert snapshot(still_world.q, still_world.other) == before

    def test_a_valid_batch_over_the_queues_own_limit_is_413(self, still_api, still_world):
        # given a request that is valid JSON, under the node's limit, over the queue's
        before = snapshot(still_world.q, still_world.other)
        body = {"messages": [{"body": "x" * 60, "attributes": {"a": "y" * 1000}}] * 1200}

        # when
        r = send(still_api, "POST", f"{API}/{still_world.q}/enqueue", body)

        # then
        assert_error(r, 413, "payload_too_large")
        assert snapshot(still_world.q, still_world.other) == before

    @pytest.mark.parametrize("action, size", [("dequeue", 100_000), ("visibility", 100_000), ("ack", 600_000)])
    def test_a_call_naming_no_messages_has_a_small_limit(self, still_api, still_world, action, size):
        # given
        before = snapshot(still_world.q, still_world.other)

        # when
        r = send_raw(still_api, f"{API}/{still_world.q}/{action}", b"{}", CONTENT_LENGTH=str(size))

        # then
        assert_error(r, 413, "payload_too_large")
        assert snapshot(still_world.q, still_world.other) == before

    def test_the_limit_is_checked_after_the_callers_right(self, still_api, still_world):
        """A queue the caller cannot see answers 404 whatever the length: its limits are not told."""
        # when
        r = send_raw(still_api, f"{API}/no-such-queue-here/enqueue", b"{}", CONTENT_LENGTH=str(2 * 1024 * 1024))

        # then
        assert_error(r, 404, "queue_not_found")

    @pytest.mark.parametrize("action", ["enqueue", "dequeue", "ack", "visibility"])
    @pytest.mark.parametrize(
        "query, extra, status, code",
        [
            ("", {"HTTP_ACCEPT": "text/csv"}, 406, "not_acceptable"),
            ("", {"HTTP_ACCEPT": "text/plain, application/xml"}, 406, "not_acceptable"),
            ("?format=xml", {}, 404, "not_found"),
        ],
        ids=["accept-csv", "accept-no-json", "format-xml"],
    )
    def test_content_negotiation_refuses_and_changes_nothing(
        self, still_api, still_world, action, query, extra, status, code
    ):
        """DRF negotiates the answer's format before the view runs; the fast path must not skip that."""
        # given
        before = snapshot(still_world.q, still_world.other)
        body = _fill(GOOD[POSTS[action]], still_world)

        # when
        r = still_api.generic(
            "POST",
            f"{API}/{still_world.q}/{action}{query}",
            json.dumps(body).encode(),
            content_type="application/json",
            **extra,
        )

        # then
        assert_error(r, status, code)
        assert snapshot(still_world.q, still_world.other) == before

    @pytest.mark.parametrize("length", ["abc", "-3", ""])
    def test_odd_content_length_is_answered_as_drf_answers(self, still_api, still_world, length):
        """The WSGI server should refuse these; if one gets through, both transports agree."""
        # given
        raw = json.dumps({"body": "x"}).encode()
        reference = make_client("drf")
        reference.credentials(HTTP_AUTHORIZATION=f"Token {still_api.token}")
        before = snapshot(still_world.q, still_world.other)

        # when
        answers = [
            client.generic(
                "POST", f"{API}/{still_world.q}/enqueue", raw, content_type="application/json", CONTENT_LENGTH=length
            )
            for client in (reference, still_api)
        ]

        # then
        drf, got = (assert_error(r, 400) for r in answers)
        assert got["error"] == drf["error"]
        assert snapshot(still_world.q, still_world.other) == before


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_the_good_requests_of_the_matrix_work(api, world):
    """The auth and unknown-queue cases send these; each must be valid, or those cases prove little."""
    # given
    for path, body in GOOD.items():
        method = "PATCH" if path == Q else "POST"

        # when
        r = send(api, method, path.replace("{q}", world.q), _fill(body, world))

        # then
        assert r.status_code in (200, 201), (path, r.content)


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", QE, {"body": "x"}),
        ("POST", QD, {"max": 1}),
        ("POST", QA, {"ids": ["@visible"]}),
        ("POST", QA, {"messages": [{"id": "@redelivered", "receipt": "@current"}]}),
        ("POST", QV, {"id": "@inflight", "receipt": "@receipt", "visibility_timeout": 900}),
        ("PATCH", Q, {"retention": 600}),
        ("PATCH", Q, {"partitions": 3}),
        ("DELETE", f"{API}/{{other}}", ABSENT),
        ("POST", API, {"name": "brand-new"}),
    ],
    ids=["enqueue", "dequeue", "ack-id", "ack-receipt", "visibility", "patch", "patch-grow", "delete", "create"],
)
def test_the_snapshot_sees_each_kind_of_change(api, world, method, path, body):
    """Control for the matrix: a valid call of each kind does change the snapshot."""
    # given
    before = snapshot(world.q, world.other) if method != "DELETE" else snapshot(world.q)
    path = path.replace("{q}", world.q).replace("{other}", world.other)

    # when
    r = send(api, method, path, _fill(body, world) if body is not ABSENT else ABSENT)

    # then
    assert r.status_code < 300, r.content
    assert (snapshot(world.q, world.other) if method != "DELETE" else snapshot(world.q)) != before


def send_raw(client, path: str, raw: bytes, **extra):
    return client.generic("POST", path, raw, content_type="application/json", **extra)


def test_body_at_exactly_max_message_size_is_accepted(api, world):
    """The boundary of the oversized cases: 64 bytes of UTF-8 is fine, 65 is not."""
    # when
    r = send(api, "POST", f"{API}/{world.q}/enqueue", {"messages": [{"body": "é" * 32}, {"body": "😀" * 16}]})

    # then
    assert r.status_code == 201, r.content


# --- random JSON ------------------------------------------------------------------------------
KEYS = ["body", "messages", "ids", "id", "receipt", "max", "wait", "visibility_timeout"]
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)


def json_values(refs: list[str]):
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | text
        | st.sampled_from(refs)
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | text, children, max_size=4)
        ),
        max_leaves=12,
    )


REFS = [
    "@inflight",
    "@receipt",
    "@inflight2",
    "@receipt2",
    "@redelivered",
    "@stale",
    "@current",
    "@visible",
    "@other_id",
    "@p9",
    "@missing",
    "{q}",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_json_never_5xx_and_4xx_changes_nothing(api, world, data):
    # given: something visible, so a valid long poll returns at once
    if service.queue_stats(world.q, caller=SYSTEM)["depth"] == 0:
        service.enqueue(world.q, [MessageDraft(f"top-up {i}") for i in range(3)], caller=SYSTEM)
    action = data.draw(st.sampled_from(["enqueue", "dequeue", "ack", "visibility"]), label="action")
    payload = _fill(data.draw(json_values(REFS), label="payload"), world)
    before = snapshot(world.q, world.other)

    # when
    t0 = time.monotonic()
    r = send(api, "POST", f"{API}/{world.q}/{action}", payload)

    # then
    assert r.status_code < 500, r.content
    assert time.monotonic() - t0 < 5
    if r.status_code >= 400:
        assert_error(r, r.status_code)
        assert snapshot(world.q, world.other) == before


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=st.sampled_from(["enqueue", "dequeue", "ack", "visibility", ""]),
    raw=st.binary(max_size=40) | text.map(str.encode),
)
def test_random_bytes_never_5xx(api, world, action, raw):
    # given
    before = snapshot(world.q, world.other)
    path = f"{API}/{world.q}/{action}" if action else API

    # when
    r = send(api, "POST", path, raw)

    # then
    assert r.status_code < 500, r.content
    if r.status_code >= 400:
        assert_error(r, r.status_code)
        assert snapshot(world.q, world.other) == before
