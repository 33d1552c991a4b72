"""Where things live in the key-value store: every key and bucket of the core, spelled once.

A key is ``<bucket>/<name>`` (``queues.kv``). A queue's (or topic's) partition owns every key
under ``<queue>/<partition>``:

- ``<queue>/<p>/<block id>/<index>``: a message (its key is its message ID);
- ``<queue>/<p>/_blocks/<block id>``: a block of the append tree, beside its messages;
- ``<queue>/<p>/_fence``: the fence, the epoch whose writes are accepted;
- ``<queue>/<p>/_head``: the head record, the newest block and the epoch that wrote it
  (``queues.engine.tree.head_record``), written with the blocks under the fence: the store alone
  leads a new owner to the newest blocks, whatever the database's row says;
- ``<queue>/<p>/_receives/<block id>.<index>``: a queue's saved receive count of a message,
  and ``<queue>/<p>/_receives/<subscription>/<block id>.<index>`` a subscription's;
- ``<queue>/<p>/_acks/<subscription>/<block id>.<index>``: a subscription's ack of a message
  that other subscriptions still hold;
- ``<queue>/<p>/_archive/<e|a>.<block id>.<index>``: the archive journal
  (``queues.engine.archive_journal``).

Names in the ``_receives``, ``_acks`` and ``_archive`` buckets end in the message's
*position*, ``<block id>.<index>``, so a scan of the bucket alone says which message each is.
A queue's keys all lie under ``<queue>`` (:func:`queue_prefix`), so deleting that prefix
removes the queue from the store. These are the names *within* the store's view of one
incarnation of the queue (:func:`incarnation`), which itself lies under the service's
``KV_PREFIX`` (``queues.kv.get_store``): in Redis, message ``orders/0/<block>/3`` of queue row
17 is field ``3`` of hash ``mq:17:orders/0/<block>``. Message IDs never carry either prefix.
"""

from __future__ import annotations

from typing import Protocol


class Positioned(Protocol):
    """What the keys need of a parsed message ID (``queues.engine.ids.MessageId``): its block
    and index. Declared here so that the keys import nothing of the IDs, which build on them."""

    @property
    def block(self) -> str: ...

    @property
    def index(self) -> int: ...


def incarnation(queue_id: int) -> str:
    """The store prefix of one incarnation of a queue (its row's id): every key above lies
    under it (``<KV_PREFIX><queue id>:<queue>/...``; a manager, a purge, a delete work in
    ``store.within(incarnation(id))``). A queue deleted and created again under its name
    gets a new row, so a stale owner of the old one (a node that has not heard of the delete)
    writes, if at all, under the old id: never into the new queue's tree, whatever the epochs."""
    return f"{queue_id}:"


def queue_prefix(queue: str) -> str:
    """Everything a queue keeps in the store lies under this prefix (at any depth)."""
    return queue


def partition_prefix(queue: str, partition: int) -> str:
    return f"{queue}/{partition}"


def message_key(queue: str, partition: int, block_id: str, index: int) -> str:
    """A message's key, which is also its message ID."""
    return f"{queue}/{partition}/{block_id}/{index}"


def message_keys(queue: str, partition: int, block_id: str, start: int, n: int) -> list[str]:
    """The keys of ``n`` messages of one block from index ``start``: :func:`message_key` of each."""
    prefix = block_bucket(queue, partition, block_id) + "/"
    return [prefix + str(i) for i in range(start, start + n)]


def block_bucket(queue: str, partition: int, block_id: str) -> str:
    """The bucket of a block's messages (their names are their indexes)."""
    return f"{queue}/{partition}/{block_id}"


def blocks_bucket(queue: str, partition: int) -> str:
    """The bucket of a partition's block records."""
    return f"{queue}/{partition}/_blocks"


def block_key(queue: str, partition: int, block_id: str) -> str:
    """Where a block's record lives: beside, not inside, the bucket of its messages."""
    return f"{blocks_bucket(queue, partition)}/{block_id}"


def fence_key(queue: str, partition: int) -> str:
    return f"{queue}/{partition}/_fence"


def head_key(queue: str, partition: int) -> str:
    """The head record's key: beside the fence (in Redis, a field of the same hash)."""
    return f"{queue}/{partition}/_head"


def position(mid: Positioned) -> str:
    """A message's name in the ``_receives``, ``_acks`` and ``_archive`` buckets: ``<block id>.<index>``."""
    return f"{mid.block}.{mid.index}"


def parse_position(name: str) -> tuple[str, int] | None:
    """``(block id, index)`` of a name made by :func:`position`, None for anything else."""
    block_id, _, idx = name.rpartition(".")
    if not block_id or not idx.isdigit() or (idx[0] == "0" and idx != "0"):
        return None  # (leading zeros: no index is written so, and no message ID reads so)
    return block_id, int(idx)


def receives_bucket(queue: str, partition: int, subscription: str = "") -> str:
    """Where a cursor's receive counts are kept: a queue's (``""``) or a subscription's."""
    bucket = f"{queue}/{partition}/_receives"
    return f"{bucket}/{subscription}" if subscription else bucket


def receives_key(queue: str, partition: int, mid: Positioned, subscription: str = "") -> str:
    """Where a redelivered message's receive count is kept (survives a takeover)."""
    return f"{receives_bucket(queue, partition, subscription)}/{position(mid)}"


def acks_bucket(queue: str, partition: int, subscription: str) -> str:
    """Where a subscription's acks of messages other subscriptions still hold are marked."""
    return f"{queue}/{partition}/_acks/{subscription}"


def ack_key(queue: str, partition: int, subscription: str, mid: Positioned) -> str:
    return f"{acks_bucket(queue, partition, subscription)}/{position(mid)}"


def archive_bucket(queue: str, partition: int) -> str:
    """The archive journal's bucket (its names: ``queues.engine.archive_journal``)."""
    return f"{queue}/{partition}/_archive"


def block_and_index(key: str) -> tuple[str, int]:
    """``"<queue>/<p>/<block id>/<index>"`` -> ``(block id, index)``, for a key known to be a
    message's (hot paths: no regex, unlike ``queues.engine.ids.parse_message_id``)."""
    _, block_id, idx = key.rsplit("/", 2)  # (one split, not three partitions: a dequeue runs it per message)
    return block_id, int(idx)
