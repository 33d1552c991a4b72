"""The archive journal: what a partition's owner leaves in the key-value store for the archiver.

Bucket ``<queue>/<partition>/_archive``; names ``e.<block id>.<index>`` (an *entry*: the
StoredMessage bytes) and ``a.<block id>.<index>`` (an *ack marker*: the ack time, wall-clock
seconds as ASCII decimal). The owner writes them with its fence, beside its own writes:

- mode ``all``: the entries in the same ``put_many`` as the messages (atomic with them where
  the backend batches atomically), a marker at each ack before the delete;
- mode ``acked``: entry and marker together, at each ack before the delete.

The archiver (``archive.archiver``) copies them to the archive table and only then deletes
exactly the names it read, so a journaled message is never lost, at worst copied twice.
Expired and dead-lettered messages are removed without a marker (they were not acknowledged).
A topic's message that retention moves to the archive while a subscription holds it is written
to the table by the owner itself (``PartitionManager._expire_topic``); its later ack is a
marker alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from queues.engine import keys
from queues.engine.body_cache import BodyCache
from queues.engine.ids import MessageId, StoredMessage, parse_message_id
from queues.kv.base import KeyValueStore

ENTRY = "e"
MARKER = "a"


def bucket(queue: str, partition: int) -> str:
    return keys.archive_bucket(queue, partition)


def _name(kind: str, mid: MessageId) -> str:
    return f"{kind}.{keys.position(mid)}"


def entries(queue: str, partition: int, items: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Journal entries for ``(message id, StoredMessage bytes)`` pairs."""
    b = bucket(queue, partition)
    out = []
    for mid, raw in items:
        parsed = parse_message_id(mid)
        if parsed is not None:
            out.append((f"{b}/{_name(ENTRY, parsed)}", raw))
    return out


def markers(queue: str, partition: int, mids: Sequence[MessageId], at: float) -> list[tuple[str, bytes]]:
    """Ack markers for ``mids``, acknowledged at ``at`` (epoch seconds)."""
    b = bucket(queue, partition)
    value = repr(float(at)).encode()
    return [(f"{b}/{_name(MARKER, m)}", value) for m in mids]


def on_ack(
    store: KeyValueStore, cache: BodyCache, queue: str, partition: int, mode: str, mids: Sequence[MessageId], at: float
) -> list[tuple[str, bytes]]:
    """What to journal before the delete of an ack: markers (mode ``all``), or entries and
    markers of the messages still stored (mode ``acked``; bodies from the cache, else one
    batched read). Raises the store's errors (the ack then fails and changes nothing)."""
    if mode == "all":
        return markers(queue, partition, mids, at)
    if mode != "acked":
        return []
    found: list[tuple[MessageId, bytes]] = []
    missing: list[MessageId] = []
    for m in mids:
        cached = cache.get(str(m))
        if cached is not None:
            found.append((m, cached.to_bytes()))
        else:
            missing.append(m)
    stubs: list[MessageId] = []
    if missing:
        for m, raw in zip(missing, store.get_many([str(m) for m in missing])):
            if raw is None:
                continue  # gone already: acknowledged before, nothing to archive
            if StoredMessage.from_bytes(raw, str(m)).archived:
                stubs.append(m)  # retention archived it already: the ack time is what is new
            else:
                found.append((m, raw))
    return entries(queue, partition, [(str(m), raw) for m, raw in found]) + markers(
        queue, partition, [m for m, _ in found] + stubs, at
    )


def parse_name(queue: str, partition: int, name: str) -> tuple[str, str] | None:
    """``("e" | "a", message id)`` for a journal name, None for anything else."""
    kind, _, rest = name.partition(".")
    pos = keys.parse_position(rest)
    if kind not in (ENTRY, MARKER) or pos is None:
        return None
    mid = keys.message_key(queue, partition, *pos)
    return (kind, mid) if parse_message_id(mid) is not None else None
