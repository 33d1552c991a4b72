#!/usr/bin/env python
"""The node's own CPU per message call, without the HTTP server: the WSGI application a node
serves (``config.node.application``: the fast path, the service, the partition managers, the
store) called directly, in this process, by one thread or several.

It MEASURES AND PRINTS; it never passes or fails. Where ``bench/throughput.py`` measures the
whole node behind granian with client processes, this takes granian and the clients away, so
a change in our own per-call and per-message work shows without their noise, and
``--threads`` shows what callers running at once cost each other (the GIL). ``--profile F``
writes a cProfile of the last timed round, in the CPU time of the calling thread (a wait
on the store costs nothing there, as in the node's CPU counters).

Figures: CPU seconds of this process (every thread: the node's housekeeping too) per call of
each phase (enqueue, dequeue, ack of what was dequeued), and per message over the cycle,
medians over ``--repeat`` rounds after one untimed round; then the box's speed before and
after (``common.box_speed``: a Python loop, a Redis PING), by which runs of different days compare.

Run it on the stores the node would use, e.g. with the test services::

    scripts/with-services.sh python bench/inprocess.py --kv redis --batch 100 --n 30000
    scripts/with-services.sh python bench/inprocess.py --kv postgres --batch 1 --n 3000 --threads 4
    scripts/with-services.sh python bench/inprocess.py --thin --batch 100   # the floor: the thin queue

It uses ``DATABASE_URL`` (migrated here) and, for ``--kv redis``, ``REDIS_URL``'s database 1
(``--kv redis-cluster``: ``MQ_TEST_REDIS_CLUSTER_URL``); its data folder is a temporary one.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from common import box_speed, exit_on_sigterm, fmt_box_speed

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--kv",
        choices=("redis", "redis-cluster", "postgres", "file"),
        default="redis",
        help="the node's key-value store",
    )
    p.add_argument("--batch", type=int, default=100, help="messages per call (1: one message per call)")
    p.add_argument("--n", type=int, default=30_000, help="messages per round (over all threads)")
    p.add_argument("--threads", type=int, default=1, help="callers at once, each its own share of the round")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", metavar="FILE", help="write a cProfile (thread CPU time) of the last round to FILE")
    p.add_argument(
        "--thin",
        action="store_true",
        help="the thin queue (bench/serving_apps.py's thin_wsgi: our calls' JSON and store round trips, "
        "nothing else) instead of the node, on Redis: the floor the node's figure compares with",
    )
    p.add_argument(
        "--traces",
        metavar="MODES",
        help="off,on: rounds with no OpenTelemetry SDK (off: what a node without one runs) and with one "
        "(on: the SDK's TracerProvider, spans batched to an exporter that drops them) interleaved, "
        "their medians side by side, and what the off path's checks cost",
    )
    args = p.parse_args(argv)
    if args.traces is not None:
        args.traces = [m.strip() for m in args.traces.split(",") if m.strip()]
        if not args.traces or set(args.traces) - {"off", "on"}:
            p.error("--traces takes off, on or off,on")
    if args.thin and (args.kv != "redis" or args.traces or args.profile):
        p.error("--thin runs on --kv redis, without --traces or --profile")
    if args.batch < 1 or args.n < args.batch * args.threads or args.threads < 1:
        p.error("need --batch >= 1, --threads >= 1 and --n >= batch x threads")
    return args


def setup(kv: str) -> None:
    """This process becomes a node on ``kv``: the settings, a migrated database, a data folder."""
    os.environ["MQ_DATA_DIR"] = tempfile.mkdtemp(prefix="mq-inprocess-")
    os.environ.setdefault("NODE_PROCESSES", "1")
    if kv == "redis":
        base = os.environ.get("REDIS_URL", "").rsplit("/", 1)[0]
        if not base:
            sys.exit("--kv redis needs REDIS_URL (scripts/with-services.sh sets it)")
        os.environ["KV_URL"] = f"{base}/1"
    elif kv == "redis-cluster":
        url = os.environ.get("MQ_TEST_REDIS_CLUSTER_URL", "")
        if not url:
            sys.exit("--kv redis-cluster needs MQ_TEST_REDIS_CLUSTER_URL (scripts/services.sh env prints it)")
        os.environ["KV_URL"] = url
        os.environ.setdefault("KV_PREFIX", "mq-inprocess:")  # beside the tests' keys, not theirs
    elif kv == "postgres":
        os.environ["KV_URL"] = "postgres"
    else:
        os.environ["KV_URL"] = f"file://{os.environ['MQ_DATA_DIR']}/kv"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    import django
    from django.core.management import call_command

    django.setup()
    if os.environ.get("MQBENCH_MIGRATED") != "1":  # the smoke test's database is migrated already
        call_command("migrate", verbosity=0, interactive=False)


class Caller:
    """Calls the node's WSGI application as granian would, with a staff user's token."""

    def __init__(self, app, token: str) -> None:
        import orjson

        self.app, self.token, self.dumps, self.loads = app, token, orjson.dumps, orjson.loads

    def __call__(self, method: str, path: str, body=None) -> tuple[int, bytes]:
        raw = self.dumps(body) if body is not None else b""
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "HTTP_HOST": "127.0.0.1:8000",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(raw)),
            "HTTP_AUTHORIZATION": f"Token {self.token}",
            "HTTP_ACCEPT": "application/json",
            "wsgi.input": io.BytesIO(raw),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "REMOTE_ADDR": "127.0.0.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        status: list[str] = []
        out = b"".join(self.app(environ, lambda s, headers, *exc: status.append(s)))
        return int(status[0][:3]), out


def cycle(call: Caller, queue: str, n: int, batch: int, spent: dict[str, float]) -> None:
    """Enqueue ``n`` messages, dequeue them all, ack them all; CPU seconds per phase into ``spent``
    (the process's: several callers add up the same seconds, so one caller times it)."""
    base = f"/api/v1/queues/{queue}"
    timer = time.process_time
    t0 = timer()
    for _ in range(n // batch):
        payload = {"body": "x" * 100} if batch == 1 else {"messages": [{"body": "x" * 100}] * batch}
        status, body = call("POST", f"{base}/enqueue", payload)
        assert status == 201, body
    t1 = timer()
    got: list[tuple[str, str]] = []
    while len(got) < n:
        status, body = call("POST", f"{base}/dequeue", {"max": batch, "visibility_timeout": 300, "wait": 0})
        assert status == 200, body
        got += [(m["id"], m["receipt"]) for m in call.loads(body)["messages"]]
    t2 = timer()
    for i in range(0, len(got), batch):
        status, body = call(
            "POST", f"{base}/ack", {"messages": [{"id": m, "receipt": r} for m, r in got[i : i + batch]]}
        )
        assert status == 200, body
    t3 = timer()
    for phase, seconds in (("enqueue", t1 - t0), ("dequeue", t2 - t1), ("ack", t3 - t2)):
        spent[phase] = spent.get(phase, 0.0) + seconds


def round_(call: Caller, queue: str, args: argparse.Namespace, profile: cProfile.Profile | None) -> dict[str, float]:
    """One round: CPU µs per message over the cycle and per call; with one caller, per call of
    each phase too."""
    share = args.n // args.threads
    spent: dict[str, float] = {}
    if profile:
        profile.enable()
    started = time.process_time()
    if args.threads == 1:
        cycle(call, queue, share, args.batch, spent)
    else:
        workers = [
            threading.Thread(target=cycle, args=(call, queue, share, args.batch, {})) for _ in range(args.threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    total = time.process_time() - started
    if profile:
        profile.disable()
    calls = args.n / args.batch
    figures = {"µs/msg": total / args.n * 1e6, "µs/call": total / (3 * calls) * 1e6}
    figures.update({f"{phase} µs/call": seconds / calls * 1e6 for phase, seconds in spent.items()})
    return figures


def traces(call: Caller, queue: str, args: argparse.Namespace) -> None:
    """``--traces``: the modes' rounds interleaved (off, on, off, on, ...), their medians side by
    side; then the cost of the checks the off path makes (``if tracing.ON:`` at the entrance, in
    the service and at the store write) measured alone, beside the off rounds' spread."""
    from queues import tracing

    if tracing.ON:
        sys.exit("--traces: this process has an OpenTelemetry SDK configured already (TRACES_EXPORT?)")
    provider = None
    if "on" in args.traces:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Dropped(SpanExporter):
            spans = 0

            def export(self, spans):  # the spans made and handed over, not serialized
                Dropped.spans += len(spans)
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        tracing.use(provider)
        cycle(call, queue, min(args.n, 20 * args.batch), args.batch, {})  # warm the SDK's path too
        tracing.use(None)
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in args.traces}
    for _ in range(args.repeat):
        for mode in args.traces:
            tracing.use(provider if mode == "on" else None)
            try:
                rounds[mode].append(round_(call, queue, args, None))
            finally:
                tracing.use(None)
    if provider is not None:
        provider.force_flush()
        provider.shutdown()
    keys = list(next(iter(rounds.values()))[0])
    print(
        f"kv={args.kv} batch={args.batch} threads={args.threads} n={args.n}: node CPU, medians of {args.repeat} rounds"
    )
    print(f"  {'':<18}" + "".join(f"{'traces ' + m:>14}" for m in args.traces))
    for k in keys:
        print(f"  {k:<18}" + "".join(f"{statistics.median(r[k] for r in rounds[m]):>14.1f}" for m in args.traces))
    for m in args.traces:
        each = ", ".join(f"{r['µs/msg']:.1f}" for r in rounds[m])
        print(f"  traces {m}: per round {each} µs/msg")
    # What "off" adds to a call: one `if tracing.ON:` at the entrance, one in the service's call,
    # one at each partition's store write (an enqueue); the same test timed alone.
    loops = 2_000_000
    started = time.perf_counter()
    for _ in range(loops):
        if tracing.ON:
            pass
    check_ns = (time.perf_counter() - started) / loops * 1e9
    if "off" in rounds:
        off = [r["µs/call"] for r in rounds["off"]]
        spread = (max(off) - min(off)) / statistics.median(off) * 100
        print(
            f"  off path: 3 checks a call at most, {check_ns:.0f} ns each measured alone: "
            f"{3 * check_ns / 1000:.2f} µs/call, {3 * check_ns / 10 / statistics.median(off):.3f}% of "
            f"the off rounds' median µs/call (their spread: {spread:.1f}%)"
        )


def report(args: argparse.Namespace, rounds: list[dict[str, float]], what: str) -> None:
    """Print the rounds' medians (and each round's µs a message)."""
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    each = ", ".join(f"{r['µs/msg']:.1f}" for r in rounds)
    phases = "".join(f", {k.split()[0]} {v:.0f}" for k, v in medians.items() if k.endswith(" µs/call"))
    print(
        f"kv={args.kv} batch={args.batch} threads={args.threads} n={args.n}: {what} "
        f"{medians['µs/msg']:.1f} µs/msg, {medians['µs/call']:.0f} µs/call ({phases.lstrip(', ') or 'all phases'}) "
        f"(medians of {args.repeat} rounds; per round {each} µs/msg)"
    )


def thin(args: argparse.Namespace) -> None:
    """``--thin``: the thin queue's WSGI application in this process, the same cycle as the
    node's; its state in memory, its store round trips on ``KV_URL`` (``REDIS_URL``'s database 1)."""
    token = uuid.uuid4().hex
    os.environ["MQ_THIN_TOKEN"], os.environ["MQ_SERVING_REDIS_URL"] = token, os.environ["KV_URL"]
    import serving_apps  # (bench/, beside this file; reads the token when imported)

    call = Caller(serving_apps.thin_wsgi, token)
    queue = f"thin-{uuid.uuid4().hex[:8]}"
    speed = box_speed(os.environ.get("REDIS_URL"))
    cycle(call, queue, min(args.n, 20 * args.batch), args.batch, {})  # warm-up, untimed
    report(args, [round_(call, queue, args, None) for _ in range(args.repeat)], "thin queue CPU")
    print(f"box speed: before {fmt_box_speed(speed)}; after {fmt_box_speed(box_speed(os.environ.get('REDIS_URL')))}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup(args.kv)
    if args.thin:
        thin(args)
        return
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username="bench-inprocess")
    user.is_staff = user.is_superuser = True
    user.save()
    token, _ = Token.objects.get_or_create(user=user)

    # The node's watchdog probes its own address (host:port); nothing listens here, and a
    # refused probe is no verdict of "stuck" (queues.cluster.watchdog), so the leases stay.
    os.environ.setdefault("NODE_ADDRESS", "127.0.0.1:9")
    import config.node as node  # this process's node runtime starts here

    call = Caller(node.application, token.key)
    queue = f"inproc-{uuid.uuid4().hex[:8]}"
    status, body = call("POST", "/api/v1/queues", {"name": queue, "partitions": args.partitions})
    assert status == 201, body
    deadline = time.monotonic() + 15
    while len(node.runtime.local_managers(queue)) < args.partitions:
        if time.monotonic() > deadline:
            sys.exit(f"the node did not claim {queue}'s partitions within 15 s")
        time.sleep(0.1)
    speed = box_speed(os.environ.get("REDIS_URL"))
    try:
        cycle(call, queue, min(args.n, 20 * args.batch), args.batch, {})  # warm-up, untimed
        if args.traces:
            traces(call, queue, args)
            print(
                f"box speed: before {fmt_box_speed(speed)}; "
                f"after {fmt_box_speed(box_speed(os.environ.get('REDIS_URL')))}"
            )
            return
        rounds = []
        for i in range(args.repeat):
            profile = cProfile.Profile(time.thread_time) if args.profile and i == args.repeat - 1 else None
            rounds.append(round_(call, queue, args, profile))
            if profile:
                profile.dump_stats(args.profile)
        report(args, rounds, "node CPU")
        print(
            f"box speed: before {fmt_box_speed(speed)}; after {fmt_box_speed(box_speed(os.environ.get('REDIS_URL')))}"
        )
    finally:
        call("DELETE", f"/api/v1/queues/{queue}")
        node.runtime.stop(release=True)


if __name__ == "__main__":
    # A SIGTERM ends it through main's finally (its queue deleted), as Ctrl-C does.
    exit_on_sigterm()
    main()
