"""The append tree as a pure data structure: allocation rule, loading, pruned prefixes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queues.engine.tree import BLOCK_GROW_S, MAX_BLOCK_SIZE, AppendTree, Block, next_block_size, root_heights


def _named_tree(n: int) -> tuple[AppendTree, list[Block]]:
    letters = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    tree = AppendTree(4, new_id=lambda ordinal: next(letters), clock=lambda: 0.0)
    blocks = [tree.allocate() for _ in range(n)]
    return tree, blocks


def test_allocation_follows_the_seed_figures():
    # given the first eight blocks
    _, blocks = _named_tree(8)
    by_id = {b.id: b for b in blocks}
    # then the order, kinds, previous and child pointers are those of docs/explanation/design.md
    assert [b.id for b in blocks] == list("ABCDEFGH")
    assert {b.id: b.prev for b in blocks} == {
        "A": None,
        "B": "A",
        "C": None,
        "D": "C",
        "E": "D",
        "F": "C",
        "G": None,
        "H": "G",
    }
    assert [(b.id, b.left, b.right) for b in blocks if not b.is_leaf] == [
        ("C", "A", "B"),
        ("F", "D", "E"),
        ("G", "C", "F"),
    ]
    assert [b.leaf_number for b in blocks if b.is_leaf] == [0, 1, 2, 3, 4]
    assert by_id["G"].height == 2 and by_id["H"].height == 0


def test_block_record_round_trips():
    _, blocks = _named_tree(3)
    assert Block.from_bytes(blocks[2].to_bytes()) == blocks[2]


@pytest.mark.parametrize("n", range(1, 40))
def test_root_heights_match_the_allocation_state(n):
    tree, _blocks = _named_tree(n) if n <= 26 else (None, None)
    if tree is None:
        tree = AppendTree(4)
        for _ in range(n):
            tree.allocate()
    tree._check()
    assert [h for _, h in tree.roots] == root_heights(tree.head)


def _store_of(blocks: list[Block], pruned: int) -> dict[str, Block]:
    """The store after pruning the first ``pruned`` blocks (always a prefix)."""
    return {b.id: b for b in blocks[pruned:]}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_load_and_traverse_over_a_pruned_prefix(n, data):
    # given a tree of n blocks whose oldest `pruned` blocks are gone from the store
    tree = AppendTree(3)
    blocks = [tree.allocate() for _ in range(n)]
    pruned = data.draw(st.integers(0, n - 1), label="pruned")
    store = _store_of(blocks, pruned)
    # when a new owner loads it from the head pointer
    loaded = AppendTree.load(blocks[-1].id, store.get, 3)
    # then it has the same allocation state, and traverses exactly the live blocks in order
    loaded._check()
    assert [h for _, h in loaded.roots] == [h for _, h in tree.roots]
    for (loaded_id, _), (original_id, _) in zip(loaded.roots, tree.roots):
        # a root is known by id if present, or named by a newer root's pointer; never wrong
        assert loaded_id == original_id or (loaded_id is None and original_id not in store)
    assert [b.id for b in loaded.iter_from_oldest(store.get)] == [b.id for b in blocks[pruned:]]
    # and allocation continues exactly as the original tree would have
    for _ in range(data.draw(st.integers(1, 20), label="more")):
        a, b = tree.allocate(), loaded.allocate()
        assert (a.height, a.leaf_number, a.ordinal) == (b.height, b.leaf_number, b.ordinal)
        loaded._check()


def _reads_to_resume(blocks: list[Block], pruned: int) -> tuple[int, int]:
    """Block reads until enqueue can resume (head loaded) and until dequeue can (oldest found)."""
    store = _store_of(blocks, pruned)
    reads = 0

    def read(block_id):
        nonlocal reads
        reads += 1
        return store.get(block_id)

    loaded = AppendTree.load(blocks[-1].id, read, 1)
    head_reads = reads
    oldest = loaded.oldest_live(read)
    assert oldest.id == blocks[pruned].id
    return head_reads, reads


@pytest.mark.slow
def test_block_reads_grow_with_log_n(capsys):
    # given trees of 10^2 .. 10^6 blocks (block size 1: one message per block, the worst case)
    rows = []
    for exp in range(2, 7):
        n = 10**exp
        tree = AppendTree(1, new_id=lambda o: f"{o:08x}-0000000000000000", clock=lambda: 0.0)
        blocks = [tree.allocate() for _ in range(n)]
        worst_head, worst_oldest = 0, 0
        # the worst of a few pruned prefixes: none, a third, all but the head's subtree
        for pruned in (0, n // 3, n // 2, n - 2):
            h, o = _reads_to_resume(blocks, pruned)
            worst_head, worst_oldest = max(worst_head, h), max(worst_oldest, o)
        rows.append((n, worst_head, worst_oldest))
    with capsys.disabled():
        print("\nblocks  reads-to-enqueue  reads-to-dequeue  3*log2(N)+3")
        for n, h, o in rows:
            print(f"{n:>7}  {h:>16}  {o:>16}  {3 * math.log2(n) + 3:>11.1f}")
    # then the head costs at most one read per root, the oldest block one more per level
    # (two where a pruned left subtree must be tried first): O(log N), a few dozen at 10^6
    for n, h, o in rows:
        assert h <= math.log2(n) + 2
        assert o <= 3 * math.log2(n) + 3
    assert rows[-1][2] < 4 * rows[0][2]


@pytest.mark.parametrize(
    ("base", "growth", "previous", "filled_in", "expected"),
    [
        (256, 16, None, None, 256),  # the first block an owner allocates
        (256, 16, 256, None, 256),  # the previous was sealed before it filled
        (256, 16, 256, BLOCK_GROW_S + 0.01, 256),  # filled, slowly
        (256, 16, 256, 0.0, 512),  # filled at once: twice as large
        (256, 16, 2048, BLOCK_GROW_S, 4096),
        (256, 16, 4096, 0.0, 4096),  # at most growth times base
        (1000, 16, 8000, 0.0, MAX_BLOCK_SIZE),  # and MAX_BLOCK_SIZE
        (MAX_BLOCK_SIZE, 16, MAX_BLOCK_SIZE, 0.0, MAX_BLOCK_SIZE),
        (256, 1, 256, 0.0, 256),  # growth 1: always base
        (256, 16, 100, 0.0, 256),  # never below base (a queue's block_size is fixed, but)
    ],
)
def test_next_block_size_doubles_after_a_block_filled_within_a_second(base, growth, previous, filled_in, expected):
    assert next_block_size(base, growth, previous, filled_in) == expected


def test_a_block_may_hold_its_own_number_of_positions():
    # given blocks of 4 by default
    tree = AppendTree(4)
    # when one is allocated with 16 positions
    a, b, c = tree.allocate(), tree.allocate(16), tree.allocate()
    # then its record says so, and the tree's shape does not depend on sizes
    assert (a.size, b.size, c.size) == (4, 16, 4)
    assert Block.from_bytes(b.to_bytes()) == b
    assert c.left == a.id and c.right == b.id
    tree._check()
    with pytest.raises(ValueError):
        tree.allocate(MAX_BLOCK_SIZE + 1)
    with pytest.raises(ValueError):
        tree.allocate(0)
