"""An enqueue's bodies as ``queues.http.validation`` checks them: a body must be Unicode text
(JSON parsers in front of it may let a lone surrogate through: Python's ``json`` does), and a
batch's errors name the message."""

from __future__ import annotations

import pytest

from queues.http.validation import enqueue_request
from queues.service import InvalidRequest
from queues.service.types import QueueConfig

CFG = QueueConfig(1, "q", 4, 256, 10, 30, 262_144, 86_400)


@pytest.mark.parametrize("body", ["x", "x" * 1000, "é", "日本語", "\U0001f600", "a\tb\x00c"])
def test_text_bodies_are_taken_as_they_are(body):
    drafts, batch = enqueue_request({"messages": [{"body": "first"}, {"body": body}]}, CFG, 0.0)
    assert batch and [d.body for d in drafts] == ["first", body]


@pytest.mark.parametrize("body", ["\ud800", "a\udfff", "ascii then \ud83d"])
def test_a_lone_surrogate_is_no_text(body):
    with pytest.raises(InvalidRequest) as err:
        enqueue_request({"messages": [{"body": "fine"}, {"body": body}]}, CFG, 0.0)
    assert err.value.code == "invalid_body"
    assert "messages[1]" in str(err.value.detail)
