"""The node runtime: one per server process.

It registers the node, holds the partition managers of the partitions this node leases, and
runs the housekeeping pass (heartbeat, queue refresh, lease renewal, claims, published
figures) every ``NODE_HEARTBEAT`` seconds on a thread of its own. Request threads call
:mod:`queues.service`, which calls the runtime. In unit and API tests the runtime runs without
its thread and the test calls :meth:`NodeRuntime.tick`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    models,
)
from django.utils import timezone

from queues import metrics
from queues.cluster import catalog, clock, leases, ownership
from queues.cluster.hooks import ARCHIVE
from queues.cluster.router import Router
from queues.engine import keys
from queues.engine.body_cache import BodyCache
from queues.engine.config import QueueConfig
from queues.engine.partition import PartitionManager, PartitionUnavailable
from queues.engine.ports import BoundRow
from queues.errors import QueueNotFound
from queues.kv import KeyValueStore, KVError, get_store
from queues.models import Node, Partition, Queue, RateSample

if TYPE_CHECKING:
    from queues.cluster.siblings import Board

log = logging.getLogger(__name__)
monotonic = time.monotonic
#: the wall clock the rate history's steps are read on (tests set it)
wall = time.time

#: seconds over which the published enqueue/ack rates are averaged.
RATE_WINDOW = 60.0
#: seconds a partition's published figures (its row) may go unwritten while they do not change:
#: a pass writes the rows whose figures changed, and the others this often, rather than one
#: UPDATE a partition every second.
STATS_REFRESH = 30.0


#: Partitions' figures written by one statement at most.
STATS_BATCH = 200


def _write_stats(rows: list[tuple[int, int, dict[str, Any]]], node_id: str, at: datetime) -> set[int]:
    """Each ``(partition id, epoch, figures)`` into its row, while this node owns it under that
    epoch; the ids of the rows written.

    One statement for up to :data:`STATS_BATCH` rows: ``UPDATE ... FROM`` the rows' values,
    on PostgreSQL one array a column (``unnest``: a short statement, parsed once), on SQLite a
    ``VALUES`` list. The ORM's ``filter(pk=, owner_id=, epoch=).update(**figures)`` builds a
    statement for every row, and even one written out and run a row each costs a busy node's
    housekeeping pass a statement per partition (``bench/housekeeping.py``).
    On PostgreSQL the statement locks its rows in id order and skips those another transaction
    holds (a purge, a queue's delete): it never waits, so it cannot deadlock with one that
    locks a queue's rows in another order, and a row skipped is written at the next pass."""
    if not rows:
        return set()
    names = (*rows[0][2], "stats_at")
    fields = [_field("id"), _field("epoch"), *(_field(name) for name in names)]
    db = connections[DEFAULT_DB_ALIAS]  # (not the ``connection`` proxy: a thread-local lookup a value)
    postgres = db.vendor == "postgresql"
    written: set[int] = set()
    with db.cursor() as cursor:
        for i in range(0, len(rows), STATS_BATCH):
            chunk = rows[i : i + STATS_BATCH]
            table = [
                [
                    f.get_db_prep_save(v, db)
                    for f, v in zip(fields, (pid, epoch, *(figures[name] for name in names[:-1]), at))
                ]
                for pid, epoch, figures in chunk
            ]
            if postgres:  # one array a column
                params: list[Any] = [list(column) for column in zip(*table)] + [node_id, node_id]
            else:
                params = [v for row in table for v in row] + [node_id]
            cursor.execute(_stats_sql(names, 0 if postgres else len(chunk)), params)
            written.update(row[0] for row in cursor.fetchall())
    return written


@functools.lru_cache(maxsize=256)
def _stats_sql(names: tuple[str, ...], n: int) -> str:
    """The statement for figures ``names`` of ``n`` rows (0: PostgreSQL's, of arrays), built
    once (SQLite's, once per row count: up to :data:`STATS_BATCH` of them)."""
    db = connections[DEFAULT_DB_ALIAS]
    fields = [_field("id"), _field("epoch"), *(_field(name) for name in names)]
    qn = db.ops.quote_name
    table, pk = qn(Partition._meta.db_table), qn(_column(_field("id")))
    owner, epoch = qn(_column(_field("owner"))), qn(_column(_field("epoch")))
    columns = ", ".join(["v_id", "v_epoch", *(f"v_{i}" for i in range(len(names)))])
    sets = ", ".join(f"{qn(_column(f))} = v.v_{i}" for i, f in enumerate(fields[2:]))
    mine = f"{table}.{owner} = %s"
    if n:
        source = f"VALUES {', '.join(['(' + ', '.join(['%s'] * len(fields)) + ')'] * n)}"
    else:
        source = f"SELECT * FROM unnest({', '.join(f'%s::{f.db_type(db)}[]' for f in fields)})"
        mine += (
            f" AND {table}.{pk} IN (SELECT v_id FROM v JOIN {table} ON {table}.{pk} = v.v_id"
            f" WHERE {table}.{owner} = %s ORDER BY v_id FOR UPDATE OF {table} SKIP LOCKED)"
        )
    return (
        f"WITH v({columns}) AS ({source}) "
        f"UPDATE {table} SET {sets} FROM v WHERE {table}.{pk} = v.v_id AND {table}.{epoch} = v.v_epoch AND {mine} "
        f"RETURNING {table}.{pk}"
    )


def _field(name: str) -> models.Field[Any, Any]:
    field = Partition._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field


def _column(field: models.Field[Any, Any]) -> str:
    assert field.column is not None
    return field.column


def _apply_rules(m: PartitionManager[leases.Lease], cfg: QueueConfig) -> None:
    """The queue's rules that its partition managers apply (the dead-letter rule, how a
    group's messages go, what is archived), as its description gives them."""
    m.max_receives = cfg.max_receives
    m.group_batch = cfg.group_batch
    m.archive = cfg.archive


class NodeRuntime:
    """One server process's membership of the cluster, and the partitions it serves.

    It registers a ``Node`` row, heartbeats it, and every ``heartbeat`` seconds runs one
    housekeeping pass (:meth:`tick`): renew its leases, reload the queue descriptions, claim its
    fair share of partitions (and orphans), give back its surplus, publish each partition's
    figures. Each partition it leases is a :class:`PartitionManager` in ``managers``; request
    threads reach them through :mod:`queues.service`, and long polls wait on its change
    condition (:meth:`wait_for_change`, woken by enqueues and releases).

    Locking: ``_lock`` guards the ``managers`` and ``queues`` maps only; each manager's own lock
    guards the partition. ``queues`` holds :class:`QueueConfig` snapshots, replaced whole.
    """

    def __init__(
        self,
        address: str,
        *,
        store: KeyValueStore | None = None,
        heartbeat: float = 1.0,
        cache_bytes: int = 64 << 20,
        background: bool = True,
        clock: leases.Clock = leases.SYSTEM_CLOCK,
    ):
        self.address = address
        self.node_id = uuid.uuid4().hex
        self.store = store or get_store()
        self.heartbeat = heartbeat
        self.background = background
        self.clock = clock
        self.cache = BodyCache(cache_bytes)
        self.managers: dict[tuple[str, int], PartitionManager[leases.Lease]] = {}
        #: the same managers by queue, then partition: each message call asks for its queue's,
        #: which a walk of every manager of the node made cost O(partitions served here).
        self._queue_managers: dict[str, dict[int, PartitionManager[leases.Lease]]] = {}
        self.queues: dict[str, QueueConfig] = {}
        self.observations: dict[int, leases.Observation] = {}
        self._lock = threading.RLock()  # guards managers / queues maps, not partition state
        self._changed = threading.Condition()
        self._change_seq = 0
        self._rr = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease_thread: threading.Thread | None = None
        #: held while leases are renewed or given back, by the housekeeping pass or the lease
        #: thread: a lease released for rebalancing is never renewed a moment later.
        self._leases_lock = threading.Lock()
        #: one claim pass at a time in this process (see :meth:`_claim_partitions`).
        self._claiming = threading.RLock()
        self.started = False
        #: monotonic time the last housekeeping pass finished (None: none yet), for readyz.
        self.last_pass: float | None = None
        self.router = Router(self.node_id)
        #: over its load or failure threshold: enqueues go to other nodes (the seed's
        #: cooling period); dequeues and acks are still served here.
        self.cooling = False
        self._failures: list[float] = []
        #: partitions an operator released here: not claimed again before this monotonic time.
        self.hold_off: dict[tuple[str, int], float] = {}
        #: per partition: (monotonic time, enqueued total, acked total, enqueue rate, ack rate).
        self._rates: dict[tuple[str, int], tuple[float, int, int, float, float]] = {}
        #: the start (epoch seconds) of the last step of the rate history written (None: none yet).
        self._history_step: float | None = None
        #: what each partition's row was last given, by whom and when (monotonic).
        self._published: dict[tuple[str, int], tuple[float, PartitionManager[leases.Lease], dict[str, Any]]] = {}
        #: ids of the queues deleted through this node: a description read before the delete
        #: committed must not be cached after it (guarded by ``_lock``).
        self._deleted: set[int] = set()
        #: Counts descriptions cached by :meth:`_remember`; ``_remembered[name]`` is the count when
        #: ``name``'s was, so a refresh whose read began earlier keeps it (it is newer).
        self._generation = 0
        self._remembered: dict[str, int] = {}
        #: Whether this process still answers calls (``queues.cluster.watchdog`` sets it in a served
        #: process: its own probe through the server came back lately). None: not watched
        #: (in-process use). While it says no, leases are given up and none is claimed: a
        #: process whose request threads are all stuck must not keep partitions it cannot serve.
        self.serving: Callable[[], bool] | None = None
        self._gave_up = False
        #: what this process tells its sibling processes of one runnode (None: it has none);
        #: set by ``config.node`` (see :mod:`queues.cluster.siblings`).
        self.board: Board | None = None
        #: what :meth:`hint` last published, by target.
        self._hinted: dict[str, tuple[float | None, float | None]] = {}
        self._hint_lock = threading.Lock()
        #: where this process reports when it starts and stops serving each partition
        #: (``OWNERSHIP_EVENTS``; None: off, as in production).
        self.ownership = ownership.events_to(settings.OWNERSHIP_EVENTS, self.node_id, address)

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> NodeRuntime:
        clock.measure()
        now = clock.now()
        Node.objects.create(
            id=self.node_id,
            address=self.address,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_at=now,
            heartbeat_at=now,
        )
        self.started = True
        self.tick()
        if self.background:
            self._thread = threading.Thread(target=self._run, name="node-housekeeping", daemon=True)
            self._thread.start()
            self._lease_thread = threading.Thread(target=self._keep_leases, name="node-leases", daemon=True)
            self._lease_thread.start()
        log.info("node %s started at %s", self.node_id, self.address)
        return self

    def stop(self, *, release: bool = True) -> None:
        """Stop housekeeping and, if ``release``, hand the leases back for a fast takeover."""
        self._stop.set()
        for thread in (self._thread, self._lease_thread):
            if thread is not None:
                thread.join(timeout=10)
        with self._lock:
            managers = list(self.managers.values())
            self.managers.clear()
            self._queue_managers.clear()
        for m in managers:
            with m.lock:
                m.close()
            if release:
                try:
                    leases.release(m.lease, self.node_id)
                except Exception:
                    log.exception("releasing %s/%s", m.queue, m.index)
        Node.objects.filter(pk=self.node_id).update(stopped_at=timezone.now())
        self.notify()

    def _run(self) -> None:
        self._every_heartbeat(self.tick, "housekeeping pass")

    def _keep_leases(self) -> None:
        """The lease thread: heartbeat and renewals only (the database, never the key-value
        store, never a partition's lock). The housekeeping pass also opens partitions (store
        reads), publishes figures (under each partition's lock) and may wait on the store for
        its timeout; a renewal waiting behind it would let leases run out during a store outage
        and every partition be reopened for nothing once it is over."""
        self._every_heartbeat(self.renew, "lease renewal", every=self.renewal_interval)

    def renewal_interval(self) -> float:
        """Seconds between the lease thread's looks: a heartbeat, or a sixth of the shortest
        lease held here (its own period or the one its queue has changed to) when that is
        less. A lease falls due at a third of its period and this node acts on it until
        ``LEASE_SAFETY`` of it: looked at once a heartbeat, a lease shorter than the heartbeat
        lapsed between two looks and its partition answered 503 though its only owner was well
        (a 1 s lease under a 1 s heartbeat). Looked at a sixth, it is renewed by half its period."""
        shortest = self.heartbeat * 6
        for m in list(self.managers.values()):
            cfg = self.queues.get(m.queue)
            shortest = min(shortest, m.lease.period, cfg.lease_period if cfg is not None else shortest)
        return max(0.05, min(self.heartbeat, shortest / 6))

    def _every_heartbeat(self, step: Callable[[], object], what: str, every: Callable[[], float] | None = None) -> None:
        """Run ``step`` once a heartbeat (or each ``every()`` seconds) until the node stops; a
        failure is logged (a store or database outage as one line) and the next beat tries again."""
        while not self._stop.wait(self.heartbeat if every is None else every()):
            try:
                step()
            except (OperationalError, InterfaceError, KVError) as exc:
                self._store_outage(exc)
            except Exception:
                log.exception("%s failed", what)
            finally:
                close_old_connections()

    def _store_outage(self, exc: Exception) -> None:
        """A housekeeping pass (or renewal) failed on the database or the store: the next one
        tries again and, if the database could not be reached, every wait for an owner to stop
        renewing starts over.

        An observer counts a lease period from when it last saw the row's nonce change. While
        the database is unreachable no owner can renew, so without starting over, the first
        pass after a database outage longer than a lease period would take the other nodes'
        partitions (their nonce "stood" for the whole outage) before their owners renewed:
        leases lost for nothing, every partition reopened. Starting over only delays the
        takeover of a really dead owner by one lease period after an outage; it never shortens
        a wait, so the clock-skew rule still holds.
        """
        if isinstance(exc, (OperationalError, InterfaceError)):
            self.observations.clear()
        log.warning("housekeeping pass failed: %s: %s", type(exc).__name__, exc)

    # --- housekeeping -------------------------------------------------------------------------
    def record_failure(self) -> None:
        """A store or partition failure seen by a request (feeds the cooling decision)."""
        self._failures.append(monotonic())

    def _update_cooling(self) -> None:
        now = monotonic()
        self._failures = [t for t in self._failures if now - t < 10.0]
        in_flight = sum(m.in_flight_count(now) for m in list(self.managers.values()))
        cooling = in_flight > settings.NODE_COOLING_IN_FLIGHT or len(self._failures) > settings.NODE_COOLING_FAILURES
        if cooling != self.cooling:
            log.warning(
                "node %s %s cooling (in flight %s, failures in 10 s %s)",
                self.address,
                "starts" if cooling else "ends",
                in_flight,
                len(self._failures),
            )
        self.cooling = cooling

    def tick(self) -> None:
        """One housekeeping pass: heartbeat, renew, refresh queues, claim, publish figures."""
        self._update_cooling()
        self.renew()
        self.refresh_queues()
        self._drop_stale()
        if self.is_serving():
            self._claim_partitions()
        self._publish_stats()
        if self.board is not None:
            for queue in list(self._queue_managers):
                self.hint(queue, force=True)  # (what came due by the clock, a delayed message's turn)
        self.last_pass = monotonic()
        try:
            self._record_rates()
        except DatabaseError as exc:  # the console's history only: the pass itself is done
            log.warning("rate history not written: %s", exc)

    def is_serving(self) -> bool:
        """Whether this process answers calls (:attr:`serving`; True when not watched)."""
        return self.serving is None or self.serving()

    def renew(self) -> None:
        """This node's heartbeat, and the renewal of the leases that are due; a process that
        does not answer calls (:meth:`is_serving`) gives its leases up instead.

        With ownership events on, the leases that lapsed are reported first (before anything
        here waits on the database): a process woken from a pause, or cut from the database,
        reports that it stopped serving at its next look."""
        if self.ownership is not None:
            self.ownership.sweep()
        if not self.is_serving():
            self._give_up_leases()
            return  # no heartbeat either: the other nodes count it out of their fair share
        if self._gave_up:
            self._gave_up = False
            log.warning("node %s answers calls again: claiming partitions again", self.address)
        with self._leases_lock:
            clock.measure()
            Node.objects.filter(pk=self.node_id).update(heartbeat_at=clock.now(), cooling=self.cooling)
            self._renew_leases()

    def _give_up_leases(self) -> None:
        """Hand back every lease: this process does not answer calls, so another node must
        serve its partitions. A manager whose lock a stuck call holds is left to run out (its
        lease is not renewed; the next owner's epoch fences it)."""
        if not self._gave_up:
            self._gave_up = True
            log.error(
                "node %s does not answer its own probe: giving up its %s leases", self.address, len(self.managers)
            )
        for m in list(self.managers.values()):
            self._release(m, "as this process does not answer calls", lock_timeout=0.5, level=logging.WARNING)
        self.notify()

    def _renew_leases(self) -> None:
        due: list[tuple[tuple[str, int], PartitionManager[leases.Lease], float | None]] = []
        for key, m in list(self.managers.items()):
            if m.closed:
                self._reopen_or_drop(key, m)
                continue
            cfg = self.queues.get(m.queue)
            period_changed = cfg is not None and cfg.lease_period != m.lease.period
            if m.lease.renewal_due() or period_changed:
                due.append((key, m, cfg.lease_period if cfg else None))
        if not due:
            return
        lost: dict[int, leases.LeaseLost] = {}
        try:
            leases.renew_many([(m.lease, period) for _, m, period in due], self.node_id, lost)
        finally:
            # Those found lost before a database error too: their managers must stop serving.
            for key, m, _ in due:
                exc = lost.get(m.lease.partition_id)
                if exc is not None:
                    log.warning("%s", exc)
                    metrics.LEASES_LOST.labels(m.queue, str(m.index)).inc()
                    with m.lock:
                        m.close()
                    self._forget(key, m)
                elif self.ownership is not None and not m.closed:
                    # Renewed (or not reached before an error): the reports know its new end,
                    # and a lease that had lapsed (reported) and is ours again under the same
                    # epoch is reported served again. After the renewal rather than before it,
                    # which may fail: under an unchanged epoch no other process can have served
                    # it meanwhile, and a call answered in between names that same epoch.
                    self.ownership.renewed(m.lease)
        for _, m, _ in due:
            if m.lease.partition_id not in lost:
                metrics.LEASE_RENEWALS.labels(m.queue, str(m.index)).inc()

    def _reopen_or_drop(self, key: tuple[str, int], m: PartitionManager[leases.Lease]) -> None:
        """A manager closed itself after a failure: hand the lease back rather than reopen
        under the same epoch, so that the next claim (this node's, usually at the next pass)
        raises the fence and any late write of the closed manager is refused."""
        self._forget(key, m)
        # Even when its time ran out here: the release is a compare-and-set on this node and
        # epoch, so it frees the row only if no one took it, and spares the next claimant the
        # wait for a nonce that no one renews any more.
        try:
            leases.release(m.lease, self.node_id)
        except Exception:
            log.exception("releasing %s/%s after a failure", m.queue, m.index)

    def _forget(self, key: tuple[str, int], m: PartitionManager[leases.Lease]) -> None:
        with self._lock:
            if self.managers.get(key) is m:
                del self.managers[key]
                same_queue = self._queue_managers.get(key[0], {})
                same_queue.pop(key[1], None)
                if not same_queue:
                    self._queue_managers.pop(key[0], None)
        if self.board is not None:
            self.hint(key[0])

    def refresh_queues(self) -> None:
        with self._lock:
            started = self._generation
        fresh = catalog.load()
        with self._lock:
            # Read before a delete here committed: not served again.
            fresh = {name: cfg for name, cfg in fresh.items() if cfg.id not in self._deleted}
            # A description cached while the rows were being read (a change made here, the
            # queue created here) is newer than the row read: keep it, or a queue grown a moment
            # ago would be served with its old partition count until the next pass.
            for name, generation in list(self._remembered.items()):
                if generation <= started:
                    del self._remembered[name]
                elif name in self.queues and self.queues[name].id not in self._deleted:
                    fresh[name] = self.queues[name]
            gone = set(self.queues) - set(fresh)
            self.queues = fresh
        for (name, _), m in list(self.managers.items()):
            cfg = fresh.get(name)
            if cfg is not None:
                _apply_rules(m, cfg)
        self._release_if_subscriptions_changed(fresh)
        for name in gone:
            self._close_queue(name)

    def live_nodes(self) -> list[Node]:
        """Nodes that heartbeat, this one included: the divisor of the fair share."""
        cutoff = clock.now() - timedelta(seconds=max(2.0, 3 * self.heartbeat))
        nodes = list(Node.objects.filter(stopped_at=None, heartbeat_at__gte=cutoff))
        if not any(n.pk == self.node_id for n in nodes):
            nodes.append(Node(pk=self.node_id, address=self.address))
        return nodes

    def _claim_partitions(self, only: str | None = None) -> None:
        """Hold a fair share of each queue's partitions: about P/N of them.

        A free partition is claimed while this node holds fewer than ``ceil(P/N)``; one whose
        owner stopped renewing is claimed whatever the count (an orphan must not wait for the
        share to be recomputed); above the share, the newest leases are given back, so a node
        that joins gets work without anyone restarting. Each node tries the partitions in its
        own order (a hash of its id), so nodes starting together mostly ask for different
        ones and move on to backups when their first choice is taken.

        One pass at a time: the housekeeping thread's and a request thread's (a queue created
        here, or first met) each counted the partitions it took from the rows it read, so two at
        once took up to twice the share. The next pass then gave the extra back, and the
        messages in flight in them were delivered again by their next owner (a two-process
        node took all 4 partitions of a queue just created and released 2 a second later,
        ``bench/throughput.py --node-processes 2 --modes single``: 463 acks refused 409).
        """
        with self._claiming:
            self._claim_pass(only)

    def _claim_pass(self, only: str | None) -> None:
        # Only what a claim reads (leases.try_claim), as tuples: every row at every pass.
        rows = Partition.objects.all() if only is None else Partition.objects.filter(queue__name=only)
        n_nodes = max(1, len(self.live_nodes()))
        by_queue: dict[str, list[leases.PartitionRow]] = {}
        configs: dict[str, QueueConfig] = {}
        for p in leases.claim_rows(rows):
            cfg = self.queues.get(p.queue_name)
            # Only the rows of the queue this node knows (not those of a queue deleted since,
            # nor of one created again under the name before this node read it).
            if cfg is not None and cfg.id == p.queue_id:
                by_queue.setdefault(p.queue_name, []).append(p)
                configs[p.queue_name] = cfg
        for name, parts in by_queue.items():
            share = math.ceil(len(parts) / n_nodes)
            mine = list(self._queue_managers.get(name, {}).values())  # (not a walk of every manager a queue)
            for extra in sorted(mine, key=lambda m: -m.index)[: max(0, len(mine) - share)]:
                self._release(extra)
            held = min(len(mine), share)
            order = sorted(
                parts, key=lambda p: hashlib.blake2b(f"{self.node_id}/{p.index}".encode(), digest_size=4).digest()
            )
            for p in order:
                key = (name, p.index)
                if key in self.managers:
                    continue
                if key in self.hold_off:
                    if self.hold_off[key] > monotonic():
                        continue
                    self.hold_off.pop(key, None)  # (a request thread's claim pass may run beside this one)
                free = p.owner_id is None
                if free and held >= share:
                    continue
                lease = leases.try_claim(p, self.node_id, self.observations, clock=self.clock)
                if lease is None:
                    continue
                opened, outage = self._open(configs[name], lease)
                if outage:
                    return  # the store or the database is down: no more opens this pass (each would wait on it)
                if opened is not None:
                    held += 1
                    self._count_open(opened, takeover=not free)

    @staticmethod
    def _count_open(m: PartitionManager[leases.Lease], *, takeover: bool) -> None:
        """A partition opened here: a takeover when its row still named an owner (one that
        stopped renewing), else the claim of a free partition."""
        label = "true" if takeover else "false"
        metrics.OPENS.labels(m.queue, str(m.index), label).inc()
        metrics.OPEN_SECONDS.labels(m.queue, label).observe(m.opened_in.get("dequeue_ready_s", 0.0))
        metrics.OPEN_READS.labels(m.queue, label).observe(m.opened_in.get("oldest_reads", 0))

    def _release(
        self,
        m: PartitionManager[leases.Lease],
        why: str = "for rebalancing",
        lock_timeout: float = -1,
        level: int = logging.INFO,
    ) -> None:
        """Give a partition back: stop serving it, then free the row. With ``lock_timeout``, a
        manager whose lock a call holds longer is left as it is (its lease not renewed, it runs
        out and the next owner's epoch fences it)."""
        # not under _leases_lock: a call may hold m.lock for a store timeout
        if not m.lock.acquire(timeout=lock_timeout):
            return
        try:
            m.close()
        finally:
            m.lock.release()
        with self._leases_lock:
            self._forget((m.queue, m.index), m)
            try:
                leases.release(m.lease, self.node_id)
                log.log(level, "released %s/%s %s", m.queue, m.index, why)
            except Exception:
                log.exception("releasing %s/%s", m.queue, m.index)

    def release_partition(self, queue: str, index: int) -> bool:
        """An operator's release: give the lease up and leave the partition to another node
        for one lease period (after that this node may take it back, if nobody did)."""
        m = self.managers.get((queue, index))
        if m is None or m.closed:
            return False
        self.hold_off[(queue, index)] = monotonic() + m.lease.period
        self._release(m)
        self.notify()
        return True

    def purged(self, queue: str) -> None:
        """The queue's partitions were purged (their epochs moved on): drop those managers now,
        rather than serve from memory until the next renewal fails, and claim the emptied
        partitions again at once. A manager opened after the purge (a partition added or
        claimed since) is kept."""
        self._drop_stale(queue)
        if queue in self.queues:
            self._claim_partitions(only=queue)
        self.notify()

    def _drop_stale(self, queue: str | None = None) -> None:
        """Close this node's managers (of ``queue``, or all) whose partition row says they no
        longer serve: the row is gone (the queue was deleted, maybe created again since under
        the same name), or its epoch or owner moved on (purged, taken over). One query."""
        mine = [(key, m) for key, m in list(self.managers.items()) if queue is None or key[0] == queue]
        if not mine:
            return
        rows = Partition.objects.filter(pk__in=[m.lease.partition_id for _, m in mine]).values_list(
            "pk", "epoch", "owner_id"
        )
        now = {pk: (epoch, owner) for pk, epoch, owner in rows}
        for key, m in mine:
            if now.get(m.lease.partition_id) != (m.lease.epoch, self.node_id):
                log.info("%s/%s: epoch %s is over here (purged, deleted or taken over)", *key, m.lease.epoch)
                with m.lock:
                    m.close()
                self._forget(key, m)

    def _open(self, cfg: QueueConfig, lease: leases.Lease) -> tuple[PartitionManager[leases.Lease] | None, bool]:
        """Serve the partition ``lease`` was just taken for: its manager (None if it could not
        open, the row handed back), and whether that was for an outage of the store or the
        database."""
        m = PartitionManager(
            lease,
            block_size=cfg.block_size,
            block_growth=settings.BLOCK_GROWTH,
            # The incarnation's own keys: a manager of a deleted queue never writes into the
            # tree of one created again under the name (keys.incarnation).
            store=self.store.within(keys.incarnation(cfg.id)),
            node_id=self.node_id,
            cache=self.cache,
            row=BoundRow(
                lease,
                self.node_id,
                leases.read_head,
                leases.set_head,
                leases.move_epoch,
                outages=leases.ROW_OUTAGES,
            ),
            on_change=functools.partial(self._messages_changed, cfg.name),
            on_close=functools.partial(self._stopped_serving, lease),
            counters=metrics.MESSAGES,
            subscriptions=cfg.subscriptions,
            archive_sink=ARCHIVE.sink,
            archive_source=ARCHIVE.source,
        )
        _apply_rules(m, cfg)
        key = (cfg.name, lease.index)
        if self.ownership is not None:
            self.ownership.serve(lease)  # before the fence: the first act as owner
        epoch = lease.epoch
        try:
            m.open_head()
            if self.ownership is not None and lease.epoch != epoch:
                self.ownership.serve(lease)  # moved past a fence ahead of the row: a new epoch
            with self._lock:
                self.managers[key] = m  # enqueues are served from here on
                self._queue_managers.setdefault(cfg.name, {})[lease.index] = m
            m.open_oldest()
        except Exception as exc:
            with m.lock:
                m.close()
            self._forget(key, m)
            # The row names this node now: hand it back, else nobody (this node included) would
            # take it before its nonce had stood a lease period, and its calls would be answered
            # 503 "no live owner" all that time.
            try:
                leases.release(lease, self.node_id)
            except Exception:
                log.exception("releasing %s/%s after its open failed", cfg.name, lease.index)
            if isinstance(exc, (KVError, OperationalError, InterfaceError)):
                # a store or database outage: the next pass tries again
                log.warning("opening %s/%s failed: %s: %s", cfg.name, lease.index, type(exc).__name__, exc)
                return None, True
            # something about this partition (a corrupt tree): another node may try it now, this
            # one not before a lease period
            log.exception("opening %s/%s", cfg.name, lease.index)
            self.hold_off[key] = monotonic() + lease.period
            return None, False
        self._messages_changed(cfg.name)
        return m, False

    def _stopped_serving(self, lease: leases.Lease) -> None:
        """A manager of this node was closed: it no longer acts as owner under ``lease``."""
        if self.ownership is not None:
            self.ownership.unserve(lease)

    def _rates_of(self, key: tuple[str, int], enqueued: int, acked: int) -> tuple[float, float]:
        """Enqueue and ack rates of a partition, averaged over about a minute (an EWMA of the
        counters' growth between passes; zero for a partition just taken over)."""
        now = monotonic()
        last = self._rates.get(key)
        if last is None:
            rates = (0.0, 0.0)
        else:
            t, enq0, ack0, enq_rate, ack_rate = last
            dt = max(now - t, 1e-3)
            w = 1.0 - math.exp(-dt / RATE_WINDOW)
            rates = (
                enq_rate + w * ((enqueued - enq0) / dt - enq_rate),
                ack_rate + w * ((acked - ack0) / dt - ack_rate),
            )
        self._rates[key] = (now, enqueued, acked, *rates)
        return rates

    def _publish_stats(self) -> None:
        """Each partition's figures into its row (the console's and the other nodes' view):
        the rows whose figures changed since they were last written, and every row at least
        each :data:`STATS_REFRESH` seconds (``stats_at`` says when)."""
        now, mono = timezone.now(), monotonic()
        managers = list(self.managers.items())
        for gone in set(self._rates) - {k for k, _ in managers}:
            del self._rates[gone]
        for gone in set(self._published) - {k for k, _ in managers}:
            del self._published[gone]
        due: list[tuple[tuple[str, int], PartitionManager[leases.Lease], dict[str, Any]]] = []
        for key, m in managers:
            s = m.stats()
            oldest = datetime.fromtimestamp(s.oldest_enqueued_at, tz=UTC) if s.oldest_enqueued_at else None
            enqueue_rate, ack_rate = self._rates_of(key, s.enqueued_total, s.acked_total)
            figures = {
                "enqueue_id": s.enqueue_id,
                "dequeue_id": s.dequeue_id,
                "depth": s.visible,
                "delayed": s.delayed,
                "enqueue_rate": round(enqueue_rate, 3),
                "ack_rate": round(ack_rate, 3),
                "in_flight": s.in_flight,
                "tree_height": s.tree_height,
                "live_blocks": s.live_blocks,
                "cursors": s.cursors,
                "enqueued_total": s.enqueued_total,
                "acked_total": s.acked_total,
                "redelivered_total": s.redelivered_total,
                "oldest_enqueued_at": oldest,
            }
            last = self._published.get(key)
            if last is not None and last[1] is m and last[2] == figures and mono - last[0] < STATS_REFRESH:
                continue
            due.append((key, m, figures))
        if not due:
            return
        written = _write_stats([(m.lease.partition_id, m.lease.epoch, f) for _, m, f in due], self.node_id, now)
        for key, m, figures in due:
            if m.lease.partition_id in written:  # (a row skipped, or no longer ours: due at the next pass)
                self._published[key] = (mono, m, figures)

    def _record_rates(self) -> None:
        """Once a ``RATE_HISTORY_STEP``, the first pass of the step: a point of the rate history
        for each partition held here (the rates just published, at the step's start), and the
        points older than ``RATE_HISTORY_SECONDS`` deleted, whoever wrote them. One row a
        partition a step: a partition taken over during a step keeps its first owner's point."""
        step = float(settings.RATE_HISTORY_STEP)
        if step <= 0:
            return
        start = math.floor(wall() / step) * step
        if start == self._history_step:
            return
        at = datetime.fromtimestamp(start, tz=UTC)
        points = [
            RateSample(
                partition_id=m.lease.partition_id, at=at, enqueue_rate=round(rates[3], 3), ack_rate=round(rates[4], 3)
            )
            for key, m in list(self.managers.items())
            if (rates := self._rates.get(key)) is not None
        ]
        RateSample.objects.bulk_create(points, batch_size=500, ignore_conflicts=True)
        RateSample.objects.filter(at__lt=at - timedelta(seconds=settings.RATE_HISTORY_SECONDS)).delete()
        self._history_step = start

    # --- queues -------------------------------------------------------------------------------
    def queue(self, name: str) -> QueueConfig:
        cfg = self.queues.get(name)
        if cfg is None:
            cfg = catalog.load(name).get(name)
            if cfg is None:
                raise QueueNotFound(name)
            if not self._remember(cfg):
                raise QueueNotFound(name)  # deleted here while we read it
            if self.started:
                # A queue created elsewhere (another node, or a sibling process of this one): take
                # this node's share now rather than at the next pass, or every call for it here
                # until then is forwarded.
                try:
                    self._claim_partitions(only=name)
                except Exception:
                    log.exception("claiming partitions of %s", name)
        return cfg

    def queue_store(self, name: str) -> KeyValueStore:
        """The store's view of the queue's current incarnation (``keys.incarnation``), in which
        its keys and message IDs are named. Raises QueueNotFound."""
        return self.store.within(keys.incarnation(self.queue(name).id))

    def _remember(self, cfg: QueueConfig) -> bool:
        """Cache a description just read, unless its queue was deleted here meanwhile."""
        with self._lock:
            if cfg.id in self._deleted:
                return False
            self.queues[cfg.name] = cfg
            self._generation += 1
            self._remembered[cfg.name] = self._generation
            for m in self._queue_managers.get(cfg.name, {}).values():
                _apply_rules(m, cfg)  # a change made here holds at once, not from the next pass
            return True

    def queue_created(self, q: Queue) -> None:
        """Take the new queue's partitions at once rather than at the next pass."""
        self.queue_changed(q)

    def queue_changed(self, q: Queue) -> None:
        """Describe the queue as its row now reads (the same read as every pass) and claim."""
        cfg = catalog.load(q.name).get(q.name)
        if cfg is not None and self._remember(cfg):
            self._claim_partitions(only=q.name)
            self.router.forget(cfg.id)

    def reload(self, name: str) -> None:
        """Queue or topic ``name`` was created or changed through another node: describe it
        as its row now reads and claim this node's share of its partitions now, rather than at
        the next pass; a topic's partitions held here whose subscriptions changed are reopened."""
        cfg = catalog.load(name).get(name)
        if cfg is None or not self._remember(cfg):
            return
        self._release_if_subscriptions_changed({name: cfg})
        self._claim_partitions(only=name)
        self.router.forget(cfg.id)
        self.notify()

    def _release_if_subscriptions_changed(self, configs: dict[str, QueueConfig]) -> None:
        """A subscription came or went (or changed): give the topic's partitions held here back,
        to be claimed again (at once, by the caller's claims) and reopened from the store with
        the new set, rather than teach a live manager a new reader."""
        for (queue, _), m in list(self.managers.items()):
            cfg = configs.get(queue)
            if cfg is not None and m.subscriptions != cfg.subscriptions:
                self._release(m)

    def queue_deleted(self, name: str, queue_id: int) -> None:
        """Queue ``queue_id`` was deleted (committed; its keys are gone, see
        ``service.delete_queue``): forget it and close its managers here. A queue created again
        under the name since then keeps its description and managers."""
        with self._lock:
            self._deleted.add(queue_id)
            cfg = self.queues.get(name)
            if cfg is not None and cfg.id == queue_id:
                del self.queues[name]
        self._drop_stale(name)
        self.notify()

    def serves(self, cfg: QueueConfig) -> bool:
        """Whether ``cfg`` still names the queue this node knows under its name: False once that
        queue was deleted here, or once another was created under the name (a long poll of the
        deleted one takes nothing of its successor)."""
        if cfg.id in self._deleted:
            return False
        current = self.queues.get(cfg.name)
        return current is None or current.id == cfg.id

    def _close_queue(self, name: str) -> None:
        for key, m in list(self.managers.items()):
            if key[0] == name:
                with m.lock:
                    m.close()
                self._forget(key, m)

    def local_managers(self, queue: str) -> list[PartitionManager[leases.Lease]]:
        return [m for m in list(self._queue_managers.get(queue, {}).values()) if not m.closed]

    def manager(self, queue: str, index: int) -> PartitionManager[leases.Lease]:
        m = self.managers.get((queue, index))
        if m is None or m.closed:
            raise PartitionUnavailable(f"partition {queue}/{index} is not served by this node; retry")
        return m

    # --- long polling -------------------------------------------------------------------------
    def _messages_changed(self, queue: str) -> None:
        """Messages of ``queue`` may have become deliverable here: wake the long polls (this
        process's, and the siblings' waiting for it)."""
        self.notify()
        if self.board is not None:
            self.hint(queue)

    def hint(self, queue: str, *, force: bool = False) -> None:
        """Tell the sibling processes what this one could deliver of ``queue`` now (each of a
        topic's subscriptions apart; see :mod:`queues.cluster.siblings`), unless it is what was
        told last (``force``: tell it again)."""
        board = self.board
        if board is None:
            return
        cfg = self.queues.get(queue)
        subs = [s.name for s in cfg.subscriptions] if cfg is not None and cfg.subscriptions is not None else [""]
        managers = self.local_managers(queue)
        for sub in subs:
            oldest: float | None = None
            due: float | None = None
            for m in managers:
                o, d = m.waiting_since(sub)
                if o is not None and (oldest is None or o < oldest):
                    oldest = o
                if d is not None and (due is None or d < due):
                    due = d
            target = f"{queue}/{sub}" if sub else queue
            with self._hint_lock:
                if force or self._hinted.get(target) != (oldest, due):  # (an enqueue behind others changes nothing)
                    self._hinted[target] = (oldest, due)
                    board.publish(target, oldest, due)

    def notify(self) -> None:
        with self._changed:
            self._change_seq += 1
            self._changed.notify_all()

    def change_seq(self) -> int:
        return self._change_seq

    def wait_for_change(self, seq: int, timeout: float) -> None:
        with self._changed:
            if self._change_seq == seq and timeout > 0:
                self._changed.wait(timeout)

    def rotation(self, n: int) -> int:
        return next(self._rr) % n if n else 0
