#!/usr/bin/env python
"""What the SDK's batching saves an application that holds one message at a time: the buffered
producer against ``enqueue`` a call each, the prefetching consumer against receive-one /
ack-one, and the asyncio client's CPU a message against the synchronous client's in threads.

It MEASURES AND PRINTS; it never passes or fails. One node (``manage.py runnode``, its default
processes) on the ``--backend`` store; each case on a queue of its own (``--partitions``):

1. **Producers.** ``--threads`` threads each send one message at a time for ``--seconds``:
   ``enqueue`` (a call each, the baseline); ``Producer.send`` without waiting for the futures
   (then one flush), with dedup IDs given (the default) and without; ``Producer.send`` with each
   thread waiting for its own future. Messages a second, and the latency of a message from the
   call to its ID (p50, p99), beside the producer's batch calls' own (p50, p99), and the p99 of
   what the producer added to a message's call-to-ID (that time less its own batch call's: the
   wait for the batch in flight and the linger, and the resolving after), which should be at
   most the linger plus one batch call.
2. **Consumers.** ``--consume`` messages enqueued, then handled by ``--consumer-threads``
   threads of ``--handler-ms`` each (a sleep): ``Consumer`` prefetching (acks through an
   ``Acker``) against ``Consumer(prefetch=False)`` (each thread receives one, acks it).
   Messages a second, and how many were delivered twice (they should be none).
3. **asyncio.** ``--cpu-messages`` enqueues from one event loop (``AsyncClient``, ``--threads``
   at a time) against the synchronous client in ``--threads`` threads: this process's CPU
   (``time.process_time``) a message.

    scripts/with-services.sh python bench/client_batching.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from common import BenchNode, exit_on_sigterm, log

from mq_client import Client, Consumer, Message, Producer
from mq_client.producer import DEFAULT_LINGER


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--threads", type=int, default=32, help="sending threads (and the asyncio concurrency)")
    p.add_argument("--seconds", type=float, default=5, help="how long each producer case sends")
    p.add_argument(
        "--lingers",
        default=f"{DEFAULT_LINGER:g},0.005",
        help="the producer's lingers to measure, seconds, comma-separated",
    )
    p.add_argument("--consume", type=int, default=5000, help="messages of each consumer case")
    p.add_argument("--consumer-threads", type=int, default=8)
    p.add_argument("--handler-ms", type=float, default=1.0)
    p.add_argument("--cpu-messages", type=int, default=3200, help="messages of each CPU case and round")
    p.add_argument("--cpu-rounds", type=int, default=3, help="rounds of the CPU cases, interleaved (medians)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--backend", default="redis", help="the node's key-value store: redis, postgres, file")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--kv-redis-db", type=int, default=1, help="Redis DB number of the redis store")
    p.add_argument("--startup-timeout", type=float, default=90)
    return p.parse_args(argv)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` in ms; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def new_queue(client: Client, partitions: int) -> str:
    name = f"cb-{uuid.uuid4().hex[:8]}"
    client.create_queue(name, partitions=partitions)
    deadline = time.monotonic() + 30
    while not all(p.address for p in client.partitions(name)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: partitions not served within 30 s")
        time.sleep(0.1)
    return name


def run_threads(count: int, seconds: float, work: Callable[[int, Callable[[], bool]], None]) -> float:
    """``work(i, going)`` on ``count`` threads until ``seconds`` pass (``going()`` turns False);
    the seconds they took."""
    stop = threading.Event()
    threads = [threading.Thread(target=work, args=(i, lambda: not stop.is_set())) for i in range(count)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def timed_batches(client: Client) -> list[tuple[float, float, list[str]]]:
    """Record each ``enqueue_batch`` call of ``client``: when it started and ended
    (``time.perf_counter``) and the bodies it carried."""
    calls: list[tuple[float, float, list[str]]] = []
    inner = client.enqueue_batch

    def enqueue_batch(queue, messages):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return inner(queue, messages)
        finally:
            calls.append((t, time.perf_counter(), [m["body"] for m in messages]))

    client.enqueue_batch = enqueue_batch  # type: ignore[method-assign]
    return calls


def added_latencies(
    calls: list[tuple[float, float, list[str]]], sent: dict[str, float], answered: dict[str, float]
) -> list[float]:
    """What the producer added to each answered message's call-to-ID: that time less its own
    batch call's (the wait for the batch in flight and the linger before its call, and the
    resolving after), in seconds. A message sent again (a refused batch split) counts its last
    call."""
    own: dict[str, float] = {}
    for start, end, bodies in calls:
        for body in bodies:
            own[body] = end - start
    return [answered[b] - sent[b] - own[b] for b in answered if b in own]


def producers(args: argparse.Namespace, node: BenchNode) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}

    # the baseline: a call a message
    client = Client(node.url, node.token)
    queue = new_queue(client, args.partitions)
    lat: list[list[float]] = [[] for _ in range(args.threads)]

    def direct(i: int, going: Callable[[], bool]) -> None:
        n = 0
        while going():
            t = time.perf_counter()
            client.enqueue(queue, f"{i}-{n}")
            lat[i].append(time.perf_counter() - t)
            n += 1

    took = run_threads(args.threads, args.seconds, direct)
    every = [x for row in lat for x in row]
    out["enqueue, a call each"] = {"rate": len(every) / took, "p50": pct(every, 0.5), "p99": pct(every, 0.99)}

    lingers = [float(x) for x in args.lingers.split(",")]
    cases = [(f"producer {lg * 1000:g} ms, {how}", lg, False, wait) for lg in lingers for how, wait in WAYS]
    cases.append((f"producer {lingers[0] * 1000:g} ms, not waiting, dedup IDs", lingers[0], True, False))
    for label, linger, dedup, wait in cases:
        client = Client(node.url, node.token)
        queue = new_queue(client, args.partitions)
        calls = timed_batches(client)
        producer = Producer(client, linger=linger, dedup_ids=dedup)
        latencies: list[float] = []
        failed = [0]
        lock = threading.Lock()
        sent: dict[str, float] = {}
        answered: dict[str, float] = {}

        def done(
            f: Future[str],
            t: float,
            body: str,
            lock: threading.Lock = lock,
            latencies: list[float] = latencies,
            failed=failed,
            answered: dict[str, float] = answered,
        ) -> None:
            now = time.perf_counter()
            with lock:
                if f.exception() is None:
                    latencies.append(now - t)
                    answered[body] = now
                else:
                    failed[0] += 1

        def send(
            i: int,
            going: Callable[[], bool],
            wait: bool = wait,
            producer: Producer = producer,
            queue: str = queue,
            sent: dict[str, float] = sent,
        ) -> None:
            n = 0
            while going():
                body = f"{i}-{n}"
                t = sent[body] = time.perf_counter()
                f = producer.send(queue, body)
                f.add_done_callback(lambda f, t=t, body=body: done(f, t, body))
                if wait:
                    f.result()
                n += 1

        t0 = time.perf_counter()
        run_threads(args.threads, args.seconds, send)
        producer.close()  # everything sent and answered
        took = time.perf_counter() - t0
        batches = [end - start for start, end, _ in calls]
        out[label] = {
            "rate": len(latencies) / took,
            "p50": pct(latencies, 0.5),
            "p99": pct(latencies, 0.99),
            "batch_p50": pct(batches, 0.5),
            "batch_p99": pct(batches, 0.99),
            "batch_size": len(latencies) / max(1, len(batches)),
            "added_p99": pct(added_latencies(calls, sent, answered), 0.99),
            "failed": failed[0],
            "linger": linger,
        }
    return out


#: How the sending threads treat their futures.
WAYS = (("not waiting", False), ("each waits", True))


def consumers(args: argparse.Namespace, node: BenchNode) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for label, prefetch in (("prefetching + Acker", True), ("receive one, ack one", False)):
        client = Client(node.url, node.token)
        queue = new_queue(client, args.partitions)
        client.enqueue_many(queue, (f"m{i}" for i in range(args.consume)))
        seen: dict[str, int] = {}

        def handler(message: Message, seen: dict[str, int] = seen, lock: threading.Lock = threading.Lock()) -> None:
            time.sleep(args.handler_ms / 1000)
            with lock:
                seen[message.id] = seen.get(message.id, 0) + 1

        consumer = Consumer(client, queue, handler, threads=args.consumer_threads, prefetch=prefetch)
        t0 = time.perf_counter()
        consumer.start()
        while consumer.handled < args.consume:
            time.sleep(0.01)
        took = time.perf_counter() - t0
        consumer.stop()
        twice = sum(1 for c in seen.values() if c > 1)
        given_back = consumer.prefetcher.given_back if consumer.prefetcher is not None else 0
        out[label] = {"rate": args.consume / took, "twice": twice, "given_back": given_back}
    return out


def cpu(args: argparse.Namespace, node: BenchNode) -> dict[str, float]:
    from mq_client.aio import AsyncClient

    client = Client(node.url, node.token)
    queue = new_queue(client, args.partitions)
    per_task = args.cpu_messages // args.threads
    n = per_task * args.threads

    def sync_round() -> tuple[float, float]:
        def work(i: int) -> None:
            for k in range(per_task):
                client.enqueue(queue, f"{i}-{k}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(args.threads)]
        c0, w0 = time.process_time(), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.process_time() - c0, time.perf_counter() - w0

    async def async_round(mq: AsyncClient) -> tuple[float, float]:
        async def work(i: int) -> None:
            for k in range(per_task):
                await mq.enqueue(queue, f"a{i}-{k}")

        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(work(i) for i in range(args.threads)))
        return time.process_time() - c0, time.perf_counter() - w0

    async def rounds() -> list[tuple[tuple[float, float], tuple[float, float]]]:
        out = []
        async with AsyncClient(node.url, node.token) as mq:
            await asyncio.gather(*(mq.enqueue(queue, "warm") for _ in range(args.threads)))  # connections open
            for _ in range(args.cpu_rounds):
                out.append((sync_round(), await async_round(mq)))  # (the loop waits while threads run)
        return out

    both = asyncio.run(rounds())
    return {
        "sync_us": statistics.median(s[0] for s, _ in both) / n * 1e6,
        "sync_rate": n / statistics.median(s[1] for s, _ in both),
        "async_us": statistics.median(a[0] for _, a in both) / n * 1e6,
        "async_rate": n / statistics.median(a[1] for _, a in both),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    log(
        f"client_batching: {args.threads} threads, {args.seconds:g} s a case, lingers {args.lingers} s; "
        f"{args.consumer_threads} handlers of {args.handler_ms:g} ms; {platform.node()}, {os.cpu_count()} CPUs"
    )
    node = BenchNode(
        "batching",
        args.backend,
        database_url=args.pg_url,
        redis_url=args.redis_url,
        kv_redis_db=args.kv_redis_db,
        startup_timeout=args.startup_timeout,
    )
    node.start()
    try:
        sent = producers(args, node)
        consumed = consumers(args, node)
        spent = cpu(args, node)
    finally:
        node.stop()

    width = max(len(label) for label in sent)
    print(f"\n## producers: {args.threads} threads, one message at a time, {args.seconds:g} s each")
    print(f"{'case':{width}} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'batch':>7} {'call p50':>9} {'call p99':>9}")
    base = sent["enqueue, a call each"]["rate"]
    for label, f in sent.items():
        batch = f"{f['batch_size']:.1f}" if "batch_size" in f else "1"
        call_p50 = f"{f.get('batch_p50', f['p50']):.2f}"
        call_p99 = f"{f.get('batch_p99', f['p99']):.2f}"
        print(f"{label:38} {f['rate']:>9,.0f} {f['p50']:>8.2f} {f['p99']:>8.2f} {batch:>7} {call_p50:>9} {call_p99:>9}")
    for label, f in sent.items():
        if "batch_size" in f:
            bound = f["linger"] * 1000 + f["batch_p99"]
            print(
                f"{label}: {f['rate'] / base:.1f}x enqueue; p99 {f['p99']:.2f} ms against linger + "
                f"batch call p99 {bound:.2f} ms; added p99 {f['added_p99']:.2f} ms; failed {f['failed']:.0f}"
            )
    print(f"\n## consumers: {args.consumer_threads} handlers of {args.handler_ms:g} ms, {args.consume} messages")
    print(f"{'case':24} {'msg/s':>9} {'twice':>6} {'given back':>11}")
    for label, f in consumed.items():
        print(f"{label:24} {f['rate']:>9,.0f} {f['twice']:>6.0f} {f['given_back']:>11.0f}")
    ratio = consumed["prefetching + Acker"]["rate"] / consumed["receive one, ack one"]["rate"]
    print(f"prefetching / receive-one: {ratio:.1f}x")
    print(
        f"\n## client CPU a message: {args.cpu_messages} enqueues, {args.threads} at a time, medians of {args.cpu_rounds}"
    )
    print(f"sync client, {args.threads} threads: {spent['sync_us']:.0f} µs/msg ({spent['sync_rate']:,.0f} msg/s)")
    print(f"asyncio client, one loop: {spent['async_us']:.0f} µs/msg ({spent['async_rate']:,.0f} msg/s)")
    print(f"asyncio / sync CPU: {spent['async_us'] / spent['sync_us']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
