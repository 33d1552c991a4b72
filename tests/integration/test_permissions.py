"""Who may do what to which queue: every API operation times every role, through DRF and the fast path.

The table below is the contract (``queues.access``): ``read`` < ``produce``, ``consume`` <
``manage``; a caller that may not read a queue is told it does not exist (404), one that may
read it but lacks the action gets 403 naming what is missing; any authenticated user may create
a queue or topic (and then manages it); ``/expire`` is for staff (and nodes) and needs
``manage`` too. Each cell runs on a fresh queue, topic and subscription made by another user,
and checks the status, the error body, that a refusal changed nothing (no audit entry) and that
a management action that succeeded is in the audit trail under the caller's name.

The forwarded half (two node processes: a call one node passes to the owner acts there for the
original user, never with more rights) is at the end.
"""

from __future__ import annotations

import time
import uuid

import pytest

from queues.access import Caller
from queues.models import AuditEntry, Grant, Queue
from tests.integration.wsgi_client import TRANSPORTS, make_client

ROLES = ("anonymous", "no_grant", "produce", "consume", "manage", "pattern", "group", "staff", "superuser")

#: The roles' grants on the queue and the topic under test (both named ``app-...``):
#: ``pattern`` is ``produce`` on ``app-*``, ``group`` is ``consume`` to a group the user is in;
#: ``staff`` has no grant (being staff gives no right on queues).
GRANTS = {"produce": "produce", "consume": "consume", "manage": "manage"}

# fmt: off
#: operation -> expected status per role, in the order of ROLES.
TABLE: dict[str, tuple[int, ...]] = {
    #                      anon  none  prod  cons  mng   patt  grp   staff super
    "queue list":         (401,  200,  200,  200,  200,  200,  200,  200,  200),
    "queue create":       (401,  201,  201,  201,  201,  201,  201,  201,  201),
    "queue read":         (401,  404,  200,  200,  200,  200,  200,  404,  200),
    "queue change":       (401,  404,  403,  403,  200,  403,  403,  404,  200),
    "queue delete":       (401,  404,  403,  403,  204,  403,  403,  404,  204),
    "queue enqueue":      (401,  404,  201,  403,  201,  201,  403,  404,  201),
    "queue dequeue":      (401,  404,  403,  200,  200,  403,  200,  404,  200),
    "queue ack":          (401,  404,  403,  200,  200,  403,  200,  404,  200),
    "queue visibility":   (401,  404,  403,  200,  200,  403,  200,  404,  200),
    "queue stats":        (401,  404,  200,  200,  200,  200,  200,  404,  200),
    "queue partitions":   (401,  404,  200,  200,  200,  200,  200,  404,  200),
    "queue purge":        (401,  404,  403,  403,  200,  403,  403,  404,  200),
    "queue redrive":      (401,  404,  403,  403,  200,  403,  403,  404,  200),
    "queue release":      (401,  404,  403,  403,  200,  403,  403,  404,  200),
    "queue expire":       (401,  403,  403,  403,  403,  403,  403,  404,  200),
    "topic list":         (401,  200,  200,  200,  200,  200,  200,  200,  200),
    "topic create":       (401,  201,  201,  201,  201,  201,  201,  201,  201),
    "topic read":         (401,  404,  200,  200,  200,  200,  200,  404,  200),
    "topic change":       (401,  404,  403,  403,  200,  403,  403,  404,  200),
    "topic delete":       (401,  404,  403,  403,  204,  403,  403,  404,  204),
    "topic publish":      (401,  404,  201,  403,  201,  201,  403,  404,  201),
    "subscription list":  (401,  404,  200,  200,  200,  200,  200,  404,  200),
    "subscription create": (401, 404,  403,  403,  201,  403,  403,  404,  201),
    "subscription read":  (401,  404,  200,  200,  200,  200,  200,  404,  200),
    "subscription delete": (401, 404,  403,  403,  204,  403,  403,  404,  204),
    "subscription dequeue": (401, 404, 403,  200,  200,  403,  200,  404,  200),
    "subscription ack":   (401,  404,  403,  200,  200,  403,  200,  404,  200),
    "subscription visibility": (401, 404, 403, 200, 200,  403,  200,  404,  200),
    "subscription stats": (401,  404,  200,  200,  200,  200,  200,  404,  200),
}
# fmt: on

#: operation -> (method, path, body, the action a refusal names, audit action on success).
OPS: dict[str, tuple[str, str, object, str | None, str | None]] = {
    "queue list": ("GET", "/api/v1/queues", None, None, None),
    "queue create": ("POST", "/api/v1/queues", {"name": "{new}", "partitions": 1}, None, "create"),
    "queue read": ("GET", "/api/v1/queues/{q}", None, "read", None),
    "queue change": ("PATCH", "/api/v1/queues/{q}", {"visibility_timeout": 40}, "manage", "change"),
    "queue delete": ("DELETE", "/api/v1/queues/{q}", None, "manage", "delete"),
    "queue enqueue": ("POST", "/api/v1/queues/{q}/enqueue", {"body": "hello"}, "produce", None),
    "queue dequeue": ("POST", "/api/v1/queues/{q}/dequeue", {"max": 1}, "consume", None),
    "queue ack": (
        "POST",
        "/api/v1/queues/{q}/ack",
        {"messages": [{"id": "{qid}", "receipt": "{qr}"}]},
        "consume",
        None,
    ),
    "queue visibility": (
        "POST",
        "/api/v1/queues/{q}/visibility",
        {"id": "{qid}", "receipt": "{qr}", "visibility_timeout": 5},
        "consume",
        None,
    ),
    "queue stats": ("GET", "/api/v1/queues/{q}/stats", None, "read", None),
    "queue partitions": ("GET", "/api/v1/queues/{q}/partitions", None, "read", None),
    "queue purge": ("POST", "/api/v1/queues/{q}/purge", {}, "manage", "purge"),
    "queue redrive": ("POST", "/api/v1/queues/{q}/redrive", {}, "manage", "redrive"),
    "queue release": ("POST", "/api/v1/queues/{q}/partitions/0/release", None, "manage", "release"),
    "queue expire": ("POST", "/api/v1/queues/{q}/expire", {}, None, None),
    "topic list": ("GET", "/api/v1/topics", None, None, None),
    "topic create": ("POST", "/api/v1/topics", {"name": "{new}", "partitions": 1}, None, "create"),
    "topic read": ("GET", "/api/v1/topics/{t}", None, "read", None),
    "topic change": ("PATCH", "/api/v1/topics/{t}", {"visibility_timeout": 40}, "manage", "change"),
    "topic delete": ("DELETE", "/api/v1/topics/{t}", None, "manage", "delete"),
    "topic publish": ("POST", "/api/v1/topics/{t}/publish", {"body": "news"}, "produce", None),
    "subscription list": ("GET", "/api/v1/topics/{t}/subscriptions", None, "read", None),
    "subscription create": ("POST", "/api/v1/topics/{t}/subscriptions", {"name": "s2"}, "manage", "subscribe"),
    "subscription read": ("GET", "/api/v1/topics/{t}/subscriptions/s", None, "read", None),
    "subscription delete": ("DELETE", "/api/v1/topics/{t}/subscriptions/s", None, "manage", "unsubscribe"),
    "subscription dequeue": ("POST", "/api/v1/topics/{t}/subscriptions/s/dequeue", {"max": 1}, "consume", None),
    "subscription ack": (
        "POST",
        "/api/v1/topics/{t}/subscriptions/s/ack",
        {"messages": [{"id": "{tid}", "receipt": "{tr}"}]},
        "consume",
        None,
    ),
    "subscription visibility": (
        "POST",
        "/api/v1/topics/{t}/subscriptions/s/visibility",
        {"id": "{tid}", "receipt": "{tr}", "visibility_timeout": 5},
        "consume",
        None,
    ),
    "subscription stats": ("GET", "/api/v1/topics/{t}/subscriptions/s/stats", None, "read", None),
}

#: the message calls the fast path serves (with a token; without one DRF answers 401).
FAST = {
    "queue enqueue",
    "queue dequeue",
    "queue ack",
    "queue visibility",
    "topic publish",
    "subscription dequeue",
    "subscription ack",
    "subscription visibility",
}


def test_the_table_covers_every_operation_and_role():
    assert set(TABLE) == set(OPS)
    assert all(len(row) == len(ROLES) for row in TABLE.values())


def _fill(value, names: dict[str, str]):
    if isinstance(value, str):
        for key, name in names.items():
            value = value.replace("{" + key + "}", name)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    return value


def _world(runtime):
    """A queue and a topic (``app-...``) made by their owner, each with a message in flight
    (its ID and receipt) and one waiting; the topic has a subscription ``s``."""
    from django.contrib.auth.models import User

    from queues import service
    from queues.service import MessageDraft

    owner = Caller.of(User.objects.create(username=f"owner-{uuid.uuid4().hex[:6]}"))
    q = f"app-{uuid.uuid4().hex[:8]}"
    t = f"app-t-{uuid.uuid4().hex[:8]}"
    service.create_queue(caller=owner, name=q, partitions=1)
    topic = service.create_queue(caller=owner, name=t, partitions=1, kind=Queue.Kind.TOPIC)
    service.create_subscription(topic, caller=owner, name="s", start="oldest")
    service.enqueue(q, [MessageDraft("one"), MessageDraft("two")], caller=owner)
    service.publish(t, [MessageDraft("one"), MessageDraft("two")], caller=owner)
    (dq,) = service.dequeue(q, caller=owner, max_messages=1, visibility_timeout=60)
    (dt,) = service.dequeue(f"{t}/s", caller=owner, max_messages=1, visibility_timeout=60)
    return {
        "q": q,
        "t": t,
        "qid": dq.id,
        "qr": dq.receipt,
        "tid": dt.id,
        "tr": dt.receipt,
        "new": f"app-new-{uuid.uuid4().hex[:8]}",
    }


def _refused_target(op: str, names: dict[str, str]) -> str:
    """What a 403 names: the queue, the topic, or ``topic/subscription`` for a subscription's own calls."""
    if op.startswith("queue"):
        return names["q"]
    if op.startswith("topic") or op in ("subscription list", "subscription create"):
        return names["t"]
    return f"{names['t']}/s"


def _user(role: str, names: dict[str, str]):
    """The user of ``role`` with its grants on the world's queue and topic (None: anonymous)."""
    from django.contrib.auth.models import Group, User

    if role == "anonymous":
        return None
    user = User.objects.create(
        username=f"{role}-{uuid.uuid4().hex[:6]}", is_staff=role == "staff", is_superuser=role == "superuser"
    )
    targets = list(Queue.objects.filter(name__in=[names["q"], names["t"]]))
    if role in GRANTS:
        for target in targets:
            Grant.objects.create(user=user, queue=target, action=GRANTS[role])
    elif role == "pattern":
        Grant.objects.create(user=user, pattern="app-*", action="produce")
    elif role == "group":
        group = Group.objects.create(name=f"g-{uuid.uuid4().hex[:6]}")
        user.groups.add(group)
        for target in targets:
            Grant.objects.create(group=group, queue=target, action="consume")
    return user


def _client(transport: str, user):
    from rest_framework.authtoken.models import Token

    client = make_client(transport)
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def _send(client, method: str, path: str, body):
    if method == "GET":
        return client.get(path)
    call = getattr(client, method.lower())
    return call(path) if body is None else call(path, body, format="json")


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("op", list(TABLE))
def test_permission_matrix(runtime, purge_kv, op, role, transport):
    # given a queue and a topic someone else made, and a caller of this role
    names = _world(runtime)
    user = _user(role, names)
    client = _client(transport, user)
    method, path, body, action, audit_action = OPS[op]
    before = set(AuditEntry.objects.values_list("pk", flat=True))
    # when it makes the call
    r = _send(client, method, _fill(path, names), _fill(body, names))
    # then it is answered as the table says
    expected = TABLE[op][ROLES.index(role)]
    assert r.status_code == expected, (op, role, transport, r.status_code, r.content)
    if transport == "fastpath" and op in FAST and user is not None:
        assert r.served_by == "fastpath"
    payload = r.json() if r.content else None
    if expected == 401:
        assert payload["error"] in ("not_authenticated", "authentication_failed")
    elif expected == 404:
        assert payload["error"] == "queue_not_found", payload  # as if it did not exist
    elif expected == 403:
        assert payload["error"] == "permission_denied", payload
        if action is not None:  # the service's refusal (expire's is the API's: staff only)
            target = _refused_target(op, names)
            assert payload == {
                "error": "permission_denied",
                "detail": f"{user.username} may not {action} {target!r}: it needs the {action!r} permission on it",
                "missing": action,
            }
    # and a refusal changed nothing; a management action done is in the audit trail, by name
    done = AuditEntry.objects.exclude(pk__in=before)
    if expected >= 400:
        assert not done.exists(), list(done.values("action", "target"))
        if op in ("queue delete", "queue purge"):
            assert Queue.objects.filter(name=names["q"]).exists()
    elif audit_action is not None:
        entry = done.get()
        assert (entry.actor, entry.action) == (user.username, audit_action)
    # and the lists show exactly what the caller may read
    if op in ("queue list", "topic list") and expected == 200:
        listed = {item["name"] for item in payload}
        mine = names["q"] if op == "queue list" else names["t"]
        may_read = TABLE["queue read"][ROLES.index(role)] == 200
        assert (mine in listed) == may_read, (role, listed)
    if op in ("queue create", "topic create") and expected == 201:
        assert Queue.objects.get(name=names["new"]).created_by_id == user.pk  # the creator manages it


@pytest.mark.django_db
def test_a_creator_manages_what_it_created_and_nobody_else_sees_it(runtime, purge_kv, user):
    from django.contrib.auth.models import User

    from tests.integration.wsgi_client import token_client

    mine = token_client("drf", user)
    other = token_client("fastpath", User.objects.create(username=f"other-{uuid.uuid4().hex[:6]}"))
    name = f"own-{uuid.uuid4().hex[:8]}"
    assert mine.post("/api/v1/queues", {"name": name, "partitions": 1}, format="json").status_code == 201
    assert mine.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json").status_code == 201
    assert mine.post(f"/api/v1/queues/{name}/purge", {}, format="json").json() == {"purged": 1}
    # another user: not in its list, and every call is answered as for a queue that does not exist
    assert name not in {q["name"] for q in other.get("/api/v1/queues").json()}
    r = other.post(f"/api/v1/queues/{name}/dequeue", {"max": 1}, format="json")
    assert r.status_code == 404 and r.json() == {"error": "queue_not_found", "detail": f"no queue named {name!r}"}
    # a bad body does not tell it either: the right is checked first
    assert other.post(f"/api/v1/queues/{name}/enqueue", {"nonsense": 1}, format="json").status_code == 404
    # with read only, it sees the queue and is told what it lacks
    Grant.objects.create(
        user=User.objects.get(username__startswith="other-"), queue=Queue.objects.get(name=name), action="read"
    )
    r = other.post(f"/api/v1/queues/{name}/dequeue", {"max": 1}, format="json")
    assert r.status_code == 403
    assert r.json()["missing"] == "consume"
    assert [e.action for e in AuditEntry.objects.filter(target=name).order_by("at")] == ["create", "purge"]


@pytest.mark.django_db
def test_the_attempt_log_and_the_archive_list_only_what_the_caller_may_read(runtime, purge_kv):
    from django.contrib.auth.models import User

    from archive.models import ArchivedMessage
    from tests.integration.wsgi_client import token_client
    from workers.models import AttemptLog

    owner = User.objects.create(username=f"o-{uuid.uuid4().hex[:6]}")
    reader = User.objects.create(username=f"r-{uuid.uuid4().hex[:6]}")
    a, b = f"app-{uuid.uuid4().hex[:6]}", f"hidden-{uuid.uuid4().hex[:6]}"
    c = token_client("drf", owner)
    for name in (a, b):
        assert c.post("/api/v1/queues", {"name": name, "partitions": 1}, format="json").status_code == 201
        row = {"queue": name, "incarnation": Queue.objects.get(name=name).pk, "partition": 0}
        AttemptLog.objects.create(message_id=f"{name}/0/0/0", attempt=1, outcome="acked", **row)
        ArchivedMessage.objects.create(message_id=f"{name}/0/0/0", body="b", enqueued_at="2026-01-01T00:00:00Z", **row)
    Grant.objects.create(user=reader, pattern="app-*", action="read")
    r = token_client("drf", reader)
    assert {x["queue"] for x in r.get("/api/v1/logs").json()["records"]} == {a}
    assert r.get("/api/v1/logs", {"queue": b}).json()["records"] == []
    assert {x["queue"] for x in r.get("/api/v1/archive").json()["messages"]} == {a}
    # replay needs manage on the target: read on it is not enough
    rr = r.post("/api/v1/archive/replay", {"queue": a}, format="json")
    assert rr.status_code == 403 and rr.json()["missing"] == "manage"
    # the owner sees both
    assert {x["queue"] for x in c.get("/api/v1/logs").json()["records"]} >= {a, b}


@pytest.mark.django_db
def test_only_a_consumer_of_a_queue_writes_its_attempt_log(runtime, purge_kv):
    from django.contrib.auth.models import User

    from tests.integration.wsgi_client import token_client
    from workers.models import AttemptLog

    owner = User.objects.create(username=f"o-{uuid.uuid4().hex[:6]}")
    stranger = User.objects.create(username=f"s-{uuid.uuid4().hex[:6]}")
    name = f"logged-{uuid.uuid4().hex[:6]}"
    c = token_client("drf", owner)
    assert c.post("/api/v1/queues", {"name": name, "partitions": 1}, format="json").status_code == 201
    mid = c.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json").json()["id"]
    record = {"message_id": mid, "attempt": 1, "outcome": "failed", "error": "forged"}
    s = token_client("drf", stranger)
    # a stranger cannot write (nor learn of) the queue's log
    r = s.post("/api/v1/logs", {"records": [record]}, format="json")
    assert r.status_code == 404 and r.json()["error"] == "queue_not_found"
    # reading is not enough: writing the log is part of consuming
    Grant.objects.create(user=stranger, queue=Queue.objects.get(name=name), action="read")
    r = s.post("/api/v1/logs", {"records": [record]}, format="json")
    assert r.status_code == 403 and r.json()["missing"] == "consume"
    assert not AttemptLog.objects.filter(queue=name).exists()
    # with consume it may, and so may the owner
    Grant.objects.create(user=stranger, queue=Queue.objects.get(name=name), action="consume")
    assert s.post("/api/v1/logs", {"records": [record]}, format="json").status_code == 201
    assert c.post("/api/v1/logs", {"records": [record]}, format="json").status_code == 201
    assert AttemptLog.objects.filter(queue=name).count() == 2


# --- forwarded calls, on two node processes --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_forwarded_call_acts_for_its_user_at_the_owner(node_factory):
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from tests.integration.nodes import Client, peer_request
    from tests.launcher import wait_until

    def token_of(user) -> str:
        return Token.objects.create(user=user).key

    owner = User.objects.create(username=f"owner-{uuid.uuid4().hex[:6]}")
    producer = User.objects.create(username=f"producer-{uuid.uuid4().hex[:6]}")
    consumer = User.objects.create(username=f"consumer-{uuid.uuid4().hex[:6]}")
    a = node_factory()
    b = node_factory()
    name = f"fwd-{uuid.uuid4().hex[:6]}"
    oc = Client(a.url, token_of(owner))
    assert oc.post("queues", {"name": name, "partitions": 4}).status_code == 201
    q = Queue.objects.get(name=name)
    Grant.objects.create(user=producer, queue=q, action="produce")
    Grant.objects.create(user=consumer, queue=q, action="consume")

    # the partitions spread over both nodes
    def owners():
        parts = oc.get(f"queues/{name}/partitions").json()["partitions"]
        return {p["index"]: p["address"] for p in parts}

    wait_until(lambda: set(owners().values()) == {a.url[7:], b.url[7:]}, 30, "the partitions spread over both nodes")
    at_b = next(i for i, addr in owners().items() if addr == b.url[7:])
    from queues.engine.ids import group_partition

    group = next(f"g{i}" for i in range(1000) if group_partition(f"g{i}", 4) == at_b)

    # a forwarded enqueue works: the producer calls A, the group's partition is B's
    pc = Client(a.url, token_of(producer))
    r = pc.post(f"queues/{name}/enqueue", {"body": "to b", "group": group})
    assert r.status_code == 201, r.text
    assert r.json()["id"].startswith(f"{name}/{at_b}/")

    # the producer may not dequeue: refused where it asked ...
    r = pc.post(f"queues/{name}/dequeue", {"max": 10})
    assert r.status_code == 403 and r.json()["missing"] == "consume"
    # ... and at the owner, when a node forwards the call for it: rights are checked again there
    url = f"{b.url}/api/v1/queues/{name}/dequeue"
    r = peer_request("POST", url, {"max": 10}, on_behalf=str(producer.pk))
    assert r.status_code == 403 and r.json()["missing"] == "consume", r.text
    # a node's call that names no user may make only the node-only calls
    r = peer_request("POST", url, {"max": 10})
    assert r.status_code == 403 and r.json()["error"] == "permission_denied", r.text
    # a user who may not read the queue is told it does not exist, at the owner too
    stranger = User.objects.create(username=f"stranger-{uuid.uuid4().hex[:6]}")
    r = peer_request("POST", url, {"max": 10}, on_behalf=str(stranger.pk))
    assert r.status_code == 404, r.text
    # the message is still there: the consumer, asking A, gets B's message through a forwarded dequeue
    cc = Client(a.url, token_of(consumer))
    deadline = time.monotonic() + 20
    got: list = []
    while not got and time.monotonic() < deadline:
        r = cc.post(f"queues/{name}/dequeue", {"max": 10})
        assert r.status_code == 200, r.text
        got = r.json()["messages"]
    assert [m["body"] for m in got] == ["to b"]
    # and acks it through A (forwarded to B, as the consumer)
    r = cc.post(f"queues/{name}/ack", {"messages": [{"id": got[0]["id"], "receipt": got[0]["receipt"]}]})
    assert r.json() == {"acked": 1, "not_found": 0}


# --- the admin's actions go through the same checks ----------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("grant", [None, "consume", "manage"])
def test_the_admins_purge_action_needs_manage_on_the_queue(runtime, purge_kv, client, grant):
    from django.contrib.auth.models import Permission, User

    from queues import service
    from queues.service import MessageDraft

    owner = Caller.of(User.objects.create(username=f"owner-{uuid.uuid4().hex[:6]}"))
    name = f"app-{uuid.uuid4().hex[:8]}"
    q = service.create_queue(caller=owner, name=name, partitions=1)
    service.enqueue(name, [MessageDraft("a"), MessageDraft("b")], caller=owner)
    # a staff operator with the admin's permission to purge, and the grant of this case
    operator = User.objects.create(username=f"op-{uuid.uuid4().hex[:6]}", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_queue", "purge_queue"]))
    if grant is not None:
        Grant.objects.create(user=operator, queue=q, action=grant)
    client.force_login(operator)
    r = client.post("/admin/queues/queue/", {"action": "purge", "_selected_action": [q.pk]}, follow=True)
    assert r.status_code == 200
    shown = " ".join(str(m) for m in r.context["messages"])
    depth = service.queue_stats(name, caller=owner)["depth"]
    if grant == "manage":
        assert f"{name}: purged 2 messages" in shown and depth == 0
        assert AuditEntry.objects.filter(target=name, action="purge", actor=operator.username).exists()
    else:
        # refused: told why (a queue it may not see is not in its list: the action never
        # reaches it), nothing removed, nothing recorded
        if grant is None:
            assert name not in shown and name not in r.content.decode(), shown
        else:
            assert f"{name}: not purged: {operator.username} may not manage {name!r}" in shown, shown
        assert depth == 2
        assert not AuditEntry.objects.filter(target=name, action="purge").exists()
