"""The OpenAPI schema is the contract: schemathesis finds nothing against a live node.

A node on PostgreSQL (the test database) and Redis serves its own schema; schemathesis
(pinned in requirements-dev.txt) reads it and runs every check it has (server errors, status
codes, response schemas and headers, schema-valid requests accepted and schema-violating ones
refused, authentication, unsupported methods ...) in the coverage, fuzzing and stateful
phases. The stateful phase follows the schema's OpenAPI links: create a queue, topic or
subscription, then call what takes its name; enqueue, dequeue, then ack or change the
visibility of what was received. ``tests/integration/schemathesis.toml`` holds the settings
and says why each is there.

The seed is printed so a failure can be replayed:
``MQ_SCHEMA_SEED=<seed> scripts/test.sh tests/integration/test_schema_contract.py``. The suite
runs a fixed seed (``FIXED_SEED``), so a red run is the change's and not the dice's; explore new
cases with ``MQ_SCHEMA_SEED=random`` and add what they find as fixes (and, once fixed, may move
``FIXED_SEED`` to that seed). ``MQ_SCHEMA_MAX_TIME=600`` lets a run go on for that many seconds
(a long exploration: ``MQ_SCHEMA_SEED=random MQ_SCHEMA_MAX_TIME=600 scripts/test.sh
tests/integration/test_schema_contract.py -k finds_nothing``).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
#: the suite's seed: it found the empty `outcome=` that /logs accepted (fixed since).
FIXED_SEED = 1770479938
REPO = HERE.parents[1]
#: Cases per operation and phase (a longer run: MQ_SCHEMA_CASES, MQ_SCHEMA_MAX_TIME, a random seed).
CASES = int(os.environ.get("MQ_SCHEMA_CASES", "10"))
#: Seconds schemathesis may go on for (0: until its cases are done).
MAX_TIME = int(os.environ.get("MQ_SCHEMA_MAX_TIME", "0"))


@pytest.fixture
def superuser_token(transactional_db):
    """A committed token of a superuser: staff-only calls (purge, expire, release) are fuzzed too."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    user = User.objects.create_superuser(username="schemathesis", password=None)
    return Token.objects.create(user=user).key


@pytest.mark.slow
@pytest.mark.timeout(420 + MAX_TIME)
@pytest.mark.cluster
def test_schemathesis_finds_nothing(tmp_path, superuser_token, node_factory):
    chosen = os.environ.get("MQ_SCHEMA_SEED", "")
    seed = random.randrange(2**31) if chosen == "random" else int(chosen or FIXED_SEED)
    print(f"schemathesis seed: {seed} (replay: MQ_SCHEMA_SEED={seed})")
    node = node_factory()
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                str(HERE / "schemathesis_cli.py"),
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "run",
                f"{node.url}/api/schema/?format=json",
                "--header",
                f"Authorization: Token {superuser_token}",
                "--checks",
                "all",
                "--phases",
                "coverage,fuzzing,stateful",
                "--max-examples",
                str(CASES),
                "--seed",
                str(seed),
                "--workers",
                "4",
                "--suppress-health-check",
                "all",
                "--generation-database",
                "none",
                "--no-color",
                *(["--max-time", str(MAX_TIME)] if MAX_TIME else []),
            ],
            cwd=tmp_path,  # its report directory and caches stay in the test's directory
            capture_output=True,
            text=True,
            timeout=400 + MAX_TIME,
        )
        elapsed = time.monotonic() - t0
    finally:
        node.stop()
    out = proc.stdout + proc.stderr
    summary = out[out.rfind("SUMMARY") :] if "SUMMARY" in out else out[-3000:]
    phases = [line.strip() for line in out.splitlines() if re.search(r"\((in [\d.]+s)\)|Scenarios:|API Links:", line)]
    print("\n".join(phases))
    print(out[out.find("WARNINGS") : out.find("SUMMARY")] if "WARNINGS" in out else "")
    print(summary)
    print(f"schemathesis: {elapsed:.0f} s, seed {seed}")
    generated = re.search(r"(\d+) generated", summary)
    assert proc.returncode == 0, (
        f"schemathesis found something (seed {seed}):\n{out[-20000:]}\nnode log:\n{node.log_tail(60)}"
    )
    assert generated and int(generated.group(1)) >= 1000, summary  # it really ran
    # Every phase ran and passed; the stateful one is the links being followed.
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert re.search(rf"✅ {phase}", summary), f"{phase} phase did not pass:\n{summary}"


# ------------------------------------------------------------------ the links, followed by hand


def _schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def _evaluate(value, request_path: dict, response_body):
    """An OpenAPI runtime expression (``$response.body#/a/0/b``, ``$request.path.x``) or a
    structure of them, as a client following the link computes it."""
    if isinstance(value, dict):
        return {k: _evaluate(v, request_path, response_body) for k, v in value.items()}
    if isinstance(value, list):
        return [_evaluate(v, request_path, response_body) for v in value]
    if isinstance(value, str) and value.startswith("$request.path."):
        return request_path[value.removeprefix("$request.path.")]
    if isinstance(value, str) and value.startswith("$response.body#"):
        out = response_body
        for part in value.removeprefix("$response.body#/").split("/"):
            out = out[int(part)] if isinstance(out, list) else out[part]
        return out
    return value


def _follow(api, schema: dict, source: tuple[str, str, str], link_name: str, path_params: dict, response):
    """Call what the link named ``link_name`` of ``source`` (path, method, status) points to."""
    path, method, status = source
    link = schema["paths"][path][method]["responses"][status]["links"][link_name]
    targets = {
        op["operationId"]: (p, m) for p, ops in schema["paths"].items() for m, op in ops.items() if "operationId" in op
    }
    target_path, target_method = targets[link["operationId"]]
    params = _evaluate(link.get("parameters", {}), path_params, response.json())
    url = target_path
    for name, value in params.items():
        url = url.replace("{" + name + "}", str(value))
    assert "{" not in url, (link_name, url)
    body = _evaluate(link.get("requestBody", {}), path_params, response.json())
    return getattr(api, target_method)(url, body, format="json"), params


def test_the_links_lead_from_a_new_queue_to_its_messages_and_back(api, unique_name):
    schema = _schema()
    name = unique_name()
    created = api.post("/api/v1/queues", {"name": name, "partitions": 1}, format="json")
    assert created.status_code == 201, created.content
    r, params = _follow(api, schema, ("/api/v1/queues", "post", "201"), "POST enqueue", {}, created)
    assert params == {"name": name}
    r = api.post(f"/api/v1/queues/{name}/enqueue", {"body": "hello"}, format="json")
    assert r.status_code == 201, r.content
    dequeued, params = _follow(
        api, schema, ("/api/v1/queues/{name}/enqueue", "post", "201"), "dequeue", {"name": name}, r
    )
    assert dequeued.status_code == 200 and dequeued.json()["messages"][0]["body"] == "hello", dequeued.content
    source = ("/api/v1/queues/{name}/dequeue", "post", "200")
    shown, _ = _follow(api, schema, source, "visibility", {"name": name}, dequeued)
    assert shown.status_code == 200, shown.content
    again = api.post(f"/api/v1/queues/{name}/dequeue", {}, format="json")
    assert again.json()["messages"][0]["receive_count"] == 2, again.content
    acked, _ = _follow(api, schema, source, "ack", {"name": name}, again)
    assert acked.status_code == 200 and acked.json() == {"acked": 1, "not_found": 0}, acked.content
    stats, _ = _follow(api, schema, ("/api/v1/queues", "post", "201"), "GET stats", {}, created)
    assert stats.status_code == 200 and stats.json()["depth"] == 0, stats.content


def test_the_links_lead_from_a_new_topic_to_a_subscription_and_its_messages(api, unique_name):
    schema = _schema()
    topic = unique_name()
    created = api.post("/api/v1/topics", {"name": topic, "partitions": 1}, format="json")
    assert created.status_code == 201, created.content
    sub, params = _follow(api, schema, ("/api/v1/topics", "post", "201"), "POST subscriptions", {}, created)
    assert params == {"topic": topic} and sub.status_code == 400  # the link gives the topic; the body is the client's
    sub = api.post(f"/api/v1/topics/{topic}/subscriptions", {"name": "s", "start": "oldest"}, format="json")
    assert sub.status_code == 201, sub.content
    published, _ = _follow(api, schema, ("/api/v1/topics", "post", "201"), "POST publish", {}, created)
    assert published.status_code == 400  # an empty body: the link carries only the name
    assert api.post(f"/api/v1/topics/{topic}/publish", {"body": "hi"}, format="json").status_code == 201
    subs = "/api/v1/topics/{topic}/subscriptions"
    dequeued, params = _follow(api, schema, (subs, "post", "201"), "POST dequeue", {"topic": topic}, sub)
    assert params == {"topic": topic, "name": "s"}
    assert dequeued.status_code == 200 and dequeued.json()["messages"][0]["body"] == "hi", dequeued.content
    acked, _ = _follow(
        api, schema, (subs + "/{name}/dequeue", "post", "200"), "ack", {"topic": topic, "name": "s"}, dequeued
    )
    assert acked.status_code == 200 and acked.json()["acked"] == 1, acked.content
