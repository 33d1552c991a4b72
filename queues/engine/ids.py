"""Message IDs, receipts, the group hash and the stored message record (where they are stored:
``queues.engine.keys``)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
from typing import Any, NamedTuple

import orjson

from queues.engine.format import refuse
from queues.engine.keys import message_key

_MESSAGE_ID = re.compile(
    r"^(?P<queue>[A-Za-z0-9][A-Za-z0-9_-]{0,79})/(?P<partition>0|[1-9][0-9]{0,3})/"
    r"(?P<block>[0-9a-f]{8}-[0-9a-f]{16})/(?P<index>0|[1-9][0-9]{0,4})$"
)


class MessageId(NamedTuple):
    """A message ID's parts. A tuple, not a frozen dataclass: an ack of 100 messages parses 100
    IDs, and a frozen dataclass's constructor costs a few times a tuple's. Its ``index`` field
    hides the tuple's ``index()`` method, which nothing here calls."""

    queue: str
    partition: int
    block: str
    index: int  # type: ignore[assignment]  # (the field, not tuple.index)
    #: the ID as text (kept: acks turn IDs into keys several times per message).
    text: str = ""

    def __str__(self) -> str:
        return self.text or message_key(self.queue, self.partition, self.block, self.index)


#: The parts before the index (``queue/partition/block/`` without its last ``/``) of IDs parsed
#: lately: an ack's IDs mostly share a block, so the whole regex runs once a block and each ID
#: only checks its index (parsing is a large share of a batch ack). Bounded: emptied when full,
#: so any prefix costs at most one regex again.
_PREFIXES: dict[str, tuple[str, int, str]] = {}
_PREFIXES_MAX = 4096
_new_tuple = tuple.__new__


def parse_message_id(text: object) -> MessageId | None:
    """The parts of a well-formed message ID, or None."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    prefix, _, index = text.rpartition("/")
    known = _PREFIXES.get(prefix)
    if known is not None:
        # The index as the regex has it: ``0|[1-9][0-9]{0,4}`` (isascii: no other digits).
        if index.isascii() and index.isdigit() and len(index) <= 5 and (index[0] != "0" or index == "0"):
            return _new_tuple(MessageId, (*known, int(index), text))
        return None
    m = _MESSAGE_ID.fullmatch(text)  # (match: "$" would let a trailing newline through)
    if m is None:
        return None
    queue, partition, block, index = m.groups()
    if len(_PREFIXES) >= _PREFIXES_MAX:
        _PREFIXES.clear()
    known = _PREFIXES[prefix] = (queue, int(partition), block)
    return _new_tuple(MessageId, (*known, int(index), text))


def group_partition(group: str, partitions: int) -> int:
    """The partition a group's messages go to: the same on every node and every release (and
    in the SDK, ``mq_client.group_partition``; a test pins the two equal)."""
    digest = hashlib.blake2b(group.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


class _ReceiptPool:
    """Receipts made :attr:`BATCH` at a time: 12 random bytes each, from one ``os.urandom`` call
    for the batch, base64url-encoded by one call and cut every 16 characters. 12 bytes are a
    whole number of base64's 3-byte groups, so each piece is exactly the encoding of its own 12
    bytes, as ``secrets.token_urlsafe(12)`` makes one. A dequeue draws a receipt per message,
    so the ``getrandom`` call and the encoding are paid once a batch rather than once a receipt.

    Each thread draws from a pool of its own, without a lock: behind one lock, the request
    threads would queue behind one that lost the GIL while it held the lock. A forked child
    starts with an empty pool (else parent and child would hand out the same receipts).
    """

    BATCH = 256

    def __init__(self) -> None:
        self._local = threading.local()
        self._forks = 0
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._forks += 1  # every thread's pool (the child has one thread) is the parent's

    def take(self) -> str:
        return self.take_many(1)[0]

    def take_many(self, n: int) -> list[str]:
        """``n`` receipts (as ``n`` calls of :meth:`take`)."""
        state = getattr(self._local, "state", None)  # [forks, receipts]
        if state is None or state[0] != self._forks:
            state = self._local.state = [self._forks, []]
        pool: list[str] = state[1]
        if len(pool) < n:
            more = -(-(n - len(pool)) // self.BATCH) * self.BATCH  # (whole batches)
            text = base64.urlsafe_b64encode(os.urandom(12 * more)).decode("ascii")
            pool.extend(text[i : i + 16] for i in range(0, len(text), 16))
        out = pool[-n:] if n else []
        del pool[len(pool) - n :]
        return out


_RECEIPTS = _ReceiptPool()


def new_receipt() -> str:
    """16 URL-safe characters from 12 random bytes (as ``secrets.token_urlsafe(12)``)."""
    return _RECEIPTS.take()


def new_receipts(n: int) -> list[str]:
    """``n`` receipts, each as :func:`new_receipt` makes one."""
    return _RECEIPTS.take_many(n)


class StoredMessage(NamedTuple):
    """What the key-value store holds under a message ID.

    Immutable (the body cache and deliveries share one). A named tuple rather than a frozen
    dataclass: an enqueue builds two per message, and a frozen dataclass' ``__init__`` (one
    ``object.__setattr__`` per field) costs several times as much.
    Read it by field name only.
    """

    body: str
    #: wall-clock seconds since the epoch.
    enqueued_at: float
    #: the strict-order parameter: messages of one group are delivered one at a time, in order.
    group: str | None = None
    #: increasing within the partition (so within a group): ``epoch << 32 | counter``.
    sequence: int = 0
    #: wall-clock seconds before which the message is not delivered (delay / not_before).
    not_before: float | None = None
    attributes: dict[str, Any] | None = None
    size: int | None = None
    #: ``{"preprocess": s, "process": s}`` given by the producer (else the queue's).
    estimates: dict[str, Any] | None = None
    #: for a dead letter: where it came from and how often it was received.
    history: dict[str, Any] | None = None
    #: a stub: the message is in the archive table, and only what places it in the delivery
    #: order (times, group, sequence) is still stored (see :meth:`stub`).
    archived: bool = False
    #: on a topic: the only subscription that reads it (a redriven dead letter); None: all.
    subscription: str | None = None
    #: a plain queue's fairness key (an SQS fair queue's message group ID): the partition's
    #: ungrouped messages of each key take turns with the other keys'; None: the keyless'.
    fairness_key: str | None = None

    def to_bytes(self) -> bytes:
        # One test per field, not a loop over (key, value) pairs: this runs once per enqueued
        # message.
        data = {"b": self.body, "t": self.enqueued_at, "s": self.sequence}
        if self.group is not None:
            data["g"] = self.group
        if self.not_before is not None:
            data["n"] = self.not_before
        if self.attributes is not None:
            data["a"] = self.attributes
        if self.size is not None:
            data["z"] = self.size
        if self.estimates is not None:
            data["e"] = self.estimates
        if self.history is not None:
            data["h"] = self.history
        if self.archived:
            data["x"] = 1
        if self.subscription is not None:
            data["r"] = self.subscription
        if self.fairness_key is not None:
            data["k"] = self.fairness_key
        return orjson.dumps(data)

    @classmethod
    def from_bytes(cls, raw: bytes, key: str = "") -> StoredMessage:
        """The record stored under ``key`` (its message ID: for the error only). Raises
        ``StoredFormatTooNew`` for a record of a later format version (``queues.engine.format``:
        version 1, the only one, holds no ``"v"``; one look-up)."""
        d = orjson.loads(raw)
        if "v" in d:
            refuse(key, "message", d)
        return cls(
            d["b"],
            d["t"],
            d.get("g"),
            d.get("s", 0),
            d.get("n"),
            d.get("a"),
            d.get("z"),
            d.get("e"),
            d.get("h"),
            bool(d.get("x")),
            d.get("r"),
            d.get("k"),
        )

    def with_sequence(self, sequence: int) -> StoredMessage:
        # This runs once per enqueued message: the tuple made straight from slices around the
        # sequence (its position, 3), without the named tuple's Python-level __new__ and a
        # lookup per field. A unit test pins it to _replace.
        return _new_tuple(StoredMessage, (*self[:3], sequence, *self[4:]))

    def stub(self) -> StoredMessage:
        """What stays in the key-value store of a message that retention moved to the archive
        while a subscription still holds it: enough to route it after a takeover, no body."""
        return StoredMessage(
            "",
            self.enqueued_at,
            self.group,
            self.sequence,
            self.not_before,
            archived=True,
            subscription=self.subscription,
            fairness_key=self.fairness_key,
        )
