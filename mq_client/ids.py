"""Message IDs (``<queue>/<partition>/<block>/<index>``) and where a message group is placed."""

from __future__ import annotations

from hashlib import blake2b

__all__ = ["group_partition", "message_partition", "message_queue", "partition_or_none"]


def message_queue(message_id: str) -> str:
    """The queue of a message ID ``<queue>/<partition>/<block>/<index>``."""
    return message_id.split("/", 1)[0]


def message_partition(message_id: str) -> int:
    """The partition of a message ID ``<queue>/<partition>/<block>/<index>``."""
    try:
        return int(message_id.split("/", 2)[1])
    except (IndexError, ValueError):
        raise ValueError(f"{message_id!r} is not a message ID (<queue>/<partition>/<block>/<index>)") from None


def partition_or_none(message_id: object) -> int | None:
    """The partition of ``message_id``, or None when it is not a message ID (the service will say
    what is wrong with it)."""
    if not isinstance(message_id, str):
        return None
    try:
        return message_partition(message_id)
    except ValueError:
        return None


def group_partition(group: str, partitions: int) -> int:
    """The partition a group's messages go to: the service's stable hash (blake2b, modulo)."""
    digest = blake2b(group.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions
