"""The cluster's clock: this node's wall clock, set by the database's.

Nodes read times other nodes wrote: a heartbeat says whether a node is alive, and a forwarded
call's signature carries its time, accepted within ``CLUSTER_CLOCK_SKEW``. A node's wall clock
may be minutes off (a host whose NTP failed): that must neither make a live node look dead (its
partitions would wait for a share nobody takes) nor refuse its forwarded calls, so those times
are read on one clock for all, the database's. Each heartbeat reads it (PostgreSQL's
``clock_timestamp()``) and keeps the offset to this node's wall clock; between heartbeats this
node's clock carries it (one whose rate is 10 % off drifts 0.1 s over a one-second heartbeat).
The offset is the middle of the read's round trip, so it is off by at most half that trip.

Leases do not use it: they trust each node's monotonic clock alone (``queues.cluster.leases``).
On a database other than PostgreSQL (SQLite: one machine, one clock) the offset stays 0.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

#: seconds to add to this node's wall clock to read the database's (last measured)
_offset = 0.0


def offset() -> float:
    """Seconds the database's clock is ahead of this node's wall clock (negative: behind)."""
    return _offset


def time_s() -> float:
    """The cluster's time, in Unix seconds."""
    return time.time() + _offset


def now() -> datetime:
    """The cluster's time, aware (UTC)."""
    return timezone.now() + timedelta(seconds=_offset)


def measure() -> float:
    """Read the database's clock and keep the offset; the offset. Raises what the database
    raises when it is down (the caller's heartbeat handles that as an outage)."""
    global _offset
    if connection.vendor != "postgresql":
        return _offset
    with connection.cursor() as cursor:
        before = time.time()
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        after = time.time()
        (database,) = cursor.fetchone()
    _offset = float(database) - (before + after) / 2
    return _offset
