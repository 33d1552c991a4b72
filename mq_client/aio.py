"""The asyncio client: :class:`AsyncClient`, the same calls as :class:`~mq_client.client.Client`
awaited on one event loop, over aiohttp (an optional dependency: ``pip install aiohttp``).

::

    from mq_client.aio import AsyncClient

    async with AsyncClient("http://10.0.0.1:8000", token="...") as mq:
        await mq.enqueue("orders", "hello")
        async with contextlib.aclosing(mq.consume("orders")) as messages:
            async for message in messages:
                ...
                await mq.ack("orders", [message])

It shares the synchronous client's types, errors, retries and backoff (the same generator of
tries, :meth:`mq_client.transport.Transport.attempts`, driven with ``await``), round robin,
node quarantine and owner routing (:class:`~mq_client.routing.OwnerCache`), and its
OpenTelemetry spans and trace context (:mod:`mq_client.tracing`): with an SDK configured (or a
``tracer_provider`` given) an enqueue is a PRODUCER span whose context each message carries, a
dequeue a span linked to its messages' creation, an ack a ``settle`` span, and every request
carries the current context in its ``traceparent`` header. The spans are current in the task
that awaits the call (``contextvars``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import aiohttp

from mq_client import tracing
from mq_client.client import (
    MAX_BATCH,
    MAX_WAIT,
    QUEUE_FIELDS,
    AckItem,
    ClientSettings,
    _chunks,
    _path,
    _q,
    ack_items,
    dequeue_payload,
    expire_payload,
    queue_settings,
    redrive_result,
    single_group,
    subscription_queue,
    visibility_payload,
    visibility_result,
)
from mq_client.errors import (
    ApiError,
    BadRequest,
    BufferFull,
    DeliveryUnknown,
    ServerError,
    Unavailable,
    error_from_answer,
)
from mq_client.ids import group_partition, partition_or_none
from mq_client.producer import (
    DEFAULT_LINGER,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BUFFERED,
    Splitter,
    message_item,
)
from mq_client.transport import API_PREFIX, Done, answer_json, dumps
from mq_client.types import (
    AckResult,
    Estimates,
    Health,
    Message,
    MessageItem,
    NewMessage,
    PartitionOwner,
    Queue,
    RedriveResult,
    Stats,
    VisibilityResult,
    message_json,
)

__all__ = ["AsyncClient", "AsyncProducer"]

#: The exceptions of a request that got no answer: refused, reset, cut short, timed out.
_NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError)


class AsyncClient(ClientSettings):
    """A client of the messaging API for asyncio: :class:`Client`'s calls (a test holds the two
    to the same names and parameters), awaited; the parameters are :class:`Client`'s
    (``tracer_provider`` too), and ``max_connections`` bounds the connections open at once (all
    nodes together). :meth:`aclose` closes it (``async with`` too), :meth:`consume` and
    :meth:`receive` are async iterators."""

    def __init__(
        self,
        urls: str | Sequence[str],
        token: str,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.1,
        *,
        max_backoff: float = 5.0,
        owners_ttl: float = 30.0,
        node_quarantine: float = 2.0,
        user_agent: str = "mq-sdk/1",
        max_connections: int = 100,
        tracer_provider: Any = None,
    ) -> None:
        # The routing state and the tries come from the synchronous transport (it opens no
        # connection of its own unless asked); the requests go through aiohttp.
        super().__init__(
            urls,
            token,
            timeout,
            retries,
            backoff,
            max_backoff=max_backoff,
            owners_ttl=owners_ttl,
            node_quarantine=node_quarantine,
            user_agent=user_agent,
            tracer_provider=tracer_provider,
        )
        #: aiohttp's session, made on the event loop of the first call (it belongs to that loop)
        self._session: aiohttp.ClientSession | None = None
        self._max_connections = max(1, max_connections)

    async def aclose(self) -> None:
        """Close the connections (a later call opens new ones)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        """The session of this client's requests: at most ``max_connections`` open at once."""
        self._session = aiohttp.ClientSession(
            headers=self._transport.headers,
            connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0),
            trust_env=False,
        )
        return self._session

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.urls!r})"

    # ------------------------------------------------------------------ calls

    async def _once(
        self, method: str, base: str, path: str, payload: Any, timeout: float
    ) -> tuple[int, Any, Mapping[str, str]]:
        session = self._session or self._open()
        headers: dict[str, str] | None = None
        if self.tracer is not None:  # the current span's context, for the node's spans to join its trace
            headers = {}
            tracing.inject(headers)
        async with session.request(
            method,
            f"{base}{API_PREFIX}/{path}",
            data=None if payload is None else dumps(payload),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 5.0)),
        ) as r:
            body = await r.read()
        return r.status, answer_json(r.status, body), r.headers

    async def _call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        owner: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> Any:
        """:meth:`Transport.call`, awaited: the same tries, backoff and errors."""
        timeout = self.timeout if timeout is None else timeout
        plan = self._transport.attempts(path, owner, retries)
        step = next(plan)
        while True:
            if isinstance(step, Done):
                return step.answer
            if not isinstance(step, str):
                await asyncio.sleep(step)
                step = plan.send(None)
                continue
            try:
                outcome: Any = await self._once(method, step, path, payload, timeout)
            except _NO_ANSWER as exc:  # refused, reset, timed out
                outcome = f"{type(exc).__name__}: {exc}"
            step = plan.send(outcome)

    # ----------------------------------------------------------------- queues

    async def create_queue(self, name: str, **settings: Any) -> Queue:
        """Create a queue; the settings are :meth:`Client.create_queue`'s keywords."""
        return Queue.from_json(await self._call("POST", "queues", {"name": name, **_settings(settings)}))

    async def update_queue(self, name: str, **changes: Any) -> Queue:
        """Change the settings given (:meth:`Client.update_queue`'s keywords)."""
        queue = Queue.from_json(await self._call("PATCH", f"queues/{_q(name)}", _settings(changes)))
        if "partitions" in changes:
            self._owners.forget(name)
        return queue

    async def get_queue(self, name: str) -> Queue:
        """A queue's settings; for ``"topic/subscription"``, the topic's with the subscription's
        own visibility timeout and dead-letter rule (as :meth:`Client.get_queue`)."""
        topic, slash, sub = name.partition("/")
        if not slash:
            return Queue.from_json(await self._call("GET", f"queues/{_q(name)}"))
        own = await self._call("GET", f"topics/{_q(topic)}/subscriptions/{_q(sub)}")
        return subscription_queue(name, await self._call("GET", f"topics/{_q(topic)}"), own)

    async def list_queues(self) -> list[Queue]:
        return [Queue.from_json(q) for q in await self._call("GET", "queues")]

    async def delete_queue(self, name: str) -> None:
        await self._call("DELETE", f"queues/{_q(name)}")
        self._owners.forget(name)

    async def stats(self, name: str) -> Stats:
        return Stats.from_json(await self._call("GET", _path(name, "stats")))

    async def partitions(self, name: str) -> list[PartitionOwner]:
        """Who serves each partition now; also refreshes the owner cache of the queue."""
        return await self._fetch_owners(name, self.retries)

    async def _fetch_owners(self, name: str, retries: int) -> list[PartitionOwner]:
        payload = await self._call("GET", f"queues/{_q(name.partition('/')[0])}/partitions", retries=retries)
        parts = [PartitionOwner.from_json(p) for p in payload.get("partitions", ())]
        self._owners.store(name, parts)
        return parts

    async def health(self, url: str | None = None) -> Health:
        """The liveness of ``url`` (one node, not retried; default: the next of the round robin)."""
        if url is None:
            return Health.from_json(await self._call("GET", "healthz"))
        status, body, _ = await self._once("GET", url.rstrip("/"), "healthz", None, self.timeout)
        if status != 200:
            raise error_from_answer(status, body if isinstance(body, dict) else {}, url)
        return Health.from_json(body)

    # --------------------------------------------------------------- messages

    async def enqueue(
        self,
        queue: str,
        body: str,
        *,
        group: str | None = None,
        dedup_id: str | None = None,
        delay: float | None = None,
        not_before: float | str | datetime | None = None,
        attributes: Mapping[str, Any] | None = None,
        size: int | None = None,
        estimates: Estimates | Mapping[str, float] | None = None,
        fairness_key: str | None = None,
    ) -> str:
        """Enqueue one message; its ID."""
        item = NewMessage(
            body,
            group=group,
            dedup_id=dedup_id,
            delay=delay,
            not_before=not_before,
            attributes=attributes,
            size=size,
            estimates=estimates,
            fairness_key=fairness_key,
        ).to_json()
        owner = await self._group_owner(queue, [group])
        if self.tracer is not None:
            with tracing.client_span(self.tracer, "send", "enqueue", queue) as span:
                (item,) = tracing.carry([item])
                mid = str((await self._call("POST", _path(queue, "enqueue"), item, owner=owner))["id"])
                span.set_attribute("messaging.message.id", mid)
                return mid
        return str((await self._call("POST", _path(queue, "enqueue"), item, owner=owner))["id"])

    async def enqueue_batch(self, queue: str, messages: Iterable[MessageItem]) -> list[str]:
        """Enqueue up to 1,000 messages in one call; their IDs, in order."""
        items = [message_json(m) for m in messages]
        if not items:
            return []
        if len(items) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} messages per call, got {len(items)}: use enqueue_many")
        owner = await self._group_owner(queue, [i.get("group") for i in items])
        if self.tracer is not None:
            with tracing.client_span(self.tracer, "send", "enqueue", queue, len(items)):
                payload = {"messages": tracing.carry(items)}
                return list((await self._call("POST", _path(queue, "enqueue"), payload, owner=owner))["ids"])
        return list((await self._call("POST", _path(queue, "enqueue"), {"messages": items}, owner=owner))["ids"])

    async def enqueue_many(self, queue: str, messages: Iterable[MessageItem], batch_size: int = MAX_BATCH) -> list[str]:
        """Enqueue any number of messages in calls of ``batch_size`` (<= 1,000), one after the
        other; all IDs, in order. If a call fails, the batches before it are stored (their IDs
        are on the exception as ``exc.ids``) and the ones after it are not sent; a cancelled
        ``enqueue_many`` says nothing of what it stored."""
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH}")
        ids: list[str] = []
        for chunk in _chunks(messages, batch_size):
            try:
                ids.extend(await self.enqueue_batch(queue, chunk))
            except ApiError as exc:
                exc.ids = list(ids)
                raise
        return ids

    async def dequeue(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float = 0,
        node: str | None = None,
    ) -> list[Message]:
        """Receive up to ``max_messages`` (1..1,000); ``wait`` (0..20 s) long-polls for a first
        message; ``node`` (``host:port``, e.g. from a heartbeat's ``take``) is asked first."""
        payload = dequeue_payload(max_messages, visibility_timeout, wait)
        timeout = self.timeout + (wait if isinstance(wait, (int, float)) and wait > 0 else 0)
        owner = self._transport.owner_url(node)
        if self.tracer is not None:
            with tracing.client_span(self.tracer, "receive", "dequeue", queue) as span:
                answer = await self._call("POST", _path(queue, "dequeue"), payload, timeout=timeout, owner=owner)
                messages = [Message.from_json(m) for m in answer.get("messages", ())]
                tracing.link_messages(span, [tracing.context_of(m.attributes) for m in messages])
                return messages
        answer = await self._call("POST", _path(queue, "dequeue"), payload, timeout=timeout, owner=owner)
        return [Message.from_json(m) for m in answer.get("messages", ())]

    async def receive(
        self, queue: str, max_messages: int = 1, *, visibility_timeout: float | None = None, wait: float = MAX_WAIT
    ) -> AsyncGenerator[Message, None]:
        """Messages as they come, long-polling forever (:meth:`Client.receive`); what it
        received and did not yield is given back when the iterator is closed (:meth:`consume`)."""
        async with contextlib.aclosing(
            self.consume(queue, max_messages, visibility_timeout=visibility_timeout, wait=wait)
        ) as messages:
            async for message in messages:
                yield message

    async def consume(
        self, queue: str, batch: int = 10, *, visibility_timeout: float | None = None, wait: float = MAX_WAIT
    ) -> AsyncGenerator[Message, None]:
        """Messages as they come, received ``batch`` at a time, long-polling forever.

        Each message received and not yet yielded is given back (visibility 0) when the
        iteration ends: the loop left and the generator closed (``contextlib.aclosing``), or the
        task cancelled. A receive cancelled while in flight cannot give back what the node may
        have sent it: those messages are delivered again when their visibility timeout ends.
        """
        pending: deque[Message] = deque()
        try:
            while True:
                if not pending:
                    pending.extend(await self.dequeue(queue, batch, visibility_timeout=visibility_timeout, wait=wait))
                    continue
                yield pending.popleft()
        finally:
            if pending:
                # shielded: a second cancellation does not leave them held for their whole timeout
                await asyncio.shield(self._give_back_all(queue, list(pending)))

    async def _give_back_all(self, queue: str, messages: list[Message]) -> None:
        results = await asyncio.gather(*(self.give_back(queue, m) for m in messages), return_exceptions=True)
        del results  # a message not given back is delivered again after its visibility timeout

    async def ack(self, queue: str, messages: Iterable[AckItem]) -> AckResult:
        """Acknowledge delivered messages (items as :meth:`Client.ack` takes them); one call per
        owner node and per 1,000 messages."""
        return await self._ack(queue, "messages", ack_items(messages))

    async def ack_ids(self, queue: str, ids: Iterable[str]) -> AckResult:
        """Acknowledge messages by ID, whoever holds them (not on strict queues)."""
        return await self._ack(queue, "ids", list(ids))

    async def _ack(self, queue: str, key: str, items: list[Any]) -> AckResult:
        if not items:
            return AckResult()
        by_owner: dict[str | None, list[Any]] = {}
        for item in items:
            mid = item["id"] if isinstance(item, dict) else item
            by_owner.setdefault(await self._owner(queue, partition_or_none(mid)), []).append(item)
        if self.tracer is not None:
            with tracing.client_span(self.tracer, "settle", "ack", queue, len(items)):
                return await self._ack_calls(queue, key, by_owner)
        return await self._ack_calls(queue, key, by_owner)

    async def _ack_calls(self, queue: str, key: str, by_owner: dict[str | None, list[Any]]) -> AckResult:
        total = AckResult()
        for owner, owned in by_owner.items():
            for chunk in _chunks(owned, MAX_BATCH):
                answer = await self._call("POST", _path(queue, "ack"), {key: chunk}, owner=owner)
                total = total + AckResult(answer.get("acked", 0), answer.get("not_found", 0))
        return total

    async def change_visibility(
        self, queue: str, message: Message | str, visibility_timeout: float, *, receipt: str | None = None
    ) -> VisibilityResult:
        """Hide a delivered message for ``visibility_timeout`` more seconds (0: deliver it again)."""
        payload = visibility_payload(message, visibility_timeout, receipt)
        owner = await self._owner(queue, partition_or_none(payload["id"]))
        return visibility_result(await self._call("POST", _path(queue, "visibility"), payload, owner=owner), payload)

    async def give_back(self, queue: str, message: Message | str, *, receipt: str | None = None) -> VisibilityResult:
        """Give a delivered message back at once (visibility 0)."""
        return await self.change_visibility(queue, message, 0, receipt=receipt)

    async def redrive(self, dead_letter_queue: str, max_messages: int = 100) -> RedriveResult:
        """Move up to ``max_messages`` dead letters back to the queues they came from."""
        answer = await self._call("POST", f"queues/{_q(dead_letter_queue)}/redrive", {"max": max_messages})
        return redrive_result(answer)

    async def expire(self, queue: str, older_than: float | None = None) -> int:
        """Apply the retention rule now on the node called (staff tokens only); how many expired."""
        answer = await self._call("POST", f"queues/{_q(queue)}/expire", expire_payload(older_than))
        return int(answer.get("expired", 0))

    # --------------------------------------------------------------- consumers

    async def send_logs(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Send attempt log records (``POST /api/v1/logs``); the service's JSON answer."""
        answer: dict[str, Any] = await self._call("POST", "logs", {"records": list(records)})
        return answer

    async def heartbeat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A consumer's heartbeat (``POST /api/v1/consumers/heartbeat``); the answer (instructions)."""
        answer: dict[str, Any] = await self._call("POST", "consumers/heartbeat", dict(payload))
        return answer

    # ---------------------------------------------------------- owner routing

    async def owners(self, queue: str) -> dict[int, str | None]:
        """The cached owner address of each partition of ``queue``; empty if unknown now."""
        if self._owners.ttl <= 0:
            return {}
        cached = self._owners.fresh(queue)
        if cached is not None:
            return cached
        try:
            parts = await self._fetch_owners(queue, 0)  # a shortcut only: not worth retries
        except ApiError:
            self._owners.lookup_failed(queue)
            return {}
        return {p.index: p.address for p in parts}

    async def _owner(self, queue: str, partition: int | None) -> str | None:
        if partition is None:
            return None
        return self._transport.owner_url((await self.owners(queue)).get(partition))

    async def _group_owner(self, queue: str, groups: Sequence[str | None]) -> str | None:
        group = single_group(groups)
        if group is None or self._owners.ttl <= 0:
            return None
        owners = await self.owners(queue)
        if not owners:
            return None
        return self._transport.owner_url(owners.get(group_partition(group, len(owners))))


def _settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`queue_settings` of keywords that must all be settings (as :class:`Client`'s
    signatures have them): ``TypeError`` names any other."""
    unknown = sorted(set(values) - set(QUEUE_FIELDS))
    if unknown:
        raise TypeError(f"not a queue setting: {', '.join(unknown)}")
    return queue_settings(values)


class _Pending:
    __slots__ = ("at", "future", "item", "size")

    def __init__(self, item: dict[str, Any], size: int, future: asyncio.Future[str], at: float) -> None:
        self.item, self.size, self.future, self.at = item, size, future, at


class AsyncProducer:
    """The buffered producer (:class:`mq_client.Producer`) on an :class:`AsyncClient`, for one
    event loop: ``await send(...)`` buffers a message and returns an ``asyncio.Future`` of its
    ID at once; a queue's messages go as one enqueue call while its previous batch is in flight
    or after ``linger``. The settings, the checks, the refusals split down to the message at
    fault and :class:`~mq_client.errors.DeliveryUnknown` are the threaded producer's; ``send``
    waits for room past ``max_buffered`` (up to ``block_timeout``, then ``BufferFull``), or
    raises at once with ``block=False``. ``await close()`` (or ``async with``) sends the rest.
    Nothing flushes it at exit: close it before the loop ends.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        linger: float = DEFAULT_LINGER,
        max_batch: int = MAX_BATCH,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        block: bool = True,
        block_timeout: float | None = None,
        dedup_ids: bool = False,
        max_message_size: int | None = None,
    ) -> None:
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be 1..{MAX_BATCH}")
        self.client = client
        self.linger, self.max_batch, self.max_batch_bytes = linger, max_batch, max_batch_bytes
        self.max_buffered, self.block, self.block_timeout = max_buffered, block, block_timeout
        self.dedup_ids, self.max_message_size = dedup_ids, max_message_size
        self._pending: dict[str, deque[_Pending]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._unresolved: set[asyncio.Future[str]] = set()
        self._room = asyncio.Condition()
        self._flushing = 0
        self._closed = False

    async def send(self, queue: str, body: str, **options: Any) -> asyncio.Future[str]:
        """Buffer one message (the options are :meth:`AsyncClient.enqueue`'s); a future of its ID."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        try:
            item = message_item(body, self.max_message_size, self.dedup_ids, **options)
        except BadRequest as exc:
            future.set_exception(exc)
            return future
        if self._closed:
            raise RuntimeError("AsyncProducer is closed")
        if len(self._unresolved) >= self.max_buffered:
            if not self.block:
                raise BufferFull(f"{len(self._unresolved)} messages buffered, the most allowed (max_buffered)")
            async with self._room:
                try:
                    await asyncio.wait_for(
                        self._room.wait_for(lambda: self._closed or len(self._unresolved) < self.max_buffered),
                        self.block_timeout,
                    )
                except TimeoutError:
                    raise BufferFull(
                        f"still {len(self._unresolved)} messages buffered after {self.block_timeout}s"
                    ) from None
            if self._closed:  # closed while it waited for room
                raise RuntimeError("AsyncProducer is closed")
        self._unresolved.add(future)
        future.add_done_callback(self._done)
        self._pending.setdefault(queue, deque()).append(_Pending(item, len(dumps(item)) + 1, future, loop.time()))
        self._start_sender(queue)
        return future

    def _start_sender(self, queue: str) -> None:
        """A sender for ``queue`` unless one is alive (a sender that ended is replaced)."""
        sender = self._senders.get(queue)
        if sender is None or sender.done():
            self._senders[queue] = asyncio.get_running_loop().create_task(self._send_queue(queue))

    def _done(self, future: asyncio.Future[str]) -> None:
        self._unresolved.discard(future)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def _send_queue(self, queue: str) -> None:
        """The queue's batches, one at a time, while it has messages. Whatever a batch raises
        resolves that batch's futures and the sender goes on with the next."""
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        try:
            while self._pending.get(queue):
                pending = self._pending[queue]
                due = pending[0].at + self.linger - loop.time()
                if due > 0 and not (self._flushing or self._closed) and len(pending) < self.max_batch:
                    await asyncio.sleep(min(due, 0.05))  # (woken early enough by a flush)
                    continue
                batch: list[_Pending] = []
                size = 0
                while pending and len(batch) < self.max_batch:
                    if batch and size + pending[0].size > self.max_batch_bytes:
                        break
                    entry = pending.popleft()
                    if not entry.future.cancelled():
                        batch.append(entry)
                        size += entry.size
                if batch:
                    await self._deliver(queue, batch)
        except asyncio.CancelledError:
            for entry in self._pending.pop(queue, ()):  # never sent
                entry.future.cancel()
            raise
        finally:
            if self._senders.get(queue) is me:
                del self._senders[queue]
            if not self._pending.get(queue):
                self._pending.pop(queue, None)

    async def _deliver(self, queue: str, batch: list[_Pending]) -> None:
        """Send ``batch``, part after part as refusals split it (:class:`~mq_client.producer.Splitter`),
        and resolve every future of it: with its ID, its own error, or ``DeliveryUnknown`` when
        the call may have stored it (5xx, no answer, an error that is not the API's)."""
        splitter: Splitter[_Pending] = Splitter(batch, lambda e: e.item)
        part: list[_Pending] | None = None
        try:
            while (part := splitter.next()) is not None:
                try:
                    ids = await self.client.enqueue_batch(queue, [e.item for e in part])
                except BadRequest as exc:
                    failed = splitter.refused(part, exc)
                    if failed is not None:
                        _set(failed.future, exc=exc)
                except (Unavailable, ServerError) as exc:
                    for e in part:
                        _set(e.future, exc=DeliveryUnknown(queue, e.item, exc))
                except ApiError as exc:  # 401, 403, 404: nothing of it stored, nor would it be
                    for e in part:
                        _set(e.future, exc=exc)
                except Exception as exc:  # noqa: BLE001 - a bug or a library's error: the call may have gone out
                    for e in part:
                        _set(e.future, exc=DeliveryUnknown(queue, e.item, exc))
                else:
                    for e, mid in zip(part, ids):
                        _set(e.future, mid)
        except BaseException as exc:  # cancelled mid-call: it may have gone out; the rest never did
            for e in part or ():
                _set(e.future, exc=DeliveryUnknown(queue, e.item, exc))
            while (rest := splitter.next()) is not None:
                for e in rest:
                    e.future.cancel()
            raise

    async def flush(self, timeout: float | None = None) -> bool:
        """Send what is buffered now, without the linger; wait for its answers. False if some
        did not come within ``timeout`` seconds."""
        waiting = set(self._unresolved)
        if not waiting:
            return True
        self._flushing += 1
        try:
            _, not_done = await asyncio.wait(waiting, timeout=timeout)
            return not not_done
        finally:
            self._flushing -= 1

    async def close(self, timeout: float | None = None) -> bool:
        """Send what is buffered and wait for the answers (each future is resolved, unless
        ``timeout`` passes first: then False); ``send`` refuses afterwards, and a ``send`` still
        waiting for room raises."""
        self._closed = True
        await self._notify()
        for queue, pending in list(self._pending.items()):
            if pending:
                self._start_sender(queue)
        return await self.flush(timeout)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def buffered(self) -> int:
        return len(self._unresolved)


def _set(future: asyncio.Future[str], result: str | None = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert result is not None
        future.set_result(result)
