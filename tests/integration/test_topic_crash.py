"""A node killed mid-load on a topic with subscriptions: nothing lost for any subscription.

Producers publish in batches while two subscriptions consume (one acks as it goes, one only
reads) and a third does nothing; the node is SIGKILLed part-way; a second node takes the
partitions over after the lease. Each subscription must then get every confirmed message it
did not ack, and none it acked. An ack whose answer was lost in the kill is in doubt: the node
may have applied it, so such a message may or may not come back to "acker".
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.nodes import Client, drain
from tests.launcher import wait_until

pytestmark = pytest.mark.cluster

BATCH = 50


@pytest.mark.slow
def test_sigkill_on_a_topic_loses_nothing_for_any_subscription(node_factory, token):
    first = node_factory()
    second = node_factory(start=False)
    try:
        c = Client(first.url, token)
        assert (
            c.post("topics", {"name": "feed", "partitions": 3, "block_size": 32, "lease_period": 2}).status_code == 201
        )
        for sub in ("acker", "reader", "idle"):
            assert c.post("topics/feed/subscriptions", {"name": sub}).status_code == 201
        wait_until(
            lambda: all(p["owner"] for p in c.get("queues/feed/partitions").json()["partitions"]),
            20,
            "the node to own every partition",
        )
        confirmed: set[str] = set()
        acked: set[str] = set()
        ack_sent: set[str] = set()  # acked, or in doubt if the answer never came
        stop = threading.Event()
        lock = threading.Lock()

        def produce():
            i = 0
            while not stop.is_set():
                try:
                    r = c.post(
                        "topics/feed/publish", {"messages": [{"body": f"m{i + k}"} for k in range(BATCH)]}, timeout=5
                    )
                except Exception:  # noqa: BLE001 - the node died mid-call: not confirmed
                    return
                if r.status_code == 201:
                    with lock:
                        confirmed.update(r.json()["ids"])
                i += BATCH

        def consume():
            while not stop.is_set():
                try:
                    got = c.post("topics/feed/subscriptions/acker/dequeue", {"max": 40}, timeout=5).json()["messages"]
                    c.post("topics/feed/subscriptions/reader/dequeue", {"max": 40, "visibility_timeout": 60}, timeout=5)
                    if got:
                        with lock:
                            ack_sent.update(m["id"] for m in got)
                        r = c.post(
                            "topics/feed/subscriptions/acker/ack",
                            {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]},
                            timeout=5,
                        )
                        if r.status_code == 200:
                            with lock:
                                acked.update(m["id"] for m in got)
                except Exception:  # noqa: BLE001 - the node died
                    return

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        wait_until(lambda: len(confirmed) >= 1500, 60, "1,500 confirmed messages")
        first.kill()
        stop.set()
        for t in threads:
            t.join(10)
        t_kill = time.monotonic()
        second.start()
        c2 = Client(second.url, token)

        wait_until(
            lambda: all(
                p["address"] == f"127.0.0.1:{second.port}"
                for p in c2.get("queues/feed/partitions").json()["partitions"]
            ),
            30,
            "the second node to own every partition",
        )
        resumed = time.monotonic() - t_kill
        got = {
            sub: [m["id"] for m in drain(c2, f"topics/feed/subscriptions/{sub}", batch=500)]
            for sub in ("acker", "reader", "idle")
        }
        for sub, ids in got.items():
            assert len(ids) == len(set(ids)), f"{sub}: a message twice in the drain"
        # nothing confirmed is lost for any subscription...
        assert confirmed <= set(got["idle"]), len(confirmed - set(got["idle"]))
        assert confirmed <= set(got["reader"])
        in_doubt = ack_sent - acked
        assert confirmed - ack_sent <= set(got["acker"]), len(confirmed - ack_sent - set(got["acker"]))
        # ...and what "acker" acknowledged does not come back to it
        assert not (acked & set(got["acker"]))
        # after all three acked, the topic holds nothing
        stats = c2.get("queues/feed/stats").json()
        assert stats["depth"] == 0 and stats["in_flight"] == 0
        print(
            f"[topic crash] {len(confirmed)} confirmed, {len(acked)} acked by 'acker' before the kill "
            f"({len(in_doubt)} more in doubt, {len(in_doubt & set(got['acker']))} of them came back); "
            f"all partitions on the new node {resumed:.1f}s after the kill; nothing lost for any subscription"
        )
    finally:
        first.stop()
        second.stop()
