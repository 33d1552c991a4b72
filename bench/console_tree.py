#!/usr/bin/env python
"""How long the console takes to draw a partition's append tree with many live blocks.

It MEASURES AND PRINTS; it never passes or fails. A partition manager (the node's own, on
partition 0 of one queue, ``BLOCK_GROWTH=1`` and ``block_size=1``: one block per message) is
filled with ``--blocks`` messages, none acknowledged, so every block is live; then the drawing a
partition's page shows (``queues.admin.tree_svg``: the head, the newest 40 blocks with their live
counts, the pruned blocks they point to) is read from the store and rendered ``--repeat``
times. Printed: the live blocks, the blocks drawn, the store calls one drawing makes and the
median seconds (read, render). The drawing reads O(40 + log N) blocks, whatever N.

    scripts/in-venv.sh python bench/console_tree.py --blocks 10000
    scripts/with-services.sh python bench/console_tree.py --blocks 10000 --kv redis

``--kv redis`` uses ``REDIS_URL``'s database 1 (flushed); the default is an in-process store.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_DATA_TMP = tempfile.mkdtemp(prefix="treebench-data-")
atexit.register(shutil.rmtree, _DATA_TMP, ignore_errors=True)
os.environ.setdefault("MQ_DATA_DIR", _DATA_TMP)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ["BLOCK_GROWTH"] = "1"  # every block holds block_size messages

import django

django.setup()

from failover import CountingStore

from queues.admin.tree_svg import collect, render
from queues.engine.ids import StoredMessage
from tests.stand_ins import PartitionRow, next_owner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--kv", choices=("memory", "redis"), default="memory")
    args = p.parse_args()
    if args.kv == "redis":
        from queues.kv import open_store

        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0] + "/1"
        import redis

        redis.Redis.from_url(url).flushdb()
        inner = open_store(url)
    else:
        from queues.kv.memory import MemoryStore

        inner = MemoryStore()
    store = CountingStore(inner)
    row = PartitionRow()
    manager = next_owner(store, row, block_size=1, queue="q")
    manager.open()
    now = time.time()
    t = time.perf_counter()
    for start in range(0, args.blocks, 1000):
        manager.enqueue([StoredMessage(f"m{i}", now) for i in range(start, min(args.blocks, start + 1000))])
    filled = time.perf_counter() - t
    live = manager.stats().live_blocks
    reads, renders, calls = [], [], []
    for _ in range(args.repeat):
        before = store.total
        t = time.perf_counter()
        drawn, edges = collect(store, "q", 0, row.head)
        t1 = time.perf_counter()
        svg = render(drawn, edges, row.head)
        reads.append(t1 - t)
        renders.append(time.perf_counter() - t1)
        calls.append(store.total - before)
    print(
        f"{args.kv} store: {live} live blocks (filled in {filled:.1f} s); drawing: {len(drawn)} blocks, "
        f"{calls[-1]} store calls, read {statistics.median(reads) * 1000:.1f} ms, "
        f"render {statistics.median(renders) * 1000:.1f} ms (medians of {args.repeat}), {len(svg):,} bytes of SVG"
    )


if __name__ == "__main__":
    main()
