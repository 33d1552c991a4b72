"""The console's overview, a topic's page and a queue's page, in headless Chromium against a real
node, at 1280x800 and 1920x1080.

The overview is linked first on the index; it lists the queues and topics the user may read with
their figures, the nodes with the partitions they hold and a map of partition owners, and it
refreshes itself: an enqueue shows in its depth without a reload. A topic's page lists its
subscriptions with their backlogs and positions; its settings page has no queue-only field; a
queue's page starts with its figures. None of these pages scrolls sideways or has a table wider
than its box, at either width, and none logs an error in the browser's console. A staff user without grants sees none of the queues. Screenshots
of each page at each width are kept (``artifacts/screenshots/``). ``manage.py mq_demo`` fills
the node with queues, a topic and a worker's attempts that the overview shows.
"""

from __future__ import annotations

import io
import uuid

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from tests.e2e.test_admin_console import _empty_store, _wait, log_in, make_queue
from tests.e2e.test_console_layout import _OVERFLOW, _STATUS, _size
from tests.integration.nodes import Client
from tests.launcher import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SIZES = [(1280, 800), (1920, 1080)]


def _fits(browser, url: str) -> None:
    got = browser.execute_script(_OVERFLOW)
    assert got["page"][0] <= got["page"][1] and not got["tables"] and not got["scrolled"], (url, got)


def _open(browser, url: str) -> None:
    browser.get(url)
    _wait(browser, EC.presence_of_element_located((By.ID, "content")))
    assert browser.execute_script(_STATUS) == 200, url
    _no_errors(browser, url)


def _no_errors(browser, where: str) -> None:
    """Nothing the page logged as an error (a script's exception, a resource that failed: a 404)."""
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert errors == [], (where, errors)


def _depth_shown(browser, name: str) -> str:
    cells = browser.find_elements(By.CSS_SELECTOR, f"#overview-queues tr[data-queue='{name}'] td.depth")
    return cells[0].text if cells else ""


def test_the_overview_topic_and_queue_pages(browser, node, token, admin_login):
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.urls import reverse

    from queues.models import Queue
    from workers.models import AttemptLog

    client = Client(node.url, token)
    dlq = make_queue(client, 1)
    name = make_queue(client, 3, dead_letter_queue=dlq, max_receives=3)
    topic = f"e2e-t-{uuid.uuid4().hex[:6]}"
    assert client.post("topics", {"name": topic, "partitions": 2}).status_code == 201
    # (through the node: a service call here would start a node runtime in this process, which
    # would take a share of every queue's partitions, the demo's too, at an address none can reach)
    assert client.post(f"topics/{topic}/subscriptions", {"name": "billing", "start": "oldest"}).status_code == 201
    assert client.post(f"topics/{topic}/publish", {"messages": [{"body": "p1"}, {"body": "p2"}]}).status_code == 201
    assert client.post(f"queues/{name}/enqueue", {"messages": [{"body": f"m{i}"} for i in range(4)]}).status_code == 201
    nobody = User.objects.create_user(f"staff-{uuid.uuid4().hex[:6]}", password="e2e-Secret-pw-2", is_staff=True)
    browser.get_log("browser")  # what earlier tests' pages logged is not this test's
    try:
        log_in(browser, node.url, *admin_login)
        # the overview is the index's first link
        first = browser.find_element(By.CSS_SELECTOR, "#content .module a")
        assert first.get_attribute("href").endswith(reverse("admin:overview")), first.get_attribute("href")
        first.click()
        _wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, f"#overview-queues tr[data-queue='{name}']")))
        # each queue and topic with its figures; the node holds every partition
        _wait(browser, lambda d: _depth_shown(d, name) == "4")
        row = browser.find_element(By.CSS_SELECTOR, f"#overview-queues tr[data-queue='{topic}']")
        assert "topic" in row.text and "1 subscription" in row.text, row.text
        nodes = browser.find_elements(By.CSS_SELECTOR, "#overview-nodes tbody tr")
        assert any(node.url.split("//")[1] in n.text for n in nodes), [n.text for n in nodes]
        cells = browser.find_elements(By.CSS_SELECTOR, f"#overview-map .map-row[data-queue='{name}'] .cell")
        assert len(cells) == 3 and all("unowned" not in c.get_attribute("class") for c in cells), cells
        # it refreshes itself: an enqueue shows without a reload
        browser.execute_script("document.body.dataset.notReloaded = 'yes'")
        assert client.post(f"queues/{name}/enqueue", {"messages": [{"body": "late"}] * 3}).status_code == 201
        _wait(browser, lambda d: _depth_shown(d, name) == "7", timeout=20)
        assert browser.execute_script("return document.body.dataset.notReloaded") == "yes"
        _no_errors(browser, "the overview, refreshed")

        topic_page = node.url + reverse("admin:topic", args=[topic])
        queue_page = node.url + reverse("admin:queues_queue_change", args=[Queue.objects.get(name=name).pk])
        topic_settings = node.url + reverse("admin:queues_queue_change", args=[Queue.objects.get(name=topic).pk])
        for width, height in SIZES:
            _size(browser, width, height)
            _open(browser, node.url + reverse("admin:overview"))
            _wait(browser, lambda d: _depth_shown(d, name) == "7")
            _fits(browser, "overview")
            browser.shot(f"overview {width}")
            # a topic's page: its subscriptions, their backlogs and positions
            _open(browser, topic_page)
            sub = browser.find_element(By.CSS_SELECTOR, "#topic-subscriptions tr[data-subscription='billing']")
            assert sub.find_element(By.CSS_SELECTOR, "td.backlog").text == "2", sub.text
            assert len(sub.find_elements(By.CSS_SELECTOR, "td.positions .position")) == 2, sub.text
            _fits(browser, "topic")
            browser.shot(f"topic {width}")
            # its settings: no queue-only field, called a topic
            _open(browser, topic_settings)
            assert not browser.find_elements(By.NAME, "dead_letter_queue")
            assert not browser.find_elements(By.NAME, "max_receives")
            assert "Change topic" in browser.find_element(By.TAG_NAME, "h1").text
            _fits(browser, "topic settings")
            # a queue's page starts with its figures
            _open(browser, queue_page)
            figures = browser.find_element(By.ID, "queue-figures")
            assert figures.location["y"] < browser.find_element(By.NAME, "visibility_timeout").location["y"]
            assert figures.find_element(By.CSS_SELECTOR, "tbody td").text == "7", figures.text
            _fits(browser, "queue")
            browser.shot(f"queue {width}")

        # the demonstration fills a node: its queues, topic and worker's attempts show in the console
        out = io.StringIO()
        call_command("mq_demo", url=node.url, token=token, seconds=6, rate=30, no_dashboards=True, stdout=out)
        text = out.getvalue()
        assert "] " in text and "sent" in text and "/admin/overview/" in text, text
        # the worker's attempt log reaches the table after the node takes it in (a batch at a time)
        wait_until(
            lambda: AttemptLog.objects.filter(queue__in=["demo-orders", "demo-emails"]).exists(),
            20,
            f"the demo worker's attempts in the attempt log (the demo said: {text[-400:]!r})",
        )
        _open(browser, node.url + reverse("admin:overview"))
        for shown in ("demo-orders", "demo-emails", "demo-events"):
            _wait(
                browser, EC.presence_of_element_located((By.CSS_SELECTOR, f"#overview-queues tr[data-queue='{shown}']"))
            )
        browser.shot("overview after the demo")

        # a staff user without grants sees none of the queues (nor their partitions)
        browser.delete_all_cookies()
        log_in(browser, node.url, nobody.username, "e2e-Secret-pw-2")
        _open(browser, node.url + reverse("admin:overview"))
        _wait(browser, EC.visibility_of_element_located((By.ID, "overview-no-queues")))
        assert browser.find_elements(By.CSS_SELECTOR, "#overview-queues tbody tr") == []
        assert name not in browser.page_source and topic not in browser.page_source
        browser.get(topic_page)
        assert browser.execute_script(_STATUS) == 404
    finally:
        browser.set_window_size(1400, 1000)
        for made in (name, dlq, topic, "demo-orders", "demo-orders-dead", "demo-emails", "demo-events"):
            _empty_store(made)
