"""The API docs page renders in a browser that reaches nothing but the node: Swagger UI's files
come from the node's static files (drf-spectacular-sidecar), the schema from its API, read
with the console's session."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.test_admin_console import log_in

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: what a CDN-served Swagger UI would load from: refused by the browser during the test.
_THIRD_PARTY = ["*jsdelivr*", "*unpkg*", "*cdnjs*", "*googleapis*", "*gstatic*", "*swagger.io*"]


def test_the_docs_page_renders_with_only_the_node_reachable(browser, node, admin_login):
    # given a browser that refuses the CDNs' hosts, logged in to the console
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": _THIRD_PARTY})
    try:
        log_in(browser, node.url, *admin_login)
        # when it opens the API docs
        browser.get(f"{node.url}/api/docs/")
        # then Swagger UI draws the API's operations from the node's schema
        WebDriverWait(browser, 30).until(
            EC.presence_of_element_located((By.CSS_SELECTOR, "#swagger-ui .opblock-summary-path"))
        )
        paths = {e.get_attribute("data-path") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
        assert "/api/v1/queues/{name}/enqueue" in paths, sorted(p for p in paths if p)[:20]
        browser.shot("api docs")
        # and everything the page loaded came from the node
        loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        origin = urlsplit(node.url).netloc
        assert loaded and all(urlsplit(u).netloc == origin for u in loaded), loaded
        assert any(u.endswith("/swagger-ui-bundle.js") for u in loaded), loaded
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
