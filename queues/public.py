"""The core's values and helpers that every entrance may use beside the service layer.

The apps (``sqs``, ``workers``, ``archive``, ``consoles``) reach the core through
``queues.service`` (every operation), ``queues.http`` (the HTTP edge they share with the REST
API), ``queues.errors``, ``queues.access`` (who a caller is and what it may do), the admin's base
classes for their own admin pages, and this module: the domain's plain values, none of its
machinery. The import contracts in ``pyproject.toml`` keep them off the rest of the core
(``queues.kv``, ``engine``, ``cluster``, ``models``, ``api``).

It imports no Django: the worker pipeline and the client side of the workers app use it bare.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypeAlias

from queues.engine.format import read_ack_time
from queues.engine.ids import MessageId, StoredMessage, parse_message_id
from queues.engine.isotime import iso, isoformat
from queues.engine.tree import MAX_BLOCK_SIZE

if TYPE_CHECKING:
    from queues.models import Queue as _Queue

#: A queue's row as the service's functions return it, for annotations only (at run time the
#: name holds a string, not the model): an app reads and changes queues through the service,
#: never through the model's manager.
QueueRow: TypeAlias = "_Queue"

#: A queue's, topic's or subscription's name, unanchored (to build other patterns from).
QUEUE_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,79}"
#: The whole of a name. ``\A``/``\Z``, never ``^``/``$``: ``$`` also matches before a trailing
#: newline, and RegexValidator searches (``"orders\n"`` would pass). The OpenAPI schema's
#: patterns say ``^``/``$``, which ECMA regexes read as whole-string anchors.
QUEUE_NAME_RE = re.compile(rf"\A{QUEUE_NAME}\Z")

#: Limits on a queue's settings, shared by the model, the API and the docs.
LIMITS = {
    "partitions": (1, 256),
    "block_size": (1, MAX_BLOCK_SIZE),
    # Two seconds at the least: a lease is renewed from half its period and acted on until
    # LEASE_SAFETY (80 %) of it, and the 300 ms a 1 s lease leaves for a renewal's round trip
    # to the database was missed now and then by a lone, healthy owner (its calls answered
    # 503 "lease expired on this node").
    "lease_period": (2, 3600),
    "visibility_timeout": (0, 12 * 3600),
    "max_message_size": (1, 1024 * 1024),
    "retention": (60, 14 * 24 * 3600),
    "max_receives": (1, 1000),
    "dedup_window": (0, 24 * 3600),
    "delay": (0, 15 * 60),
    "estimate": (0, 24 * 3600),
}
__all__ = [
    "LIMITS",
    "QUEUE_NAME",
    "QUEUE_NAME_RE",
    "MessageId",
    "QueueRow",
    "StoredMessage",
    "iso",
    "isoformat",
    "parse_message_id",
    "read_ack_time",
]
