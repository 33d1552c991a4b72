"""The nemesis run's receiver of the nodes' ownership reports (``nemesis.run.Owners``): a
report read after its node was ended, from a process that is dead, ends at the node's end; one
from a live process stays open until its node ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import orjson

from nemesis.history import Recorder, read
from nemesis.run import Owners


def _owners(tmp_path, pid: int) -> tuple[Owners, Recorder]:
    recorder = Recorder(tmp_path / "history.jsonl")
    owners = Owners(tmp_path / "owners.sock", recorder, {os.getpgid(pid): "n1"}, {})
    owners.names[pid] = f"n1/{pid}"
    owners.start()
    return owners, recorder


def _report(tmp_path, pid: int, event: str, partition: str, epoch: int, ago: float = 0.0, **more) -> None:
    """A node's report, of what happened ``ago`` seconds before it was sent."""
    datagram = {
        "pid": pid,
        "event": event,
        "partition": partition,
        "epoch": epoch,
        "address": "127.0.0.1:1",
        "ago": ago,
        **more,
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(orjson.dumps(datagram), str(tmp_path / "owners.sock"))


def _events(tmp_path, owners: Owners, recorder: Recorder, count: int) -> list[tuple[str, str, int]]:
    deadline = time.monotonic() + 5
    while owners.count < count and time.monotonic() < deadline:
        time.sleep(0.01)
    owners.close()
    recorder.close()
    return [(e.node, e.event, e.time) for e in read(tmp_path / "history.jsonl").nodes]


def test_a_dead_process_s_report_read_after_its_node_ended_ends_there(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that reported, then died with its node
    owners, recorder = _owners(tmp_path, os.getpid())
    owners.names[child.pid] = f"n1/{child.pid}"
    owners.ended("n1")
    ended = owners.ended_at["n1"]
    _report(tmp_path, child.pid, "serve", "q/0", 3, ago=1.0)  # it served before the end
    events = _events(tmp_path, owners, recorder, 1)
    assert [(n, e) for n, e, _ in events] == [(f"n1/{child.pid}", "serve"), (f"n1/{child.pid}", "unserve")]
    assert events[1][2] == ended and not owners.open


def test_a_live_process_s_report_stays_open_until_its_node_ends(tmp_path):
    pid = os.getpid()
    owners, recorder = _owners(tmp_path, pid)
    owners.ended("n1")  # an earlier end of the node, before this process served
    time.sleep(0.01)
    _report(tmp_path, pid, "serve", "q/0", 3)
    deadline = time.monotonic() + 5
    while owners.count < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert owners.open == {(f"n1/{pid}", "q/0"): 3}
    owners.ended("n1")
    events = _events(tmp_path, owners, recorder, 1)
    assert [e for _, e, _ in events] == ["serve", "unserve"]


def test_a_dropped_report_unbounds_what_the_process_serves(tmp_path):
    pid = os.getpid()
    owners, recorder = _owners(tmp_path, pid)
    _report(tmp_path, pid, "serve", "q/0", 3, seq=1, until=2.0)
    _report(tmp_path, pid, "renew", "q/0", 3, seq=3, until=2.0)  # number 2 was dropped
    events = _events(tmp_path, owners, recorder, 2)
    read_back = read(tmp_path / "history.jsonl").nodes
    assert [(e.event, e.until is None) for e in read_back] == [("serve", False), ("renew", True), ("renew", False)]
    assert len(events) == 3
