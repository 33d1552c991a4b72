"""The nemesis checker (nemesis/checker.py) catches what it claims (issue 46, "What must be shown"):
histories with a lost ack, a reordered group, overlapping owners, a superseded epoch, a 500 and a
503 without Retry-After are each reported; a clean history with duplicates and unknown outcomes is
valid, and what it allows is counted. A property test then runs the checker over histories of a
correct queue, generated, and over the same with one anomaly put in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemesis.checker import ANOMALIES, check
from nemesis.history import FaultEvent, History, NodeEvent, Op

MS = 1_000_000


class Run:
    """A synthetic history written one record at a time on a clock that ticks a millisecond a
    record. ``call`` writes a whole call; ``start``/``finish`` leave room for others in between."""

    def __init__(self) -> None:
        self.records: list[Op | NodeEvent | FaultEvent] = []
        self.now = 0

    def tick(self) -> int:
        self.now += MS
        return self.now

    def start(self, process: Any, f: str, **known: Any) -> None:
        self.records.append(Op(process=process, type="invoke", f=f, time=self.tick(), **known))

    def finish(self, process: Any, f: str, type: str = "ok", **learnt: Any) -> None:
        self.records.append(Op(process=process, type=type, f=f, time=self.tick(), **learnt))

    def call(self, process: Any, f: str, type: str = "ok", invoke: dict | None = None, **learnt: Any) -> None:
        self.start(process, f, **(invoke or {}))
        self.finish(process, f, type, **learnt)

    def enqueue(
        self, *tokens: str, queue: str = "q", group: str | None = None, type: str = "ok", **learnt: Any
    ) -> None:
        value: Any = tokens[0] if len(tokens) == 1 else list(tokens)
        if type == "ok":
            learnt.setdefault("ids", [f"{queue}/{t}" for t in tokens])
            learnt.setdefault("status", 201)
        self.call("producer", "enqueue", type, {"queue": queue, "group": group, "value": value}, **learnt)

    def dequeue(self, *tokens: str, queue: str = "q", **learnt: Any) -> None:
        value = [{"id": f"{queue}/{t}", "value": t} for t in tokens]
        self.call("consumer", "dequeue", "ok", {"queue": queue}, value=value, status=200, **learnt)

    def ack(self, *tokens: str, queue: str = "q", type: str = "ok") -> None:
        self.call("consumer", "ack", type, {"queue": queue, "ids": [f"{queue}/{t}" for t in tokens]})

    def node(
        self,
        node: str,
        event: str,
        partition: str = "q/0",
        epoch: int = 1,
        until: int | None = None,
        id: str | None = None,
    ) -> int:
        """A node's event; ``until``: its lease's end, that many ticks after the event; ``id``:
        the process's node ID. Returns its time."""
        time = self.tick()
        end = time + until * MS if until is not None else None
        self.records.append(
            NodeEvent(node=node, event=event, partition=partition, epoch=epoch, time=time, until=end, id=id)
        )
        return time

    def fault(self, kind: str, event: str, target: str | None = None) -> None:
        self.records.append(FaultEvent(fault=kind, event=event, time=self.tick(), target=target))

    def history(self) -> History:
        return History.of(self.records)


def only(result, anomaly: str, count: int = 1) -> list[dict]:
    """The result reports ``count`` of ``anomaly`` and nothing else; returns its examples."""
    assert not result.valid
    assert result.anomalies == {a: (count if a == anomaly else 0) for a in ANOMALIES}
    return result.examples[anomaly]


def test_a_clean_history_with_duplicates_and_unknowns_is_valid_and_counted():
    # given
    run = Run()
    run.node("n1", "serve", epoch=1)
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.enqueue("c")
    run.enqueue("d", type="info", error="timeout")  # unknown, never delivered: not lost
    run.enqueue("e", type="info", error="connection reset")  # unknown, delivered: recovered
    run.enqueue("f", type="fail", status=503, retry_after="1")  # refused, never delivered
    run.dequeue("a", "c", node="n1", partition="q/0", epoch=1)
    run.ack("a")
    run.dequeue("b", "e")
    run.fault("kill", "start", "n2")
    run.dequeue("c")  # c's visibility ran out: delivered again while n2 is down
    run.ack("b", "c", "e")
    run.fault("kill", "stop", "n2")
    run.dequeue("c")  # its ack is answered: a delivery after an ack
    run.ack("c", type="info")
    run.node("n1", "unserve", epoch=1)
    # when
    result = check(run.history())
    # then
    assert result.valid, result.to_json()
    assert result.anomalies == dict.fromkeys(ANOMALIES, 0)
    assert result.enqueues == {"confirmed": 3, "failed": 1, "unknown": 2, "recovered": 1}
    assert result.deliveries == 6
    assert result.duplicates == {"kill": 1, "none": 1}
    assert result.after_ack == {"none": 1}
    assert result.operations["enqueue"] == {"ok": 3, "info": 2, "fail": 1}


def test_an_acknowledged_enqueue_never_delivered_is_lost():
    run = Run()
    run.enqueue("a")
    run.enqueue("b")
    run.dequeue("a")
    run.ack("a")
    (example,) = only(check(run.history()), "lost")
    assert (example["stream"], example["token"], example["ids"]) == ("q", "b", ["q/b"])


def test_a_topic_message_must_reach_every_subscription():
    run = Run()
    run.enqueue("a", queue="t", fanout=["t/one", "t/two"])
    run.dequeue("a", queue="t/one")
    (example,) = only(check(run.history()), "lost")
    assert (example["stream"], example["token"]) == ("t/two", "a")


@pytest.mark.parametrize("enqueue", ["fail", "never"])
def test_a_delivery_of_a_message_that_was_never_enqueued_is_unexpected(enqueue):
    run = Run()
    if enqueue == "fail":
        run.enqueue("a", type="fail", status=400)
    run.dequeue("a")
    (example,) = only(check(run.history()), "unexpected")
    assert example["token"] == "a"


def test_a_group_message_delivered_before_its_predecessor_was_acked_is_reported():
    # given: b enqueued after a was confirmed, delivered while a is in flight
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.dequeue("a")
    run.dequeue("b")
    run.ack("a")
    run.ack("b")
    # when / then
    (example,) = only(check(run.history()), "group_order")
    assert (example["group"], example["delivered"], example["before"]) == ("g", "b", "a")
    assert example["its_ack_sent"] is not None


@pytest.mark.parametrize(
    "delivered",
    [
        ["b"],  # b first, a never
        ["b", "a"],  # reordered in one answer
        ["a", "b"],  # both in flight at once
    ],
)
def test_a_reordered_group_is_reported(delivered):
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.dequeue(*delivered)
    examples = check(run.history()).examples["group_order"]
    assert [e["delivered"] for e in examples] == ["b"]


def test_a_batch_orders_its_group_and_ungrouped_or_concurrent_enqueues_order_nothing():
    # a batch: its order is the group's
    run = Run()
    run.enqueue("a", "b", group="g")
    run.dequeue("b")
    run.dequeue("a")
    assert only(check(run.history()), "group_order")[0]["delivered"] == "b"
    # concurrent enqueues of one group: either order is right
    run = Run()
    run.start("p1", "enqueue", queue="q", group="g", value="a")
    run.start("p2", "enqueue", queue="q", group="g", value="b")
    run.finish("p1", "enqueue", ids=["q/a"])
    run.finish("p2", "enqueue", ids=["q/b"])
    run.dequeue("b")
    run.ack("b")
    run.dequeue("a")
    run.ack("a")
    assert check(run.history()).valid
    # other groups and no group: no order between them
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="h")
    run.enqueue("c")
    run.dequeue("c", "b", "a")
    assert check(run.history()).valid


def test_an_ack_that_may_have_taken_effect_frees_the_next_message_of_the_group():
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.dequeue("a")
    run.start("consumer-2", "ack", queue="q", ids=["q/a"])  # sent, answer not yet heard
    run.dequeue("b")
    run.finish("consumer-2", "ack", type="info", error="timeout")
    assert check(run.history()).valid
    # an ack that failed freed nothing
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.dequeue("a")
    run.ack("a", type="fail")
    run.dequeue("b")
    assert only(check(run.history()), "group_order")[0]["delivered"] == "b"


@pytest.mark.parametrize(
    ("answers", "reported"),
    [
        ([("a", "b"), ("c",)], []),  # the group's next ones together, in order
        ([("a",), ("b", "c")], ["b", "c"]),  # b and c while a is in flight
        ([("b", "a")], ["b"]),  # out of order within one answer
        ([("a", "c")], ["c"]),  # b skipped
    ],
)
def test_with_group_batch_one_answer_may_hold_a_groups_next_messages_in_order(answers, reported):
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.enqueue("c", group="g")
    for answer in answers:
        run.dequeue(*answer)
        if answer == ("a", "b"):
            run.ack("a", "b")
    run.ack("a", "b", "c")
    result = check(run.history(), group_batch={"q"})
    assert [e["delivered"] for e in result.examples["group_order"]] == reported
    # without group_batch, two of a group in one answer are two in flight
    assert not check(run.history()).valid


def test_with_group_batch_a_message_whose_visibility_ran_out_comes_back_before_the_rest():
    run = Run()
    run.enqueue("a", group="g")
    run.enqueue("b", group="g")
    run.enqueue("c", group="g")
    run.dequeue("a", "b")
    run.ack("b")  # a's visibility runs out: a again, then c once a is acked
    run.dequeue("a")
    run.ack("a")
    run.dequeue("c")
    run.ack("c")
    assert check(run.history(), group_batch={"q"}).valid


def test_two_nodes_serving_one_partition_at_once_are_reported():
    run = Run()
    run.node("n1", "serve", epoch=1)
    run.node("n2", "serve", epoch=2)
    run.node("n1", "unserve", epoch=1)
    run.node("n2", "unserve", epoch=2)
    (example,) = only(check(run.history()), "overlapping_owners")
    assert (example["partition"], example["nodes"], example["epochs"]) == ("q/0", ["n1", "n2"], [1, 2])
    assert example["to"] - example["from"] == MS


def test_an_owner_that_says_nothing_more_serves_until_its_last_reported_lease_end():
    # a process frozen (its server stopping it) after a renewal: n2 takes over after its lease
    # end, and the run's end of n1 comes later still: no overlap
    run = Run()
    run.node("n1/1", "serve", epoch=1, until=5)
    run.node("n1/1", "renew", epoch=1, until=3)  # its end: 3 ticks after this one
    for _ in range(4):
        run.tick()
    run.node("n2/2", "serve", epoch=2)
    run.node("n1/1", "unserve", epoch=1)  # written by the run when it killed n1
    assert check(run.history()).valid
    # a renewal moves the end on: n2 serving before it is an overlap
    run = Run()
    run.node("n1/1", "serve", epoch=1, until=3)
    run.node("n1/1", "renew", epoch=1, until=10)
    run.node("n2/2", "serve", epoch=2)
    run.node("n1/1", "unserve", epoch=1)
    only(check(run.history()), "overlapping_owners")
    # one of its reports dropped (a renew with no end): unbounded until it reports an end again
    run = Run()
    run.node("n1/1", "serve", epoch=1, until=2)
    run.node("n1/1", "renew", epoch=1)
    for _ in range(3):
        run.tick()
    run.node("n2/2", "serve", epoch=2)
    run.node("n1/1", "unserve", epoch=1)
    only(check(run.history()), "overlapping_owners")
    # a call served by it after its word: the stretch lasts until that call was sent at least
    run = Run()
    run.node("n1/1", "serve", epoch=1, until=2, id="abc")
    for _ in range(3):
        run.tick()
    run.node("n2/2", "serve", epoch=2, id="def")
    run.call("c", "dequeue", served=[["abc", "q/0", 1]])
    run.node("n1/1", "unserve", epoch=1, id="abc")
    result = check(run.history())
    assert result.anomalies["overlapping_owners"] == 1  # (and the call's epoch was stale)
    # a renew of another epoch, or of nothing served, bounds nothing
    run = Run()
    run.node("n1/1", "renew", epoch=1, until=1)
    run.node("n1/1", "serve", epoch=2)
    run.node("n1/1", "renew", epoch=1, until=1)
    for _ in range(3):
        run.tick()
    run.node("n2/2", "serve", epoch=3)
    run.node("n1/1", "unserve", epoch=2)
    only(check(run.history()), "overlapping_owners")


def test_a_killed_or_paused_owner_serves_nothing_meanwhile():
    # killed: its stretch ends at the kill, it never says unserve
    run = Run()
    run.node("n1", "serve", epoch=1)
    run.fault("kill", "start", "n1")
    run.node("n2", "serve", epoch=2)
    run.fault("kill", "stop", "n1")
    assert check(run.history()).valid
    # paused past its lease; on waking it finds the lease lost and says so
    run = Run()
    run.node("n1", "serve", epoch=1)
    run.fault("pause", "start", "n1")
    run.node("n2", "serve", epoch=2)
    run.node("n1", "unserve", epoch=1)  # stamped while n1 is still stopped
    run.fault("pause", "stop", "n1")
    assert check(run.history()).valid
    # woken before it says so: the stretch after the pause overlaps n2's, unless within the slack
    run = Run()
    run.node("n1", "serve", epoch=1)
    run.fault("pause", "start", "n1")
    run.node("n2", "serve", epoch=2)
    run.fault("pause", "stop", "n1")
    run.node("n1", "unserve", epoch=1)
    only(check(run.history()), "overlapping_owners")
    assert check(run.history(), overlap_slack_ns=MS).valid
    # another partition, or the same node again, is no overlap
    run = Run()
    run.node("n1", "serve", partition="q/0", epoch=1)
    run.node("n2", "serve", partition="q/1", epoch=1)
    run.node("n1", "serve", partition="q/0", epoch=2)
    assert check(run.history()).valid


def test_an_operation_answered_under_a_superseded_epoch_is_reported():
    # given: n2 took the partition over (epoch 2); then n1 answers under epoch 1
    run = Run()
    run.node("n1", "serve", epoch=1)
    run.enqueue("a", node="n1", partition="q/0", epoch=1)  # before the takeover: fine
    run.start("producer-2", "enqueue", queue="q", value="b")
    run.fault("kill", "start", "n1")
    run.node("n2", "serve", epoch=2)
    run.finish("producer-2", "enqueue", ids=["q/b"], node="n1", partition="q/0", epoch=1)  # sent before: fine
    run.enqueue("c", node="n1", partition="q/0", epoch=1, status=201)  # sent after: stale
    run.enqueue("d", type="fail", node="n1", partition="q/0", epoch=1, status=503, retry_after="1")  # fenced: fine
    run.dequeue("a", "b", "c", node="n2", partition="q/0", epoch=2)
    # when / then
    (example,) = only(check(run.history()), "stale_epoch")
    assert (example["node"], example["epoch"], example["superseded_by"]) == ("n1", 1, 2)


@pytest.mark.parametrize(
    ("status", "retry_after", "anomaly"),
    [
        (500, None, "server_error"),
        (502, "1", "server_error"),
        (503, None, "unavailable_without_retry_after"),
        (503, "", "unavailable_without_retry_after"),
        (503, "2", None),
        (429, None, None),
        (404, None, None),
    ],
)
def test_a_5xx_other_than_503_and_a_503_without_retry_after_are_reported(status, retry_after, anomaly):
    run = Run()
    run.call("consumer", "dequeue", "fail", {"queue": "q"}, status=status, retry_after=retry_after, error="x")
    result = check(run.history())
    if anomaly is None:
        assert result.valid
    else:
        (example,) = only(result, anomaly)
        assert example["status"] == status


def test_what_is_allowed_is_counted_by_the_faults_on_when_it_was_answered():
    run = Run()
    run.enqueue("a")
    run.dequeue("a")
    run.ack("a")
    run.fault("kill", "start", "n1")
    run.fault("redis-pause", "start", "redis")
    run.dequeue("a")
    run.fault("kill", "stop", "n1")
    run.dequeue("a")
    run.fault("redis-pause", "stop", "redis")
    run.dequeue("a")
    result = check(run.history())
    assert result.valid
    assert result.duplicates == {"kill+redis-pause": 1, "none": 1, "redis-pause": 1}
    assert result.after_ack == result.duplicates


def test_the_examples_stop_at_three_the_counts_do_not():
    run = Run()
    for i in range(5):
        run.enqueue(f"m{i}")
    result = check(run.history())
    assert result.anomalies["lost"] == 5
    assert [e["token"] for e in result.examples["lost"]] == ["m0", "m1", "m2"]


# -- property: the histories of a correct queue are valid; one anomaly put in is always caught


@st.composite
def clean_runs(draw: st.DrawFn) -> tuple[Run, dict[str, Any]]:
    """A correct queue, simulated: enqueues (some unknown: applied or not; some refused), then
    consumers that take any deliverable message (a group's next only once the ones before are
    acknowledged; with ``group_batch``, with the group's next ones after it in the same answer),
    and ack each, lose the ack's answer, or let its visibility run out; faults start and stop in
    between. Returns the run and what it did (duplicates, recovered, whether it batched)."""
    run = Run()
    batch = draw(st.booleans())
    groups = st.sampled_from([None, "g1", "g2"])
    stored: list[tuple[str, str | None]] = []  # the queue's messages, in enqueue order
    recovered_candidates: set[str] = set()
    for i in range(draw(st.integers(1, 10))):
        token, group = f"m{i}", draw(groups)
        outcome = draw(st.sampled_from(["ok", "ok", "ok", "info-applied", "info-lost", "fail"]))
        if outcome == "ok":
            run.enqueue(token, group=group)
        elif outcome == "fail":
            run.enqueue(token, group=group, type="fail", status=503, retry_after="1")
        else:
            run.enqueue(token, group=group, type="info", error="timeout")
        if outcome in ("ok", "info-applied"):
            stored.append((token, group))
            if outcome == "info-applied":
                recovered_candidates.add(token)

    acked: set[str] = set()
    delivered: dict[str, int] = {}
    faulted = False
    steps = 0
    while len(acked) < len(stored):
        deliverable = [
            n
            for n, (token, group) in enumerate(stored)
            if token not in acked and (group is None or all(t in acked for t, g in stored[:n] if g == group))
        ]
        n = draw(st.sampled_from(deliverable))
        token, group = stored[n]
        answer = [token]
        if batch and group is not None:
            after = [t for t, g in stored[n + 1 :] if g == group and t not in acked]
            answer += after[: draw(st.integers(0, 2))]
        if draw(st.booleans()):
            run.fault("kill", "stop" if faulted else "start", "n1")
            faulted = not faulted
        run.dequeue(*answer)
        steps += 1
        for token in answer:
            delivered[token] = delivered.get(token, 0) + 1
            choices = ["ack", "ack", "ack-unknown-applied", "ack-unknown-lost", "timeout"]
            then = draw(st.sampled_from(choices if steps < 30 else ["ack"]))
            if then == "ack":
                run.ack(token)
                acked.add(token)
            elif then.startswith("ack-unknown"):
                run.ack(token, type="info")
                if then.endswith("applied"):
                    acked.add(token)
    did = {
        "duplicates": sum(n - 1 for n in delivered.values()),
        "recovered": len(recovered_candidates),
        "deliveries": sum(delivered.values()),
        "group_batch": ["q"] if batch else [],
    }
    return run, did


@settings(max_examples=150, deadline=None)
@given(clean_runs())
def test_any_history_of_a_correct_queue_is_valid(clean):
    run, did = clean
    result = check(run.history(), group_batch=did["group_batch"])
    assert result.valid, result.to_json()
    assert sum(result.duplicates.values()) == did["duplicates"]
    assert result.enqueues["recovered"] == did["recovered"]
    assert result.deliveries == did["deliveries"]


def _drop_deliveries(run: Run, token: str) -> None:
    for n, record in enumerate(run.records):
        if isinstance(record, Op) and record.f == "dequeue" and record.type == "ok":
            run.records[n] = replace(record, value=[m for m in record.value if m["value"] != token])


def _deliver_early(run: Run) -> None:
    """Deliver a group's second confirmed message right after its enqueue was answered, before
    the first one was even delivered (the simulation delivers only once every enqueue is done)."""
    by_group: dict[str, list[str]] = {}
    for o in run.history().operations():
        if o.f == "enqueue" and o.type == "ok" and o.group is not None:
            by_group.setdefault(o.group, []).append(o.value)
    later = next((tokens[1] for tokens in by_group.values() if len(tokens) > 1), None)
    if later is None:
        run.enqueue("x", group="late")
        run.enqueue("y", group="late")
        run.dequeue("y")
        return
    n, answered = next(
        (n, r)
        for n, r in enumerate(run.records)
        if isinstance(r, Op) and r.type == "ok" and r.f == "enqueue" and r.ids == [f"q/{later}"]
    )
    run.records[n + 1 : n + 1] = [
        Op(process="intruder", type="invoke", f="dequeue", time=answered.time + 1, queue="q"),
        Op(
            process="intruder",
            type="ok",
            f="dequeue",
            time=answered.time + 2,
            value=[{"id": f"q/{later}", "value": later}],
        ),
    ]


INJECTED = [
    "lost",
    "unexpected",
    "group_order",
    "overlapping_owners",
    "server_error",
    "unavailable_without_retry_after",
]


@settings(max_examples=200, deadline=None)
@given(clean_runs(), st.sampled_from(INJECTED), st.data())
def test_one_anomaly_put_into_a_correct_history_is_caught(clean, anomaly, data):
    # given
    run, did = clean
    confirmed = [o.value for o in run.history().operations() if o.f == "enqueue" and o.type == "ok"]
    if anomaly == "lost":
        if not confirmed:
            run.enqueue("late")  # confirmed, never delivered
        else:
            _drop_deliveries(run, data.draw(st.sampled_from(confirmed)))
    elif anomaly == "unexpected":
        run.dequeue("nobody-sent-this")
    elif anomaly == "group_order":
        _deliver_early(run)
    elif anomaly == "overlapping_owners":
        run.node("n1", "serve", epoch=1)
        run.node("n2", "serve", epoch=2)
        run.node("n1", "unserve", epoch=1)
    else:
        ops = [n for n, r in enumerate(run.records) if isinstance(r, Op) and r.type != "invoke"]
        n = data.draw(st.sampled_from(ops))
        status = 500 if anomaly == "server_error" else 503
        run.records[n] = replace(run.records[n], status=status, retry_after=None)
    # when
    result = check(run.history(), group_batch=did["group_batch"])
    # then
    assert not result.valid
    assert result.anomalies[anomaly] >= 1
