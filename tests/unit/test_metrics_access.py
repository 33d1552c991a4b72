"""Who may read ``/metrics``: the bearer token of ``METRICS_TOKEN``, or no token from an
address in ``METRICS_ALLOW``; and the collector's figures from partition managers in memory."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
from django.test import RequestFactory, override_settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from queues.api.observability import metrics_allowed
from queues.service.figures import NodeCollector

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


def request(addr: str, auth: str | None = None):
    extra = {"REMOTE_ADDR": addr}
    if auth is not None:
        extra["HTTP_AUTHORIZATION"] = auth
    return RequestFactory().get("/metrics", **extra)


@pytest.mark.parametrize(
    ("addr", "auth", "token", "allowed"),
    [
        ("127.0.0.1", None, "", True),  # the default: the node's own host
        ("::1", None, "", True),
        ("::ffff:127.0.0.1", None, "", True),  # a dual-stack socket's view of loopback
        ("192.0.2.7", None, "", False),
        ("192.0.2.7", None, "t0ken", False),  # elsewhere: the token is needed
        ("192.0.2.7", "Bearer t0ken", "t0ken", True),
        ("192.0.2.7", "bearer t0ken", "t0ken", True),
        ("192.0.2.7", "Bearer t0ke", "t0ken", False),
        ("192.0.2.7", "Token t0ken", "t0ken", False),  # an API token's scheme is not it
        ("127.0.0.1", "Bearer wrong", "t0ken", False),  # a wrong token is refused from anywhere
        ("127.0.0.1", "Bearer ", "", False),  # no token configured: a bearer cannot match
        ("not an address", None, "", False),
    ],
)
def test_metrics_access(addr, auth, token, allowed):
    with override_settings(METRICS_TOKEN=token, METRICS_ALLOW=LOOPBACK):
        assert metrics_allowed(request(addr, auth)) is allowed


@pytest.mark.parametrize(
    "header", [{"HTTP_X_FORWARDED_FOR": "203.0.113.9"}, {"HTTP_FORWARDED": "for=203.0.113.9"}, {"HTTP_X_REAL_IP": "x"}]
)
def test_a_request_a_proxy_forwarded_needs_the_token_whatever_its_address(header):
    # a proxy on the node's own host connects from loopback: its clients are not the host
    with override_settings(METRICS_TOKEN="t", METRICS_ALLOW=LOOPBACK):
        assert not metrics_allowed(RequestFactory().get("/metrics", REMOTE_ADDR="127.0.0.1", **header))
        assert metrics_allowed(
            RequestFactory().get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer t", **header)
        )


def test_an_empty_allow_list_needs_the_token():
    with override_settings(METRICS_TOKEN="t", METRICS_ALLOW=[]):
        assert not metrics_allowed(request("127.0.0.1"))
        assert metrics_allowed(request("127.0.0.1", "Bearer t"))


def test_the_collector_reports_nothing_without_a_runtime():
    registry = CollectorRegistry()
    registry.register(NodeCollector(lambda: None))
    assert list(text_string_to_metric_families(generate_latest(registry).decode())) == []


def test_the_docs_proxy_example_keeps_metrics_private():
    # the nginx example users copy: /metrics answered 404 at the proxy, and X-Forwarded-For set
    # so that a proxy configured otherwise still gets 403 from the node without the token
    page = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "behind-a-proxy.md").read_text()
    (example,) = re.findall(r"```nginx\n(.*?)```", page, re.S)
    assert re.search(r"location \^~ /metrics \{[^}]*\breturn 404;\s*\}", example), example
    proxied = example[example.index("location / {") :]
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in proxied
