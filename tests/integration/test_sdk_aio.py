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
from tests.integration.test_sdk import _name, _served, _wait
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
