"""An operator grants a user ``produce`` on a name pattern in the admin, in headless Chromium
against a real node, and the grant takes effect on a queue made afterwards: the user's token
may enqueue into it, not dequeue from it. Screenshots of every step go to
``artifacts/screenshots/<test>/``.
"""

from __future__ import annotations

import re
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select

from queues import access
from tests.e2e.test_admin_console import _empty_store, _wait, log_in
from tests.integration.nodes import Client
from tests.launcher import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

QUEUE = "billing-eu"


def test_a_pattern_grant_made_in_the_admin_lets_a_user_produce_but_not_consume(browser, node, admin_login):
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from queues.models import AuditEntry, Grant, Queue

    # given a non-staff user with an API token and no grant, and the operator's own token
    clerk = User.objects.create_user("billing-clerk", password="clerk-pw-1")
    clerk_api = Client(node.url, Token.objects.create(user=clerk).key)
    operator_api = Client(node.url, Token.objects.create(user=User.objects.get(username=admin_login[0])).key)
    try:
        # when the operator signs in and grants the clerk produce on billing-* in the grants list
        log_in(browser, node.url, *admin_login)
        browser.get(f"{node.url}/admin/queues/grant/add/")
        _wait(browser, EC.presence_of_element_located((By.ID, "id_pattern")))
        Select(browser.find_element(By.ID, "id_user")).select_by_visible_text(clerk.username)
        browser.find_element(By.ID, "id_pattern").send_keys("billing-*")
        Select(browser.find_element(By.ID, "id_action")).select_by_value("produce")
        browser.shot("grant form")
        browser.find_element(By.CSS_SELECTOR, "#grant_form [name=_save]").click()
        _wait(browser, EC.presence_of_element_located((By.ID, "result_list")))
        browser.shot("grants list")
        # then the list shows it, the row is stored as made by the operator, and the audit trail has it
        listing = browser.find_element(By.ID, "result_list").text
        assert "user billing-clerk" in listing and "billing-*" in listing and "produce" in listing, listing
        g = Grant.objects.get()
        assert (g.user_id, g.group_id, g.queue_id, g.pattern, g.action) == (
            clerk.pk,
            None,
            None,
            "billing-*",
            "produce",
        )
        assert g.created_by.username == admin_login[0]
        entry = AuditEntry.objects.get(action="grant")
        assert (entry.actor, entry.target, entry.detail) == (
            admin_login[0],
            "billing-*",
            {"principal": "user:billing-clerk", "action": "produce"},
        )
        browser.get(f"{node.url}/admin/queues/auditentry/")
        trail = browser.find_element(By.ID, "result_list").text
        browser.shot("audit trail")
        assert admin_login[0] in trail and "billing-*" in trail

        # when the operator creates billing-eu afterwards, through the API
        r = operator_api.post("queues", {"name": QUEUE, "partitions": 1})
        assert r.status_code == 201, r.text
        queue = Queue.objects.get(name=QUEUE)
        wait_until(
            lambda: all(p["owner"] for p in operator_api.get(f"queues/{QUEUE}/partitions").json()["partitions"]),
            20,
            f"the node to own {QUEUE}'s partition",
        )
        # then its page's effective access shows the clerk may read and produce, not consume or manage
        browser.get(f"{node.url}/admin/queues/queue/{queue.pk}/change/")
        table = _wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, "table.effective-access")))
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", table)
        browser.shot("queue page effective access")
        row = table.find_element(By.CSS_SELECTOR, "tr[data-principal='user:billing-clerk']")
        cells = {
            re.sub("^action-", "", td.get_attribute("class")): td.get_attribute("data-granted")
            for td in row.find_elements(By.CSS_SELECTOR, "td[data-granted]")
        }
        assert cells == {"read": "yes", "produce": "yes", "consume": "no", "manage": "no"}, cells
        assert "produce on billing-*" in row.text

        # ---- from here on the API must enforce the grants (access-core's service layer) ----
        # when the clerk enqueues into billing-eu with its token (another process of the node
        # may have read the grants before they changed: it sees them within access.TTL)
        invoice = {"messages": [{"body": "invoice 1"}]}
        deadline = time.monotonic() + 3 * access.TTL
        while (r := clerk_api.post(f"queues/{QUEUE}/enqueue", invoice)).status_code != 201:
            assert time.monotonic() < deadline, (r.status_code, r.text)
            time.sleep(0.2)
        # then it is stored, and the operator can see it waiting
        assert len(r.json()["ids"]) == 1, r.text
        assert operator_api.get(f"queues/{QUEUE}/stats").json()["depth"] == 1
        # but a dequeue is refused: it may see the queue, it lacks consume
        r = clerk_api.post(f"queues/{QUEUE}/dequeue", {"max": 10})
        assert r.status_code == 403, (r.status_code, r.text)
        body = r.json()
        assert body["error"] == "permission_denied" and body["missing"] == "consume", body
        assert "billing-clerk may not consume 'billing-eu'" in body["detail"], body
        # and the message is still there for a consumer that may
        got = operator_api.post(f"queues/{QUEUE}/dequeue", {"max": 10}).json()["messages"]
        assert [m["body"] for m in got] == ["invoice 1"]
        # and a queue the pattern does not cover does not exist for the clerk
        assert operator_api.post("queues", {"name": "orders-eu", "partitions": 1}).status_code == 201
        assert clerk_api.post("queues/orders-eu/enqueue", {"body": "x"}).status_code == 404
    finally:
        for name in (QUEUE, "orders-eu"):
            _empty_store(name)  # its keys, under the queue's incarnation
