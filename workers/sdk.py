"""The Python client of the messaging API: what the workers use, and what applications may import.

It needs only ``requests`` (never Django), so an application can vendor or import it alone::

    from workers.sdk import Client

    mq = Client("http://10.0.0.1:8000,http://10.0.0.2:8000", token="...")   # or Client.from_env()
    mq.create_queue("orders", partitions=4)
    mq.enqueue("orders", "hello", group="customer-42")
    ids = mq.enqueue_many("orders", ({"body": str(i)} for i in range(2500)))   # 3 calls of <= 1,000
    for m in mq.dequeue("orders", 10, visibility_timeout=60, wait=5):
        ...
    mq.ack("orders", messages)

What it does for you:

* **Typed results.** Answers come back as frozen dataclasses (:class:`Message`, :class:`Queue`,
  :class:`Stats`, :class:`AckResult` ...); errors as :class:`ApiError` subclasses carrying the
  API's ``status``, ``code`` (e.g. ``queue_not_found``, ``receipt_mismatch``) and ``detail``.
* **Batching.** :meth:`Client.enqueue_many`, :meth:`Client.ack` and :meth:`Client.ack_ids` split
  their input into calls of at most 1,000 items (the API's limit).
* **Retries.** A 4xx other than 429 is never retried (the call was wrong and changed nothing). A
  429 (a node's cap on concurrent long polls or consumers) is retried like a 5xx. A 5xx (503 means
  "this partition is not served here right now") and a connection error are retried up to
  ``retries`` times with exponential backoff and full jitter, honouring ``Retry-After``, each time on
  the next node of the round robin. A node that refused a connection is skipped for a short while.
  Retries are at least once: an enqueue whose answer was lost may be stored twice (give a
  ``dedup_id`` to make that impossible within the queue's dedup window), a dequeue whose answer was
  lost leaves its messages invisible until their visibility timeout.
* **Round robin** over the nodes given (``urls``, a list or a comma-separated string).
* **Owner routing.** The client learns which node owns each partition (``GET
  /queues/{name}/partitions``, cached for ``owners_ttl`` seconds and dropped on any failure) and sends
  acks and visibility changes (and enqueues of a single message group) straight to the owner of the
  message's partition, ``http://<address>``. If the owner is unknown or fails (it is then left alone
  for a moment), the call goes round robin at once with all its retries: any node forwards a call to
  the owner, so this is only a shortcut, never a requirement.

A :class:`Client` is thread-safe: each thread gets its own ``requests.Session`` (connection pool);
the round robin, the node health and the owner cache are shared under a lock.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from hashlib import blake2b
from typing import Any, TypeVar
from urllib.parse import quote

import requests

try:  # the service's own JSON codec when present; the standard library otherwise
    import orjson

    def _dumps(value: Any) -> bytes:
        return orjson.dumps(value)

    def _loads(raw: bytes) -> Any:
        return orjson.loads(raw)
except ImportError:  # pragma: no cover - orjson is in the service's requirements

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")

    def _loads(raw: bytes) -> Any:
        return json.loads(raw)


__all__ = [
    "MAX_BATCH",
    "AckResult",
    "ApiError",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Estimates",
    "Health",
    "History",
    "Message",
    "NewMessage",
    "NotFound",
    "PartitionOwner",
    "PartitionStats",
    "Queue",
    "RedriveResult",
    "ServerError",
    "Stats",
    "Unauthorized",
    "Unavailable",
    "VisibilityResult",
    "group_partition",
    "message_partition",
    "message_queue",
]

#: The API's limit on messages per enqueue call, IDs per ack call and messages per dequeue.
MAX_BATCH = 1000
#: The API's limit on a dequeue's long poll, in seconds.
MAX_WAIT = 20
API_PREFIX = "/api/v1"
#: Seconds after which owners are asked again when some partition had none, or the lookup failed.
OWNERS_RETRY = 1.0


# ----------------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An answer the API refused, or no answer at all.

    ``status`` is the HTTP status (0 when no node answered), ``code`` the API's stable error code
    (``queue_not_found``, ``receipt_mismatch``, ``body_too_large``, ``unavailable`` ...), ``detail``
    what is wrong, for people (a string, or the field errors of a queue call), and ``payload`` the
    whole JSON answer.
    """

    def __init__(
        self, status: int, code: str, detail: Any = None, payload: Mapping | None = None, url: str | None = None
    ):
        self.status = status
        self.code = code
        self.detail = detail
        self.payload = dict(payload or {})
        self.url = url
        super().__init__(f"{status} {code}: {detail}" if detail is not None else f"{status} {code}")


class BadRequest(ApiError):
    """400 (or 413, 415...): the call was wrong and changed nothing. ``code`` says what was wrong."""


class Unauthorized(ApiError):
    """401 or 403: no token, a bad token, or a call this token may not make."""


class NotFound(ApiError):
    """404: no such queue (``code == "queue_not_found"``) or no such path."""


class Conflict(ApiError):
    """409: a stale receipt (``code == "receipt_mismatch"``): the message was delivered again
    since, to someone else. ``message_id`` names it. Nothing of that call was removed on that node."""

    @property
    def message_id(self) -> str | None:
        return self.payload.get("id")


class Unavailable(ApiError):
    """503 after all retries: no node served the partition (a takeover in progress, the store
    unreachable). Retrying later is the right thing to do."""


class ServerError(ApiError):
    """Another 5xx after all retries: a bug on the server (see the node's log)."""


class ConnectionFailed(Unavailable):
    """No node could be reached (refused, reset, timed out) after all retries; ``status`` is 0."""


def _error_class(status: int) -> type[ApiError]:
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status in (401, 403):
        return Unauthorized
    if status in (429, 503):
        return Unavailable
    if status >= 500:
        return ServerError
    if 400 <= status < 500:
        return BadRequest
    return ApiError


# ------------------------------------------------------------------------------ results


def _time(value: Any) -> datetime | None:
    """An ISO 8601 time of the API as an aware datetime (UTC), or None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


T = TypeVar("T")


def _known(cls: type[T], data: Mapping, **override: Any) -> T:
    """``cls(**data)`` with the fields ``cls`` knows (newer servers may answer more)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in data.items() if k in names}
    values.update(override)
    return cls(**values)


@dataclass(frozen=True)
class Estimates:
    """How long a message should take in each stage of a worker, in seconds."""

    #: seconds to pre-process (the message's own estimate, else the queue's ``preprocess_estimate``)
    preprocess: float | None = None
    #: seconds to process (the message's own estimate, else the queue's ``process_estimate``)
    process: float | None = None

    @classmethod
    def from_json(cls, data: Mapping | None) -> Estimates:
        data = data or {}
        return cls(preprocess=data.get("preprocess"), process=data.get("process"))

    def to_json(self) -> dict:
        return {k: v for k, v in (("preprocess", self.preprocess), ("process", self.process)) if v is not None}


@dataclass(frozen=True)
class History:
    """Where a dead letter came from (set on messages of a dead-letter queue)."""

    #: the queue the message was first enqueued to
    source: str | None = None
    #: its message ID in that queue
    id: str | None = None
    #: how often it had been delivered there when it was set aside
    receive_count: int | None = None
    #: its message group there, if any
    group: str | None = None
    #: when it was first enqueued
    enqueued_at: datetime | None = None
    #: when it was moved to the dead-letter queue
    dead_lettered_at: datetime | None = None

    @classmethod
    def from_json(cls, data: Mapping | None) -> History | None:
        if not data:
            return None
        return _known(
            cls, data, enqueued_at=_time(data.get("enqueued_at")), dead_lettered_at=_time(data.get("dead_lettered_at"))
        )


@dataclass(frozen=True)
class Message:
    """A delivered message: hidden from other consumers until its visibility deadline."""

    #: the message ID, ``<queue>/<partition>/<block>/<index>``
    id: str
    #: this delivery's receipt: carry it to :meth:`Client.ack` and :meth:`Client.change_visibility`
    receipt: str
    #: the message body (UTF-8 text)
    body: str
    #: how many times the message was delivered, this delivery included (1 on the first)
    receive_count: int = 1
    #: when the message was enqueued (aware, UTC)
    enqueued_at: datetime | None = None
    #: its sequence number: increases within a partition (and so within a group), across owners
    sequence: int | None = None
    #: its message group, or None
    group: str | None = None
    #: its attributes (string, number or boolean values)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    #: the size the producer declared (``size`` at enqueue), or None
    size: int | None = None
    #: the time estimates for a worker's pre-process and process stages
    estimates: Estimates = field(default_factory=Estimates)
    #: on a dead-letter queue: where the message came from; else None
    history: History | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> Message:
        return cls(
            id=data["id"],
            receipt=data["receipt"],
            body=data["body"],
            receive_count=data.get("receive_count", 1),
            enqueued_at=_time(data.get("enqueued_at")),
            sequence=data.get("sequence"),
            group=data.get("group"),
            attributes=dict(data.get("attributes") or {}),
            size=data.get("size"),
            estimates=Estimates.from_json(data.get("estimates")),
            history=History.from_json(data.get("history")),
        )

    @property
    def queue(self) -> str:
        """The queue the message is in (from its ID)."""
        return message_queue(self.id)

    @property
    def partition(self) -> int:
        """The partition the message is in (from its ID)."""
        return message_partition(self.id)


@dataclass(frozen=True)
class NewMessage:
    """A message to enqueue. :meth:`Client.enqueue_many` also takes plain strings (a body) and dicts."""

    #: the body: UTF-8 text up to the queue's ``max_message_size`` (encode other data as JSON)
    body: str
    #: message group: messages of a group are delivered in order, one at a time (strict queues need one)
    group: str | None = None
    #: deduplication ID: a second enqueue with it within the queue's dedup window returns the first ID
    dedup_id: str | None = None
    #: seconds (<= 900) before the first delivery; the queue's ``delay`` when None
    delay: float | None = None
    #: not delivered before this time: epoch seconds, an ISO 8601 string or a datetime (not with ``delay``)
    not_before: float | str | datetime | None = None
    #: up to 16 attributes: names of 1..64 characters, string, number or boolean values
    attributes: Mapping[str, Any] | None = None
    #: the size of the work the message stands for, for the producer's own accounting
    size: int | None = None
    #: time estimates in seconds: an :class:`Estimates` or ``{"preprocess": s, "process": s}``
    estimates: Estimates | Mapping[str, float] | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"body": self.body}
        for name in ("group", "dedup_id", "delay", "size"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.not_before is not None:
            out["not_before"] = _not_before(self.not_before)
        if self.attributes is not None:
            out["attributes"] = dict(self.attributes)
        if self.estimates is not None:
            out["estimates"] = (
                self.estimates.to_json() if isinstance(self.estimates, Estimates) else dict(self.estimates)
            )
        return out


def _not_before(value: float | str | datetime) -> float | str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.astimezone()  # a naive datetime is local time, as datetime.timestamp() says
        return value.isoformat()
    return value


def _message_json(item: str | NewMessage | Mapping) -> dict:
    if isinstance(item, str):
        return {"body": item}
    if isinstance(item, NewMessage):
        return item.to_json()
    if isinstance(item, Mapping):
        out = dict(item)
        if isinstance(out.get("not_before"), datetime):
            out["not_before"] = _not_before(out["not_before"])
        if isinstance(out.get("estimates"), Estimates):
            out["estimates"] = out["estimates"].to_json()
        return out
    raise TypeError(f"a message is a str (its body), a NewMessage or a dict, not {type(item).__name__}")


@dataclass(frozen=True)
class Queue:
    """A queue's settings."""

    #: the queue's name: letters, digits, '_' and '-', at most 80
    name: str
    #: how many partitions it has (they can only grow)
    partitions: int = 4
    #: positions per block of the append tree
    block_size: int = 256
    #: seconds a node's lease on a partition lasts
    lease_period: float = 10
    #: default seconds a delivered message stays hidden
    visibility_timeout: float = 30
    #: the largest body accepted, in bytes of UTF-8
    max_message_size: int = 256 * 1024
    #: seconds a message is kept before the retention rule removes it
    retention: float = 4 * 24 * 3600
    #: every message needs a group, and acks need receipts
    strict: bool = False
    #: name of the queue that receives messages delivered ``max_receives`` times, or None
    dead_letter_queue: str | None = None
    #: deliveries after which a message goes to ``dead_letter_queue``, or None
    max_receives: int | None = None
    #: seconds a ``dedup_id`` is remembered
    dedup_window: float = 300
    #: default seconds before a new message is first delivered
    delay: float = 0
    #: default pre-process estimate of its messages, seconds, or None
    preprocess_estimate: float | None = None
    #: default process estimate of its messages, seconds, or None
    process_estimate: float | None = None
    #: what is copied to the archive table: "none", "all" (every message) or "acked"
    archive: str = "none"
    #: when it was created
    created_at: datetime | None = None
    #: when its settings last changed
    updated_at: datetime | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> Queue:
        return _known(cls, data, created_at=_time(data.get("created_at")), updated_at=_time(data.get("updated_at")))


@dataclass(frozen=True)
class PartitionStats:
    """One partition in :class:`Stats`: exact figures from its owner when ``live``, else the
    figures its last owner saved."""

    #: the partition's index, 0..partitions-1
    index: int
    #: the owner node's address (``host:port``), or None when nobody holds the lease
    owner: str | None = None
    #: the lease's epoch (increments at every change of owner)
    epoch: int = 0
    #: figures come from the owner's memory (the answering node owns it), not from the database
    live: bool = False
    #: visible messages waiting
    depth: int = 0
    #: messages delivered and not yet acknowledged
    in_flight: int = 0
    #: ``depth`` is exact (False: an estimate, e.g. blocks not read yet after a takeover)
    depth_exact: bool = False
    #: seconds since the oldest message was enqueued, or None when empty
    oldest_age: float | None = None
    #: ID of the append tree's newest block
    head_block: str | None = None
    #: next free position (the enqueue ID), as a message ID
    enqueue_id: str | None = None
    #: next deliverable position (the dequeue ID), as a message ID
    dequeue_id: str | None = None
    #: height of the append tree
    tree_height: int | None = None
    #: blocks not yet pruned
    live_blocks: int | None = None
    #: messages enqueued in total
    enqueued: int | None = None
    #: messages acknowledged in total
    acked: int | None = None
    #: messages delivered again in total
    redelivered: int | None = None
    #: the owner node's ID, or None when nobody holds the lease (None too from older servers)
    owner_id: str | None = None
    #: the owner node's address (``host:port``), as ``owner`` (None from older servers)
    owner_address: str | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> PartitionStats:
        return _known(cls, data)


@dataclass(frozen=True)
class Stats:
    """A queue's figures, summed over its partitions."""

    #: the queue's name
    queue: str
    #: visible messages waiting, all partitions
    depth: int = 0
    #: messages delivered and not yet acknowledged, all partitions
    in_flight: int = 0
    #: seconds since the oldest message was enqueued, or None when empty
    oldest_age: float | None = None
    #: per partition, by index
    partitions: tuple[PartitionStats, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping) -> Stats:
        return _known(cls, data, partitions=tuple(PartitionStats.from_json(p) for p in data.get("partitions", ())))


@dataclass(frozen=True)
class PartitionOwner:
    """Who serves a partition (``GET /queues/{name}/partitions``)."""

    #: the partition's index
    index: int
    #: the owner node's ID, or None when nobody holds the lease
    owner: str | None = None
    #: the owner's ``host:port``, or None
    address: str | None = None
    #: the lease's epoch
    epoch: int = 0
    #: the owner is over its load and sends enqueues elsewhere
    cooling: bool = False
    #: the owner node's ID, as ``owner`` (None from older servers)
    owner_id: str | None = None
    #: the owner node's ``host:port``, as ``address`` (None from older servers)
    owner_address: str | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> PartitionOwner:
        return _known(cls, data)


@dataclass(frozen=True)
class AckResult:
    """What an ack removed."""

    #: messages removed by the call
    acked: int = 0
    #: IDs no longer stored (acknowledged before, expired, or dead-lettered)
    not_found: int = 0

    def __add__(self, other: AckResult) -> AckResult:
        return AckResult(self.acked + other.acked, self.not_found + other.not_found)


@dataclass(frozen=True)
class VisibilityResult:
    """A message's new visibility."""

    #: the message ID
    id: str
    #: seconds from the call until it is delivered again (0: visible at once)
    visibility_timeout: float


@dataclass(frozen=True)
class RedriveResult:
    """What a redrive moved from a dead-letter queue."""

    #: messages moved back to the queue (or topic subscription) they came from
    moved: int = 0
    #: messages left in place (no source named in their history)
    skipped: int = 0
    #: ``moved`` by source: a queue's name, or ``topic/subscription``
    sources: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Health:
    """A node's liveness answer. Only a staff user's token (or a node) is told the rest."""

    #: ``"ok"``
    status: str
    #: the node's ID (staff only, else None)
    node: str | None = None
    #: the node's ``host:port`` (staff only, else None)
    address: str | None = None
    #: partitions it holds now, all queues (staff only, else 0)
    partitions: int = 0


# ----------------------------------------------------------------------------- helpers


def message_queue(message_id: str) -> str:
    """The queue of a message ID ``<queue>/<partition>/<block>/<index>``."""
    return message_id.split("/", 1)[0]


def message_partition(message_id: str) -> int:
    """The partition of a message ID ``<queue>/<partition>/<block>/<index>``."""
    try:
        return int(message_id.split("/", 2)[1])
    except (IndexError, ValueError):
        raise ValueError(f"{message_id!r} is not a message ID (<queue>/<partition>/<block>/<index>)") from None


def group_partition(group: str, partitions: int) -> int:
    """The partition a group's messages go to: the service's stable hash (blake2b, modulo)."""
    digest = blake2b(group.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


def _retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delta seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


_UNSET: Any = object()
_QUEUE_FIELDS = (
    "partitions",
    "block_size",
    "lease_period",
    "visibility_timeout",
    "max_message_size",
    "retention",
    "strict",
    "dead_letter_queue",
    "max_receives",
    "dedup_window",
    "delay",
    "preprocess_estimate",
    "process_estimate",
    "archive",
)


class _Node:
    """One base URL of the round robin and how it has been doing."""

    __slots__ = ("down_until", "failures", "url")

    def __init__(self, url: str):
        self.url = url
        self.failures = 0
        self.down_until = 0.0


@dataclass
class _Owners:
    addresses: dict[int, str | None]
    fetched: float


# ------------------------------------------------------------------------------ client


class Client:
    """A client of the messaging API over one or more nodes.

    :param urls: base URLs of nodes (``http://host:port``), a list or a comma-separated string
    :param token: an API token (``Authorization: Token <token>``)
    :param timeout: seconds to connect and to wait for an answer (a dequeue's ``wait`` is added)
    :param retries: how many times a call is tried again after a 5xx or a connection error
    :param backoff: the first retry's delay ceiling in seconds; doubles at every retry (full jitter)
    :param max_backoff: the largest delay between two tries, ``Retry-After`` included
    :param owners_ttl: seconds the partition owners of a queue are cached; 0 turns owner routing off
    :param node_quarantine: seconds a node that refused a connection is skipped (doubles, up to 8x)
    """

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
    ):
        if isinstance(urls, str):
            urls = urls.split(",")
        cleaned = [u.strip().rstrip("/") for u in urls if u and u.strip()]
        if not cleaned:
            raise ValueError("give at least one node URL")
        cleaned = [u if "://" in u else f"http://{u}" for u in cleaned]
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("retries and backoff must be >= 0, timeout > 0")
        self._nodes = [_Node(u) for u in dict.fromkeys(cleaned)]
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.owners_ttl = owners_ttl
        self.node_quarantine = node_quarantine
        self.scheme = cleaned[0].split("://", 1)[0]
        self._headers = {
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": user_agent,
        }
        self._lock = threading.Lock()
        self._next = 0
        self._owners: dict[str, _Owners] = {}
        self._unreachable: dict[str, float] = {}  # owner URL -> monotonic time to try it again
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._sleep: Callable[[float], None] = time.sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> Client:
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

    @property
    def urls(self) -> list[str]:
        """The nodes of the round robin, in order."""
        return [n.url for n in self._nodes]

    def close(self) -> None:
        """Close every thread's connections. The client stays usable (new sessions open)."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
        self._local = threading.local()

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
        settings = {k: v for k, v in locals().items() if k in _QUEUE_FIELDS and v is not _UNSET}
        return Queue.from_json(self._call("POST", "queues", {"name": name, **settings}))

    def list_queues(self) -> list[Queue]:
        return [Queue.from_json(q) for q in self._call("GET", "queues")]

    def get_queue(self, name: str) -> Queue:
        """A queue's settings; for ``"topic/subscription"``, the topic's with the subscription's
        own visibility timeout and dead-letter rule (what a consumer of it needs)."""
        topic, slash, sub = name.partition("/")
        if not slash:
            return Queue.from_json(self._call("GET", f"queues/{_q(name)}"))
        data = dict(self._call("GET", f"topics/{_q(topic)}"))
        own = self._call("GET", f"topics/{_q(topic)}/subscriptions/{_q(sub)}")
        data.update(name=name, dead_letter_queue=own.get("dead_letter_queue"), max_receives=own.get("max_receives"))
        if own.get("visibility_timeout") is not None:
            data["visibility_timeout"] = own["visibility_timeout"]
        return Queue.from_json(data)

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
        dead_letter_queue: str | None = _UNSET,
        max_receives: int | None = _UNSET,
        dedup_window: float = _UNSET,
        delay: float = _UNSET,
        preprocess_estimate: float | None = _UNSET,
        process_estimate: float | None = _UNSET,
        archive: str = _UNSET,
    ) -> Queue:
        """Change the settings given (``None`` clears the optional ones); partitions only grow."""
        changes = {k: v for k, v in locals().items() if k in _QUEUE_FIELDS and v is not _UNSET}
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
        fetched = time.monotonic()
        if any(p.address is None for p in parts):
            # Some partition has no owner now (just created, a takeover): ask again soon.
            fetched -= max(0.0, self.owners_ttl - OWNERS_RETRY)
        with self._lock:
            self._owners[name] = _Owners({p.index: p.address for p in parts}, fetched)
        return parts

    def health(self, url: str | None = None) -> Health:
        """The liveness of ``url`` (one node; default: the next of the round robin). Not retried."""
        if url is None:
            return Health(**_pick(Health, self._call("GET", "healthz")))
        status, body, _ = self._once("GET", url.rstrip("/"), "healthz", None, self.timeout)
        if status != 200:
            body = body if isinstance(body, dict) else {}
            raise _error_class(status)(
                status, str(body.get("error") or f"http_{status}"), body.get("detail"), body, url=url
            )
        return Health(**_pick(Health, body))

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
    ) -> str:
        """Enqueue one message; its ID. A message with a group goes to its partition's owner."""
        item = NewMessage(
            body,
            group=group,
            dedup_id=dedup_id,
            delay=delay,
            not_before=not_before,
            attributes=attributes,
            size=size,
            estimates=estimates,
        ).to_json()
        return self._call("POST", _path(queue, "enqueue"), item, owner=self._group_owner(queue, [group]))["id"]

    def enqueue_batch(self, queue: str, messages: Iterable[str | NewMessage | Mapping]) -> list[str]:
        """Enqueue up to 1,000 messages in one call (stored in order in one partition when none
        has a group); their IDs, in order. Items: a body, a :class:`NewMessage` or a dict."""
        items = [_message_json(m) for m in messages]
        if not items:
            return []
        if len(items) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} messages per call, got {len(items)}: use enqueue_many")
        owner = self._group_owner(queue, [i.get("group") for i in items])
        return list(self._call("POST", _path(queue, "enqueue"), {"messages": items}, owner=owner)["ids"])

    def enqueue_many(
        self, queue: str, messages: Iterable[str | NewMessage | Mapping], batch_size: int = MAX_BATCH
    ) -> list[str]:
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
                exc.ids = list(ids)  # type: ignore[attr-defined]
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
        payload: dict[str, Any] = {"max": max_messages}
        if visibility_timeout is not None:
            payload["visibility_timeout"] = visibility_timeout
        if wait:
            payload["wait"] = wait
        timeout = self.timeout + (wait if isinstance(wait, (int, float)) and wait > 0 else 0)
        answer = self._call("POST", _path(queue, "dequeue"), payload, timeout=timeout, owner=self._owner_url(node))
        return [Message.from_json(m) for m in answer.get("messages", ())]

    def receive(
        self, queue: str, max_messages: int = 1, *, visibility_timeout: float | None = None, wait: float = MAX_WAIT
    ) -> Iterator[Message]:
        """Messages as they come, long-polling forever (stop by leaving the loop). Ack each."""
        while True:
            yield from self.dequeue(queue, max_messages, visibility_timeout=visibility_timeout, wait=wait)

    def ack(self, queue: str, messages: Iterable[Message | tuple[str, str | None] | Mapping]) -> AckResult:
        """Acknowledge (delete) delivered messages, checking their receipts.

        Items: :class:`Message`, ``(id, receipt)`` or ``{"id", "receipt"}``. One call per owner
        node and per 1,000 messages. A stale receipt raises :class:`Conflict`: nothing of that call
        is removed, but calls made before it (other owners, earlier batches) stay done.
        """
        items = []
        for m in messages:
            if isinstance(m, Message):
                items.append({"id": m.id, "receipt": m.receipt})
            elif isinstance(m, Mapping):
                items.append({"id": m["id"], "receipt": m.get("receipt")})
            else:
                mid, receipt = m
                items.append({"id": mid, "receipt": receipt})
        return self._ack(queue, "messages", items, lambda item: item["id"])

    def ack_ids(self, queue: str, ids: Iterable[str]) -> AckResult:
        """Acknowledge (delete) messages by ID, whoever holds them (not on strict queues)."""
        return self._ack(queue, "ids", list(ids), lambda mid: mid)

    def change_visibility(
        self, queue: str, message: Message | str, visibility_timeout: float, *, receipt: str | None = None
    ) -> VisibilityResult:
        """Hide a delivered message for ``visibility_timeout`` more seconds from now (0: deliver
        it again at once). ``message`` is a :class:`Message` (its receipt is used) or an ID."""
        if isinstance(message, Message):
            mid, receipt = message.id, receipt or message.receipt
        else:
            mid = message
        payload: dict[str, Any] = {"id": mid, "visibility_timeout": visibility_timeout}
        if receipt is not None:
            payload["receipt"] = receipt
        answer = self._call(
            "POST", _path(queue, "visibility"), payload, owner=self._owner(queue, _partition_or_none(mid))
        )
        return VisibilityResult(
            id=answer.get("id", mid), visibility_timeout=answer.get("visibility_timeout", visibility_timeout)
        )

    def give_back(self, queue: str, message: Message | str, *, receipt: str | None = None) -> VisibilityResult:
        """Give a delivered message back at once (visibility 0): delivered again, and logged as
        given back rather than abandoned (unless the attempt was reported)."""
        return self.change_visibility(queue, message, 0, receipt=receipt)

    def redrive(self, dead_letter_queue: str, max_messages: int = 100) -> RedriveResult:
        """Move up to ``max_messages`` dead letters back to the queues they came from."""
        answer = self._call("POST", f"queues/{_q(dead_letter_queue)}/redrive", {"max": max_messages})
        return RedriveResult(
            moved=answer.get("moved", 0), skipped=answer.get("skipped", 0), sources=answer.get("sources") or {}
        )

    def expire(self, queue: str, older_than: float | None = None) -> int:
        """Apply the retention rule now on the node called (staff tokens only); how many expired."""
        payload = {} if older_than is None else {"older_than": older_than}
        return int(self._call("POST", f"queues/{_q(queue)}/expire", payload).get("expired", 0))

    # ---------------------------------------------------------------- consumers

    def send_logs(self, records: list[dict]) -> dict:
        """Send attempt log records (``POST /api/v1/logs``); the service's JSON answer."""
        return self._call("POST", "logs", {"records": list(records)})

    def heartbeat(self, payload: dict) -> dict:
        """A consumer's heartbeat (``POST /api/v1/consumers/heartbeat``); the answer (instructions)."""
        return self._call("POST", "consumers/heartbeat", dict(payload))

    # ------------------------------------------------------------ owner routing

    def owners(self, queue: str) -> dict[int, str | None]:
        """The cached owner address of each partition of ``queue`` (fetched when older than
        ``owners_ttl``); empty if they cannot be learned now."""
        if self.owners_ttl <= 0:
            return {}
        with self._lock:
            cached = self._owners.get(queue)
        if cached is not None and time.monotonic() - cached.fetched < self.owners_ttl:
            return cached.addresses
        try:
            self._fetch_owners(queue, 0)  # a shortcut only: not worth retries
        except ApiError:
            with self._lock:  # do not ask again at every call while it fails
                self._owners[queue] = _Owners({}, time.monotonic() - max(0.0, self.owners_ttl - OWNERS_RETRY))
            return {}
        with self._lock:
            return self._owners[queue].addresses

    def forget_owners(self, queue: str | None = None) -> None:
        """Drop the cached owners of ``queue`` (all queues when None)."""
        with self._lock:
            if queue is None:
                self._owners.clear()
            else:
                self._owners.pop(queue, None)

    def _owner(self, queue: str, partition: int | None) -> str | None:
        if partition is None:
            return None
        return self._owner_url(self.owners(queue).get(partition))

    def _owner_url(self, address: str | None) -> str | None:
        """``scheme://address``, unless that owner could not be reached a moment ago."""
        if not address:
            return None
        url = f"{self.scheme}://{address}"
        with self._lock:
            until = self._unreachable.get(url)
        return None if until is not None and until > time.monotonic() else url

    def _group_owner(self, queue: str, groups: Sequence[str | None]) -> str | None:
        """The owner of the one partition all ``groups`` hash to, else None (any node)."""
        if not groups or any(g is None for g in groups) or len(set(groups)) != 1 or self.owners_ttl <= 0:
            return None
        owners = self.owners(queue)
        if not owners:
            return None
        return self._owner_url(owners.get(group_partition(groups[0], len(owners))))  # type: ignore[arg-type]

    def _ack(self, queue: str, key: str, items: list, id_of: Callable[[Any], str]) -> AckResult:
        if not items:
            return AckResult()
        by_owner: dict[str | None, list] = {}
        for item in items:
            by_owner.setdefault(self._owner(queue, _partition_or_none(id_of(item))), []).append(item)
        total = AckResult()
        for owner, owned in by_owner.items():
            for chunk in _chunks(owned, MAX_BATCH):
                answer = self._call("POST", _path(queue, "ack"), {key: chunk}, owner=owner)
                total = total + AckResult(answer.get("acked", 0), answer.get("not_found", 0))
        return total

    # -------------------------------------------------------------------- HTTP

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update(self._headers)
            session.trust_env = False  # no proxies or .netrc from the environment between nodes
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _pick_node(self, tried: set[str]) -> _Node:
        """The next node of the round robin, preferring ones up and not tried in this call."""
        now = time.monotonic()
        with self._lock:
            n = len(self._nodes)
            order = [self._nodes[(self._next + i) % n] for i in range(n)]
            choice = (
                next((x for x in order if x.down_until <= now and x.url not in tried), None)
                or next((x for x in order if x.down_until <= now), None)
                or next((x for x in order if x.url not in tried), None)
                or min(order, key=lambda x: x.down_until)
            )
            self._next = (self._nodes.index(choice) + 1) % n
            return choice

    def _node_ok(self, url: str) -> None:
        for node in self._nodes:
            if node.url == url and node.failures:
                with self._lock:
                    node.failures, node.down_until = 0, 0.0

    def _node_failed(self, url: str) -> None:
        for node in self._nodes:
            if node.url == url:
                with self._lock:
                    node.failures += 1
                    node.down_until = time.monotonic() + self.node_quarantine * min(8, 2 ** (node.failures - 1))

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Full jitter: uniform in [0, backoff * 2^attempt], at least Retry-After, at most max_backoff."""
        delay = random.uniform(0, self.backoff * (2**attempt))
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.max_backoff)

    def _once(self, method: str, base: str, path: str, payload: Any, timeout: float) -> tuple[int, Any, Mapping]:
        """One HTTP request: ``(status, JSON or None, headers)``; raises requests' exceptions."""
        data = None if payload is None else _dumps(payload)
        r = self._session().request(
            method, f"{base}{API_PREFIX}/{path}", data=data, timeout=(min(timeout, 5.0), timeout)
        )
        body: Any = None
        if r.content:
            try:
                body = _loads(r.content)
            except ValueError:
                body = {"error": f"http_{r.status_code}", "detail": r.text[:500]}
        return r.status_code, body, r.headers

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
        """The call on ``owner`` first if given, else round robin; retried as the module says."""
        timeout = self.timeout if timeout is None else timeout
        retries = self.retries if retries is None else retries
        if owner is not None:
            retries += 1  # the direct try is a shortcut: the round robin keeps all its tries
        tried: set[str] = set()
        last: ApiError | None = None
        for attempt in range(retries + 1):
            direct = owner is not None and attempt == 0
            base = owner if direct else self._pick_node(tried).url
            tried.add(base)
            try:
                status, body, headers = self._once(method, base, path, payload, timeout)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                last = ConnectionFailed(0, "connection_failed", f"{base}: {exc}", url=base)
                if direct:
                    self._forget_owner_of(path)
                    with self._lock:
                        self._unreachable[base] = time.monotonic() + self.node_quarantine
                else:
                    self._node_failed(base)
                # A node not tried yet in this call is tried at once; else back off.
                if not direct and attempt < retries and not self._untried(tried):
                    self._sleep(self._delay(attempt, None))
                continue
            if status < 400:
                if not direct:
                    self._node_ok(base)
                return body if body is not None else {}
            body = body if isinstance(body, dict) else {"detail": body}
            error = _error_class(status)(
                status, str(body.get("error") or f"http_{status}"), body.get("detail"), body, url=base
            )
            if status < 500 and status != 429:
                raise error
            last = error  # 5xx, and 429 (a node's cap on long polls or consumers): later may do
            if direct:  # the owner moved or is failing: the round robin, at once
                self._forget_owner_of(path)
            elif attempt < retries:
                self._sleep(self._delay(attempt, _retry_after(headers.get("Retry-After"))))
        assert last is not None
        raise last

    def _untried(self, tried: set[str]) -> bool:
        now = time.monotonic()
        return any(n.url not in tried and n.down_until <= now for n in self._nodes)

    def _forget_owner_of(self, path: str) -> None:
        if path.startswith("queues/"):
            self.forget_owners(path.split("/")[1])


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


def _partition_or_none(message_id: Any) -> int | None:
    try:
        return message_partition(message_id)
    except (ValueError, AttributeError, TypeError):
        return None  # let the service say what is wrong with it


def _pick(cls: type, data: Any) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in (data or {}).items() if k in names}
