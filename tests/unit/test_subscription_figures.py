"""A topic's figures per subscription (``PartitionManager.stats().cursors``), which the owner
publishes in ``Partition.cursors`` and ``queues.service.subscription_stats`` sums: what each
subscription holds (not acked yet, in flight included) and since when."""

from __future__ import annotations

import time

from queues.engine.cursor import SubscriptionSpec
from queues.engine.ids import StoredMessage, parse_message_id
from queues.engine.partition import PartitionManager
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow, next_owner


def open_topic(store, row: PartitionRow, subs=("fast", "slow"), *, block_size=4) -> PartitionManager:
    m = next_owner(
        store,
        row,
        block_size=block_size,
        queue="t",
        cache_bytes=1 << 20,
        subscriptions=[SubscriptionSpec(s) for s in subs],
    )
    m.open()
    return m


def test_a_subscription_holds_its_in_flight_messages_and_says_since_when():
    # given a topic with two subscriptions and six messages over two blocks
    store, row = MemoryStore(), PartitionRow()
    m = open_topic(store, row)
    before = time.time()
    m.enqueue([StoredMessage(f"m{i}", time.time()) for i in range(6)])

    # when "fast" takes every message (all in flight) and "slow" takes none
    got = m.dequeue(10, 30.0, "fast")
    figures = m.stats().cursors

    # then both hold all six, "fast" has them in flight, and both know the oldest one's age
    assert len(got) == 6
    assert figures["fast"]["held"] == 6 and figures["fast"]["in_flight"] == 6
    assert figures["slow"]["held"] == 6 and figures["slow"]["in_flight"] == 0
    oldest = figures["fast"]["oldest_enqueued_at"]
    assert oldest is not None and before - 1 <= oldest <= time.time()
    assert figures["slow"]["oldest_enqueued_at"] == oldest

    # when "fast" acks the first block's four
    first_block = parse_message_id(got[0].id).block
    m.ack([(parse_message_id(d.id), d.receipt) for d in got[:4]], sub="fast")
    figures = m.stats().cursors

    # then it holds two, dated by the second block; "slow" still by the first
    assert all(parse_message_id(d.id).block == first_block for d in got[:4])
    assert figures["fast"]["held"] == 2
    assert figures["fast"]["oldest_enqueued_at"] == m.blocks[parse_message_id(got[4].id).block].block.created_at
    assert figures["slow"]["oldest_enqueued_at"] == oldest

    # when it acks the rest: it holds nothing, and has no oldest
    m.ack([(parse_message_id(d.id), d.receipt) for d in got[4:]], sub="fast")
    figures = m.stats().cursors
    assert figures["fast"]["held"] == 0 and figures["fast"]["oldest_enqueued_at"] is None
    assert figures["slow"]["held"] == 6


def test_figures_survive_a_takeover():
    # given a slow subscription holding three messages, one of them in flight
    store, row = MemoryStore(), PartitionRow()
    m = open_topic(store, row)
    m.enqueue([StoredMessage(f"m{i}", time.time()) for i in range(3)])
    assert len(m.dequeue(1, 30.0, "slow")) == 1

    # when another owner takes over (the messages are read back by a scan)
    m2 = open_topic(store, row)
    figures = m2.stats().cursors

    # then it reports the same holding, with the block's time as the oldest
    assert figures["slow"]["held"] == 3 and figures["fast"]["held"] == 3
    assert figures["slow"]["oldest_enqueued_at"] == next(iter(m2.blocks.values())).block.created_at


def test_a_blocks_listing_gives_each_subscription_its_own_state():
    # given a topic's block of 4, whose messages "fast" took (one then acknowledged) and "slow" not
    store, row = MemoryStore(), PartitionRow()
    m = open_topic(store, row)
    ids = m.enqueue([StoredMessage(f"m{i}", time.time()) for i in range(3)])
    got = m.dequeue(10, 30.0, "fast")
    m.ack([(parse_message_id(got[0].id), got[0].receipt)], sub="fast")
    block = parse_message_id(ids[0]).block
    # when the console asks for the block's messages
    listing = m.block_messages(block)
    # then each one has a state per subscription, and the head's unwritten position is not listed
    assert listing is not None and (listing["used"], listing["live"], listing["head"]) == (3, 3, True)
    assert [(x["id"], x["states"]) for x in listing["messages"]] == [
        (ids[0], {"fast": "gone", "slow": "ready"}),
        (ids[1], {"fast": "in_flight", "slow": "ready"}),
        (ids[2], {"fast": "in_flight", "slow": "ready"}),
    ]
    assert listing["messages"][1]["receive_counts"] == {"fast": 1}
    # and a listing is bounded; a block the manager holds nothing of has none
    assert len(m.block_messages(block, limit=1)["messages"]) == 1
    assert m.block_messages("00000009-0123456789abcdef") is None
