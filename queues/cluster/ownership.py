"""Ownership events: a node process tells an observer when it starts and stops acting as the
owner of a partition.

Off unless ``OWNERSHIP_EVENTS`` names the path of a UNIX datagram socket that an observer has
bound (the nemesis run, which checks that no two processes serve one partition at overlapping
times). Then the node runtime (``queues.cluster.node``) sends one JSON datagram per event::

    {"event": "serve" | "renew" | "unserve", "node": "<node id>", "address": "<host:port it serves>",
     "pid": <process id>, "partition": "<queue>/<index>", "epoch": <lease epoch>, "ago": <seconds>,
     "until": <seconds>, "seq": <n>}

``seq`` numbers the process's datagrams 1, 2, ...: a gap tells the observer one was dropped.

- ``serve``: sent once the lease is won and before anything is done as owner (before the fence
  is raised), with ``ago`` 0; sent again when the epoch moves on during the open (a fence ahead
  of the row), and when a lease that had lapsed (reported ``unserve``) is renewed under the same
  epoch and the partition is served on.
- ``renew``: the lease was renewed while served. ``serve`` and ``renew`` carry ``until``: the
  seconds, by the node's monotonic clock, the process may act as owner from then on at most
  (its lease's ``valid_until``): it acts no longer than that unless a later ``renew`` says so,
  even when it can report nothing more (a process frozen while its server stops it).
- ``unserve``: sent once per stretch of serving, when the process stops acting as owner: its
  manager closed for whatever reason, or its lease lapsed (found by :meth:`OwnershipEvents.sweep`
  every :data:`SWEEP_EVERY` and at each renewal look). ``ago`` is how long before the datagram, by the node's own monotonic
  clock, it really stopped: a lease that lapsed stopped at its ``valid_until`` however late that
  was noticed (a process woken from SIGSTOP; a thread of its own looks every
  :data:`SWEEP_EVERY`, whatever the database does); a manager closed while
  its lease was valid stopped when it was closed (0).

The observer stamps each datagram with its own clock on receipt and subtracts ``ago``: a node's
wall clock is never trusted (it may be set minutes off).

A send blocks for at most :data:`SEND_TIMEOUT` (an observer that reads too slowly), then a
warning is logged and the node goes on: the events serve a test, never the service. An observer
that is not there (no socket at the path, or nobody reading it) is warned about once, until a
send goes through again.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from dataclasses import dataclass

import orjson

from queues.cluster.leases import Lease

log = logging.getLogger("queues.ownership")

#: Seconds a datagram's send may wait for room in the observer's socket.
SEND_TIMEOUT = 1.0
#: Seconds between two looks for leases that lapsed (:meth:`OwnershipEvents.sweep`).
SWEEP_EVERY = 0.05


@dataclass
class _Served:
    """A lease announced as served."""

    lease: Lease
    #: the epoch announced.
    epoch: int
    #: the latest ``lease.valid_until`` noted (at the announcement, renewals, sweeps): when it
    #: ends, should it be given up or found lost (``valid_until`` 0 then) unnoticed.
    until: float


class OwnershipEvents:
    """Sends this node process's ``serve`` and ``unserve`` events to the socket at ``path``.

    It remembers which leases it announced as served (by partition, the lease object itself:
    each claim makes a new one), so each stretch of serving is reported stopped once, however
    often its manager is closed, and :meth:`sweep` finds the ones that lapsed. Thread-safe: the
    housekeeping thread, the lease thread and request threads (a manager that closes itself)
    report."""

    def __init__(self, path: str, node_id: str, address: str):
        self.path = path
        self.node_id = node_id
        self.address = address
        self.pid = os.getpid()
        #: numbers this process's datagrams, so that the observer sees one that was dropped
        self._seq = itertools.count(1)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.settimeout(SEND_TIMEOUT)
        self._lock = threading.Lock()
        #: partition id -> what was announced served there.
        self._serving: dict[int, _Served] = {}
        self._missing = False  # the observer was found gone (warned once)
        # A lapse is found by a thread of its own, which makes no database call: the node's
        # housekeeping and lease threads can each wait out a database's timeout (a node cut
        # from it, a restart), and a process stopped meanwhile (SIGKILL after a stop that
        # hung) would never report a stop it made at its lease's end.
        self._closed = threading.Event()
        threading.Thread(target=self._sweep_often, name="ownership-sweep", daemon=True).start()

    def serve(self, lease: Lease) -> None:
        """The process starts (or goes on, under a new epoch or after a lapse) acting as the
        owner of ``lease``'s partition: call before it acts."""
        with self._lock:
            self._serving[lease.partition_id] = _Served(lease, lease.epoch, lease.valid_until)
        self._send("serve", lease, lease.epoch, 0.0, lease.valid_until - lease.clock.monotonic())

    def serving(self, lease: Lease) -> bool:
        """Whether ``lease`` is announced as served (and not reported stopped since)."""
        entry = self._serving.get(lease.partition_id)
        return entry is not None and entry.lease is lease

    def renewed(self, lease: Lease) -> None:
        """``lease`` was renewed (by the caller, just now): its new end is noted, and if it had
        lapsed (reported stopped) and is valid again, it is served again (:meth:`serve`)."""
        with self._lock:
            entry = self._serving.get(lease.partition_id)
            if entry is not None and entry.lease is lease:
                entry.until = max(entry.until, lease.valid_until)
                renewed = True
            else:
                renewed = False
        if renewed:
            self._send("renew", lease, lease.epoch, 0.0, lease.valid_until - lease.clock.monotonic())
        elif lease.valid():
            self.serve(lease)

    def unserve(self, lease: Lease) -> None:
        """The process stopped acting as the owner of ``lease``'s partition (call after it
        stopped): reported once, with the epoch announced, dated by the lease's end if that came
        first. Nothing if ``lease`` is not the one announced (reported already, or never)."""
        now = lease.clock.monotonic()
        with self._lock:
            entry = self._serving.get(lease.partition_id)
            if entry is None or entry.lease is not lease:
                return
            del self._serving[lease.partition_id]
        # A lease given up or found lost has valid_until 0 (leases.release, renew_many): its end
        # is then the last one noted here (at the open, each renewal and each sweep, which runs
        # before every renewal): a process paused after a sweep and woken to find its lease
        # lost stopped when that lease ran out, during the pause. A manager closed while its
        # lease was valid stopped now (ago 0). That is conservative: the process may have
        # stopped acting a moment earlier, never later, so the stretch reported covers the
        # real one.
        until = lease.valid_until if lease.valid_until > 0 else entry.until
        self._send("unserve", lease, entry.epoch, now - min(now, until))

    def sweep(self) -> None:
        """Report the leases announced as served that have lapsed (``not lease.valid()``): the
        process stopped acting as their owner at their ``valid_until`` (``check_serving``
        refuses every call from then on), even if its managers are still open and may renew
        them (then :meth:`serve` is sent again)."""
        lapsed = []
        with self._lock:
            for entry in self._serving.values():
                if entry.lease.valid():
                    entry.until = max(entry.until, entry.lease.valid_until)
                else:
                    lapsed.append(entry.lease)
        for lease in lapsed:
            self.unserve(lease)

    def _sweep_often(self) -> None:
        while not self._closed.wait(SWEEP_EVERY):
            try:
                self.sweep()
            except Exception:  # the events serve a test, never the service
                log.exception("ownership events: sweep failed")

    def close(self) -> None:
        self._closed.set()
        self._sock.close()

    def _send(self, event: str, lease: Lease, epoch: int, ago: float, until: float | None = None) -> None:
        partition = f"{lease.queue}/{lease.index}"
        log.debug("%s %s epoch %s (%.3f s ago)", event, partition, epoch, ago)
        message = {
            "event": event,
            "node": self.node_id,
            "address": self.address,
            "pid": self.pid,
            "partition": partition,
            "epoch": epoch,
            "ago": ago,
            "seq": next(self._seq),
        }
        if until is not None:
            message["until"] = max(until, 0.0)
        datagram = orjson.dumps(message)
        try:
            self._sock.sendto(datagram, self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if not self._missing:
                self._missing = True
                log.warning("ownership events: no observer at %s (%s): events are dropped", self.path, exc)
            return
        except TimeoutError:
            log.warning(
                "ownership events: %s did not take %s of %s in %s s: dropped", self.path, event, partition, SEND_TIMEOUT
            )
            return
        except OSError as exc:
            log.warning("ownership events: %s of %s not sent to %s: %s", event, partition, self.path, exc)
            return
        if self._missing:
            self._missing = False
            log.warning("ownership events: the observer at %s is back", self.path)


def events_to(path: str, node_id: str, address: str) -> OwnershipEvents | None:
    """The events of a node process to the socket at ``path`` (``OWNERSHIP_EVENTS``); None
    when ``path`` is empty (off)."""
    return OwnershipEvents(path, node_id, address) if path else None
