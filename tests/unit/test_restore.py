"""What operators do to the stores: a partition row restored from a backup (its epoch and head
pointer behind the key-value store), or rebuilt from the queue descriptions alone.

The partition manager on the in-memory store, with the row stood in by ``PartitionRow``; the
same on real processes, PostgreSQL and Redis is in ``tests/integration/test_restore.py``.
"""

from __future__ import annotations

import pytest

from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.keys import fence_key, head_key
from queues.engine.partition import PartitionManager, PartitionUnavailable
from queues.engine.tree import AppendTree, head_record, newest_head, parse_head_record
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow, next_owner


def opened(store: MemoryStore, row: PartitionRow, block_size: int = 2) -> PartitionManager:
    m = next_owner(store, row, block_size=block_size)
    m.open()
    return m


def enqueue(m: PartitionManager, n: int, tag: str) -> list[str]:
    return m.enqueue([StoredMessage(f"{tag}{i}", 0.0) for i in range(n)])


def drain(m: PartitionManager) -> list[str]:
    out: list[str] = []
    while got := m.load_bodies(m.dequeue(100, 30.0)):
        m.ack([(parse_message_id(d.id), d.receipt) for d in got])
        out.extend(d.id for d in got)
    return out


def test_an_owner_meeting_a_fence_ahead_moves_past_it_at_once():
    # given a partition whose fence is 39 epochs ahead of its row (as after a restore)
    store, row = MemoryStore(), PartitionRow()
    first = opened(store, row)
    before = enqueue(first, 5, "a")
    store.advance_fence(fence_key("q", 0), row.epoch + 39)
    stale_epoch = store.read_fence(fence_key("q", 0))
    # when the next owner opens it: one open, not one lease period per epoch
    m = opened(store, row)
    # then it holds the epoch past the fence, alone, and serves
    assert m.lease.epoch == stale_epoch + 1 == row.epoch == store.read_fence(fence_key("q", 0))
    after = enqueue(m, 5, "b")
    with pytest.raises(PartitionUnavailable):
        enqueue(first, 1, "stale")  # the earlier owner writes nothing
    assert sorted(drain(m)) == sorted(before + after)


def test_an_epoch_the_row_hands_out_again_is_never_shared():
    # given owner A (epoch 1), a backup of the row, then owner B (epoch 2) who enqueues
    store, row = MemoryStore(), PartitionRow()
    a = opened(store, row)
    first = enqueue(a, 3, "a")
    backup = (row.epoch, row.head)
    b = opened(store, row)
    second = enqueue(b, 3, "b")
    # when the row is restored and C claims it: the row gives C epoch 2, B's
    row.epoch, row.head = backup
    c = opened(store, row)
    # then C moved past B's epoch, and B (still running) can write nothing more
    assert c.lease.epoch == 3
    with pytest.raises(PartitionUnavailable):
        enqueue(b, 1, "stale")
    assert sorted(drain(c)) == sorted(first + second)


def test_the_store_leads_a_new_owner_to_blocks_a_restored_row_forgot():
    # given a backup of the row taken after 3 messages, then 20 more (10 more blocks)
    store, row = MemoryStore(), PartitionRow()
    a = opened(store, row)
    ids = enqueue(a, 3, "a")
    backup = (row.epoch, row.head)
    ids += enqueue(a, 20, "b")
    # when the row is restored to the backup and another owner opens the partition
    row.epoch, row.head = backup
    m = opened(store, row)
    # then it follows the store's head record, points the row at it again, and loses nothing
    assert row.head == parse_head_record(store.get(head_key("q", 0)))[1] == m.tree.head.id
    ids += enqueue(m, 2, "c")
    assert sorted(drain(m)) == sorted(ids)


def test_a_row_rebuilt_from_the_queue_description_alone_loses_nothing():
    store, row = MemoryStore(), PartitionRow()
    a = opened(store, row, block_size=3)
    ids = enqueue(a, 17, "a")
    row.epoch, row.head = 0, None  # a fresh row: epoch 0, no head
    m = opened(store, row, block_size=3)
    assert m.lease.epoch == 2
    assert sorted(drain(m)) == sorted(ids)


def test_the_head_record_is_written_with_each_new_block_under_the_fence():
    store, row = MemoryStore(), PartitionRow()
    m = opened(store, row, block_size=2)
    enqueue(m, 1, "a")
    calls = store.calls["put_many"]
    enqueue(m, 1, "a")  # same block: no record written
    assert store.calls["put_many"] == calls + 1
    enqueue(m, 1, "a")  # a new block: the record rides in its write (no extra round trip)
    assert store.calls["put_many"] == calls + 3  # the block (with the record), the message
    assert parse_head_record(store.get(head_key("q", 0))) == (m.lease.epoch, m.tree.head.id)


class Blocks(dict):
    def read(self, block_id):
        return self.get(block_id)


def _tree(n: int) -> tuple[Blocks, list[str]]:
    tree, blocks = AppendTree(1), Blocks()
    ids = []
    for _ in range(n):
        b = tree.allocate()
        blocks[b.id] = b
        ids.append(b.id)
    return blocks, ids


def test_newest_head_takes_the_newer_present_head():
    blocks, ids = _tree(6)
    read = blocks.read
    assert newest_head(ids[2], None, read) == ids[2]  # no record (written before it existed)
    assert newest_head(None, (5, ids[4]), read) == ids[4]  # a row rebuilt: the store's
    assert newest_head(ids[1], (5, ids[4]), read) == ids[4]  # a row restored: the store's
    assert newest_head(ids[5], (5, ids[4]), read) == ids[5]  # a record behind (an older owner wrote on)
    del blocks[ids[5]]
    assert newest_head(ids[5], (5, ids[4]), read) == ids[4]  # a store restored: the row's head is gone
    assert newest_head(ids[3], (6, None), read) == ids[3]  # emptied, yet newer blocks: keep them
    del blocks[ids[3]]
    assert newest_head(ids[3], (6, None), read) is None  # purged since the row's backup


def test_head_record_round_trip():
    assert parse_head_record(head_record(7, "0000002a-aa")) == (7, "0000002a-aa")
    assert parse_head_record(head_record(8, None)) == (8, None)
    assert parse_head_record(None) is None
