"""What a partition manager knows of each of its live blocks (``queues.engine.partition``)."""

from __future__ import annotations

from queues.engine.tree import Block


class BlockState:
    """Which positions of a block still hold unacknowledged messages."""

    __slots__ = ("archived", "block", "live", "newest", "pending", "scanned", "sealed")

    def __init__(self, block: Block, live: set[int], *, sealed: bool, scanned: bool):
        self.block = block
        self.live = live
        #: positions reserved by enqueues whose store write has not finished.
        self.pending = 0
        #: enqueue time of the newest message in the block (for retention).
        self.newest = block.created_at
        #: no position will be written any more (not the head, or the head of a dead owner).
        self.sealed = sealed
        #: read by a scan (found in the store at open), rather than written by this manager.
        self.scanned = scanned
        #: live positions whose stored record is a stub: the message is in the archive.
        self.archived: set[int] = set()
