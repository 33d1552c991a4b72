"""The SDK's asyncio client (``mq_client.aio``) against real node processes: every call, typed
results and errors, concurrency on one loop, and a cancelled ``consume`` giving back what it
held and had not yielded."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import mq_client as sdk
from mq_client import Client
from mq_client.aio import AsyncClient
from tests.integration import nodes
from tests.integration.test_sdk import _name, _served, _wait
from tests.integration.test_sdk_buffered import check_each_resolved_once
from tests.launcher import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_every_call_awaited_with_typed_results(node_factory, token):
    node = node_factory()
    name = _name("aio")

    async def scenario() -> None:
        async with AsyncClient(node.url, token) as mq:
            q = await mq.create_queue(name, partitions=2, visibility_timeout=45)
            assert isinstance(q, sdk.Queue) and q.partitions == 2 and q.visibility_timeout == 45
            assert await mq.get_queue(name) == q
            assert name in {x.name for x in await mq.list_queues()}
            assert (await mq.update_queue(name, process_estimate=2.0)).process_estimate == 2.0
            assert (await mq.health()).status == "ok"
            with pytest.raises(sdk.Conflict):
                await mq.create_queue(name)
            with pytest.raises(sdk.NotFound):
                await mq.get_queue(name + "-none")
            with pytest.raises(sdk.BadRequest):
                await mq.enqueue(name, "")

            # many calls at once on one loop
            ids = await asyncio.gather(*(mq.enqueue(name, f"m{i}", attributes={"i": i}) for i in range(50)))
            assert len(set(ids)) == 50
            ids += await mq.enqueue_batch(name, ["a", sdk.NewMessage("b", group="g"), {"body": "c"}])
            got: list[sdk.Message] = []
            while len(got) < 53:
                got += await mq.dequeue(name, 100, visibility_timeout=60, wait=1)
            assert {m.id for m in got} == set(ids) and all(m.receipt for m in got)
            by_body = {m.body: m for m in got}
            assert by_body["m7"].attributes == {"i": 7} and by_body["b"].group == "g"
            v = await mq.change_visibility(name, by_body["a"], 120)
            assert v == sdk.VisibilityResult(id=by_body["a"].id, visibility_timeout=120)
            await mq.give_back(name, by_body["b"])
            again = await mq.dequeue(name, 5, wait=2)
            assert [m.body for m in again] == ["b"] and again[0].receive_count == 2
            stats = await mq.stats(name)
            assert stats.in_flight == 53 and stats.depth == 0
            rest = [m for m in got if m.body != "b"]
            assert await mq.ack(name, [*rest[:10], again[0]]) == sdk.AckResult(11, 0)
            assert await mq.ack_ids(name, [m.id for m in rest[10:]]) == sdk.AckResult(42, 0)
            assert (await mq.stats(name)).in_flight == 0
            await mq.delete_queue(name)
            with pytest.raises(sdk.NotFound):
                await mq.stats(name)

    asyncio.run(scenario())


def test_a_dead_node_is_skipped_and_acks_go_to_the_owner(node_factory, token):
    node = node_factory()
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sync = Client(node.url, token)
    name = sync.create_queue(_name("aio"), partitions=1).name
    _wait(lambda: _served(sync, name), 20, "the node to serve the partition")

    async def scenario() -> None:
        async with AsyncClient([closed, node.url], token, retries=2, backoff=0.01) as mq:
            mid = await mq.enqueue(name, "x")
            [message] = await mq.dequeue(name, wait=2)
            assert message.id == mid
            assert set((await mq.owners(name)).values()) == {node.url.removeprefix("http://")}
            assert await mq.ack(name, [message]) == sdk.AckResult(1, 0)
        async with AsyncClient(closed, token, retries=1, backoff=0.01) as nowhere:
            with pytest.raises(sdk.ConnectionFailed):
                await nowhere.stats(name)

    asyncio.run(scenario())


def test_the_rest_of_the_sync_clients_calls_awaited(node_factory, token):
    """The calls beyond the message basics, each as the synchronous client makes it:
    ``enqueue_many``, ``receive`` (an async iterator giving back what it did not yield),
    ``heartbeat``, ``send_logs``, ``redrive``, ``expire`` and a subscription's ``get_queue``."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    node = node_factory()
    sync = Client(node.url, token)
    root = User.objects.create(username=_name("root"), is_staff=True, is_superuser=True)
    staff = Token.objects.create(user=root).key
    name, poisoned, dlq = _name("aio"), _name("aio-p"), _name("aio-dlq")
    sync.create_queue(name, partitions=1)
    sync.create_queue(dlq, partitions=1)
    sync.create_queue(poisoned, partitions=1, dead_letter_queue=dlq, max_receives=1)
    _wait(lambda: all(_served(sync, q) for q in (name, poisoned, dlq)), 20, "the node to serve the queues")
    topic = _name("aio-topic")
    admin = nodes.Client(node.url, token)
    assert admin.post("topics", {"name": topic, "partitions": 1, "visibility_timeout": 40}).status_code == 201
    r = admin.post(f"topics/{topic}/subscriptions", {"name": "mail", "visibility_timeout": 7})
    assert r.status_code == 201, r.text

    async def scenario() -> None:
        async with AsyncClient(node.url, token) as mq:
            ids = await mq.enqueue_many(name, [f"m{i}" for i in range(250)], batch_size=100)
            assert len(set(ids)) == 250
            with pytest.raises(ValueError):
                await mq.enqueue_many(name, ["x"], batch_size=1001)

            # receive: as the sync client's, messages one at a time; the rest given back at the end
            seen: list[sdk.Message] = []
            async with contextlib.aclosing(mq.receive(name, 10, visibility_timeout=300, wait=2)) as messages:
                async for message in messages:
                    seen.append(message)
                    if len(seen) == 3:
                        break
            assert [m.body for m in seen] == ["m0", "m1", "m2"]
            assert (await mq.stats(name)).in_flight == 3

            beat = await mq.heartbeat(
                {"consumer": "aio-w", "queues": [name], "held": [{"id": m.id, "receipt": m.receipt} for m in seen]}
            )
            assert sorted(beat["extended"]) == sorted(m.id for m in seen) and beat["lost"] == []
            answer = await mq.send_logs(
                [
                    {
                        "message_id": seen[0].id,
                        "attempt": 1,
                        "outcome": "succeeded",
                        "process_started_at": "2026-01-01T00:00:00+00:00",
                        "process_ended_at": "2026-01-01T00:00:01+00:00",
                    }
                ]
            )
            assert answer == {"stored": 1}, answer
            assert await mq.ack(name, seen) == sdk.AckResult(3, 0)

            # a message received past max_receives (1) goes to the dead-letter queue; redrive
            # moves it back
            poison = await mq.enqueue(poisoned, "poison")
            assert [m.id for m in await mq.dequeue(poisoned, visibility_timeout=0, wait=2)] == [poison]
            deadline = asyncio.get_running_loop().time() + 20
            while (await mq.stats(dlq)).depth != 1:
                assert await mq.dequeue(poisoned, 1, visibility_timeout=300) == []  # dead-letters it
                assert asyncio.get_running_loop().time() < deadline, "no dead letter"
                await asyncio.sleep(0.2)
            result = await mq.redrive(dlq, 10)
            assert result == sdk.RedriveResult(moved=1, skipped=0, sources={poisoned: 1})
            assert [m.body for m in await mq.dequeue(poisoned, wait=2)] == ["poison"]

            with pytest.raises(sdk.Unauthorized):
                await mq.expire(name)  # operators only
            sub = await mq.get_queue(f"{topic}/mail")
            assert sub.name == f"{topic}/mail" and sub.visibility_timeout == 7 and sub.partitions == 1

        async with AsyncClient(node.url, staff) as as_staff:
            assert await as_staff.expire(name, older_than=0) >= 1

    asyncio.run(scenario())


def test_a_cancelled_consume_gives_back_what_it_held(node_factory, token):
    node = node_factory()
    sync = Client(node.url, token)
    name = sync.create_queue(_name("aio"), partitions=1).name
    _wait(lambda: _served(sync, name), 20, "the node to serve the partition")
    ids = sync.enqueue_batch(name, [f"m{i}" for i in range(10)])
    first: list[sdk.Message] = []
    acked: list[str] = []

    async def scenario() -> None:
        async with AsyncClient(node.url, token) as mq:
            handled = asyncio.Event()

            async def consumer() -> None:
                async with contextlib.aclosing(mq.consume(name, batch=5, visibility_timeout=300)) as messages:
                    async for message in messages:
                        first.append(message)
                        handled.set()
                        await asyncio.sleep(3600)  # a handler still at work when cancelled

            task = asyncio.create_task(consumer())
            await asyncio.wait_for(handled.wait(), 20)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            # a loop that ends normally gives back the rest of its batch too
            async with contextlib.aclosing(mq.consume(name, batch=3, visibility_timeout=300)) as messages:
                async for message in messages:
                    await mq.ack(name, [message])
                    acked.append(message.id)
                    break

    asyncio.run(scenario())
    assert [m.id for m in first] == ids[:1]
    # the four received and not yielded were given back at once: delivered again, a second time
    got = sync.dequeue(name, 10, wait=1)
    # all but the one yielded to the cancelled handler (held under its receipt) and the one acked
    assert {m.id for m in got} == set(ids[1:]) - set(acked) and len(got) == 8
    assert {m.id for m in got if m.receive_count > 1} >= set(ids[1:5]) - set(acked)


def test_the_async_producer_batches_and_fails_a_bad_message_alone(node_factory, token):
    from mq_client.aio import AsyncProducer

    node = node_factory()
    sync = Client(node.url, token)
    name = sync.create_queue(_name("aio"), partitions=1, max_message_size=1024).name
    _wait(lambda: _served(sync, name), 20, "the node to serve the partition")
    batches: list[int] = []

    async def scenario() -> tuple[list[str], BaseException | None, BaseException | None]:
        async with AsyncClient(node.url, token) as mq:
            inner = mq.enqueue_batch

            async def counted(queue, messages):
                items = list(messages)
                batches.append(len(items))
                return await inner(queue, items)

            mq.enqueue_batch = counted
            async with AsyncProducer(mq) as producer:

                async def request(i: int) -> str:
                    return await (await producer.send(name, f"m{i}", attributes={"i": i}))

                ids = await asyncio.gather(*(request(i) for i in range(200)))
                local = await producer.send(name, "")
                held = await producer.send(name, "y" * 2000)  # too large for this queue: the node says
                rest = [await producer.send(name, f"after-{i}") for i in range(5)]
            ids += [f.result() for f in rest]
            return ids, local.exception(), held.exception()

    ids, local, too_large = asyncio.run(scenario())
    assert len(set(ids)) == 205
    assert isinstance(local, sdk.BadRequest) and local.code == "empty_body"
    assert isinstance(too_large, sdk.BadRequest) and too_large.code == "body_too_large"
    assert len(batches) < 200 // 4, f"not batched: {batches}"
    assert sync.stats(name).depth == 205


def test_every_async_future_resolved_once_when_the_node_dies_mid_batch(node_factory, token):
    """The threaded producer's test (test_sdk_buffered.py) on one event loop: tasks send without
    stopping, the node is killed and started again; each future resolves once (an ID, its own
    error or DeliveryUnknown carrying its dedup_id), and what was stored is each ID'd message
    once, under its ID."""
    from mq_client.aio import AsyncProducer

    node = node_factory()
    sync = Client(node.url, token)
    name = sync.create_queue(_name("aio"), partitions=1).name
    _wait(lambda: _served(sync, name), 20, "the node to serve the partition")
    resolutions: dict[str, list[object]] = {}
    futures: dict[str, asyncio.Future[str]] = {}

    def record(body: str, f: asyncio.Future[str]) -> None:
        resolutions.setdefault(body, []).append("cancelled" if f.cancelled() else f.exception() or f.result())

    async def until(done, seconds: float, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + seconds
        while not done():
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def scenario() -> bool:
        async with AsyncClient(node.url, token, timeout=2, retries=1, backoff=0.05) as mq:
            producer = AsyncProducer(mq, linger=0.002, dedup_ids=True)
            stop = asyncio.Event()

            async def sender(t: int) -> None:
                i = 0
                while not stop.is_set():
                    body = f"t{t}-{i}"
                    f = await producer.send(name, body)
                    futures[body] = f
                    f.add_done_callback(lambda f, body=body: record(body, f))
                    i += 1
                    await asyncio.sleep(0)

            tasks = [asyncio.create_task(sender(t)) for t in range(4)]
            await until(lambda: len(resolutions) > 200, 20, "messages to be stored before the kill")
            await asyncio.to_thread(node.kill)  # mid-batch: the senders never stopped
            await until(lambda: any(not isinstance(r[0], str) for r in resolutions.values()), 30, "a batch not stored")
            stop.set()
            await asyncio.gather(*tasks)
            await asyncio.to_thread(node.start)
            await asyncio.to_thread(_wait, lambda: sync.health().status == "ok", 30, "the node back")
            return await producer.close(60)

    assert asyncio.run(scenario()) is True
    assert not [b for b, r in resolutions.items() if r[0] == "cancelled"]
    check_each_resolved_once(sync, name, resolutions, set(futures))


def test_the_async_client_traces_as_the_sync_client_does(node_factory, token, tmp_path, exporter):
    # given a node writing its spans, and an asyncio client tracing into memory
    import json

    node = node_factory(TRACES_EXPORT="jsonl", TRACES_FILE=str(tmp_path / "node.jsonl"))
    name = _name("aio-traced")
    Client(node.url, token).create_queue(name, partitions=1)
    tracer = exporter.tracer

    async def task(i: int, mq: AsyncClient) -> tuple[str, str]:
        # each task in a trace of its own: the client's spans are current in the task awaiting them
        with tracer.start_as_current_span(f"request {i}") as parent:
            mid = await mq.enqueue(name, f"m{i}")
            await asyncio.sleep(0)  # (the other task runs between the calls)
            return mid, f"{parent.get_span_context().trace_id:032x}"

    async def scenario() -> tuple[list[tuple[str, str]], list[str], list[sdk.Message]]:
        async with AsyncClient(node.url, token, tracer_provider=exporter.provider) as mq:
            sent = await asyncio.gather(task(0, mq), task(1, mq))
            batch = await mq.enqueue_batch(name, ["b0", "b1"])
            got: list[sdk.Message] = []
            while len(got) < 4:
                got += await mq.dequeue(name, 10, visibility_timeout=60, wait=1)
            assert await mq.ack(name, got) == sdk.AckResult(4, 0)
            return sent, batch, got

    sent, batch, got = asyncio.run(scenario())

    spans = exporter.get_finished_spans()
    enqueues = [s for s in spans if s.name == f"enqueue {name}"]
    by_id = {s.attributes.get("messaging.message.id"): s for s in enqueues}
    by_body = {m.body: m for m in got}
    node_spans = [json.loads(line) for line in (tmp_path / "node.jsonl").read_text().splitlines()]
    for i, (mid, trace_id) in enumerate(sent):
        # then each task's enqueue is a PRODUCER span in that task's trace, the child of its span
        span = by_id[mid]
        ctx = span.get_span_context()
        assert span.kind.name == "PRODUCER" and f"{ctx.trace_id:032x}" == trace_id
        assert span.attributes["messaging.operation.type"] == "send"
        # its message carries its context
        assert by_body[f"m{i}"].attributes["traceparent"].split("-")[1:3] == [trace_id, f"{ctx.span_id:016x}"]
        # and the node's enqueue span is its child (the request's traceparent header)
        (at_node,) = [s for s in node_spans if s["name"] == f"enqueue {name}" and s["trace_id"] == trace_id]
        assert at_node["parent_id"] == f"{ctx.span_id:016x}"
    # the batch's span counts its messages, which carry its context
    (batch_span,) = [s for s in enqueues if s.attributes.get("messaging.batch.message_count") == 2]
    bctx = batch_span.get_span_context()
    assert {tuple(by_body[b].attributes["traceparent"].split("-")[1:3]) for b in ("b0", "b1")} == {
        (f"{bctx.trace_id:032x}", f"{bctx.span_id:016x}")
    }
    # the dequeues link to the messages' creation, the ack is a settle span
    receives = [s for s in spans if s.name == f"dequeue {name}"]
    linked = {(link.context.trace_id, link.context.span_id) for s in receives for link in s.links}
    assert linked == {(s.get_span_context().trace_id, s.get_span_context().span_id) for s in enqueues}
    assert all(s.attributes["messaging.operation.type"] == "receive" for s in receives)
    (ack,) = [s for s in spans if s.name == f"ack {name}"]
    assert (
        ack.attributes["messaging.operation.type"] == "settle" and ack.attributes["messaging.batch.message_count"] == 4
    )
    assert len(batch) == 2
