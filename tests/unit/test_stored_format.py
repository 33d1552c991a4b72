"""The stored format's versions (``queues.engine.format``): today's bytes are version 1 and read as
they always were; a record of a later version is refused, loudly, by this release, and fails (is
never misread) in the decoders of the release before it, which has no check.

The same against a real node, PostgreSQL and Redis: ``tests/integration/test_stored_format.py``.
"""

from __future__ import annotations

import logging

import orjson
import pytest

from queues.engine import format as stored_format
from queues.engine.format import CorruptRecord, envelope, read_ack_time, read_count
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.keys import block_key, head_key, receives_key
from queues.engine.partition import PartitionManager
from queues.engine.tree import Block, head_record, parse_head_record
from queues.errors import PartitionUnavailable, ServiceError, StoredFormatTooNew
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow, next_owner

#: Bytes of each kind exactly as the release before this one writes them (a change here is a
#: change of the stored format: it needs a version of its own).
MESSAGE = (
    b'{"b":"hello","t":1764400000.25,"s":12884901895,"g":"g1","n":1764400060.5,"a":{"k":"v"},"z":5,'
    b'"e":{"process":2.0},"h":{"from":"q","receives":3},"r":"sub-a"}'
)
MESSAGE_OBJ = StoredMessage(
    "hello",
    1764400000.25,
    "g1",
    3 << 32 | 7,
    1764400060.5,
    {"k": "v"},
    5,
    {"process": 2.0},
    {"from": "q", "receives": 3},
    False,
    "sub-a",
)
STUB = b'{"b":"","t":1764400000.25,"s":12884901895,"g":"g1","n":1764400060.5,"x":1,"r":"sub-a"}'
BARE = b'{"b":"hi","t":1.5,"s":0}'
PARENT = (
    b'["00000002-9f3c2a1b4d5e6f70",2,1,1,null,"00000000-0123456789abcdef","00000001-fedcba9876543210",4,1764400000.5]'
)
PARENT_OBJ = Block(
    "00000002-9f3c2a1b4d5e6f70",
    2,
    1,
    1,
    None,
    "00000000-0123456789abcdef",
    "00000001-fedcba9876543210",
    4,
    1764400000.5,
)
LEAF = b'["00000003-0011223344556677",3,0,2,"00000002-9f3c2a1b4d5e6f70",null,null,8,1764400001.0]'
LEAF_OBJ = Block("00000003-0011223344556677", 3, 0, 2, "00000002-9f3c2a1b4d5e6f70", None, None, 8, 1764400001.0)
HEAD = b'[7,"00000003-0011223344556677"]'
EMPTIED_HEAD = b"[8,null]"


# --- version 1: today's bytes ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "record"),
    [(MESSAGE, MESSAGE_OBJ), (STUB, MESSAGE_OBJ.stub()), (BARE, StoredMessage("hi", 1.5))],
    ids=["full", "stub", "bare"],
)
def test_a_message_record_of_today_reads_and_writes_the_same_bytes(raw, record):
    assert StoredMessage.from_bytes(raw, "q/0/b/1") == record
    assert record.to_bytes() == raw


@pytest.mark.parametrize(("raw", "block"), [(PARENT, PARENT_OBJ), (LEAF, LEAF_OBJ)], ids=["parent", "leaf"])
def test_a_block_record_of_today_reads_and_writes_the_same_bytes(raw, block):
    assert Block.from_bytes(raw, "q/0/_blocks/x") == block
    assert block.to_bytes() == raw


def test_a_head_record_of_today_reads_and_writes_the_same_bytes():
    assert parse_head_record(HEAD, "q/0/_head") == (7, "00000003-0011223344556677")
    assert head_record(7, "00000003-0011223344556677") == HEAD
    assert parse_head_record(EMPTIED_HEAD, "q/0/_head") == (8, None)
    assert head_record(8, None) == EMPTIED_HEAD
    assert parse_head_record(None) is None


def test_counts_and_ack_times_of_today_read_as_numbers():
    assert read_count(b"3", "k") == 3
    assert read_count(str(10**6).encode(), "k") == 10**6
    assert read_ack_time(repr(1764400000.125).encode(), "k") == 1764400000.125


def test_this_release_writes_version_1_and_reads_only_it():
    assert stored_format.CURRENT == 1
    assert sorted(stored_format.READS) == [1]


# --- a later version ------------------------------------------------------------------------------
def _later(kind: str, version: int = 2) -> bytes:
    payload = {"message": orjson.loads(MESSAGE), "block": orjson.loads(LEAF), "head": orjson.loads(HEAD)}
    return envelope(version, payload.get(kind, 3))


#: kind -> how this release reads a record of it stored under a key.
READERS = {
    "message": StoredMessage.from_bytes,
    "block": Block.from_bytes,
    "head": parse_head_record,
    "receive count": read_count,
    "ack time": read_ack_time,
}


@pytest.mark.parametrize("version", [2, 17])
@pytest.mark.parametrize("kind", list(READERS))
def test_a_record_of_a_later_version_is_refused_with_its_key_and_version_and_logged(kind, version, caplog):
    # given a record as a later release would store it, under its key
    key = f"q/0/some-{kind.replace(' ', '-')}-key"
    raw = _later(kind, version)
    # when this release reads it
    with caplog.at_level(logging.ERROR, logger="queues.engine.format"), pytest.raises(StoredFormatTooNew) as refused:
        READERS[kind](raw, key)
    # then it is refused, naming the key, the kind and the version, and logged so at ERROR
    exc = refused.value
    assert (exc.key, exc.kind, exc.version, exc.reads) == (key, kind, version, 1)
    assert key in str(exc) and f"version {version}" in str(exc)
    [line] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert key in line.getMessage() and f"version {version}" in line.getMessage()


def test_a_refusal_is_an_outage_answer_not_a_fault():
    exc = StoredFormatTooNew("q/0/_head", "head", 2, 1)
    assert isinstance(exc, PartitionUnavailable) and isinstance(exc, ServiceError)
    assert exc.status == 503
    assert exc.headers() == {"Retry-After": "1"}


#: Records that are neither version 1 nor the envelope of a later version: corrupt.
NOT_ENVELOPES = [
    b'{"v":1,"d":[7,"x"]}',  # version 1 is unmarked: an envelope of 1 is nobody's
    b'{"v":"2","d":3}',
    b'{"v":2,"d":3,"extra":1}',
    b'{"v":2}',
]


@pytest.mark.parametrize("raw", NOT_ENVELOPES)
@pytest.mark.parametrize("kind", list(READERS))
def test_a_record_that_is_neither_version_1_nor_a_later_envelope_is_corrupt(kind, raw):
    with pytest.raises(CorruptRecord):
        READERS[kind](raw, "k")


@pytest.mark.parametrize("kind", ["block", "head", "receive count", "ack time"])
def test_a_record_of_another_shape_is_corrupt(kind):
    with pytest.raises(CorruptRecord):
        READERS[kind](b'"hello"', "k")


def test_the_envelope_of_version_1_does_not_exist():
    with pytest.raises(ValueError):
        envelope(1, [])


# --- what the previous release does with it -------------------------------------------------------
# Its decoders, as they are in the release before this one (which reads without a check).
def _previous_message(raw: bytes) -> object:
    d = orjson.loads(raw)
    return (d["b"], d["t"], d.get("g"), d.get("s", 0))


def _previous_block(raw: bytes) -> object:
    return Block(*orjson.loads(raw))


def _previous_head(raw: bytes) -> object:
    epoch, head_id = orjson.loads(raw)
    return int(epoch), head_id or None


PREVIOUS = {
    "message": _previous_message,
    "block": _previous_block,
    "head": _previous_head,
    "receive count": int,
    "ack time": float,
}


@pytest.mark.parametrize("kind", list(PREVIOUS))
def test_the_previous_release_fails_on_a_later_record_and_never_misreads_it(kind):
    # version 1 it reads (the same bytes both ways during a rolling upgrade)...
    today = {"message": MESSAGE, "block": LEAF, "head": HEAD, "receive count": b"3", "ack time": b"1.5"}[kind]
    PREVIOUS[kind](today)
    # ...and a later version makes it fail rather than hand out what it is not
    with pytest.raises((KeyError, TypeError, ValueError)):
        PREVIOUS[kind](_later(kind))


def test_a_list_marker_would_have_been_misread_by_the_previous_release():
    # why the envelope is an object of two keys: a version put in a list is taken for a field
    assert _previous_head(orjson.dumps([2, "payload"])) == (2, "payload")
    nine = orjson.dumps([2, *orjson.loads(LEAF)[1:]])
    assert _previous_block(nine).id == 2
    # and an object of nine keys is unpacked as nine fields (its keys)
    assert _previous_block(orjson.dumps({str(i): i for i in range(9)})).id == "0"


# --- a partition that meets one -------------------------------------------------------------------
def _opened(store: MemoryStore, row: PartitionRow) -> PartitionManager:
    m = next_owner(store, row, block_size=3)
    m.open()
    return m


def test_a_later_message_in_an_unscanned_block_is_refused_at_dequeue_and_left_as_it_is():
    # given 9 messages in blocks of 3, and a later release's record in place of the 5th
    store, row = MemoryStore(), PartitionRow()
    ids = _opened(store, row).enqueue([StoredMessage(f"m{i}", 0.0) for i in range(9)])
    later = _later("message")
    store.put(ids[4], later)
    # when a new owner delivers up to it
    m = _opened(store, row)
    first = m.load_bodies(m.dequeue(3, 30.0))
    assert [d.id for d in first] == ids[:3]
    # then the dequeue that reaches its block is refused, the manager closed...
    with pytest.raises(StoredFormatTooNew) as refused:
        m.dequeue(10, 30.0)
    assert refused.value.key == ids[4] and refused.value.version == 2
    assert m.closed
    # ...and the record and its neighbours are in the store as they were
    assert store.get(ids[4]) == later
    assert [store.get(i) is not None for i in ids] == [True] * 9
    # the next owner delivers what comes before it again (at least once), and refuses it again
    again = _opened(store, row)
    assert [d.id for d in again.load_bodies(again.dequeue(3, 30.0))] == ids[:3]
    with pytest.raises(StoredFormatTooNew):
        again.dequeue(10, 30.0)


@pytest.mark.parametrize("kind", ["head", "block", "message", "receive count"])
def test_a_partition_whose_store_holds_a_later_record_is_not_opened(kind):
    # given a partition with messages in two blocks, one redelivered (its receive count saved)
    store, row = MemoryStore(), PartitionRow()
    first = _opened(store, row)
    ids = first.enqueue([StoredMessage(f"m{i}", 0.0) for i in range(6)])
    first.dequeue(1, 0.0)
    first.dequeue(1, 30.0)  # delivered twice: its count is saved
    head_id = store.get(head_key("q", 0))
    assert head_id is not None
    newest = orjson.loads(head_id)[1]
    count_key = receives_key("q", 0, parse_message_id(ids[0]))
    assert store.get(count_key) == b"2"
    key = {
        "head": head_key("q", 0),
        "block": block_key("q", 0, newest),
        "message": ids[0],  # in the oldest block, scanned at open
        "receive count": count_key,
    }[kind]
    store.put(key, _later(kind))
    # when a new owner opens the partition
    m = next_owner(store, row, block_size=3)
    with pytest.raises(StoredFormatTooNew) as refused:
        m.open()
    # then it refuses it, naming the key, and serves nothing
    assert refused.value.key == key and refused.value.kind == kind
    assert store.get(key) == _later(kind)
