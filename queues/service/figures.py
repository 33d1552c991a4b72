"""What this node can say about itself: its figures for Prometheus, and whether it is ready.

:class:`NodeCollector` reads the partition managers of this process's node when ``/metrics`` is
scraped (``prometheus_client`` custom collector): per queue and topic the depth, in flight,
delayed, dead letters and oldest age; per subscription what it holds; per partition its owner,
epoch and its last open. Nothing is kept between scrapes, so a figure is as fresh as the
scrape. Each partition is served by one node, so ``sum by (queue)`` over the nodes gives the
queue's figures. The counters and histograms of events are in ``queues.metrics``.

:func:`readiness` answers ``GET /api/v1/readyz``: the database and the key-value store answer
(each probe bounded by :data:`PROBE_TIMEOUT`), and the node's housekeeping passes run (each
claims what is free of the node's share and renews what it holds).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from django.db import connection
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from queues.cluster import balance
from queues.cluster.node import NodeRuntime
from queues.service.runtime import current_runtime, get_runtime

#: Seconds a readiness probe of the database or the store may take before it counts as down.
PROBE_TIMEOUT = 2.0
#: The key the store probe reads (absent: the read is the probe).
PROBE_KEY = "_mq/readyz"


class NodeCollector(Collector):
    """Figures of this process's node, read from its partition managers at scrape time."""

    def __init__(self, runtime: Callable[[], NodeRuntime | None] = current_runtime):
        self.runtime = runtime

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rt = self.runtime()
        if rt is None:
            return
        now = time.time()
        queue_labels = ["queue", "kind"]
        depth = GaugeMetricFamily(
            "mq_queue_depth", "Messages stored and not in flight (delayed included)", labels=queue_labels
        )
        in_flight = GaugeMetricFamily("mq_queue_in_flight", "Messages delivered and not acked yet", labels=queue_labels)
        delayed = GaugeMetricFamily("mq_queue_delayed", "Messages whose delay has not passed yet", labels=queue_labels)
        oldest = GaugeMetricFamily(
            "mq_queue_oldest_age_seconds", "Age of the oldest message stored (0: none)", labels=queue_labels
        )
        served = GaugeMetricFamily("mq_queue_partitions_served", "Partitions this node serves", labels=queue_labels)
        dead = GaugeMetricFamily(
            "mq_queue_dead_letters",
            "Messages held in the dead-letter queue a queue (or subscription) names",
            labels=["queue", "subscription", "dead_letter_queue"],
        )
        held = GaugeMetricFamily(
            "mq_subscription_held",
            "Messages a subscription has not acked (in flight included)",
            labels=["queue", "subscription"],
        )
        sub_in_flight = GaugeMetricFamily(
            "mq_subscription_in_flight", "A subscription's messages in flight", labels=["queue", "subscription"]
        )
        sub_oldest = GaugeMetricFamily(
            "mq_subscription_oldest_age_seconds",
            "Age of the oldest message a subscription holds (0: none)",
            labels=["queue", "subscription"],
        )
        owned = GaugeMetricFamily(
            "mq_partition_owned", "1 for each partition this node owns", labels=["queue", "partition", "node"]
        )
        epoch = GaugeMetricFamily(
            "mq_partition_epoch", "The epoch (fence) of an owned partition", labels=["queue", "partition"]
        )
        open_s = GaugeMetricFamily(
            "mq_partition_last_open_seconds",
            "Seconds the partition's last open took here (claim to dequeues served)",
            labels=["queue", "partition"],
        )
        open_reads = GaugeMetricFamily(
            "mq_partition_last_open_block_reads",
            "Blocks read by the partition's last open here",
            labels=["queue", "partition"],
        )
        cooling = GaugeMetricFamily("mq_node_cooling", "1 while the node is cooling (enqueues go elsewhere)")
        cooling.add_metric([], 1.0 if rt.cooling else 0.0)
        connections = GaugeMetricFamily(
            "mq_node_client_connections",
            "Busy client connections each process of the node holds (runnode --processes N, queues.cluster.balance)",
            labels=["node"],
        )
        if balance.LAST_COUNT is not None:
            connections.add_metric([rt.address], float(balance.LAST_COUNT))

        per_queue: dict[str, list[float]] = {}  # name -> [depth, in flight, delayed, oldest age, partitions]
        per_sub: dict[tuple[str, str], list[float]] = {}  # (topic, sub) -> [held, in flight, oldest age]
        live: dict[str, float] = {}  # messages held per queue (the dead-letter figure of those naming it)
        for m in list(rt.managers.values()):
            if m.closed:
                continue
            s = m.stats()
            cfg = rt.queues.get(m.queue)
            kind = cfg.kind if cfg is not None else "queue"
            row = per_queue.setdefault(m.queue, [0.0, 0.0, 0.0, 0.0, 0.0, kind == "topic"])
            row[0] += s.visible
            row[1] += s.in_flight
            row[2] += s.delayed
            if s.oldest_enqueued_at:
                row[3] = max(row[3], now - s.oldest_enqueued_at)
            row[4] += 1
            live[m.queue] = live.get(m.queue, 0.0) + s.visible + s.in_flight
            index = str(m.index)
            owned.add_metric([m.queue, index, rt.address], 1.0)
            epoch.add_metric([m.queue, index], float(s.epoch))
            open_s.add_metric([m.queue, index], float(s.opened_in.get("dequeue_ready_s", 0.0)))
            open_reads.add_metric([m.queue, index], float(s.opened_in.get("oldest_reads", 0)))
            for sub, f in s.cursors.items():  # one series per subscription: add the partitions up
                figures = per_sub.setdefault((m.queue, sub), [0.0, 0.0, 0.0])
                figures[0] += f.get("held", 0)
                figures[1] += f.get("in_flight", 0)
                first = f.get("oldest_enqueued_at")
                if first:
                    figures[2] = max(figures[2], now - first)
        for name, row in sorted(per_queue.items()):
            labels = [name, "topic" if row[5] else "queue"]
            depth.add_metric(labels, row[0])
            in_flight.add_metric(labels, row[1])
            delayed.add_metric(labels, row[2])
            oldest.add_metric(labels, row[3])
            served.add_metric(labels, row[4])
        for (name, sub), (n_held, n_in_flight, age) in sorted(per_sub.items()):
            held.add_metric([name, sub], n_held)
            sub_in_flight.add_metric([name, sub], n_in_flight)
            sub_oldest.add_metric([name, sub], age)
        for name, cfg in sorted(rt.queues.items()):
            if cfg.dead_letter_queue is not None:
                dead.add_metric([name, "", cfg.dead_letter_queue], live.get(cfg.dead_letter_queue, 0.0))
            for spec in cfg.subscriptions or ():
                if spec.dead_letter_queue is not None:
                    dead.add_metric([name, spec.name, spec.dead_letter_queue], live.get(spec.dead_letter_queue, 0.0))
        yield from (depth, in_flight, delayed, oldest, served, dead, held, sub_in_flight, sub_oldest)
        yield from (owned, epoch, open_s, open_reads, cooling, connections)


# --- readiness --------------------------------------------------------------------------------
class _Probe:
    """Runs a check on a thread of its own and waits at most ``PROBE_TIMEOUT`` for it: a store
    or database that hangs (paused, a dropped network) must not hang the readiness call. While
    a check is still hanging from an earlier call, the next calls answer "not ready" at once
    rather than start another thread."""

    def __init__(self, check: Callable[[], object]):
        self.check = check
        self.lock = threading.Lock()
        self.running: threading.Thread | None = None

    def __call__(self) -> bool:
        result: list[bool] = []

        def run() -> None:
            try:
                self.check()
                result.append(True)
            except Exception:  # noqa: BLE001 - any failure means "not ready"
                result.append(False)

        with self.lock:
            if self.running is not None and self.running.is_alive():
                return False
            self.running = threading.Thread(target=run, name="readyz-probe", daemon=True)
            self.running.start()
            thread = self.running
        thread.join(PROBE_TIMEOUT)
        return bool(result and result[0])


def _database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()  # the probe's thread ends: so does its connection


def _store() -> None:
    get_runtime().store.get(PROBE_KEY)


_PROBES = {"database": _Probe(_database), "store": _Probe(_store)}


def readiness() -> dict[str, bool]:
    """Which of this node's readiness checks pass: ``database`` and ``store`` answer, and
    ``partitions``: its housekeeping passes run (each renews its leases and claims what is free
    of its share), the last one within three heartbeats."""
    out = {name: probe() for name, probe in _PROBES.items()}
    rt = get_runtime()
    last = rt.last_pass
    out["partitions"] = (
        rt.started
        and not rt._stop.is_set()
        and last is not None
        and time.monotonic() - last <= max(3 * rt.heartbeat, 5.0)
    )
    return out
