"""A drawing of a partition's append tree, rendered on the server as SVG.

It is read from the key-value store, not from the owner's memory, so any node's admin can
draw any partition: the head pointer from the row, then the blocks by their pointers, the
newest ``limit`` of them, and when there are more, the oldest few (where the oldest live block
is) with a fold between. A pointer to a block that is gone (pruned) is drawn as a dashed
ghost. Each present block shows how many of its positions still hold messages (one scan);
what each of them is (ready, in flight, delayed...) only the owner knows
(``queues.service.block_messages``: the page asks it when a block is clicked).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from queues.engine.keys import block_key
from queues.engine.tree import AppendTree, Block
from queues.kv import KeyValueStore
from queues.models import Partition

BOX_W, BOX_H, GAP_X, LEVEL_H, MARGIN = 64, 34, 14, 64, 24
#: Width of the fold that stands for the blocks not drawn between the oldest and the newest.
FOLD_W = 120
#: Oldest present blocks drawn beside the newest ones when the tree holds more than those.
OLDEST_DRAWN = 6


@dataclass
class Drawn:
    id: str
    ordinal: int
    height: int
    present: bool
    live: int | None
    size: int | None
    x: float = 0.0
    y: float = 0.0


def collect(
    store: KeyValueStore, queue: str, index: int, head_id: str | None, limit: int = 40, oldest: int = OLDEST_DRAWN
) -> tuple[list[Drawn], list[tuple[str, str, str]]]:
    """The newest ``limit`` blocks (present or pruned) and the pointers between them; when the
    tree holds more, also its ``oldest`` oldest present blocks (the oldest live block first:
    O(log N) reads to reach it), the blocks between them left undrawn (see :func:`render`)."""
    if not head_id:
        return [], []

    def read(block_id: str) -> Block | None:
        key = block_key(queue, index, block_id)
        raw = store.get(key)
        return Block.from_bytes(raw, key) if raw is not None else None

    tree = AppendTree.load(head_id, read, 1)
    present: dict[str, Block] = {}
    # Newest first: the head, then each root's subtree from its right side.
    stack = [rid for rid, _ in tree.roots if rid is not None]
    seen: set[str] = set()
    missing: set[str] = set()
    while stack and len(present) < limit:
        block_id = stack.pop()
        if block_id in seen:
            continue
        seen.add(block_id)
        block = tree.blocks.get(block_id) or read(block_id)
        if block is None:
            missing.add(block_id)
            continue
        present[block_id] = block
        for child in (block.left, block.right):
            if child:
                stack.append(child)  # noqa: PERF401 - a depth-first walk: the stack is popped meanwhile
    if stack and oldest > 0:  # more blocks than drawn: the oldest ones too
        newest_drawn = min(b.ordinal for b in present.values())
        for block in tree.iter_from_oldest(read):
            if block.ordinal >= newest_drawn or len(present) >= limit + oldest:
                break
            present[block.id] = block
    edges: list[tuple[str, str, str]] = []
    ghosts: set[str] = set()
    for block in present.values():
        for kind, target in (("left", block.left), ("right", block.right), ("prev", block.prev)):
            if not target:
                continue
            if target not in present:
                # A block not drawn: pruned (a dashed ghost), or present and left out of the
                # drawing (no pointer drawn to it).
                if target not in missing and (tree.blocks.get(target) or read(target)) is not None:
                    continue
                missing.add(target)
                ghosts.add(target)
            edges.append((kind, block.id, target))
    drawn = [
        Drawn(b.id, b.ordinal, b.height, True, len(store.scan(f"{queue}/{index}/{b.id}")), b.size)
        for b in present.values()
    ]
    for ghost_id in ghosts:
        try:
            ordinal = int(ghost_id.split("-")[0], 16)
        except ValueError:
            ordinal = -1
        drawn.append(Drawn(ghost_id, ordinal, _height_of(ghost_id, present), False, None, None))
    return drawn, edges


def _height_of(block_id: str, present: dict[str, Block]) -> int:
    for b in present.values():
        if block_id in (b.left, b.right):
            return b.height - 1
    return 0


def render(drawn: list[Drawn], edges: list[tuple[str, str, str]], head: str | None = None) -> str:
    """Blocks left to right in allocation order, parents above their children; a fold stands for
    the blocks left out between the oldest and the newest drawn. The drawing has a ``viewBox``:
    the page scales it (zoom, or fit to its box) by setting its width and height. The ``head``
    block (the newest) and the oldest block drawn that still holds messages (with the oldest
    blocks drawn, the partition's oldest live block) are marked above their boxes; a present
    block is a button (``tabindex``) that the page shows the messages of when clicked."""
    if not drawn:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" width="320" height="40"><text x="8" y="24">'
            "no blocks yet</text></svg>"
        )
    drawn.sort(key=lambda d: d.ordinal)
    top = max(d.height for d in drawn)
    # Between two present blocks drawn whose ordinals are not consecutive lie present blocks
    # left out (pruning only ever removes the oldest): a fold that says how many.
    folds: list[tuple[float, int]] = []
    x = float(MARGIN)
    previous: Drawn | None = None
    for d in drawn:
        if previous is not None and previous.present and d.present and d.ordinal > previous.ordinal + 1:
            folds.append((x, d.ordinal - previous.ordinal - 1))
            x += FOLD_W + GAP_X
        d.x = x
        d.y = MARGIN + (top - max(d.height, 0)) * LEVEL_H
        x += BOX_W + GAP_X
        previous = d
    at = {d.id: d for d in drawn}
    width = int(x) + MARGIN
    height = MARGIN * 2 + (top + 1) * LEVEL_H + 20
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" class="append-tree" '
            'font-family="monospace" font-size="10" role="img" aria-label="append tree">'
        ),
        (
            '<defs><marker id="arrow" viewBox="0 0 6 6" refX="6" refY="3" markerWidth="6" markerHeight="6" '
            'orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#888"/></marker></defs>'
        ),
    ]
    for kind, src, dst in edges:
        a, b = at[src], at[dst]
        x1, y1 = a.x + BOX_W / 2, a.y + BOX_H
        if kind == "prev":
            x1, y1 = a.x, a.y + BOX_H / 2
            x2, y2 = b.x + BOX_W, b.y + BOX_H / 2
            mid = (x1 + x2) / 2
            out.append(
                f'<path class="prev" d="M{x1},{y1} C{mid},{y1 + 30} {mid},{y2 + 30} {x2},{y2}" '
                'fill="none" stroke="#aaa" stroke-dasharray="3,3" marker-end="url(#arrow)"/>'
            )
        else:
            x2, y2 = b.x + BOX_W / 2, b.y
            out.append(f'<line class="child" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#555"/>')
    for fx, count in folds:
        fy = MARGIN + top * LEVEL_H
        out.append(
            f'<g class="fold" data-blocks="{count}"><title>{count:,} blocks not drawn</title>'
            f'<rect x="{fx}" y="{fy}" width="{FOLD_W}" height="{BOX_H}" rx="4" fill="#fafafa" '
            'stroke="#999" stroke-dasharray="2,4"/>'
            f'<text x="{fx + FOLD_W / 2}" y="{fy + 21}" text-anchor="middle" fill="#555">'
            f"\u22ef {count:,} blocks \u22ef</text></g>"
        )
    oldest = min((d for d in drawn if d.present and d.live), key=lambda d: d.ordinal, default=None)
    marks: dict[str, list[str]] = {}
    if head in at:
        marks.setdefault(head, []).append("head")
    if oldest is not None:
        marks.setdefault(oldest.id, []).append("oldest live")
    for block_id, names in marks.items():
        d = at[block_id]
        classes = " ".join(f"mark-{n.split()[0]}" for n in names)
        out.append(
            f'<text class="{classes}" data-block="{escape(block_id)}" x="{d.x + 2}" y="{d.y - 4}" '
            f'fill="#ba2121">{", ".join(names)}</text>'
        )
    for d in drawn:
        label = escape(d.id.split("-")[0].lstrip("0") or "0")
        title = escape(d.id)
        if d.present:
            fill = "#e8f3e8" if d.live else "#f4f4f4"
            out.append(
                f'<g class="block" data-id="{title}" tabindex="0" role="button"><title>{title}: {d.live}/{d.size} live</title>'
                f'<rect x="{d.x}" y="{d.y}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                f'fill="{fill}" stroke="#333"/>'
                f'<text x="{d.x + 4}" y="{d.y + 13}">#{label}</text>'
                f'<text x="{d.x + 4}" y="{d.y + 27}">{d.live}/{d.size}</text></g>'
            )
        else:
            out.append(
                f'<g class="pruned" data-id="{title}"><title>{title}: pruned</title>'
                f'<rect x="{d.x}" y="{d.y}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="none" '
                f'stroke="#bbb" stroke-dasharray="4,3"/>'
                f'<text x="{d.x + 4}" y="{d.y + 20}" fill="#999">gone</text></g>'
            )
    out.append("</svg>")
    return "".join(out)


def partition_svg(partition: Partition, store: KeyValueStore, limit: int = 40) -> str:
    drawn, edges = collect(store, partition.queue.name, partition.index, partition.head_block or None, limit)
    return render(drawn, edges, partition.head_block or None)
