"""The append tree: the message tracking structure of one partition.

Blocks are immutable once written and each holds ``size`` positions; a message ID is
``<queue>/<partition>/<block id>/<index>``. Blocks are allocated in the order of the seed's
figures::

    A(leaf 000) B(leaf 001) C(parent A,B) D(leaf 010) E(leaf 011) F(parent D,E) G(parent C,F) H(leaf 100)
    previous:  A->none  B->A  C->none  D->C  E->D  F->C  G->none  H->G

After leaf number k, as many parents as k has trailing 1-bits, then the next leaf. A new leaf's
previous pointer is the most recently allocated block; a new parent's is its left child's. So the
blocks, in allocation order, are the post-order of a forest of complete binary trees, and the
previous pointers from the head visit the roots of that forest: O(log N) of them.

Pruning happens in allocation order only: a block is pruned once it and every older block are
fully acknowledged. The pruned blocks are therefore always a *prefix* of the allocation order,
which is what makes traversal over missing blocks sound:

* a missing root on the previous chain means every older block is gone too;
* a missing left child means its whole subtree is gone, so the oldest live block is to the right.

A fully acknowledged block behind an older live one keeps only its small record until the older
one is done (its messages are deleted at ack time); that is the price of the prefix rule.

This module does no I/O: reading a block is a callable passed in, so the same code serves the
partition manager (reading the key-value store) and the unit tests (reading a dict).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from queues.engine.format import refuse
from queues.errors import Fault

BlockReader = Callable[[str], "Block | None"]

#: The most positions a block may hold (a queue's ``block_size`` and a grown block alike): a
#: takeover lists a block's keys in one scan.
MAX_BLOCK_SIZE = 10_000
#: A block that filled within this many seconds of its allocation is followed by one twice its
#: size (see :func:`next_block_size`).
BLOCK_GROW_S = 1.0
#: A grown block still open this long after its allocation is sealed at the next enqueue (its
#: unused positions stay unused): retention removes a block's messages once its newest is past
#: the retention, so growth adds at most this to how long a message may outlive it.
BLOCK_SEAL_S = 2 * BLOCK_GROW_S


def next_block_size(base: int, growth: int, previous: int | None, filled_in: float | None) -> int:
    """Positions of a partition's next block: ``base`` (the queue's ``block_size``), or twice the
    ``previous`` block's when that one filled up within :data:`BLOCK_GROW_S` (``filled_in``,
    None when it did not fill: sealed early, or the first block an owner allocates), up to
    ``growth`` times ``base`` and :data:`MAX_BLOCK_SIZE`.

    A busy partition so allocates a block (a fenced store write and the row's head pointer,
    under the partition's lock) every few thousand messages rather than every ``base``; a
    quiet one keeps blocks of ``base``. Growth 1: every block holds ``base``.
    """
    if previous is None or filled_in is None or filled_in > BLOCK_GROW_S:
        return base
    return max(base, min(previous * 2, base * growth, MAX_BLOCK_SIZE))


def new_block_id(ordinal: int) -> str:
    """``<ordinal, hex>-<64 random bits>``: sortable by age, never equal across two writers."""
    return f"{ordinal:08x}-{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class Block:
    #: ``<ordinal hex>-<random hex>``; the random part keeps two owners' blocks apart.
    id: str
    #: position in allocation order, 0 for the first block of the partition.
    ordinal: int
    #: 0 for a leaf, h for a parent of two complete subtrees of height h-1.
    height: int
    #: number (from 0) of the newest leaf in the tree when this block was allocated.
    leaf_number: int
    #: previous pointer: the previous root (see the module docstring), or None.
    prev: str | None
    #: child pointers, None for a leaf.
    left: str | None
    right: str | None
    #: positions (message indexes) this block holds.
    size: int
    #: wall-clock time of allocation (seconds since the epoch), for ages in the console.
    created_at: float

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            [
                self.id,
                self.ordinal,
                self.height,
                self.leaf_number,
                self.prev,
                self.left,
                self.right,
                self.size,
                self.created_at,
            ]
        )

    @classmethod
    def from_bytes(cls, raw: bytes, key: str = "") -> Block:
        """The record stored under ``key`` (for the error only). Raises ``StoredFormatTooNew``
        for a record of a later format version (``queues.engine.format``: version 1 is a list)."""
        record = orjson.loads(raw)
        if type(record) is not list:
            refuse(key, "block", record)
        return cls(*record)

    @property
    def is_leaf(self) -> bool:
        return self.height == 0


def root_heights(head: Block) -> list[int]:
    """Heights of the complete subtrees (oldest first) once ``head`` has been allocated.

    Leaves 0..k-1 were fully merged before leaf k was added, so they form one subtree per set
    bit of k. A head of height h has absorbed the bits of k below h; the bits at h and above
    are still separate roots. O(log N), no reads.
    """
    k = head.leaf_number
    heights = [bit for bit in range(k.bit_length() - 1, head.height - 1, -1) if k >> bit & 1]
    heights.append(head.height)
    return heights


class AppendTree:
    """Allocation state of a partition's append tree, plus the blocks it knows.

    ``roots`` is the stack of complete subtrees, oldest first, as ``[block id, height]``; its
    top is the head. The next block is a parent of the top two roots when their heights are
    equal, else a new leaf.
    """

    def __init__(
        self, block_size: int, *, new_id: Callable[[int], str] = new_block_id, clock: Callable[[], float] = time.time
    ):
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.block_size = block_size
        self._new_id = new_id
        self._clock = clock
        self.roots: list[tuple[str | None, int]] = []
        #: every block this tree has allocated or read, by id (the live ones, once pruned ones
        #: are forgotten).
        self.blocks: dict[str, Block] = {}
        self.head: Block | None = None
        #: blocks whose records were read from the store (a count, for the O(log N) claims).
        self.reads = 0

    # --- allocation ---------------------------------------------------------------------------
    def allocate(self, size: int | None = None) -> Block:
        """Allocate the next block by the leaf-counter rule and make it the head, with ``size``
        positions (default: ``block_size``). O(1)."""
        size = self.block_size if size is None else size
        if not 1 <= size <= MAX_BLOCK_SIZE:
            raise ValueError(f"a block holds 1 to {MAX_BLOCK_SIZE} positions, not {size}")
        head = self.head
        ordinal = 0 if head is None else head.ordinal + 1
        leaf_number = -1 if head is None else head.leaf_number
        if len(self.roots) >= 2 and self.roots[-1][1] == self.roots[-2][1]:
            (left_id, height), (right_id, _) = self.roots[-2], self.roots[-1]
            left = self.blocks.get(left_id) if left_id is not None else None
            # A parent's previous pointer is its left child's. When the left child has been
            # pruned, so has everything older (prefix rule), and the pointer leads nowhere.
            prev = left.prev if left is not None else None
            block = Block(
                self._new_id(ordinal),
                ordinal,
                height + 1,
                leaf_number,
                prev,
                left_id,
                right_id,
                size,
                self._clock(),
            )
            del self.roots[-2:]
            self.roots.append((block.id, height + 1))
        else:
            prev = head.id if head is not None else None
            block = Block(self._new_id(ordinal), ordinal, 0, leaf_number + 1, prev, None, None, size, self._clock())
            self.roots.append((block.id, 0))
        self.blocks[block.id] = block
        self.head = block
        return block

    def checkpoint(self) -> tuple[list[tuple[str | None, int]], Block | None]:
        """The allocation state, for :meth:`rollback`. O(log N) (the roots)."""
        return list(self.roots), self.head

    def rollback(self, checkpoint: tuple[list[tuple[str | None, int]], Block | None]) -> None:
        """Forget the blocks allocated since ``checkpoint``, as if they never were: the next
        allocation takes their ordinals again, under new IDs. For blocks the store or the head
        pointer never confirmed; nothing may have been written into them. O(log N) plus the
        blocks forgotten."""
        roots, head = checkpoint
        newest = head.ordinal if head is not None else -1
        for block_id in [i for i, b in self.blocks.items() if b.ordinal > newest]:
            del self.blocks[block_id]
        self.roots, self.head = roots, head

    # --- loading after a takeover -------------------------------------------------------------
    @classmethod
    def load(cls, head_id: str | None, read: BlockReader, block_size: int, **kwargs: Any) -> AppendTree:
        """Rebuild the allocation state from the head pointer. O(log N) block reads.

        Follows previous pointers from the head to collect the roots. A root that is missing
        was pruned, and with it everything older, so the walk stops there.
        """
        tree = cls(block_size, **kwargs)
        if head_id is None:
            return tree
        head = tree._read(head_id, read)
        if head is None:
            raise CorruptTree(f"head block {head_id} is missing")
        heights = root_heights(head)
        ids: list[str | None] = [head.id]
        block = head
        # One read per root older than the head; the pointer of the last one read names the
        # next even when that one is gone, so ids and heights stay aligned.
        for _ in range(len(heights) - 1):
            prev_id = block.prev
            if prev_id is None:
                break
            ids.append(prev_id)
            nxt = tree._read(prev_id, read)
            if nxt is None:
                break
            block = nxt
        ids.reverse()
        # Roots older than the oldest id we know were pruned with everything before them.
        # They keep their place in the stack (their heights decide future merges) with no id.
        missing = len(heights) - len(ids)
        roots: list[tuple[str | None, int]] = [
            (ids[i - missing] if i >= missing else None, height) for i, height in enumerate(heights)
        ]
        tree.roots = roots
        tree.head = head
        return tree

    def _read(self, block_id: str, read: BlockReader) -> Block | None:
        block = self.blocks.get(block_id)
        if block is not None:
            return block
        self.reads += 1
        block = read(block_id)
        if block is not None:
            self.blocks[block_id] = block
        return block

    def oldest_live(self, read: BlockReader) -> Block | None:
        """The oldest block still present, by descending from the oldest present root. O(log N)."""
        for block in self.iter_from_oldest(read):
            return block
        return None

    def iter_from_oldest(self, read: BlockReader, *, upto: int | None = None) -> Iterator[Block]:
        """Present blocks in allocation order (post-order), oldest first, reading as it goes.

        Reaching the first block costs O(log N) reads; each further block costs one read.
        ``upto`` stops after the block with that ordinal.
        """
        for root_id, _height in list(self.roots):
            root = self._read(root_id, read) if root_id is not None else None
            if root is None:
                continue
            for block in self._postorder(root, read):
                if upto is not None and block.ordinal > upto:
                    return
                yield block

    def _postorder(self, root: Block, read: BlockReader) -> Iterator[Block]:
        # Iterative post-order over present blocks; a missing child means a pruned subtree.
        # A right child is read only once its left sibling's subtree is done, so reaching the
        # oldest block reads one block per level.
        LEFT, RIGHT, SELF = 0, 1, 2
        stack: list[list[Any]] = [[root, LEFT]]  # [block, the next step]
        while stack:
            frame = stack[-1]
            block, step = frame
            if block.is_leaf or step == SELF:
                stack.pop()
                yield block
                continue
            frame[1] = step + 1
            child_id = block.right if step == RIGHT else block.left
            child = self._read(child_id, read) if child_id else None
            if child is not None:
                stack.append([child, LEFT])

    def forget(self, block_id: str) -> None:
        """Drop a pruned block from memory (its pointer may still name it)."""
        self.blocks.pop(block_id, None)

    # --- invariants ---------------------------------------------------------------------------
    def _check(self) -> None:
        """Assert the structural invariants of the allocation state (for tests)."""
        heights = [h for _, h in self.roots]
        # Heights never increase towards the head, except the top pair awaiting a merge.
        for i in range(len(heights) - 2):
            assert heights[i] > heights[i + 1], heights
        if self.head is not None:
            assert self.roots[-1][0] == self.head.id
            assert heights == root_heights(self.head), (heights, root_heights(self.head))


# --- the head record ---------------------------------------------------------------------------
def head_record(epoch: int, head_id: str | None) -> bytes:
    """What the store keeps beside the fence (``queues.engine.keys.head_key``): the newest block and the
    epoch of the owner that allocated it. The owner writes it in the same fenced write as the
    block itself, so the store alone leads to its newest blocks (None: an emptied tree)."""
    return orjson.dumps([epoch, head_id])


def parse_head_record(raw: bytes | None, key: str = "") -> tuple[int, str | None] | None:
    """``(epoch, head id)`` of a stored head record (under ``key``: for the error only); None
    when the store has none (no block allocated in the partition since the record was
    introduced). Raises ``StoredFormatTooNew`` for a record of a later format version
    (``queues.engine.format``: version 1 is a list)."""
    if raw is None:
        return None
    record = orjson.loads(raw)
    if type(record) is not list:
        refuse(key, "head", record)
    epoch, head_id = record
    return int(epoch), head_id or None


def newest_head(row_head: str | None, record: tuple[int, str | None] | None, read: BlockReader) -> str | None:
    """The head a new owner loads: the newer of the partition row's pointer and the store's
    head record. At most two block reads, and none when they agree (the usual case).

    The record is written with the block it names, under the fence, and the row only after
    both: with both stores as they were written, the record is never behind the row. It can
    be behind only when it was written by an owner older than the record (an upgrade), and
    the row can be behind when the database was restored from a backup or rebuilt. So: a head
    whose block is gone is not a candidate (the row's pointer into a tree that was pruned or
    purged since, or into blocks a restored store never had); of two that are present, the
    later in allocation order (ordinal), the record's on a tie. No record: the row's.
    """
    if record is None:
        return row_head
    stored = record[1]
    if row_head is None or row_head == stored:
        return stored
    row_block = read(row_head)
    if row_block is None:
        return stored  # (a missing record head too: CorruptTree, at load)
    if stored is None:
        return row_head  # an emptied tree (purge) with newer blocks: written by an older owner
    stored_block = read(stored)
    if stored_block is None or row_block.ordinal > stored_block.ordinal:
        return row_head
    return stored


class CorruptTree(Fault):
    """The store does not hold the tree the partition row points at."""
