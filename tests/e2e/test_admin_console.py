"""An operator's walk through the admin console in headless Chromium, against a real node.

Log in, open a queue, its partitions and a partition's append-tree drawing (a block's
messages, and a tree of 10^4 blocks), then the dashboards. What the pages show is checked against state the test made itself (its own
message IDs, the rows, the store), and every step leaves a screenshot under
``artifacts/screenshots/<test>/``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from queues.engine.keys import incarnation
from tests.integration.nodes import Client
from tests.launcher import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BLOCK_SIZE = 4
#: Live blocks of the large tree drawn (one message each).
TREE_BLOCKS = 10_000


def _wait(driver, condition, timeout: float = 15):
    return WebDriverWait(driver, timeout).until(condition)


def log_in(browser, base: str, username: str, password: str) -> None:
    browser.get(f"{base}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys(username)
    browser.find_element(By.ID, "id_password").send_keys(password)
    browser.shot("login form")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    _wait(browser, EC.presence_of_element_located((By.ID, "user-tools")))
    assert_styled(browser)
    browser.shot("admin index")


def assert_styled(browser) -> None:
    """The admin's CSS loaded (served by WhiteNoise from the node): the header is coloured."""
    loaded = browser.execute_script(
        "return [...document.styleSheets].filter(s => s.href && s.href.includes('/static/admin/css/'))"
        ".map(s => { try { return s.cssRules.length } catch (e) { return -1 } })"
    )
    assert loaded and all(n > 0 for n in loaded), f"admin stylesheets missing or empty: {loaded}"
    background = browser.execute_script("return getComputedStyle(document.getElementById('header')).backgroundColor")
    assert background not in ("", "transparent", "rgba(0, 0, 0, 0)"), background


_CHART_GEOMETRY = """
const box = b => [b.x, b.y, b.x + b.width, b.y + b.height];
return [...document.querySelectorAll('svg.chart')].map(svg => ({
    title: svg.querySelector('.chart-title').textContent,
    width: svg.viewBox.baseVal.width,
    title_box: box(svg.querySelector('.chart-title').getBBox()),
    legend: [...svg.querySelectorAll('.legend > *')].map(e => box(e.getBBox())),
    x_labels: [...svg.querySelectorAll('.x-label')].map(e => box(e.getBBox())),
}));
"""


def assert_charts_laid_out(browser) -> None:
    """In every chart as the browser drew it (its own text metrics): the legend clear of the
    title, every x label inside the drawing. The latency chart has three series: a legend."""
    charts = browser.execute_script(_CHART_GEOMETRY)
    assert charts, "no charts"
    for chart in charts:
        t = chart["title_box"]
        for b in chart["legend"]:
            assert b[2] <= t[0] or t[2] <= b[0] or b[3] <= t[1] or t[3] <= b[1], (chart["title"], t, b)
        for b in chart["x_labels"]:
            assert b[0] >= 0 and b[2] <= chart["width"], (chart["title"], b, chart["width"])
    latency = [c for c in charts if c["title"].startswith("End-to-end latency")]
    assert len(latency) == 1 and len(latency[0]["legend"]) == 6 and len(latency[0]["x_labels"]) == 6, latency


#: The tree drawing's own box (the element that scrolls it) and the form row it sits in.
_TREE_BOX = """
const svg = arguments[0], row = svg.closest('.form-row');
let box = svg.parentElement;
while (box !== row && getComputedStyle(box).overflowX === 'visible') box = box.parentElement;
const b = box.getBoundingClientRect(), r = row.getBoundingClientRect();
return {svg: svg.getBoundingClientRect().width, box: [b.left, b.right], row: [r.left, r.right],
        scroll: box.scrollWidth, client: box.clientWidth, overflow: getComputedStyle(box).overflowX};
"""


def make_queue(client: Client, partitions: int, **fields) -> str:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    r = client.post("queues", {"name": name, "partitions": partitions, **fields})
    assert r.status_code == 201, r.text

    def all_owned() -> bool:
        r = client.get(f"queues/{name}/partitions")
        return r.status_code == 200 and all(p["owner"] for p in r.json()["partitions"])

    wait_until(all_owned, 20, f"the node to own {name}'s partitions")
    return name


def _empty_store(name: str) -> None:
    from queues.kv import get_store
    from queues.models import Queue

    for pk in Queue.objects.filter(name=name).values_list("pk", flat=True):
        get_store().within(incarnation(pk)).delete_prefix(name)


def block_of(mid: str) -> tuple[int, str]:
    _, partition, block, _ = mid.split("/")
    return int(partition), block


@pytest.mark.node(env={"BLOCK_GROWTH": "1"})  # every block of 4: many blocks to draw
def test_queue_partitions_and_tree(browser, node, token, admin_login):
    from queues.kv import get_store
    from queues.models import Partition, Queue

    # given a queue of 3 partitions with 4-message blocks, 240 messages, and the oldest
    # four blocks of each partition fully acknowledged (so pruned), the rest still held
    client = Client(node.url, token)
    name = make_queue(client, 3, block_size=BLOCK_SIZE, visibility_timeout=300)
    try:
        ids: list[str] = []
        for batch in range(24):  # about 16 live blocks a partition: a drawing wider than its row
            r = client.post(f"queues/{name}/enqueue", {"messages": [{"body": f"{batch}:{i}"} for i in range(10)]})
            assert r.status_code == 201, r.text
            ids.extend(r.json()["ids"])
        delivered: list[dict] = []
        for _ in range(20):
            got = client.post(f"queues/{name}/dequeue", {"max": 1000, "visibility_timeout": 300}).json()["messages"]
            delivered.extend(got)
            if len(delivered) == len(ids) or not got:
                break
        assert sorted(m["id"] for m in delivered) == sorted(ids)

        def ordinal(mid: str) -> int:
            return int(block_of(mid)[1].split("-")[0], 16)

        to_ack = [m for m in delivered if ordinal(m["id"]) < 4]
        r = client.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in to_ack]})
        assert r.status_code == 200 and r.json()["acked"] == len(to_ack), r.text
        acked = {m["id"] for m in to_ack}
        live = Counter(block_of(m) for m in ids if m not in acked)  # (partition, block) -> live messages
        pruned = {block_of(m) for m in acked} - set(live)
        # the partition with the most live blocks gets drawn
        index = Counter(p for p, _ in live).most_common(1)[0][0]
        live_here = {b: n for (p, b), n in live.items() if p == index}
        pruned_here = {b for p, b in pruned if p == index}
        assert len(live_here) >= 5 and pruned_here, (live_here, pruned_here)
        queue = Queue.objects.get(name=name)

        def row() -> Partition:
            return Partition.objects.get(queue=queue, index=index)

        wait_until(lambda: row().live_blocks == len(live_here), 10, "the owner to publish its live blocks")
        # the store agrees: the drawn partition's block records are exactly the live blocks
        store = get_store().within(incarnation(queue.pk))
        assert set(store.scan(f"{name}/{index}/_blocks")) == set(live_here)

        # when an operator logs in and opens the queue
        base = node.url
        log_in(browser, base, *admin_login)
        browser.find_element(By.CSS_SELECTOR, "a[href='/admin/queues/queue/']").click()
        _wait(browser, EC.presence_of_element_located((By.ID, "result_list")))
        browser.shot("queue list")
        browser.find_element(By.CSS_SELECTOR, f"#result_list a[href^='/admin/queues/queue/{queue.pk}/change/']").click()
        _wait(browser, EC.url_contains(f"/admin/queues/queue/{queue.pk}/change/"))
        assert_styled(browser)
        # then the queue page lists its partitions with their owner, from the rows
        inline_rows = browser.find_elements(By.CSS_SELECTOR, "#partition_set-group tbody tr.has_original")
        browser.shot("queue page")
        assert len(inline_rows) == 3, browser.page_source[:2000]
        owner = Partition.objects.get(queue=queue, index=0).owner.address
        assert owner in browser.find_element(By.ID, "partition_set-group").text

        # when they open the queue's partitions
        browser.get(f"{base}/admin/queues/partition/?queue__id__exact={queue.pk}")
        rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        browser.shot("partition list")
        assert len(rows) == 3
        listing = browser.find_element(By.ID, "result_list").text
        for p in Partition.objects.filter(queue=queue):
            assert str(p) in listing and p.owner.address in listing
        # and one partition's page
        browser.find_element(
            By.CSS_SELECTOR, f"#result_list a[href^='/admin/queues/partition/{row().pk}/change/']"
        ).click()
        _wait(browser, EC.url_contains(f"/admin/queues/partition/{row().pk}/change/"))
        svg = _wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, ".field-tree svg")))
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", svg)
        browser.shot("partition tree")
        assert_styled(browser)
        # then the drawing has one box per live block, labelled with the messages the test
        # left in it, and dashed ghosts for pruned blocks that live ones still point to
        drawn = {}
        for g in svg.find_elements(By.CSS_SELECTOR, "g.block"):
            texts = [t.get_attribute("textContent") for t in g.find_elements(By.CSS_SELECTOR, "text")]
            drawn[g.get_attribute("data-id")] = texts
        assert set(drawn) == set(live_here)
        for block, texts in drawn.items():
            assert texts[-1] == f"{live_here[block]}/{BLOCK_SIZE}", (block, texts)
        ghosts = {g.get_attribute("data-id") for g in svg.find_elements(By.CSS_SELECTOR, "g.pruned")}
        assert ghosts and ghosts <= pruned_here, (ghosts, pruned_here)
        assert row().head_block in drawn
        assert len(svg.find_elements(By.CSS_SELECTOR, "rect")) == len(drawn) + len(ghosts)
        # it is really painted: the drawing has a size on the page
        assert svg.size["width"] > 100 and svg.size["height"] > 50, svg.size
        # and all of it can be reached: a drawing wider than its row scrolls sideways in its own
        # box, which ends inside the row (the row hides what overflows it)
        fit = browser.execute_script(_TREE_BOX, svg)
        assert fit["box"][1] <= fit["row"][1] + 1, fit
        assert fit["scroll"] >= fit["svg"] - 1, fit
        assert fit["scroll"] <= fit["client"] or fit["overflow"] in ("auto", "scroll"), fit
        # where the head and the oldest block still holding messages are is marked
        assert svg.find_elements(By.CSS_SELECTOR, "text.mark-head"), "no head mark"
        assert svg.find_elements(By.CSS_SELECTOR, "text.mark-oldest"), "no oldest live mark"
        # and it zooms: "+" draws it larger, "fit" puts all of it inside its box
        before = svg.size["width"]
        browser.find_element(By.CSS_SELECTOR, ".tree-controls [data-zoom=in]").click()
        assert svg.size["width"] > before * 1.2, (before, svg.size)
        browser.find_element(By.CSS_SELECTOR, ".tree-controls [data-zoom=fit]").click()
        fit = browser.execute_script(_TREE_BOX, svg)
        assert fit["svg"] <= fit["client"] and fit["scroll"] <= fit["client"] + 1, fit
        browser.shot("partition tree, fitted")

        # when one message of the head block is acknowledged, and the operator clicks the block
        head = row().head_block
        in_head = sorted((m for m in delivered if block_of(m["id"]) == (index, head)), key=lambda m: position(m["id"]))
        assert len(in_head) >= 2, in_head
        r = client.post(
            f"queues/{name}/ack", {"messages": [{"id": in_head[0]["id"], "receipt": in_head[0]["receipt"]}]}
        )
        assert r.status_code == 200 and r.json()["acked"] == 1, r.text
        browser.find_element(By.CSS_SELECTOR, f".field-tree g.block[data-id='{head}']").click()
        panel = browser.find_element(By.CSS_SELECTOR, ".tree-block-panel")
        _wait(browser, lambda _: panel.get_attribute("data-loaded") == head)
        browser.shot("a block's messages")
        # then the panel beside the drawing lists its messages' IDs and states, from the owner:
        # the one acknowledged is gone, the others in flight (dequeued above)
        shown = {
            li.get_attribute("data-id"): li.find_element(By.CSS_SELECTOR, ".state").get_attribute("data-state")
            for li in panel.find_elements(By.CSS_SELECTOR, "li")
        }
        assert shown == {in_head[0]["id"]: "gone", **{m["id"]: "in_flight" for m in in_head[1:]}}, shown
        assert panel.is_displayed() and in_head[1]["id"] in panel.text and "in flight" in panel.text
        # and what a node that does not own the partition asks of the owner (a signed call
        # for the console's user) is the same list, refused for a user without a grant
        _forwarded_block_read(node, admin_login[0], name, index, head, shown)
    finally:
        _empty_store(name)
    _ten_thousand_blocks(browser, node, client)


def position(mid: str) -> int:
    return int(mid.rsplit("/", 1)[1])


def _forwarded_block_read(node, operator: str, name: str, index: int, block: str, expected: dict[str, str]) -> None:
    from django.contrib.auth.models import User

    from queues.access import Caller
    from queues.api.peers import HttpPeers
    from queues.service import RemoteError

    address = node.url.split("://", 1)[1]
    as_operator = Caller.of(User.objects.get(username=operator))
    listing = HttpPeers().block_messages(address, name, index, block, 1000, 0, as_operator)
    assert {m["id"]: m["states"][""] for m in listing["messages"]} == expected
    stranger = User.objects.create(username=f"stranger-{uuid.uuid4().hex[:6]}", is_staff=True)
    with pytest.raises(RemoteError) as refused:
        HttpPeers().block_messages(address, name, index, block, 1000, 0, Caller.of(stranger))
    assert refused.value.status == 404, refused.value.payload


def _ten_thousand_blocks(browser, node, client: Client) -> None:
    """A tree of 10^4 live blocks (on the node of test_queue_partitions_and_tree, whose blocks
    hold block_size messages: no node started for it alone)."""
    from queues.models import Partition

    # given a partition of 10^4 blocks of one message (a batch enqueue of 1,000 allocates
    # 1,000 blocks), the oldest 3 acknowledged
    name = make_queue(client, 1, block_size=1, visibility_timeout=300)
    try:
        t = time.perf_counter()
        ids: list[str] = []
        for start in range(0, TREE_BLOCKS, 1000):
            r = client.post(
                f"queues/{name}/enqueue", {"messages": [{"body": str(i)} for i in range(start, start + 1000)]}
            )
            assert r.status_code == 201, r.text
            ids.extend(r.json()["ids"])
        filled = time.perf_counter() - t
        got = client.post(f"queues/{name}/dequeue", {"max": 3, "visibility_timeout": 300}).json()["messages"]
        assert [m["id"] for m in got] == ids[:3]
        r = client.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
        assert r.status_code == 200 and r.json()["acked"] == 3, r.text
        p = Partition.objects.get(queue__name=name, index=0)
        assert p.head_block == block_of(ids[-1])[1]
        # when the operator opens the partition's page
        t = time.perf_counter()
        browser.get(f"{node.url}/admin/queues/partition/{p.pk}/change/")
        svg = _wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, ".field-tree svg")))
        loaded = time.perf_counter() - t
        print(f"{TREE_BLOCKS} blocks: enqueued in {filled:.1f} s; the page loaded in {loaded:.2f} s")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", svg)
        browser.shot("a tree of 10^4 blocks")
        # then the drawing marks the head (the newest block) and the oldest block still holding
        # a message, with a fold for the blocks between them left undrawn
        marks = {
            t.get_attribute("class"): t.get_attribute("data-block")
            for t in svg.find_elements(By.CSS_SELECTOR, "text.mark-head, text.mark-oldest")
        }
        assert marks == {"mark-head": block_of(ids[-1])[1], "mark-oldest": block_of(ids[3])[1]}, marks
        (fold,) = svg.find_elements(By.CSS_SELECTOR, "g.fold")
        drawn = svg.find_elements(By.CSS_SELECTOR, "g.block")
        # (every block drawn or counted in the fold; the 3 acknowledged ones may be pruned already)
        assert TREE_BLOCKS - 3 <= int(fold.get_attribute("data-blocks")) + len(drawn) <= TREE_BLOCKS, len(drawn)
        assert fold.is_displayed() and "blocks" in fold.text
        # and "oldest live" lists that block's message, ready to be delivered
        browser.find_element(By.CSS_SELECTOR, ".tree-controls [data-goto=oldest]").click()
        panel = browser.find_element(By.CSS_SELECTOR, ".tree-block-panel")
        _wait(browser, lambda _: panel.get_attribute("data-loaded") == block_of(ids[3])[1])
        browser.shot("a tree of 10^4 blocks, its oldest live block")
        (item,) = panel.find_elements(By.CSS_SELECTOR, "li")
        assert item.get_attribute("data-id") == ids[3], item.text
        assert item.find_element(By.CSS_SELECTOR, ".state").get_attribute("data-state") == "ready"
    finally:
        _empty_store(name)


def test_dashboards(browser, node, token, admin_login):
    # The dashboards page (consoles, admin:dashboards) after `manage.py refresh_dashboards`:
    # a Spark job in local mode, the slow part of this test (20-35 s).
    from django.core.management import call_command
    from django.urls import reverse
    from django.utils import timezone

    from archive.models import ArchivedMessage
    from queues.models import Queue
    from workers.models import AttemptLog, Consumer

    # given a queue and a few hundred attempts of its messages by two workers
    client = Client(node.url, token)
    name = make_queue(client, 2)
    try:
        now = timezone.now()
        workers = [
            Consumer.objects.create(
                id=f"w-{uuid.uuid4().hex[:8]}", name=f"celery@e2e-{k}", queues=[name], last_heartbeat=now
            )
            for k in range(2)
        ]
        has_enqueued_at = any(f.name == "enqueued_at" for f in AttemptLog._meta.get_fields())
        rng = random.Random(6)
        rows = []
        for i in range(300):
            start = now - timedelta(minutes=60) + timedelta(seconds=12 * i)
            pre = rng.uniform(0.05, 0.5)
            proc = rng.uniform(0.2, 3.0)
            outcome = rng.choices(["succeeded", "failed", "timed_out", "abandoned"], [85, 8, 4, 3])[0]
            partition = i % 2
            fields = {
                "message_id": f"{name}/{partition}/{i // BLOCK_SIZE:08x}-e2e/{i % BLOCK_SIZE}",
                "queue": name,
                "partition": partition,
                "group": f"g{i % 5}",
                "worker": workers[i % 2],
                "attempt": 2 if i % 7 == 0 else 1,
                "outcome": outcome,
                "size": rng.randrange(100, 5000),
                "preprocess_started_at": start,
                "preprocess_ended_at": start + timedelta(seconds=pre),
                "process_started_at": start + timedelta(seconds=pre),
                "process_ended_at": start + timedelta(seconds=pre + proc),
            }
            if has_enqueued_at:
                fields["enqueued_at"] = start - timedelta(seconds=rng.uniform(0.1, 5))
            rows.append(AttemptLog(**fields))
        AttemptLog.objects.bulk_create(rows)
        # and acknowledged messages in the archive, for the end-to-end latency chart
        ArchivedMessage.objects.bulk_create(
            ArchivedMessage(
                message_id=f"{name}/0/{i:08x}-e2e-archived/0",
                queue=name,
                partition=0,
                body="x",
                enqueued_at=now - timedelta(minutes=60) + timedelta(seconds=30 * i),
                acked_at=now - timedelta(minutes=60) + timedelta(seconds=30 * i + rng.uniform(0.5, 9)),
            )
            for i in range(100)
        )
        # when the figures are computed and an operator opens the dashboards
        call_command("refresh_dashboards")
        log_in(browser, node.url, *admin_login)
        browser.get(node.url + reverse("admin:dashboards"))
        assert_styled(browser)
        charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
        # then the page fits a 1400 px window: nothing makes it scroll sideways
        widths = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[1] == 1400 and widths[0] <= widths[1], f"page scrolls sideways: {widths}"
        cut = browser.execute_script(
            "return [...document.querySelectorAll('.table-scroll')].filter(d => d.scrollWidth > d.clientWidth)"
            ".map(d => [d.querySelector('table').id, d.scrollWidth, d.clientWidth])"
        )
        assert not cut, f"tables wider than the page at 1400 px: {cut}"
        assert_charts_laid_out(browser)
        browser.shot("dashboards")
        # then there are charts, and the figures table has a row for the queue
        assert charts, "no <svg class=chart> on the dashboards page"
        assert all(c.size["width"] > 50 and c.size["height"] > 30 for c in charts), [c.size for c in charts]
        tables = " ".join(t.text for t in browser.find_elements(By.CSS_SELECTOR, "table"))
        assert name in tables, f"{name} not in the figures tables"
        # and its figures are the test's attempts: counts per queue and per worker
        succeeded = sum(r.outcome == "succeeded" for r in rows)
        overview = [
            [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#overview tbody tr")
        ]
        assert [name, "300", str(succeeded)] in [cells[:3] for cells in overview], overview
        workers_table = browser.find_element(By.ID, "workers").text
        assert "celery@e2e-0" in workers_table and "celery@e2e-1" in workers_table
        # and the queue learned its estimates from them (processing took 0.2-3 s here)
        learned = Queue.objects.get(name=name)
        assert 0.2 <= learned.process_estimate <= 3.0, learned.process_estimate
        assert browser.find_elements(By.CSS_SELECTOR, "#estimates tbody tr")
        # and the charts use the page's width: three in a row at 1920 px, two at 1280 px
        for width, per_row in ((1920, 3), (1280, 2)):
            browser.set_window_size(width, 1080)
            browser.set_window_size(width + width - browser.execute_script("return window.innerWidth"), 1080)
            tops = browser.execute_script(
                "return [...document.querySelectorAll('svg.chart')].map(c => Math.round(c.getBoundingClientRect().top))"
            )
            assert tops.count(tops[0]) == per_row, (width, tops)
            widths = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert widths[0] <= widths[1], (width, widths)
            browser.shot(f"dashboards {width}")
        browser.set_window_size(1400, 1000)
        # and the operator chooses the range (buckets to match) and the whole cluster's figures
        browser.find_element(By.CSS_SELECTOR, ".dash-ranges a[data-range=day]").click()
        _wait(browser, EC.url_contains("range=day"))
        assert "1800 s buckets" in browser.find_element(By.CSS_SELECTOR, ".dash-ranges").text
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart circle")) > 0
        browser.find_element(By.LINK_TEXT, "all queues").click()
        _wait(browser, EC.url_contains("queue=%2A"))
        assert "All queues" in browser.find_element(By.CSS_SELECTOR, ".dash-ranges + h2").text
        # every attempt of the hour is in the half hours shown (one queue's: it is the only one)
        attempts = [
            int(tr.find_elements(By.TAG_NAME, "td")[1].text)
            for tr in browser.find_elements(By.CSS_SELECTOR, "#buckets tbody tr")
        ]
        assert sum(attempts) == 300, attempts
        browser.shot("dashboards, all queues, last day")
    finally:
        _empty_store(name)


def test_topic_subscriptions_and_archive(browser, node, token, admin_login):
    # A topic's page, a slow subscription's positions, and the archive that holds what
    # retention moved out of the store while the subscription still needed it.
    from rest_framework.authtoken.models import Token

    from archive.models import ArchivedMessage
    from queues.models import Partition, Queue, Subscription

    user = Token.objects.get(key=token).user
    user.is_staff = True  # retention on demand is for staff
    user.save()
    client = Client(node.url, token)
    name = f"e2e-t-{uuid.uuid4().hex[:6]}"
    r = client.post("topics", {"name": name, "partitions": 2, "archive": "all"})
    assert r.status_code == 201, r.text
    try:
        for sub in ("fast", "slow"):
            assert client.post(f"topics/{name}/subscriptions", {"name": sub, "start": "oldest"}).status_code == 201
        wait_until(
            lambda: all(p["owner"] for p in client.get(f"queues/{name}/partitions").json()["partitions"]),
            20,
            "the node to own the topic's partitions",
        )
        # given 12 published messages that "fast" acknowledged and "slow" never read, past retention
        ids = client.post(f"topics/{name}/publish", {"messages": [{"body": f"news {i}"} for i in range(12)]}).json()[
            "ids"
        ]
        fast = client.post(f"topics/{name}/subscriptions/fast/dequeue", {"max": 100}).json()["messages"]
        assert (
            client.post(
                f"topics/{name}/subscriptions/fast/ack",
                {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in fast]},
            ).status_code
            == 200
        )
        r = client.post(f"queues/{name}/expire", {"older_than": 0})
        assert r.status_code == 200 and r.json()["archived"] == 12, r.text
        topic = Queue.objects.get(name=name)

        def published() -> bool:
            rows = Partition.objects.filter(queue=topic)
            return sum(((p.cursors or {}).get("slow") or {}).get("archived", 0) for p in rows) == 12

        wait_until(published, 10, "the owner to publish the subscriptions' figures")

        # when an operator opens the topic
        log_in(browser, node.url, *admin_login)
        browser.get(f"{node.url}/admin/queues/queue/{topic.pk}/change/")
        assert_styled(browser)
        group = browser.find_element(By.ID, "subscriptions-group")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", group)
        browser.shot("topic page")
        # then each subscription says how much it holds, and how much of it only the archive has
        cells = {
            tr.find_element(By.CSS_SELECTOR, "td.field-name").text: (
                tr.find_element(By.CSS_SELECTOR, "td.field-held").text,
                tr.find_element(By.CSS_SELECTOR, "td.field-archived").text,
            )
            for tr in group.find_elements(By.CSS_SELECTOR, "tbody tr.has_original")
        }
        assert cells == {"fast": ("0", "0"), "slow": ("12", "12")}, cells

        # when they open the slow subscription
        slow = Subscription.objects.get(topic=topic, name="slow")
        browser.get(f"{node.url}/admin/queues/subscription/{slow.pk}/change/")
        table = browser.find_element(By.CSS_SELECTOR, "table.positions")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", table)
        browser.shot("subscription positions")
        # then its position in each partition is its oldest message there, the test's own IDs
        rows = [
            [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
        ]
        expected = []
        for p in (0, 1):
            here = [m for m in ids if m.split("/")[1] == str(p)]  # in publish order: the first is the oldest
            expected.append([str(p), here[0] if here else "-", str(len(here)), "0", "0", str(len(here))])
        assert rows == expected, rows

        # when they open the archive, filtered on the topic
        browser.get(f"{node.url}/admin/archive/archivedmessage/?queue={name}")
        listing = browser.find_element(By.ID, "result_list")
        browser.shot("archive list")
        # then the twelve messages are there with their bodies, written at retention
        shown = {
            tr.find_element(By.CSS_SELECTOR, "th.field-message_id, td.field-message_id").text
            for tr in listing.find_elements(By.CSS_SELECTOR, "tbody tr")
        }
        assert shown == set(ids)
        assert "news 11" in listing.text
        assert ArchivedMessage.objects.filter(queue=name).count() == 12
    finally:
        _empty_store(name)
