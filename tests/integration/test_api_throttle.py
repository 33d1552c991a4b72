"""The API counts calls per user (the fast path's message calls too) and answers 429 with
``Retry-After`` past the rate; another user keeps its own count."""

from __future__ import annotations

import random

from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from tests.integration.wsgi_client import token_client


def _rates(user: str | None, anon: str | None = None):
    rest = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": user, "anon": anon}}
    return override_settings(REST_FRAMEWORK=rest)


def test_a_user_past_its_rate_gets_429_on_both_paths(runtime, user, django_user_model, unique_name):
    name = unique_name()
    client = token_client("fastpath", user)
    with _rates("5/m"):
        # given a user's five calls in the minute: a queue made through Django, four enqueues
        # through the fast path
        assert client.post("/api/v1/queues", {"name": name}, format="json").status_code == 201
        sent = [client.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json") for _ in range(4)]
        assert [r.status_code for r in sent] == [201] * 4 and {r.served_by for r in sent} == {"fastpath"}
        # when it calls again, on either path
        fast = client.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json")
        slow = client.get("/api/v1/queues")
        # then both are refused with 429 and a wait, and nothing was stored
        for r in (fast, slow):
            assert r.status_code == 429, r.content
            assert 1 <= int(r["Retry-After"]) <= 60
        assert fast.served_by == "fastpath" and fast.json()["error"] == "throttled"
        # and another user is not held back by its count
        other = token_client("fastpath", django_user_model.objects.create(username=f"o-{name}"))
        assert other.get("/api/v1/queues").status_code == 200
    from queues import service
    from queues.access import SYSTEM

    assert service.queue_stats(name, caller=SYSTEM)["depth"] == 4


def test_anonymous_calls_are_counted_per_address(runtime):
    # counts live in the cache (Redis in the suite, kept between runs): an address of its own
    address = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"
    client = APIClient(REMOTE_ADDR=address)
    with _rates(None, "2/m"):
        codes = [client.get("/api/v1/healthz").status_code for _ in range(3)]
    assert codes == [200, 200, 429]


def test_no_rates_no_throttle(runtime, user, unique_name):
    client = token_client("fastpath", user)
    with _rates(None):
        assert all(client.get("/api/v1/queues").status_code == 200 for _ in range(30))
