"""A stored message's record: every field comes back from its bytes as it went in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from queues.engine.ids import StoredMessage

text = st.text(max_size=20)
json_dict = st.dictionaries(
    text, st.one_of(text, st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False)), max_size=3
)
maybe = st.one_of


messages = st.builds(
    StoredMessage,
    body=text,
    enqueued_at=st.floats(0, 4e9),
    group=maybe(st.none(), text),
    sequence=st.integers(0, 2**63 - 1),
    not_before=maybe(st.none(), st.floats(0, 4e9)),
    attributes=maybe(st.none(), json_dict),
    size=maybe(st.none(), st.integers(0, 2**31)),
    estimates=maybe(st.none(), json_dict),
    history=maybe(st.none(), json_dict),
    archived=st.booleans(),
    subscription=maybe(st.none(), text),
)


@given(messages)
def test_a_record_round_trips(message):
    assert StoredMessage.from_bytes(message.to_bytes()) == message


def test_absent_fields_take_no_bytes():
    raw = StoredMessage("hi", 1.5, sequence=7).to_bytes()
    assert raw == b'{"b":"hi","t":1.5,"s":7}'


@given(messages, st.integers(0, 2**63 - 1))
def test_with_sequence_changes_the_sequence_alone(message, sequence):
    renumbered = message.with_sequence(sequence)
    assert type(renumbered) is StoredMessage
    assert renumbered == message._replace(sequence=sequence)
