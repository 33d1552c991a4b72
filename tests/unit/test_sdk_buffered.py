"""The SDK's buffered producer and acker, and its local message checks, against a scripted stub:
how a refused batch is split down to the message at fault, what is reported unknown."""

from __future__ import annotations

import pytest

import mq_client as sdk
from mq_client import Acker, Client, Message, Producer
from mq_client.checks import (
    MAX_ATTRIBUTE_NAME,
    MAX_ATTRIBUTES,
    MAX_DELAY,
    MESSAGE_FIELDS,
    Refusal,
    check_message,
    refused_index,
)
from tests.unit.test_sdk import Stub


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def _client(url: str) -> Client:
    c = Client(url, "tok", retries=1, backoff=0.0)
    c._transport.sleep = lambda seconds: None
    return c


def test_the_local_checks_are_the_services():
    from queues.http import validation
    from queues.public import LIMITS

    assert MESSAGE_FIELDS == validation.MESSAGE_FIELDS
    assert MAX_ATTRIBUTES == validation.MAX_ATTRIBUTES
    assert LIMITS["delay"][1] == MAX_DELAY
    assert sdk.MAX_BATCH == validation.MAX_BATCH


@pytest.mark.parametrize(
    ("item", "code"),
    [
        ({"body": ""}, "empty_body"),
        ({"body": 3}, "invalid_body"),
        ({"body": "\ud800"}, "invalid_body"),
        ({"body": "x", "colour": "red"}, "unknown_field"),
        ({"body": "x", "group": ""}, "invalid_group"),
        ({"body": "x", "dedup_id": "d" * 129}, "invalid_dedup_id"),
        ({"body": "x", "delay": 901}, "out_of_range"),
        ({"body": "x", "delay": 1, "not_before": 5}, "invalid_delay"),
        ({"body": "x", "attributes": {f"a{i}": 1 for i in range(MAX_ATTRIBUTES + 1)}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"n" * (MAX_ATTRIBUTE_NAME + 1): 1}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"a": "v" * 1025}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"a": [1]}}, "invalid_attributes"),
        ({"body": "x", "attributes": {"a": float("nan")}}, "invalid_attributes"),
    ],
)
def test_what_the_api_refuses_is_refused_locally(item, code):
    with pytest.raises(Refusal) as exc:
        check_message(item)
    assert exc.value.code == code


def test_what_the_api_takes_passes_the_local_checks():
    check_message({"body": "é" * 100, "group": "g", "delay": 900, "attributes": {"a": 1, "b": "x", "c": True}})
    check_message({"body": "x" * 1024}, max_message_size=1024)
    with pytest.raises(Refusal) as exc:
        check_message({"body": "é" * 513}, max_message_size=1024)  # 1,026 bytes of UTF-8
    assert exc.value.code == "body_too_large"


def test_the_refused_message_is_read_from_the_detail():
    assert refused_index("messages[12]: body is empty") == 12
    assert refused_index("message: body is empty") is None
    assert refused_index({"name": ["taken"]}) is None


def _enqueued(stub: Stub) -> list[list[str]]:
    return [[m["body"] for m in r["json"]["messages"]] for r in stub.requests if r["path"].endswith("/enqueue")]


def test_a_refusal_naming_a_message_fails_it_and_sends_the_rest(stub):
    stub.answers = [
        (400, {"error": "body_too_large", "detail": "messages[2]: body is 9 bytes"}, {}),
        (200, {"ids": ["q/0/b/0", "q/0/b/1", "q/0/b/2"]}, {}),
    ]
    with Producer(_client(stub.url), linger=60) as producer:
        futures = [producer.send("q", b) for b in ("a", "b", "too large", "c")]
    assert _enqueued(stub) == [["a", "b", "too large", "c"], ["a", "b", "c"]]
    assert [f.result() for f in (futures[0], futures[1], futures[3])] == ["q/0/b/0", "q/0/b/1", "q/0/b/2"]
    assert futures[2].exception().code == "body_too_large"


def test_a_refusal_naming_none_is_split_in_halves_down_to_the_bad_message(stub):
    too_large = (413, {"error": "payload_too_large", "detail": "the request is too large"}, {})
    stub.answers = [too_large, (200, {"ids": ["q/0/b/0", "q/0/b/1"]}, {}), too_large, too_large]
    stub.answers += [(200, {"ids": ["q/0/b/2"]}, {})]
    with Producer(_client(stub.url), linger=60) as producer:
        futures = [producer.send("q", b) for b in ("a", "b", "c", "big")]
    assert _enqueued(stub) == [["a", "b", "c", "big"], ["a", "b"], ["c", "big"], ["c"], ["big"]]
    # the third answer refused [c, big], the fourth [c] alone: c fails, big is then stored
    assert [f.result() for f in futures[:2]] == ["q/0/b/0", "q/0/b/1"]
    assert futures[2].exception().status == 413 and futures[3].result() == "q/0/b/2"


def test_a_batch_that_may_be_stored_is_unknown_with_its_dedup_ids(stub):
    stub.answers = [(503, {"error": "unavailable", "detail": "x"}, {})]
    with Producer(_client(stub.url), linger=60, dedup_ids=True) as producer:
        mine = producer.send("q", "a", dedup_id="mine")
        given = producer.send("q", "b")
    for f in (mine, given):
        error = f.exception()
        assert isinstance(error, sdk.DeliveryUnknown) and not isinstance(error, sdk.ApiError)
        assert isinstance(error.cause, sdk.Unavailable) and error.queue == "q"
    assert mine.exception().dedup_id == "mine" and len(given.exception().dedup_id) == 32
    # the client's own retry sent the same dedup IDs again
    sent = [[m["dedup_id"] for m in r["json"]["messages"]] for r in stub.requests]
    assert len(sent) == 2 and sent[0] == sent[1]

    stub.requests.clear()
    stub.answers = [(404, {"error": "queue_not_found", "detail": "no queue"}, {})]
    with Producer(_client(stub.url), linger=60) as producer:
        lost = [producer.send("q", b) for b in "xyz"]
    assert all(isinstance(f.exception(), sdk.NotFound) for f in lost) and len(stub.requests) == 1
    assert "dedup_id" not in stub.requests[0]["json"]["messages"][0]


def test_a_cancelled_message_is_not_sent(stub):
    stub.answers = [(200, {"ids": ["q/0/b/0"]}, {})]
    with Producer(_client(stub.url), linger=60) as producer:
        dropped = producer.send("q", "never")
        kept = producer.send("q", "kept")
        assert dropped.cancel()
    assert kept.result() == "q/0/b/0" and _enqueued(stub) == [["kept"]]


def test_a_stale_receipt_fails_its_ack_alone(stub):
    conflict = {"error": "receipt_mismatch", "detail": "stale", "id": "q/0/b/1"}
    stub.answers = [(409, conflict, {}), (200, {"acked": 2, "not_found": 0}, {})]
    messages = [Message(id=f"q/0/b/{i}", receipt=f"r{i}", body="x") for i in range(3)]
    client = _client(stub.url)
    client.owners_ttl = 0
    with Acker(client, linger=60) as acker:
        futures = [acker.ack(m) for m in messages]
    sent = [[m["id"] for m in r["json"]["messages"]] for r in stub.requests]
    assert sent == [["q/0/b/0", "q/0/b/1", "q/0/b/2"], ["q/0/b/0", "q/0/b/2"]]
    assert futures[0].result() is None and futures[2].result() is None
    assert isinstance(futures[1].exception(), sdk.Conflict)


class FakeConsumerClient:
    """What a Prefetcher calls of a client: receives answer from ``ready``, give-backs recorded."""

    timeout = 1.0

    def __init__(self, ready: list[Message]):
        self.ready = ready
        self.asked: list[int] = []
        self.given_back: list[str] = []

    def dequeue(self, queue, max_messages, *, visibility_timeout=None, wait=0):
        import time

        self.asked.append(max_messages)
        out, self.ready = self.ready[:max_messages], self.ready[max_messages:]
        if not out:
            time.sleep(0.01)
        return out

    def give_back(self, queue, message):
        self.given_back.append(message.id)


def test_a_buffered_message_that_would_expire_is_given_back_not_handed_out():
    import time

    from mq_client.consumer import _Held

    messages = [Message(id=f"q/0/b/{i}", receipt="r", body=str(i)) for i in range(3)]
    client = FakeConsumerClient([])
    prefetcher = sdk.Prefetcher(client, "q", visibility_timeout=30, strict=False, margin=5, wait=0)
    with prefetcher._cv:
        now = time.monotonic()
        prefetcher._buffer.extend(
            [_Held(messages[0], now + 1), _Held(messages[1], now + 4.9), _Held(messages[2], now + 20)]
        )
    held = prefetcher.get(timeout=1)
    assert held.message is messages[2]
    assert client.given_back == ["q/0/b/0", "q/0/b/1"] and prefetcher.given_back == 2
    prefetcher.close()


def test_the_prefetch_follows_the_handlers_rate_and_holds_nothing_before():
    import time

    client = FakeConsumerClient([Message(id=f"q/0/b/{i}", receipt="r", body=str(i)) for i in range(1000)])
    prefetcher = sdk.Prefetcher(client, "q", visibility_timeout=10, strict=False, max_prefetch=50, wait=0)
    assert prefetcher.target() == 0  # no rate measured: only what a waiting handler asks for
    first = prefetcher.get(timeout=5)
    assert first is not None and client.asked[0] == 1
    # 100 messages handed out a second: half of 10 s of them is 500, capped at max_prefetch
    now = time.monotonic()
    prefetcher._handed.extend([now - 1 + i / 100 for i in range(101)])
    assert prefetcher.target() == 50
    strict = sdk.Prefetcher(client, "q", visibility_timeout=10, strict=True, wait=0)
    strict._handed.extend([now - 1 + i / 100 for i in range(101)])
    assert strict.target() == 0
    prefetcher.close()
    strict.close()


def test_the_asyncio_client_retries_as_the_synchronous_one(stub):
    import asyncio

    from mq_client.aio import AsyncClient

    stub.answers = [
        (503, {"error": "unavailable", "detail": "x"}, {"Retry-After": "0"}),
        (200, {"id": "q/0/b/0"}, {}),
        (400, {"error": "empty_body", "detail": "message: body is empty"}, {}),
    ]

    async def scenario() -> None:
        async with AsyncClient(stub.url, "tok", retries=2, backoff=0.0, owners_ttl=0) as mq:
            assert await mq.enqueue("q", "x") == "q/0/b/0"
            with pytest.raises(sdk.BadRequest) as exc:
                await mq.enqueue("q", "")
            assert exc.value.code == "empty_body"

    asyncio.run(scenario())
    assert len(stub.requests) == 3, "the 503 retried once, the 400 never"
    assert stub.requests[0]["auth"] == "Token tok" and stub.requests[0]["json"] == {"body": "x"}


def test_a_refused_batch_is_split_by_what_the_answer_names():
    from mq_client.producer import split_refused

    batch = [{"body": b} for b in "abcde"]
    named = sdk.BadRequest(400, "empty_body", "messages[3]: body is empty")
    assert split_refused(batch, named, lambda e: e) == (3, [batch[:3] + batch[4:]])
    unnamed = sdk.BadRequest(413, "payload_too_large", "too large")
    assert split_refused(batch, unnamed, lambda e: e) == (None, [batch[:2], batch[2:]])
    assert split_refused(batch[:1], unnamed, lambda e: e) == (0, [])
    acks = [{"id": f"q/0/b/{i}", "receipt": "r"} for i in range(3)]
    stale = sdk.Conflict(409, "receipt_mismatch", "stale", {"id": "q/0/b/2"})
    assert split_refused(acks, stale, lambda e: e) == (2, [acks[:2]])


class FakeEnqueueClient:
    """What a Producer calls of a client: ``enqueue_batch`` refusing the first message whose
    body starts with "bad" (named as the API names it), storing the rest."""

    def __init__(self) -> None:
        import threading

        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def enqueue_batch(self, queue, items):
        bodies = [m["body"] for m in items]
        with self.lock:
            self.calls.append(bodies)
        for i, body in enumerate(bodies):
            if body.startswith("bad"):
                raise sdk.BadRequest(400, "invalid_body", f"messages[{i}]: body is bad")
        return [f"{queue}/0/b/{body}" for body in bodies]


def test_a_batch_of_many_refused_messages_fails_each_without_recursion():
    client = FakeEnqueueClient()
    bodies = [f"bad{i}" for i in range(600)] + ["good"]
    with Producer(client, linger=60) as producer:
        futures = [producer.send("q", b) for b in bodies]
    assert futures[-1].result() == "q/0/b/good"
    errors = [f.exception() for f in futures[:-1]]
    assert all(isinstance(e, sdk.BadRequest) for e in errors), {type(e).__name__ for e in errors}
    assert len(client.calls) <= 2 * len(bodies)


def test_a_few_refused_messages_in_a_large_batch_cost_a_few_calls():
    client = FakeEnqueueClient()
    bodies = [f"m{i}" for i in range(1000)]
    for i in (3, 10, 400, 401, 402, 403, 404, 405, 999):
        bodies[i] = f"bad{i}"
    with Producer(client, linger=60) as producer:
        futures = [producer.send("q", b) for b in bodies]
    for body, future in zip(bodies, futures):
        if body.startswith("bad"):
            assert isinstance(future.exception(), sdk.BadRequest)
        else:
            assert future.result() == f"q/0/b/{body}"
    assert len(client.calls) < 60
    stored = [b for call in client.calls for b in call if not any(c.startswith("bad") for c in call)]
    assert stored == [b for b in bodies if not b.startswith("bad")], "stored once each, in order"


def test_many_stale_receipts_fail_their_acks_alone():
    class FakeAckClient:
        calls = 0

        def ack(self, queue, items):
            self.calls += 1
            for item in items:
                if item["receipt"] == "stale":
                    raise sdk.Conflict(409, "receipt_mismatch", "stale", {"id": item["id"]})

    client = FakeAckClient()
    messages = [Message(id=f"q/0/b/{i}", receipt="stale" if i % 2 else "r", body="x") for i in range(800)]
    with Acker(client, linger=60) as acker:
        futures = [acker.ack(m) for m in messages]
    for i, future in enumerate(futures):
        assert isinstance(future.exception(), sdk.Conflict) if i % 2 else future.result() is None
    assert client.calls <= 2 * len(messages)


def test_a_done_callback_may_send_on_a_full_buffer_and_flush():
    import threading

    client = FakeEnqueueClient()
    sent_again, callback_done = threading.Event(), threading.Event()
    flushed: list[bool] = []
    with Producer(client, linger=0, max_buffered=1, block_timeout=5) as producer:

        def again(future):
            producer.send("q", "second").add_done_callback(lambda f: sent_again.set())
            flushed.append(producer.flush(timeout=5))  # must not wait for its own batch
            callback_done.set()

        producer.send("q", "first").add_done_callback(again)
        assert sent_again.wait(10), "the callback's send() waited for its own batch's slot"
        # ("second" may be answered by another sender thread before this callback's flush returns)
        assert callback_done.wait(10), "the callback's flush() waited"
    assert client.calls == [["first"], ["second"]] and len(flushed) == 1


def test_a_408_is_retried_and_never_splits_a_batch(stub):
    timeout = (408, {"error": "request_timeout", "detail": "the request came too slowly"}, {})
    stub.answers = [timeout, timeout]
    with Producer(_client(stub.url), linger=60) as producer:
        futures = [producer.send("q", b) for b in "ab"]
    assert all(isinstance(f.exception(), sdk.DeliveryUnknown) for f in futures)
    assert _enqueued(stub) == [["a", "b"], ["a", "b"]], "retried whole, never split"


def test_an_async_sender_survives_any_error_and_close_resolves_everything():
    import asyncio

    from mq_client.aio import AsyncProducer

    class Flaky:
        """enqueue_batch: a bug's error on the first call, then a 503, then stores; "bad"
        bodies refused by index as the API does."""

        def __init__(self) -> None:
            self.calls = 0

        async def enqueue_batch(self, queue, items):
            self.calls += 1
            await asyncio.sleep(0)
            if self.calls == 1:
                raise KeyError("a bug in a library")
            if self.calls == 2:
                raise sdk.Unavailable(503, "unavailable", "x")
            for i, item in enumerate(items):
                if item["body"].startswith("bad"):
                    raise sdk.BadRequest(400, "invalid_body", f"messages[{i}]: bad")
            return [f"{queue}/0/b/{item['body']}" for item in items]

    async def scenario() -> None:
        producer = AsyncProducer(Flaky(), linger=0, max_batch=2)
        futures = [await producer.send("q", b) for b in ("a", "b", "c", "d")]
        futures += [await producer.send("q", f"bad{i}") for i in range(400)]
        futures.append(await producer.send("q", "e"))
        assert await asyncio.wait_for(producer.close(), 10)
        assert all(f.done() for f in futures)
        assert [type(f.exception()) for f in futures[:4]] == [sdk.DeliveryUnknown] * 4
        assert isinstance(futures[0].exception().cause, KeyError)
        assert all(isinstance(f.exception(), sdk.BadRequest) for f in futures[4:-1])
        assert futures[-1].result() == "q/0/b/e"
        with pytest.raises(RuntimeError):
            await producer.send("q", "late")

    asyncio.run(scenario())


def test_an_async_send_waiting_for_room_is_refused_once_closed():
    import asyncio

    from mq_client.aio import AsyncProducer

    class Slow:
        async def enqueue_batch(self, queue, items):
            await asyncio.sleep(0.3)
            return [f"{queue}/0/b/{i}" for i, _ in enumerate(items)]

    async def scenario() -> None:
        producer = AsyncProducer(Slow(), linger=0, max_buffered=1)
        first = await producer.send("q", "a")
        waiting = asyncio.ensure_future(producer.send("q", "b"))
        await asyncio.sleep(0.05)
        assert await producer.close(5)
        with pytest.raises(RuntimeError):
            await waiting
        assert first.result() == "q/0/b/0" and producer.buffered == 0

    asyncio.run(scenario())


def test_a_burst_of_hand_outs_is_no_rate():
    import time

    prefetcher = sdk.Prefetcher(
        FakeConsumerClient([]), "q", visibility_timeout=10, strict=False, max_prefetch=50, wait=0
    )
    now = time.monotonic()
    prefetcher._handed.extend([now - 0.001 * (8 - i) for i in range(8)])  # 8 handlers starting together
    assert prefetcher.target() <= 8
    prefetcher.close()


class LateClient(FakeConsumerClient):
    """Its receive answers after ``late`` seconds (a long poll that waited)."""

    late = 3.0

    def dequeue(self, queue, max_messages, *, visibility_timeout=None, wait=0):
        import time

        out = super().dequeue(queue, max_messages, visibility_timeout=visibility_timeout, wait=wait)
        if out:
            time.sleep(self.late)
        return out


def test_a_message_answered_late_in_a_poll_keeps_its_whole_visibility():
    import time

    client = LateClient([Message(id="q/0/b/0", receipt="r", body="x")])
    prefetcher = sdk.Prefetcher(client, "q", visibility_timeout=4, strict=False, margin=1.5, wait=0)
    held = prefetcher.get(timeout=10)
    assert held is not None and client.given_back == []
    assert held.deadline - time.monotonic() > 3
    prefetcher.close()


def test_a_strict_prefetcher_gives_back_what_arrives_for_nobody():
    import time

    client = LateClient([Message(id=f"q/0/b/{i}", receipt="r", body=str(i)) for i in range(3)])
    client.late = 0.5
    prefetcher = sdk.Prefetcher(client, "q", visibility_timeout=30, strict=True, wait=0)
    assert prefetcher.get(timeout=0.1) is None  # gone before the receive answered
    deadline = time.monotonic() + 5
    while not client.given_back and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.given_back == ["q/0/b/0"] and prefetcher.buffered == 0
    prefetcher.close()


def test_the_prefetch_thread_survives_an_error_that_is_not_the_apis():
    class Broken(FakeConsumerClient):
        fails = 2

        def dequeue(self, queue, max_messages, *, visibility_timeout=None, wait=0):
            if self.fails:
                self.fails -= 1
                raise ValueError("a bug in a library")
            return super().dequeue(queue, max_messages, visibility_timeout=visibility_timeout, wait=wait)

    client = Broken([Message(id="q/0/b/0", receipt="r", body="x")])
    prefetcher = sdk.Prefetcher(client, "q", visibility_timeout=30, strict=False, wait=0.1)
    held = prefetcher.get(timeout=5)
    assert held is not None and held.message.id == "q/0/b/0"
    prefetcher.close()


def test_a_handler_raising_a_base_exception_gives_its_message_back():
    import asyncio
    import time

    class Client_(FakeConsumerClient):
        def __init__(self, ready):
            super().__init__(ready)
            self.acked: list[str] = []
            self.extended: list[str] = []

        def ack(self, queue, items):
            self.acked += [i["id"] if isinstance(i, dict) else i.id for i in items]

        def change_visibility(self, queue, message, seconds):
            if seconds == 0:
                self.given_back.append(message.id)
            else:
                self.extended.append(message.id)

    def handler(message):
        if message.body == "cancel":
            raise asyncio.CancelledError
        return None

    messages = [Message(id="q/0/b/0", receipt="r", body="cancel"), Message(id="q/0/b/1", receipt="r", body="ok")]
    client = Client_(messages)
    consumer = sdk.Consumer(client, "q", handler, threads=1, visibility_timeout=30, strict=False)
    with consumer:
        deadline = time.monotonic() + 5
        while consumer.handled + consumer.failed < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert consumer._held == {}
    assert consumer.failed == 1 and consumer.handled == 1, "the worker lived on"
    assert client.given_back == ["q/0/b/0"] and client.acked == ["q/0/b/1"]


def test_a_forked_child_does_not_hand_out_the_parents_buffer():
    import os
    import time

    from mq_client.consumer import _Held

    prefetcher = sdk.Prefetcher(FakeConsumerClient([]), "q", visibility_timeout=30, strict=False, wait=0)
    with prefetcher._cv:
        prefetcher._buffer.append(_Held(Message(id="q/0/b/0", receipt="r", body="x"), time.monotonic() + 30))
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it got nothing of the parent's
        try:
            os._exit(0 if prefetcher.get(timeout=0.2) is None else 1)
        except BaseException:  # noqa: BLE001 - a child must never return into pytest
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert prefetcher.get(timeout=1).message.id == "q/0/b/0", "the parent keeps its own"
    prefetcher.close()
