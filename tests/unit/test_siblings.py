"""The board the processes of one runnode share (queues.cluster.siblings): two boards in one
folder, as two processes would keep them."""

from __future__ import annotations

import threading
import time

import pytest

from queues.cluster import siblings
from queues.cluster.siblings import Board


@pytest.fixture
def pair(tmp_path):
    """Boards of two "processes" (pids 101 and 102), each listed with its address."""
    woken = {101: threading.Event(), 102: threading.Event()}
    boards = {}
    for pid in (101, 102):
        (tmp_path / str(pid)).write_text(f"127.0.0.1:{pid}")
        boards[pid] = Board(tmp_path, woken[pid].set, pid=pid)
    # the pids are not running processes: let the listing take them as live
    real_kill = siblings.os.kill

    def kill(pid, sig):
        if pid in boards:
            return
        real_kill(pid, sig)

    siblings.os.kill = kill
    try:
        yield boards, woken
    finally:
        siblings.os.kill = real_kill
        for b in boards.values():
            b.close()


def test_a_sibling_sees_what_the_other_holds_and_nothing_once_it_is_taken(pair):
    boards, _ = pair
    a, b = boards[101], boards[102]
    assert a.holders("orders") == []
    since = time.time() - 3
    b.publish("orders", since, None)
    assert a.holders("orders") == [(since, "127.0.0.1:102")]
    assert b.holders("orders") == []  # (its own slot is not a sibling's)
    b.publish("orders", None, None)
    assert a.holders("orders") == []


def test_targets_are_apart_and_a_message_come_due_counts_as_waiting(pair):
    boards, _ = pair
    a, b = boards[101], boards[102]
    now = time.monotonic()
    b.publish("t/s1", None, now - 0.5)  # came due half a second ago
    b.publish("t/s2", None, now + 60)  # due in a minute: nothing to deliver now
    ((oldest, address),) = a.holders("t/s1", now)
    assert address == "127.0.0.1:102" and time.time() - oldest == pytest.approx(0.5, abs=0.2)
    assert a.holders("t/s2", now) == []
    assert a.next_due("t/s2") == pytest.approx(now + 60)
    assert a.holders("t") == []


def test_a_slot_written_for_another_target_is_a_maybe(pair):
    boards, _ = pair
    a, b = boards[101], boards[102]
    names = {}
    for i in range(200_000):  # two names in one slot
        index, _ = siblings.slot_of(f"q{i}")
        if index in names:
            first, second = names[index], f"q{i}"
            break
        names[index] = f"q{i}"
    b.publish(first, time.time() - 1, None)
    assert [addr for _, addr in a.holders(second)] == ["127.0.0.1:102"]


def test_a_long_poll_is_woken_when_a_sibling_gets_a_message_for_it(pair):
    boards, woken = pair
    a, b = boards[101], boards[102]
    b.publish("orders", time.time(), None)
    assert not woken[101].wait(0.3)  # nobody waits: no wake-up sent
    with a.waiting("orders"):
        b.publish("orders", time.time(), None)
        assert woken[101].wait(5)
        woken[101].clear()
        b.publish("other", time.time(), None)  # a target it does not wait for
        assert not woken[101].wait(0.3)
    b.publish("orders", time.time(), None)  # the wait ended: the count went back to 0
    assert not woken[101].wait(0.3)


def test_a_siblings_access_changes_are_seen_at_once(pair):
    boards, _ = pair
    assert boards[101].siblings_changes() == 0 == boards[102].siblings_changes()
    boards[102].count_changes(3)
    assert boards[101].siblings_changes() == 3
    assert boards[102].siblings_changes() == 0  # its own count is not its siblings'


def test_an_access_change_moves_the_generation_once_it_commits(monkeypatch):
    """``changes.changed`` counts on commit and writes the count where the siblings read it."""
    from queues.access import changes

    written = []
    siblings = {"count": 0}
    monkeypatch.setattr(changes, "_made", 0)
    monkeypatch.setattr(changes, "_publish", None)
    monkeypatch.setattr(changes, "_siblings", None)
    changes.attach(written.append, lambda: siblings["count"])
    assert written == [0] and changes.generation() == 0
    pending = []
    monkeypatch.setattr(changes.transaction, "on_commit", pending.append)
    changes.changed()
    assert changes.generation() == 0  # not before the commit
    pending.pop()()
    assert changes.generation() == 1 and written == [0, 1]
    siblings["count"] = 5  # a sibling's change
    assert changes.generation() == 6


def test_a_sibling_that_ends_keeps_its_changes_in_the_sum(pair, tmp_path):
    """The sum never goes back: a cache kept under an earlier sum is never trusted again."""
    boards, _ = pair
    boards[102].count_changes(4)
    assert boards[101].siblings_changes() == 4
    boards[102].close()
    (tmp_path / "102").unlink()
    boards[101]._scanned_at = float("-inf")  # look at the folder again now
    assert boards[101].siblings() == []
    assert boards[101].siblings_changes() == 4
