"""The per-request and per-process caches of the hot path (issue 17 item 1): they save work
without changing an answer."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from queues import access, metrics
from queues.api import fastpath
from queues.service import targets
from queues.service.types import QueueConfig

ALICE = access.Caller(7, "alice")
BOB = access.Caller(8, "bob")


@pytest.fixture
def checks(monkeypatch):
    """Every ``require`` authorize makes, as (user, action); a stand-in queue "orders"."""
    cfg = QueueConfig(1, "orders", 4, 1000, 30, 30, 262144, 86400)
    made: list[tuple[int | None, str]] = []
    allowed = {(7, "produce"), (8, "produce")}

    def require(caller, action, queue_id, name, created_by, *, target=""):
        made.append((caller.user_id, action))
        if (caller.user_id, action) not in allowed:
            raise access.Forbidden(caller, action, target or name)

    monkeypatch.setattr(targets, "queue_config", lambda name: cfg)
    monkeypatch.setattr(targets, "require", require)
    return made, allowed


def test_outside_a_call_every_authorize_checks(checks):
    made, _ = checks
    targets.authorize("orders", "produce", caller=ALICE)
    targets.authorize("orders", "produce", caller=ALICE)
    assert made == [(7, "produce"), (7, "produce")]


def test_within_a_call_a_granted_answer_is_reused_for_the_same_caller_only(checks):
    made, _ = checks
    token = targets.begin_call()
    try:
        first = targets.authorize("orders", "produce", caller=ALICE)
        assert targets.authorize("orders", "produce", caller=ALICE) is first
        targets.authorize("orders", "produce", caller=BOB)  # another caller: checked
    finally:
        targets.end_call(token)
    assert made == [(7, "produce"), (8, "produce")]
    targets.authorize("orders", "produce", caller=ALICE)  # the next request checks afresh
    assert made[-1] == (7, "produce") and len(made) == 3


def test_a_refusal_is_never_kept_and_a_revoked_grant_stops_the_next_request(checks):
    made, allowed = checks
    token = targets.begin_call()
    try:
        with pytest.raises(access.Forbidden):
            targets.authorize("orders", "consume", caller=ALICE)
        with pytest.raises(access.Forbidden):
            targets.authorize("orders", "consume", caller=ALICE)
        targets.authorize("orders", "produce", caller=ALICE)
    finally:
        targets.end_call(token)
    assert made == [(7, "consume"), (7, "consume"), (7, "produce")]
    allowed.discard((7, "produce"))  # revoked between two requests
    token = targets.begin_call()
    try:
        with pytest.raises(access.Forbidden):
            targets.authorize("orders", "produce", caller=ALICE)
    finally:
        targets.end_call(token)


def test_a_check_handed_on_is_not_made_again(checks):
    made, _ = checks
    # given the check an entrance made before reading a call's body
    checked = targets.check("orders", "produce", caller=ALICE)
    # when the call hands it on for the same question, it answers without checking again
    assert targets.authorized(checked, "orders", "produce", caller=ALICE) == (checked.cfg, "")
    assert made == [(7, "produce")]
    # and any other question is checked: another caller, another action
    targets.authorized(checked, "orders", "produce", caller=BOB)
    with pytest.raises(access.Forbidden):
        targets.authorized(checked, "orders", "consume", caller=ALICE)
    assert made == [(7, "produce"), (8, "produce"), (7, "consume")]


def test_metric_children_are_the_labelled_ones():
    registry = CollectorRegistry()
    counter = Counter("mq_test_children", "test", ["queue"], registry=registry)
    child = metrics.child(counter, "orders")
    assert child is counter.labels("orders")
    assert metrics.child(counter, "orders") is child
    child.inc(3)
    assert registry.get_sample_value("mq_test_children_total", {"queue": "orders"}) == 3


def test_host_verdicts_are_cached_and_follow_allowed_hosts(settings):
    settings.ALLOWED_HOSTS = ["good.example"]
    assert fastpath._host_allowed({"HTTP_HOST": "good.example:8000"})
    assert not fastpath._host_allowed({"HTTP_HOST": "evil.example"})
    assert fastpath._HOSTS == {"good.example:8000": True, "evil.example": False}
    settings.ALLOWED_HOSTS = ["evil.example"]  # setting_changed empties the cache
    assert fastpath._host_allowed({"HTTP_HOST": "evil.example"})
    assert not fastpath._host_allowed({"HTTP_HOST": "good.example:8000"})
