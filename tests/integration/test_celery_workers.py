"""Real Celery workers (``celery -A config worker``) consuming a real node over PostgreSQL + Redis.

The handlers are in ``handlers_for_tests`` (queue ``work``); each worker process writes what it
processed to its own file, and the service's attempt log (``GET /api/v1/logs``) must agree:
every message processed exactly once when nothing fails, an abandoned attempt recorded when a
worker dies holding a message, no second delivery while a worker heartbeats through a long task,
and failed attempts ending in the dead-letter queue.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.handlers_for_tests import QUEUE, events
from tests.integration.nodes import Client, database_url
from tests.launcher import ROOT, wait_until
from workers.models import Consumer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CELERY = str(Path(sys.executable).with_name("celery"))


_wait = wait_until


class WorkerProcess:
    """``celery -A config worker --pool solo -c N`` in its own process group."""

    def __init__(self, env: dict[str, str], log_path: Path, concurrency: int):
        self.env, self.log_path, self.concurrency = env, log_path, concurrency
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> WorkerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    CELERY,
                    "-A",
                    "config",
                    "worker",
                    "--pool",
                    "solo",
                    "-c",
                    str(self.concurrency),
                    "-l",
                    "info",
                    "-n",
                    f"{self.log_path.stem}@%h",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while "consuming [" not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not consuming after {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the whole group: no log flush, no message given back."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL whatever is left of the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)


@pytest.fixture
def handler_out(tmp_path) -> Path:
    out = tmp_path / "handled"
    out.mkdir()
    return out


@pytest.fixture
def celery_worker(tmp_path, node, token, handler_out):
    """Start real Celery workers on demand (``start(concurrency, **env)``); all are stopped at the end."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MQ_DATA_DIR": str(tmp_path / "worker-data"),
        "CELERY_BROKER_URL": "filesystem://",
        "QUEUE_API_URL": node.url,
        "QUEUE_API_TOKEN": token,
        "WORKER_HANDLERS": "tests.integration.handlers_for_tests",
        "TEST_HANDLER_OUT": str(handler_out),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("WORKER_QUEUES", None)
    env.pop("WORKER_PIPELINING", None)
    workers: list[WorkerProcess] = []

    def start(concurrency: int = 1, **extra_env: str) -> WorkerProcess:
        w = WorkerProcess({**env, **extra_env}, tmp_path / f"worker{len(workers)}.log", concurrency)
        workers.append(w)
        return w.start()

    yield start
    for w in workers:
        w.stop()


def _create_queue(node_api: Client, **fields) -> None:
    r = node_api.post("queues", fields)
    assert r.status_code == 201, r.text
    name = fields["name"]
    _wait(
        lambda: all(p["owner"] for p in node_api.get(f"queues/{name}/partitions").json()["partitions"]),
        20,
        f"the node to own every partition of {name}",
    )


def _enqueue(node_api: Client, messages: list[dict]) -> list[str]:
    r = node_api.post(f"queues/{QUEUE}/enqueue", {"messages": messages})
    assert r.status_code == 201, r.text
    return r.json()["ids"]


def _logs(node_api: Client, **params) -> list[dict]:
    query = "&".join(f"{k}={v}" for k, v in {"queue": QUEUE, "limit": 1000, **params}.items())
    r = node_api.get(f"logs?{query}")
    assert r.status_code == 200, r.text
    return r.json()["records"]


def _attempts(node_api: Client, mid: str) -> list[tuple[int, str]]:
    return sorted((r["attempt"], r["outcome"]) for r in _logs(node_api, message=mid))


def _t(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_a_worker_drains_a_queue_processing_each_message_once(node_api, celery_worker, handler_out):
    # given 200 messages in "work"
    _create_queue(node_api, name=QUEUE, visibility_timeout=10)
    ids = _enqueue(node_api, [{"body": f"m{i}"} for i in range(200)])
    # when a real worker with two slots drains it
    worker = celery_worker(2)
    t0 = time.monotonic()
    drained = _wait(lambda: len(_logs(node_api)) >= 200, 40, "200 attempt records")
    time.sleep(0.6)  # a record beyond 200 would be a duplicate; give it one more flush
    records = _logs(node_api)
    worker.stop()
    # then each message was processed exactly once...
    done = Counter(mid for event, mid, _, _ in events(handler_out) if event == "done")
    started = Counter(mid for event, mid, _, _ in events(handler_out) if event == "start")
    assert set(done) == set(ids) and set(done.values()) == {1}, "a message processed twice or never"
    assert started == done
    # ...and the service logged one successful attempt per message, with its stage times
    assert len(records) == 200
    assert Counter(r["message_id"] for r in records) == Counter(ids)
    assert {(r["outcome"], r["attempt"]) for r in records} == {("succeeded", 1)}
    for r in records:
        stages = [r["preprocess_started_at"], r["preprocess_ended_at"], r["process_started_at"], r["process_ended_at"]]
        assert all(stages), r
        pre_start, pre_end, proc_start, proc_end = map(_t, stages)
        assert pre_start <= pre_end <= proc_start <= proc_end, r
    stats = node_api.get(f"queues/{QUEUE}/stats").json()
    assert stats["depth"] == 0 and stats["in_flight"] == 0
    print(
        f"[drain] 200 messages, 2 slots: drained in {drained:.2f}s "
        f"({200 / max(drained, 1e-9):.0f} msg/s, worker up {time.monotonic() - t0:.1f}s)"
    )


def test_a_message_held_by_a_killed_worker_is_processed_by_another(node_api, celery_worker, handler_out):
    # given a worker processing a message that hangs on its first delivery
    _create_queue(node_api, name=QUEUE, visibility_timeout=2, partitions=1)
    # (a short long poll: when A is killed, no dequeue of A's may still be waiting at the node, or
    # the node would hand the message to that dead connection once it is visible again: attempt 2)
    worker_a = celery_worker(1, WORKER_WAIT="0.5")
    (mid,) = _enqueue(node_api, [{"body": "hang", "attributes": {"behaviour": "hang-first"}}])
    _wait(lambda: ("start", mid, 1) in {e[:3] for e in events(handler_out)}, 10, "worker A to start it")
    started = time.monotonic()
    _wait(lambda: Consumer.objects.filter(held__contains=[mid]).exists(), 5, "A's heartbeat to hold it")
    time.sleep(max(0.0, 0.8 - (time.monotonic() - started)))  # A's one dequeue for the next message is over
    # when that worker is killed with SIGKILL and another one starts
    worker_a.kill()
    killed = time.monotonic()
    worker_b = celery_worker(1)
    # then the second worker processes it after the visibility timeout, as its second delivery
    _wait(lambda: "succeeded" in {o for _, o in _attempts(node_api, mid)}, 20, "the message to succeed")
    recovered = time.monotonic() - killed
    worker_b.stop()
    done = [e for e in events(handler_out) if e[0] == "done"]
    assert [(mid_, count) for _, mid_, count, _ in done] == [(mid, 2)]
    assert _attempts(node_api, mid) == [(1, "abandoned"), (2, "succeeded")]
    abandoned = _logs(node_api, message=mid, outcome="abandoned")[0]
    assert abandoned["worker"] == Consumer.objects.get(held__contains=[mid], pid=worker_a.proc.pid).pk
    assert worker_a.proc.returncode == -signal.SIGKILL
    print(f"[sigkill] processed by worker B {recovered:.2f}s after worker A was killed (visibility 2 s)")


def test_a_long_task_is_never_delivered_twice_while_its_worker_heartbeats(node_api, celery_worker, handler_out):
    # given a worker with a free second slot, and a task four times the visibility timeout
    _create_queue(node_api, name=QUEUE, visibility_timeout=1)
    celery_worker(2)
    (mid,) = _enqueue(node_api, [{"body": "long", "attributes": {"behaviour": "long", "seconds": 4}}])
    # when it runs to the end
    took = _wait(lambda: _attempts(node_api, mid), 20, "the attempt record")
    time.sleep(1.2)  # past one more visibility timeout: a redelivery would show now
    # then it was processed once, in one attempt
    assert [e[:3] for e in events(handler_out)] == [("start", mid, 1), ("done", mid, 1)]
    assert _attempts(node_api, mid) == [(1, "succeeded")]
    print(f"[long] a 4 s task with a 1 s visibility timeout: one attempt, recorded after {took:.2f}s")


def test_a_failing_message_ends_in_the_dead_letter_queue(node_api, celery_worker, handler_out):
    # given a queue that sets messages aside after two deliveries
    _create_queue(node_api, name="work-dlq")
    _create_queue(node_api, name=QUEUE, visibility_timeout=5, dead_letter_queue="work-dlq", max_receives=2)
    (mid,) = _enqueue(node_api, [{"body": "bad", "attributes": {"behaviour": "fail"}}])
    # when a worker's handler fails on it every time
    celery_worker(1)
    took = _wait(lambda: node_api.get("queues/work-dlq/stats").json()["depth"] == 1, 30, "the dead letter")
    # then both attempts are logged as failed, with the error, and it left the queue
    time.sleep(0.6)
    records = _logs(node_api, message=mid)
    assert sorted((r["attempt"], r["outcome"]) for r in records) == [(1, "failed"), (2, "failed")]
    assert all("told to fail" in r["error"] and "RuntimeError" in r["traceback"] for r in records)
    assert [e[:3] for e in events(handler_out)] == [("start", mid, 1), ("start", mid, 2)]
    stats = node_api.get(f"queues/{QUEUE}/stats").json()
    assert stats["depth"] == 0 and stats["in_flight"] == 0
    print(f"[dead letter] failed twice, dead-lettered after {took:.2f}s")


def test_a_worker_consumes_a_topic_subscription_unchanged(node_api, celery_worker, handler_out):
    # given a topic with two subscriptions and 30 messages published
    r = node_api.post("topics", {"name": "news", "partitions": 2, "visibility_timeout": 10})
    assert r.status_code == 201, r.text
    for sub in ("mail", "sms"):
        assert node_api.post("topics/news/subscriptions", {"name": sub}).status_code == 201
    _wait(
        lambda: all(p["owner"] for p in node_api.get("queues/news/partitions").json()["partitions"]),
        20,
        "the node to own every partition of news",
    )
    r = node_api.post("topics/news/publish", {"messages": [{"body": f"n{i}"} for i in range(30)]})
    assert r.status_code == 201, r.text
    ids = r.json()["ids"]
    # when a real worker consumes "news/mail" (its handler is registered under that name)
    worker = celery_worker(
        1,
        WORKER_QUEUES="news/mail",
        WORKER_HANDLERS="tests.integration.handlers_for_tests,tests.integration.handlers_for_topic_tests",
    )
    _wait(
        lambda: node_api.get("topics/news/subscriptions/mail/stats").json()["held"] == 0,
        40,
        "the mail subscription to be drained",
    )
    worker.stop()
    # then each message was processed once for "mail", and "sms" still holds all of them
    done = Counter(mid for event, mid, _, _ in events(handler_out) if event == "done")
    assert set(done) == set(ids) and set(done.values()) == {1}
    assert node_api.get("topics/news/subscriptions/sms/stats").json()["held"] == 30
    got = node_api.post("topics/news/subscriptions/sms/dequeue", {"max": 100}).json()["messages"]
    assert sorted(m["id"] for m in got) == sorted(ids)
