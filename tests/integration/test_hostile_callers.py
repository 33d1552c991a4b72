"""Callers holding something cheap, on real nodes: a token with no grants, an access key ID
with a made-up signature, large bodies, a connection reused after an unread body.

Each case replays what a hostile client did to a node whose request threads read bodies: the
node's front (``queues.http.front``) reads them on its event loop, bounded by the sender's
shares (address and credential together), so while the attack runs every other user's calls
are answered well within the client's 5 s timeout, ``readyz`` answers, and no lease moves.
The attacks come from 127.0.0.2 (``tests.hostile``), the users from 127.0.0.1.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest
import requests
from botocore.config import Config
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from queues.models import Partition
from sqs.models import AccessKey
from tests import hostile
from tests.integration.nodes import Client
from tests.launcher import NodeProcess, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.django_db(transaction=True),
    pytest.mark.node(env={"NODE_STUCK_AFTER": "2"}),
]

#: The client's timeout in the finding; the users' worst call must stay well inside it.
CLIENT_TIMEOUT = 5.0


def _user_token(name: str, *, grants: bool) -> str:
    user = User.objects.create(username=f"{name}-{uuid.uuid4().hex[:8]}", is_staff=grants, is_superuser=grants)
    return Token.objects.create(user=user).key


def _leases(queue: str) -> dict[int, tuple[str | None, int]]:
    return {p.index: (p.owner_id, p.epoch) for p in Partition.objects.filter(queue__name=queue)}


def _served(queue: str, nodes: int) -> None:
    wait_until(
        lambda: (
            all(owner for owner, _ in _leases(queue).values()) and len({o for o, _ in _leases(queue).values()}) == nodes
        ),
        30,
        f"{queue} served by {nodes} node(s)",
    )


def _users(node: NodeProcess, token: str, queue: str) -> hostile.Users:
    """Another user's enqueue, dequeue and ack, and readyz, against ``node``."""
    client = Client(node.url, token)

    def cycle() -> int:
        r = client.post(f"queues/{queue}/enqueue", {"messages": [{"body": "u"}]}, timeout=CLIENT_TIMEOUT)
        if r.status_code != 201:
            return r.status_code
        r = client.post(f"queues/{queue}/dequeue", {"max": 10}, timeout=CLIENT_TIMEOUT)
        got = r.json()["messages"] if r.status_code == 200 else []
        if got:
            acks = {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]}
            r = client.post(f"queues/{queue}/ack", acks, timeout=CLIENT_TIMEOUT)
        return r.status_code

    def ready() -> int:
        return requests.get(f"{node.url}/api/v1/readyz", timeout=CLIENT_TIMEOUT).status_code

    return hostile.Users({"cycle": cycle, "readyz": ready})


def _sqs_key_id(user_token: str) -> str:
    """An active access key of the token's user (its ID: what a stranger may know)."""
    user = Token.objects.get(key=user_token).user
    key = AccessKey.issue(user)
    return key.access_key_id


def _targets(node: NodeProcess, *, partitions: int, nodes: int) -> tuple[str, str, str, str, dict]:
    """A superuser's token, its queue of ``partitions`` served by ``nodes`` node(s), a token
    with no grants, an access key ID of the superuser, and the queue's leases now."""
    admin = _user_token("owner", grants=True)
    queue = f"hq-{uuid.uuid4().hex[:8]}"
    r = Client(node.url, admin).post("queues", {"name": queue, "partitions": partitions})
    assert r.status_code == 201, r.text
    _served(queue, nodes)
    return admin, queue, _user_token("nogrant", grants=False), _sqs_key_id(admin), _leases(queue)


def _check(users: hostile.Users, before: dict, queue: str) -> None:
    assert not users.failures, users.failures[:5]
    assert users.worst < CLIENT_TIMEOUT / 5, users.summary()
    assert _leases(queue) == before, "a lease moved while the node was under attack"


def test_one_node_stays_up_under_every_cheap_attack(node_factory):
    try:
        node = node_factory(processes=1)
        admin, queue, nogrant, key_id, before = _targets(node, partitions=2, nodes=1)

        # a token with no grants trickles 100 bodies to the REST API's create
        with _users(node, admin, queue) as users:
            answered = hostile.dribble(
                node.port,
                "/api/v1/queues",
                {"Authorization": f"Token {nogrant}", "Content-Type": "application/json"},
                seconds=8,
            )
        # each was cut for its rate (408) or refused past its share (429), none left waiting
        assert set(answered) <= {408, 429}, answered
        assert answered[429] and answered[408], answered
        _check(users, before, queue)
        # and each refusal is counted by its reason
        scrape = requests.get(f"{node.url}/metrics", timeout=10).text
        assert _refusals(scrape, "slow_body") >= answered[408], scrape[-2000:]
        assert _refusals(scrape, "over_share") >= answered[429], scrape[-2000:]

        # an access key's ID with a made-up, well-formed signature trickles 100 SQS calls
        with _users(node, admin, queue) as users:
            answered = hostile.dribble(node.port, "/sqs/", hostile.sqs_dribble_headers(key_id), seconds=8)
        assert set(answered) <= {400, 408}, answered  # RequestThrottled (400), cut (408)
        _check(users, before, queue)
        # ... and the key's owner, calling from its own address, is served throughout
        sqs = boto3.client(
            "sqs",
            endpoint_url=f"{node.url}/sqs",
            region_name="us-east-1",
            aws_access_key_id=key_id,
            aws_secret_access_key=AccessKey.objects.get(access_key_id=key_id).secret,
            config=Config(retries={"max_attempts": 1}),
        )
        stop = threading.Event()
        owner_calls: list[float] = []

        def owner() -> None:
            url = sqs.create_queue(QueueName=f"own-{uuid.uuid4().hex[:6]}")["QueueUrl"]
            while not stop.is_set():
                started = time.monotonic()
                sqs.send_message(QueueUrl=url, MessageBody="mine")
                owner_calls.append(time.monotonic() - started)

        thread = threading.Thread(target=owner)
        thread.start()
        try:
            hostile.dribble(node.port, "/sqs/", hostile.sqs_dribble_headers(key_id), seconds=7)
        finally:
            stop.set()
            thread.join(timeout=10)
        assert owner_calls and max(owner_calls) < 1.0, owner_calls

        # a signature that cannot be valid is refused before its body (no byte of it sent)
        bad = {**hostile.sqs_dribble_headers(key_id), "Authorization": f"AWS4-HMAC-SHA256 Credential={key_id}/x"}
        assert hostile.dribble(node.port, "/sqs/", bad, connections=1, seconds=3) == {400: 1}
        bad = hostile.sqs_dribble_headers(key_id)
        bad["Authorization"] = bad["Authorization"].replace("0" * 64, "00")
        assert hostile.dribble(node.port, "/sqs/", bad, connections=1, seconds=3) == {403: 1}

        # large bodies with a token that has no grants: refused, and the memory comes back
        (pid,) = node.member_pids()
        rss_before = _rss(pid)
        with _users(node, admin, queue) as users:
            answered = hostile.large_bodies(
                node.port,
                "/api/v1/queues",
                {"Authorization": f"Token {nogrant}", "Content-Type": "application/json"},
                at_once=24,
                rounds=2,
            )
        assert set(answered) <= {400, 429}, answered
        _check(users, before, queue)
        wait_until(lambda: _rss(pid) - rss_before < 64 * hostile.MiB, 10, "the node's RSS back within 64 MiB")

        # clients that hang up mid-body leave nothing held: the same caller is read again
        grantless = {"Authorization": f"Token {nogrant}", "Content-Type": "application/json"}
        hostile.abandon(node.port, "/api/v1/queues", grantless, connections=40)
        # (within a second, well before the grace would have cut their reads)
        statuses = []
        wait_until(
            lambda: (
                statuses.append(hostile.send_as_attacker(node.port, "/api/v1/queues", grantless, b'{"name": "!"}'))
                or statuses[-1] == 400
            ),  # (its name refused: its body was read, not its share refused)
            1.5,
            f"the caller's share back after its clients hung up (answered {statuses[-3:]})",
        )

        # a connection reused after a body left unread: the next request is never lost
        kept = hostile.keep_alive_after_unread(node.port, admin, rounds=40)
        assert kept == {"answered": 40, "dropped": 0}, kept
    finally:
        node_factory.stop()


def test_two_nodes_keep_their_leases_while_one_is_attacked(node_factory):
    try:
        a = node_factory(processes=1)
        b = node_factory(processes=1)
        admin, queue, nogrant, key_id, before = _targets(a, partitions=4, nodes=2)
        with _users(a, admin, queue) as on_a, _users(b, admin, queue) as on_b:
            threads = [
                threading.Thread(
                    target=hostile.dribble,
                    args=(a.port, "/api/v1/queues", {"Authorization": f"Token {nogrant}"}),
                    kwargs={"seconds": 8},
                ),
                threading.Thread(
                    target=hostile.dribble,
                    args=(a.port, "/sqs/", hostile.sqs_dribble_headers(key_id)),
                    kwargs={"seconds": 8},
                ),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        _check(on_a, before, queue)
        _check(on_b, before, queue)
        # large bodies with that token, and connections reused after unread bodies, on A
        with _users(a, admin, queue) as on_a, _users(b, admin, queue) as on_b:
            answered = hostile.large_bodies(
                a.port,
                "/api/v1/queues",
                {"Authorization": f"Token {nogrant}", "Content-Type": "application/json"},
                at_once=24,
                rounds=1,
            )
            kept = hostile.keep_alive_after_unread(a.port, admin, rounds=20)
        assert set(answered) <= {400, 429}, answered
        assert kept == {"answered": 20, "dropped": 0}, kept
        _check(on_a, before, queue)
        _check(on_b, before, queue)
    finally:
        node_factory.stop()


def _refusals(scrape: str, reason: str) -> float:
    """``mq_front_refusals_total{reason=...}`` in a scrape of ``/metrics`` (0 when absent)."""
    for line in scrape.splitlines():
        if line.startswith(f'mq_front_refusals_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
