"""Names match whole: a queue's, topic's or subscription's name and a grant's pattern are
checked against the whole string. ``$`` in a regex also matches before a trailing newline and
Django's RegexValidator searches, so ``"orders\\n"`` passed a ``^...$`` pattern: the file store_kind
answered 500 for it, Redis and PostgreSQL created and listed it, and then answered every call on
it, DELETE included, with 404. A pattern grant (``billing-*``) reached such a name too."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from queues import access, service
from queues.access import SYSTEM
from queues.kv import reset_store
from queues.models import AuditEntry, Grant, Queue, Subscription

pytestmark = pytest.mark.django_db

BAD = ["{n}\n", "{n}\r\n", "\n{n}", "{n}\n\n"]


@pytest.fixture(params=["file", "configured"])
def store_kind(request, settings, tmp_path):
    """Each case on the file store (where the name once reached the disk: a 500) and on the
    store the suite runs with (Redis or PostgreSQL: created, then unreachable)."""
    if request.param == "file":
        settings.KV_URL = f"file://{tmp_path / 'kv'}"
    reset_store()
    yield request.param
    reset_store()


@pytest.mark.usefixtures("store_kind")  # before the runtime: it opens the store
@pytest.mark.parametrize("shape", BAD)
def test_a_queue_or_topic_name_with_a_newline_is_400_and_creates_nothing(api, unique_name, shape):
    name = shape.format(n=unique_name("orders"))
    for path in ("/api/v1/queues", "/api/v1/topics"):
        r = api.post(path, {"name": name, "partitions": 1}, format="json")
        assert r.status_code == 400, (path, r.status_code, r.content)
        assert "name" in r.json()["detail"], r.json()
    assert not Queue.objects.filter(name=name).exists()
    assert not Queue.objects.filter(name=name.strip()).exists()
    assert not AuditEntry.objects.filter(target=name).exists()
    assert name not in [q["name"] for q in api.get("/api/v1/queues").json()]


@pytest.mark.usefixtures("store_kind")  # before the runtime: it opens the store
@pytest.mark.parametrize("shape", BAD)
def test_a_subscription_name_with_a_newline_is_400(api, unique_name, shape):
    topic = unique_name("news")
    assert api.post("/api/v1/topics", {"name": topic, "partitions": 1}, format="json").status_code == 201
    name = shape.format(n="mail")
    r = api.post(f"/api/v1/topics/{topic}/subscriptions", {"name": name}, format="json")
    assert r.status_code == 400, r.content
    assert not Subscription.objects.filter(topic__name=topic).exists()


@pytest.mark.usefixtures("store_kind")  # before the runtime: it opens the store
def test_the_service_refuses_such_names_for_every_entrance(runtime, unique_name):
    # (the admin's forms, the SQS API and the management commands create through these)
    name = unique_name("orders") + "\n"
    with pytest.raises(ValidationError) as exc:
        service.create_queue(caller=SYSTEM, name=name, partitions=1)
    assert "name" in exc.value.message_dict
    topic = service.create_queue(caller=SYSTEM, name=unique_name("news"), kind="topic", partitions=1)
    with pytest.raises(ValidationError) as exc:
        service.create_subscription(topic, caller=SYSTEM, name="mail\n")
    assert "name" in exc.value.message_dict
    assert not Queue.objects.filter(name=name).exists()


def test_the_grant_model_refuses_a_pattern_with_a_newline(db):
    bob = User.objects.create(username="bob-nl")
    with pytest.raises(ValidationError) as exc:
        Grant(user=bob, pattern="billing-*\n", action="produce").full_clean()
    assert "pattern" in exc.value.message_dict


@pytest.mark.parametrize(
    "name, reached",
    [
        ("billing-eu", True),
        ("billing-", True),
        ("billing-eu\n", False),
        ("billing-e\nu", False),
        ("billing-eu\r", False),
        ("billing-eu/x", False),
        ("xbilling-eu", False),
    ],
)
def test_a_pattern_grant_reaches_whole_names_only(db, name, reached):
    bob = User.objects.create(username="bob-pat")
    Grant.objects.create(user=bob, pattern="billing-*", action="produce")
    access.RULES.forget()
    try:
        rights = access.granted(access.Caller.of(bob), queue_id=10**9, name=name, created_by=None)
        assert ("produce" in rights) is reached, rights
        shown = access.grants_on(10**9, name)
        assert bool(shown) is reached
    finally:
        access.RULES.forget()


def test_the_schema_still_says_a_name_in_ecma_anchors():
    # the OpenAPI document is read by ECMA regex engines, which know no \A or \Z
    from queues.api.schema import NAME

    assert NAME["pattern"].startswith("^") and NAME["pattern"].endswith("$")
    assert "\\A" not in NAME["pattern"] and "\\Z" not in NAME["pattern"]
