#!/usr/bin/env python
"""Failover benchmark: how long a new owner takes to resume a deep partition.

It MEASURES AND PRINTS; it never passes or fails.

docs/explanation/correctness.md, invariant 5: after a takeover, enqueues resume as soon as the head block is loaded,
and dequeues once the oldest live block is reached: O(log N) blocks from the head.

For each depth N (default 10^3, 10^4, 10^5, 10^6 messages in one partition):
  1. build: a PartitionManager with epoch 1 enqueues N small messages in batches (--batch per
     call) on a real key-value store, then acks the oldest ``--acked-fraction`` of them,
     oldest first, in batches, so the fully acknowledged blocks at the front are pruned and
     the tree has a pruned prefix (the realistic case); optionally (``--redelivered K``)
     delivers the K oldest unacked messages twice, so K receive counts sit in the store;
  2. takeover, ``--repeat`` times: a NEW PartitionManager (epoch 2, 3, ...: each one raises the
     fence) opens the partition from the head pointer, then does one real enqueue and one real
     dequeue (+ the body read). Measured:
       - blocks read to enqueue-ready / dequeue-ready (``opened_in`` head_reads / oldest_reads);
       - store round trips to the same two points (every store is wrapped in a counting proxy;
         each KeyValueStore primitive is one round trip; the row's head-pointer read, a DB
         query in production, is not a store call and is not counted);
       - s to enqueue: from the start of open() to the end of the first enqueue;
       - s to dequeue: open() plus the first dequeue (with its body read), the enqueue's
         duration left out, as if the dequeue had been the first call;
       - open()'s own enqueue_ready_s / dequeue_ready_s for comparison.
     Checked (reported, not asserted): the first dequeued message is the oldest unacked one,
     with its body; the takeover's enqueue goes into a fresh block; the epoch-1 owner is fenced.
Medians over the repeats are printed, then the growth of the dequeue-resume time and of the
blocks read from the smallest to the largest depth, beside the log2 ratios (log N growth) and
the N ratio (what a linear scan would cost).

Backends: memory (queues.kv.memory.MemoryStore), redis (RedisStore on db --redis-db of
--redis-url, FLUSHED at start and after each depth), file (FileStore in a temp dir; one file per
message and an fsync per batch, so keep its depths small).

Examples:
  python bench/failover.py --backend memory
  python bench/failover.py --backend redis --redis-url redis://127.0.0.1:63897 --block-size 16
  python bench/failover.py --backend file --depths 1000,10000
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# tests.stand_ins.next_owner builds its lease with queues.cluster.leases, which imports the Django
# models: set Django up, with a throwaway data dir so that nothing under data/ is touched. No
# database is used.
_DATA_TMP = tempfile.mkdtemp(prefix="fobench-data-")
atexit.register(shutil.rmtree, _DATA_TMP, ignore_errors=True)
os.environ.setdefault("MQ_DATA_DIR", _DATA_TMP)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from common import exit_on_sigterm, log

from queues.engine import partition as partition_mod
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.partition import PartitionManager, PartitionUnavailable
from queues.kv.base import Fence, KeyValueStore
from tests.stand_ins import PartitionRow, next_owner

# --------------------------------------------------------------------------------------
# the store proxy and the takeover
# --------------------------------------------------------------------------------------


class CountingStore(KeyValueStore):
    """Delegates every primitive to ``inner`` and counts it: one primitive, one round trip.

    The conveniences of the base class (get, put, advance_fence, ...) are inherited, so they
    reach ``inner`` through the counted primitives, as they do in every backend.
    """

    def __init__(self, inner: KeyValueStore):
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.total = 0
        #: seconds spent inside the store's primitives (round trips, for a remote store).
        self.seconds = 0.0

    def _timed(self, name: str, fn, *a, **kw):
        # An empty batch makes no round trip in the real backends (MemoryStore counts it).
        if not (name in ("get_many", "put_many", "delete_many") and len(a[0]) == 0):
            self.calls[name] += 1
            self.total += 1
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - t

    def get_many(self, keys):
        return self._timed("get_many", self.inner.get_many, keys)

    def put_many(self, items, *, fence: Fence | None = None):
        return self._timed("put_many", self.inner.put_many, items, fence=fence)

    def delete_many(self, keys, *, fence: Fence | None = None):
        return self._timed("delete_many", self.inner.delete_many, keys, fence=fence)

    def compare_and_set(self, key, expected, value):
        return self._timed("compare_and_set", self.inner.compare_and_set, key, expected, value)

    def scan(self, bucket):
        return self._timed("scan", self.inner.scan, bucket)

    def delete_prefix(self, prefix):
        return self._timed("delete_prefix", self.inner.delete_prefix, prefix)

    def close(self):
        self.inner.close()


class MarkedManager(PartitionManager):
    """A PartitionManager that notes the store's call count and the time at the moment its
    own code declares enqueues (and dequeues) ready: the flags are properties here."""

    @property
    def enqueue_ready(self) -> bool:
        return self._bench_enqueue_ready

    @enqueue_ready.setter
    def enqueue_ready(self, value: bool) -> None:
        self._bench_enqueue_ready = value
        if value:
            self.bench_enqueue_mark = (time.perf_counter(), self.store.total)

    @property
    def dequeue_ready(self) -> bool:
        return self._bench_dequeue_ready

    @dequeue_ready.setter
    def dequeue_ready(self, value: bool) -> None:
        self._bench_dequeue_ready = value
        if value:
            self.bench_dequeue_mark = (time.perf_counter(), self.store.total)


def new_manager(store: CountingStore, row: PartitionRow, queue: str, block_size: int) -> PartitionManager:
    return next_owner(
        store, row, block_size=block_size, queue=queue, node_id=f"node-{row.epoch + 1}", manager=MarkedManager
    )


# --------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------


class Backend:
    def __init__(self, args):
        self.kind = args.backend
        self.args = args
        self.client = None
        self.tmp: str | None = None
        if self.kind == "redis":
            import redis

            self.client = redis.Redis.from_url(args.redis_url, db=args.redis_db)
            self.client.ping()
            self.client.flushdb()
        self.description = self._describe()

    def describe(self) -> str:
        return self.description

    def _describe(self) -> str:
        if self.kind == "redis":
            info = self.client.info("server")
            return f"redis {info.get('redis_version')} at {self.args.redis_url} db {self.args.redis_db}"
        if self.kind == "file":
            return f"file store in {tempfile.gettempdir()}"
        return "in-process MemoryStore"

    def fresh(self) -> KeyValueStore:
        if self.kind == "memory":
            from queues.kv.memory import MemoryStore

            return MemoryStore()
        if self.kind == "redis":
            from queues.kv.redis import RedisStore

            self.client.flushdb()
            return RedisStore(self.client)
        from queues.kv.filesystem import FileStore

        self.tmp = tempfile.mkdtemp(prefix="fobench-kv-")
        return FileStore(self.tmp)

    def done_with(self, store: KeyValueStore) -> None:
        if self.kind == "redis":
            self.client.flushdb()
        elif self.kind == "file":
            store.close()
            if self.tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = None

    def close(self) -> None:
        if self.client is not None:
            self.client.flushdb()
            self.client.close()


# --------------------------------------------------------------------------------------
# one depth
# --------------------------------------------------------------------------------------


def build(store: CountingStore, row: PartitionRow, queue: str, depth: int, args) -> dict:
    """Epoch 1 enqueues ``depth`` messages and acks the oldest fraction. Returns facts."""
    m = new_manager(store, row, queue, args.block_size)
    m.open()
    t0 = time.perf_counter()
    ids: list[str] = []
    now = time.time()
    for start in range(0, depth, args.batch):
        n = min(args.batch, depth - start)
        ids.extend(m.enqueue([StoredMessage(f"m{start + i}", now) for i in range(n)]))
    t_enq = time.perf_counter() - t0
    n_acked = min(depth, round(depth * args.acked_fraction))
    t1 = time.perf_counter()
    for start in range(0, n_acked, args.batch):
        chunk = ids[start : min(start + args.batch, n_acked)]
        m.ack([(parse_message_id(mid), None) for mid in chunk])
    t_ack = time.perf_counter() - t1
    # Optionally leave receive counts behind (read whole by open()): deliver the oldest
    # unacked messages once, let their visibility timeout pass (the partition module's clock is
    # moved an hour on, as the unit tests do), and deliver them again: a redelivery each.
    n_redel = min(args.redelivered, depth - n_acked)
    if n_redel:
        delivered = 0
        while delivered < n_redel:
            got = m.dequeue(min(args.batch, n_redel - delivered), 60.0)
            if not got:
                break
            delivered += len(got)
        real_clock = partition_mod.monotonic
        partition_mod.monotonic = lambda: real_clock() + 3600.0
        try:
            again = 0
            while again < delivered:
                got = m.dequeue(min(args.batch, delivered - again), 7200.0)
                if not got:
                    break
                again += len(got)
        finally:
            partition_mod.monotonic = real_clock
        n_redel = again
    head = m.tree.head
    live_blocks = len(store.inner.scan(f"{queue}/0/_blocks"))
    oldest_unacked = ids[n_acked] if n_acked < depth else None
    facts = {
        "builder": m,
        "allocated": head.ordinal + 1,
        "live_blocks": live_blocks,
        "roots": len(m.tree.roots),
        "height": max(h for _, h in m.tree.roots) + 1,
        "acked": n_acked,
        "redelivered": n_redel,
        "oldest_unacked": oldest_unacked,
        "oldest_body": f"m{n_acked}" if oldest_unacked else None,
        "head_ordinal": head.ordinal,
        "build_enqueue_s": t_enq,
        "build_ack_s": t_ack,
    }
    del ids
    return facts


def takeover(store: CountingStore, row: PartitionRow, queue: str, facts: dict, args) -> dict:
    """One new owner: open, one enqueue, one dequeue. Times, reads, round trips, checks."""
    gc.collect()
    if args.settle > 0:
        time.sleep(args.settle)
    m = new_manager(store, row, queue, args.block_size)
    c0 = store.total
    st0 = store.seconds
    t0 = time.perf_counter()
    m.open()
    t_open = time.perf_counter()
    c_open = store.total
    st_open = store.seconds - st0
    ids = m.enqueue([StoredMessage(f"takeover-epoch-{m.lease.epoch}", time.time())])
    t_enq = time.perf_counter()
    c_enq = store.total
    got = m.load_bodies(m.dequeue(1, 30.0))
    t_deq = time.perf_counter()
    c_deq = store.total

    first = got[0] if got else None
    if facts["oldest_unacked"] is None:
        # everything was acknowledged: the first delivery is the takeover's own message
        want_id, want_body = ids[0], f"takeover-epoch-{m.lease.epoch}"
    else:
        want_id, want_body = facts["oldest_unacked"], facts["oldest_body"]
    ok_first = first is not None and first.id == want_id and first.message.body == want_body
    new_block = parse_message_id(ids[0]).block
    ok_fresh = ids[0].endswith("/0") and int(new_block.split("-")[0], 16) > facts["head_ordinal"]
    facts["head_ordinal"] = m.tree.head.ordinal
    return {
        "epoch": m.lease.epoch,
        "head_reads": m.opened_in["head_reads"],
        "oldest_reads": m.opened_in["oldest_reads"],
        "open_enqueue_ready_s": m.opened_in["enqueue_ready_s"],
        "open_dequeue_ready_s": m.opened_in["dequeue_ready_s"],
        "mark_enqueue_ready_s": m.bench_enqueue_mark[0] - t0,
        "mark_dequeue_ready_s": m.bench_dequeue_mark[0] - t0,
        "s_enqueue": t_enq - t0,
        "s_dequeue": (t_open - t0) + (t_deq - t_enq),
        "rt_enqueue_ready": m.bench_enqueue_mark[1] - c0,
        "rt_dequeue_ready": m.bench_dequeue_mark[1] - c0,
        "rt_enqueue": (c_open - c0) + (c_enq - c_open),
        "rt_dequeue": (c_open - c0) + (c_deq - c_enq),
        "store_open_s": st_open,
        "ok_first": ok_first,
        "first_id": first.id if first else None,
        "want_id": want_id,
        "ok_fresh": ok_fresh,
        "manager": m,
    }


def stale_owner_fenced(builder: PartitionManager) -> bool:
    """The epoch-1 owner, still believing its lease, must be refused by the fence."""
    try:
        builder.enqueue([StoredMessage("from the stale owner", time.time())])
    except PartitionUnavailable:
        return True
    return False


def run_depth(backend: Backend, depth: int, args) -> dict:
    inner = backend.fresh()
    store = CountingStore(inner)
    row = PartitionRow()
    queue = f"fo-{depth}-b{args.block_size}"
    log(
        f"depth {depth:,}: building (block size {args.block_size}, batch {args.batch}, "
        f"acked fraction {args.acked_fraction})"
    )
    facts = build(store, row, queue, depth, args)
    log(
        f"depth {depth:,}: built in {facts['build_enqueue_s']:.1f}s enqueue + "
        f"{facts['build_ack_s']:.1f}s ack; {facts['allocated']:,} blocks allocated, "
        f"{facts['live_blocks']:,} live, {facts['roots']} roots, height {facts['height']}, "
        f"{facts['acked']:,} acked, {facts['redelivered']:,} redelivered"
    )
    builder = facts.pop("builder")
    runs = []
    fenced = None
    for r in range(args.repeat):
        res = takeover(store, row, queue, facts, args)
        if r == 0:
            fenced = stale_owner_fenced(builder)
            del builder
        res.pop("manager")
        runs.append(res)
        log(
            f"depth {depth:,} takeover {r + 1}/{args.repeat} (epoch {res['epoch']}): "
            f"reads {res['head_reads']}/{res['oldest_reads']}, rt {res['rt_enqueue_ready']}/"
            f"{res['rt_dequeue_ready']}, s_enq {res['s_enqueue'] * 1e3:.3f} ms, "
            f"s_deq {res['s_dequeue'] * 1e3:.3f} ms, store in open {res['store_open_s'] * 1e3:.3f} ms, first ok {res['ok_first']}"
        )
        if not res["ok_first"]:
            log(f"  MISMATCH: first delivered {res['first_id']}, oldest unacked {res['want_id']}")
    backend.done_with(inner)
    gc.collect()

    def med(key):
        return statistics.median(r[key] for r in runs)

    return {
        "depth": depth,
        "allocated": facts["allocated"],
        "live_blocks": facts["live_blocks"],
        "height": facts["height"],
        "roots": facts["roots"],
        "build_s": facts["build_enqueue_s"] + facts["build_ack_s"],
        **{
            k: med(k)
            for k in (
                "head_reads",
                "oldest_reads",
                "s_enqueue",
                "s_dequeue",
                "open_enqueue_ready_s",
                "open_dequeue_ready_s",
                "rt_enqueue_ready",
                "rt_dequeue_ready",
                "rt_enqueue",
                "rt_dequeue",
                "store_open_s",
            )
        },
        "ok_first": sum(r["ok_first"] for r in runs),
        "ok_fresh": sum(r["ok_fresh"] for r in runs),
        "fenced": fenced,
        "repeat": len(runs),
    }


# --------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def print_table(rows: list[dict], args, backend: Backend) -> None:
    print()
    print(
        f"Failover: {backend.describe()}; block size {args.block_size}; "
        f"acked fraction {args.acked_fraction}; redelivered {args.redelivered}; medians of {args.repeat} takeovers"
    )
    hdr = (
        "depth",
        "blocks alloc",
        "blocks live",
        "height",
        "reads enq",
        "reads deq",
        "rt enq",
        "rt deq",
        "ms to enq",
        "ms to deq",
        "open enq-ready ms",
        "open deq-ready ms",
        "store ms in open",
        "first=oldest",
        "fresh blk",
        "stale fenced",
        "build s",
    )
    lines = [hdr]
    for r in rows:
        lines.append(
            (
                f"{r['depth']:,}",
                f"{r['allocated']:,}",
                f"{r['live_blocks']:,}",
                str(r["height"]),
                f"{r['head_reads']:g}",
                f"{r['oldest_reads']:g}",
                f"{r['rt_enqueue_ready']:g}/{r['rt_enqueue']:g}",
                f"{r['rt_dequeue_ready']:g}/{r['rt_dequeue']:g}",
                ms(r["s_enqueue"]),
                ms(r["s_dequeue"]),
                ms(r["open_enqueue_ready_s"]),
                ms(r["open_dequeue_ready_s"]),
                ms(r["store_open_s"]),
                f"{r['ok_first']}/{r['repeat']}",
                f"{r['ok_fresh']}/{r['repeat']}",
                "yes" if r["fenced"] else "NO",
                f"{r['build_s']:.1f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(hdr))]
    for i, line in enumerate(lines):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(
        "reads enq/deq: blocks read until enqueue-ready / dequeue-ready (opened_in head_reads, "
        "oldest_reads). rt enq/deq: store round trips until ready / until the first enqueue or "
        "dequeue (with its body read) is done. ms to enq: open() start -> first enqueue done; "
        "ms to deq: open() + first dequeue. open ...-ready ms: open()'s own opened_in figures; store ms in open: time inside store calls "
        "during open()."
    )
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        n_ratio = b["depth"] / a["depth"]
        log_ratio = math.log2(b["depth"]) / math.log2(a["depth"])
        blk_log_ratio = math.log2(b["allocated"]) / math.log2(a["allocated"]) if a["allocated"] > 1 else float("nan")
        t_ratio = b["s_dequeue"] / a["s_dequeue"] if a["s_dequeue"] else float("nan")
        o_ratio = b["open_dequeue_ready_s"] / a["open_dequeue_ready_s"] if a["open_dequeue_ready_s"] else float("nan")
        r_ratio = b["oldest_reads"] / a["oldest_reads"] if a["oldest_reads"] else float("nan")
        print(
            f"growth {a['depth']:,} -> {b['depth']:,}: dequeue-resume time x{t_ratio:.2f} "
            f"(open() alone x{o_ratio:.2f}), blocks read x{r_ratio:.2f}; "
            f"log2 N ratio {log_ratio:.2f}, log2 blocks ratio {blk_log_ratio:.2f}, N ratio {n_ratio:,.0f}"
        )


def parse_depths(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        if part.startswith("1e"):
            out.append(10 ** int(part[2:]))
        else:
            out.append(int(float(part)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=("redis", "memory", "file"), default="redis")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--redis-db", type=int, default=7, help="flushed at start, between depths and at the end")
    p.add_argument("--depths", default="1e3,1e4,1e5,1e6", help="comma-separated, e.g. 1000,1e5")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--batch", type=int, default=1000, help="messages per enqueue / ack call while building")
    p.add_argument("--acked-fraction", type=float, default=0.5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--redelivered",
        type=int,
        default=0,
        help="leave this many of the oldest unacked messages redelivered once (their receive "
        "counts are in the store, and open() reads them all)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds to pause before each takeover (lets the store finish background work)",
    )
    p.add_argument(
        "--log",
        action="store_true",
        help="keep the queues loggers at INFO (open() logs a line, which is then timed too)",
    )
    args = p.parse_args(argv)
    if not 0.0 <= args.acked_fraction <= 1.0:
        p.error("--acked-fraction must be within [0, 1]")
    if args.repeat < 1 or args.batch < 1 or args.block_size < 1:
        p.error("--repeat, --batch and --block-size must be at least 1")
    depths = parse_depths(args.depths)

    if not args.log:
        logging.getLogger("queues").setLevel(logging.ERROR)
    backend = Backend(args)
    log(f"backend: {backend.describe()}")
    rows = []
    try:
        # One untimed round on a small partition first: the first takeovers of a process run
        # measurably slower (connections, script cache, interpreter warm-up).
        log("warm-up round (not reported)")
        run_depth(backend, 1000, argparse.Namespace(**{**vars(args), "repeat": 3}))
        for depth in depths:
            rows.append(run_depth(backend, depth, args))
    finally:
        backend.close()
    print_table(rows, args, backend)
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
