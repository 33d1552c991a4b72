"""The client: one method per call of the messaging API, typed results, batching, owner routing.

How calls are sent and retried is :mod:`mq_client.transport`; which node owns a partition is
:mod:`mq_client.routing`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Self, TypeVar
from urllib.parse import quote

from mq_client import tracing
from mq_client.errors import ApiError, error_from_answer
from mq_client.ids import group_partition, partition_or_none
from mq_client.routing import OwnerCache
from mq_client.transport import Transport
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

__all__ = ["MAX_BATCH", "MAX_WAIT", "Client", "ClientSettings"]

#: The API's limit on messages per enqueue call, IDs per ack call and messages per dequeue.
MAX_BATCH = 1000
#: The API's limit on a dequeue's long poll, in seconds.
MAX_WAIT = 20

_T = TypeVar("_T")
_UNSET: Any = object()
#: The settings of a queue, as the create and update calls take them.
QUEUE_FIELDS = (
    "partitions",
    "block_size",
    "lease_period",
    "visibility_timeout",
    "max_message_size",
    "retention",
    "strict",
    "group_batch",
    "dead_letter_queue",
    "max_receives",
    "dedup_window",
    "delay",
    "preprocess_estimate",
    "process_estimate",
    "archive",
)


class ClientSettings:
    """What :class:`Client` and :class:`~mq_client.aio.AsyncClient` share besides their calls:
    the construction (the transport's routing state and tries, the owner cache, the tracer),
    :meth:`from_env`, the settings (read and changed on the transport and the owner cache that
    use them) and the owner cache's :meth:`forget_owners`."""

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
        tracer_provider: Any = None,
    ) -> None:
        """The parameters are :class:`Client`'s."""
        self._transport = Transport(
            urls.split(",") if isinstance(urls, str) else urls,
            token,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            node_quarantine=node_quarantine,
            user_agent=user_agent,
            on_owner_failed=self._forget_owner_of,
        )
        self._owners = OwnerCache(owners_ttl)
        self.token = token
        #: the OpenTelemetry tracer of this client's spans; None (no span, no trace context
        #: added) unless an SDK is configured when the client is made, or ``tracer_provider`` given
        self.tracer = tracing.tracer(tracer_provider) if tracer_provider is not None or tracing.enabled() else None
        self._transport.traced = self.tracer is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> Self:
        """A client from ``QUEUE_API_URL`` (comma-separated; default ``http://127.0.0.1:8000``) and
        ``QUEUE_API_TOKEN``; ``QUEUE_API_TIMEOUT`` and ``QUEUE_API_RETRIES`` when set."""
        env = os.environ if environ is None else environ
        token = env.get("QUEUE_API_TOKEN", "")
        if not token:
            raise ValueError("QUEUE_API_TOKEN is not set")
        if "timeout" not in options and env.get("QUEUE_API_TIMEOUT"):
            options["timeout"] = float(env["QUEUE_API_TIMEOUT"])
        if "retries" not in options and env.get("QUEUE_API_RETRIES"):
            options["retries"] = int(env["QUEUE_API_RETRIES"])
        return cls(env.get("QUEUE_API_URL") or "http://127.0.0.1:8000", token, **options)

    # The settings, read and changed on the transport and the owner cache that use them.

    @property
    def urls(self) -> list[str]:
        """The nodes of the round robin, in order."""
        return self._transport.urls

    @property
    def scheme(self) -> str:
        """The scheme of the first node's URL, used for the owners' addresses."""
        return self._transport.scheme

    @property
    def timeout(self) -> float:
        return self._transport.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._transport.timeout = value

    @property
    def retries(self) -> int:
        return self._transport.retries

    @retries.setter
    def retries(self, value: int) -> None:
        self._transport.retries = value

    @property
    def backoff(self) -> float:
        return self._transport.backoff

    @backoff.setter
    def backoff(self, value: float) -> None:
        self._transport.backoff = value

    @property
    def max_backoff(self) -> float:
        return self._transport.max_backoff

    @max_backoff.setter
    def max_backoff(self, value: float) -> None:
        self._transport.max_backoff = value

    @property
    def node_quarantine(self) -> float:
        return self._transport.node_quarantine

    @node_quarantine.setter
    def node_quarantine(self, value: float) -> None:
        self._transport.node_quarantine = value

    @property
    def owners_ttl(self) -> float:
        return self._owners.ttl

    @owners_ttl.setter
    def owners_ttl(self, value: float) -> None:
        self._owners.ttl = value

    def forget_owners(self, queue: str | None = None) -> None:
        """Drop the cached owners of ``queue`` (all queues when None)."""
        self._owners.forget(queue)

    def _forget_owner_of(self, path: str) -> None:
        """A call's direct try on its owner failed: the owners of its queue are asked again."""
        if path.startswith("queues/"):
            self.forget_owners(path.split("/")[1])


class Client(ClientSettings):
    """A client of the messaging API over one or more nodes.

    :param urls: base URLs of nodes (``http://host:port``), a list or a comma-separated string
    :param token: an API token (``Authorization: Token <token>``)
    :param timeout: seconds to connect and to wait for an answer (a dequeue's ``wait`` is added)
    :param retries: how many times a call is tried again after a 5xx or a connection error
    :param backoff: the first retry's delay ceiling in seconds; doubles at every retry (full jitter)
    :param max_backoff: the largest delay between two tries, ``Retry-After`` included
    :param owners_ttl: seconds the partition owners of a queue are cached; 0 turns owner routing off
    :param node_quarantine: seconds a node that refused a connection is skipped (doubles, up to 8x)
    :param tracer_provider: the OpenTelemetry ``TracerProvider`` of the client's spans (default:
        the global one, when an SDK is configured; with none the client makes no span)
    """

    def close(self) -> None:
        """Close every thread's connections. The client stays usable (new sessions open)."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.urls!r})"

    # ------------------------------------------------------------------ queues

    def create_queue(
        self,
        name: str,
        *,
        partitions: int = _UNSET,
        block_size: int = _UNSET,
        lease_period: float = _UNSET,
        visibility_timeout: float = _UNSET,
        max_message_size: int = _UNSET,
        retention: float = _UNSET,
        strict: bool = _UNSET,
        group_batch: bool = _UNSET,
        dead_letter_queue: str | None = _UNSET,
        max_receives: int | None = _UNSET,
        dedup_window: float = _UNSET,
        delay: float = _UNSET,
        preprocess_estimate: float | None = _UNSET,
        process_estimate: float | None = _UNSET,
        archive: str = _UNSET,
    ) -> Queue:
        """Create a queue; settings left out take the service's defaults. ``Conflict`` (409
        ``already_exists``) if the name is taken, ``BadRequest`` if a setting is out of range
        (``detail`` names the fields)."""
        settings = queue_settings(locals())
        return Queue.from_json(self._call("POST", "queues", {"name": name, **settings}))

    def list_queues(self) -> list[Queue]:
        return [Queue.from_json(q) for q in self._call("GET", "queues")]

    def get_queue(self, name: str) -> Queue:
        """A queue's settings; for ``"topic/subscription"``, the topic's with the subscription's
        own visibility timeout and dead-letter rule (what a consumer of it needs)."""
        topic, slash, sub = name.partition("/")
        if not slash:
            return Queue.from_json(self._call("GET", f"queues/{_q(name)}"))
        own = self._call("GET", f"topics/{_q(topic)}/subscriptions/{_q(sub)}")
        return subscription_queue(name, self._call("GET", f"topics/{_q(topic)}"), own)

    def update_queue(
        self,
        name: str,
        *,
        partitions: int = _UNSET,
        block_size: int = _UNSET,
        lease_period: float = _UNSET,
        visibility_timeout: float = _UNSET,
        max_message_size: int = _UNSET,
        retention: float = _UNSET,
        strict: bool = _UNSET,
        group_batch: bool = _UNSET,
        dead_letter_queue: str | None = _UNSET,
        max_receives: int | None = _UNSET,
        dedup_window: float = _UNSET,
        delay: float = _UNSET,
        preprocess_estimate: float | None = _UNSET,
        process_estimate: float | None = _UNSET,
        archive: str = _UNSET,
    ) -> Queue:
        """Change the settings given (``None`` clears the optional ones); partitions only grow."""
        changes = queue_settings(locals())
        queue = Queue.from_json(self._call("PATCH", f"queues/{_q(name)}", changes))
        if "partitions" in changes:
            self.forget_owners(name)
        return queue

    def delete_queue(self, name: str) -> None:
        """Delete a queue with all its messages."""
        self._call("DELETE", f"queues/{_q(name)}")
        self.forget_owners(name)

    def stats(self, name: str) -> Stats:
        return Stats.from_json(self._call("GET", _path(name, "stats")))

    def partitions(self, name: str) -> list[PartitionOwner]:
        """Who serves each partition now; also refreshes the owner cache of the queue."""
        return self._fetch_owners(name, self.retries)

    def _fetch_owners(self, name: str, retries: int) -> list[PartitionOwner]:
        payload = self._call("GET", f"queues/{_q(name.partition('/')[0])}/partitions", retries=retries)
        parts = [PartitionOwner.from_json(p) for p in payload.get("partitions", ())]
        self._owners.store(name, parts)
        return parts

    def health(self, url: str | None = None) -> Health:
        """The liveness of ``url`` (one node; default: the next of the round robin). Not retried."""
        if url is None:
            return Health.from_json(self._call("GET", "healthz"))
        status, body, _ = self._transport.once("GET", url.rstrip("/"), "healthz", None, self.timeout)
        if status != 200:
            raise error_from_answer(status, body if isinstance(body, dict) else {}, url)
        return Health.from_json(body)

    # ----------------------------------------------------------------- messages

    def enqueue(
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
        """Enqueue one message; its ID. A message with a group goes to its partition's owner;
        ``fairness_key`` (1-128 characters, a tenant's) makes its messages take turns with other
        keys' in each partition (see the REST API's ``fairness_key``)."""
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
        if self.tracer is not None:
            return self._traced_enqueue(queue, [item], self._group_owner(queue, [group]), single=True)[0]
        mid: str = self._call("POST", _path(queue, "enqueue"), item, owner=self._group_owner(queue, [group]))["id"]
        return mid

    def enqueue_batch(self, queue: str, messages: Iterable[MessageItem]) -> list[str]:
        """Enqueue up to 1,000 messages in one call (stored in order in one partition when none
        has a group); their IDs, in order. Items: a body, a :class:`NewMessage` or a dict."""
        items = [message_json(m) for m in messages]
        if not items:
            return []
        if len(items) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} messages per call, got {len(items)}: use enqueue_many")
        owner = self._group_owner(queue, [i.get("group") for i in items])
        if self.tracer is not None:
            return self._traced_enqueue(queue, items, owner, single=False)
        return list(self._call("POST", _path(queue, "enqueue"), {"messages": items}, owner=owner)["ids"])

    def enqueue_many(self, queue: str, messages: Iterable[MessageItem], batch_size: int = MAX_BATCH) -> list[str]:
        """Enqueue any number of messages in calls of ``batch_size`` (<= 1,000); all IDs, in order.

        Each call is separate: if one fails, the batches before it are stored (their IDs are on
        the exception as ``exc.ids``) and the ones after it are not sent.
        """
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH}")
        ids: list[str] = []
        for chunk in _chunks(messages, batch_size):
            try:
                ids.extend(self.enqueue_batch(queue, chunk))
            except ApiError as exc:
                exc.ids = list(ids)
                raise
        return ids

    def dequeue(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float = 0,
        node: str | None = None,
    ) -> list[Message]:
        """Receive up to ``max_messages`` (1..1,000); each is hidden for ``visibility_timeout``
        seconds (default: the queue's). ``wait`` (0..20 s) long-polls for a first message.
        ``node`` (``host:port``, e.g. from a heartbeat's ``take``) is asked first."""
        payload = dequeue_payload(max_messages, visibility_timeout, wait)
        timeout = self.timeout + (wait if isinstance(wait, (int, float)) and wait > 0 else 0)
        owner = self._transport.owner_url(node)
        if self.tracer is not None:
            return self._traced_dequeue(queue, payload, timeout, owner)
        answer = self._call("POST", _path(queue, "dequeue"), payload, timeout=timeout, owner=owner)
        return [Message.from_json(m) for m in answer.get("messages", ())]

    def receive(
        self, queue: str, max_messages: int = 1, *, visibility_timeout: float | None = None, wait: float = MAX_WAIT
    ) -> Iterator[Message]:
        """Messages as they come, long-polling forever (stop by leaving the loop). Ack each."""
        while True:
            yield from self.dequeue(queue, max_messages, visibility_timeout=visibility_timeout, wait=wait)

    def ack(self, queue: str, messages: Iterable[AckItem]) -> AckResult:
        """Acknowledge (delete) delivered messages, checking their receipts.

        Items: :class:`Message`, ``(id, receipt)`` or ``{"id", "receipt"}``. One call per owner
        node and per 1,000 messages. A stale receipt raises :class:`Conflict`: nothing of that call
        is removed, but calls made before it (other owners, earlier batches) stay done.
        """
        return self._ack(queue, "messages", ack_items(messages), lambda item: item["id"])

    def ack_ids(self, queue: str, ids: Iterable[str]) -> AckResult:
        """Acknowledge (delete) messages by ID, whoever holds them (not on strict queues)."""
        return self._ack(queue, "ids", list(ids), lambda mid: mid)

    def change_visibility(
        self, queue: str, message: Message | str, visibility_timeout: float, *, receipt: str | None = None
    ) -> VisibilityResult:
        """Hide a delivered message for ``visibility_timeout`` more seconds from now (0: deliver
        it again at once). ``message`` is a :class:`Message` (its receipt is used) or an ID."""
        payload = visibility_payload(message, visibility_timeout, receipt)
        answer = self._call(
            "POST", _path(queue, "visibility"), payload, owner=self._owner(queue, partition_or_none(payload["id"]))
        )
        return visibility_result(answer, payload)

    def give_back(self, queue: str, message: Message | str, *, receipt: str | None = None) -> VisibilityResult:
        """Give a delivered message back at once (visibility 0): delivered again, and logged as
        given back rather than abandoned (unless the attempt was reported)."""
        return self.change_visibility(queue, message, 0, receipt=receipt)

    def redrive(self, dead_letter_queue: str, max_messages: int = 100) -> RedriveResult:
        """Move up to ``max_messages`` dead letters back to the queues they came from."""
        return redrive_result(self._call("POST", f"queues/{_q(dead_letter_queue)}/redrive", {"max": max_messages}))

    def expire(self, queue: str, older_than: float | None = None) -> int:
        """Apply the retention rule now on the node called (staff tokens only); how many expired."""
        return int(self._call("POST", f"queues/{_q(queue)}/expire", expire_payload(older_than)).get("expired", 0))

    # ---------------------------------------------------------------- consumers

    def send_logs(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Send attempt log records (``POST /api/v1/logs``); the service's JSON answer."""
        answer: dict[str, Any] = self._call("POST", "logs", {"records": list(records)})
        return answer

    def heartbeat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A consumer's heartbeat (``POST /api/v1/consumers/heartbeat``); the answer (instructions)."""
        answer: dict[str, Any] = self._call("POST", "consumers/heartbeat", dict(payload))
        return answer

    # ------------------------------------------------------------ owner routing

    def owners(self, queue: str) -> dict[int, str | None]:
        """The cached owner address of each partition of ``queue`` (fetched when older than
        ``owners_ttl``); empty if they cannot be learned now."""
        if self.owners_ttl <= 0:
            return {}
        cached = self._owners.fresh(queue)
        if cached is not None:
            return cached
        try:
            parts = self._fetch_owners(queue, 0)  # a shortcut only: not worth retries
        except ApiError:
            self._owners.lookup_failed(queue)  # do not ask again at every call while it fails
            return {}
        return {p.index: p.address for p in parts}

    def _owner(self, queue: str, partition: int | None) -> str | None:
        if partition is None:
            return None
        return self._transport.owner_url(self.owners(queue).get(partition))

    def _group_owner(self, queue: str, groups: Sequence[str | None]) -> str | None:
        """The owner of the one partition all ``groups`` hash to, else None (any node)."""
        group = single_group(groups)
        if group is None or self.owners_ttl <= 0:
            return None
        owners = self.owners(queue)
        if not owners:
            return None
        return self._transport.owner_url(owners.get(group_partition(group, len(owners))))

    def _ack(self, queue: str, key: str, items: list[_T], id_of: Callable[[_T], str]) -> AckResult:
        if not items:
            return AckResult()
        by_owner: dict[str | None, list[_T]] = {}
        for item in items:
            by_owner.setdefault(self._owner(queue, partition_or_none(id_of(item))), []).append(item)
        if self.tracer is not None:
            with tracing.client_span(self.tracer, "settle", "ack", queue, len(items)):
                return self._ack_calls(queue, key, by_owner)
        return self._ack_calls(queue, key, by_owner)

    def _ack_calls(self, queue: str, key: str, by_owner: dict[str | None, list[_T]]) -> AckResult:
        total = AckResult()
        for owner, owned in by_owner.items():
            for chunk in _chunks(owned, MAX_BATCH):
                answer = self._call("POST", _path(queue, "ack"), {key: chunk}, owner=owner)
                total = total + AckResult(answer.get("acked", 0), answer.get("not_found", 0))
        return total

    def _traced_enqueue(self, queue: str, items: list[dict[str, Any]], owner: str | None, single: bool) -> list[str]:
        """An enqueue inside a producer span (``send``) whose context each message carries in
        its attributes (``traceparent``, ``tracestate``), and the request in its headers."""
        assert self.tracer is not None
        with tracing.client_span(self.tracer, "send", "enqueue", queue, len(items)) as span:
            items = tracing.carry(items)
            path = _path(queue, "enqueue")
            if single:
                ids = [str(self._call("POST", path, items[0], owner=owner)["id"])]
                span.set_attribute("messaging.message.id", ids[0])
                return ids
            return list(self._call("POST", path, {"messages": items}, owner=owner)["ids"])

    def _traced_dequeue(self, queue: str, payload: dict[str, Any], timeout: float, owner: str | None) -> list[Message]:
        """A dequeue inside a ``receive`` span linked to the messages' creation contexts."""
        assert self.tracer is not None
        with tracing.client_span(self.tracer, "receive", "dequeue", queue) as span:
            answer = self._call("POST", _path(queue, "dequeue"), payload, timeout=timeout, owner=owner)
            messages = [Message.from_json(m) for m in answer.get("messages", ())]
            tracing.link_messages(span, [tracing.context_of(m.attributes) for m in messages])
            return messages

    def _call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        owner: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> Any:
        return self._transport.call(method, path, payload, owner=owner, timeout=timeout, retries=retries)


def _chunks(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    it = iter(items)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


def _q(name: str) -> str:
    """A queue name as a path segment (names are [A-Za-z0-9_-], but never trust input)."""
    return quote(name, safe="")


def _path(target: str, call: str) -> str:
    """The API path of a message call on a queue (``"orders"``) or on a topic's subscription
    (``"news/mail"``: ``topics/news/subscriptions/mail/...``), so that every method that takes
    a queue name takes a subscription too."""
    topic, slash, sub = target.partition("/")
    if slash:
        return f"topics/{_q(topic)}/subscriptions/{_q(sub)}/{call}"
    return f"queues/{_q(target)}/{call}"


# The requests and answers of the calls, shared with the asyncio client (mq_client.aio).

#: What the ack calls take for a message: a :class:`Message`, ``(id, receipt)`` or ``{"id", "receipt"}``.
AckItem = Message | tuple[str, str | None] | Mapping[str, Any]


def ack_items(messages: Iterable[AckItem]) -> list[dict[str, Any]]:
    """The ack call's ``messages``: ``{"id", "receipt"}`` of each item."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, Message):
            items.append({"id": m.id, "receipt": m.receipt})
        elif isinstance(m, Mapping):
            items.append({"id": m["id"], "receipt": m.get("receipt")})
        else:
            mid, receipt = m
            items.append({"id": mid, "receipt": receipt})
    return items


def dequeue_payload(max_messages: int, visibility_timeout: float | None, wait: float) -> dict[str, Any]:
    payload: dict[str, Any] = {"max": max_messages}
    if visibility_timeout is not None:
        payload["visibility_timeout"] = visibility_timeout
    if wait:
        payload["wait"] = wait
    return payload


def visibility_payload(message: Message | str, visibility_timeout: float, receipt: str | None) -> dict[str, Any]:
    if isinstance(message, Message):
        mid, receipt = message.id, receipt or message.receipt
    else:
        mid = message
    payload: dict[str, Any] = {"id": mid, "visibility_timeout": visibility_timeout}
    if receipt is not None:
        payload["receipt"] = receipt
    return payload


def visibility_result(answer: Mapping[str, Any], payload: Mapping[str, Any]) -> VisibilityResult:
    return VisibilityResult(
        id=answer.get("id", payload["id"]),
        visibility_timeout=answer.get("visibility_timeout", payload["visibility_timeout"]),
    )


def queue_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The queue settings among ``values`` (a method's locals), those given."""
    return {k: v for k, v in values.items() if k in QUEUE_FIELDS and v is not _UNSET}


def single_group(groups: Sequence[str | None]) -> str | None:
    """The one group all messages of a batch have, else None."""
    return groups[0] if groups and len(set(groups)) == 1 else None


def subscription_queue(name: str, topic: Mapping[str, Any], own: Mapping[str, Any]) -> Queue:
    """A subscription ``name`` (``"topic/subscription"``) as a :class:`Queue`: its topic's
    settings (``topic``, the topic's JSON) with the subscription's own (``own``, its JSON)
    visibility timeout and dead-letter rule."""
    data = dict(topic)
    data.update(name=name, dead_letter_queue=own.get("dead_letter_queue"), max_receives=own.get("max_receives"))
    if own.get("visibility_timeout") is not None:
        data["visibility_timeout"] = own["visibility_timeout"]
    return Queue.from_json(data)


def redrive_result(answer: Mapping[str, Any]) -> RedriveResult:
    return RedriveResult(
        moved=answer.get("moved", 0), skipped=answer.get("skipped", 0), sources=answer.get("sources") or {}
    )


def expire_payload(older_than: float | None) -> dict[str, Any]:
    return {} if older_than is None else {"older_than": older_than}
