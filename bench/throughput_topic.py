"""The topic run of bench/throughput.py (``--topic``): our topics against Redis Streams."""

from __future__ import annotations

import json
import time
import uuid

from common import fmt_rate, fmt_ratio, log, median
from throughput_systems import OursSystem, StreamsSystem

from tests.launcher import with_redis_db

TOPIC_SUBSCRIPTIONS = (1, 3, 10)
TOPIC_BODY = "x" * 100
TOPIC_BATCH = 100


def topic_round_ours(system: OursSystem, r, subs: int, n: int, tag: str) -> dict:
    """One round on our node: a topic with 4 partitions and `subs` subscriptions; publish n
    messages (100 per call), then drain each subscription in turn (dequeue 100 + ack them with
    their receipts). publish = n / publish seconds; deliver = deliveries / drain seconds; bytes =
    Redis used_memory growth over the publish phase / n (the store right after publishing)."""
    name = f"bt-{subs}-{tag}"
    status, body = system.node.api("POST", "/api/v1/topics", {"name": name, "partitions": 4})
    assert status == 201, body
    conn = system.node.connection()  # keep-alive, as the Redis client keeps its connection
    try:
        for k in range(subs):
            status, body = system.node.api("POST", f"/api/v1/topics/{name}/subscriptions", {"name": f"s{k}"})
            assert status == 201, body
        time.sleep(1.5)  # the node reopens the partitions with the subscriptions
        before = r.info("memory")["used_memory"]
        t0 = time.perf_counter()
        for i in range(0, n, TOPIC_BATCH):
            msgs = [{"body": TOPIC_BODY} for _ in range(min(TOPIC_BATCH, n - i))]
            status, body = system.node.api("POST", f"/api/v1/topics/{name}/publish", {"messages": msgs}, conn=conn)
            assert status == 201, body
        publish_s = time.perf_counter() - t0
        per_message = (r.info("memory")["used_memory"] - before) / n
        t0 = time.perf_counter()
        delivered = 0
        for k in range(subs):
            while True:
                status, body = system.node.api(
                    "POST",
                    f"/api/v1/topics/{name}/subscriptions/s{k}/dequeue",
                    {"max": TOPIC_BATCH, "visibility_timeout": 60},
                    conn=conn,
                )
                assert status == 200, body
                got = json.loads(body)["messages"]
                if not got:
                    break
                delivered += len(got)
                status, body = system.node.api(
                    "POST",
                    f"/api/v1/topics/{name}/subscriptions/s{k}/ack",
                    {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]},
                    conn=conn,
                )
                assert status == 200, body
        drain_s = time.perf_counter() - t0
        assert delivered == n * subs, (delivered, n * subs)
    finally:
        conn.close()
        system.node.api("DELETE", f"/api/v1/topics/{name}")
    return {"publish": n / publish_s, "deliver": delivered / drain_s, "bytes": per_message}


def topic_round_streams(streams: StreamsSystem, subs: int, n: int, tag: str) -> dict:
    """The same round on Redis Streams, the fan-out baseline: one stream with one consumer group
    per subscription; publish = a pipeline of 100 XADDs per call; drain each group in turn with
    XREADGROUP COUNT 100 + XACK of those ids. Same figures as topic_round_ours; bytes = used_memory
    growth over the publish phase / n (groups created before, so no pending entries are counted).
    The stream is deleted after the round."""
    r = streams.r
    key = f"mqbench:topic:{subs}-{tag}"
    groups = [f"s{k}" for k in range(subs)]
    r.delete(key)
    streams.keys.add(key)
    try:
        for g in groups:
            r.xgroup_create(key, g, id="0", mkstream=True)
        before = r.info("memory")["used_memory"]
        t0 = time.perf_counter()
        added = 0
        for i in range(0, n, TOPIC_BATCH):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(TOPIC_BATCH, n - i)):
                pipe.xadd(key, {b"body": TOPIC_BODY})
            added += sum(1 for x in pipe.execute() if x)
        publish_s = time.perf_counter() - t0
        per_message = (r.info("memory")["used_memory"] - before) / n
        assert added == n, (added, n)
        t0 = time.perf_counter()
        delivered = acked = 0
        for g in groups:
            while True:
                res = r.xreadgroup(g, "c0", {key: ">"}, count=TOPIC_BATCH)
                ids = [eid for _stream, entries in res or [] for eid, _fields in entries]
                if not ids:
                    break
                delivered += len(ids)
                acked += int(r.xack(key, g, *ids))
        drain_s = time.perf_counter() - t0
        assert delivered == n * subs, (delivered, n * subs)
        assert acked == delivered, (acked, delivered)
    finally:
        streams.drop_target({"stream": key})
    return {"publish": n / publish_s, "deliver": delivered / drain_s, "bytes": per_message}


def print_topic_table(args, rows: list[dict]) -> None:
    """Medians per system and subscription count, with the ratios ours / Redis Streams."""

    def med(system: str, subs: int, figure: str):
        return median([x[figure] for x in rows if x["system"] == system and x["subs"] == subs])

    def fmt_bytes(x) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    print(
        f"\ntopic run: {args.topic_messages} messages of 100 bytes per round, published 100 per call, "
        f"drained 100 per call (dequeue/XREADGROUP + ack/XACK), one client; medians of {args.repeat} "
        f"rounds per system, interleaved (ours, streams, ours, ...)"
    )
    print(
        "ours = our node, redis backend, topic with 4 partitions; streams = Redis Streams on the same Redis "
        f"(DB {args.streams_db}), one stream, one consumer group per subscription"
    )
    print(
        "deliv/s = messages delivered and acked over all subscriptions / drain seconds; B/msg = Redis "
        "used_memory growth over the publish phase / messages"
    )
    print(f"{'':>5} {'ours':^31} {'redis streams':^31} {'ours / streams':^19}")
    print(
        f"{'subs':>5} {'publish/s':>10} {'deliv/s':>10} {'B/msg':>9} {'publish/s':>10} {'deliv/s':>10} {'B/msg':>9}"
        f" {'publish':>9} {'deliv':>9}"
    )
    for subs in TOPIC_SUBSCRIPTIONS:
        o = {f: med("ours", subs, f) for f in ("publish", "deliver", "bytes")}
        s = {f: med("streams", subs, f) for f in ("publish", "deliver", "bytes")}
        print(
            f"{subs:>5} {fmt_rate(o['publish']):>10} {fmt_rate(o['deliver']):>10} {fmt_bytes(o['bytes']):>9} "
            f"{fmt_rate(s['publish']):>10} {fmt_rate(s['deliver']):>10} {fmt_bytes(s['bytes']):>9} "
            f"{fmt_ratio(o['publish'], s['publish']):>9} {fmt_ratio(o['deliver'], s['deliver']):>9}"
        )


def run_topic(args) -> None:
    """Topic run: for 1, 3 and 10 subscriptions, --repeat rounds on our node (redis backend) and
    on Redis Streams, interleaved round by round so background load hits both alike. Each round
    publishes --topic-messages messages and drains every subscription (see topic_round_ours and
    topic_round_streams). A message is stored once, so our bytes/message must not grow with the
    subscriptions; a stream stores it once too, which makes it the baseline for that figure."""
    import redis as redis_lib

    n = args.topic_messages
    system = OursSystem(args, "redis")
    streams = StreamsSystem(args)
    system.start()
    r = redis_lib.Redis.from_url(with_redis_db(args.redis_url, args.kv_redis_db))
    rows = []

    def record(label: str, subs: int, rep: int, row: dict) -> None:
        log(
            f"topic {label} subs={subs} round {rep + 1}/{args.repeat}: publish {fmt_rate(row['publish'])}/s"
            f"  deliveries {fmt_rate(row['deliver'])}/s  {row['bytes']:,.0f} B/msg"
        )
        rows.append({"system": label, "subs": subs} | row)

    try:
        streams.start()
        log(streams.describe())
        for subs in TOPIC_SUBSCRIPTIONS:
            for rep in range(args.repeat):
                tag = f"{rep}-{uuid.uuid4().hex[:6]}"
                record("ours", subs, rep, topic_round_ours(system, r, subs, n, tag))
                record("streams", subs, rep, topic_round_streams(streams, subs, n, tag))
    finally:
        r.close()
        try:
            streams.stop()
        except Exception as exc:
            log(f"{streams.name}: stop/cleanup failed: {exc}")
        system.stop()
    print_topic_table(args, rows)
