"""Who served a call, for the entrances: the record itself is the node runtime's
(:mod:`queues.cluster.served`), where the routing hands a call to this node's partition managers."""

from __future__ import annotations

from queues.cluster.served import active, begin, end, extend, record

__all__ = ["active", "begin", "end", "extend", "record"]
