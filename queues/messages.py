"""Message IDs, receipts and the stored message record."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

import orjson

_MESSAGE_ID = re.compile(
    r"^(?P<queue>[A-Za-z0-9][A-Za-z0-9_-]{0,79})/(?P<partition>0|[1-9][0-9]{0,3})/"
    r"(?P<block>[0-9a-f]{8}-[0-9a-f]{16})/(?P<index>0|[1-9][0-9]{0,4})$"
)


@dataclass(frozen=True, slots=True)
class MessageId:
    queue: str
    partition: int
    block: str
    index: int

    def __str__(self) -> str:
        return f"{self.queue}/{self.partition}/{self.block}/{self.index}"


def parse_message_id(text: object) -> MessageId | None:
    """The parts of a well-formed message ID, or None."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    m = _MESSAGE_ID.match(text)
    if m is None:
        return None
    return MessageId(m["queue"], int(m["partition"]), m["block"], int(m["index"]))


def block_key(queue: str, partition: int, block_id: str) -> str:
    """Where a block's record lives: beside, not inside, the bucket of its messages."""
    return f"{queue}/{partition}/_blocks/{block_id}"


def fence_key(queue: str, partition: int) -> str:
    return f"{queue}/{partition}/_fence"


def new_receipt() -> str:
    return secrets.token_urlsafe(12)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """What the key-value store holds under a message ID."""

    body: str
    #: wall-clock seconds since the epoch.
    enqueued_at: float

    def to_bytes(self) -> bytes:
        return orjson.dumps({"b": self.body, "t": self.enqueued_at})

    @classmethod
    def from_bytes(cls, raw: bytes) -> "StoredMessage":
        data = orjson.loads(raw)
        return cls(data["b"], data["t"])
