"""The archive journal the partition manager writes (mode all / acked), on the in-memory store."""

from __future__ import annotations

import pytest

from queues.engine import archive_journal
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.partition import PartitionUnavailable
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow
from tests.unit.test_partition import open_manager


def journal(store):
    b = archive_journal.bucket("q", 0)
    names = sorted(store.scan(b))
    return {n: store.get(f"{b}/{n}") for n in names}


def _ack(m, ids):
    got = m.load_bodies(m.dequeue(100, 30.0))
    m.ack([(parse_message_id(d.id), d.receipt) for d in got if d.id in ids])


def test_mode_none_writes_no_journal():
    store, row = MemoryStore(), PartitionRow()
    m = open_manager(store, row, 4, 1 << 20)
    ids = m.enqueue([StoredMessage(f"m{i}", 1.0) for i in range(3)])
    _ack(m, ids)
    assert journal(store) == {}


def test_mode_all_journals_at_enqueue_and_marks_acks():
    store, row = MemoryStore(), PartitionRow()
    m = open_manager(store, row, 4, 1 << 20)
    m.archive = "all"
    ids = m.enqueue([StoredMessage(f"m{i}", 1.0, group="g" if i else None) for i in range(3)])
    j = journal(store)
    assert len(j) == 3
    for mid in ids:
        p = parse_message_id(mid)
        assert j[f"e.{p.block}.{p.index}"] == store.get(mid)
    _ack(m, ids[:1])
    p = parse_message_id(ids[0])
    assert float(journal(store)[f"a.{p.block}.{p.index}"]) > 0
    # retention is no ack: no marker
    m.expire(cutoff=10**12)
    assert len(journal(store)) == 4
    assert archive_journal.parse_name("q", 0, f"a.{p.block}.{p.index}") == ("a", ids[0])
    assert archive_journal.parse_name("q", 0, "junk") is None


def test_mode_acked_journals_only_acked_messages():
    store, row = MemoryStore(), PartitionRow()
    m = open_manager(store, row, 4, 0)  # no body cache: the bodies are read back
    m.archive = "acked"
    ids = m.enqueue([StoredMessage(f"m{i}", 1.0) for i in range(5)])
    assert journal(store) == {}
    raws = {mid: store.get(mid) for mid in ids}
    _ack(m, ids[:2])
    j = journal(store)
    assert len(j) == 4
    for mid in ids[:2]:
        p = parse_message_id(mid)
        assert j[f"e.{p.block}.{p.index}"] == raws[mid]
        assert f"a.{p.block}.{p.index}" in j
    m.expire(cutoff=10**12)
    assert len(journal(store)) == 4


def test_a_stale_owner_journals_nothing():
    store, row = MemoryStore(), PartitionRow()
    old = open_manager(store, row, 4, 1 << 20)
    old.archive = "all"
    open_manager(store, row, 4, 1 << 20)
    with pytest.raises(PartitionUnavailable):
        old.enqueue([StoredMessage("late", 1.0)])
    assert journal(store) == {}
