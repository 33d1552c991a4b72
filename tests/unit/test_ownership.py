"""Ownership events (``queues.cluster.ownership``) and the record of who served a call
(``queues.service.served``, ``X-MQ-Served-By``): what is sent, once, and nothing when off."""

from __future__ import annotations

import logging
import socket
import tempfile
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from queues.api.peers import _served_by_line
from queues.cluster import ownership
from queues.cluster.leases import Clock, Lease
from queues.engine.body_cache import BodyCache
from queues.engine.partition import PartitionManager
from queues.engine.ports import BoundRow
from queues.http import served_header
from queues.kv.memory import MemoryStore
from queues.service import served
from tests.stand_ins import Ticks


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def datagrams():
    """A bound UNIX datagram socket (a short path: AF_UNIX allows about 100 bytes) and what
    arrives there."""
    folder = Path(tempfile.mkdtemp(prefix="own-", dir="/tmp"))
    path = folder / "events.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.5)

    def received() -> list[dict]:
        out = []
        try:
            while True:
                out.append(orjson.loads(sock.recv(65536)))
        except TimeoutError:
            return out

    yield SimpleNamespace(path=str(path), sock=sock, received=received)
    sock.close()
    path.unlink(missing_ok=True)
    folder.rmdir()


def _lease(ticks: Ticks, partition_id: int = 7, epoch: int = 3, index: int = 1) -> Lease:
    return Lease(
        partition_id, "orders", index, epoch, "nonce", 2.0, ticks.now + 1.6, "", renewed_at=ticks.now,
        clock=Clock(monotonic=ticks),
    )  # fmt: skip


def test_serve_then_unserve_once_with_the_node_and_epoch(datagrams, ticks):
    # given a node's events to the datagrams's socket
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    lease = _lease(ticks)
    # when it serves, then stops while its lease is valid, and is closed a second time
    events.serve(lease)
    ticks.now += 0.5
    events.unserve(lease)
    events.unserve(lease)
    # then one serve and one unserve arrive, the stop dated now (ago 0)
    got = datagrams.received()
    common = {"node": "node-1", "address": "127.0.0.1:4000", "partition": "orders/1", "epoch": 3}
    assert [{k: e[k] for k in (*common, "event", "ago")} for e in got] == [
        {**common, "event": "serve", "ago": 0.0},
        {**common, "event": "unserve", "ago": 0.0},
    ]
    assert all(isinstance(e["pid"], int) for e in got)


def test_a_lapsed_lease_is_reported_by_the_sweep_dated_when_it_lapsed(datagrams, ticks):
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    lapsing, kept = _lease(ticks, partition_id=1), _lease(ticks, partition_id=2, index=2)
    kept.valid_until = ticks.now + 60
    events.serve(lapsing)
    events.serve(kept)
    datagrams.received()
    # when the clock passes the first lease's end by 4.4 s (a pause) before a sweep
    ticks.now = lapsing.valid_until + 4.4
    events.sweep()
    events.sweep()
    # then only that one is reported, once, stopped 4.4 s ago
    (got,) = datagrams.received()
    assert got["event"] == "unserve" and got["partition"] == "orders/1"
    assert got["ago"] == pytest.approx(4.4)
    assert not events.serving(lapsing) and events.serving(kept)
    # and a close of its manager afterwards reports nothing more
    events.unserve(lapsing)
    assert datagrams.received() == []
    # when the lease is renewed under the same epoch, serve is sent again
    lapsing.valid_until = ticks.now + 1.6
    events.serve(lapsing)
    assert [e["event"] for e in datagrams.received()] == ["serve"]


def test_a_lost_lease_is_dated_now(datagrams, ticks):
    # (leases.renew_many and leases.release set valid_until to 0: when it ended is unknown)
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    lease = _lease(ticks)
    events.serve(lease)
    lease.valid_until = 0.0
    events.unserve(lease)
    assert [(e["event"], e["ago"]) for e in datagrams.received()] == [("serve", 0.0), ("unserve", 0.0)]


def test_a_lease_found_lost_after_a_pause_is_dated_when_it_ran_out(datagrams, ticks):
    # given a lease looked at by a sweep, then a pause past its end before the renewal that
    # finds it lost (leases.renew_many sets valid_until to 0)
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    lease = _lease(ticks)
    events.serve(lease)
    ticks.now += 1.0
    lease.valid_until = ticks.now + 1.6  # (renewed)
    events.renewed(lease)
    events.sweep()
    end = lease.valid_until
    ticks.now = end + 2.5
    lease.valid_until = 0.0
    events.unserve(lease)
    # then the renewal said how long it may act (1.6 s), and its stop is dated when it ran
    # out, not when the loss was found
    got = datagrams.received()
    assert [(e["event"], e["ago"]) for e in got] == [("serve", 0.0), ("renew", 0.0), ("unserve", 2.5)]
    assert got[1]["until"] == pytest.approx(1.6) and "until" not in got[2]


def test_serve_and_renew_say_how_long_the_process_may_act(datagrams, ticks):
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    lease = _lease(ticks)
    lease.valid_until = ticks.now + 2.4
    events.serve(lease)
    ticks.now += 1.0
    lease.valid_until = ticks.now + 2.4
    events.renewed(lease)
    got = datagrams.received()
    assert [(e["event"], round(e["until"], 6)) for e in got] == [("serve", 2.4), ("renew", 2.4)]


def test_an_older_lease_of_the_partition_does_not_end_the_newer_one(datagrams, ticks):
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    old, new = _lease(ticks, epoch=3), _lease(ticks, epoch=4)
    events.serve(old)
    events.unserve(old)
    events.serve(new)
    events.unserve(old)  # (closed twice: the second time after the new claim)
    assert [(e["event"], e["epoch"]) for e in datagrams.received()] == [("serve", 3), ("unserve", 3), ("serve", 4)]
    assert events.serving(new)


def test_no_observer_is_warned_about_once_and_the_node_goes_on(ticks, caplog, tmp_path):
    events = ownership.OwnershipEvents(str(tmp_path / "nobody.sock"), "node-1", "127.0.0.1:4000")
    with caplog.at_level(logging.WARNING, logger="queues.ownership"):
        for i in range(3):
            events.serve(_lease(ticks, partition_id=i))
    assert len([r for r in caplog.records if "no observer" in r.getMessage()]) == 1


def test_an_observer_that_does_not_read_costs_a_send_timeout_then_a_warning(datagrams, ticks, monkeypatch, caplog):
    # given a node whose sends wait at most 50 ms, and an observer that reads nothing
    monkeypatch.setattr(ownership, "SEND_TIMEOUT", 0.05)
    events = ownership.OwnershipEvents(datagrams.path, "node-1", "127.0.0.1:4000")
    lease = _lease(ticks)
    # when its socket's queue fills up
    with caplog.at_level(logging.WARNING, logger="queues.ownership"):
        for _ in range(5000):
            events.serve(lease)
            if caplog.records:
                break
    # then a send gives up with a warning, and nothing is raised
    assert any("did not take" in r.getMessage() for r in caplog.records)


def test_off_without_a_path():
    assert ownership.events_to("", "node-1", "127.0.0.1:4000") is None


def _manager(ticks: Ticks, closes: list[str]) -> PartitionManager[Lease]:
    lease = _lease(ticks)
    return PartitionManager(
        lease,
        block_size=8,
        store=MemoryStore(),
        node_id="node-1",
        cache=BodyCache(1 << 20),
        row=BoundRow(lease, "node-1", lambda _: None, lambda *_: None, lambda *_: None),
        on_close=lambda: closes.append("closed"),
    )


def test_a_manager_calls_on_close_once(ticks):
    closes: list[str] = []
    m = _manager(ticks, closes)
    assert not m.closed
    m.close()
    m.close()
    assert m.closed and closes == ["closed"]


def test_a_call_records_each_manager_once_in_order(settings, ticks):
    settings.SERVED_BY_HEADER = True
    a, b = _manager(ticks, []), _manager(ticks, [])
    b.index, b.lease.epoch = 2, 9
    token = served.begin()
    served.record(a)
    served.record(b)
    served.record(a)
    served.extend(["node-2:orders/0:5", "node-1:orders/1:3"])
    assert served.end(token) == ["node-1:orders/1:3", "node-1:orders/2:9", "node-2:orders/0:5"]
    assert not served.active()  # (closed: a request thread's next call starts with none)


def test_nothing_is_recorded_when_off(settings, ticks):
    settings.SERVED_BY_HEADER = False
    token = served.begin()
    assert token is None and not served.active()
    served.record(_manager(ticks, []))
    assert served.end(token) == []
    assert served_header.header_items([]) == []


def test_the_header_of_a_peer_answer_is_read_back():
    found: list[bytes] = []
    for line in (b"HTTP/1.1 201 Created\r\n", b"x-mq-served-by: n1:q/0:4, n1:q/1:2\r\n", b"Content-Length: 3\r\n"):
        _served_by_line(found, line)
    assert [served_header.parse(v.decode()) for v in found] == [["n1:q/0:4", "n1:q/1:2"]]
    ((name, value),) = served_header.header_items(["n1:q/0:4", "n1:q/1:2"])
    assert (name, served_header.parse(value)) == ("X-MQ-Served-By", ["n1:q/0:4", "n1:q/1:2"])


def _epochs(q: str) -> dict[str, int]:
    from queues.models import Partition

    return {f"{q}/{i}": e for i, e in Partition.objects.filter(queue__name=q).values_list("index", "epoch")}


def test_the_node_reports_opens_closes_lapses_and_renewals(runtime, make_queue, purge_kv, datagrams):
    # given a node that reports to the datagrams (what OWNERSHIP_EVENTS sets up at its start)
    runtime.ownership = ownership.OwnershipEvents(datagrams.path, runtime.node_id, runtime.address)
    q = make_queue(partitions=2)
    runtime.tick()
    # then it reported serving each partition, under the row's epoch
    assert sorted((e["event"], e["partition"], e["epoch"]) for e in datagrams.received()) == sorted(
        ("serve", p, epoch) for p, epoch in _epochs(q).items()
    )

    # when a manager closes itself (a failure that left memory and store apart)
    first = runtime.manager(q, 0)
    with first.lock:
        first.close()
    # then that is reported at once, and its reopening under a newer epoch at the next passes
    assert [(e["event"], e["partition"], e["ago"]) for e in datagrams.received()] == [("unserve", f"{q}/0", 0.0)]
    runtime.tick()  # (the renewal hands the lease back)
    runtime.tick()  # (the claim takes it again)
    (again,) = datagrams.received()
    assert (again["event"], again["partition"], again["epoch"]) == ("serve", f"{q}/0", _epochs(q)[f"{q}/0"])
    assert again["epoch"] > first.lease.epoch

    # when the other's lease lapsed 3 s ago unnoticed (a pause), and is renewed under its epoch
    second = runtime.manager(q, 1)
    second.lease.valid_until = second.lease.clock.monotonic() - 3.0
    second.lease.renewed_at -= second.lease.period
    runtime.renew()
    # then the node reported it stopped when it lapsed, then serving again under the same epoch
    stop, serve = datagrams.received()
    assert (stop["event"], stop["partition"], stop["epoch"]) == ("unserve", f"{q}/1", second.lease.epoch)
    assert stop["ago"] == pytest.approx(3.0, abs=0.5)
    assert (serve["event"], serve["partition"], serve["epoch"], serve["ago"]) == (
        "serve",
        f"{q}/1",
        second.lease.epoch,
        0.0,
    )
    assert runtime.manager(q, 1) is second

    # when an operator releases a partition
    assert runtime.release_partition(q, 1)
    # then it is reported stopped, once
    assert [(e["event"], e["partition"]) for e in datagrams.received()] == [("unserve", f"{q}/1")]
