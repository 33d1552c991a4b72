#!/usr/bin/env python
"""What serving one call costs a node process before any of the service's code runs: granian,
its request threads or event loop, and one store round trip. For the serving model the node
uses (WSGI on a pool of request threads, redis-py) and for the ones it could use.

It MEASURES AND PRINTS; it never passes or fails. Each model is a tiny application in
``bench/serving_apps.py`` served by granian in a process of its own; ``--clients`` client
processes send it keep-alive HTTP/1.1 POSTs with a ~100-byte JSON body, as the throughput
benchmark's clients do. Figures: the server's CPU (every process of its session, from /proc)
per call, and calls per second, medians over ``--repeat`` rounds after one untimed round,
the models' rounds interleaved, each beside the node's own model (``wsgi-threads``).

Models:
  wsgi-nostore        WSGI, the node's request threads, no store call: the HTTP floor
  wsgi-threads        WSGI, the node's request threads, one redis-py PING a call: the node today
  wsgi-1thread        WSGI, one request thread, one redis-py PING a call
  rsgi-redis-asyncio  RSGI (one event loop), one redis.asyncio PING a call
  rsgi-protocol       RSGI, one PING a call on a pipelined asyncio Protocol to Redis
and, on demand (``--models``), the service's synchronous code run on an event loop, and
wsgi-threads under other granian settings than runnode's:
  rsgi-inline         RSGI, one redis-py PING a call on the loop's own thread (blocking it)
  wsgi-threads-st     runtime_mode st (a single-threaded Rust runtime)
  wsgi-threads-mt     runtime_mode mt (a multi-threaded one)
  wsgi-threads-http1  HTTP/1 only, no websockets

Why it exists: a single-message call costs the node about 230 µs of CPU, and the service's
own Python, run in-process without granian (``bench/inprocess.py --batch 1 --threads 4``),
about 80. The rest is here: threads handing the GIL to each other around every socket call.

    scripts/with-services.sh python bench/serving.py --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import BenchError, box_speed, exit_on_sigterm, fmt_box_speed, fmt_rate, log, median
from throughput_cpu import session_cpu_seconds

HERE = Path(__file__).resolve().parent

#: model -> (granian interface, target in serving_apps, request threads: None = the node's,
#: other Granian settings than runnode's)
MODELS: dict[str, tuple[str, str, int | None, dict]] = {
    "wsgi-nostore": ("wsgi", "wsgi_nostore", None, {}),
    "wsgi-threads": ("wsgi", "wsgi_ping", None, {}),
    "wsgi-1thread": ("wsgi", "wsgi_ping", 1, {}),
    "wsgi-threads-st": ("wsgi", "wsgi_ping", None, {"runtime_mode": "st"}),
    "wsgi-threads-mt": ("wsgi", "wsgi_ping", None, {"runtime_mode": "mt"}),
    "wsgi-threads-http1": ("wsgi", "wsgi_ping", None, {"http": "1", "websockets": False}),
    "rsgi-redis-asyncio": ("rsgi", "rsgi_redis_asyncio", None, {}),
    "rsgi-protocol": ("rsgi", "rsgi_protocol", None, {}),
    "rsgi-inline": ("rsgi", "rsgi_inline", None, {}),
}
#: the thin queue (``serving_apps.ThinQueue``), which ``bench/throughput.py`` serves through
#: ``--serve``: our message calls at their leanest, on our serving model and on an event loop
THIN_MODELS: dict[str, tuple[str, str, int | None, dict]] = {
    "thin-wsgi": ("wsgi", "thin_wsgi", None, {}),
    "thin-rsgi": ("rsgi", "thin_rsgi", None, {}),
}
#: the models run when --models is not given (the granian-setting variants: on demand)
DEFAULT_MODELS = ("wsgi-nostore", "wsgi-threads", "wsgi-1thread", "rsgi-redis-asyncio", "rsgi-protocol")
BASELINE = "wsgi-threads"
REQUEST = json.dumps({"body": "x" * 100}).encode()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--clients", type=int, default=4, help="client processes, one connection each")
    p.add_argument("--calls", type=int, default=5000, help="calls per client per round")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=64, help="the node's request threads (NODE_THREADS)")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", ""))
    p.add_argument("--first-port", type=int, default=8790)
    # internal: one server, or one client
    p.add_argument("--serve", nargs=2, metavar=("MODEL", "PORT"), help=argparse.SUPPRESS)
    p.add_argument("--client", nargs=2, type=int, metavar=("PORT", "CALLS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s): {', '.join(unknown)}")
    if not args.serve and not args.client and not args.redis_url:
        p.error("needs --redis-url or REDIS_URL (scripts/with-services.sh sets it)")
    return args


def serve(model: str, port: int, threads: int) -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, RuntimeModes

    interface, target, own_threads, settings = MODELS.get(model) or THIN_MODELS[model]
    kwargs: dict = {}
    if interface == "wsgi":
        n = own_threads or threads
        kwargs = {"blocking_threads": n, "backpressure": n * 4}  # as runnode sets them
    kwargs.update(settings)
    if "runtime_mode" in kwargs:
        kwargs["runtime_mode"] = RuntimeModes(kwargs["runtime_mode"])
    if "http" in kwargs:
        kwargs["http"] = HTTPModes(kwargs["http"])
    Granian(
        f"serving_apps:{target}",
        address="127.0.0.1",
        port=port,
        interface=Interfaces(interface),
        workers=1,
        log_access=False,
        working_dir=HERE,
        **kwargs,
    ).serve()


def client(port: int, calls: int) -> None:
    from throughput_clients import _HttpConn

    conn = _HttpConn(f"http://127.0.0.1:{port}", "bench", timeout=30)
    for _ in range(calls):
        status, _ = conn.request("POST", "/api/v1/queues/bench/enqueue", REQUEST)
        if status != 200:
            sys.exit(f"client: HTTP {status}")
    conn.close()


def start_server(model: str, port: int, env: dict[str, str], python: str = sys.executable, threads: int = 64):
    """``--serve model port`` in a process of its own session (its CPU: every process of that
    session), once it listens; BenchError when it exits or does not listen within 30 s."""
    proc = subprocess.Popen(
        [python, __file__, "--serve", model, str(port), "--threads", str(threads)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            assert proc.stderr is not None
            raise BenchError(f"{model}: server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise BenchError(f"{model}: server did not listen on {port} within 30 s") from None
            time.sleep(0.1)


class Server:
    def __init__(self, model: str, port: int, args: argparse.Namespace) -> None:
        self.model, self.port = model, port
        env = dict(os.environ, MQ_SERVING_REDIS_URL=args.redis_url)
        self.proc = start_server(model, port, env, threads=args.threads)

    def round(self, args: argparse.Namespace) -> tuple[float, float]:
        """(calls per second, server CPU µs per call) of one round of every client at once."""
        before = session_cpu_seconds(self.proc.pid)
        started = time.perf_counter()
        clients = [
            subprocess.Popen([sys.executable, __file__, "--client", str(self.port), str(args.calls)])
            for _ in range(args.clients)
        ]
        if any(c.wait() != 0 for c in clients):
            raise SystemExit(f"{self.model}: a client failed")
        wall = time.perf_counter() - started
        cpu = session_cpu_seconds(self.proc.pid) - before
        calls = args.clients * args.calls
        return calls / wall, cpu / calls * 1e6

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]), args.threads)
    if args.client:
        return client(*args.client)
    exit_on_sigterm()
    speed = box_speed(args.redis_url)
    servers: list[Server] = []
    samples: dict[str, list[tuple[float, float]]] = {m: [] for m in args.models}
    try:
        for i, model in enumerate(args.models):
            try:
                servers.append(Server(model, args.first_port + i, args))
            except BenchError as exc:
                raise SystemExit(str(exc)) from None
        for r in range(args.repeat + 1):
            for server in servers:
                rate, us = server.round(args)
                log(f"{server.model} round {r}/{args.repeat}: {fmt_rate(rate)} calls/s, {us:.0f} µs/call")
                if r:  # round 0 warms up
                    samples[server.model].append((rate, us))
    finally:
        for server in servers:
            server.stop()
    print(
        f"\nserver CPU per call, {args.clients} clients x {args.calls} calls a round, "
        f"medians of {args.repeat} rounds (request threads: {args.threads})"
    )
    base = median(us for _, us in samples.get(BASELINE, []))
    print(f"{'model':<20} {'calls/s':>9} {'µs/call':>8} {'vs ' + BASELINE:>16}")
    for model in args.models:
        rate, us = median(s[0] for s in samples[model]), median(s[1] for s in samples[model])
        ratio = f"{us / base:.2f}x" if base else "n/a"
        print(f"{model:<20} {fmt_rate(rate):>9} {us:8.0f} {ratio:>16}")
    print(f"box speed before: {fmt_box_speed(speed)}")
    print(f"box speed after: {fmt_box_speed(box_speed(args.redis_url))}")


if __name__ == "__main__":
    main()
