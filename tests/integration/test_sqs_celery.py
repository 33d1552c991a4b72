"""kombu's SQS transport and a real Celery worker, pointed at a node's SQS endpoint.

The applications are configured exactly as for Amazon SQS (``sqs://<key>:<secret>@host:port``),
with an access key of an ordinary user; the node runs on PostgreSQL + Redis. kombu builds its
endpoint from the broker URL's host and port only, so the node answers SQS calls at ``/`` too
(and at the queue URLs it hands out).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import pytest
from kombu import Connection

from tests.launcher import ROOT, NodeProcess, wait_until

# One node for the module (its tests call it over HTTP only); the access key is committed apart.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.node(shared=True)]

CELERY = str(Path(sys.executable).with_name("celery"))
TASKS = 500
LONG_SLEEP = 8  # seconds: longer than the queue's visibility timeout below
VISIBILITY = 4


@pytest.fixture(scope="module")
def access_key(committed):
    from django.contrib.auth import get_user_model

    from sqs.models import AccessKey

    def issue() -> AccessKey:
        user = get_user_model().objects.create_user(f"celery-app-{uuid.uuid4().hex[:6]}")
        return AccessKey.issue(user, "kombu test")

    return committed(issue)


def _broker_url(node: NodeProcess, key) -> str:
    host, port = node.url.removeprefix("http://").split(":")
    return f"sqs://{quote(key.access_key_id, safe='')}:{quote(key.secret, safe='')}@{host}:{port}"


def _transport_options() -> dict:
    return {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1, "visibility_timeout": VISIBILITY}


def test_kombu_publishes_and_consumes_through_the_sqs_endpoint(node, access_key):
    queue = f"kombu-{uuid.uuid4().hex[:8]}"
    with Connection(_broker_url(node, access_key), transport_options=_transport_options()) as conn:
        q = conn.SimpleQueue(queue)
        try:
            for i in range(5):
                q.put({"n": i, "text": "héllo"})
            got = []
            for _ in range(5):
                m = q.get(block=True, timeout=10)
                got.append(m.payload["n"])
                assert m.payload["text"] == "héllo"
                m.ack()
            assert sorted(got) == list(range(5))
            # acked means deleted: nothing comes back after the visibility timeout
            time.sleep(VISIBILITY + 1)
            with pytest.raises(q.Empty):
                q.get(block=True, timeout=2)
        finally:
            q.close()


def _worker(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    log = open(tmp_path / "celery.log", "ab")  # noqa: SIM115 - the worker holds it; closed when the test process exits
    return subprocess.Popen(
        [
            CELERY,
            "-A",
            "tests.integration.sqs_celery_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "-l",
            "info",
            "-n",
            "sqs@%h",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _ran(out: Path) -> Counter:
    done: Counter = Counter()
    for f in out.glob("*.log"):
        done.update(int(line) for line in f.read_text().split())
    return done


def _worker_env(node, access_key, queue: str, out, **extra: str) -> dict[str, str]:
    """The environment of the Celery app of tests/integration/sqs_celery_app.py (its broker
    the node's SQS endpoint, its queue, the folder its tasks write to)."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MQ_SQS_BROKER_URL": _broker_url(node, access_key),
        "MQ_SQS_QUEUE": queue,
        "MQ_SQS_OUT": str(out),
        "MQ_SQS_VISIBILITY": str(VISIBILITY),
        **extra,
    }


def test_a_celery_worker_runs_every_task_once_over_sqs(node, access_key, tmp_path, monkeypatch):
    queue = f"celery-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "ran"
    out.mkdir()
    env = _worker_env(node, access_key, queue, out)
    # Celery's CELERY_BROKER_URL wins over the app's broker_url: the suite's (Redis) must go
    env.pop("CELERY_BROKER_URL", None)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    for k in ("MQ_SQS_BROKER_URL", "MQ_SQS_QUEUE", "MQ_SQS_OUT", "MQ_SQS_VISIBILITY"):
        monkeypatch.setenv(k, env[k])
    from tests.integration.sqs_celery_app import app, record

    app.conf.broker_url = env["MQ_SQS_BROKER_URL"]
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = _transport_options()
    assert app.connection_for_write().as_uri().startswith("sqs://")
    # given 500 tasks and one that runs longer than the queue's visibility timeout, published
    # through kombu's SQS transport
    record.delay(-1, sleep=LONG_SLEEP)
    for n in range(TASKS):
        record.delay(n)
    # when a real Celery worker (two processes) consumes the queue
    proc = _worker(tmp_path, env)
    try:
        wait_until(lambda: sum(_ran(out).values()) >= TASKS + 1, 180, "every task to run")
        # then, past another visibility timeout (a message not deleted would come back now),
        # every task ran exactly once, the long one too
        time.sleep(VISIBILITY + 2)
        ran = _ran(out)
        assert set(ran) == set(range(-1, TASKS)), sorted(set(range(-1, TASKS)) - set(ran))[:10]
        assert [n for n, c in ran.items() if c != 1] == []
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    log = (tmp_path / "celery.log").read_text(errors="replace")
    assert "transport:   sqs://" in log and "Traceback" not in log


def test_a_celery_task_over_sqs_continues_its_senders_trace_in_the_worker(node, access_key, tmp_path, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from workers import celery_tracing

    queue, out, traces, env, record = _traced_worker_setup(node, access_key, tmp_path, monkeypatch, "traced")
    # given a producer whose OpenTelemetry SDK keeps its spans in memory, and a Celery worker
    # whose SDK writes its spans as JSON lines
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    celery_tracing.use(provider)
    try:
        # when the producer sends a task over sqs:// inside a span of its own
        with provider.get_tracer("shop").start_as_current_span("checkout"):
            record.delay(7)
    finally:
        celery_tracing.use(None)
    (producer,) = memory.get_finished_spans()
    proc = _worker(tmp_path, env)
    try:
        wait_until(lambda: traces.exists() and '"process ' in traces.read_text(), 60, "the worker's span")
    finally:  # the span is written as it ends: nothing is left to wait for
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    # then the worker ran it inside a CONSUMER span, the child of the producer's span
    assert _ran(out) == Counter({7: 1})
    (span,) = [json.loads(line) for line in traces.read_text().splitlines()]
    ctx = producer.get_span_context()
    assert (span["trace_id"], span["parent_id"]) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert (span["name"], span["kind"], span["status"]) == (f"process {queue}", "CONSUMER", "UNSET")
    assert span["attributes"]["celery.task.name"] == "sqs_tasks.record"
    assert span["attributes"]["messaging.operation.type"] == "process"


def _traced_worker_setup(node, access_key, tmp_path, monkeypatch, prefix: str):
    """A queue of its own, the folder its tasks record runs in, the file the worker writes its
    spans to, the worker's environment, and this process's Celery app sending over sqs:// to
    that queue (its ``record`` task)."""
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "ran"
    out.mkdir()
    traces = tmp_path / "worker-spans.jsonl"
    env = _worker_env(node, access_key, queue, out, MQ_SQS_TRACES=str(traces))
    env.pop("CELERY_BROKER_URL", None)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    from tests.integration.sqs_celery_app import app, record

    app.conf.broker_url = env["MQ_SQS_BROKER_URL"]
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = _transport_options()
    return queue, out, traces, env, record


#: a task's trace context whose tracestate holds a line feed, a forged log record and ANSI escapes
FORGED_LINE = "2025-01-01 00:00:00 ERROR celery.worker forged by a task's sender"  # (no comma: it ends a member)
FORGED_CONTEXT = {
    "traceparent": "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01",
    "tracestate": f"rojo=1\n{FORGED_LINE}\x1b[2J\x1b[31m",
}


def test_a_task_whose_tracestate_forges_a_log_line_runs_in_its_trace_and_the_worker_logs_none_of_it(
    node, access_key, tmp_path, monkeypatch
):
    _, out, traces, env, record = _traced_worker_setup(node, access_key, tmp_path, monkeypatch, "forged")
    # given a task sent over sqs:// whose headers carry a traceparent and a tracestate that
    # holds a line feed, a forged log record and ANSI escapes (anyone who may send to the
    # queue may write a task's headers)
    record.apply_async((9,), headers=FORGED_CONTEXT)
    # when a Celery worker whose SDK writes its spans as JSON lines runs it
    proc = _worker(tmp_path, env)
    try:
        wait_until(lambda: traces.exists() and '"process ' in traces.read_text(), 60, "the worker's span")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # then it ran, in the trace its traceparent names (the tracestate dropped)
    assert _ran(out) == Counter({9: 1})
    (span,) = [json.loads(line) for line in traces.read_text().splitlines()]
    assert (span["trace_id"], span["parent_id"]) == ("5759e988bd862e3fe1be46a994272793", "53995c3f42cd8ad8")
    # and the worker's log has none of the tracestate raw: no forged record, no escape sequence
    log = (tmp_path / "celery.log").read_text(errors="replace")
    assert "sqs_tasks.record" in log  # (the worker logged its task)
    assert [line for line in log.splitlines() if line.startswith(FORGED_LINE) or "\x1b" in line] == []
