"""Dead letters and redrive (issue 14): what redrive moves, skips and refuses, subscriptions'
dead letters, and dead-letter queues that could never take their sources' messages.

In-process, on the configured database and key-value store; the two-node cases (redrive of a
dead-letter queue served by another node) are in ``test_cluster_4xx.py``.
"""

from __future__ import annotations

import pytest

from tests.integration.test_guarantees import ack, dequeue, enqueue, in_process, post, stats
from tests.launcher import wait_until

TOPICS = "/api/v1/topics"


def dead_letter(api, source: str, body: str, group: str | None = None) -> str:
    """Enqueue ``body`` into ``source`` (max_receives 1) and fail it once: the next dequeue
    moves it to the dead-letter queue. Returns its ID in the source."""
    mid = enqueue(api, source, {"body": body, **({"group": group} if group else {})})["id"]
    (m,) = dequeue(api, source, visibility_timeout=0)
    assert m["id"] == mid
    assert dequeue(api, source) == []  # the second dequeue moves it instead
    return mid


@in_process
def test_redrive_gives_skipped_dead_letters_back_at_once_with_their_counts(api, make_queue):
    # given a dead-letter queue holding a message without a source (a client put it there)
    dlq = make_queue()
    enqueue(api, dlq, {"body": "no history"})
    # when it is redriven
    r = post(api, dlq, "redrive", {"max": 10})
    # then it is skipped, and deliverable at once with its first receive count (not hidden for
    # a minute, not counted as a receive)
    assert r.status_code == 200 and (r.json()["moved"], r.json()["skipped"]) == (0, 1), r.content
    (m,) = dequeue(api, dlq, visibility_timeout=60)
    assert m["body"] == "no history" and m["receive_count"] == 1


@in_process
def test_redrive_checks_every_source_before_copying_anything(api, make_queue):
    # given a dead-letter queue holding dead letters of two queues, one of them deleted since
    dlq = make_queue(partitions=1)
    kept = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    gone = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    dead_letter(api, kept, "for kept")
    dead_letter(api, gone, "for gone")
    assert stats(api, dlq)["depth"] == 2
    assert api.delete(f"/api/v1/queues/{gone}").status_code == 204
    # when it is redriven
    r = post(api, dlq, "redrive", {"max": 10})
    # then the missing source is named, nothing was copied to the other one, and the dead letters
    # are deliverable again at once, their receive counts unchanged: a retry duplicates nothing
    assert r.status_code == 404 and gone in r.json()["detail"], r.content
    assert stats(api, kept)["depth"] == 0
    got = dequeue(api, dlq, max=10, visibility_timeout=60)
    assert sorted(m["body"] for m in got) == ["for gone", "for kept"]
    assert [m["receive_count"] for m in got] == [1, 1]


@in_process
def test_redrive_counts_what_it_moved_per_source(api, make_queue):
    # given dead letters of two queues in one dead-letter queue
    dlq = make_queue(partitions=2)
    a = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    b = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    for body in ("a1", "a2"):
        dead_letter(api, a, body)
    dead_letter(api, b, "b1")
    # when they are redriven
    r = post(api, dlq, "redrive", {"max": 10})
    # then each source got its own back, and the answer says how many each
    assert r.status_code == 200 and r.json() == {"moved": 3, "skipped": 0, "sources": {a: 2, b: 1}}, r.content
    assert sorted(m["body"] for m in dequeue(api, a, max=10)) == ["a1", "a2"]
    assert [m["body"] for m in dequeue(api, b, max=10)] == ["b1"]
    assert stats(api, dlq)["depth"] == 0


@in_process
def test_a_subscriptions_dead_letters_go_back_to_that_subscription_only(api, make_queue, unique_name, runtime):
    # given a topic whose subscription "picky" dead-letters after one receive, and "other"
    dlq = make_queue()
    topic = unique_name("t")
    assert api.post(TOPICS, {"name": topic, "partitions": 1}, format="json").status_code == 201
    for spec in ({"name": "picky", "dead_letter_queue": dlq, "max_receives": 1}, {"name": "other"}):
        r = api.post(f"{TOPICS}/{topic}/subscriptions", spec, format="json")
        assert r.status_code == 201, r.content
    runtime.tick()
    r = api.post(f"{TOPICS}/{topic}/publish", {"body": "hard", "group": "g"}, format="json")
    assert r.status_code == 201, r.content
    picky, other = f"{topic}/picky", f"{topic}/other"
    sub_url = f"{TOPICS}/{topic}/subscriptions"

    def take(sub: str, **params) -> list[dict]:
        r = api.post(f"{sub_url}/{sub}/dequeue", params, format="json")
        assert r.status_code == 200, r.content
        return r.json()["messages"]

    (m,) = take("other")
    r = api.post(f"{sub_url}/other/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]}]}, format="json")
    assert r.json()["acked"] == 1
    assert len(take("picky", visibility_timeout=0)) == 1
    assert take("picky") == []  # moved to the dead-letter queue
    # when the dead-letter queue is redriven
    r = post(api, dlq, "redrive", {"max": 10})
    # then it is back in "picky" (in its group), and "other", which acked it, does not see it again
    assert r.status_code == 200 and r.json() == {"moved": 1, "skipped": 0, "sources": {picky: 1}}, r.content
    (back,) = take("picky", visibility_timeout=60)
    assert (back["body"], back["group"], back["receive_count"]) == ("hard", "g", 1)
    assert take("other") == []
    assert other not in r.json()["sources"]


@in_process
def test_a_strict_dead_letter_queue_keeps_groups_and_their_order(api, make_queue):
    # given a strict queue whose dead-letter queue is strict too, and three messages of a group
    dlq = make_queue(strict=True, partitions=2)
    source = make_queue(strict=True, partitions=1, dead_letter_queue=dlq, max_receives=1)
    enqueue(api, source, {"messages": [{"body": f"m{i}", "group": "g"} for i in range(3)]})

    # when a consumer fails every delivery (visibility 0: back at once)
    def failed_all() -> bool:
        dequeue(api, source, visibility_timeout=0)
        return stats(api, source)["depth"] == 0

    # then the source empties (before: each dead letter lost its group, the strict queue refused
    # it, and it was set aside again at every dequeue, for ever)
    wait_until(failed_all, 20, "the source to empty into its dead-letter queue")
    # and the dead-letter queue holds them in their group, in order
    seen = []
    for _ in range(3):
        (m,) = dequeue(api, dlq, max=10, visibility_timeout=60)
        assert m["group"] == "g" and m["history"]["group"] == "g"
        seen.append(m["body"])
        ack(api, dlq, [m])
    assert seen == ["m0", "m1", "m2"]


@in_process
@pytest.mark.parametrize(
    "dlq_fields, source_fields, field",
    [
        ({"max_message_size": 1000}, {}, "dead_letter_queue"),
        ({"strict": True}, {"strict": False}, "dead_letter_queue"),
    ],
)
def test_a_dead_letter_queue_that_cannot_take_the_messages_is_refused(
    api, make_queue, unique_name, dlq_fields, source_fields, field
):
    # given a dead-letter queue whose rules would refuse some of the source's messages
    dlq = make_queue(**dlq_fields)
    # when a queue names it
    name = unique_name()
    fields = {"name": name, "dead_letter_queue": dlq, "max_receives": 2, **source_fields}
    r = api.post("/api/v1/queues", fields, format="json")
    # then it is refused with why, and nothing is created
    assert r.status_code == 400 and field in r.content.decode(), r.content
    assert api.get(f"/api/v1/queues/{name}").status_code == 404
    # and the same for a queue that exists, changed to name it
    source = make_queue(**source_fields)
    r = api.patch(f"/api/v1/queues/{source}", {"dead_letter_queue": dlq, "max_receives": 2}, format="json")
    assert r.status_code == 400, r.content
    assert api.get(f"/api/v1/queues/{source}").json()["dead_letter_queue"] is None


@in_process
def test_a_dead_letter_queue_cannot_be_changed_to_refuse_its_sources_messages(api, make_queue, unique_name):
    # given a dead-letter queue of a queue and of a topic's subscription
    dlq = make_queue()
    make_queue(dead_letter_queue=dlq, max_receives=2)
    # when it is changed to take smaller messages than its source's, or to be strict
    for change in ({"max_message_size": 1000}, {"strict": True}):
        r = api.patch(f"/api/v1/queues/{dlq}", change, format="json")
        # then it is refused
        assert r.status_code == 400, r.content
    # and a subscription cannot name a dead-letter queue that cannot take its topic's messages
    small = make_queue(max_message_size=1000)
    topic = unique_name("t")
    assert api.post(TOPICS, {"name": topic}, format="json").status_code == 201
    spec = {"name": "s", "dead_letter_queue": small, "max_receives": 2}
    r = api.post(f"{TOPICS}/{topic}/subscriptions", spec, format="json")
    assert r.status_code == 400, r.content


def _moves_failed(queue: str) -> float:
    from queues import metrics

    return metrics.DEAD_LETTER_MOVES_FAILED.labels(queue, "")._value.get()


def _set_aside(api, source: str, bodies: list[str]) -> dict[str, str]:
    """Enqueue ``bodies`` into ``source`` (max_receives 1) and receive each once without an
    ack; the next dequeue sets them all aside together. Body -> ID."""
    ids = enqueue(api, source, {"messages": [{"body": b} for b in bodies]})["ids"]
    got = dequeue(api, source, max=10, visibility_timeout=0)
    assert sorted(m["body"] for m in got) == sorted(bodies)
    return dict(zip(bodies, ids))


@in_process
def test_a_dead_letter_that_cannot_move_stays_counted_and_the_others_move(api, make_queue, monkeypatch, caplog):
    from queues.service import RemoteError
    from queues.service import messages as service_messages

    # given a dead-letter queue whose owner refuses one dead letter (a 4xx of its own)
    dlq = make_queue(partitions=1)
    source = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    real = service_messages._enqueue_somewhere

    def refusing(cfg, index, drafts, now, hops, caller):
        if cfg.name == dlq and any(d.body == "refused" for d in drafts):
            raise RemoteError(400, {"error": "invalid_attributes", "detail": "refused by the owner"})
        return real(cfg, index, drafts, now, hops, caller)

    monkeypatch.setattr(service_messages, "_enqueue_somewhere", refusing)
    ids = _set_aside(api, source, ["before", "refused", "after"])
    failed = _moves_failed(source)
    # when the next dequeue sets the three aside together
    with caplog.at_level("WARNING", logger="queues.service.messages"):
        assert dequeue(api, source, max=10) == []
    # then the other two are in the dead-letter queue, and the refused one stays in the source,
    # counted and logged by its ID
    got = dequeue(api, dlq, max=10, visibility_timeout=60)
    assert sorted(m["body"] for m in got) == ["after", "before"]
    assert stats(api, source)["depth"] == 1
    assert _moves_failed(source) == failed + 1
    assert any(ids["refused"] in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    # and once the dead-letter queue takes it, a later dequeue moves it too
    monkeypatch.setattr(service_messages, "_enqueue_somewhere", real)
    wait_until(lambda: not dequeue(api, source, max=10) and stats(api, source)["depth"] == 0, 10, "the move")
    assert [m["body"] for m in dequeue(api, dlq, max=10)] == ["refused"]


@in_process
def test_dead_letters_whose_way_is_down_are_tried_once_a_dequeue(api, make_queue, monkeypatch):
    from queues.service import PartitionUnavailable
    from queues.service import messages as service_messages

    # given a dead-letter queue that no node serves now (its store, or its owner, is down)
    dlq = make_queue(partitions=1)
    source = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    real = service_messages._enqueue_somewhere
    calls = []

    def down(cfg, index, drafts, now, hops, caller):
        if cfg.name != dlq:
            return real(cfg, index, drafts, now, hops, caller)
        calls.append(cfg.name)
        raise PartitionUnavailable(f"{cfg.name}/0: no owner now")

    monkeypatch.setattr(service_messages, "_enqueue_somewhere", down)
    _set_aside(api, source, ["one", "two", "three"])
    failed = _moves_failed(source)
    # when the next dequeue sets them aside
    assert dequeue(api, source, max=10) == []
    # then the move is tried once, not once a dead letter (each could wait out a timeout), and
    # all three stay in the source, the one tried counted
    assert calls == [dlq]
    assert stats(api, source)["depth"] == 3
    assert _moves_failed(source) == failed + 1
    # and when the dead-letter queue is back, they all move
    monkeypatch.setattr(service_messages, "_enqueue_somewhere", real)
    wait_until(lambda: not dequeue(api, source, max=10) and stats(api, source)["depth"] == 0, 10, "the move")
    assert sorted(m["body"] for m in dequeue(api, dlq, max=10)) == ["one", "three", "two"]
