"""The Prometheus metrics of a node that count or time events (``prometheus_client``).

Figures that are a state (depth, in flight, who owns a partition) are not kept here: they are
read from the partition managers when ``/metrics`` is scraped (``queues.service.figures``).
What is here is incremented at the one place each event happens:

- messages: enqueued, delivered, redelivered, acked and expired (the partition managers, through
  :data:`MESSAGES`), dead-lettered and dead letters that could not be moved
  (``queues.service.messages``);
- partitions: lease renewals and partitions opened, by takeover or by a claim of a free
  partition, with how long the open took and how many blocks it read (``queues.cluster.node``);
- API calls: latency by operation and status (the fast path, and Django's middleware below);
- the key-value store: call latency and errors by backend and operation (``queues.kv.base``).

A leaf module (``prometheus_client``, no Django: the middleware names only what it reads of
Django's request and response), so the key-value store imports it without cycles and the
engine built on the store stays Django-free. Multiprocess-safe: with
``PROMETHEUS_MULTIPROC_DIR`` set when the process starts, ``prometheus_client`` keeps these
values in memory-mapped files of that folder and ``/metrics`` adds up every process's (see
docs/reference/metrics.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

#: Seconds: API calls and store calls (a store call is often well under a millisecond).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Seconds a partition took to open (a takeover reads O(log N) blocks).
OPEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Blocks read to open a partition.
READ_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)

# --- messages ---------------------------------------------------------------------------------
ENQUEUED = Counter("mq_messages_enqueued", "Messages stored by this node's partitions", ["queue"])
DELIVERED = Counter(
    "mq_messages_delivered",
    "Deliveries made by this node's partitions (first deliveries and redeliveries)",
    ["queue", "subscription"],
)
REDELIVERED = Counter(
    "mq_messages_redelivered",
    "Deliveries of messages whose previous delivery ran out without an ack",
    ["queue", "subscription"],
)
ACKED = Counter("mq_messages_acked", "Messages acknowledged on this node's partitions", ["queue", "subscription"])
DEAD_LETTERED = Counter(
    "mq_messages_dead_lettered",
    "Messages moved to a dead-letter queue past max_receives",
    ["queue", "subscription"],
)
DEAD_LETTER_MOVES_FAILED = Counter(
    "mq_dead_letter_moves_failed",
    "Dead letters whose move to the dead-letter queue failed (each try; the message stays in its queue "
    "and is tried again at a later dequeue)",
    ["queue", "subscription"],
)
EXPIRED = Counter("mq_messages_expired", "Messages removed by retention", ["queue"])

# --- partitions -------------------------------------------------------------------------------
LEASE_RENEWALS = Counter("mq_lease_renewals", "Lease renewals of this node", ["queue", "partition"])
LEASES_LOST = Counter("mq_leases_lost", "Leases this node found taken from it at renewal", ["queue", "partition"])
OPENS = Counter(
    "mq_partition_opens",
    "Partitions opened here: takeover=true when the row still named an owner that stopped renewing",
    ["queue", "partition", "takeover"],
)
OPEN_SECONDS = Histogram(
    "mq_partition_open_seconds",
    "Seconds from the claim to serving dequeues (fence raised, head and oldest block read)",
    ["queue", "takeover"],
    buckets=OPEN_BUCKETS,
)
OPEN_READS = Histogram(
    "mq_partition_open_block_reads",
    "Blocks read to open a partition (O(log N) for a takeover)",
    ["queue", "takeover"],
    buckets=READ_BUCKETS,
)

# --- API calls --------------------------------------------------------------------------------
API_CALLS = Histogram(
    "mq_api_call_seconds",
    "API call latency by operation (the URL's name) and HTTP status",
    ["operation", "status"],
    buckets=LATENCY_BUCKETS,
)

#: Calls this process made of another node (a sibling process of its runnode included): the
#: second hops, by call, which ``bench/throughput.py`` divides by the messages moved.
FORWARDED = Counter("mq_forwarded_calls", "Calls this process forwarded to another node, by call", ["call"])

#: runnode --processes N: connections a process closed to even out the processes (queues.cluster.balance).
CONNECTIONS_SHED = Counter(
    "mq_node_connections_shed",
    "Client connections this process closed so the node's processes share its clients evenly",
)

# --- the key-value store ----------------------------------------------------------------------
STORE_CALLS = Histogram(
    "mq_store_call_seconds",
    "Key-value store call latency by backend and operation",
    ["backend", "operation"],
    buckets=LATENCY_BUCKETS,
)
STORE_ERRORS = Counter(
    "mq_store_errors", "Key-value store calls that failed (fenced writes excluded)", ["backend", "operation"]
)


#: The labelled children already looked up, by metric and label values: ``labels()`` takes a
#: lock and builds a key on every call, and every API call records its figures. No child is
#: ever removed (``remove()`` is not used), so a cached child stays the one ``/metrics`` reads.
_CHILDREN: dict[tuple[object, tuple[str, ...]], Any] = {}


def child(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, looked up once per process and label values."""
    key = (metric, values)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN.setdefault(key, metric.labels(*values))
    return found


def observe_call(operation: str, status: int, started: float) -> None:
    """One API call answered ``status``; ``started`` is its ``time.perf_counter()``."""
    child(API_CALLS, operation, str(status)).observe(time.perf_counter() - started)


class MessageCounts:
    """The partition managers' message counters (``queues.engine.ports.Counters``)."""

    def enqueued(self, queue: str, n: int) -> None:
        child(ENQUEUED, queue).inc(n)

    def delivered(self, queue: str, sub: str, n: int) -> None:
        child(DELIVERED, queue, sub).inc(n)

    def redelivered(self, queue: str, sub: str) -> None:
        child(REDELIVERED, queue, sub).inc()

    def acked(self, queue: str, sub: str, n: int) -> None:
        child(ACKED, queue, sub).inc(n)

    def expired(self, queue: str, n: int) -> None:
        child(EXPIRED, queue).inc(n)


MESSAGES = MessageCounts()


class HttpRequest(Protocol):
    """What the middleware reads of Django's request."""

    path: str


class HttpResponse(Protocol):
    """What the middleware reads of Django's response."""

    status_code: int


class ApiTimingMiddleware:
    """Times every call Django answers under ``/api/``, labelled with the URL's name (the same
    names the fast path uses, so an operation has one series whichever path served it)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        operation = match.url_name if match is not None and match.url_name else "unmatched"
        observe_call(operation, response.status_code, started)
        return response
