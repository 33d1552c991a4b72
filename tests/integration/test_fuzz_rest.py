"""The REST API fuzzed in this process with hostile values of every kind: never a 5xx, every
refusal the API's JSON error (``{"error": ..., "detail": ...}``).

The requests are the schema's (drf-spectacular's, read by schemathesis: every operation, its
path, query and body parameters, a schema-valid case of each), sent to the node's WSGI
application in this process (its fast path, and Django behind it) with a superuser's token
or a user's who owns nothing; path parameters name the world's queues, topic and
subscription. Then one to three places of the case (a body's member at any depth, a query
parameter, a path parameter) get a hostile value (``tests/fuzzing.py``). What schemathesis
itself checks against a live node (every check it has, the schema's links followed) is
``test_schema_contract.py``; this is the values no schema-driven generator makes: integers
past 4,300 digits, nesting 5,000 deep, NUL and lone surrogates, megabytes of text.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_from_bytes

import pytest
import schemathesis
from django.contrib.auth.models import User
from drf_spectacular.generators import SchemaGenerator
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token

from queues import service
from queues.access import Caller
from queues.models import Queue, Subscription
from tests import fuzzing
from tests.fuzzing import KINDS, dumps, fuzz_settings, hostile, replaced, text_of
from tests.integration.wsgi_client import WsgiClient, WsgiResponse

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("purge_kv")]


@functools.cache
def _operations() -> list[Any]:
    """The schema's operations (read once: the schema is the node's, the same every test)."""
    raw = SchemaGenerator().get_schema(request=None, public=True)
    return [result.ok() for result in schemathesis.openapi.from_dict(raw).get_all_operations()]


def _quoted(value: Any) -> str:
    return quote_from_bytes(text_of(value).encode("utf-8", "surrogatepass"), safe="")


@dataclass
class Rest:
    """Calls of the REST API, by the world's superuser or by a user who owns nothing."""

    tokens: dict[str, str]
    names: dict[str, list[str]]
    #: makes the world's queues, topic and subscription that do not exist (again)
    restore: Any
    client: WsgiClient = field(default_factory=lambda: WsgiClient(raise_request_exception=False))

    def call(self, method: str, path: str, query: dict[str, Any], body: Any, who: str) -> WsgiResponse:
        url = path + ("?" + "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in query.items()) if query else "")
        data = b"" if body is fuzzing.NO_BODY else dumps(body).encode("utf-8", "surrogatepass")
        r = self.client.generic(method, url, data, "application/json", HTTP_AUTHORIZATION=f"Token {self.tokens[who]}")
        check(r, f"{method} {url[:300]} {data[:300]!r}")
        if method == "DELETE" and r.status_code < 300:
            self.restore()  # a world queue may be gone
        return r


def check(r: WsgiResponse, what: str) -> None:
    """No 5xx; a refusal is the API's JSON error. The readiness probe's 503 is its answer "not
    ready" (the test's runtime beats no heartbeat: after a while it is not), not an error."""
    fuzzing.record("rest", r.status_code, what)
    where = f"{what} -> {r.status_code}: {r.content[:1500]!r}"
    probe = what.startswith("GET /api/v1/readyz")
    problem = fuzzing.server_error(r.status_code, r.headers.get, outage=probe)
    assert problem is None, f"{problem}: {where}"
    if r.status_code >= 400 and not probe:
        body = json.loads(r.content)
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and "detail" in body, where


@pytest.fixture
def rest(runtime, user, monkeypatch) -> Rest:
    """A world of queues, a topic with a subscription and messages in flight, made by a
    superuser; the API as that superuser and as ``user``, who owns nothing."""
    dequeue = service.dequeue  # every dequeue answers at once (its wait is not what is fuzzed)
    monkeypatch.setattr(service, "dequeue", lambda *a, **kw: dequeue(*a, **{**kw, "wait": 0.0}))
    root = User.objects.create_superuser(username=f"fz-root-{uuid.uuid4().hex[:6]}", password=None)
    caller = Caller.of(root)
    tag = uuid.uuid4().hex[:6]
    names = {
        "queue": [f"fz-{tag}", f"fz-strict-{tag}", f"fz-dlq-{tag}"],
        "topic": [f"fz-topic-{tag}"],
        "subscription": ["fz-sub"],
        "index": ["0", "1"],
    }

    def restore(fill: bool = False) -> None:
        """The world's queues, topic and subscription that do not exist, made (again); with
        ``fill``, messages in flight on the first queue (not when made again: the runtime
        claims a queue made again under a deleted one's name on its next pass, which this
        test's runtime makes when told: :func:`restore` tells it)."""

        def missing(name: str) -> bool:
            return not Queue.objects.filter(name=name).exists()

        q, strict, dlq = names["queue"]
        if missing(dlq):
            service.create_queue(caller=caller, name=dlq, partitions=1)
        if missing(q):
            dead = service.get_queue(dlq, caller=caller)
            service.create_queue(caller=caller, name=q, partitions=2, dead_letter_queue=dead, max_receives=2)
        if fill:
            service.enqueue(q, [service.MessageDraft(f"m{i}") for i in range(4)], caller=caller)
            service.dequeue(q, caller=caller, max_messages=2, visibility_timeout=3600)
        if missing(strict):
            service.create_queue(caller=caller, name=strict, partitions=1, strict=True)
        topic = names["topic"][0]
        if missing(topic):
            service.create_queue(caller=caller, name=topic, kind="topic", partitions=1)
        if not Subscription.objects.filter(topic__name=topic, name="fz-sub").exists():
            t = service.get_queue(topic, Queue.Kind.TOPIC, caller=caller)
            service.create_subscription(t, caller=caller, name="fz-sub")
        runtime.tick()

    restore(fill=True)
    tokens = {"root": Token.objects.create(user=root).key, "user": Token.objects.create(user=user).key}
    return Rest(tokens, names, restore)


def _world_name(path: str, param: str) -> str:
    """What a path parameter names: ``{name}`` a queue's, a topic's or a subscription's."""
    if param in ("topic", "index"):
        return param
    if path.startswith("/api/v1/topics/{topic}/subscriptions"):
        return "subscription"
    return "topic" if path.startswith("/api/v1/topics") else "queue"


@st.composite
def cases(draw: st.DrawFn, rest: Rest, operations: list[Any], kind: str | None) -> tuple[str, str, dict, Any, str]:
    """(method, path, query, body, who): a schema-valid case of any operation, its path naming
    the world, with one to three hostile values of ``kind`` (None: any kind, or none)."""
    op = draw(st.sampled_from(operations))
    case = draw(op.as_strategy())
    path_params = dict(case.path_parameters or {})
    for name in path_params:
        if draw(st.sampled_from([True] * 9 + [False])):  # mostly the world's, else the schema's
            path_params[name] = draw(st.sampled_from(rest.names[_world_name(op.path, name)]))
    query = dict(case.query or {})
    body = case.body if not isinstance(case.body, schemathesis.core.NotSet) else fuzzing.NO_BODY
    # a queue named in the query or the body (a log's, an archive's): mostly the world's
    if "queue" in query and draw(st.sampled_from([True, False])):
        query["queue"] = draw(st.sampled_from(rest.names["queue"]))
    if isinstance(body, dict) and "queue" in body and draw(st.sampled_from([True, False])):
        body = {**body, "queue": draw(st.sampled_from(rest.names["queue"]))}
    places: list[tuple[str, fuzzing.Path]] = [("path", (n,)) for n in path_params]
    places += [("query", (p.name,)) for p in op.query] + [("query", ("unknown",))]
    if body is not fuzzing.NO_BODY:
        places += [("body", p) for p in fuzzing.paths(body)]
    for _ in range(draw(st.integers(0 if kind is None else 1, 3))):
        where, place = draw(st.sampled_from(places)) if places else ("body", ())
        value = draw(hostile(kind))
        if where == "path":
            path_params[place[0]] = value
        elif where == "query":
            query[place[0]] = value
        else:
            body = replaced(None if body is fuzzing.NO_BODY else body, place, value)
    path = op.path
    for name, value in path_params.items():
        path = path.replace("{" + name + "}", _quoted(value))
    who = draw(st.sampled_from(["root"] * 4 + ["user"]))
    return op.method.upper(), path, query, body, who


def test_any_call_of_any_operation_is_answered_never_with_a_5xx(rest):
    @fuzz_settings(examples=120)
    @given(case=cases(rest, _operations(), None))
    def fuzz(case):
        rest.call(*case)

    fuzz()


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_values_of_each_kind_are_refused_never_with_a_5xx(rest, kind):
    @fuzz_settings(examples=20)
    @given(case=cases(rest, _operations(), kind))
    def fuzz(case):
        rest.call(*case)

    fuzz()
