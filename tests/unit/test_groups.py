"""Message groups in the partition manager (docs/explanation/correctness.md, invariant 4), against a model.

Random sequences of enqueue (several groups plus ungrouped messages, some delayed) / dequeue /
ack / visibility change / clock advance / takeover (a new owner with a newer epoch, the old
one abandoned), optionally with ``max_receives`` so that some messages are dead-lettered, must
keep to:

1. a group's message is never delivered while an earlier message of the group is still live
   (not acknowledged, not dead-lettered): delivery in sequence order (with ``group_batch``,
   unless that one is delivered before it by the same dequeue);
2. never two messages of one group in flight at once (delivered by the current owner, not
   acknowledged, visibility not expired; the old owner's deliveries are forgotten at a
   takeover, since the new owner cannot know them: at least once); with ``group_batch``,
   never a message of a group delivered while one of an earlier dequeue is in flight;
3. a delayed message is never delivered before its ``not_before`` (wall clock);
4. sequence numbers increase with enqueue order, within a group and the partition, also
   across takeovers;
5. nothing confirmed and not acknowledged is lost: draining at the end brings back every
   live message.

Runs on the in-memory store, with fake monotonic and wall clocks that advance together.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from queues.engine import partition as partition_mod
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.partition import PartitionManager, PartitionUnavailable
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow, next_owner

GROUPS = ["g1", "g2", "g3", "g4"]


class Clocks:
    """A monotonic and a wall clock, advanced together."""

    def __init__(self):
        self.mono = 1000.0
        self.wall = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, dt: float) -> None:
        self.mono += dt
        self.wall += dt


def open_manager(
    store,
    row: PartitionRow,
    clocks: Clocks,
    *,
    block_size: int,
    cache_bytes: int = 0,
    max_receives: int | None = None,
    full: bool = True,
    batch: bool = False,
) -> PartitionManager:
    """A takeover: the next epoch opens the partition (both phases, or only the head)."""
    m = next_owner(store, row, block_size=block_size, cache_bytes=cache_bytes)
    m.wall = clocks.time  # before open: messages of unscanned blocks are routed by their delay
    m.max_receives = max_receives
    m.group_batch = batch
    if full:
        m.open()
    else:
        m.open_head()
    return m


class GroupMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clocks = Clocks()
        self._saved = partition_mod.monotonic
        partition_mod.monotonic = self.clocks.monotonic
        self.store = MemoryStore()
        self.row = PartitionRow()
        self.m: PartitionManager | None = None
        self.half_open = False
        #: the abandoned owner and the receipts it handed out.
        self.stale: PartitionManager | None = None
        self.stale_receipts: dict[str, str] = {}
        self.block_size = 2
        self.cache_bytes = 0
        self.max_receives: int | None = None
        self.batch = False
        self.groups = GROUPS[:1]
        # the model
        self.pos: dict[str, int] = {}  # id -> enqueue order
        self.group_of: dict[str, str | None] = {}
        self.by_group: dict[str, list[str]] = {}  # group -> ids in enqueue order
        self.not_before: dict[str, float | None] = {}
        self.body: dict[str, str] = {}
        self.live: set[str] = set()  # confirmed, not acked, not dead-lettered
        self.dead: set[str] = set()
        self.in_flight: dict[str, tuple[str, float]] = {}  # id -> (receipt, deadline), this owner
        self.deliveries: Counter[str] = Counter()
        self.last_seq = -1
        self.last_group_seq: dict[str, int] = {}

    @initialize(
        block_size=st.integers(1, 4),
        ngroups=st.integers(1, 4),
        max_receives=st.sampled_from([None, None, 1, 2, 3]),
        cache=st.sampled_from([0, 1 << 20]),
        batch=st.booleans(),
    )
    def start(self, block_size, ngroups, max_receives, cache, batch):
        self.block_size, self.max_receives, self.cache_bytes = block_size, max_receives, cache
        self.batch = batch
        self.groups = GROUPS[:ngroups]
        self.m = self._open(full=True)

    def _open(self, *, full: bool) -> PartitionManager:
        return open_manager(
            self.store,
            self.row,
            self.clocks,
            block_size=self.block_size,
            cache_bytes=self.cache_bytes,
            max_receives=self.max_receives,
            full=full,
            batch=self.batch,
        )

    # --- rules --------------------------------------------------------------------------------
    @rule(
        items=st.lists(
            st.tuples(st.sampled_from([None, 0, 1, 2, 3]), st.sampled_from([None, None, None, 0.0, 0.5, 3.0, 20.0])),
            min_size=1,
            max_size=5,
        )
    )
    def enqueue(self, items):
        msgs = []
        for gi, delay in items:
            group = None if gi is None else self.groups[gi % len(self.groups)]
            nb = None if delay is None else self.clocks.wall + delay
            msgs.append(StoredMessage(f"b{len(self.pos) + len(msgs)}", self.clocks.wall, group=group, not_before=nb))
        ids = self.m.enqueue(msgs)
        assert len(ids) == len(msgs)
        for mid, msg in zip(ids, msgs):
            assert mid not in self.pos, "message ID issued twice"
            raw = self.store.get(mid)
            assert raw is not None, "confirmed but not stored"
            stored = StoredMessage.from_bytes(raw)
            assert (stored.body, stored.group, stored.not_before) == (msg.body, msg.group, msg.not_before)
            # (4) sequence numbers increase with enqueue order, across takeovers too
            assert stored.sequence > self.last_seq, "partition sequence went backwards"
            self.last_seq = stored.sequence
            if msg.group is not None:
                assert stored.sequence > self.last_group_seq.get(msg.group, -1), "group sequence went backwards"
                self.last_group_seq[msg.group] = stored.sequence
                self.by_group.setdefault(msg.group, []).append(mid)
            self.pos[mid] = len(self.pos)
            self.group_of[mid] = msg.group
            self.not_before[mid] = msg.not_before
            self.body[mid] = msg.body
            self.live.add(mid)

    @rule(n=st.integers(1, 10), vis=st.sampled_from([0.5, 5.0, 30.0]))
    def dequeue(self, n, vis):
        got = self._dequeue(n, vis)
        if self.half_open:
            assert got == [], "delivered before the oldest live block was reached"

    def _ackable(self) -> list[str]:
        """What a consumer may acknowledge: in a batch, a message whose visibility ran out goes
        back to its group at the next dequeue, and its receipt is no longer current then."""
        now = self.clocks.mono
        return sorted(i for i, (_, dl) in self.in_flight.items() if not self.batch or dl > now)

    @rule(data=st.data())
    @precondition(lambda self: self._ackable())
    def ack(self, data):
        ids = data.draw(st.lists(st.sampled_from(self._ackable()), min_size=1, max_size=4, unique=True))
        removed = self.m.ack([(parse_message_id(i), self.in_flight[i][0]) for i in ids])
        assert removed == len(ids)
        for i in ids:
            self.live.discard(i)
            del self.in_flight[i]

    @rule(data=st.data())
    @precondition(lambda self: any(dl > self.clocks.mono for _, dl in self.in_flight.values()))
    def change_visibility_to_zero(self, data):
        hidden = sorted(i for i, (_, dl) in self.in_flight.items() if dl > self.clocks.mono)
        mid = data.draw(st.sampled_from(hidden))
        receipt = self.in_flight[mid][0]
        with self.m.lock:
            self.m.change_visibility_locked(parse_message_id(mid), receipt, 0)
        self.in_flight[mid] = (receipt, self.clocks.mono)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 5.0, 30.0]))
    def advance(self, dt):
        self.clocks.advance(dt)

    @rule(full=st.booleans())
    def takeover(self, full):
        # the old owner is abandoned; its deliveries count as expired (at least once)
        self.stale = self.m
        self.stale_receipts = {i: self.in_flight[i][0] for i in self._ackable()}
        self.m = self._open(full=full)
        self.half_open = not full
        self.in_flight.clear()

    @rule(data=st.data())
    @precondition(lambda self: self.stale_receipts)
    def stale_owner_acks(self, data):
        # a consumer acks at the old owner: refused (fenced), and the store is unchanged, or the
        # new owner would hold a live head that is gone (its group blocked for good)
        ids = data.draw(st.lists(st.sampled_from(sorted(self.stale_receipts)), min_size=1, max_size=3, unique=True))
        before = {k: dict(v) for k, v in self.store.buckets.items()}
        with pytest.raises(PartitionUnavailable):
            self.stale.ack([(parse_message_id(i), self.stale_receipts[i]) for i in ids])
        assert {k: dict(v) for k, v in self.store.buckets.items()} == before, "a stale owner changed the store"

    @rule()
    @precondition(lambda self: self.half_open)
    def finish_open(self):
        self.m.open_oldest()
        self.half_open = False

    # --- checks -------------------------------------------------------------------------------
    def _dequeue(self, n: int, vis: float):
        deliveries = self.m.dequeue(n, vis)
        got = self.m.load_bodies(deliveries)
        assert len(got) == len(deliveries), "a delivered message had no body in the store"
        now = self.clocks.mono
        this_call: set[str] = set()
        for d in got:
            mid = d.id
            assert mid in self.live, f"delivered {mid}, which was acked, dead-lettered or never confirmed"
            assert d.message.body == self.body[mid]
            held = self.in_flight.get(mid)
            assert held is None or held[1] <= now, "delivered while hidden"
            # (3) never before its delay
            nb = self.not_before[mid]
            assert nb is None or nb <= self.clocks.wall, f"{mid} delivered {nb - self.clocks.wall}s early"
            group = self.group_of[mid]
            if group is not None:
                # (1) in sequence order: no earlier message of the group is still live
                earlier = [
                    x
                    for x in self.by_group[group]
                    if self.pos[x] < self.pos[mid] and x in self.live and not (self.batch and x in this_call)
                ]
                assert not earlier, f"{group}: {mid} delivered while earlier {earlier} still live"
                # (2) one in flight at a time (a batch: one dequeue's at a time)
                busy = [
                    x
                    for x, (_, dl) in self.in_flight.items()
                    if x != mid and self.group_of[x] == group and dl > now and not (self.batch and x in this_call)
                ]
                assert not busy, f"{group}: {mid} delivered while {busy} in flight"
                this_call.add(mid)
            if self.max_receives is not None:
                assert d.receive_count <= self.max_receives, "delivered past max_receives"
            self.deliveries[mid] += 1
            self.in_flight[mid] = (d.receipt, now + vis)
        self._move_dead()
        return got

    def _move_dead(self) -> None:
        """What the service does after a dequeue: copy to the dead-letter queue, then ack."""
        dead = self.m.take_dead()
        if not dead:
            return
        assert self.max_receives is not None, "dead-lettered without max_receives"
        for mid, count in dead:
            assert mid in self.live, f"dead-lettered {mid}, which is not live"
            assert count >= self.max_receives
            assert self.deliveries[mid] >= self.max_receives, "dead-lettered before max_receives deliveries"
        self.m.ack([(parse_message_id(mid), None) for mid, _ in dead])
        for mid, _ in dead:
            self.live.discard(mid)
            self.in_flight.pop(mid, None)
            self.dead.add(mid)

    @invariant()
    def store_holds_every_live_message(self):
        for mid in self.live:
            assert self.store.get(mid) is not None, f"confirmed message {mid} lost"
        for mid in self.dead:
            assert self.store.get(mid) is None, f"dead-lettered {mid} still stored"

    def teardown(self):
        try:
            if self.m is None:
                return
            if self.half_open:
                self.m.open_oldest()
                self.half_open = False
            # (5) drain: every live message comes back (or is dead-lettered)
            self.clocks.advance(1000)
            for _ in range(4 * len(self.live) + 20):
                if not self.live:
                    break
                got = self._dequeue(1000, 5.0)
                if got:
                    self.m.ack([(parse_message_id(d.id), d.receipt) for d in got])
                    for d in got:
                        self.live.discard(d.id)
                        del self.in_flight[d.id]
            assert not self.live, f"never delivered: {sorted(self.live, key=self.pos.get)[:5]}"
        finally:
            partition_mod.monotonic = self._saved


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestGroups = GroupMachine.TestCase


# --- examples -------------------------------------------------------------------------------------
@pytest.fixture
def clocks(monkeypatch):
    c = Clocks()
    monkeypatch.setattr(partition_mod, "monotonic", c.monotonic)
    return c


def _enqueue(m, clocks, *specs):
    """specs: (body, group) or (body, group, delay)."""
    msgs = [
        StoredMessage(s[0], clocks.wall, group=s[1], not_before=clocks.wall + s[2] if len(s) > 2 else None)
        for s in specs
    ]
    return m.enqueue(msgs)


def _bodies(m, n=10, vis=5.0):
    got = m.load_bodies(m.dequeue(n, vis))
    return [d.message.body for d in got], got


def _ack(m, got):
    m.ack([(parse_message_id(d.id), d.receipt) for d in got])


def test_group_delivered_one_at_a_time(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4)
    _enqueue(m, clocks, ("a1", "a"), ("x", None), ("a2", "a"), ("a3", "a"), ("y", None))
    bodies, got = _bodies(m, 10)
    assert sorted(bodies) == ["a1", "x", "y"]
    _ack(m, got)
    for expected in ("a2", "a3"):
        bodies, got = _bodies(m, 10)
        assert bodies == [expected]
        assert _bodies(m, 10)[0] == []  # the next waits for the ack
        _ack(m, got)
    assert _bodies(m, 10)[0] == []


def test_redelivered_head_blocks_its_group(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4)
    _enqueue(m, clocks, ("a1", "a"), ("a2", "a"), ("b1", "b"))
    bodies, got = _bodies(m, 10, vis=1.0)
    assert sorted(bodies) == ["a1", "b1"]
    _ack(m, [d for d in got if d.message.body == "b1"])
    clocks.advance(2.0)  # a1's visibility expires
    bodies, got = _bodies(m, 10, vis=1.0)
    assert bodies == ["a1"] and got[0].receive_count == 2
    clocks.advance(0.5)
    assert _bodies(m, 10)[0] == []  # a1 is in flight again: a2 waits
    with m.lock:
        m.change_visibility_locked(parse_message_id(got[0].id), got[0].receipt, 0)
    bodies, got = _bodies(m, 10)
    assert bodies == ["a1"] and got[0].receive_count == 3
    _ack(m, got)
    assert _bodies(m, 10)[0] == ["a2"]


@pytest.mark.parametrize("full", [True, False])
def test_group_order_across_takeover_unscanned_then_new(clocks, full):
    store, row = MemoryStore(), PartitionRow()
    old = open_manager(store, row, clocks, block_size=1)
    _enqueue(old, clocks, ("a1", "a"), ("x1", None), ("a2", "a"))
    _enqueue(old, clocks, ("a3", "a"))
    assert _bodies(old, 10)[0] == ["a1", "x1"]  # in flight at the old owner, never acked
    m = open_manager(store, row, clocks, block_size=1, full=full)
    _enqueue(m, clocks, ("a4", "a"), ("x2", None))
    _enqueue(m, clocks, ("a5", "a"))
    if not full:
        assert _bodies(m, 10)[0] == []
        m.open_oldest()
    seen = []
    for _ in range(20):
        bodies, got = _bodies(m, 10)
        grouped = [b for b in bodies if b.startswith("a")]
        assert len(grouped) <= 1, f"two of one group at once: {bodies}"
        seen += bodies
        _ack(m, got)
    assert [b for b in seen if b.startswith("a")] == ["a1", "a2", "a3", "a4", "a5"]
    assert sorted(b for b in seen if b.startswith("x")) == ["x1", "x2"]


def test_delayed_head_holds_its_group(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4)
    _enqueue(m, clocks, ("a1", "a", 10.0), ("a2", "a"), ("u", None, 5.0), ("v", None))
    assert _bodies(m, 10, vis=100.0)[0] == ["v"]
    clocks.advance(4.9)
    assert _bodies(m, 10, vis=100.0)[0] == []
    clocks.advance(0.1)
    assert _bodies(m, 10, vis=100.0)[0] == ["u"]
    clocks.advance(5.0)
    bodies, got = _bodies(m, 10)
    assert bodies == ["a1"]
    _ack(m, got)
    assert _bodies(m, 10)[0] == ["a2"]


def test_ack_at_a_stale_owner_is_fenced(clocks):
    store, row = MemoryStore(), PartitionRow()
    old = open_manager(store, row, clocks, block_size=4)
    _enqueue(old, clocks, ("a1", "a"), ("a2", "a"))
    _, got = _bodies(old, 10)
    m = open_manager(store, row, clocks, block_size=4)
    with pytest.raises(PartitionUnavailable):
        _ack(old, got)
    assert store.get(got[0].id) is not None
    bodies, got = _bodies(m, 10)
    assert bodies == ["a1"]  # at least once: redelivered by the new owner
    _ack(m, got)
    assert _bodies(m, 10)[0] == ["a2"]


def test_dead_letter_releases_the_group(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4, max_receives=1)
    _enqueue(m, clocks, ("a1", "a"), ("a2", "a"))
    assert _bodies(m, 10, vis=1.0)[0] == ["a1"]
    clocks.advance(2.0)
    assert _bodies(m, 10)[0] == []  # a1 is set aside, still holding the group
    dead = m.take_dead()
    assert [(parse_message_id(mid).index, count) for mid, count in dead] == [(0, 1)]
    m.ack([(parse_message_id(mid), None) for mid, _ in dead])
    assert _bodies(m, 10)[0] == ["a2"]


# --- batches of a group (group_batch: SQS FIFO) ----------------------------------------------------
def test_batch_takes_a_group_in_order_and_holds_it(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4, batch=True)
    _enqueue(m, clocks, ("a1", "a"), ("b1", "b"), ("a2", "a"), ("x", None), ("a3", "a"), ("a4", "a"), ("a5", "a"))
    bodies, first = _bodies(m, 3)
    assert bodies == ["a1", "a2", "a3"]  # as many of one group as there is room for
    bodies, second = _bodies(m, 10)
    assert bodies == ["b1", "x"]  # a's are held while its batch is out
    _ack(m, first[:2])
    assert _bodies(m, 10)[0] == []  # a3 is still out
    _ack(m, first[2:] + second)
    assert _bodies(m, 10)[0] == ["a4", "a5"]


def test_batch_message_visible_again_waits_for_the_rest_then_goes_in_order(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4, batch=True)
    _enqueue(m, clocks, ("a1", "a"), ("a2", "a"), ("a3", "a"), ("a4", "a"))
    bodies, got = _bodies(m, 3, vis=10.0)
    assert bodies == ["a1", "a2", "a3"]
    with m.lock:
        m.change_visibility_locked(parse_message_id(got[1].id), got[1].receipt, 0)
    assert _bodies(m, 10)[0] == []  # a1 and a3 are still out
    _ack(m, got[:1])
    assert _bodies(m, 10)[0] == []  # a3 is still out
    clocks.advance(11.0)  # a3's visibility runs out: the group is free
    bodies, again = _bodies(m, 10)
    assert bodies == ["a2", "a3", "a4"]
    assert [d.receive_count for d in again] == [2, 2, 1]
    assert m.redelivered_total == 2


def test_batch_given_back_is_delivered_again_first(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4, batch=True)
    _enqueue(m, clocks, ("a1", "a"), ("a2", "a"), ("b1", "b"))
    got = m.dequeue(2, 5.0)
    m.give_back(got)
    bodies, got = _bodies(m, 10)
    assert bodies == ["a1", "a2", "b1"]
    assert [d.receive_count for d in got] == [1, 1, 1]


def test_an_ack_that_frees_a_group_wakes_the_long_polls(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4, batch=True)
    _enqueue(m, clocks, ("a1", "a"), ("a2", "a"), ("a3", "a"))
    _, got = _bodies(m, 2)
    woken = []
    m.on_change = lambda: woken.append(1)
    _ack(m, got[:1])
    assert woken == []  # a2 is still out
    _ack(m, got[1:])
    assert woken == [1]
    assert _bodies(m, 10)[0] == ["a3"]


def test_batch_dead_letter_holds_the_group_until_moved(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=4, max_receives=1, batch=True)
    _enqueue(m, clocks, ("a1", "a"), ("a2", "a"), ("a3", "a"))
    _, got = _bodies(m, 2, vis=1.0)
    _ack(m, got[1:])
    clocks.advance(2.0)
    assert _bodies(m, 10)[0] == []  # a1 is set aside, still holding the group
    dead = m.take_dead()
    assert [mid for mid, _ in dead] == [got[0].id]
    m.ack([(parse_message_id(mid), None) for mid, _ in dead])
    assert _bodies(m, 10)[0] == ["a3"]


def test_the_group_whose_waiting_message_is_oldest_goes_first(clocks):
    """SQS FIFO: a receive hands out the group whose waiting message was sent earliest; a
    group freed by a delete comes back in its place, not behind the groups unblocked since."""
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=8, batch=True)
    _enqueue(m, clocks, ("a1", "a"), ("b1", "b"), ("a2", "a"), ("c1", "c"))
    first, got_a = _bodies(m, 1)
    assert first == ["a1"]
    assert _bodies(m, 1)[0] == ["b1"]
    _ack(m, got_a)  # a2 (sent before c1) waits now
    assert _bodies(m, 1)[0] == ["a2"]
    assert _bodies(m, 1)[0] == ["c1"]


def test_a_head_given_back_goes_in_its_place_among_the_heads(clocks):
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=8)
    _enqueue(m, clocks, ("a1", "a"), ("b1", "b"), ("c1", "c"))
    got = m.dequeue(1, 5.0)
    m.give_back(got)
    assert _bodies(m, 10)[0] == ["a1", "b1", "c1"]
