"""Retention on a topic that archives: what a slow subscription holds moves to the archive.

The partition manager on the in-memory store, with a dict standing in for the archive table
(the real table, nodes and a SIGKILL are in tests/integration/test_topic_archive.py).
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from queues.engine import partition as partition_mod
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.partition import PartitionManager, PartitionUnavailable, ReceiptMismatch, SubscriptionSpec
from queues.kv import KVError
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow, next_owner


class Archive:
    """The archive table: records by message ID, written and read as the node does."""

    def __init__(self):
        self.rows: dict[str, bytes] = {}
        self.fail = False
        self.writes = 0

    def sink(self, items):
        if self.fail:
            raise RuntimeError("database down")
        self.writes += 1
        for mid, raw in items:
            self.rows.setdefault(mid, raw)

    def source(self, mids):
        if self.fail:
            raise RuntimeError("database down")
        return {mid: StoredMessage.from_bytes(self.rows[mid]) for mid in mids if mid in self.rows}


def open_topic(
    store, row: PartitionRow, archive: Archive, subs=("fast", "slow"), *, mode="all", block_size=4, cache_bytes=1 << 20
) -> PartitionManager:
    m = next_owner(
        store,
        row,
        block_size=block_size,
        cache_bytes=cache_bytes,
        queue="t",
        subscriptions=[s if isinstance(s, SubscriptionSpec) else SubscriptionSpec(s) for s in subs],
        archive_sink=archive.sink,
        archive_source=archive.source,
    )
    m.archive = mode
    m.open()
    return m


def take(m, sub, n=100):
    return m.load_bodies(m.dequeue(n, 30.0, sub), sub)


def ack(m, sub, deliveries):
    m.ack([(parse_message_id(d.id), d.receipt) for d in deliveries], sub=sub)


def drain(m, sub):
    """Dequeue and ack until nothing comes (groups give one message at a time)."""
    out = []
    while got := take(m, sub):
        ack(m, sub, got)
        out.extend(got)
    return out


def stored_messages(store) -> dict[str, StoredMessage]:
    out = {}
    for bucket in list(store.buckets):
        if bucket.startswith("t/0/") and not bucket.split("/")[2].startswith("_"):
            for idx in store.scan(bucket):
                out[f"{bucket}/{idx}"] = StoredMessage.from_bytes(store.get(f"{bucket}/{idx}"))
    return out


def publish(m, n, groups=("a", "b", None)):
    bodies = [f"m{i}" for i in range(n)]
    ids = m.enqueue([StoredMessage(b, 1000.0 + i, group=groups[i % len(groups)]) for i, b in enumerate(bodies)])
    return dict(zip(ids, bodies))


def test_retention_moves_what_a_slow_subscription_holds_to_the_archive():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 10)
    # given a fast subscription that acked everything and a slow one that read nothing
    assert len(drain(m, "fast")) == 10
    # when retention passes
    assert m.expire(cutoff=10**12) == 0
    # then nothing was removed for the slow one: the messages are in the archive and only
    # stubs (no body) are left in the store, under the same IDs
    assert m.archived_total == 10
    assert set(archive.rows) == set(sent)
    stubs = stored_messages(store)
    assert set(stubs) == set(sent)
    assert all(s.archived and s.body == "" for s in stubs.values())
    assert m.stats().cursors["slow"]["archived"] == 10
    assert m.stats().cursors["fast"]["archived"] == 0
    # and a second pass changes nothing (already archived)
    assert m.expire(cutoff=10**12) == 0 and archive.writes == 1
    # when the slow subscription reads: every body comes back from the archive, groups in order
    got = drain(m, "slow")
    assert {d.id: d.message.body for d in got} == sent
    assert all(d.from_archive for d in got)
    for g in ("a", "b"):
        seqs = [d.message.sequence for d in got if d.message.group == g]
        assert seqs == sorted(seqs) and len(seqs) > 1
    # and once it acked them, the stubs are gone too (only the head block is left)
    assert stored_messages(store) == {}
    assert m.stats().live_blocks == 1


def test_a_new_owner_serves_stubs_from_the_archive_in_group_order():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive)
    old = publish(m, 9, groups=("g",))
    drain(m, "fast")
    m.expire(cutoff=10**12)
    # given a takeover after retention (the old owner's memory is gone)
    m2 = open_topic(store, row, archive)
    new = publish(m2, 3, groups=("g",))
    # then the slow subscription gets the archived ones first, then the new ones, one at a time
    got = drain(m2, "slow")
    assert [d.id for d in got] == [*old, *new]
    assert [d.from_archive for d in got] == [True] * 9 + [False] * 3
    assert [d.message.body for d in got] == [*old.values(), *new.values()]
    # and the fast one gets only the new ones (its acks of the old ones were kept as markers)
    assert [d.id for d in drain(m2, "fast")] == list(new)
    assert stored_messages(store) == {}


def test_without_archiving_retention_removes_for_every_subscription():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive, mode="none")
    publish(m, 6)
    drain(m, "fast")
    assert m.expire(cutoff=10**12) == 6
    assert archive.rows == {} and stored_messages(store) == {}
    assert take(m, "slow") == []


def test_messages_no_subscription_holds_are_removed_not_archived():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 8)
    drain(m, "fast")
    m.expire(cutoff=10**12)
    # given the slow subscription is deleted, and one that starts after these messages is added
    # (so they are neither held nor acked by every subscription: they wait for retention)
    m2 = open_topic(store, row, archive, subs=("fast", SubscriptionSpec("late", starts_at=10**11)))
    take(m2, "fast")  # scans every unscanned block
    assert len(stored_messages(store)) == 8
    # then the next retention pass removes the stubs nobody holds
    assert m2.expire(cutoff=10**12) == 8
    assert stored_messages(store) == {}
    assert set(archive.rows) == set(sent)  # the archive keeps its copies


def test_an_archive_that_cannot_be_written_defers_retention_and_changes_nothing():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 5)
    drain(m, "fast")
    archive.fail = True
    with pytest.raises(PartitionUnavailable):
        m.expire(cutoff=10**12)
    assert all(not s.archived for s in stored_messages(store).values())
    assert len(stored_messages(store)) == 5
    archive.fail = False
    assert {d.message.body for d in drain(m, "slow")} == set(sent.values())


def test_an_ack_during_the_archive_write_is_not_undone_by_the_stub():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 4, groups=(None,))
    drain(m, "fast")
    got = take(m, "slow")
    first = got[0]
    real_sink = archive.sink

    def sink_racing_an_ack(items):
        real_sink(items)
        ack(m, "slow", [first])  # the last holder acks while the rows are being written

    m.archive_sink = sink_racing_an_ack
    m.expire(cutoff=10**12)
    left = stored_messages(store)
    assert first.id not in left  # deleted by the ack, not brought back as a stub
    assert set(left) == set(sent) - {first.id} and all(s.archived for s in left.values())


def test_a_stub_missing_from_the_archive_is_dropped_not_delivered_empty():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 3, groups=(None,))
    drain(m, "fast")
    m.expire(cutoff=10**12)
    lost = next(iter(sent))
    del archive.rows[lost]  # an operator deleted the row by hand
    got = drain(m, "slow")
    assert {d.id for d in got} == set(sent) - {lost}
    assert all(d.message.body for d in got)
    assert stored_messages(store) == {}


def test_an_archive_read_failure_gives_the_stubs_back_and_delivers_the_rest():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive, subs=("fast", SubscriptionSpec("slow", max_receives=2)))
    old = publish(m, 3, groups=(None,))
    drain(m, "fast")
    m.expire(cutoff=10**12)
    new = publish(m, 2, groups=(None,))
    # given the archive's database is down for longer than max_receives dequeues
    archive.fail = True
    for _ in range(3):
        got = m.load_bodies(m.dequeue(10, 30.0, "slow"), "slow")
        # then the messages the store still has are delivered, the stubs given back
        assert {d.id for d in got} <= set(new)
        ack(m, "slow", got)
    assert m.take_dead("slow") == []
    # and once it is back, the stubs come out in order with their first receive count
    archive.fail = False
    got = take(m, "slow")
    assert [d.id for d in got] == list(old) and {d.receive_count for d in got} == {1}
    assert all(d.from_archive for d in got)


def test_a_store_read_failure_gives_every_delivery_back(monkeypatch):
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive, cache_bytes=0)
    sent = publish(m, 3, groups=("g", None, None))
    monkeypatch.setattr(store, "get_many", lambda keys: (_ for _ in ()).throw(KVError("reset")))
    with pytest.raises(PartitionUnavailable):
        m.load_bodies(m.dequeue(10, 30.0, "slow"), "slow")
    monkeypatch.undo()
    got = take(m, "slow")
    assert sorted(d.id for d in got) == sorted(sent) and {d.receive_count for d in got} == {1}


def test_mode_acked_archives_held_messages_at_retention_and_marks_the_later_ack():
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive, mode="acked")
    sent = publish(m, 3, groups=(None,))
    drain(m, "fast")
    m.expire(cutoff=10**12)
    assert set(archive.rows) == set(sent)
    drain(m, "slow")
    journal = sorted(store.scan("t/0/_archive"))
    # the ack journals a marker per message and no entry (the stub has no body to journal)
    assert [n[0] for n in journal] == ["a"] * 3


def test_a_stub_write_that_failed_half_way_is_finished_by_the_next_pass(monkeypatch):
    store, row, archive = MemoryStore(), PartitionRow(), Archive()
    m = open_topic(store, row, archive, cache_bytes=0)
    sent = publish(m, 4, groups=(None,))
    drain(m, "fast")
    real_put = store.put_many

    def put_one_then_fail(items, fence=None):
        real_put(items[:1], fence=fence)
        raise KVError("connection reset")

    monkeypatch.setattr(store, "put_many", put_one_then_fail)
    with pytest.raises(PartitionUnavailable):
        m.expire(cutoff=10**12)
    monkeypatch.setattr(store, "put_many", real_put)
    assert sum(s.archived for s in stored_messages(store).values()) == 1
    m.expire(cutoff=10**12)
    assert all(s.archived for s in stored_messages(store).values())
    assert m.stats().cursors["slow"]["archived"] == 4
    assert {d.message.body for d in drain(m, "slow")} == set(sent.values())


# --- a model -----------------------------------------------------------------------------------
class TopicMachine(RuleBasedStateMachine):
    """Random publish / dequeue / ack per subscription / retention / takeover on a topic that
    archives. For every subscription: nothing confirmed and not acked by it is lost, nothing
    it acked comes back, bodies are the published ones (from the store or the archive), and a
    group's message is never delivered while an older one of the group is live for it."""

    SUBS = ("a", "b", "c")

    def __init__(self):
        super().__init__()
        self.clock = partition_mod.monotonic
        self.now = 1000.0
        partition_mod.monotonic = lambda: self.now
        self.store, self.row, self.archive = MemoryStore(), PartitionRow(), Archive()
        self.cache_bytes = 0
        self.m = None
        self.sent: dict[str, StoredMessage] = {}  # id -> what was published
        self.order: dict[str, int] = {}
        self.live = {s: set() for s in self.SUBS}  # per subscription: confirmed, not acked by it
        self.receipts = {s: {} for s in self.SUBS}  # this owner's deliveries: id -> (receipt, deadline)

    @initialize(cache_bytes=st.sampled_from([0, 1 << 20]))
    def open(self, cache_bytes):
        self.cache_bytes = cache_bytes
        self.m = self._open()

    def _open(self):
        return open_topic(self.store, self.row, self.archive, self.SUBS, block_size=3, cache_bytes=self.cache_bytes)

    @rule(n=st.integers(1, 4), group=st.sampled_from([None, "g1", "g2"]))
    def publish(self, n, group):
        messages = [StoredMessage(f"m{len(self.sent) + k}", 1000.0, group=group) for k in range(n)]
        for mid, msg in zip(self.m.enqueue(messages), messages):
            self.sent[mid] = msg
            self.order[mid] = len(self.order)
            for s in self.SUBS:
                self.live[s].add(mid)

    @rule(sub=st.sampled_from(SUBS), n=st.integers(1, 5), vis=st.sampled_from([1.0, 50.0]))
    def dequeue(self, sub, n, vis):
        for d in take_vis(self.m, sub, n, vis):
            assert d.id in self.live[sub], f"{sub} got {d.id}, which it acked or never saw confirmed"
            assert d.message.body == self.sent[d.id].body
            group = self.sent[d.id].group
            if group is not None:
                older = [x for x in self.live[sub] if self.sent[x].group == group and self.order[x] < self.order[d.id]]
                assert not older, f"{sub}: {d.id} delivered before older {older} of {group}"
                busy = [
                    x
                    for x, (_, dl) in self.receipts[sub].items()
                    if x != d.id and self.sent[x].group == group and dl > self.now and x in self.live[sub]
                ]
                assert not busy, f"{sub}: two of {group} in flight"
            self.receipts[sub][d.id] = (d.receipt, self.now + vis)

    @rule(sub=st.sampled_from(SUBS), data=st.data())
    def ack(self, sub, data):
        if not self.receipts[sub]:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.receipts[sub])), min_size=1, max_size=3, unique=True))
        try:
            self.m.ack([(parse_message_id(i), self.receipts[sub][i][0]) for i in ids], sub=sub)
        except ReceiptMismatch:
            return  # redelivered since: that receipt is stale (the whole ack is refused)
        for i in ids:
            self.live[sub].discard(i)
            del self.receipts[sub][i]

    @rule(dt=st.sampled_from([0.5, 5.0, 100.0]))
    def advance(self, dt):
        self.now += dt

    @rule()
    def retention(self):
        try:
            self.m.expire(cutoff=10**12)
        except PartitionUnavailable:
            assert self.archive.fail  # deferred: nothing changed

    @rule(down=st.booleans())
    def archive_database(self, down):
        self.archive.fail = down

    @rule()
    def takeover(self):
        self.m = self._open()
        self.receipts = {s: {} for s in self.SUBS}

    @invariant()
    def every_held_message_is_stored_or_archived(self):
        held = set().union(*self.live.values())
        raws = self.store.get_many(sorted(held))
        for mid, raw in zip(sorted(held), raws):
            assert raw is not None, f"{mid} is held but gone from the store"
            if StoredMessage.from_bytes(raw).archived:
                assert mid in self.archive.rows, f"{mid} is a stub with no archive row"

    def teardown(self):
        try:
            if self.m is None:
                return
            self.archive.fail = False
            self.now += 1000
            for sub in self.SUBS:
                got = {d.id: d.message.body for d in drain(self.m, sub)}
                assert set(got) == self.live[sub], (sub, sorted(set(got) ^ self.live[sub])[:5])
                assert all(got[mid] == self.sent[mid].body for mid in got)
            assert stored_messages(self.store) == {}
        finally:
            partition_mod.monotonic = self.clock


def take_vis(m, sub, n, vis):
    return m.load_bodies(m.dequeue(n, vis, sub), sub)


TopicMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestTopicWithArchive = TopicMachine.TestCase
