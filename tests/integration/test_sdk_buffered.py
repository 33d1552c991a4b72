"""The SDK's buffered producer and acker (``mq_client.producer``) against real node processes.

Many threads' single messages go as few calls; every future is resolved exactly once (an ID,
its own error, or DeliveryUnknown) even when the node is killed mid-batch; nothing buffered is
lost on close(); a full buffer pushes back; a bad message fails alone; a forked child sends its
own messages, and not its parent's.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

import pytest

import mq_client as sdk
from mq_client import Acker, Client, Producer
from tests.integration.test_sdk import _drain, _name, _record_calls, _served, _wait

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _queue(mq: Client, **settings) -> str:
    name = mq.create_queue(_name("buf"), **settings).name
    _wait(lambda: _served(mq, name), 20, "the node to serve every partition")
    return name


def _enqueue_calls(calls) -> list[int]:
    """The number of messages of each enqueue call recorded."""
    return [len(c[3].get("messages", [c[3]])) for c in calls if c[2].endswith("/enqueue")]


def test_many_threads_single_messages_go_as_few_batches(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=2)
    calls = _record_calls(mq)
    futures: dict[str, Future[str]] = {}
    lock = threading.Lock()

    with Producer(mq, linger=0.05) as producer:

        def sender(t: int) -> None:
            for i in range(50):
                f = producer.send(name, f"t{t}-{i}", attributes={"t": t})
                with lock:
                    futures[f"t{t}-{i}"] = f

        threads = [threading.Thread(target=sender, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # close() (the with block) sent everything and waited for every answer
    assert all(f.done() for f in futures.values())
    ids = {body: f.result() for body, f in futures.items()}
    assert len(set(ids.values())) == 800
    sizes = _enqueue_calls(calls)
    assert sum(sizes) == 800 and len(sizes) < 800 // 4, f"single messages were not batched: {sizes}"
    got = _drain(mq, name, 800)
    assert {m.body: m.id for m in got} == ids
    assert all(m.attributes == {"t": int(m.body[1:].split("-")[0])} for m in got)
    # each thread's messages were stored in the order it sent them (one batch of a queue at a time)
    by_id = {m.id: m for m in got}
    for t in range(16):
        seqs = [by_id[ids[f"t{t}-{i}"]] for i in range(50)]
        same_partition = [m for m in seqs if m.partition == seqs[0].partition]
        assert [m.sequence for m in same_partition] == sorted(m.sequence for m in same_partition)


def test_close_sends_everything_buffered_and_send_refuses_after(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=1)
    producer = Producer(mq, linger=60)  # nothing would go by the linger within the test
    futures = [producer.send(name, f"m{i}") for i in range(1500)]
    # (the first 1,000 fill a batch, which goes at once and may be answered already; the last
    # 500 wait for the linger)
    assert 500 <= producer.buffered <= 1500
    assert not any(f.done() for f in futures[1000:])
    assert producer.close() is True
    assert producer.buffered == 0
    assert len({f.result() for f in futures}) == 1500
    assert mq.stats(name).depth == 1500
    with pytest.raises(RuntimeError):
        producer.send(name, "late")


def test_a_full_buffer_pushes_back(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=1)
    raising = Producer(mq, linger=60, max_buffered=3, block=False)
    held = [raising.send(name, f"m{i}") for i in range(3)]
    with pytest.raises(sdk.BufferFull):
        raising.send(name, "one too many")
    blocking = Producer(mq, linger=60, max_buffered=2, block_timeout=0.2)
    held += [blocking.send(name, f"b{i}") for i in range(2)]
    with pytest.raises(sdk.BufferFull):
        blocking.send(name, "waits, then gives up")

    # a blocked sender goes on as soon as a flush makes room
    blocking.block_timeout = None
    went: list[Future[str]] = []
    waiter = threading.Thread(target=lambda: went.append(blocking.send(name, "after the flush")))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not went, "a full buffer must block the sender"
    assert blocking.flush() is True
    waiter.join(10)
    assert len(went) == 1
    raising.close()
    blocking.close()
    assert all(f.result() for f in [*held, *went])
    assert mq.stats(name).depth == 6


def test_a_bad_message_fails_alone(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=1, max_message_size=1024)
    calls = _record_calls(mq)
    with Producer(mq, linger=60) as producer:
        good = [producer.send(name, f"good-{i}") for i in range(10)]
        # what the client can check fails at once, and no batch carries it
        local = producer.send(name, "x", attributes={f"a{i}": i for i in range(17)})
        assert isinstance(local.exception(0), sdk.BadRequest) and local.exception().code == "invalid_attributes"
        # what only the queue knows (its max_message_size) is refused in a batch: that one fails alone
        too_large = producer.send(name, "y" * 2000)
        good += [producer.send(name, f"good-{i}") for i in range(10, 20)]
    error = too_large.exception()
    assert isinstance(error, sdk.BadRequest) and error.code == "body_too_large"
    ids = [f.result() for f in good]
    assert len(set(ids)) == 20
    assert _enqueue_calls(calls) == [21, 20], "the batch refused whole, then sent again without the bad one"
    got = _drain(mq, name, 20)
    assert sorted(m.body for m in got) == sorted(f"good-{i}" for i in range(20))


def test_every_future_resolved_once_when_the_node_dies_mid_batch(node_factory, token):
    node = node_factory()
    mq = Client(node.url, token, timeout=2, retries=1, backoff=0.05)
    name = _queue(mq, partitions=1)
    resolutions: dict[str, list[object]] = {}
    lock = threading.Lock()
    futures: dict[str, Future[str]] = {}

    def record(body: str, f: Future[str]) -> None:
        with lock:
            resolutions.setdefault(body, []).append(f.exception() or f.result())

    producer = Producer(mq, linger=0.002, dedup_ids=True)
    stop = threading.Event()

    def sender(t: int) -> None:
        i = 0
        while not stop.is_set():
            body = f"t{t}-{i}"
            f = producer.send(name, body)
            futures[body] = f
            f.add_done_callback(lambda f, body=body: record(body, f))
            i += 1

    threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    _wait(lambda: len(resolutions) > 200, 20, "messages to be stored before the kill")
    node.kill()  # mid-batch: senders never stopped
    # a batch in flight at the kill is unknown; one sent after it may be unknown or failed (a
    # refused connection): either way its futures resolve, once
    _wait(lambda: any(not isinstance(r[0], str) for r in list(resolutions.values())), 30, "a batch not stored")
    stop.set()
    for t in threads:
        t.join()
    node.start()
    _wait(lambda: mq.health().status == "ok", 30, "the node back")
    assert producer.close(60) is True
    check_each_resolved_once(mq, name, resolutions, set(futures))


def check_each_resolved_once(mq: Client, name: str, resolutions: dict[str, list[object]], sent: set[str]) -> None:
    """After a node died mid-batch and came back: each message ``sent`` (by body) resolved once,
    to its ID, its own ApiError or DeliveryUnknown (carrying its dedup ID); what the queue holds
    is each ID'd message once, under its ID, and of the unknown ones some or none."""
    assert set(resolutions) == sent
    assert all(len(r) == 1 for r in resolutions.values()), "a future resolved twice"
    stored = {b: r[0] for b, r in resolutions.items() if isinstance(r[0], str)}
    unknown = {b: r[0] for b, r in resolutions.items() if isinstance(r[0], sdk.DeliveryUnknown)}
    failed = {b: r[0] for b, r in resolutions.items() if b not in stored and b not in unknown}
    assert stored and (unknown or failed)
    assert all(isinstance(e, sdk.ApiError) for e in failed.values()), failed
    for body, e in unknown.items():
        assert e.dedup_id and e.queue == name and e.message["body"] == body
    _wait(lambda: _served(mq, name), 30, "the partition served again")
    got = _drain(mq, name, len(stored))
    bodies = [m.body for m in got]
    assert len(bodies) == len(set(bodies)), "a message stored twice"
    assert set(stored) <= set(bodies) <= set(stored) | set(unknown)
    assert {m.body: m.id for m in got if m.body in stored} == stored


def test_a_forked_child_sends_its_own_and_not_its_parents(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=1)
    producer = Producer(mq, linger=60)
    before = producer.send(name, "parent, before the fork")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an empty buffer, threads of its own
        code = 1
        try:
            assert producer.buffered == 0
            f = producer.send(name, "child")
            producer.flush(20)
            mid = f.result(0)
            os.write(write, mid.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child_id = os.read(read, 1000).decode()
    os.close(read)
    assert status == 0 and child_id.startswith(f"{name}/")
    after = producer.send(name, "parent, after the fork")
    assert producer.close() is True
    got = _drain(mq, name, 3)
    assert sorted(m.body for m in got) == ["child", "parent, after the fork", "parent, before the fork"]
    assert {m.body: m.id for m in got}["child"] == child_id
    assert before.result() != after.result()


def test_acks_from_many_threads_go_as_few_calls_and_a_stale_receipt_fails_alone(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=2)
    mq.enqueue_many(name, [f"m{i}" for i in range(400)])
    got = _drain(mq, name, 400)
    stale = got[0]
    mq.give_back(name, stale)
    again = mq.dequeue(name, 1, wait=2)
    assert [m.id for m in again] == [stale.id]
    calls = _record_calls(mq)
    futures: list[Future[None]] = []
    lock = threading.Lock()
    with Acker(mq, linger=0.05) as acker:

        def handler(part: list[sdk.Message]) -> None:
            for m in part:
                f = acker.ack(m)
                with lock:
                    futures.append(f)

        threads = [threading.Thread(target=handler, args=(got[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        moved = acker.change_visibility(again[0], 120).result(10)
    assert moved.visibility_timeout == 120
    errors = [f.exception() for f in futures]
    conflicts = [e for e in errors if e is not None]
    assert len(conflicts) == 1 and isinstance(conflicts[0], sdk.Conflict)
    assert conflicts[0].message_id == stale.id
    acks = [c for c in calls if c[2].endswith("/ack")]
    assert len(acks) < 400 // 4, f"acks were not batched: {len(acks)} calls"
    stats = mq.stats(name)
    assert stats.depth == 0 and stats.in_flight == 1  # the redelivered one, held by its new receipt
    assert mq.ack(name, again).acked == 1


def test_a_prefetching_consumer_handles_each_message_once(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=2, visibility_timeout=30)
    seen: list[str] = []
    lock = threading.Lock()

    def handler(message: sdk.Message) -> None:
        with lock:
            seen.append(message.body)

    # prefetching, then receive-one / ack-one
    for prefetch, count in ((True, 500), (False, 100)):
        mq.enqueue_many(name, [f"{prefetch}-{i}" for i in range(count)])
        consumer = sdk.Consumer(mq, name, handler, threads=8, prefetch=prefetch)
        with consumer:
            _wait(lambda c=consumer, n=count: c.handled >= n, 30, "the messages handled")
        assert consumer.handled == count and consumer.failed == 0
        if prefetch:
            assert consumer.prefetcher.given_back == 0
    assert len(seen) == len(set(seen)) == 600, "a message handled twice"
    stats = mq.stats(name)
    assert stats.depth == 0 and stats.in_flight == 0


def test_a_strict_queue_is_not_prefetched_past_the_handlers(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=1, strict=True)
    mq.enqueue_many(name, [sdk.NewMessage(f"{g}-{i}", group=g) for g in "abcd" for i in range(2)])
    with sdk.Prefetcher(mq, name, wait=0.5) as prefetcher:
        assert prefetcher.strict
        first = prefetcher.get(timeout=10).message
        # the prefetcher held no other group's head: another consumer gets the other three groups
        others = Client(mq.urls, token).dequeue(name, 10, wait=1)
        assert sorted(m.group for m in others) == sorted(set("abcd") - {first.group})
        assert prefetcher.buffered == 0


def test_a_consumer_extends_what_its_handler_still_holds(node_factory, token):
    mq = Client(node_factory().url, token)
    name = _queue(mq, partitions=1)
    mid = mq.enqueue(name, "slow")
    started, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def handler(message: sdk.Message) -> None:
        seen.append(message.id)
        started.set()
        release.wait(30)

    # a visibility timeout of 6 s leaves the heartbeat seconds of slack on a loaded machine
    with sdk.Consumer(mq, name, handler, threads=1, visibility_timeout=6) as consumer:
        assert started.wait(20)
        # three visibility timeouts later the message is still hidden: the heartbeat extended it
        other = Client(mq.urls, token)
        assert other.dequeue(name, 10, wait=18) == []
        release.set()
        _wait(lambda: consumer.handled == 1, 20, "the handler to finish")
    assert seen == [mid]
    stats = mq.stats(name)
    assert stats.depth == 0 and stats.in_flight == 0
