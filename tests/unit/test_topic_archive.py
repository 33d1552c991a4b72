"""Retention on a topic that archives: what a slow subscription holds moves to the archive.

The partition manager on the in-memory store, with a dict standing in for the archive table
(the real table, nodes and a SIGKILL are in tests/integration/test_topic_archive.py).
"""

from __future__ import annotations

import math

import pytest

from queues.kv.memory import MemoryStore
from queues.leases import Lease
from queues.messages import StoredMessage, parse_message_id
from queues.partition import BodyCache, PartitionManager, PartitionUnavailable, SubscriptionSpec

from .support import Row


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


def open_topic(store, row: Row, archive: Archive, subs=("fast", "slow"), *, mode="all",
               block_size=4, cache_bytes=1 << 20) -> PartitionManager:
    row.epoch += 1
    lease = Lease(1, "t", 0, row.epoch, "n", 10.0, math.inf, row.head or "")
    m = PartitionManager(lease, block_size=block_size, store=store, node_id="node",
                         cache=BodyCache(cache_bytes), set_head=row.set_head, read_head=row.read_head,
                         subscriptions=[s if isinstance(s, SubscriptionSpec) else SubscriptionSpec(s) for s in subs],
                         archive_sink=archive.sink, archive_source=archive.source)
    m.archive = mode
    m.open()
    return m


def take(m, sub, n=100):
    return m.load_bodies(m.dequeue(n, 30.0, sub))


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
    store, row, archive = MemoryStore(), Row(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 10)
    # given a fast subscription that acked everything and a slow one that read nothing
    assert len(drain(m, "fast")) == 10
    # when retention passes
    assert m.expire(cutoff=10**12) == 0
    # then nothing was removed for the slow one: the messages are in the archive and only
    # stubs (no body) are left in the store, under the same IDs
    assert m.offloaded_total == 10
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
    store, row, archive = MemoryStore(), Row(), Archive()
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
    store, row, archive = MemoryStore(), Row(), Archive()
    m = open_topic(store, row, archive, mode="none")
    publish(m, 6)
    drain(m, "fast")
    assert m.expire(cutoff=10**12) == 6
    assert archive.rows == {} and stored_messages(store) == {}
    assert take(m, "slow") == []


def test_messages_no_subscription_holds_are_removed_not_archived():
    store, row, archive = MemoryStore(), Row(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 8)
    drain(m, "fast")
    m.expire(cutoff=10**12)
    # given the slow subscription is deleted, and one that starts after these messages is added
    # (so they are neither held nor acked by every subscription: they wait for retention)
    m2 = open_topic(store, row, archive, subs=("fast", SubscriptionSpec("late", starts_at=10**11)))
    take(m2, "fast")  # reads the whole backlog
    assert len(stored_messages(store)) == 8
    # then the next retention pass removes the stubs nobody holds
    assert m2.expire(cutoff=10**12) == 8
    assert stored_messages(store) == {}
    assert set(archive.rows) == set(sent)  # the archive keeps its copies


def test_an_archive_that_cannot_be_written_defers_retention_and_changes_nothing():
    store, row, archive = MemoryStore(), Row(), Archive()
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
    store, row, archive = MemoryStore(), Row(), Archive()
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
    store, row, archive = MemoryStore(), Row(), Archive()
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


def test_an_archive_read_failure_keeps_the_message_for_later():
    store, row, archive = MemoryStore(), Row(), Archive()
    m = open_topic(store, row, archive)
    sent = publish(m, 2, groups=(None,))
    drain(m, "fast")
    m.expire(cutoff=10**12)
    archive.fail = True
    deliveries = m.dequeue(10, 0.0, "slow")  # visibility 0: due again at once
    with pytest.raises(PartitionUnavailable):
        m.load_bodies(deliveries)
    archive.fail = False
    assert {d.message.body for d in drain(m, "slow")} == set(sent.values())


def test_mode_acked_archives_held_messages_at_retention_and_marks_the_later_ack():
    store, row, archive = MemoryStore(), Row(), Archive()
    m = open_topic(store, row, archive, mode="acked")
    sent = publish(m, 3, groups=(None,))
    drain(m, "fast")
    m.expire(cutoff=10**12)
    assert set(archive.rows) == set(sent)
    drain(m, "slow")
    journal = sorted(store.scan("t/0/_archive"))
    # the ack journals a marker per message and no entry (the stub has no body to journal)
    assert [n[0] for n in journal] == ["a"] * 3
