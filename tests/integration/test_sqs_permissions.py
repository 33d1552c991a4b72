"""Who may do what to which queue over the SQS API: every SQS action times every role, each role
with its own access key, through boto3 against a real node (PostgreSQL + Redis), like the REST
API's ``test_permissions.py``.

The contract is the REST API's (``queues.access``): ``read`` < ``produce``, ``consume`` <
``manage``. A queue the caller may not read does not exist for it (QueueDoesNotExist, the query
code ``AWS.SimpleQueueService.NonExistentQueue``); one it may read but lacks the action on
answers AccessDenied, naming what is missing; any user may create a queue (and then manages
it); a dead-letter queue named at creation needs ``produce`` on it. Being staff, or holding any
Django model permission, gives no right on a queue.

Roles: ``anonymous`` (an unsigned call), ``no_grant``, ``read`` / ``produce`` / ``consume`` /
``manage`` (a grant on the queue and its dead-letter queue), ``staff`` (no grant), the
superuser; and, for each single permission of a registered model (those the console's
matrix lists), a staff user with it and no grant (answered as ``no_grant``) and one with it
and ``read`` (answered as ``read`` for what ``read`` is refused).

Each cell of the first roles runs on a fresh world made by another user: a queue ``mx-...``
(tagged, two messages, one of them in flight under the owner's receipt handle, which the
caller's message calls use) and its dead-letter queue. The model permission roles share two
such worlds (nothing they may do changes one). A refusal changes nothing (the queues' rows,
their SQS settings, their messages as the owner counts them) and writes no audit entry; a
management action that succeeded is in the audit trail under the caller's name; the lists
show exactly what the caller may read.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import boto3
import botocore
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from queues.models import AuditEntry, Grant, Queue
from sqs import actions as sqs_actions
from sqs.models import AccessKey, QueueSettings

#: The module's rows are committed by its fixtures (the node reads them) and removed at its end;
#: each test only reads the database (the node writes), in a transaction rolled back after it.
#: The node's housekeeping passes once a second: the module makes about 400 queues, and a pass
#: over their partitions every 0.3 s would keep their rows' locks taken nearly all the time, so
#: that on a loaded machine calls would wait on them past the node's database deadline.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.node(env={"NODE_HEARTBEAT": "1.0"})]

REGION = "eu-west-1"
ACCOUNT = "000000000000"

ROLES = ("anonymous", "no_grant", "read", "produce", "consume", "manage", "staff", "superuser")
GRANTS = {"read": "read", "produce": "produce", "consume": "consume", "manage": "manage"}

#: the outcomes: success, or the error code boto3 reads (and the HTTP status it came with).
OK = "ok"
ANON = "MissingAuthenticationToken"
GONE = "AWS.SimpleQueueService.NonExistentQueue"
DENIED = "AccessDenied"
TAKEN = "QueueAlreadyExists"
NO_DLQ = "InvalidParameterValue"  # (SQS: a deadLetterTargetArn that names no queue)
BAD = "InvalidParameterValue"
NO_TASK = "ResourceNotFoundException"
STATUS = {ANON: 403, GONE: 400, DENIED: 403, TAKEN: 400, NO_DLQ: 400, BAD: 400, NO_TASK: 404}


def _model_permissions() -> list[str]:
    """Every permission of a registered model (``app.codename``), its custom ones included."""
    from django.contrib import admin

    perms = set()
    for model in admin.site._registry:
        opts = model._meta
        perms |= {f"{opts.app_label}.{a}_{opts.model_name}" for a in opts.default_permissions}
        perms |= {f"{opts.app_label}.{c}" for c, _ in opts.permissions}
    return sorted(perms)


PERMISSIONS = _model_permissions()

# fmt: off
#: action (a variant in parentheses) -> expected outcome per role, in the order of ROLES.
TABLE: dict[str, tuple[str, ...]] = {
    #                                   anon   none    read    prod    cons    mng     staff   super
    "CreateQueue":                     (ANON,  OK,     OK,     OK,     OK,     OK,     OK,     OK),
    "CreateQueue (its name)":          (ANON,  TAKEN,  OK,     OK,     OK,     OK,     TAKEN,  OK),
    "CreateQueue (dead letters to it)": (ANON, NO_DLQ, DENIED, OK,     DENIED, OK,     NO_DLQ, OK),
    "GetQueueUrl":                     (ANON,  GONE,   OK,     OK,     OK,     OK,     GONE,   OK),
    "ListQueues":                      (ANON,  OK,     OK,     OK,     OK,     OK,     OK,     OK),
    "GetQueueAttributes":              (ANON,  GONE,   OK,     OK,     OK,     OK,     GONE,   OK),
    "SetQueueAttributes":              (ANON,  GONE,   DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "SetQueueAttributes (SQS settings)": (ANON, GONE,  DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "DeleteQueue":                     (ANON,  GONE,   DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "PurgeQueue":                      (ANON,  GONE,   DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "SendMessage":                     (ANON,  GONE,   DENIED, OK,     DENIED, OK,     GONE,   OK),
    "SendMessageBatch":                (ANON,  GONE,   DENIED, OK,     DENIED, OK,     GONE,   OK),
    "ReceiveMessage":                  (ANON,  GONE,   DENIED, DENIED, OK,     OK,     GONE,   OK),
    "DeleteMessage":                   (ANON,  GONE,   DENIED, DENIED, OK,     OK,     GONE,   OK),
    "DeleteMessageBatch":              (ANON,  GONE,   DENIED, DENIED, OK,     OK,     GONE,   OK),
    "ChangeMessageVisibility":         (ANON,  GONE,   DENIED, DENIED, OK,     OK,     GONE,   OK),
    "ChangeMessageVisibilityBatch":    (ANON,  GONE,   DENIED, DENIED, OK,     OK,     GONE,   OK),
    "TagQueue":                        (ANON,  GONE,   DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "UntagQueue":                      (ANON,  GONE,   DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "ListQueueTags":                   (ANON,  GONE,   OK,     OK,     OK,     OK,     GONE,   OK),
    "ListDeadLetterSourceQueues":      (ANON,  GONE,   OK,     OK,     OK,     OK,     GONE,   OK),
    "StartMessageMoveTask":            (ANON,  GONE,   DENIED, DENIED, DENIED, OK,     GONE,   OK),
    "ListMessageMoveTasks":            (ANON,  GONE,   OK,     OK,     OK,     OK,     GONE,   OK),
    # a handle of no running task: ResourceNotFoundException, whoever asks (test_sqs_move_tasks)
    "CancelMessageMoveTask":           (ANON,  NO_TASK, NO_TASK, NO_TASK, NO_TASK, NO_TASK, NO_TASK, NO_TASK),
    # an AWS account ID names no user here; no label "all" to remove (test_sqs_identity: both done)
    "AddPermission":                   (ANON,  GONE,   DENIED, DENIED, DENIED, BAD,    GONE,   BAD),
    "RemovePermission":                (ANON,  GONE,   DENIED, DENIED, DENIED, BAD,    GONE,   BAD),
}
# fmt: on


@dataclass(frozen=True)
class World:
    """A queue ``q`` (URL ``url``) and its dead-letter queue ``d``, made by the owner; ``handle``:
    the owner's receipt of the message in flight; ``new``: a name nobody uses (each call is
    given its own)."""

    q: str
    d: str
    url: str
    dl_url: str
    handle: str
    new: str
    #: the body of the message not in flight
    waiting: str

    @property
    def dl_arn(self) -> str:
        return _arn(self.d)


def _arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def _redrive(target: str, count: int = 5) -> str:
    return json.dumps({"deadLetterTargetArn": _arn(target), "maxReceiveCount": count})


#: action -> the call, with a client of the caller, in a world.
CALLS: dict[str, Callable[[Any, World], dict]] = {
    "CreateQueue": lambda c, w: c.create_queue(QueueName=w.new),
    "CreateQueue (its name)": lambda c, w: c.create_queue(QueueName=w.q),
    "CreateQueue (dead letters to it)": lambda c, w: c.create_queue(
        QueueName=w.new, Attributes={"RedrivePolicy": _redrive(w.q)}
    ),
    "GetQueueUrl": lambda c, w: c.get_queue_url(QueueName=w.q),
    "ListQueues": lambda c, w: c.list_queues(QueueNamePrefix=w.q),
    "GetQueueAttributes": lambda c, w: c.get_queue_attributes(QueueUrl=w.url, AttributeNames=["All"]),
    "SetQueueAttributes": lambda c, w: c.set_queue_attributes(QueueUrl=w.url, Attributes={"VisibilityTimeout": "40"}),
    "SetQueueAttributes (SQS settings)": lambda c, w: c.set_queue_attributes(
        QueueUrl=w.url, Attributes={"ReceiveMessageWaitTimeSeconds": "2", "KmsMasterKeyId": "alias/aws/sqs"}
    ),
    "DeleteQueue": lambda c, w: c.delete_queue(QueueUrl=w.url),
    "PurgeQueue": lambda c, w: c.purge_queue(QueueUrl=w.url),
    "SendMessage": lambda c, w: c.send_message(QueueUrl=w.url, MessageBody="hello"),
    "SendMessageBatch": lambda c, w: c.send_message_batch(
        QueueUrl=w.url, Entries=[{"Id": "a", "MessageBody": "a"}, {"Id": "b", "MessageBody": "b"}]
    ),
    "ReceiveMessage": lambda c, w: c.receive_message(QueueUrl=w.url, MaxNumberOfMessages=10, WaitTimeSeconds=2),
    "DeleteMessage": lambda c, w: c.delete_message(QueueUrl=w.url, ReceiptHandle=w.handle),
    "DeleteMessageBatch": lambda c, w: c.delete_message_batch(
        QueueUrl=w.url, Entries=[{"Id": "a", "ReceiptHandle": w.handle}]
    ),
    "ChangeMessageVisibility": lambda c, w: c.change_message_visibility(
        QueueUrl=w.url, ReceiptHandle=w.handle, VisibilityTimeout=0
    ),
    "ChangeMessageVisibilityBatch": lambda c, w: c.change_message_visibility_batch(
        QueueUrl=w.url, Entries=[{"Id": "a", "ReceiptHandle": w.handle, "VisibilityTimeout": 0}]
    ),
    "TagQueue": lambda c, w: c.tag_queue(QueueUrl=w.url, Tags={"env": "x"}),
    "UntagQueue": lambda c, w: c.untag_queue(QueueUrl=w.url, TagKeys=["team"]),
    "ListQueueTags": lambda c, w: c.list_queue_tags(QueueUrl=w.url),
    "ListDeadLetterSourceQueues": lambda c, w: c.list_dead_letter_source_queues(QueueUrl=w.dl_url),
    "StartMessageMoveTask": lambda c, w: c.start_message_move_task(SourceArn=w.dl_arn),
    "ListMessageMoveTasks": lambda c, w: c.list_message_move_tasks(SourceArn=w.dl_arn),
    "CancelMessageMoveTask": lambda c, w: c.cancel_message_move_task(TaskHandle="bm90LWEtdGFzaw=="),
    "AddPermission": lambda c, w: c.add_permission(
        QueueUrl=w.url, Label="all", AWSAccountIds=["111122223333"], Actions=["*"]
    ),
    "RemovePermission": lambda c, w: c.remove_permission(QueueUrl=w.url, Label="all"),
}

#: action -> (the right a refusal names, on which queue: "q", "d"; the audit actions of a
#: success, space-separated, None: none).
RIGHTS: dict[str, tuple[str | None, str | None, str | None]] = {
    "CreateQueue": (None, None, "create"),
    "CreateQueue (its name)": (None, None, None),
    "CreateQueue (dead letters to it)": ("produce", "q", "create"),
    "GetQueueUrl": ("read", "q", None),
    "ListQueues": (None, None, None),
    "GetQueueAttributes": ("read", "q", None),
    "SetQueueAttributes": ("manage", "q", "change"),
    "SetQueueAttributes (SQS settings)": ("manage", "q", "change"),
    "DeleteQueue": ("manage", "q", "delete"),
    "PurgeQueue": ("manage", "q", "purge"),
    "SendMessage": ("produce", "q", None),
    "SendMessageBatch": ("produce", "q", None),
    "ReceiveMessage": ("consume", "q", None),
    "DeleteMessage": ("consume", "q", None),
    "DeleteMessageBatch": ("consume", "q", None),
    "ChangeMessageVisibility": ("consume", "q", None),
    "ChangeMessageVisibilityBatch": ("consume", "q", None),
    "TagQueue": ("manage", "q", "change"),
    "UntagQueue": ("manage", "q", "change"),
    "ListQueueTags": ("read", "q", None),
    "ListDeadLetterSourceQueues": ("read", "d", None),
    "StartMessageMoveTask": ("manage", "d", "move_start redrive move_end"),
    "ListMessageMoveTasks": ("read", "d", None),
    "CancelMessageMoveTask": (None, None, None),
    "AddPermission": ("manage", "q", None),
    "RemovePermission": ("manage", "q", None),
}


def test_the_table_names_every_sqs_action_and_role():
    # a new action in sqs/actions.py fails here until the table says who may call it
    assert {row.split(" (")[0] for row in TABLE} == set(sqs_actions.ACTIONS)
    assert set(TABLE) == set(CALLS) == set(RIGHTS)
    assert all(len(row) == len(ROLES) for row in TABLE.values())
    assert len(PERMISSIONS) > 40  # every registered model's permissions, custom ones too


# --- the node, the users and the worlds --------------------------------------------------------
class Env:
    """The module's node, its boto3 session and the owner of every world."""

    def __init__(self, node):
        self.node = node
        self.session = boto3.session.Session()
        self.owner = _new_user("owner")
        self.owner_sqs = self.client(self.owner)

    def client(self, user):
        """A boto3 client with a new access key of ``user`` (None: unsigned)."""
        # A 5xx is retried, as SDKs do: a moment's 503 (the node's database busy on a loaded
        # machine) says nothing of a right. A refusal (4xx) is never retried.
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, read_timeout=30, max_pool_connections=4)
        if user is None:
            config = config.merge(Config(signature_version=botocore.UNSIGNED))
            key_id, secret = "unused", "unused"
        else:
            key = AccessKey.issue(user)
            key_id, secret = key.access_key_id, key.secret
        return self.session.client(
            "sqs",
            endpoint_url=f"{self.node.url}/sqs",
            region_name=REGION,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=config,
        )

    def world(self) -> World:
        o = self.owner_sqs
        q = f"mx-{uuid.uuid4().hex[:10]}"
        d = f"{q}-dl"
        dl_url = o.create_queue(QueueName=d)["QueueUrl"]
        url = o.create_queue(QueueName=q, Attributes={"RedrivePolicy": _redrive(d)}, tags={"team": "a"})["QueueUrl"]
        o.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "one"}, {"Id": "2", "MessageBody": "two"}]
        )
        (m,) = o.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=43200, WaitTimeSeconds=5)[
            "Messages"
        ]
        return World(q, d, url, dl_url, m["ReceiptHandle"], f"{q}-new", "two" if m["Body"] == "one" else "one")

    def counts(self, w: World) -> tuple[tuple[str, str], ...]:
        """(visible, in flight) of the queue and the dead-letter queue, as the owner reads them."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        out = []
        for url in (w.url, w.dl_url):
            got = self.owner_sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
            out.append((got[names[0]], got[names[1]]))
        return tuple(out)


#: what a world holds before anyone but its owner calls: the queue one visible message and one
#: in flight, the dead-letter queue none.
UNTOUCHED = (("1", "1"), ("0", "0"))


def _new_user(role: str, **fields):
    from django.contrib.auth.models import User

    return User.objects.create(username=f"{role}-{uuid.uuid4().hex[:6]}", **fields)


def _grant(user, w: World, action: str) -> None:
    for q in Queue.objects.filter(name__in=[w.q, w.d]):
        Grant.objects.create(user=user, queue=q, action=action)


def _rows(w: World) -> tuple:
    """The queues' rows and SQS settings as the database holds them (any write changes them)."""
    names = [w.q, w.d, w.new]
    return (
        sorted(Queue.objects.filter(name__in=names).values_list(), key=str),
        sorted(QueueSettings.objects.filter(queue__name__in=names).values_list(), key=str),
    )


def _last_audit() -> int:
    return AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _outcome(call: Callable[[], dict]) -> tuple[str, dict]:
    """(OK or the error code, the answer) of a boto3 call; the error's HTTP status is checked."""
    try:
        return OK, call()
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        assert STATUS.get(code) == status, (code, status, exc.response["Error"])
        return code, exc.response


@pytest.fixture(scope="module")
def env(module_node) -> Env:
    """The module's node (its data committed, since the node reads it, and all of it removed at
    the end: :func:`module_node`) and the owner of every world."""
    return Env(module_node)


@dataclass
class Cell:
    world: World
    user: Any
    client: Any


@pytest.fixture(scope="module")
def cells(env) -> dict[tuple[str, str], Cell]:
    """A fresh world per cell of the table's roles (a shared one per role that may read none),
    and the role's user (one per role, with its grant on every world of its row); made at
    once, so the node reads the grants once."""
    users = {
        role: None
        if role == "anonymous"
        else _new_user(role, is_staff=role in ("staff", "superuser"), is_superuser=role == "superuser")
        for role in ROLES
    }
    clients = {role: env.client(user) for role, user in users.items()}
    keys = [(op, role) for op in TABLE for role in ROLES]
    # The roles that may read nothing share a world each: nothing they may do changes it.
    shared = {role: env.world() for role in ROLES if TABLE["GetQueueUrl"][ROLES.index(role)] != OK}
    fresh = [key for key in keys if key[1] not in shared]
    with ThreadPoolExecutor(4) as pool:
        worlds = dict(zip(fresh, pool.map(lambda _: env.world(), fresh)))
    out = {}
    for op, role in keys:
        w = shared[role] if role in shared else worlds[op, role]
        if role in GRANTS:
            _grant(users[role], w, GRANTS[role])
        out[op, role] = Cell(w, users[role], clients[role])
    _wait_for_grants(env, users["read"], out[list(TABLE)[-1], "read"].world)
    return out


def _wait_for_grants(env, user, w: World) -> None:
    """The node reads the grants again within ``access.TTL``: wait until ``user``'s grant on
    ``w``, made last, shows."""
    from tests.launcher import wait_until

    probe = env.client(user)

    def seen() -> bool:
        try:
            probe.get_queue_url(QueueName=w.q)
            return True
        except ClientError:
            return False

    try:
        wait_until(seen, 20, "the node to read the grants")
    finally:
        probe.close()


# --- the checks --------------------------------------------------------------------------------
def _check(op: str, role_row: str, user, w: World, expected: str, got: str, answer: dict, new_audit) -> None:
    """Everything a cell asserts but the world's message counts (and its audit entries, where
    ``new_audit`` is None: the caller checks them)."""
    username = user.username if user is not None else None
    assert got == expected, (op, role_row, got, answer.get("Error", answer))
    right, on, audit_action = RIGHTS[op]
    if got == DENIED:
        target = w.q if on == "q" else w.d
        assert answer["Error"]["Message"] == (
            f"{username} may not {right} {target!r}: it needs the {right!r} permission on it"
        ), answer["Error"]
    if got != OK:
        assert not new_audit, (op, role_row, new_audit)
        assert not Queue.objects.filter(name=w.new).exists()
        return
    if new_audit is None:
        pass
    elif audit_action is not None:
        wanted = {(username, act) for act in audit_action.split()}
        assert new_audit and {(a, act) for a, act, _ in new_audit} == wanted, (op, new_audit)
    else:
        assert not new_audit, (op, role_row, new_audit)
    if op.startswith("CreateQueue") and op != "CreateQueue (its name)":
        assert Queue.objects.get(name=w.new).created_by_id == user.pk  # the creator manages it


def _listed(op: str, answer: dict, w: World) -> bool | None:
    """Whether a list names the world's queue (None: not a list)."""
    if op == "ListQueues":
        return any(u.endswith(f"/{w.q}") for u in answer.get("QueueUrls", []))
    if op == "ListDeadLetterSourceQueues":
        return any(u.endswith(f"/{w.q}") for u in answer.get("queueUrls", []))
    return None


def _new_audit(since: int) -> list[tuple[str, str, str]]:
    return list(AuditEntry.objects.filter(pk__gt=since).order_by("pk").values_list("actor", "action", "target"))


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("op", list(TABLE))
@pytest.mark.cluster
def test_sqs_permission_matrix(env, cells, op, role):
    # given a queue someone else made, and a caller of this role with its own key
    cell = cells[op, role]
    w = replace(cell.world, new=f"{cell.world.q}-{uuid.uuid4().hex[:6]}")
    rows, since = _rows(w), _last_audit()
    # when it makes the call
    got, answer = _outcome(lambda: CALLS[op](cell.client, w))
    # then it is answered as the table says, a refusal changed nothing and wrote nothing, a
    # management action done is in the audit trail under the caller's name
    expected = TABLE[op][ROLES.index(role)]
    _check(op, role, cell.user, w, expected, got, answer, _new_audit(since))
    if got != OK:
        assert _rows(w) == rows, (op, role)
        assert env.counts(w) == UNTOUCHED, (op, role)
    # and the lists name the queue exactly when the caller may read it
    may_read = TABLE["GetQueueUrl"][ROLES.index(role)] == OK
    listed = _listed(op, answer, w)
    if listed is not None and got == OK:
        assert listed == may_read, (op, role, answer)
    if op == "ReceiveMessage" and got == OK:
        assert [m["Body"] for m in answer["Messages"]] == [w.waiting]  # not the one in flight


@pytest.fixture(scope="module")
def shared(env) -> tuple[World, World]:
    """Two worlds the model permission roles share: ``hidden`` (no grant) and ``shown`` (read)."""
    return env.world(), env.world()


@pytest.fixture(scope="module")
def permission_users(env, shared) -> dict[str, tuple[Any, Any, Any, Any]]:
    """Per permission, two staff users with that one permission: (user, client) without a grant
    and (user, client) with ``read`` on the ``shown`` world."""
    from django.contrib.auth.models import Permission

    _, shown = shared
    users = {}
    for permission in PERMISSIONS:
        app, codename = permission.split(".")
        found = Permission.objects.get(content_type__app_label=app, codename=codename)
        bare, reader = _new_user("perm", is_staff=True), _new_user("perm-read", is_staff=True)
        for user in (bare, reader):
            user.user_permissions.add(found)
        _grant(reader, shown, "read")
        users[permission] = (bare, env.client(bare), reader, env.client(reader))
    _wait_for_grants(env, reader, shown)
    return users


@pytest.mark.parametrize("permission", list(PERMISSIONS))
@pytest.mark.cluster
def test_a_model_permission_gives_no_right_over_sqs(env, shared, permission_users, permission):
    # given two staff users with this one model permission: one with a read grant on the
    # queue, one with no grant (they share their worlds with the other permissions' users)
    hidden, shown = shared
    bare, bare_sqs, reader, reader_sqs = permission_users[permission]
    before = {w: _rows(w) for w in (hidden, shown)}
    since = _last_audit()
    # (the reader calls the actions ``read`` is refused: a permission could only add to those)
    cases = [(op, "no_grant", hidden, bare, bare_sqs) for op in TABLE] + [
        (op, "read", shown, reader, reader_sqs) for op in TABLE if TABLE[op][ROLES.index("read")] == DENIED
    ]

    def call(case):
        op, _, w, _, client = case
        world = replace(w, new=f"{w.q}-{uuid.uuid4().hex[:6]}")
        return world, *_outcome(lambda: CALLS[op](client, world))

    # when each calls every SQS action on its queue (several at once)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, cases))
    # (their connections are closed now: kept open, each permission's would add to the node's
    # open connections, and past its backpressure it accepts no new one until some close)
    bare_sqs.close()
    reader_sqs.close()
    # then each is answered as for a user with that grant and no permission
    created = set()
    for (op, role, _, user, _), (world, got, answer) in zip(cases, results):
        expected = TABLE[op][ROLES.index(role)]
        _check(op, role, user, world, expected, got, answer, None)
        if got == OK and _listed(op, answer, world) is not None:
            assert _listed(op, answer, world) == (role == "read"), (op, role, answer)
        if got == OK and RIGHTS[op][2] == "create":
            created.add((user.username, "create", world.new))
    # and nothing changed but the queues they created, which is all the audit trail says
    assert set(_new_audit(since)) == created
    for w in (hidden, shown):
        assert _rows(w) == before[w]
        assert env.counts(w) == UNTOUCHED
