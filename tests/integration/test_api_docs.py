"""The API docs page is served whole by the node: Swagger UI's files come from the node's own
static files (drf-spectacular-sidecar through WhiteNoise), never from a CDN, and the schema and
the page need a login."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
import requests

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_docs_page_loads_nothing_from_another_host(node, token):
    # given a client with a token
    auth = {"Authorization": f"Token {token}"}
    # when it opens the docs page
    page = requests.get(f"{node.url}/api/docs/", headers=auth, timeout=30)
    # then every file the page names is on the node itself, under its static files
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    html = page.text
    assert not re.search(r"cdn\.|jsdelivr|unpkg|googleapis|gstatic|swagger\.io", html), html[:2000]
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(urlsplit(ref).netloc == "" for ref in refs), refs
    scripts = re.findall(r'<script src="([^"]+)"', html)
    assert any(s.endswith("/swagger-ui-bundle.js") for s in scripts), scripts
    # and the node serves each one (no login needed for static files)
    for ref in refs:
        r = requests.get(f"{node.url}{ref}", timeout=30)
        assert r.status_code == 200 and len(r.content) > 500, ref
        if ref.endswith(".js"):
            assert "javascript" in r.headers["Content-Type"], (ref, r.headers["Content-Type"])
    # and the page reads the schema from the node, which answers the token's user
    assert 'url: "/api/schema/"' in html
    schema = requests.get(f"{node.url}/api/schema/?format=json", headers=auth, timeout=30)
    assert schema.status_code == 200 and "/api/v1/queues/{name}/enqueue" in schema.json()["paths"]


def test_the_schema_and_the_docs_need_a_login(node):
    # given a client without credentials
    schema = requests.get(f"{node.url}/api/schema/", timeout=30)
    docs = requests.get(f"{node.url}/api/docs/", timeout=30, allow_redirects=False)
    # then the schema is refused like any API call, and the docs page sends it to the login
    assert schema.status_code == 401
    assert docs.status_code == 302 and docs.headers["Location"] == "/admin/login/?next=/api/docs/"
