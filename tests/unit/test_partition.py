"""The partition manager against a simple model, on the in-memory store.

Random sequences of enqueue / dequeue / ack / clock advance / takeover (a new owner with a
newer epoch, the old one left running as a stale owner; or after the row was restored from a
backup, its epoch and head pointer behind the store) must never lose a confirmed message,
never issue a message ID twice, never let a stale owner write, deliver first deliveries in
enqueue order, and leave nothing behind once everything is acknowledged.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from queues.engine import partition as partition_mod
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.keys import block_key
from queues.engine.partition import (
    PartitionManager,
    PartitionUnavailable,
    ReceiptMismatch,
)
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow, next_owner


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def open_manager(store, row: PartitionRow, block_size: int, cache_bytes: int, growth: int = 1) -> PartitionManager:
    m = next_owner(store, row, block_size=block_size, cache_bytes=cache_bytes, block_growth=growth)
    m.open()
    return m


def delivered_by(m: PartitionManager) -> list[str]:
    """The IDs ``m`` delivers, five at a time, until it has none left (nothing acked)."""
    delivered: list[str] = []
    while batch := m.load_bodies(m.dequeue(5, 30.0)):
        delivered += [d.id for d in batch]
    return delivered


class PartitionMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = FakeClock()
        self._saved = partition_mod.monotonic
        partition_mod.monotonic = self.clock
        self.store = MemoryStore()
        self.row = PartitionRow()
        self.block_size = 3
        self.growth = 1
        self.cache_bytes = 0
        self.m: PartitionManager | None = None
        self.stale: PartitionManager | None = None
        self.taken_over_at = 0.0
        self.seq = 0
        self.order: dict[str, int] = {}  # id -> enqueue sequence
        self.live: dict[str, str] = {}  # confirmed and not acknowledged: id -> body
        self.receipts: dict[str, tuple[str, float]] = {}  # id -> (receipt, deadline) this owner
        self.first_delivered: set[str] = set()
        self.last_first = -1
        self.backup: tuple[int, str | None] | None = None  # the row as a database backup has it

    @rule(block_size=st.integers(1, 4), growth=st.sampled_from([1, 4]), cache=st.sampled_from([0, 1 << 20]))
    @precondition(lambda self: self.m is None)
    def start(self, block_size, growth, cache):
        # (growth 4: blocks that fill within a second grow, up to 4 times block_size; the
        # clock's steps of 0.1, 1 and 10 s make them grow, stop growing and get sealed)
        self.block_size, self.growth, self.cache_bytes = block_size, growth, cache
        self.m = open_manager(self.store, self.row, block_size, cache, growth)

    @rule(n=st.integers(1, 5))
    @precondition(lambda self: self.m is not None)
    def enqueue(self, n):
        bodies = [f"m{self.seq + i}" for i in range(n)]
        ids = self.m.enqueue([StoredMessage(b, 0.0) for b in bodies])
        for mid, body in zip(ids, bodies):
            assert mid not in self.order, "message ID issued twice"
            assert parse_message_id(mid) is not None
            self.order[mid] = self.seq
            self.seq += 1
            self.live[mid] = body

    @rule(n=st.integers(1, 6), vis=st.sampled_from([0.5, 5.0]))
    @precondition(lambda self: self.m is not None)
    def dequeue(self, n, vis):
        got = self.m.load_bodies(self.m.dequeue(n, vis))
        for d in got:
            assert d.id in self.live, f"delivered {d.id}, which was acknowledged or never confirmed"
            assert d.message.body == self.live[d.id]
            held = self.receipts.get(d.id)
            assert held is None or held[1] <= self.clock.now, "delivered while hidden"
            if d.id not in self.first_delivered and held is None:
                # first delivery by this owner: in enqueue order
                assert self.order[d.id] > self.last_first, "first deliveries out of order"
                self.last_first = self.order[d.id]
            self.first_delivered.add(d.id)
            self.receipts[d.id] = (d.receipt, self.clock.now + vis)

    @rule(data=st.data())
    @precondition(lambda self: self.m is not None and self.receipts)
    def ack(self, data):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.receipts)), min_size=1, max_size=4, unique=True))
        stale = data.draw(st.booleans())
        items = [(parse_message_id(i), "stale-receipt" if stale else self.receipts[i][0]) for i in ids]
        try:
            self.m.ack(items)
        except ReceiptMismatch:
            assert stale
            return
        for i in ids:
            self.live.pop(i, None)
            self.receipts.pop(i)

    @rule(dt=st.sampled_from([0.1, 1.0, 10.0]))
    def advance(self, dt):
        self.clock.now += dt

    @rule()
    @precondition(lambda self: self.m is not None)
    def takeover(self):
        # a new owner takes the partition; the old one keeps running, unaware
        self.stale = self.m
        self.m = open_manager(self.store, self.row, self.block_size, self.cache_bytes, self.growth)
        self.taken_over_at = self.clock.now
        self.receipts.clear()
        self.first_delivered.clear()
        self.last_first = -1

    @rule()
    def back_up_the_database(self):
        self.backup = (self.row.epoch, self.row.head)

    @rule()
    @precondition(lambda self: self.m is not None and self.backup is not None)
    def restore_the_database_and_take_over(self):
        # the row goes back to the backup (its epoch and head pointer: the store is ahead of
        # both), and a new owner claims it while the current one runs on, unaware
        self.row.epoch, self.row.head = self.backup
        self.takeover()

    @rule()
    @precondition(lambda self: self.stale is not None)
    def stale_owner_enqueues(self):
        before = {k: dict(v) for k, v in self.store.buckets.items()}
        with pytest.raises(PartitionUnavailable):
            self.stale.enqueue([StoredMessage("from a stale owner", 0.0)])
        after = {k: dict(v) for k, v in self.store.buckets.items()}
        assert before == after, "a stale owner changed the store"

    @rule()
    @precondition(
        lambda self: self.stale is not None and self.clock.now - self.taken_over_at > partition_mod.FENCE_TRUST
    )
    def stale_owner_dequeues(self):
        # past its trust in the store's last word, a stale owner reads the fence: it delivers
        # nothing more from memory
        with pytest.raises(PartitionUnavailable):
            self.stale.dequeue(10, 5.0)

    @invariant()
    def blocks_hold_at_most_growth_times_block_size(self):
        if self.m is not None:
            assert all(1 <= b.size <= self.block_size * self.growth for b in self.m.tree.blocks.values())

    @invariant()
    def store_holds_every_live_message(self):
        for mid in self.live:
            assert self.store.get(mid) is not None, f"confirmed message {mid} lost"

    def teardown(self):
        try:
            if self.m is None:
                return
            # drain: everything confirmed and not acknowledged comes back, once more at least
            self.clock.now += 100
            for _ in range(len(self.live) + 2):
                got = self.m.load_bodies(self.m.dequeue(1000, 5.0))
                if not got:
                    break
                self.m.ack([(parse_message_id(d.id), d.receipt) for d in got])
                for d in got:
                    self.live.pop(d.id, None)
            assert not self.live, f"never delivered: {sorted(self.live)[:5]}"
            # and nothing is left but the head block's record and the fence
            messages = {b for b in self.store.buckets if not b.endswith(("/_blocks",)) and b != "q/0"}
            assert not messages, messages
            head = self.row.head
            blocks = set(self.store.buckets.get("q/0/_blocks", {}))
            assert blocks <= {head}, f"unpruned blocks {blocks - {head}}"
        finally:
            partition_mod.monotonic = self._saved


PartitionMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPartitionManager = PartitionMachine.TestCase


def test_block_key_is_beside_the_messages():
    assert block_key("q", 0, "00000001-aaaaaaaaaaaaaaaa") == "q/0/_blocks/00000001-aaaaaaaaaaaaaaaa"


class FlakyStore(MemoryStore):
    """Fails the next ``fail_scans`` scans: a store that drops out mid-takeover."""

    fail_scans = 0

    def scan(self, bucket):
        if self.fail_scans:
            self.fail_scans -= 1
            from queues.kv import KVError

            raise KVError("store unreachable")
        return super().scan(bucket)


def test_a_store_failure_while_scanning_an_unscanned_block_closes_and_loses_nothing():
    # given 12 messages in blocks of 3, and a new owner whose store fails while it reads them
    store, row = FlakyStore(), PartitionRow()
    first = open_manager(store, row, 3, 0)
    ids = first.enqueue([StoredMessage(f"m{i}", 0.0) for i in range(12)])
    second = open_manager(store, row, 3, 0)
    got = second.load_bodies(second.dequeue(2, 30.0))
    assert [d.id for d in got] == ids[:2]
    store.fail_scans = 1
    # when the next block cannot be scanned
    with pytest.raises(PartitionUnavailable):
        second.dequeue(10, 30.0)
    # then that manager is closed (no half-read state goes on serving)...
    assert second.closed
    with pytest.raises(PartitionUnavailable):
        second.dequeue(10, 30.0)
    # ...and the next owner delivers every message, none skipped
    assert delivered_by(open_manager(store, row, 3, 0)) == ids


class FailingBlockStore(MemoryStore):
    """Fails the next ``fail_block_puts`` writes of a block record: a store that drops out
    (or a timeout whose write may have landed, with ``lands``) while a new block is added."""

    fail_block_puts = 0
    lands = False

    def put_many(self, items, *, fence=None):
        if self.fail_block_puts and any("/_blocks/" in key for key, _ in items):
            self.fail_block_puts -= 1
            if self.lands:
                super().put_many(items, fence=fence)
            from queues.kv import KVError

            raise KVError("store unreachable")
        return super().put_many(items, fence=fence)


class FlakyRow(PartitionRow):
    """A head pointer whose next ``fail_sets`` writes fail like a database that restarts; with
    ``lands`` the write committed and only its answer was lost."""

    fail_sets = 0
    lands = False

    def set_head(self, lease, node_id, head):
        if self.fail_sets:
            self.fail_sets -= 1
            if self.lands:
                super().set_head(lease, node_id, head)
            from django.db import OperationalError

            raise OperationalError("terminating connection due to administrator command")
        super().set_head(lease, node_id, head)


@pytest.mark.parametrize("lands", [False, True])
@pytest.mark.parametrize("failing", ["store", "database"])
def test_a_store_outage_while_adding_a_block_keeps_serving_and_loses_nothing(failing, lands):
    # given a partition with blocks of 3 holding 4 messages (the head block has room for 2)
    store, row = FailingBlockStore(), FlakyRow()
    m = open_manager(store, row, 3, 0)
    ids = m.enqueue([StoredMessage(f"m{i}", 0.0) for i in range(4)])
    # when the next block's record (or the head pointer) cannot be written
    if failing == "store":
        store.fail_block_puts, store.lands = 1, lands
    else:
        row.fail_sets, row.lands = 1, lands
    with pytest.raises(Exception) as failed:
        m.enqueue([StoredMessage(f"n{i}", 0.0) for i in range(3)])
    assert failed.type.__name__ in ("PartitionUnavailable", "OperationalError")
    # then the manager still serves once the store is back: no reopen, no new epoch
    assert not m.closed
    ids += m.enqueue([StoredMessage(f"k{i}", 0.0) for i in range(5)])
    m.tree._check()
    # and a new owner (reading the row's pointer, whichever the failure left) finds them all
    assert delivered_by(open_manager(store, row, 3, 0)) == ids


def test_a_busy_partition_grows_its_blocks_and_seals_a_grown_one_that_stays_open(monkeypatch):
    # given a partition with blocks of 4 that may grow to 4 times that, on a clock of our own
    clock = FakeClock()
    monkeypatch.setattr(partition_mod, "monotonic", clock)
    store, row = MemoryStore(), PartitionRow()
    m = open_manager(store, row, 4, 0, growth=4)

    def sizes_of(ids: list[str]) -> list[int]:
        blocks = dict.fromkeys(parse_message_id(i).block for i in ids)
        return [m.tree.blocks[b].size for b in blocks]

    # when the first blocks fill at once: each next one is twice the size, up to 16
    ids = m.enqueue([StoredMessage(f"a{i}", 0.0) for i in range(4 + 8 + 16 + 16 + 1)])
    assert sizes_of(ids) == [4, 8, 16, 16, 16]
    # when the head (grown, 15 positions free) stays open past BLOCK_SEAL_S
    clock.now += partition_mod.BLOCK_SEAL_S + 0.1
    late = m.enqueue([StoredMessage("b", 0.0)])
    # then it is sealed, and the next block is of the queue's own size again
    assert sizes_of(late) == [4]
    # when that one takes longer than BLOCK_GROW_S to fill, the next does not grow
    clock.now += 0.5
    filling = m.enqueue([StoredMessage(f"c{i}", 0.0) for i in range(3)])
    clock.now += 1.0
    slow = m.enqueue([StoredMessage("d", 0.0)])
    assert sizes_of(slow) == [4]
    # and a block of the base size is never sealed early, however long it stays open
    clock.now += 100.0
    same = m.enqueue([StoredMessage("e", 0.0)])
    assert parse_message_id(same[0]).block == parse_message_id(slow[0]).block
    m.tree._check()
    # and a new owner finds every message, in order, past the sealed block's unused positions
    assert delivered_by(open_manager(store, row, 4, 0, growth=4)) == ids + late + filling + slow + same


def test_a_manager_not_told_of_a_purge_delivers_nothing_once_its_trust_ran_out(monkeypatch):
    """Fences stop writes only, and a first delivery writes nothing (IDs from memory, bodies
    from the cache): a manager reads its fence before delivering once FENCE_TRUST has passed
    since the store last confirmed its epoch, and not before."""
    clock = FakeClock()
    monkeypatch.setattr(partition_mod, "monotonic", clock)
    store, row = MemoryStore(), PartitionRow()
    m = open_manager(store, row, 4, 1 << 20)
    ids = m.enqueue([StoredMessage(f"m{i}", 0.0) for i in range(4)])
    reads: list[str] = []
    real = store.read_fence
    monkeypatch.setattr(store, "read_fence", lambda key: reads.append(key) or real(key))
    # given deliveries within FENCE_TRUST of the enqueue (a fenced write that went through):
    # no read
    assert [d.id for d in m.load_bodies(m.dequeue(1, 30.0))] == ids[:1]
    assert reads == []
    # past it, one read, then deliveries on its word for FENCE_TRUST more
    clock.now += partition_mod.FENCE_TRUST + 0.01
    assert [d.id for d in m.load_bodies(m.dequeue(1, 30.0))] == ids[1:2]
    assert [d.id for d in m.load_bodies(m.dequeue(1, 30.0))] == ids[2:3]
    assert len(reads) == 1
    # when a purge moves the fence past its epoch and the manager is not told
    store.advance_fence(m.fence.key, m.fence.epoch + 1)
    clock.now += partition_mod.FENCE_TRUST + 0.01
    # then it delivers nothing more (the bodies are still in the node's cache), and closes
    with pytest.raises(PartitionUnavailable):
        m.dequeue(10, 30.0)
    assert m.closed
