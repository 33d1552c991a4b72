"""A block of a partition's append tree as its owner sees it: its messages' IDs and states.

The console shows it when an operator clicks a block of the tree drawing. The block records in
the store say which blocks exist; which message is ready, in flight or delayed is known only
to the partition's owner (its managers' memory), so the read is served there, forwarded to
the owner (another node, or a sibling process of this one) like any owner's call.
"""

from __future__ import annotations

import re

from queues.access import Caller
from queues.cluster.router import MAX_HOPS
from queues.engine.partition import BLOCK_LISTING_MAX, BlockListing
from queues.service.errors import Conflict, InvalidRequest
from queues.service.peers import get_peers
from queues.service.runtime import get_runtime
from queues.service.targets import authorize

#: A block ID (``queues.engine.tree.new_block_id``): its ordinal, then 64 random bits.
BLOCK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{16}")


def block_messages(
    queue: str, index: int, block: str, *, caller: Caller, hops: int = 0, limit: int = BLOCK_LISTING_MAX
) -> BlockListing:
    """The messages of block ``block`` of partition ``index`` of ``queue`` (a queue or a topic):
    each one's ID and state per reader (``queues.engine.partition.MESSAGE_STATES``), the first
    ``limit`` positions (at most ``BLOCK_LISTING_MAX``). A block the owner holds no message
    of (all acknowledged, pruned, or never allocated) answers no messages and ``live`` 0;
    ``unscanned`` says the owner has not read it since it took the partition over.

    ``read``; asked of the partition's owner for ``caller``. Changes nothing. Raises
    QueueNotFound, InvalidRequest (``no_such_partition``, ``invalid_block``), Conflict
    (``not_owned``: no live node holds the partition), RemoteError, PeerUnreachable.
    """
    cfg, _ = authorize(queue, "read", caller=caller)
    if not 0 <= index < cfg.partitions:
        raise InvalidRequest(f"{queue} has partitions 0..{cfg.partitions - 1}, not {index}", "no_such_partition")
    if not BLOCK_ID.fullmatch(block):
        raise InvalidRequest(f"{block!r} is not a block ID (<8 hex>-<16 hex>)", "invalid_block")
    limit = max(1, min(limit, BLOCK_LISTING_MAX))
    rt = get_runtime()
    manager = rt.managers.get((cfg.name, index))
    if manager is not None and not manager.closed:
        listing = manager.block_messages(block, limit)
        if listing is None:
            listing = _none_held(block, unscanned=manager.unscanned is not None)
        return listing
    address = rt.router.owner_of(cfg.id, cfg.name, index) if hops < MAX_HOPS else None
    if address is None:
        raise Conflict(f"no live node holds {queue}/{index} now", "not_owned")
    return get_peers().block_messages(address, cfg.name, index, block, limit, hops, caller)


def _none_held(block: str, *, unscanned: bool) -> BlockListing:
    try:
        ordinal = int(block.split("-")[0], 16)
    except ValueError:
        ordinal = -1
    listing: BlockListing = {
        "block": block,
        "ordinal": ordinal,
        "height": -1,
        "size": 0,
        "used": 0,
        "live": 0,
        "created_age": 0.0,
        "head": False,
        "messages": [],
        "more": 0,
    }
    if unscanned:
        listing["unscanned"] = True
    return listing
