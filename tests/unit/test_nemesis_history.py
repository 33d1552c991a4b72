"""The nemesis history (nemesis/history.py): the recorder writes whole lines from any number of
threads, the reader gives back what was written and refuses what is not a history, and each call
is paired with its completion as Jepsen pairs them."""

from __future__ import annotations

import json
import threading

import pytest

from nemesis.history import FaultEvent, History, HistoryError, NodeEvent, Op, Recorder, from_json, read, to_json


def test_records_go_to_json_without_their_empty_fields_and_come_back():
    # given
    records = [
        Op(process=3, type="invoke", f="enqueue", time=5, queue="q", group="g", value="m1"),
        Op(process=3, type="ok", f="enqueue", time=9, ids=["q/0/b/0"], status=201, node="n1", partition="q/0", epoch=2),
        NodeEvent(node="n1", event="serve", partition="q/0", epoch=2, time=1),
        FaultEvent(fault="kill", event="start", time=2, target="n2"),
    ]
    # when
    lines = [to_json(r) for r in records]
    # then
    assert lines[0] == {
        "process": 3,
        "type": "invoke",
        "f": "enqueue",
        "time": 5,
        "queue": "q",
        "group": "g",
        "value": "m1",
    }
    assert [from_json(json.loads(json.dumps(line))) for line in lines] == records


@pytest.mark.parametrize(
    "line",
    [
        {"process": 1, "type": "done", "f": "enqueue", "time": 1},  # no such type
        {"process": 1, "type": "ok", "time": 1},  # no f
        {"process": 1, "type": "ok", "f": "ack", "time": 1, "colour": "red"},  # unknown key
        {"node": "n1", "event": "leave", "partition": "q/0", "epoch": 1, "time": 1},
        {"fault": "kill", "event": "start"},  # no time
        {"hello": "world"},
    ],
)
def test_a_line_that_is_no_record_is_refused(line):
    with pytest.raises(HistoryError):
        from_json(line)


def test_the_recorder_writes_whole_lines_from_many_threads_and_the_reader_gets_them_all(tmp_path):
    # given: 8 client threads, each its own process, and a nemesis thread, on one recorder
    path = tmp_path / "history.jsonl"
    calls = 300
    with Recorder(path) as recorder:

        def client(process: int) -> None:
            for i in range(calls):
                op = recorder.invoke(process, "enqueue", queue="q", value=f"{process}:{i}:" + "x" * 200)
                recorder.complete(op, "ok", ids=[f"q/0/{process}/{i}"], status=201)

        def nemesis() -> None:
            for _ in range(calls):
                recorder.fault("pause", "start", "n1")
                recorder.fault("pause", "stop", "n1")

        threads = [threading.Thread(target=client, args=(p,)) for p in range(8)]
        threads.append(threading.Thread(target=nemesis))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # when
    history = read(path)
    # then: every line whole, every call paired with its own completion, in order of start
    assert len(path.read_text().splitlines()) == 8 * calls * 2 + calls * 2
    operations = history.operations()
    assert len(operations) == 8 * calls and {o.type for o in operations} == {"ok"}
    assert all(o.ids == ["q/0/{}/{}".format(*o.value.split(":")[:2])] for o in operations)
    assert [o.invoked for o in operations] == sorted(o.invoked for o in operations)
    assert all(o.completed is not None and o.completed >= o.invoked for o in operations)
    assert len(history.faults) == 2 * calls


def test_the_reader_drops_a_last_line_cut_short_and_refuses_a_bad_line_elsewhere(tmp_path):
    # given: a writer killed in the middle of its last line
    good = json.dumps({"process": 1, "type": "invoke", "f": "dequeue", "time": 1, "queue": "q"})
    path = tmp_path / "history.jsonl"
    path.write_text(good + "\n" + good[:20])
    # when / then: the whole lines are read, the call left open counts as unknown
    (operation,) = read(path).operations()
    assert (operation.type, operation.completed) == ("info", None)
    # given: the same cut in the middle of the file
    path.write_text(good[:20] + "\n" + good + "\n")
    with pytest.raises(HistoryError, match=r"history.jsonl:1: not JSON"):
        read(path)
    path.write_text(good + "\n" + json.dumps({"node": "n1"}) + "\n")
    with pytest.raises(HistoryError, match=r"history.jsonl:2: "):
        read(path)


def _ops(*lines: dict) -> History:
    return History.of(from_json(line) for line in lines)


def test_a_completion_adds_what_it_learnt_to_what_the_call_said():
    history = _ops(
        {
            "process": "c1",
            "type": "invoke",
            "f": "enqueue",
            "time": 10,
            "queue": "q",
            "value": ["a", "b"],
            "group": "g",
        },
        {"process": "c2", "type": "invoke", "f": "dequeue", "time": 11, "queue": "q"},
        {"process": "c1", "type": "ok", "f": "enqueue", "time": 15, "ids": ["q/0/b/0", "q/0/b/1"], "status": 201},
        {"process": "c2", "type": "info", "f": "dequeue", "time": 40, "error": "timeout"},
    )
    enqueue, dequeue = history.operations()
    assert (enqueue.type, enqueue.invoked, enqueue.completed) == ("ok", 10, 15)
    assert (enqueue.queue, enqueue.group, enqueue.tokens, enqueue.ids, enqueue.status) == (
        "q",
        "g",
        ["a", "b"],
        ["q/0/b/0", "q/0/b/1"],
        201,
    )
    assert enqueue.streams == ["q"]
    assert (dequeue.type, dequeue.completed, dequeue.queue, dequeue.error) == ("info", 40, "q", "timeout")


@pytest.mark.parametrize(
    "lines",
    [
        # a completion with no call open
        [{"process": 1, "type": "ok", "f": "ack", "time": 1}],
        # a second call while the first is open (after an unknown outcome, Jepsen's client takes
        # a new process number; here the unknown is written, so the process is free again)
        [
            {"process": 1, "type": "invoke", "f": "ack", "time": 1},
            {"process": 1, "type": "invoke", "f": "ack", "time": 2},
        ],
        # a completion of another function
        [
            {"process": 1, "type": "invoke", "f": "ack", "time": 1},
            {"process": 1, "type": "ok", "f": "dequeue", "time": 2},
        ],
    ],
)
def test_a_history_whose_calls_do_not_pair_is_refused(lines):
    with pytest.raises(HistoryError):
        _ops(*lines).operations()


def test_a_process_calls_again_after_an_unknown_outcome_is_written():
    history = _ops(
        {"process": 1, "type": "invoke", "f": "ack", "time": 1},
        {"process": 1, "type": "info", "f": "ack", "time": 2},
        {"process": 1, "type": "invoke", "f": "ack", "time": 3},
        {"process": 1, "type": "fail", "f": "ack", "time": 4, "status": 404},
    )
    assert [(o.type, o.invoked, o.completed) for o in history.operations()] == [("info", 1, 2), ("fail", 3, 4)]
    assert (history.start, history.end) == (1, 4)
