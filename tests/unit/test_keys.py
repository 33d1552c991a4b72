"""The store's layout (``queues.engine.keys``): what an owner finds after an upgrade depends on it, so
every key is pinned here as it is written today."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queues.engine import keys
from queues.engine.ids import MessageId, parse_message_id

BLOCK = "00000001-aaaaaaaaaaaaaaaa"
MID = parse_message_id(f"q/3/{BLOCK}/17")


def test_every_key_of_a_partition_as_stored():
    assert keys.message_key("q", 3, BLOCK, 17) == str(MID) == f"q/3/{BLOCK}/17"
    assert keys.block_bucket("q", 3, BLOCK) == f"q/3/{BLOCK}"
    assert keys.blocks_bucket("q", 3) == "q/3/_blocks"
    assert keys.block_key("q", 3, BLOCK) == f"q/3/_blocks/{BLOCK}"
    assert keys.fence_key("q", 3) == "q/3/_fence"
    assert keys.receives_bucket("q", 3) == "q/3/_receives"
    assert keys.receives_key("q", 3, MID) == f"q/3/_receives/{BLOCK}.17"
    assert keys.receives_bucket("q", 3, "sub") == "q/3/_receives/sub"
    assert keys.receives_key("q", 3, MID, "sub") == f"q/3/_receives/sub/{BLOCK}.17"
    assert keys.acks_bucket("q", 3, "sub") == "q/3/_acks/sub"
    assert keys.ack_key("q", 3, "sub", MID) == f"q/3/_acks/sub/{BLOCK}.17"
    assert keys.archive_bucket("q", 3) == "q/3/_archive"
    assert keys.partition_prefix("q", 3) == "q/3"
    assert keys.queue_prefix("q") == "q"


def test_a_message_id_built_from_its_parts_is_its_key():
    assert str(MessageId("q", 3, BLOCK, 17)) == keys.message_key("q", 3, BLOCK, 17)


@given(index=st.integers(min_value=0, max_value=99_999))
def test_positions_read_back_and_keys_split(index):
    mid = parse_message_id(keys.message_key("q", 0, BLOCK, index))
    assert keys.parse_position(keys.position(mid)) == (BLOCK, index)
    assert keys.block_and_index(str(mid)) == (BLOCK, index)


@pytest.mark.parametrize("name", ["", "junk", f"{BLOCK}.", f".{BLOCK}", f"{BLOCK}.x", f"{BLOCK}.01", f"{BLOCK}.-1"])
def test_names_that_are_no_position(name):
    assert keys.parse_position(name) is None


@pytest.mark.parametrize(
    "text",
    [f"q/3/{BLOCK}/17\n", f"\nq/3/{BLOCK}/17", f"q/3/{BLOCK}/17 ", f"q/3/{BLOCK}/017", f"q/3/{BLOCK}/100000"],
)
def test_a_message_id_with_anything_around_it_is_no_message_id(text):
    # ("$" in a regex also matches before a trailing newline: the whole text must be the ID)
    assert parse_message_id(text) is None


def _parsed_by_the_regex_alone(text):
    from queues.engine.ids import _MESSAGE_ID

    m = _MESSAGE_ID.fullmatch(text) if len(text) <= 200 else None
    return None if m is None else (m["queue"], int(m["partition"]), m["block"], int(m["index"]), text)


_PREFIXES = [f"q/3/{BLOCK}", f"q/03/{BLOCK}", f"q/3/{BLOCK}x", "q/3", "", f"q/3/{BLOCK}/1"]
_INDEXES = ["", "0", "00", "01", "-1", "+1", "1 ", " 1", "1\n", "\u0661", "\u00b2", "99999", "100000", "1_0", "7"]


def _parse_as_the_regex_would(prefix, index, warm):
    # parse_message_id checks only the index of an ID whose prefix it has parsed before
    from queues.engine import ids as messages

    text = f"{prefix}/{index}"
    messages._PREFIXES.clear()
    if warm:
        parse_message_id(f"{prefix}/0")  # a well-formed sibling first (if the prefix is one)
    got = parse_message_id(text)
    assert (None if got is None else (*got,)) == _parsed_by_the_regex_alone(text)
    assert got is None or str(got) == text


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("index", _INDEXES)
@pytest.mark.parametrize("prefix", _PREFIXES)
def test_a_message_id_parses_as_the_regex_reads_it_whether_its_block_was_seen_or_not(prefix, index, warm):
    _parse_as_the_regex_would(prefix, index, warm)


@given(prefix=st.sampled_from(_PREFIXES), index=st.text(max_size=7), warm=st.booleans())
def test_any_index_parses_as_the_regex_reads_it(prefix, index, warm):
    _parse_as_the_regex_would(prefix, index, warm)


def test_key_prefixes_and_file_store_segments_are_whole_names(tmp_path):
    from queues.kv.base import PrefixedStore
    from queues.kv.filesystem import FileStore
    from queues.kv.memory import MemoryStore

    with pytest.raises(ValueError):
        PrefixedStore(MemoryStore(), "mq:\n")
    store = FileStore(tmp_path)
    with pytest.raises(ValueError):
        store.put("q/0/_fence\n", b"1")
