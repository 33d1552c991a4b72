"""Operators' actions racing message traffic on the same queue, with the interleaving forced.

Each test patches one function so that the other operation runs at the critical point (as
saleor's ``race_condition`` helpers do), rather than sleeping and hoping. The rule: a race
answers 404 or 409 with a clear error, or succeeds; never 500; and nothing that was not
deliberately removed is lost.

Runs in-process (the runtime has no housekeeping thread; the test ticks it). The two-node
version, with live traffic, is ``test_races_nodes.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from queues import service
from queues.access import SYSTEM
from queues.cluster import catalog
from queues.cluster.node import NodeRuntime
from queues.engine.partition import PartitionManager
from queues.models import Partition, Queue

pytestmark = pytest.mark.django_db

API = "/api/v1/queues"


@contextlib.contextmanager
def before_once(owner: object, attr: str, action: Callable[[], object]) -> Iterator[list[object]]:
    """Run ``action`` the first time ``owner.attr`` is called, just before the real call: the
    race's critical point. Yields the list of what ``action`` returned (empty if never run)."""
    real = getattr(owner, attr)
    done: list[object] = []

    def wrapper(*args, **kwargs):
        if not done:
            done.append(None)  # before the action, which may call it too
            done[0] = action()
        return real(*args, **kwargs)

    setattr(owner, attr, wrapper)
    try:
        yield done
    finally:
        setattr(owner, attr, real)


def after_once(owner: object, attr: str, action: Callable[[], object]) -> contextlib.AbstractContextManager:
    """Run ``action`` the first time ``owner.attr`` returns, before its caller goes on."""
    real = getattr(owner, attr)
    done: list[object] = []

    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        if not done:
            done.append(None)  # before the action, which may call it too
            done[0] = action()
        return result

    @contextlib.contextmanager
    def patched():
        setattr(owner, attr, wrapper)
        try:
            yield done
        finally:
            setattr(owner, attr, real)

    return patched()


def enqueue(api, name, n, prefix="m", **extra) -> list[str]:
    r = api.post(
        f"{API}/{name}/enqueue", {"messages": [{"body": f"{prefix}{i}", **extra} for i in range(n)]}, format="json"
    )
    assert r.status_code == 201, r.content
    return r.json()["ids"]


def drain(api, name) -> list[str]:
    """Dequeue and ack until empty; the bodies."""
    bodies: list[str] = []
    while True:
        r = api.post(f"{API}/{name}/dequeue", {"max": 100}, format="json")
        assert r.status_code == 200, r.content
        got = r.json()["messages"]
        if not got:
            return bodies
        bodies += [m["body"] for m in got]
        a = ack(api, name, got)
        assert a.status_code == 200, a.content


def ack(api, name, got):
    return api.post(
        f"{API}/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]}, format="json"
    )


def assert_error(r, status: int, code: str) -> None:
    assert r.status_code == status, r.content
    assert r.json()["error"] == code, r.content
    assert r.json()["detail"]


def delete(name: str) -> None:
    service.delete_queue(service.get_queue(name, caller=SYSTEM), caller=SYSTEM)


# --- purge --------------------------------------------------------------------------------------
def test_purge_racing_delete_answers_404(superuser_api, make_queue):
    # given a queue with messages in two partitions
    name = make_queue(partitions=2)
    enqueue(superuser_api, name, 10)
    # when the queue is deleted after the purge listed its partitions (the known 500:
    # Partition.DoesNotExist from queues/cluster/purge.py)
    with before_once(service.operations, "purge_partition", lambda: delete(name)) as done:
        r = superuser_api.post(f"{API}/{name}/purge", {}, format="json")
    # then
    assert done
    assert_error(r, 404, "queue_not_found")
    assert not Queue.objects.filter(name=name).exists()


def test_purge_racing_partition_growth_keeps_serving_the_new_partitions(superuser_api, make_queue, runtime):
    # given a queue of 2 partitions with messages, all served here
    name = make_queue(partitions=2)
    enqueue(superuser_api, name, 10, prefix="old")

    def grow():
        r = superuser_api.patch(f"{API}/{name}", {"partitions": 4}, format="json")
        assert r.status_code == 200, r.content

    # when the queue grows to 4 partitions while the purge runs
    with before_once(service.operations, "purge_partition", grow) as done:
        r = superuser_api.post(f"{API}/{name}/purge", {}, format="json")
    # then the purge succeeds and every partition is served again at once (the purged ones
    # reclaimed, the new ones kept), so enqueues need no housekeeping pass
    assert done
    assert r.status_code == 200, r.content
    assert r.json()["purged"] == 10
    assert sorted(m.index for m in runtime.local_managers(name)) == [0, 1, 2, 3]
    enqueue(superuser_api, name, 20, prefix="new")
    assert sorted(drain(superuser_api, name)) == sorted(f"new{i}" for i in range(20))


def test_purge_racing_enqueue_removes_what_came_before(superuser_api, make_queue, runtime):
    # given a queue with messages
    name = make_queue(partitions=1)
    enqueue(superuser_api, name, 5, prefix="before")
    # when an enqueue lands while the purge is emptying the partition (after its epoch moved)
    with after_once(
        service.operations,
        "purge_partition",
        lambda: superuser_api.post(f"{API}/{name}/enqueue", {"body": "during"}, format="json"),
    ) as during:
        r = superuser_api.post(f"{API}/{name}/purge", {}, format="json")
    # then the purge succeeds, the enqueue during it was refused with 503 + Retry-After or
    # stored, and what is enqueued after it is all delivered
    assert r.status_code == 200, r.content
    (answer,) = during
    assert answer.status_code in (201, 503), answer.content
    if answer.status_code == 503:
        assert answer["Retry-After"]
    enqueue(superuser_api, name, 5, prefix="after")
    got = drain(superuser_api, name)
    assert not [b for b in got if b.startswith("before")]
    assert sorted(b for b in got if b.startswith("after")) == [f"after{i}" for i in range(5)]


def test_dequeue_racing_purge_then_serves_only_what_came_after(superuser_api, make_queue):
    # given a queue with messages
    name = make_queue(partitions=1)
    enqueue(superuser_api, name, 5)

    def purge():
        assert superuser_api.post(f"{API}/{name}/purge", {}, format="json").status_code == 200

    # when the purge runs between the dequeue taking messages and reading their bodies
    with before_once(PartitionManager, "load_bodies", purge) as done:
        r = superuser_api.post(f"{API}/{name}/dequeue", {"max": 5}, format="json")
    # then the dequeue answers (what it took before the purge finished, from the node's body
    # cache: it is ordered before the purge), their acks are refused as not in flight, and
    # the queue serves on with nothing of before
    assert done
    assert r.status_code == 200, r.content
    got = r.json()["messages"]
    if got:
        assert_error(ack(superuser_api, name, got), 409, "receipt_mismatch")
    enqueue(superuser_api, name, 3, prefix="after")
    assert sorted(drain(superuser_api, name)) == ["after0", "after1", "after2"]


# --- delete -------------------------------------------------------------------------------------
def test_delete_racing_delete_and_recreate_leaves_the_new_queue_alone(superuser_api, make_queue, runtime):
    # given a queue
    name = make_queue(partitions=2)
    enqueue(superuser_api, name, 3, prefix="old")

    def delete_and_recreate():
        delete(name)
        make_queue(name=name, partitions=2)
        return enqueue(superuser_api, name, 4, prefix="new")

    # when another client deletes it and creates it again between this DELETE's read of the
    # row and its delete
    with after_once(service, "get_queue", delete_and_recreate) as done:
        r = superuser_api.delete(f"{API}/{name}")
    # then this DELETE answers 404 and the new queue keeps its managers and its messages
    assert done
    assert_error(r, 404, "queue_not_found")
    assert sorted(m.index for m in runtime.local_managers(name)) == [0, 1]
    assert sorted(drain(superuser_api, name)) == [f"new{i}" for i in range(4)]


def test_dequeue_racing_delete_answers_without_the_deleted_messages(superuser_api, make_queue):
    # given a queue with messages
    name = make_queue(partitions=1)
    enqueue(superuser_api, name, 5)
    # when it is deleted between the dequeue taking messages and reading their bodies
    with before_once(PartitionManager, "load_bodies", lambda: delete(name)) as done:
        r = superuser_api.post(f"{API}/{name}/dequeue", {"max": 5}, format="json")
    # then the dequeue answers (what it took is ordered before the delete), and from then on
    # the queue does not exist
    assert done
    assert r.status_code == 200, r.content
    assert_error(
        ack(superuser_api, name, r.json()["messages"] or [{"id": f"{name}/0/x/0", "receipt": "r"}]),
        404,
        "queue_not_found",
    )
    assert_error(superuser_api.post(f"{API}/{name}/dequeue", {}, format="json"), 404, "queue_not_found")


def test_a_description_read_while_the_queue_is_deleted_is_not_kept(superuser_api, make_queue, runtime):
    # given a queue this node does not hold a description of (as after a restart)
    name = make_queue(partitions=1)
    runtime.queues.pop(name)
    # when it is deleted after rt.queue(name) read its row but before it kept the description
    with after_once(catalog, "config_from_row", lambda: delete(name)) as done:
        r = superuser_api.post(f"{API}/{name}/enqueue", {"body": "x"}, format="json")
    # then the enqueue answers 404 and the deleted queue is not served from memory
    assert done
    assert_error(r, 404, "queue_not_found")
    assert name not in runtime.queues
    assert_error(superuser_api.post(f"{API}/{name}/enqueue", {"body": "x"}, format="json"), 404, "queue_not_found")


def test_calls_on_a_stale_description_of_a_deleted_queue_answer_404(superuser_api, make_queue, runtime):
    # given a queue with a message in flight, deleted while another node (here: this one's
    # memory, put back) still held its description
    name = make_queue(partitions=2)
    enqueue(superuser_api, name, 2)
    got = superuser_api.post(f"{API}/{name}/dequeue", {"max": 1}, format="json").json()["messages"]
    stale = runtime.queues[name]
    delete(name)
    runtime.queues[name] = stale
    # when a client enqueues or acks through that description
    enqueued = superuser_api.post(f"{API}/{name}/enqueue", {"body": "late", "group": "g"}, format="json")
    ungrouped = superuser_api.post(f"{API}/{name}/enqueue", {"body": "late"}, format="json")
    acked = ack(superuser_api, name, got)
    # then the queue does not exist (404), rather than "retry" (503) for ever
    assert_error(enqueued, 404, "queue_not_found")
    assert_error(ungrouped, 404, "queue_not_found")
    assert_error(acked, 404, "queue_not_found")


def test_another_node_drops_its_managers_of_a_deleted_and_recreated_queue_at_its_next_pass(
    superuser_api, make_queue, runtime, settings
):
    # given a second node holding partitions of a queue
    other = NodeRuntime("other-node", background=False).start()
    try:
        name = make_queue(partitions=2)
        other.tick()
        runtime.tick()
        assert other.local_managers(name), "the other node should hold a partition"
        # when the queue is deleted here and created again under the same name
        delete(name)
        make_queue(name=name, partitions=2)
        other.tick()
        # then the other node serves no manager of the old queue any more (whose memory would
        # deliver deleted messages, and whose writes could land in the new queue's keys)
        current = set(Partition.objects.filter(queue__name=name).values_list("pk", flat=True))
        assert all(m.lease.partition_id in current for m in other.local_managers(name))
        runtime.tick()
        other.tick()
        enqueue(superuser_api, name, 10, prefix="new")
        assert len(drain(superuser_api, name)) == 10
    finally:
        other.stop(release=True)


# --- partition growth ---------------------------------------------------------------------------
def test_growth_racing_delete_answers_404(superuser_api, make_queue):
    # given
    name = make_queue(partitions=2)
    # when the queue is deleted between the PATCH's read of it and its change
    with after_once(service, "get_queue", lambda: delete(name)) as done:
        r = superuser_api.patch(f"{API}/{name}", {"partitions": 4}, format="json")
    # then
    assert done
    assert_error(r, 404, "queue_not_found")


def test_growth_racing_growth_answers_409(superuser_api, make_queue):
    # given a queue of 2 partitions
    name = make_queue(partitions=2)

    def grow_to_6():
        assert superuser_api.patch(f"{API}/{name}", {"partitions": 6}, format="json").status_code == 200

    # when another PATCH grows it to 6 between this PATCH's read (2) and its change (to 4)
    with after_once(service, "get_queue", grow_to_6) as done:
        r = superuser_api.patch(f"{API}/{name}", {"partitions": 4}, format="json")
    # then this one is told the queue changed meanwhile, and nothing shrank
    assert done
    assert_error(r, 409, "partitions_changed")
    assert Queue.objects.get(name=name).partitions == 6
    assert Partition.objects.filter(queue__name=name).count() == 6


def test_growth_while_dequeuing_loses_nothing(superuser_api, make_queue, runtime):
    # given a queue of 2 partitions with grouped messages
    name = make_queue(partitions=2)
    r = superuser_api.post(
        f"{API}/{name}/enqueue",
        {"messages": [{"body": f"a{i}", "group": f"g{i % 5}"} for i in range(20)]},
        format="json",
    )
    assert r.status_code == 201, r.content

    def grow():
        assert superuser_api.patch(f"{API}/{name}", {"partitions": 5}, format="json").status_code == 200

    # when the queue grows while a dequeue is reading bodies
    with before_once(PartitionManager, "load_bodies", grow) as done:
        first = superuser_api.post(f"{API}/{name}/dequeue", {"max": 3}, format="json")
    # then that dequeue answers, and every message (old and new) is delivered
    assert done
    assert first.status_code == 200, first.content
    got = first.json()["messages"]
    assert ack(superuser_api, name, got).status_code == 200
    r = superuser_api.post(
        f"{API}/{name}/enqueue",
        {"messages": [{"body": f"b{i}", "group": f"g{i % 7}"} for i in range(20)]},
        format="json",
    )
    assert r.status_code == 201, r.content
    rest = drain(superuser_api, name)
    assert sorted([m["body"] for m in got] + rest) == sorted(
        [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
    )


# --- create -------------------------------------------------------------------------------------
def test_create_racing_create_answers_409(superuser_api, unique_name):
    # given
    name = unique_name()
    from queues.api.serializers import QueueSerializer

    # when another client creates the same name after this one's request was checked
    with after_once(
        QueueSerializer, "is_valid", lambda: service.create_queue(name=name, partitions=1, caller=SYSTEM)
    ) as done:
        r = superuser_api.post(API, {"name": name, "partitions": 2}, format="json")
    # then
    assert done
    assert_error(r, 409, "already_exists")
    assert Queue.objects.get(name=name).partitions == 1


# --- redrive ------------------------------------------------------------------------------------
def _dead_letters(superuser_api, make_queue, n: int) -> tuple[str, str]:
    dlq = make_queue(partitions=1)
    source = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    enqueue(superuser_api, source, n)
    assert (
        len(
            superuser_api.post(f"{API}/{source}/dequeue", {"max": n, "visibility_timeout": 0}, format="json").json()[
                "messages"
            ]
        )
        == n
    )
    superuser_api.post(f"{API}/{source}/dequeue", {"max": n}, format="json")  # past max_receives: moved
    assert (
        len(
            superuser_api.post(f"{API}/{dlq}/dequeue", {"max": n, "visibility_timeout": 0}, format="json").json()[
                "messages"
            ]
        )
        == n
    )
    return dlq, source


def test_redrive_racing_purge_of_the_dead_letter_queue(superuser_api, make_queue, runtime):
    # given a dead-letter queue holding 4 messages of its source
    dlq, source = _dead_letters(superuser_api, make_queue, 4)

    def purge():
        assert superuser_api.post(f"{API}/{dlq}/purge", {}, format="json").status_code == 200

    # when the dead-letter queue is purged while the redrive moves them
    with before_once(service.operations, "enqueue", purge) as done:
        r = superuser_api.post(f"{API}/{dlq}/redrive", {"max": 10}, format="json")
    # then the redrive answers: what it moved is in the source, nothing is left in the DLQ
    assert done
    assert r.status_code in (200, 503), r.content
    if r.status_code == 200:
        assert r.json()["moved"] == 4
        assert sorted(drain(superuser_api, source)) == [f"m{i}" for i in range(4)]
    else:
        assert r["Retry-After"]
    assert drain(superuser_api, dlq) == []


def test_redrive_racing_delete_of_the_source_answers_404(superuser_api, make_queue, runtime):
    # given a dead-letter queue holding 3 messages of its source
    dlq, source = _dead_letters(superuser_api, make_queue, 3)
    # when the source is deleted while the redrive moves them back
    with before_once(service.operations, "enqueue", lambda: delete(source)) as done:
        r = superuser_api.post(f"{API}/{dlq}/redrive", {"max": 10}, format="json")
    # then the redrive says which queue is missing, and the dead letters stay in the DLQ
    assert done
    assert_error(r, 404, "queue_not_found")
    assert source in r.json()["detail"]
    figures = service.queue_stats(dlq, caller=SYSTEM)
    assert figures["depth"] + figures["in_flight"] == 3


def test_redrive_racing_delete_of_the_dead_letter_queue(superuser_api, make_queue, runtime):
    # given a dead-letter queue holding 3 messages of its source
    dlq, source = _dead_letters(superuser_api, make_queue, 3)
    # when the dead-letter queue itself is deleted while the redrive moves its messages
    with before_once(service.operations, "enqueue", lambda: delete(dlq)) as done:
        r = superuser_api.post(f"{API}/{dlq}/redrive", {"max": 10}, format="json")
    # then the redrive answers (what it moved is in the source) or says the queue is gone
    assert done
    assert r.status_code in (200, 404, 503), r.content
    if r.status_code == 200:
        assert sorted(drain(superuser_api, source)) == [f"m{i}" for i in range(3)]
    elif r.status_code == 404:
        assert r.json()["error"] == "queue_not_found"
    else:
        assert r["Retry-After"]


# --- subscriptions ------------------------------------------------------------------------------
def _topic(superuser_api, unique_name) -> str:
    name = unique_name("t")
    r = superuser_api.post("/api/v1/topics", {"name": name, "partitions": 1}, format="json")
    assert r.status_code == 201, r.content
    return name


def test_subscription_racing_delete_of_its_topic_answers_404(superuser_api, unique_name):
    # given a topic
    topic = _topic(superuser_api, unique_name)
    # when the topic is deleted between the request's read of it and the subscription's insert
    with after_once(service, "get_queue", lambda: delete_topic(topic)) as done:
        r = superuser_api.post(f"/api/v1/topics/{topic}/subscriptions", {"name": "s"}, format="json")
    # then
    assert done
    assert_error(r, 404, "queue_not_found")


def test_subscription_racing_the_same_subscription_answers_409(superuser_api, unique_name):
    # given a topic
    topic = _topic(superuser_api, unique_name)

    def same():
        service.create_subscription(service.get_queue(topic, Queue.Kind.TOPIC, caller=SYSTEM), name="s", caller=SYSTEM)

    # when another client creates the same subscription meanwhile
    with after_once(service, "get_queue", same) as done:
        r = superuser_api.post(f"/api/v1/topics/{topic}/subscriptions", {"name": "s"}, format="json")
    # then
    assert done
    assert_error(r, 409, "subscription_exists")


def delete_topic(name: str) -> None:
    service.delete_queue(service.get_queue(name, Queue.Kind.TOPIC, caller=SYSTEM), caller=SYSTEM)


def test_a_retried_dedup_id_after_delete_and_recreate_is_a_new_message(superuser_api, make_queue):
    # given a message enqueued with a dedup_id
    name = make_queue(partitions=1)
    [old_id] = enqueue(superuser_api, name, 1, prefix="old", dedup_id="order-7")
    # when the queue is deleted, created again under the name, and the producer retries
    delete(name)
    make_queue(name=name, partitions=1)
    [new_id] = enqueue(superuser_api, name, 1, prefix="new", dedup_id="order-7")
    # then the retry is a new message of the new queue, not the ID of one that went with the old
    assert new_id != old_id
    assert drain(superuser_api, name) == ["new0"]


def test_a_refresh_racing_a_change_keeps_the_newer_description(superuser_api, make_queue, runtime, monkeypatch):
    # given a queue of 2 partitions described on this node
    name = make_queue(partitions=2)
    assert runtime.queue(name).partitions == 2
    configs = catalog.load

    def stale_configs(only=None):
        if only is not None:
            return configs(only)  # (the change's own read of its queue)
        # the housekeeping pass reads the rows (2 partitions) ... then the queue grows here
        # before the pass stores what it read
        read = {n: cfg for n, cfg in configs().items() if n == name}
        r = superuser_api.patch(f"{API}/{name}", {"partitions": 3}, format="json")
        assert r.status_code == 200, r.content
        return read

    monkeypatch.setattr(catalog, "load", stale_configs)
    runtime.refresh_queues()
    monkeypatch.setattr(catalog, "load", configs)
    # then the node keeps the grown queue's description, not the rows read before the change
    # (with those, an ID of partition 2 was refused as "no partition 2" until the next pass)
    assert runtime.queue(name).partitions == 3
    fake = f"{name}/2/00000001-0000000000000000/0"
    r = superuser_api.post(
        f"{API}/{name}/visibility", {"id": fake, "receipt": "x" * 16, "visibility_timeout": 5}, format="json"
    )
    assert r.status_code != 400, r.content
    # and the next pass, which reads after the change, agrees
    runtime.refresh_queues()
    assert runtime.queue(name).partitions == 3


def test_a_stale_owners_write_racing_delete_and_recreate_never_lands_in_the_new_queue(tmp_path, runtime, unique_name):
    """The filesystem store (the embedded default): a stale owner's write has passed the fence
    check when the queue is deleted (its directory and fence lock file with it) and created
    again under the name; the write then goes on. It must not land among the new queue's keys,
    where the new owner's scans (blocks, receive counts, the archive journal) would find it."""
    from queues.engine.ids import StoredMessage
    from queues.kv.filesystem import FileStore

    root = tmp_path / "kv"
    store = FileStore(root).within("mq:")
    here = NodeRuntime("file-node", store=store, background=False).start()
    other = NodeRuntime("other-node", store=store, background=False).start()
    service.set_runtime(here)
    try:
        # given a queue whose partition the other node holds, with a writable head block
        name = unique_name()
        service.create_queue(caller=SYSTEM, name=name, partitions=1)
        here.release_partition(name, 0)
        other.tick()
        stale = other.manager(name, 0)
        [first] = stale.enqueue([StoredMessage("before", 0.0)])
        old_block = first.split("/")[2]

        def delete_and_recreate() -> None:
            delete(name)
            service.create_queue(caller=SYSTEM, name=name, partitions=1)
            here.hold_off.clear()
            here.tick()
            here.manager(name, 0).enqueue([StoredMessage("new", 0.0)])

        # when the other node's next write is under way (fence checked) as the queue is deleted
        # and created again here (the other node is not told)
        with before_once(FileStore, "_write_atomically", delete_and_recreate) as done:  # noqa: SIM117 - the patch applies only inside the store it patches
            with contextlib.suppress(Exception):
                stale.enqueue([StoredMessage("racing", 0.0)])
        # then nothing of the old queue's block lies among the new queue's keys
        assert done
        new = here.manager(name, 0)
        files = [p for p in root.rglob("*") if p.is_file()]
        new_tree = next(p.parent.parent for p in files if p.parent.name == "_blocks" and p.name in new.blocks)
        assert [str(p) for p in new_tree.rglob("*") if old_block in str(p)] == []
        # and the new queue serves only its own message
        got = service.dequeue(name, caller=SYSTEM, max_messages=10)
        assert [d.message.body for d in got if d.message is not None] == ["new"]
    finally:
        service.set_runtime(runtime)
        other.stop(release=False)
        here.stop(release=False)


@pytest.mark.parametrize("removal", ["purge", "delete"])
def test_a_node_not_told_of_a_purge_or_delete_delivers_nothing_it_removed(
    superuser_api, make_queue, runtime, monkeypatch, removal
):
    """The node holding a partition is not told of a purge or delete: the call to it fails;
    or a purge under way has cleared the partition's owner, so a delete racing it names no
    owner to tell and the purge then answers 404 before telling anyone; or it was still
    opening the partition when the others were told. Its manager keeps the messages' IDs in
    memory and their bodies in the node's cache, and fences stop only writes: a first
    delivery writes nothing. A dequeue reaching that node after the answer (a client's, or
    one forwarded by another node, which asks the owners of the re-created queue) must
    deliver nothing the purge or delete removed."""
    from queues.engine.ids import StoredMessage
    from queues.service.peers import get_peers

    other = NodeRuntime("other-node", background=False).start()
    try:
        # given a queue whose only partition the other node holds, with messages it enqueued
        name = make_queue(partitions=1)
        runtime.release_partition(name, 0)
        other.tick()
        stale = other.manager(name, 0)
        old = stale.enqueue([StoredMessage(f"old{i}", 0.0) for i in range(3)])
        told: list[str] = []

        def unreachable(address: str, queue: str) -> None:
            told.append(address)
            raise ConnectionError(f"{address} is unreachable")

        monkeypatch.setattr(get_peers(), "close_purged", unreachable)
        # when the queue is purged, or deleted and created again, through this node, which
        # cannot tell the other one
        if removal == "purge":
            r = superuser_api.post(f"{API}/{name}/purge", {}, format="json")
            assert r.status_code == 200, r.content
        else:
            delete(name)
            make_queue(name=name, partitions=1)
        assert told == ["other-node"]
        # then a dequeue that reaches the other node (forwarded: it answers from its own
        # partitions) delivers none of the removed messages
        service.set_runtime(other)
        try:
            got = service.dequeue(name, caller=SYSTEM, max_messages=10, hops=1)
        finally:
            service.set_runtime(runtime)
        assert [d.id for d in got if d.id in old] == []
        # and the other node's manager of the removed epoch serves no more
        assert stale.closed
    finally:
        other.stop(release=False)


def test_a_partition_whose_keys_hold_a_fence_already_is_served(superuser_api, make_queue, runtime):
    """A row id is unique in one database, but a database created again (a restore, a test
    database) beside a store that kept its keys hands the ids out again, and a deleted queue
    leaves its fences one past its last epoch: a new partition's first epoch starts past the
    fence its keys hold, or its first claim cannot raise it and no node ever serves it."""
    from queues.engine import keys
    from queues.engine.ids import StoredMessage

    # given a queue of one partition, and a fence already at epoch 5 under the keys its
    # second partition will have
    name = make_queue(partitions=1)
    pk = Queue.objects.get(name=name).pk
    assert runtime.store.within(keys.incarnation(pk)).advance_fence(keys.fence_key(name, 1), 5)
    # when the queue grows to two partitions
    r = superuser_api.patch(f"{API}/{name}", {"partitions": 2}, format="json")
    assert r.status_code == 200, r.content
    runtime.tick()
    # then this node serves both, and a message of the new partition is delivered
    assert {m.index for m in runtime.local_managers(name)} == {0, 1}
    runtime.manager(name, 1).enqueue([StoredMessage("p1", 0.0)])
    assert drain(superuser_api, name) == ["p1"]
