"""``/metrics`` and ``readyz`` on real node processes over PostgreSQL + Redis.

The scrape is parsed with ``prometheus_client``'s own parser; after a known workload its
figures must equal the stats API's (``GET …/stats``) and the counts the test made. Access to
``/metrics`` is refused without the token from a network not allowed; ``readyz`` is 503 with
``Retry-After`` on a node whose store nobody answers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.nodes import Client, member_addresses
from tests.launcher import free_port, wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


def scrape(url: str, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of one scrape."""
    r = requests.get(f"{url}/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    samples = [
        ((s.name, tuple(sorted(s.labels.items()))), s.value)
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    ]
    out = dict(samples)
    assert len(out) == len(samples), "a series appears twice in one scrape"
    return out


def value(samples, name: str, **labels: str) -> float:
    """The sample's value, 0 if absent (a counter never incremented has no series)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str, **labels: str) -> float:
    """The sum over the series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_metrics_equal_the_stats_after_a_known_workload(node_factory, token, unique_name):
    # given: a queue whose messages go to a dead-letter queue after one delivery
    node = node_factory()
    c = Client(node.url, token)
    q, dlq = unique_name("m"), unique_name("m-dlq")
    assert c.post("queues", {"name": dlq, "partitions": 1}).status_code == 201
    r = c.post("queues", {"name": q, "partitions": 1, "dead_letter_queue": dlq, "max_receives": 1})
    assert r.status_code == 201, r.text

    # when: enqueue N = 10, dequeue k = 4, ack j = 2, one message dead-lettered
    r = c.post(f"queues/{q}/enqueue", {"messages": [{"body": f"m{i}"} for i in range(10)]})
    assert r.status_code == 201, r.text
    first = c.post(f"queues/{q}/dequeue", {"max": 4, "visibility_timeout": 300}).json()["messages"]
    assert len(first) == 4
    r = c.post(f"queues/{q}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in first[:2]]})
    assert r.json() == {"acked": 2, "not_found": 0}
    # visible again at once: the next dequeue finds it past max_receives and moves it
    doomed = c.post(f"queues/{q}/dequeue", {"max": 1, "visibility_timeout": 0}).json()["messages"]
    assert len(doomed) == 1
    last = c.post(f"queues/{q}/dequeue", {"max": 1, "visibility_timeout": 300}).json()["messages"]
    assert len(last) == 1 and last[0]["id"] != doomed[0]["id"]
    delivered = len(first) + len(doomed) + len(last)

    # then: the scrape agrees with the stats API and with what was done
    stats = c.get(f"queues/{q}/stats").json()
    dlq_stats = c.get(f"queues/{dlq}/stats").json()
    m = scrape(node.url)
    assert stats["depth"] == 10 - 2 - 1 - 3 == value(m, "mq_queue_depth", queue=q, kind="queue")
    assert stats["in_flight"] == 3 == value(m, "mq_queue_in_flight", queue=q, kind="queue")
    assert dlq_stats["depth"] == 1 == value(m, "mq_queue_depth", queue=dlq, kind="queue")
    assert value(m, "mq_queue_dead_letters", queue=q, subscription="", dead_letter_queue=dlq) == 1
    assert value(m, "mq_queue_delayed", queue=q, kind="queue") == 0
    assert 0 < value(m, "mq_queue_oldest_age_seconds", queue=q, kind="queue") < 600
    parts = stats["partitions"]
    assert sum(p["enqueued"] for p in parts) == 10 == value(m, "mq_messages_enqueued_total", queue=q)
    # the stats' "acked" counts the dead letter's removal from the queue too; the metric only acks
    assert value(m, "mq_messages_acked_total", queue=q, subscription="") == 2
    assert sum(p["acked"] for p in parts) == 2 + value(m, "mq_messages_dead_lettered_total", queue=q, subscription="")
    assert sum(p["redelivered"] for p in parts) == value(m, "mq_messages_redelivered_total", queue=q, subscription="")
    assert value(m, "mq_messages_delivered_total", queue=q, subscription="") == delivered == 6
    assert value(m, "mq_messages_dead_lettered_total", queue=q, subscription="") == 1
    assert value(m, "mq_messages_enqueued_total", queue=dlq) == 1
    # per partition: the owner, its epoch, its open
    assert value(m, "mq_partition_owned", queue=q, partition="0", node=parts[0]["owner"]) == 1
    assert value(m, "mq_partition_epoch", queue=q, partition="0") == parts[0]["epoch"]
    assert total(m, "mq_partition_opens_total", queue=q, partition="0") >= 1
    # call latencies: the fast path's and Django's calls under one operation name each
    assert value(m, "mq_api_call_seconds_count", operation="queue-enqueue", status="201") == 1
    assert value(m, "mq_api_call_seconds_count", operation="queue-dequeue", status="200") == 3
    assert value(m, "mq_api_call_seconds_count", operation="queue-stats", status="200") == 2
    # the store, by backend
    assert total(m, "mq_store_call_seconds_count", backend="redis", operation="put_many") > 0
    assert total(m, "mq_store_errors_total") == 0
    # a lease is renewed every third of its period (10 s)
    wait_until(lambda: value(scrape(node.url), "mq_lease_renewals_total", queue=q, partition="0") >= 1, 60, "a renewal")


def test_worker_attempts_are_counted_as_they_are_stored(node_factory, token, unique_name):
    node = node_factory()
    c = Client(node.url, token)
    q = unique_name("m")
    assert c.post("queues", {"name": q, "partitions": 1}).status_code == 201
    mid = c.post(f"queues/{q}/enqueue", {"body": "x"}).json()["id"]
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    record = {
        "message_id": mid,
        "attempt": 1,
        "preprocess_started_at": t0.isoformat(),
        "preprocess_ended_at": (t0 + timedelta(seconds=2)).isoformat(),
        "process_started_at": (t0 + timedelta(seconds=2)).isoformat(),
        "process_ended_at": (t0 + timedelta(seconds=7)).isoformat(),
    }
    r = c.post("logs", {"records": [{**record, "outcome": "failed"}, {**record, "attempt": 2, "outcome": "succeeded"}]})
    assert r.status_code in (200, 201), r.text

    m = scrape(node.url)
    assert value(m, "mq_worker_attempts_total", queue=q, outcome="failed") == 1
    assert value(m, "mq_worker_attempts_total", queue=q, outcome="succeeded") == 1
    assert value(m, "mq_worker_preprocess_seconds_count", queue=q) == 2
    assert value(m, "mq_worker_preprocess_seconds_sum", queue=q) == 4
    assert value(m, "mq_worker_process_seconds_sum", queue=q) == 10


def test_metrics_need_the_token_or_an_allowed_network(node_factory):
    # 192.0.2.0/24 is TEST-NET-1: allowed on paper, never reached; the test calls from loopback
    node = node_factory(METRICS_TOKEN="s3cret-metrics", METRICS_ALLOW="192.0.2.0/24")
    url = f"{node.url}/metrics"
    assert requests.get(url, timeout=10).status_code == 403
    assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 403
    assert requests.get(url, headers={"Authorization": "Token s3cret-metrics"}, timeout=10).status_code == 403
    r = requests.get(url, headers={"Authorization": "Bearer s3cret-metrics"}, timeout=10)
    assert r.status_code == 200 and "mq_node_cooling" in r.text
    # the default: loopback may scrape, with no token configured a bearer is refused
    plain = node_factory()
    assert requests.get(f"{plain.url}/metrics", timeout=10).status_code == 200
    assert requests.get(f"{plain.url}/metrics", headers={"Authorization": "Bearer x"}, timeout=10).status_code == 403


def test_readyz_is_200_on_a_healthy_node_and_503_when_the_store_is_unreachable(node_factory):
    node = node_factory()
    wait_until(lambda: requests.get(f"{node.url}/api/v1/readyz", timeout=10).status_code == 200, 30, "ready")
    assert requests.get(f"{node.url}/api/v1/readyz", timeout=10).json() == {"status": "ready"}

    # a store on a port nobody listens on: alive (healthz), not ready
    nobody = node_factory(KV_URL=f"redis://127.0.0.1:{free_port()}/5")
    r = requests.get(f"{nobody.url}/api/v1/readyz", timeout=10)
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "5"
    assert r.json() == {"status": "not_ready", "not_ready": ["store"]}
    assert requests.get(f"{nobody.url}/api/v1/healthz", timeout=10).status_code == 200
    # and the failed probes show as store errors, the alert's figure
    m = scrape(nobody.url)
    assert value(m, "mq_store_errors_total", backend="redis", operation="get_many") >= 1
    assert value(m, "mq_store_call_seconds_count", backend="redis", operation="get_many") >= 1


def test_metrics_in_multiprocess_mode(node_factory, token, unique_name, tmp_path):
    # given: a node whose prometheus-client keeps its values in files (several processes' mode)
    folder = tmp_path / "prometheus"
    folder.mkdir()
    node = node_factory(PROMETHEUS_MULTIPROC_DIR=str(folder))
    c = Client(node.url, token)
    q = unique_name("m")
    assert c.post("queues", {"name": q, "partitions": 1}).status_code == 201
    # when
    assert c.post(f"queues/{q}/enqueue", {"messages": [{"body": "a"}, {"body": "b"}]}).status_code == 201
    # then: the counters come from the files, the figures from the node
    m = scrape(node.url)
    assert value(m, "mq_messages_enqueued_total", queue=q) == 2
    assert value(m, "mq_queue_depth", queue=q, kind="queue") == 2
    assert value(m, "mq_api_call_seconds_count", operation="queue-enqueue", status="201") == 1
    assert any(folder.glob("*.db"))


def test_topic_figures_equal_the_subscription_stats(node_factory, token, unique_name):
    node = node_factory()
    c = Client(node.url, token)
    t = unique_name("t")
    assert c.post("topics", {"name": t, "partitions": 2}).status_code == 201
    for sub in ("fast", "slow"):
        assert c.post(f"topics/{t}/subscriptions", {"name": sub, "start": "oldest"}).status_code == 201
    assert c.post(f"topics/{t}/publish", {"messages": [{"body": str(i)} for i in range(5)]}).status_code == 201
    got = c.post(f"topics/{t}/subscriptions/fast/dequeue", {"max": 3, "visibility_timeout": 300}).json()["messages"]
    assert len(got) == 3
    r = c.post(f"topics/{t}/subscriptions/fast/ack", {"messages": [{"id": got[0]["id"], "receipt": got[0]["receipt"]}]})
    assert r.json()["acked"] == 1

    m = scrape(node.url)
    for sub, held, in_flight, acked in (("fast", 4, 2, 1), ("slow", 5, 0, 0)):
        stats = c.get(f"topics/{t}/subscriptions/{sub}/stats").json()
        assert stats["held"] == held == value(m, "mq_subscription_held", queue=t, subscription=sub)
        assert stats["in_flight"] == in_flight == value(m, "mq_subscription_in_flight", queue=t, subscription=sub)
        assert stats["acked"] == acked == value(m, "mq_messages_acked_total", queue=t, subscription=sub)
    assert value(m, "mq_messages_enqueued_total", queue=t) == 5
    assert value(m, "mq_messages_delivered_total", queue=t, subscription="fast") == 3
    assert value(m, "mq_api_call_seconds_count", operation="topic-publish", status="201") == 1
    assert value(m, "mq_api_call_seconds_count", operation="subscription-dequeue", status="200") == 1


def test_one_scrape_is_the_whole_node_of_several_processes(node_factory, token, unique_name):
    # given: a node of two processes, each holding one of the queue's two partitions
    node = node_factory(processes=2)
    c = Client(node.url, token)
    q = unique_name("mp")
    assert c.post("queues", {"name": q, "partitions": 2}).status_code == 201
    members = member_addresses(node)
    assert len(members) == 2

    def one_each() -> bool:
        owners = {p["address"] for p in c.get(f"queues/{q}/partitions").json()["partitions"]}
        return owners == set(members)

    wait_until(one_each, 30, "each process to hold one partition")
    # when: messages go to both partitions (groups hashed to each), through the one port
    from queues.engine.ids import group_partition

    groups = [next(f"g{i}" for i in range(1000) if group_partition(f"g{i}", 2) == k) for k in (0, 1)]
    for g, n in zip(groups, (3, 4), strict=True):
        msgs = [{"body": "x", "group": g} for _ in range(n)]
        assert c.post(f"queues/{q}/enqueue", {"messages": msgs}).status_code == 201
    # then: whichever process answers, the scrape adds up both: counters (from the files) and
    # the figures read from the partition managers (asked of the sibling)
    for _ in range(4):  # new connections: the kernel spreads them over the processes
        m = scrape(node.url)
        assert value(m, "mq_messages_enqueued_total", queue=q) == 7
        assert value(m, "mq_queue_depth", queue=q, kind="queue") == 7
        assert value(m, "mq_queue_partitions_served", queue=q, kind="queue") == 2
        assert total(m, "mq_partition_owned", queue=q) == 2
        assert value(m, "mq_node_processes_missing") == 0
