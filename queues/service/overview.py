"""The whole cluster at a glance, as one caller may see it: every queue and topic it may read
with its figures and what is wrong with it, the nodes with the partitions each holds, and the
alerts those add up to.

Read from what the owners publish at each heartbeat (the partition rows), the rate history
their housekeeping keeps (``RateSample``: a point a partition each ``RATE_HISTORY_STEP``, for
the last ``RATE_HISTORY_SECONDS``) and the nodes' own rows: one query per table, whatever the
number of queues, so the console can poll it. The
queues are those of :func:`queues.service.permitted_queues` (``read``); a node's partitions
are listed only where their queue is one of them, so a caller without grants sees the nodes
(when shown them at all) and none of the queues.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from django.conf import settings
from django.db.models import Count, F, Sum

from queues.access import Caller
from queues.cluster import clock
from queues.models import Node, Partition, Queue, RateSample
from queues.service.reads import permitted_queues

#: A queue is falling behind when it takes in more than this many times what it acks, with
#: messages waiting (over the owners' last minute).
BEHIND_RATIO = 1.2
#: ... or when its oldest message has waited longer than this many seconds.
BEHIND_AGE = 300.0


class QueueLine(TypedDict):
    """One queue or topic on the overview."""

    id: int
    name: str
    kind: str
    partitions: int
    subscriptions: int
    depth: int
    in_flight: int
    delayed: int
    #: waiting in its dead-letter queue now (None without one) / moved there in all.
    dead_letters: int | None
    dead_lettered_total: int
    oldest_age: float | None
    enqueue_rate: float
    ack_rate: float
    #: the rate history: ``[step start (epoch seconds), enqueue rate, ack rate]``, oldest first,
    #: summed over the queue's partitions
    history: list[tuple[float, float, float]]
    #: partitions with no live owner
    unowned: int
    #: partitions whose owner is cooling (sending enqueues elsewhere)
    cooling: int
    behind: bool


class NodeLine(TypedDict):
    """One node process on the overview."""

    id: str
    address: str
    hostname: str
    pid: int | None
    alive: bool
    cooling: bool
    heartbeat_age: float
    up: float | None
    #: every partition it holds (of any queue), and those of the caller's queues by name
    held: int
    owns: dict[str, list[int]]
    #: messages waiting and in flight in the partitions it holds (of the caller's queues)
    depth: int
    in_flight: int


class Overview(TypedDict):
    at: float
    #: seconds between the points of the queues' ``history`` (0: none kept)
    history_step: float
    queues: list[QueueLine]
    nodes: list[NodeLine]
    alerts: list[str]


def _seconds(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round((now - then).total_seconds(), 3)


def alive_cutoff(now: datetime) -> datetime:
    """A node whose last heartbeat is older than this is not alive (three heartbeats, at least 5 s)."""
    return now - timedelta(seconds=max(5.0, 3 * float(settings.NODE_HEARTBEAT)))


def cluster_overview(
    caller: Caller,
    *,
    with_nodes: bool = True,
    only: Iterable[int] | None = None,
    history_after: float | None = None,
) -> Overview:
    """The overview for ``caller``: its queues (``read``; of those, the ones whose row IDs are in
    ``only`` when given), and the nodes when ``with_nodes`` (the console shows them to a user
    who may view nodes). Each queue's rate history holds the last ``RATE_HISTORY_SECONDS``, or
    only its points after ``history_after`` (epoch seconds: a page that has the earlier ones).
    Heartbeats are read on the cluster's clock (``queues.cluster.clock``)."""
    now = clock.now()
    cutoff = alive_cutoff(now)
    readable = permitted_queues(caller)
    if only is not None:
        readable = readable.filter(pk__in=list(only))
    queues = list(
        readable.order_by("name").values(
            "id", "name", "kind", "partitions", "dead_letter_queue_id", "dead_lettered_total"
        )
    )
    ids = [q["id"] for q in queues]
    nodes = {n.pk: n for n in Node.objects.all()} if with_nodes else {}
    alive = set(Node.objects.filter(stopped_at=None, heartbeat_at__gte=cutoff).values_list("pk", flat=True))
    cooling = set(Node.objects.filter(pk__in=alive, cooling=True).values_list("pk", flat=True))
    subscriptions = dict(
        Queue.objects.filter(pk__in=ids, kind=Queue.Kind.TOPIC)
        .annotate(n=Count("subscriptions"))
        .values_list("pk", "n")
    )
    lines: dict[int, QueueLine] = {}
    oldest: dict[int, datetime] = {}
    for q in queues:
        lines[q["id"]] = {
            "id": q["id"],
            "name": q["name"],
            "kind": q["kind"],
            "partitions": q["partitions"],
            "subscriptions": subscriptions.get(q["id"], 0),
            "depth": 0,
            "in_flight": 0,
            "delayed": 0,
            "dead_letters": None,
            "dead_lettered_total": q["dead_lettered_total"],
            "oldest_age": None,
            "enqueue_rate": 0.0,
            "ack_rate": 0.0,
            "history": [],
            "unowned": 0,
            "cooling": 0,
            "behind": False,
        }
    by_node: dict[str, dict[str, list[int]]] = {}
    node_figures: dict[str, list[int]] = {}
    names = {q["id"]: q["name"] for q in queues}
    for p in Partition.objects.filter(queue_id__in=ids).values(
        "queue_id",
        "index",
        "owner_id",
        "depth",
        "in_flight",
        "delayed",
        "enqueue_rate",
        "ack_rate",
        "oldest_enqueued_at",
    ):
        line = lines[p["queue_id"]]
        line["depth"] += p["depth"]
        line["in_flight"] += p["in_flight"]
        line["delayed"] += p["delayed"]
        line["enqueue_rate"] += p["enqueue_rate"]
        line["ack_rate"] += p["ack_rate"]
        if p["oldest_enqueued_at"] is not None:
            held = oldest.get(p["queue_id"])
            oldest[p["queue_id"]] = min(held, p["oldest_enqueued_at"]) if held else p["oldest_enqueued_at"]
        owner = p["owner_id"]
        if owner is None or owner not in alive:
            line["unowned"] += 1
        elif owner in cooling:
            line["cooling"] += 1
        if owner is not None:
            by_node.setdefault(owner, {}).setdefault(names[p["queue_id"]], []).append(p["index"])
            figures = node_figures.setdefault(owner, [0, 0])
            figures[0] += p["depth"]
            figures[1] += p["in_flight"]
    since = now - timedelta(seconds=settings.RATE_HISTORY_SECONDS)
    if history_after is not None:
        since = max(since, datetime.fromtimestamp(history_after, tz=UTC) + timedelta(microseconds=1))
    points = (
        RateSample.objects.filter(partition__queue_id__in=ids, at__gte=since)
        .values(queue_id=F("partition__queue_id"), step=F("at"))
        .annotate(enq=Sum("enqueue_rate"), ack=Sum("ack_rate"))
        .order_by("queue_id", "step")
    )
    for point in points:
        lines[point["queue_id"]]["history"].append(
            (point["step"].timestamp(), round(point["enq"], 3), round(point["ack"], 3))
        )
    # the dead-letter queues' depth, whoever may read them: the figure belongs to the source
    targets = {q["dead_letter_queue_id"] for q in queues if q["dead_letter_queue_id"] is not None}
    waiting = dict(
        Partition.objects.filter(queue_id__in=targets)
        .values("queue_id")
        .annotate(n=Sum("depth"))
        .values_list("queue_id", "n")
    )
    for q in queues:
        line = lines[q["id"]]
        if q["dead_letter_queue_id"] is not None:
            line["dead_letters"] = waiting.get(q["dead_letter_queue_id"]) or 0
        line["oldest_age"] = _seconds(now, oldest.get(q["id"]))
        line["enqueue_rate"] = round(line["enqueue_rate"], 3)
        line["ack_rate"] = round(line["ack_rate"], 3)
        age = line["oldest_age"] or 0.0
        line["behind"] = (
            line["depth"] > 0
            and (line["enqueue_rate"] > BEHIND_RATIO * line["ack_rate"] or age > BEHIND_AGE)
            and line["kind"] == Queue.Kind.QUEUE
        )

    node_lines: list[NodeLine] = []
    if with_nodes:
        held_all = dict(
            Partition.objects.filter(owner_id__in=list(nodes))
            .values("owner_id")
            .annotate(n=Count("pk"))
            .values_list("owner_id", "n")
        )
        for pk, n in sorted(
            nodes.items(), key=lambda kv: (kv[1].stopped_at is not None, kv[1].address, kv[1].started_at)
        ):
            if n.stopped_at is not None and pk not in by_node and held_all.get(pk, 0) == 0:
                continue  # a stopped node holding nothing: in the nodes' list, not here
            figures = node_figures.get(pk, [0, 0])
            node_lines.append(
                {
                    "id": pk,
                    "address": n.address,
                    "hostname": n.hostname,
                    "pid": n.pid,
                    "alive": pk in alive,
                    "cooling": n.cooling,
                    "heartbeat_age": _seconds(now, n.heartbeat_at) or 0.0,
                    "up": None if n.stopped_at is not None else _seconds(now, n.started_at),
                    "held": held_all.get(pk, 0),
                    "owns": {k: sorted(v) for k, v in sorted(by_node.get(pk, {}).items())},
                    "depth": figures[0],
                    "in_flight": figures[1],
                }
            )
    alerts: list[str] = []
    for line in lines.values():
        what = "topic" if line["kind"] == Queue.Kind.TOPIC else "queue"
        if line["unowned"]:
            alerts.append(
                f"{what} {line['name']}: {line['unowned']} of {line['partitions']} partitions have no live owner"
            )
        if line["cooling"]:
            alerts.append(f"{what} {line['name']}: {line['cooling']} partitions on a cooling node")
        if line["behind"]:
            alerts.append(f"{what} {line['name']}: falling behind")
    for node in node_lines:
        if not node["alive"] and node["held"]:
            alerts.append(f"node {node['address']}: not alive, still named owner of {node['held']} partitions")
        elif node["cooling"] and node["alive"]:
            alerts.append(f"node {node['address']}: cooling")
    return {
        "at": time.time(),
        "history_step": float(settings.RATE_HISTORY_STEP),
        "queues": list(lines.values()),
        "nodes": node_lines,
        "alerts": alerts,
    }
