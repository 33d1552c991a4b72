"""Purging a partition: remove every message, with or without the owner's help.

Any node (or the admin) can purge; the owner need not answer, and an unowned partition is
purged the same way. The order makes it safe against the owner and against the next one:

1. One transaction on the row: the epoch moves on (past the store's fence, if that is ahead),
   the owner is cleared and the head pointer emptied. The old owner's renewal and head updates
   now fail (they compare the epoch), and the next owner starts an empty tree under a newer
   epoch, in blocks with new random IDs.
2. The fence in the store is raised to the purge's epoch, so every later write of the old
   owner is refused (a newer owner may have raised it further already: also fine), and the
   store's head record (``queues.engine.keys.head_key``) is emptied like the row's pointer.
3. The old tree is walked from the old head and each of its blocks deleted with the messages
   in it, by name. Only blocks reachable from the old head are touched, so the next owner's
   blocks never are, even while it enqueues during the purge.

Messages the old owner confirmed before step 2 are in the old tree and go with it: a purge
removes what was enqueued before it finished. The old owner stops serving at its next
renewal; the node that purges closes its own managers at once and tells the other owners.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

from django.db import transaction

from queues.engine.keys import (
    block_bucket,
    block_key,
    fence_key,
    head_key,
    incarnation,
    parse_position,
    receives_bucket,
)
from queues.engine.tree import AppendTree, Block, CorruptTree, head_record, newest_head, parse_head_record
from queues.kv import Fence, Fenced, KeyValueStore
from queues.models import Partition

log = logging.getLogger(__name__)

#: keys deleted per store call.
BATCH = 1000


def purge_partition(partition_id: int, store: KeyValueStore) -> int | None:
    """Empty one partition (see the module's text). Returns how many messages were removed,
    or None when the row is gone: the queue was deleted (its messages with it) since the
    caller listed its partitions."""
    with transaction.atomic():
        # Only the partition's row is locked (not the queue's: a delete locks that one first).
        p = Partition.objects.select_for_update(of=("self",)).select_related("queue").filter(pk=partition_id).first()
        if p is None:
            return None
        queue, index = p.queue.name, p.index
        store = store.within(incarnation(p.queue_id))
        # Past the fence too when it is ahead of the row (a restored database): every owner,
        # the ones the row forgot included, is fenced out.
        epoch = max(p.epoch, store.read_fence(fence_key(queue, index))) + 1
        block_size = p.queue.block_size

        def read(block_id: str) -> Block | None:
            key = block_key(queue, index, block_id)
            raw = store.get(key)
            return Block.from_bytes(raw, key) if raw is not None else None

        Partition.objects.filter(pk=partition_id).update(
            epoch=epoch,
            owner=None,
            lease_nonce=secrets.token_hex(8),
            head_block="",
            lease_acquired_at=None,
            lease_renewed_at=None,
            enqueue_id="",
            dequeue_id="",
            depth=0,
            in_flight=0,
            delayed=0,
            tree_height=0,
            live_blocks=0,
            oldest_enqueued_at=None,
        )
        # Before the row is free again: the old owner's writes are refused from here on.
        store.advance_fence(fence_key(queue, index), epoch)
        # The old tree as the store leads to it (the row may be behind: newest_head), read
        # after the fence, so no owner moves it since; then the store's head record is emptied
        # as the row's pointer was, so the next owner starts an empty tree.
        record_key = head_key(queue, index)
        old_head = newest_head(p.head_block or None, parse_head_record(store.get(record_key), record_key), read)
        try:
            store.put(record_key, head_record(epoch, None), fence=Fence(fence_key(queue, index), epoch))
        except Fenced:
            log.warning("purge %s/%s: a newer epoch holds the fence; its owner keeps the head record", queue, index)
    if not old_head:
        return 0

    try:
        tree = AppendTree.load(old_head, read, block_size)
    except CorruptTree:
        log.warning("purge %s/%s: old head %s is gone already", queue, index, old_head)
        return 0
    removed = 0
    doomed: list[str] = []
    for block in tree.iter_from_oldest(read):
        bucket = block_bucket(queue, index, block.id)
        doomed.extend(f"{bucket}/{name}" for name in store.scan(bucket))
        if len(doomed) >= BATCH:
            removed += store.delete_many(doomed)
            doomed = []
    removed += store.delete_many(doomed) if doomed else 0
    # Blocks after their messages, so that a purge cut short leaves no message without its block.
    for keys in _chunks([block_key(queue, index, b) for b in tree.blocks], BATCH):
        store.delete_many(keys)
    # Saved receive counts of the old blocks (names are "<block id>.<index>"); the next
    # owner's are left alone.
    receives = receives_bucket(queue, index)
    old = [n for n in store.scan(receives) if (pos := parse_position(n)) is not None and pos[0] in tree.blocks]
    for names in _chunks(old, BATCH):
        store.delete_many([f"{receives}/{n}" for n in names])
    return removed


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
