"""A node of two processes (``runnode --processes 2``) on PostgreSQL + Redis answers as one node.

Each process is a cluster member of its own, with its own leases and partitions, behind one port:
the kernel hands each new connection to one of them. Whichever process a call lands on:

- a queue is served as soon as its create call returns: enqueues right after it are accepted,
  to every partition, not answered 503 while a sibling has yet to take its share;
- a dequeue with room answers with the node's deliverable messages, the siblings' included: a
  message made visible again is in the next dequeue;
- under a steady load, with the consumers' keep-alive connections on one process and the
  producer's on the other, no message waits a second for a consumer (the bound is a meaning
  check, far above a healthy node's milliseconds: speed is ``bench/latency.py``'s).

Calls go over http.client: a new connection for each call where the landing should be left to
the kernel, kept-alive connections where the test places them.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.nodes import member_ids
from tests.launcher import NodeProcess, wait_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    # the default node's heartbeat (1 s), not the tests' 0.3 s: a sibling takes its share of a new
    # queue at its next pass, and a shorter beat would hide how long that is
    pytest.mark.node(processes=2, backend="redis", env={"NODE_HEARTBEAT": "1.0"}),
]

PARTITIONS = 4


# --- calls ------------------------------------------------------------------------------------
def call(
    node: NodeProcess,
    token: str,
    method: str,
    path: str,
    payload: dict | None = None,
    *,
    conn: http.client.HTTPConnection | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    """``method /api/v1/path`` with the token: on ``conn`` (kept open) if given, else on a new
    connection (closed after). The status and the decoded JSON answer (None when empty)."""
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", node.port, timeout=timeout)
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    body = None
    if payload is not None:
        body = json.dumps(payload).encode()
        headers["Content-Type"] = "application/json"
    try:
        c.request(method, f"/api/v1/{path}", body=body, headers=headers)
        r = c.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw else None)
    finally:
        if own:
            c.close()


def ok(status_and_answer: tuple[int, Any], *statuses: int) -> Any:
    status, answer = status_and_answer
    assert status in (statuses or (200,)), (status, answer)
    return answer


def groups_per_partition(partitions: int, per_partition: int) -> list[list[str]]:
    """``per_partition`` group names hashed to each partition, in partition order."""
    from queues.engine.ids import group_partition

    out: list[list[str]] = [[] for _ in range(partitions)]
    i = 0
    while min(len(gs) for gs in out) < per_partition:
        g = f"g{i}"
        gs = out[group_partition(g, partitions)]
        if len(gs) < per_partition:
            gs.append(g)
        i += 1
    return out


def owners(node: NodeProcess, token: str, queue: str) -> dict[int, str | None]:
    """``{partition: owner's Node id}`` as ``GET .../partitions`` says."""
    answer = ok(call(node, token, "GET", f"queues/{queue}/partitions"))
    return {p["index"]: p["owner_id"] for p in answer["partitions"]}


def served_by_both(node: NodeProcess, token: str, queue: str, members: set[str]) -> dict[int, str | None]:
    """Wait until every partition has an owner and both processes own some; the owners."""
    seen: dict[int, str | None] = {}

    def both() -> bool:
        seen.clear()
        seen.update(owners(node, token, queue))
        return None not in seen.values() and set(seen.values()) == members

    wait_until(both, 30, f"both processes of the node to own partitions of {queue} (last seen: {seen})")
    return seen


def partition_of(message_id: str) -> int:
    from queues.engine.ids import parse_message_id

    parsed = parse_message_id(message_id)
    assert parsed is not None, message_id
    return parsed.partition


# --- where a kept-alive connection landed -----------------------------------------------------
def _server_inode(port: int, client_port: int) -> int | None:
    """The inode of the node's end of the established connection from ``client_port``
    (``/proc/net/tcp``: addresses in hex, state 01 = established)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local_port, remote_port = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
        if local_port == port and remote_port == client_port and f[3] == "01":
            return int(f[9])
    return None


def process_of(node: NodeProcess, conn: http.client.HTTPConnection) -> int | None:
    """The pid of the node's process that holds ``conn`` (after a call on it), None if unseen."""
    assert conn.sock is not None
    inode = _server_inode(node.port, conn.sock.getsockname()[1])
    if inode is None:
        return None
    for pid in node.member_pids():
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def connection_on(
    node: NodeProcess, want: int | None, avoid: int | None = None
) -> tuple[http.client.HTTPConnection, int]:
    """A kept-alive connection held by process ``want`` (any if None) and not by ``avoid``: new
    connections until the kernel hands one to it; the connection and its process."""
    for _ in range(60):
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
        conn.request("GET", "/api/v1/healthz")
        conn.getresponse().read()
        pid = process_of(node, conn)
        if pid is not None and pid != avoid and want in (None, pid):
            return conn, pid
        conn.close()
    raise AssertionError(f"no connection landed on process {want} (not {avoid}) in 60 tries")


# --- a new queue ------------------------------------------------------------------------------
def test_every_partition_of_a_new_queue_takes_enqueues_right_after_the_create(node_factory, token, unique_name):
    # given: a node of two processes, both registered as cluster members
    node = node_factory()
    assert len(member_ids(node)) == 2
    groups = [gs[0] for gs in groups_per_partition(PARTITIONS, 1)]
    refused: list[tuple[str, str, int, Any]] = []
    calls = 0

    # when: 40 queues are created, and each at once gets an enqueue to every partition (a group
    # hashed to it) and one without a group, every call on a new connection (either process)
    for _ in range(40):
        q = unique_name("new")
        ok(call(node, token, "POST", "queues", {"name": q, "partitions": PARTITIONS}), 201)
        for what, message in [(g, {"body": "x", "group": g}) for g in groups] + [("no group", {"body": "x"})]:
            status, answer = call(node, token, "POST", f"queues/{q}/enqueue", message)
            calls += 1
            if status not in (200, 201):
                refused.append((q, what, status, answer))

    # then: every one was stored, none answered 503 "no live owner; retry"
    assert not refused, f"{len(refused)} of {calls} enqueues right after the create refused; first: {refused[:3]}"


# --- a message made visible again -------------------------------------------------------------
@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
def test_a_message_made_visible_again_is_in_the_next_dequeue_whichever_process_answers(
    node_factory, token, unique_name, strict
):
    # given: a 4-partition queue served by both processes, 20 deliverable messages over them
    # (plain: each on a new connection, stored by the process that takes it; strict: one group
    # each, five hashed to each partition)
    node = node_factory()
    members = member_ids(node)
    q = unique_name("vis")
    ok(call(node, token, "POST", "queues", {"name": q, "partitions": PARTITIONS, "strict": strict}), 201)
    by_owner = served_by_both(node, token, q, members)
    stored: list[str] = []
    if strict:
        for gs in groups_per_partition(PARTITIONS, 5):
            for g in gs:
                stored.append(ok(call(node, token, "POST", f"queues/{q}/enqueue", {"body": g, "group": g}), 201)["id"])
    else:
        for i in range(20):
            stored.append(ok(call(node, token, "POST", f"queues/{q}/enqueue", {"body": f"m{i}"}), 201)["id"])
    holders = {by_owner[partition_of(mid)] for mid in stored}
    assert holders == members, f"the messages are all on one process ({holders}); the test needs both"
    fixer = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)

    def visible_again(m: dict) -> None:
        payload = {"id": m["id"], "receipt": m["receipt"], "visibility_timeout": 0}
        ok(call(node, token, "POST", f"queues/{q}/visibility", payload, conn=fixer))

    missed: list[str] = []
    try:
        for wait in (0, 2):
            for round_ in range(20):
                # when: one message is taken for long, then made visible again at once
                (m,) = ok(call(node, token, "POST", f"queues/{q}/dequeue", {"max": 1, "visibility_timeout": 300}))[
                    "messages"
                ]
                visible_again(m)
                # and the next dequeue has room for every message of the node
                got = ok(
                    call(
                        node,
                        token,
                        "POST",
                        f"queues/{q}/dequeue",
                        {"max": 100, "visibility_timeout": 300, "wait": wait},
                    )
                )["messages"]
                if m["id"] not in {d["id"] for d in got}:
                    missed.append(f"wait {wait} round {round_}: {len(got)} of 20 came, not {m['id']}")
                for d in got:  # the node holds 20 deliverable messages again
                    visible_again(d)
    finally:
        fixer.close()

    # then: the message was in the next dequeue every time, short poll and long poll alike
    short, long = (sum(f"wait {w} " in x for x in missed) for w in (0, 2))
    assert not missed, (
        f"the message made visible again was missing {short} of 20 times (short poll) "
        f"and {long} of 20 times (long poll, wait 2): {missed}"
    )


# --- the oldest message's age under a steady load ---------------------------------------------
RATE = 200  # messages a second
SECONDS = 6.0
MAX_AGE = 1.0  # seconds: the issue's bound, a meaning check and no timing benchmark


def test_no_message_waits_a_second_when_the_consumers_sit_on_the_other_process(node_factory, token, unique_name):
    # given: a 4-partition queue served by both processes; the producer's kept-alive connection
    # on one process, both consumers' on the other (a 2:1 spread, which the node leaves as is)
    node = node_factory()
    members = member_ids(node)
    q = unique_name("age")
    ok(call(node, token, "POST", "queues", {"name": q, "partitions": PARTITIONS}), 201)
    served_by_both(node, token, q, members)
    producer_conn, producer_pid = connection_on(node, None)
    first, consumer_pid = connection_on(node, None, avoid=producer_pid)
    second, _ = connection_on(node, consumer_pid)
    consumer_conns = [first, second]

    sent_count = int(RATE * SECONDS)
    refused: list[tuple[int, Any]] = []
    ages: dict[int, float] = {}
    duplicates: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    produced = threading.Event()
    done = threading.Event()

    def produce() -> None:
        try:
            t0 = time.monotonic()
            for i in range(sent_count):
                delay = t0 + i / RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                body = json.dumps({"i": i, "t": time.monotonic()})
                status, answer = call(node, token, "POST", f"queues/{q}/enqueue", {"body": body}, conn=producer_conn)
                if status not in (200, 201):
                    refused.append((status, answer))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            produced.set()

    def consume(conn: http.client.HTTPConnection) -> None:
        try:
            while not done.is_set():
                status, answer = call(
                    node,
                    token,
                    "POST",
                    f"queues/{q}/dequeue",
                    {"max": 10, "wait": 5, "visibility_timeout": 60},
                    conn=conn,
                )
                now = time.monotonic()
                assert status == 200, (status, answer)
                got = answer["messages"]
                with lock:
                    for d in got:
                        sent = json.loads(d["body"])
                        if sent["i"] in ages:
                            duplicates.append(sent["i"])
                        ages[sent["i"]] = now - sent["t"]
                    if produced.is_set() and len(ages) >= sent_count - len(refused):
                        done.set()
                if got:
                    items = [{"id": d["id"], "receipt": d["receipt"]} for d in got]
                    ok(call(node, token, "POST", f"queues/{q}/ack", {"messages": items}, conn=conn))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            done.set()

    # when: the producer sends 200 single messages a second for 6 s; the consumers long-poll
    # (max 10, wait 5) and ack
    threads = [threading.Thread(target=consume, args=(c,)) for c in consumer_conns]
    threads.append(threading.Thread(target=produce))
    for t in threads:
        t.start()
    produced.wait(SECONDS + 60)
    done.wait(20)
    done.set()
    for t in threads:
        t.join(15)
    for c in [producer_conn, *consumer_conns]:
        c.close()

    # then: every message came once, none older than a second when it came
    assert not errors, errors
    assert not refused, f"{len(refused)} enqueues refused: {refused[:3]}"
    assert sorted(ages) == list(range(sent_count)), f"{sent_count - len(ages)} of {sent_count} messages never came"
    assert not duplicates, f"{len(duplicates)} messages came twice"
    values = sorted(ages.values())
    late = [a for a in values if a >= MAX_AGE]
    assert not late, (
        f"{len(late)} of {sent_count} messages were {MAX_AGE} s old or more when they came "
        f"(p50 {statistics.median(values) * 1e3:.1f} ms, p99 {values[int(len(values) * 0.99)] * 1e3:.0f} ms, "
        f"max {values[-1] * 1e3:.0f} ms; producer on process {producer_pid}, consumers on {consumer_pid})"
    )


# --- access changes ---------------------------------------------------------------------------
def test_a_grant_taken_back_through_one_process_is_in_force_in_its_sibling_at_once(node_factory, unique_name):
    """Each process caches grants and tokens for a few seconds; a change made through one is an
    access change its sibling reads on its board, so the sibling reads them again at the next
    call instead of answering from what it kept."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from sqs.models import AccessKey

    node = node_factory()
    owner = User.objects.create(username=unique_name("owner"))
    owner_token, key = Token.objects.create(user=owner).key, AccessKey.issue(owner)
    reader = User.objects.create(username=unique_name("reader"))
    reader_token = Token.objects.create(user=reader).key
    name = unique_name("granted")
    ok(call(node, owner_token, "POST", "queues", {"name": name, "partitions": 1}), 201)
    # the owner's calls on one process, the reader's on the other
    owners_conn, owners_pid = connection_on(node, None)
    readers_conn, _ = connection_on(node, None, avoid=owners_pid)

    def sqs(action: str, **params: Any) -> dict:
        body = json.dumps(params).encode()
        req = AWSRequest(
            "POST",
            f"{node.url}/sqs/",
            data=body,
            headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"},
        )
        SigV4Auth(Credentials(key.access_key_id, key.secret), "sqs", "eu-west-1").add_auth(req)
        owners_conn.request("POST", "/sqs/", body=body, headers=dict(req.headers))
        r = owners_conn.getresponse()
        raw = r.read()
        assert r.status == 200, (action, r.status, raw)
        return json.loads(raw) if raw else {}

    url = sqs("GetQueueUrl", QueueName=name)["QueueUrl"]
    sqs("AddPermission", QueueUrl=url, Label="reads", AWSAccountIds=[reader.username], Actions=["GetQueueAttributes"])
    # given: the reader's process has read the grant (and the token) and keeps them
    for _ in range(3):
        ok(call(node, reader_token, "GET", f"queues/{name}/stats", conn=readers_conn))
    # when: the owner takes the grant back through the other process
    sqs("RemovePermission", QueueUrl=url, Label="reads")
    # then: the reader's next call is refused (the queue is not even shown), not answered
    ok(call(node, reader_token, "GET", f"queues/{name}/stats", conn=readers_conn), 404)
    owners_conn.close()
    readers_conn.close()
