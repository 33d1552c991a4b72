"""Every page of the console fits a 1280 px screen, and no add form breaks: in headless Chromium
against a real node, with rows in every list (a queue with its dead-letter queue, a topic with a
subscription, a worker's attempts, an archived message, a key, a grant, settings).

At 1280x800, each list page of every registered model (a screenshot of each is kept), and the
page of its first row: the page does not scroll sideways and no table is wider than the box it
sits in (``scrollWidth <= clientWidth``); at 1920x1080, each list page again. Each add form the console
offers, submitted empty, answers a page (its errors), never a 5xx; submitted filled with valid values
(``FILLED``), it adds the object, which the page it leads to names, and logs no error in the browser.
``/favicon.ico`` is served.
"""

from __future__ import annotations

import uuid

import pytest
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.e2e.test_admin_console import _empty_store, _wait, log_in, make_queue
from tests.integration.nodes import Client

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1280, 800
WIDE = (1920, 1080)


def _size(browser, width: int, height: int) -> None:
    """The window whose inner width (what the page is laid out in) is ``width``."""
    browser.set_window_size(width, height)
    inner = browser.execute_script("return window.innerWidth")
    browser.set_window_size(width + (width - inner), height)


#: The page's sideways overflow, and each table wider than the box it sits in.
_OVERFLOW = """
const doc = document.documentElement;
const tables = [...document.querySelectorAll('table')].map(t => {
    const box = t.parentElement;
    return [t.id || t.className || box.className, Math.round(t.getBoundingClientRect().width), box.clientWidth];
}).filter(([, w, c]) => w > c + 1);
const scrolled = [...document.querySelectorAll('#content *')].filter(
    e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible'
        && e.tagName !== 'svg' && !e.closest('svg') && e.clientWidth > 0
).map(e => [e.tagName + '.' + e.className + '#' + e.id, e.scrollWidth, e.clientWidth]);
const cols = [...document.querySelectorAll('#result_list thead th')].map(
    th => [th.className.split(' ')[0], Math.round(th.getBoundingClientRect().width)]);
return {cols: cols, page: [doc.scrollWidth, doc.clientWidth], tables: tables, scrolled: scrolled};
"""

#: The status of the page the browser shows (Navigation Timing's responseStatus).
_STATUS = "return performance.getEntriesByType('navigation')[0].responseStatus"


#: Each add form's valid values, by its model (``app_label.model_name``): field name -> value
#: (a select's option by its text, else by its value), and the text the page after the save shows
#: of the new object. ``{bob}`` is the seeded user, ``{queue}`` a seeded queue, ``{dlq}`` one with
#: no SQS settings yet, ``{u}`` a fresh suffix. A model added to the console without a row here fails.
FILLED: dict[str, tuple[dict[str, str], str]] = {
    "auth.group": ({"name": "e2e-group-{u}"}, "e2e-group-{u}"),
    "auth.user": (
        {"username": "e2e-user-{u}", "password1": "e2e-Secret-pw-{u}", "password2": "e2e-Secret-pw-{u}"},
        "e2e-user-{u}",
    ),
    "queues.grant": ({"user": "{bob}", "queue": "{queue}", "action": "read"}, "{bob}"),
    "queues.queue": ({"name": "e2e-add-{u}", "partitions": "2"}, "e2e-add-{u}"),
    "authtoken.tokenproxy": ({"user": "{bob}"}, "{bob}"),
    "sqs.accesskey": ({"user": "{bob}", "description": "added by the walk {u}"}, "added by the walk {u}"),
    "sqs.queuesettings": ({"queue": "{dlq}", "receive_wait": "3"}, "{dlq}"),
}


def _left(browser, form) -> None:
    """Wait for the page the form's save leads to (the form gone stale), not the form still shown.
    Chromium, asked about the element while the page changes, may answer that the node "does
    not belong to the document" rather than that it is stale: it is gone all the same."""

    def gone(_) -> bool:
        try:
            form.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" not in str(exc):
                raise
            return True
        return False

    WebDriverWait(browser, 15, poll_frequency=0.05).until(gone)


def _fill(form, values: dict[str, str]) -> None:
    for name, value in values.items():
        field = form.find_element(By.NAME, name)
        if field.tag_name == "select":
            select = Select(field)
            if any(o.text == value for o in select.options):
                select.select_by_visible_text(value)
            else:
                select.select_by_value(value)
        else:
            field.clear()
            field.send_keys(value)


def _seed(node, token) -> tuple[list[str], str]:
    """Rows in every list: returns the queue names made (to empty their store after: the
    dead-letter queue, the queue, the topic) and the name of the user who has a grant and a key."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from archive.models import ArchivedMessage, ArchiverLock
    from consoles.models import DashboardRun, EstimateFit
    from queues import service
    from queues.access import SYSTEM
    from queues.models import Node, Queue
    from sqs import service as sqs_service
    from sqs.models import AccessKey
    from workers.models import AttemptLog, Consumer

    client = Client(node.url, token)
    dlq = make_queue(client, 1)
    name = make_queue(client, 2, dead_letter_queue=dlq, max_receives=3)
    topic = f"e2e-t-{uuid.uuid4().hex[:6]}"
    assert client.post("topics", {"name": topic, "partitions": 1}).status_code == 201
    # (through the node: the service's call would start a node runtime in this process)
    assert client.post(f"topics/{topic}/subscriptions", {"name": "billing"}).status_code == 201
    client.post(f"queues/{name}/enqueue", {"messages": [{"body": f"m{i}"} for i in range(5)]})
    bob = User.objects.create(username=f"bob-{uuid.uuid4().hex[:6]}")
    service.grant(caller=SYSTEM, user=bob, queue=Queue.objects.get(name=name), action="consume")
    AccessKey.issue(bob, "a key for the walk")
    sqs_service.update_queue_settings(Queue.objects.get(name=name), caller=SYSTEM, receive_wait=5)
    now = timezone.now()
    worker = Consumer.objects.create(
        id=f"w-{uuid.uuid4().hex}", name="celery@e2e-layout", hostname="e2e-layout", queues=[name], last_heartbeat=now
    )
    incarnation = Queue.objects.get(name=name).pk
    AttemptLog.objects.bulk_create(
        AttemptLog(
            message_id=f"{name}/0/{i:08x}-0123456789abcdef/{i % 4}",
            queue=name,
            incarnation=incarnation,
            partition=0,
            group="invoices",
            worker=worker,
            attempt=1,
            outcome="failed" if i % 3 else "succeeded",
            error="ValueError: the invoice's total does not match its lines" if i % 3 else "",
            process_started_at=now,
            process_ended_at=now,
        )
        for i in range(6)
    )
    ArchivedMessage.objects.create(
        message_id=f"{name}/0/00000000-0123456789abcdef/0",
        queue=name,
        incarnation=incarnation,
        partition=0,
        group="invoices",
        body="an invoice of a customer, archived when acknowledged " * 4,
        enqueued_at=now,
        acked_at=now,
    )
    ArchiverLock.objects.create(queue=name, holder=f"archiver-{uuid.uuid4().hex}", expires_at=now)
    run = DashboardRun.objects.create(
        status=DashboardRun.Status.SUCCEEDED,
        trigger="refresh_dashboards",
        master="local[2]",
        source="jdbc",
        bucket_seconds=60,
        window_start=now,
        finished_at=now,
    )
    EstimateFit.objects.create(
        run=run, queue=name, stage="process", n=120, intercept=0.0123, slope=0.000045, r2=0.87, rmse=0.0456,
        median_size=1234, estimate=0.2345, previous=0.2, applied=True, created_at=now,
    )  # fmt: skip
    # a node that cools: its mark is a word, not a red cross
    Node.objects.create(
        id=uuid.uuid4().hex,
        address="10.0.0.99:8000",
        started_at=now,
        heartbeat_at=now,
        stopped_at=now,  # not alive: the node under test never hands it a partition
        cooling=True,
        pid=4242,
    )
    return [dlq, name, topic], bob.username


def test_every_list_fits_1280_and_every_add_form_answers(browser, node, token, admin_login):
    from django.contrib import admin
    from django.urls import reverse

    made, bob = _seed(node, token)
    try:
        log_in(browser, node.url, *admin_login)
        _size(browser, WIDTH, HEIGHT)
        problems, adds = [], []
        for model in list(admin.site._registry):
            meta = model._meta
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
            browser.get(node.url + url)
            _wait(browser, EC.presence_of_element_located((By.ID, "content")))
            assert browser.execute_script(_STATUS) == 200, url
            got = browser.execute_script(_OVERFLOW)
            if got["page"][0] > got["page"][1] or got["tables"]:
                problems.append((url, got))
            browser.shot(f"{meta.app_label} {meta.model_name}")
            if browser.find_elements(By.CSS_SELECTOR, f"a.addlink[href='{url}add/']"):
                adds.append((model, url + "add/"))
            # and the page of its first row (where the columns the list leaves out are)
            links = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr > :is(th, td) a[href*='/change/']")
            if links:
                page = links[0].get_attribute("href")
                browser.get(page)
                _wait(browser, EC.presence_of_element_located((By.ID, "content")))
                got = browser.execute_script(_OVERFLOW)
                if got["page"][0] > got["page"][1] or got["tables"]:
                    problems.append((page, got))
        # every add form submitted empty answers the form again (its errors), not a 5xx
        for _, url in adds:
            browser.get(node.url + url)
            form = _wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, "#content-main form")))
            assert browser.execute_script(_STATUS) == 200, url
            form.find_element(By.CSS_SELECTOR, "[name=_save]").click()
            _left(browser, form)
            _wait(browser, EC.presence_of_element_located((By.ID, "content")))
            status = browser.execute_script(_STATUS)
            assert status < 500, (url, status, browser.page_source[:2000])
            # and says what is missing
            assert browser.find_elements(By.CSS_SELECTOR, ".errornote"), (url, browser.page_source[:2000])
        # and filled with valid values it adds the object: the page it leads to says so and names it
        browser.get_log("browser")  # (the pages above logged nothing the test reads)
        dlq, queue = made[0], made[1]
        for model, url in adds:
            label = model._meta.label_lower
            assert label in FILLED, f"{url}: no valid values for its add form in FILLED"
            u = uuid.uuid4().hex[:6]
            values, shown = FILLED[label]
            values = {k: v.format(u=u, bob=bob, queue=queue, dlq=dlq) for k, v in values.items()}
            shown = shown.format(u=u, bob=bob, queue=queue, dlq=dlq)
            before = model._default_manager.count()
            browser.get(node.url + url)
            form = _wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, "#content-main form")))
            _fill(form, values)
            form.find_element(By.CSS_SELECTOR, "[name=_save]").click()
            _left(browser, form)
            _wait(browser, EC.presence_of_element_located((By.ID, "content")))
            status = browser.execute_script(_STATUS)
            assert status < 500, (url, status, browser.page_source[:2000])
            assert not browser.find_elements(By.CSS_SELECTOR, ".errornote, .errorlist"), (
                url,
                values,
                browser.find_element(By.ID, "content").text[:2000],
            )
            assert browser.current_url != node.url + url, (url, browser.find_element(By.ID, "content").text[:2000])
            added = " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
            assert "added successfully" in added, (url, added)
            assert shown in browser.find_element(By.ID, "content").text, (url, shown)
            assert model._default_manager.count() == before + 1, url
            errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
            assert errors == [], (url, errors)
            if label == "queues.queue":
                made.append(values["name"])
        # and at 1920x1080 every list fits too (wider screens show more columns' text per line)
        _size(browser, *WIDE)
        for model in list(admin.site._registry):
            meta = model._meta
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
            browser.get(node.url + url)
            _wait(browser, EC.presence_of_element_located((By.ID, "content")))
            got = browser.execute_script(_OVERFLOW)
            if got["page"][0] > got["page"][1] or got["tables"]:
                problems.append((f"{url} at {WIDE[0]}", got))
        browser.get(node.url + reverse("admin:queues_queue_changelist"))
        browser.shot("queue list 1920")
        # and the icon the browser asks every page for is there
        browser.get(node.url + "/favicon.ico")
        assert browser.execute_script(_STATUS) == 200
        assert problems == [], problems
    finally:
        browser.set_window_size(1400, 1000)
        for name in made:
            _empty_store(name)
