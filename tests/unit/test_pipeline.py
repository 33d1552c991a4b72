"""The worker pipeline (workers/pipeline.py) against an in-memory client: no server.

Timings come from the pipeline's own attempt log records (pre-processing and processing start
and end times) and from the fake client's clock of dequeues, acks and visibility changes.
Handlers sleep for the durations written in each message's body, so a message's *estimates*
(what the pipeline schedules by) and its real durations can differ.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest

from mq_client import ApiError, Estimates, Unavailable
from tests.stand_ins import FakeMessage
from workers.handlers import Handler
from workers.pipeline import MAX_ACKS_WAITING, MAX_AHEAD, Pipeline

TOL = 0.08  # scheduling slack on a busy 2-core machine; the delays below are 3-10x larger


# ------------------------------------------------------------------------------ the fake client


@dataclass
class _Stored:
    message: FakeMessage
    deliveries: int = 0
    visible_at: float = 0.0
    receipt: str | None = None
    acked: bool = False


class FakeClient:
    """The SDK's pipeline-facing methods over in-memory queues. Thread-safe.

    Records every call: ``dequeues`` (start, end, queue, wait, ids), ``acks`` (time, queue, id),
    ``visibility`` (time, queue, id, timeout, receive_count), ``log_batches`` and ``heartbeats``.
    ``outstanding`` is the number of messages delivered and neither acked nor given a new
    visibility; ``max_outstanding`` its peak.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[str, list[_Stored]] = {}
        self._seq = itertools.count()
        self.dequeues: list[tuple] = []
        self.acks: list[tuple] = []
        self.stale_acks: list[tuple] = []
        self.visibility: list[tuple] = []
        self.log_batches: list[list[dict]] = []
        self.nodes_asked: list[str | None] = []
        self.heartbeats: list[dict] = []
        self.heartbeat_answer: dict = {"instruction": "continue", "sleep": 0, "extended": [], "lost": []}
        self.outstanding = 0
        self.max_outstanding = 0
        self.asked: list[int] = []  # each dequeue's max_messages
        self.ack_calls = 0
        #: seconds each dequeue takes before answering (a call's round trip)
        self.dequeue_delay = 0.0

    # -- test side
    def add(
        self,
        queue: str,
        body: Any = "",
        *,
        estimates: Any = None,
        group: str | None = None,
        deliveries: int = 0,
        size: int | None = None,
    ) -> str:
        """Enqueue; ``deliveries`` earlier deliveries make its next ``receive_count`` deliveries + 1."""
        body = body if isinstance(body, str) else json.dumps(body)
        with self.cond:
            mid = f"{queue}/0/0/{next(self._seq)}"
            msg = FakeMessage(
                id=mid,
                receipt="",
                body=body,
                group=group,
                attributes={"k": "v"},
                size=size if size is not None else len(body),
                estimates=estimates,
            )
            self.queues.setdefault(queue, []).append(_Stored(msg, deliveries=deliveries))
            self.cond.notify_all()
        return mid

    def records(self) -> list[dict]:
        with self.cond:
            return [r for batch in self.log_batches for r in batch]

    def acked_ids(self) -> list[str]:
        with self.cond:
            return [a[2] for a in self.acks]

    def dequeue_count(self) -> int:
        with self.cond:
            return len(self.dequeues)

    def _find(self, queue: str, mid: str) -> _Stored | None:
        for s in self.queues.get(queue, []):
            if s.message.id == mid:
                return s
        return None

    # -- the SDK's methods
    def dequeue(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float = 0,
        node: str | None = None,
    ) -> list[FakeMessage]:
        t0 = time.time()
        self.nodes_asked.append(node)
        self.asked.append(max_messages)
        if self.dequeue_delay:
            time.sleep(self.dequeue_delay)
        deadline = time.monotonic() + (wait or 0)
        with self.cond:
            while True:
                now = time.time()
                ready = [s for s in self.queues.get(queue, []) if not s.acked and s.visible_at <= now]
                if ready or time.monotonic() >= deadline:
                    break
                self.cond.wait(min(0.01, max(0.0, deadline - time.monotonic())))
            out = []
            for s in ready[:max_messages]:
                s.deliveries += 1
                s.receipt = uuid.uuid4().hex
                s.visible_at = now + (visibility_timeout if visibility_timeout is not None else 30.0)
                out.append(replace(s.message, receipt=s.receipt, receive_count=s.deliveries))
            self.outstanding += len(out)
            self.max_outstanding = max(self.max_outstanding, self.outstanding)
            self.dequeues.append((t0, time.time(), queue, wait, [m.id for m in out]))
            return out

    def ack(self, queue: str, messages) -> dict:
        with self.cond:
            self.ack_calls += 1
            n = 0
            for item in messages:  # (id, receipt) pairs, or the API's {"id", "receipt"} (an Acker's)
                mid, receipt = (item["id"], item["receipt"]) if isinstance(item, dict) else item
                s = self._find(queue, mid)
                if s is None or s.acked or s.receipt != receipt:
                    self.stale_acks.append((time.time(), queue, mid))
                    continue
                s.acked = True
                self.outstanding -= 1
                self.acks.append((time.time(), queue, mid))
                n += 1
            return {"acked": n}

    def change_visibility(self, queue: str, message, visibility_timeout: float) -> dict:
        with self.cond:
            s = self._find(queue, message.id)
            self.visibility.append((time.time(), queue, message.id, visibility_timeout, message.receive_count))
            if s is not None and not s.acked and s.receipt == message.receipt:
                s.visible_at = time.time() + visibility_timeout
                s.receipt = None
                self.outstanding -= 1
                self.cond.notify_all()
            return {"id": message.id, "visibility_timeout": visibility_timeout}

    def send_logs(self, records: list[dict]) -> dict:
        with self.cond:
            self.log_batches.append([dict(r) for r in records])
        return {"stored": len(records)}

    def heartbeat(self, payload: dict) -> dict:
        with self.cond:
            self.heartbeats.append(payload)
            return dict(self.heartbeat_answer)


# ------------------------------------------------------------------------------ handlers & helpers


class Calls:
    """Which messages each stage saw (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.preprocessed: list[str] = []
        self.processed: list[str] = []

    def add(self, kind: str, mid: str) -> None:
        with self.lock:
            getattr(self, kind).append(mid)


def sleeping_handler(
    queue: str = "jobs",
    calls: Calls | None = None,
    timeout: float | None = None,
    gates: dict[str, threading.Event] | None = None,
) -> Handler:
    """Body: ``{"pre": s, "proc": s, "fail": bool, "pre_fail": bool}``; ``gates[id]``, when
    given, is awaited at the start of that message's processing."""
    calls = calls or Calls()

    def preprocess(message):
        spec = json.loads(message.body or "{}")
        calls.add("preprocessed", message.id)
        time.sleep(spec.get("pre", 0))
        if spec.get("pre_fail"):
            raise RuntimeError("cannot fetch input")
        return spec

    def process(message, prepared):
        calls.add("processed", message.id)
        if gates and message.id in gates:
            assert gates[message.id].wait(10)
        time.sleep(prepared.get("proc", 0))
        if prepared.get("fail"):
            raise ValueError(f"boom {message.id}")

    return Handler(queue, process, preprocess, timeout)


def make_pipeline(client: FakeClient, handler: Handler, **options) -> Pipeline:
    options.setdefault("wait", 0.05)
    options.setdefault("heartbeat_every", 3600)  # heartbeats are driven by the tests
    return Pipeline(client, {handler.queue: handler}, **options)


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def ts(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp()


def by_process_start(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: ts(r["process_started_at"]) or 0)


def run_all(client: FakeClient, handler: Handler, n: int, **options) -> tuple[Pipeline, float, float]:
    """Start a pipeline, wait for ``n`` acks, stop it; (pipeline, first dequeue start, last ack)."""
    pipe = make_pipeline(client, handler, **options).start()
    try:
        wait_for(lambda: len(client.acks) >= n, timeout=15, what=f"{n} acks")
    finally:
        pipe.stop()
    return pipe, client.dequeues[0][0], client.acks[-1][0]


# ------------------------------------------------------------------------------ timing


@pytest.mark.parametrize(
    "estimates",
    [{"preprocess": 0.1, "process": 0.6}, Estimates(preprocess=0.1, process=0.6)],
    ids=["mapping", "sdk-Estimates"],
)
def test_next_preprocessing_is_timed_to_end_with_current_processing(estimates):
    client = FakeClient()
    for _ in range(3):
        client.add("jobs", {"pre": 0.1, "proc": 0.6}, estimates=estimates)
    run_all(client, sleeping_handler(), 3)

    recs = by_process_start(client.records())
    assert [r["outcome"] for r in recs] == ["succeeded"] * 3
    for cur, nxt in itertools.pairwise(recs):
        lead = ts(nxt["preprocess_started_at"]) - ts(cur["process_started_at"])
        assert abs(lead - (0.6 - 0.1)) <= TOL, f"pre-processing began {lead:.3f}s after processing"
        assert ts(nxt["preprocess_ended_at"]) <= ts(cur["process_ended_at"]) + TOL
        # ... so the next processing follows at once
        assert ts(nxt["process_started_at"]) - ts(cur["process_ended_at"]) <= TOL


@pytest.mark.parametrize("batch_acks", [True, False])
def test_pipelining_overlaps_the_next_preprocessing_and_sequential_does_not(batch_acks):
    """Order of events, read from the attempt records (speed itself is bench/pipeline.py's)."""
    n, pre, proc = 6, 0.03, 0.2
    for pipelining in (True, False):
        client = FakeClient()
        for _ in range(n):
            client.add("jobs", {"pre": pre, "proc": proc}, estimates={"preprocess": pre, "process": proc})
        run_all(client, sleeping_handler(), n, pipelining=pipelining, batch_acks=batch_acks)
        # one slot: the current and the next (and, acks batched, those processed whose acks are
        # on their way: one here, as a processing takes longer than an ack call)
        assert client.max_outstanding <= (2 if pipelining else 1) + batch_acks
        assert sorted(client.acked_ids()) == sorted(s.message.id for s in client.queues["jobs"])
        recs = by_process_start(client.records())
        for cur, nxt in itertools.pairwise(recs):
            overlap = ts(nxt["preprocess_started_at"]) < ts(cur["process_ended_at"])
            assert overlap == pipelining, (pipelining, cur, nxt)


def test_early_finish_starts_next_preprocessing_at_once():
    client = FakeClient()
    a = client.add("jobs", {"pre": 0.01, "proc": 0.1}, estimates={"preprocess": 0.01, "process": 1.0})
    b = client.add("jobs", {"pre": 0.03, "proc": 0.02}, estimates={"preprocess": 0.03, "process": 0.02})
    run_all(client, sleeping_handler(), 2)
    recs = {r["message_id"]: r for r in client.records()}
    # estimated 1.0 s: B's pre-processing would wait 0.97 s; A ends after 0.1 s, B starts then.
    # The bound is half the 0.87 s that waiting out the estimate would add, not TOL: a loaded
    # machine (the full suite on 2 cores) once put 0.6 s between A's end and B's processing.
    a_ended, b_rec = ts(recs[a]["process_ended_at"]), recs[b]
    assert a_ended - TOL <= ts(b_rec["preprocess_started_at"]) <= a_ended + 0.4
    assert ts(b_rec["process_started_at"]) - ts(b_rec["preprocess_ended_at"]) <= 0.4  # then its processing


def test_long_poll_for_the_next_message_does_not_delay_processing():
    """With an empty queue the look-ahead dequeue long-polls (``wait``): processing goes on."""
    client = FakeClient()
    for _ in range(2):
        client.add("jobs", {"proc": 0.1})
    _, first, last = run_all(client, sleeping_handler(), 2, wait=1.0)
    recs = by_process_start(client.records())
    assert ts(recs[1]["process_started_at"]) - ts(recs[0]["process_ended_at"]) <= TOL
    assert last - first < 0.2 + 0.15, f"2 x 0.1 s of work took {last - first:.2f}s"


@pytest.mark.parametrize("batch_acks", [True, False])
def test_slots_hold_at_most_two_messages_each(batch_acks):
    client = FakeClient()
    for _ in range(8):
        client.add("jobs", {"pre": 0.01, "proc": 0.1}, estimates={"preprocess": 0.01, "process": 0.1})
    _, first, last = run_all(client, sleeping_handler(), 8, concurrency=2, batch_acks=batch_acks)
    # two a slot not yet processed (tasks longer than a call: nothing received ahead), and, acks
    # batched, those processed whose acks wait for their answer (one a slot here: a processing
    # takes longer than an ack call)
    assert client.max_outstanding <= 4 + 2 * batch_acks
    assert 8 / (last - first) >= 0.8 * 2 / 0.1


# ------------------------------------------------------------------------------ outcomes & retries


def test_one_log_record_per_attempt_with_its_outcome():
    client = FakeClient()
    calls = Calls()
    ok = client.add("jobs", {"proc": 0.01}, group="g1")
    fail = client.add("jobs", {"proc": 0.01, "fail": True})
    slow = client.add("jobs", {"proc": 0.6})
    prefail = client.add("jobs", {"pre_fail": True})
    # (a failed message comes back after retry_backoff: not within this test, even on a slow box)
    pipe = make_pipeline(client, sleeping_handler(calls=calls, timeout=0.3), retry_backoff=60).start()
    try:
        wait_for(lambda: len(client.acks) + len(client.visibility) >= 4, what="4 attempts")
    finally:
        pipe.stop()

    recs = client.records()
    assert sorted(r["message_id"] for r in recs) == sorted([ok, fail, slow, prefail])  # one each
    by_id = {r["message_id"]: r for r in recs}
    assert {m: by_id[m]["outcome"] for m in by_id} == {
        ok: "succeeded",
        fail: "failed",
        slow: "timed_out",
        prefail: "failed",
    }
    for r in recs:
        assert r["attempt"] == 1 and r["worker"] == pipe.consumer_id and r["size"] is not None
    assert by_id[ok]["group"] == "g1"
    assert "error" not in by_id[ok] and "error" not in by_id[slow]
    assert by_id[fail]["error"] == f"ValueError: boom {fail}"
    assert "Traceback" in by_id[fail]["traceback"] and "ValueError: boom" in by_id[fail]["traceback"]
    assert by_id[prefail]["error"] == "RuntimeError: cannot fetch input"
    assert "RuntimeError" in by_id[prefail]["traceback"]
    assert by_id[prefail]["process_started_at"] is None and prefail not in calls.processed
    assert ts(by_id[slow]["process_ended_at"]) - ts(by_id[slow]["process_started_at"]) > 0.3
    assert client.acked_ids() == [ok]
    assert sorted(v[2] for v in client.visibility) == sorted([fail, slow, prefail])


def test_failed_attempts_back_off_with_receive_count_and_are_never_acked():
    client = FakeClient()
    ids = [client.add("jobs", {"fail": True}, deliveries=d) for d in (0, 1, 3)]  # receive_count 1, 2, 4
    # (backoffs of seconds: none comes back within the test, even on a slow box)
    pipe = make_pipeline(client, sleeping_handler(), retry_backoff=5).start()
    try:
        wait_for(lambda: len(client.visibility) >= 3, what="3 visibility changes")
    finally:
        pipe.stop()
    assert client.acks == [] and client.stale_acks == []
    assert len(client.visibility) == 3
    backoff = {v[2]: (v[4], v[3]) for v in client.visibility}
    assert [backoff[m] for m in ids] == [(1, 5), (2, 10), (4, 40)]
    assert [r["attempt"] for r in sorted(client.records(), key=lambda r: ids.index(r["message_id"]))] == [1, 2, 4]


# ------------------------------------------------------------------------------ heartbeats


def test_message_reported_lost_is_never_acked():
    client = FakeClient()
    calls = Calls()
    gate = threading.Event()
    a = client.add("jobs", {"proc": 0.01}, estimates={"preprocess": 0, "process": 0.01})
    b = client.add("jobs", {"proc": 0.01})
    pipe = make_pipeline(client, sleeping_handler(calls=calls, gates={a: gate})).start()
    try:
        wait_for(lambda: client.outstanding == 2, what="A processing and B taken")
        client.heartbeat_answer = {"instruction": "continue", "sleep": 0, "extended": [], "lost": [a, b]}
        answer = pipe.heartbeat_once()
        assert answer["lost"] == [a, b]
        held = {h["id"]: h["receipt"] for h in client.heartbeats[-1]["held"]}
        assert set(held) == {a, b} and all(held.values())
        client.heartbeat_answer = {"instruction": "continue", "sleep": 0, "extended": [], "lost": []}
        gate.set()
        c = client.add("jobs", {"proc": 0.01})
        wait_for(lambda: c in client.acked_ids(), what="C acked")
    finally:
        gate.set()
        pipe.stop()
    assert client.acked_ids() == [c]
    assert a not in [v[2] for v in client.visibility]  # not released either: another worker has it
    assert b not in calls.processed  # lost before it started: dropped
    assert {r["message_id"] for r in client.records()} == {a, c}


def test_sleep_instruction_pauses_dequeues():
    client = FakeClient()
    pipe = make_pipeline(client, sleeping_handler(), wait=0.02).start()
    try:
        wait_for(lambda: client.dequeue_count() >= 3, what="idle polling")
        client.heartbeat_answer = {"instruction": "sleep", "sleep": 0.6, "extended": [], "lost": []}
        slept_at = time.time()
        assert pipe.heartbeat_once()["instruction"] == "sleep"
        time.sleep(0.05)  # a poll under way may still end
        n = client.dequeue_count()
        m = client.add("jobs", {"proc": 0.01})
        time.sleep(0.35)
        assert client.dequeue_count() == n, "dequeued while asleep"
        wait_for(lambda: m in client.acked_ids(), timeout=3, what="work after the sleep")
    finally:
        pipe.stop()
    first_after = min(d[0] for d in client.dequeues if d[0] > slept_at + 0.05)
    assert first_after >= slept_at + 0.6 - 0.01


def test_take_instruction_sends_dequeues_to_the_assigned_owners():
    client = FakeClient()
    pipe = make_pipeline(client, sleeping_handler(), wait=0.02).start()
    try:
        wait_for(lambda: client.dequeue_count() >= 2, what="idle polling")
        assert set(client.nodes_asked) == {None}
        client.heartbeat_answer = {
            "instruction": "take",
            "sleep": 0,
            "extended": [],
            "lost": [],
            "take": [
                {"queue": "jobs", "partition": 3, "node": "10.0.0.7:8000"},
                {"queue": "other", "partition": 1, "node": "10.0.0.8:8000"},
            ],
        }
        pipe.heartbeat_once()
        n = len(client.nodes_asked)
        wait_for(lambda: len(client.nodes_asked) >= n + 3, what="polls after the assignment")
    finally:
        pipe.stop()
    # only the handled queue's assignment counts, and its owner is asked first
    assert set(client.nodes_asked[n + 1 :]) == {"10.0.0.7:8000"}


# ------------------------------------------------------------------------------ stopping


def test_stop_finishes_current_gives_back_next_and_flushes_logs():
    client = FakeClient()
    calls = Calls()
    a = client.add("jobs", {"pre": 0.01, "proc": 0.3}, estimates={"preprocess": 0.01, "process": 0.4})
    b = client.add("jobs", {"pre": 0.03, "proc": 0.01}, estimates={"preprocess": 0.03, "process": 0.01})
    c = client.add("jobs", {"proc": 0.01})
    pipe = make_pipeline(client, sleeping_handler(calls=calls)).start()
    wait_for(lambda: client.outstanding == 2, what="A processing and B taken")
    t0 = time.time()
    pipe.stop()
    assert time.time() - t0 >= 0.15  # A was finished, not abandoned
    assert client.acked_ids() == [a]
    assert [(v[2], v[3]) for v in client.visibility] == [(b, 0)]
    assert calls.processed == [a] and b not in calls.preprocessed
    assert [d[4] for d in client.dequeues if d[4]] == [[a], [b]]  # C never taken
    assert not any(s.acked or s.deliveries for s in client.queues["jobs"] if s.message.id == c)
    assert client.outstanding == 0
    recs = client.records()  # sent by stop(): the flusher had not run yet
    assert [(r["message_id"], r["outcome"]) for r in recs] == [(a, "succeeded")]


@pytest.mark.parametrize(
    "error, kept",
    [
        (ApiError(404, "queue_not_found"), False),
        (ApiError(403, "permission_denied"), False),
        (Unavailable(503, "x"), True),
    ],
)
def test_log_records_the_service_refuses_are_dropped_and_outages_retried(error, kept):
    client = FakeClient()
    pipe = make_pipeline(client, sleeping_handler(calls=Calls()))
    pipe._logs.append({"message_id": "q/0/0/0", "attempt": 1, "outcome": "failed"})

    def refuse(records):
        raise error

    client.send_logs = refuse
    pipe._flush_logs()
    # a refusal for good drops the batch (sending it again would only be refused again and hold
    # every later record behind it); an outage keeps it for the next flush
    assert len(pipe._logs) == (1 if kept else 0)


# ------------------------------------------------------------------------------ short tasks


def short_tasks(n: int, group: str | None = None, dequeue_delay: float = 0.005) -> FakeClient:
    """``n`` messages of 1 ms tasks, dequeues taking ``dequeue_delay`` seconds each."""
    client = FakeClient()
    client.dequeue_delay = dequeue_delay
    for i in range(n):
        client.add("jobs", {"proc": 0.001}, group=None if group is None else f"{group}{i % 4}")
    return client


def test_short_tasks_are_received_ahead_and_acked_in_batches():
    # given tasks of 1 ms and dequeue calls of 5 ms, 4 slots
    n, slots = 200, 4
    client = short_tasks(n)
    run_all(client, sleeping_handler(), n, concurrency=slots)
    # then once the times are measured, a call asks for more than one: what the slots process in
    # about one call's time (5 ms / 1 ms, 4 slots: about 20; more as a loaded machine stretches
    # the calls), never more than MAX_AHEAD
    assert 1 < max(client.asked) <= 1 + MAX_AHEAD
    assert len([ids for *_, ids in client.dequeues if ids]) < n / 4
    # every message handled once, delivered once, acked once, in fewer ack calls than messages
    assert sorted(client.acked_ids()) == sorted(s.message.id for s in client.queues["jobs"])
    assert all(s.deliveries == 1 for s in client.queues["jobs"]) and not client.stale_acks
    assert client.ack_calls < n
    # what is held is bounded: per slot its current and next, what waits received ahead, and
    # those processed whose acks are on their way
    assert client.max_outstanding <= 2 * slots + MAX_AHEAD + MAX_ACKS_WAITING


def test_long_tasks_and_grouped_messages_are_taken_one_at_a_time():
    # tasks longer than a call: one message a dequeue (pipelining hides the call)
    client = FakeClient()
    client.dequeue_delay = 0.002
    for _ in range(6):
        client.add("jobs", {"proc": 0.03})
    run_all(client, sleeping_handler(), 6, concurrency=2)
    assert set(client.asked) == {1}
    # grouped messages, however short: never received ahead (a message waiting here holds its group)
    client = short_tasks(60, group="g")
    run_all(client, sleeping_handler(), 60, concurrency=4)
    assert set(client.asked) == {1}


def test_stop_gives_back_what_was_received_ahead():
    # given short tasks received ahead, and a slot stuck on one message
    n = 200
    client = short_tasks(n)
    gate = threading.Event()
    stuck: list[str] = []

    def process(message, prepared):
        if len(client.acks) >= 60 and not stuck:
            stuck.append(message.id)
            gate.wait(10)
        time.sleep(0.001)

    pipe = make_pipeline(client, Handler("jobs", process), concurrency=2).start()
    wait_for(lambda: stuck, what="a slot to hold a message")
    # when the pipeline stops (the stuck one finishes meanwhile)
    threading.Timer(0.2, gate.set).start()
    pipe.stop()
    # then nothing is left held: every message delivered was acked or given back (visibility 0)
    assert client.outstanding == 0
    given_back = [v for v in client.visibility if v[3] == 0]
    assert len(client.acked_ids()) + len(given_back) == sum(s.deliveries for s in client.queues["jobs"])
    assert not set(client.acked_ids()) & {v[2] for v in given_back}


def test_what_a_worker_holds_fits_in_one_heartbeat():
    # given a worker that may list at most 20 messages in a heartbeat (the service's
    # WORKER_MAX_HELD), 4 slots, and short tasks of two queues
    max_held, slots, n = 20, 4, 300
    client = short_tasks(n // 2)
    for _ in range(n // 2):
        client.add("other", {"proc": 0.001})
    handlers = {"jobs": sleeping_handler(), "other": sleeping_handler("other")}
    pipe = Pipeline(client, handlers, concurrency=slots, wait=0.05, heartbeat_every=3600, max_held=max_held)
    # then what is received ahead (of both queues together) has half of what the slots leave
    assert pipe.max_ahead == (max_held - 2 * slots) // 2
    pipe.start()
    try:
        peak = 0
        while len(client.acks) < n:
            beat = pipe.heartbeat_once()
            assert beat is not None
            peak = max(peak, len(client.heartbeats[-1]["held"]))
            time.sleep(0.002)
    finally:
        pipe.stop()
    # when it has handled them all, it never held more than one heartbeat may list, and did
    # receive ahead
    assert client.max_outstanding <= max_held and peak <= max_held
    assert max(client.asked) > 1
    assert sorted(client.acked_ids()) == sorted(s.message.id for q in client.queues.values() for s in q)


def test_a_worker_of_more_slots_than_a_heartbeat_lists_is_refused():
    with pytest.raises(ValueError, match="WORKER_MAX_HELD"):
        Pipeline(FakeClient(), {"jobs": sleeping_handler()}, concurrency=501)
    small = Pipeline(FakeClient(), {"jobs": sleeping_handler()}, concurrency=500)
    assert not small.receive_ahead and small._acker is None  # (nothing left beside the slots')
