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

``--browser``: the whole page instead, as an operator opens it. A node (``runnode``, on
``DATABASE_URL`` and ``REDIS_URL``'s database ``--kv-redis-db``, ``BLOCK_GROWTH=1``) gets a queue
of one partition with ``block_size`` 1 and ``--blocks`` messages (batches of 1,000: one block
each); headless Chromium (the browser the e2e tests drive, ``MQ_CHROMIUM`` /
``MQ_CHROMEDRIVER``) logs in and opens the partition's page ``--repeat`` times. Printed, as
medians: the seconds from asking for the page until its drawing is there (the browser's
load event: the page, its styles and scripts), and the navigation timing's time to the first
byte (the server drawing the tree) and to DOMContentLoaded. The ``1`` line beside it is the
same page with a tree of one block.

    scripts/with-services.sh python bench/console_tree.py --browser --blocks 10000 --repeat 7
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

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


def browser_main(args: argparse.Namespace) -> None:
    """``--browser``: the partition's page in headless Chromium (see the module's text)."""
    from common import BenchNode, exit_on_sigterm, log

    from tests.e2e.conftest import CHROMEDRIVER, CHROMIUM

    exit_on_sigterm()
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    redis_url = os.environ.get("MQ_TEST_REDIS_URL") or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    database_url = os.environ.get("DATABASE_URL") or os.environ.get("MQ_TEST_PG_URL", "")
    if not database_url:
        raise SystemExit("--browser needs DATABASE_URL (run it under scripts/with-services.sh)")
    node = BenchNode(
        "tree",
        "redis",
        database_url=database_url,
        redis_url=redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url,
        kv_redis_db=args.kv_redis_db,
        extra_env=["BLOCK_GROWTH=1", "NODE_HEARTBEAT=0.5", "DEBUG=0"],
    )
    password = uuid.uuid4().hex
    driver = None
    node.start()
    try:
        node.manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            f"u = get_user_model().objects.get(username={node.user!r})\n"
            f"u.set_password({password!r}); u.save()\n",
        )
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        profile = tempfile.mkdtemp(prefix="treebench-chromium-")
        atexit.register(shutil.rmtree, profile, ignore_errors=True)
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--window-size=1400,1000",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(60)
        driver.get(f"{node.url}/admin/login/?next=/admin/")
        driver.find_element(By.ID, "id_username").send_keys(node.user)
        driver.find_element(By.ID, "id_password").send_keys(password)
        driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        WebDriverWait(driver, 30).until(EC.presence_of_element_located((By.ID, "user-tools")))
        for blocks in sorted({1, args.blocks}):
            name = f"treebench-{uuid.uuid4().hex[:8]}"
            status, body = node.api(
                "POST", "/api/v1/queues", {"name": name, "partitions": 1, "block_size": 1, "lease_period": 30}
            )
            if status != 201:
                raise SystemExit(f"queue not made: {status} {body[:300]!r}")
            t = time.perf_counter()
            for start in range(0, blocks, 1000):
                batch = [{"body": str(i)} for i in range(start, min(blocks, start + 1000))]
                status, body = node.api("POST", f"/api/v1/queues/{name}/enqueue", {"messages": batch}, timeout=120)
                if status != 201:
                    raise SystemExit(f"enqueue refused: {status} {body[:300]!r}")
            filled = time.perf_counter() - t
            url = _partition_page(node, name)
            walls, ttfb, dcl = [], [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                driver.get(url)  # returns at the load event
                WebDriverWait(driver, 30).until(
                    EC.presence_of_element_located((By.CSS_SELECTOR, ".field-tree svg text.mark-head"))
                )
                walls.append(time.perf_counter() - t)
                nav = driver.execute_script(
                    "const n = performance.getEntriesByType('navigation')[0];"
                    "return [n.responseStart - n.startTime, n.domContentLoadedEventEnd - n.startTime];"
                )
                ttfb.append(nav[0] / 1000)
                dcl.append(nav[1] / 1000)
            drawn = len(driver.find_elements(By.CSS_SELECTOR, ".field-tree svg g.block"))
            folded = [int(g.get_attribute("data-blocks")) for g in driver.find_elements(By.CSS_SELECTOR, "g.fold")]
            print(
                f"browser, {blocks} live blocks (enqueued in {filled:.1f} s; {drawn} drawn, {sum(folded):,} folded): "
                f"page with its drawing {statistics.median(walls):.3f} s (min {min(walls):.3f}, "
                f"max {max(walls):.3f}), first byte {statistics.median(ttfb):.3f} s, "
                f"DOMContentLoaded {statistics.median(dcl):.3f} s (medians of {args.repeat})",
                flush=True,
            )
            node.api("DELETE", f"/api/v1/queues/{name}")
    finally:
        if driver is not None:
            driver.quit()
        log("stopping the node")
        node.stop()


def _partition_page(node: Any, name: str) -> str:
    """The URL of partition 0's page, once the node owns it (its row has an owner)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = node.api("GET", f"/api/v1/queues/{name}/partitions")
        if status == 200:
            parts = json.loads(body)["partitions"]
            if parts and parts[0].get("owner"):
                break
        time.sleep(0.2)
    out = node.manage(
        "shell",
        "-c",
        f"from queues.models import Partition\nprint('PK=%d' % Partition.objects.get(queue__name={name!r}, index=0).pk)",
    )
    return f"{node.url}/admin/queues/partition/{out.split('PK=')[1].split()[0]}/change/"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--kv", choices=("memory", "redis"), default="memory")
    p.add_argument("--browser", action="store_true", help="open the page in headless Chromium (see above)")
    p.add_argument("--kv-redis-db", type=int, default=1, help="--browser: the node's Redis database")
    args = p.parse_args()
    if args.browser:
        browser_main(args)
        return
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
