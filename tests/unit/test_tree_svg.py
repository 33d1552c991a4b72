"""The append-tree drawing: present blocks, pointers, pruned blocks as ghosts, valid SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from queues.admin.tree_svg import collect, render
from queues.engine.keys import block_key
from queues.engine.tree import AppendTree
from queues.kv.memory import MemoryStore

SVG = "{http://www.w3.org/2000/svg}"


def _store_with_tree(n_blocks: int, pruned: int, live_per_block: int = 2):
    store = MemoryStore()
    tree = AppendTree(4)
    blocks = [tree.allocate() for _ in range(n_blocks)]
    for b in blocks[pruned:]:
        store.put(block_key("q", 0, b.id), b.to_bytes())
        for i in range(live_per_block):
            store.put(f"q/0/{b.id}/{i}", b"{}")
    return store, blocks


def test_the_seed_example_is_drawn_with_its_pointers():
    # given A..H, nothing pruned
    store, blocks = _store_with_tree(8, pruned=0)
    # when drawn
    drawn, edges = collect(store, "q", 0, blocks[-1].id)
    svg = ET.fromstring(render(drawn, edges))
    # then every block is there with its live count, and the child and previous pointers
    groups = svg.findall(f"{SVG}g")
    assert len([g for g in groups if g.get("class") == "block"]) == 8
    assert not [g for g in groups if g.get("class") == "pruned"]
    by_id = {b.id: name for b, name in zip(blocks, "ABCDEFGH")}
    child = {(by_id[s], by_id[d]) for k, s, d in edges if k != "prev"}
    prev = {(by_id[s], by_id[d]) for k, s, d in edges if k == "prev"}
    assert child == {("C", "A"), ("C", "B"), ("F", "D"), ("F", "E"), ("G", "C"), ("G", "F")}
    assert prev == {("B", "A"), ("D", "C"), ("E", "D"), ("F", "C"), ("H", "G")}
    assert "2/4" in render(drawn, edges)


def test_pruned_blocks_are_ghosts_and_the_drawing_is_bounded():
    # given 200 blocks whose oldest 150 are pruned
    store, blocks = _store_with_tree(200, pruned=150)
    drawn, edges = collect(store, "q", 0, blocks[-1].id, limit=30, oldest=6)
    svg = ET.fromstring(render(drawn, edges, blocks[-1].id))
    groups = svg.findall(f"{SVG}g")
    kinds = [g.get("class") for g in groups]
    # then the newest 30 present blocks are drawn and the oldest 6, a fold counting those
    # between, and pointers into the pruned prefix end at dashed ghosts
    present = {d.id for d in drawn if d.present}
    assert present == {b.id for b in blocks[-30:] + blocks[150:156]}
    (fold,) = [g for g in groups if g.get("class") == "fold"]
    assert int(fold.get("data-blocks")) == 50 - 30 - 6
    assert kinds.count("pruned") >= 1
    ghosts = {d.id for d in drawn if not d.present}
    assert ghosts <= {b.id for b in blocks[:150]}, "a present block left out is drawn as pruned"
    # and the head and the oldest live block are marked
    marks = {t.get("class"): t.get("data-block") for t in svg.findall(f"{SVG}text") if t.get("data-block")}
    assert marks == {"mark-head": blocks[-1].id, "mark-oldest": blocks[150].id}


def test_an_empty_partition_says_so():
    assert "no blocks yet" in render(*collect(MemoryStore(), "q", 0, None))
