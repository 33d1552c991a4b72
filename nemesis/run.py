"""A nemesis run: nodes on stores of the run's own, clients over REST, the SDK and SQS, faults from
a seed, then the checker over the whole history and the report beside it.

``python -m nemesis.run --minutes 5 --seed 7`` (``make chaos MINUTES=5 SEED=7``); ``--help`` for
the rest. A run's directory holds ``history.jsonl``, ``summary.json``, ``picture.png``, the
nodes' logs and the stores' files (removed after a valid run unless ``--keep``). What is
checked, and how to read the picture: docs/explanation/nemesis.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import requests

from nemesis import report
from nemesis.checker import Result, check
from nemesis.clients import (
    Client,
    Context,
    Ledger,
    RestConsumer,
    RestProducer,
    SdkConsumer,
    SdkProducer,
    SqsClient,
)
from nemesis.clocks import Drift
from nemesis.clocks import available as clock_tools
from nemesis.faults import DEFAULT_KINDS, KINDS, Fault, Nemesis, schedule
from nemesis.history import NodeEvent, Recorder, read
from nemesis.netns import Network, pid_alive, remove_leftovers
from nemesis.release import Release, prepare
from nemesis.stores import Stores
from tests.launcher import NodeFailed, NodeProcess, free_ports

ROOT = Path(__file__).resolve().parents[1]

#: The queues' lease period (seconds): short, so that takeovers happen often.
LEASE_PERIOD = 3
#: The consumers' visibility timeout (seconds): a message whose ack was lost comes back soon.
VISIBILITY = 4


@dataclass
class Options:
    seed: int
    duration: float
    nodes: int = 3
    processes: int = 1
    kv: str = "redis"
    kinds: Sequence[str] = DEFAULT_KINDS
    out: Path = ROOT / "nemesis-runs"
    #: seconds the consumers have, after the faults, to drain every confirmed message
    drain: float = 90.0
    keep: bool = False
    #: the tree the nodes run from (None: this one); a test gives a patched copy
    code: Path | None = None
    #: overlaps of two owners up to this long are not reported (the run's stamping delay)
    overlap_slack_ms: float = 20.0
    #: run each node in a network namespace of its own (needed by the partition faults, which
    #: turn it on; root only)
    netns: bool = False


@dataclass
class Outcome:
    result: Result
    directory: Path
    summary: Path
    picture: Path
    schedule: list[Fault]
    errors: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.result.valid and not self.errors


# ------------------------------------------------------------------------------ ownership events


class Owners(threading.Thread):
    """Receives the nodes' ``serve``/``unserve`` datagrams (``OWNERSHIP_EVENTS``) and writes
    them to the history, stamped on receipt minus the ``ago`` the node reports, the process
    named ``<node>/<pid>`` (the node found by the process's group, which is the node's)."""

    def __init__(
        self,
        path: Path,
        recorder: Recorder,
        groups: dict[int, str],
        ports: dict[int, str],
        rates: dict[str, float] | None = None,
    ) -> None:
        super().__init__(name="owners", daemon=True)
        self.path, self.recorder, self.groups, self.ports = path, recorder, groups, ports
        #: each node's clock rate (seconds of its own per real second): a lease's end it reports
        #: in seconds of its own is that many real seconds divided by its rate
        self.rates = rates if rates is not None else {}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.closed = threading.Event()
        self.names: dict[int, str] = {}
        self.count = 0
        #: what each process serves, by the events so far: (process, partition) -> epoch
        self.open: dict[tuple[str, str], int] = {}
        #: when each node's processes were last all found dead (:meth:`ended`)
        self.ended_at: dict[str, int] = {}
        #: each process's last datagram number (``seq``): a gap is a datagram dropped
        self.seqs: dict[int, int] = {}
        self.lock = threading.Lock()

    def process_name(self, pid: int, address: str) -> str:
        """``<node>/<pid>``: the node by the process's group (a node started a moment ago may
        report before the run has noted its group), else by the port it serves."""
        if pid in self.names:
            return self.names[pid]
        try:
            node = self.groups.get(os.getpgid(pid))
        except ProcessLookupError:
            node = None
        node = node or self.ports.get(int(address.rpartition(":")[2] or 0))
        if node is None:
            return f"?/{pid}"  # not kept: the next datagram may know better
        self.names[pid] = f"{node}/{pid}"
        return self.names[pid]

    def run(self) -> None:
        while not self.closed.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            now = self.recorder.clock()
            try:
                e = orjson.loads(data)
                pid = int(e["pid"])
                name = self.process_name(pid, str(e.get("address", "")))
                at = now - int(float(e.get("ago") or 0) * 1e9)
                until = None
                if e.get("until") is not None:  # (the datagram left its node at or before ``now``)
                    until = now + int(float(e["until"]) / self.rates.get(name.partition("/")[0], 1.0) * 1e9)
                event = NodeEvent(
                    node=name,
                    event=e["event"],
                    partition=str(e["partition"]),
                    epoch=int(e["epoch"]),
                    time=at,
                    until=until,
                    id=str(e["node"]) if e.get("node") else None,
                )
                with self.lock:
                    seq = e.get("seq")
                    if isinstance(seq, int):
                        last = self.seqs.get(pid)
                        self.seqs[pid] = seq
                        if last is not None and seq > last + 1:
                            # a report was dropped (a renew, maybe): what this process serves is
                            # bounded by no end it reported until it reports one again
                            for (held_by, partition), epoch in self.open.items():
                                if held_by == name:
                                    self.recorder.write(
                                        replace(
                                            event, event="renew", partition=partition, epoch=epoch, time=at, until=None
                                        )
                                    )
                    self.recorder.write(event)
                    ended = self.ended_at.get(event.node.partition("/")[0])
                    if event.event == "renew":
                        pass  # bounds a serving already open (the checker's), opens none
                    elif event.event == "serve" and ended is not None and ended >= event.time and not pid_alive(pid):
                        # a report read after its node was ended (the reader fell behind, or
                        # the datagram waited in the socket): its serving ended with the node
                        self.recorder.write(replace(event, event="unserve", time=ended, until=None))
                    elif event.event == "serve":
                        self.open[(event.node, event.partition)] = event.epoch
                    else:
                        self.open.pop((event.node, event.partition), None)
                        # one served while the process was not named yet ends with it too
                        if self.open.pop((f"?/{pid}", event.partition), None) is not None:
                            self.recorder.write(replace(event, node=f"?/{pid}"))
                self.count += 1
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                print(f"nemesis: a node's event was not understood ({exc}): {data[:200]!r}", file=sys.stderr)

    def ended(self, node: str) -> None:
        """Every process of ``node`` is dead (killed, or stopped): what they still serve by their
        events ends now. A process killed a moment after it won a lease may have sent its
        ``serve`` just before it died, and the datagram is read after the kill: without this,
        its serving would never end in the history. Waits a moment for such datagrams."""
        time.sleep(0.2)
        with self.lock:
            now = self.recorder.clock()
            self.ended_at[node] = now
            for (name, partition), epoch in list(self.open.items()):
                if name.startswith(node + "/"):
                    self.recorder.write(
                        NodeEvent(node=name, event="unserve", partition=partition, epoch=epoch, time=now)
                    )
                    del self.open[(name, partition)]

    def close(self) -> None:
        self.closed.set()
        self.join(timeout=5)
        self.sock.close()


# --------------------------------------------------------------------------------------- the run


def _manage(env: dict[str, str], code: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=code, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


class Run:
    """One run, from the stores' start to the report (:meth:`go`)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = opts.out / f"{stamp}-seed{opts.seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.code = opts.code or ROOT
        self.nodes: dict[str, NodeProcess] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.names = [f"n{i + 1}" for i in range(opts.nodes)]
        #: held while a node or a store is hit, healed or restarted (the nemesis's locks)
        self.node_locks: dict[str, threading.RLock] = {t: threading.RLock() for t in [*self.names, "redis", "pg"]}
        self.release: Release | None = None
        #: nodes that could not start (their store cut off, down): the supervisor retries them
        self.down: set[str] = set()
        #: set when the run is over (the supervisor stops)
        self.finished = threading.Event()
        self.network: Network | None = None

    # --- setup ------------------------------------------------------------------------------
    def start_network(self) -> None:
        """A network namespace per node, the stores reachable from each (the partition faults)."""
        ok, why = Network.available()
        if not ok:
            raise SystemExit(f"nemesis: the partition faults need network namespaces: {why}")
        gone = remove_leftovers()  # of runs killed before they could remove their own
        if gone:
            print(f"nemesis: removed what killed runs left: {', '.join(gone)}", flush=True)
        self.network = Network(secrets.token_hex(3), self.names).__enter__()

    def start_stores(self) -> None:
        base = free_ports(8)  # PostgreSQL, Redis, the cluster's three primaries and their bus
        host = self.network.store_host if self.network else None
        self.stores = Stores(self.dir / "services", pg_port=base, redis_port=base + 1, cluster_port=base + 2, host=host)
        self.stores.start()

    def node_env(self, name: str) -> dict[str, str]:
        urls = self.stores.address(self.network.store_host if self.network else "127.0.0.1")
        kv = {"redis": urls["kv-redis"], "redis-cluster": urls["kv-redis-cluster"], "postgres": "postgres"}
        data = self.dir / "data" / name
        data.mkdir(parents=True, exist_ok=True)
        return {
            "DATABASE_URL": urls["database"],
            "KV_URL": kv[self.opts.kv],
            "MQ_DATA_DIR": str(data),
            "CLUSTER_SECRET": self.cluster_secret,
            "SECRET_KEY": self.secret_key,
            "OWNERSHIP_EVENTS": str(self.owners_path),
            "SERVED_BY_HEADER": "1",
            "NODE_HEARTBEAT": "0.3",
            "NODE_CPU_AFFINITY": "off",
            "LOG_LEVEL": "INFO",
        }

    def setup(self) -> None:
        self.cluster_secret = secrets.token_hex(24)
        self.secret_key = secrets.token_hex(24)
        self.owners_path = self.dir / "owners.sock"
        self.recorder = Recorder(self.dir / "history.jsonl")
        self.groups: dict[int, str] = {}
        self.ports: dict[int, str] = {}
        self.rates: dict[str, float] = {}
        self.owners = Owners(self.owners_path, self.recorder, self.groups, self.ports, self.rates)
        self.owners.start()
        env = {**os.environ, **self.node_env("setup")}
        _manage(env, self.code, "migrate", "--noinput")
        out = _manage(env, self.code, "quickstart", "--app-user", "nemesis")
        self.token = next(line.split()[1] for line in out.splitlines() if line.startswith("MQ_APP_TOKEN "))
        out = _manage(env, self.code, "sqs_keys", "create", "nemesis")
        keys = dict(line.split(" = ", 1) for line in out.splitlines() if " = " in line)
        self.access_key = (keys["aws_access_key_id"].strip(), keys["aws_secret_access_key"].strip())
        ports = free_ports(self.opts.nodes)
        for i, name in enumerate(self.names):
            self.ports[ports + i] = name
            self.nodes[name] = self.make_node(name, ports + i)
            if not self.start_node(name, tries=3):
                raise RuntimeError(f"{name} did not start; its log: {self.nodes[name].log_path}")
        self.create_queues()

    def make_node(
        self, name: str, port: int, release: Release | None = None, drift: Drift | None = None
    ) -> NodeProcess:
        """Node ``name`` on ``port``, of this tree or of ``release``, its clocks drifting or not;
        in its network namespace when the run has them."""
        env = self.node_env(name)
        host = "127.0.0.1"
        if self.network:
            host = self.network.node_host(name)
            env["NODE_ADDRESS"] = f"{host}:{port}"
        if drift:
            env.update(drift.env())
        self.rates[name] = drift.rate if drift else 1.0
        node = NodeProcess(
            env,
            self.dir,
            port,
            heartbeat=0.3,
            processes=self.opts.processes,
            python=release.python if release else sys.executable,
            cwd=release.tree if release else self.code,
            host=host,
            prefix=self.network.wrap(name, []) if self.network else (),
        )
        # The node's processes report what they serve while it starts, before start() returns:
        # its group must be known by then, or those reports would name no node.
        node.on_spawn = lambda pgid: self.groups.__setitem__(pgid, name)
        return node

    def start_node(self, name: str, *, tries: int = 2) -> bool:
        """Start node ``name``; whether it serves. One that exits while starting (its database
        or store is down or cut off: a fault) is tried ``tries`` times, then left to
        :meth:`supervise`, which starts it again as a supervisor would, once it can."""
        node = self.nodes[name]
        for attempt in range(1, tries + 1):
            try:
                node.start(timeout=60)
            except NodeFailed as exc:
                print(f"nemesis: {name} did not start (try {attempt}): {str(exc).splitlines()[0]}", flush=True)
                node.stop(timeout=5)
                self.owners.ended(name)
                time.sleep(1.0)
                continue
            assert node.pid is not None
            self.groups[node.pid] = name
            self.down.discard(name)
            return True
        self.down.add(name)
        return False

    def supervise(self) -> None:
        """Every second, start again the nodes that could not start (a thread of the run's)."""
        while not self.finished.wait(1.0):
            for name in sorted(self.down):
                lock = self.node_locks[name]
                if lock.acquire(blocking=False):  # (a fault on it goes first)
                    try:
                        if name in self.down:
                            self.start_node(name, tries=1)
                    finally:
                        lock.release()

    def signal(self, name: str, sig: int) -> None:
        """``sig`` to node ``name``'s processes; nothing if it is not running (down after a
        start that failed)."""
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None:
            try:
                node.signal(sig)
            except ProcessLookupError:
                pass

    def create_queues(self) -> None:
        http = requests.Session()
        http.headers["Authorization"] = f"Token {self.token}"
        url = self.nodes["n1"].url + "/api/v1"
        common = {"lease_period": LEASE_PERIOD, "visibility_timeout": VISIBILITY}
        for body, path in (
            ({"name": "plain", "partitions": 6, **common}, "queues"),
            ({"name": "strict", "partitions": 4, "strict": True, **common}, "queues"),
            ({"name": "events", "partitions": 3, "lease_period": LEASE_PERIOD}, "topics"),
            ({"name": "a", "start": "oldest", "visibility_timeout": VISIBILITY}, "topics/events/subscriptions"),
            ({"name": "b", "start": "oldest", "visibility_timeout": VISIBILITY}, "topics/events/subscriptions"),
        ):
            answer = http.post(f"{url}/{path}", json=body, timeout=30)
            if answer.status_code != 201:
                raise RuntimeError(f"POST {path} {body}: {answer.status_code} {answer.text[:500]}")

    def clients(self, ctx: Context) -> list[Client]:
        seed = self.opts.seed
        strict_groups = [[f"g{k}-{j}" for j in range(4)] for k in range(3)]
        topic = ["events/a", "events/b"]
        # Fairness keys on the plain queue, one of them flooding (the previous release refuses
        # them: none in a run that swaps nodes back to it)
        keys = () if "upgrade" in self.opts.kinds else ("flood", "flood", "flood", "t1", "t2")
        return [
            RestProducer(ctx, "rp-plain", "plain", 0, seed + 1, fairness_keys=keys),
            SdkProducer(ctx, "sp-plain", "plain", 1, seed + 2),
            SqsClient(ctx, "qp-plain", "plain", 2, seed + 3, produce=True),
            RestProducer(ctx, "rp-strict-0", "strict", 0, seed + 4, groups=strict_groups[0]),
            RestProducer(ctx, "rp-strict-1", "strict", 1, seed + 5, groups=strict_groups[1]),
            SdkProducer(ctx, "sp-strict", "strict", 2, seed + 6, groups=strict_groups[2]),
            RestProducer(ctx, "rp-events", "events", 1, seed + 7, fanout=topic),
            RestConsumer(ctx, "rc-plain-0", "plain", 0, seed + 11),
            RestConsumer(ctx, "rc-plain-1", "plain", 1, seed + 12),
            SdkConsumer(ctx, "sc-plain", "plain", 2, seed + 13),
            SqsClient(ctx, "qc-plain", "plain", 0, seed + 14, produce=False),
            RestConsumer(ctx, "rc-strict-0", "strict", 1, seed + 15),
            RestConsumer(ctx, "rc-strict-1", "strict", 2, seed + 16),
            SdkConsumer(ctx, "sc-strict", "strict", 0, seed + 17),
            RestConsumer(ctx, "rc-events-a", "events/a", 2, seed + 18),
            RestConsumer(ctx, "rc-events-b", "events/b", 0, seed + 19),
        ]

    # --- faults -----------------------------------------------------------------------------
    def actions(self) -> dict[str, tuple[Any, Any]]:
        def kill(f: Fault) -> None:
            with self.node_locks[f.target]:
                node = self.nodes[f.target]
                if node.proc is not None and node.proc.poll() is None:  # (one that is down stays down)
                    node.kill()
                    self.owners.ended(f.target)

        def restart(f: Fault) -> None:
            with self.node_locks[f.target]:
                node = self.nodes[f.target]
                if node.proc is None or node.proc.poll() is not None:
                    self.start_node(f.target)

        def pause(f: Fault) -> None:
            self.signal(f.target, signal.SIGSTOP)

        def resume(f: Fault) -> None:
            self.signal(f.target, signal.SIGCONT)

        def nothing(f: Fault) -> None:
            return None

        def replace(f: Fault, release: Release | None = None, drift: Drift | None = None) -> None:
            with self.node_locks[f.target]:
                node = self.nodes[f.target]
                node.stop()
                self.owners.ended(f.target)
                self.nodes[f.target] = self.make_node(f.target, node.port, release, drift)
                self.start_node(f.target)

        def downgrade(f: Fault) -> None:
            replace(f, release=self.release)

        def drift(f: Fault) -> None:
            replace(f, drift=Drift(f.rate, f.offset))

        def cut(way: str) -> Any:
            def apply(f: Fault) -> None:
                assert self.network is not None
                (self.network.cut_from_stores if way == "stores" else self.network.cut_from_peers)(f.target)

            return apply

        def heal(f: Fault) -> None:
            assert self.network is not None
            self.network.heal(f.target)

        return {
            "kill": (kill, restart),
            "pause": (pause, resume),
            "redis-kill": (lambda f: self.stores.restart_redis(self.redis_primary(f)), nothing),
            "redis-pause": (
                lambda f: self.stores.pause("redis", self.redis_primary(f)),
                lambda f: self.stores.resume("redis", self.redis_primary(f)),
            ),
            "pg-restart": (lambda f: self.stores.restart_pg(), nothing),
            "pg-pause": (lambda f: self.stores.pause("pg"), lambda f: self.stores.resume("pg")),
            "upgrade": (downgrade, replace),
            "drift": (drift, replace),
            "partition-stores": (cut("stores"), heal),
            "partition-peers": (cut("peers"), heal),
        }

    def redis_primary(self, f: Fault) -> int | None:
        """The Redis a Redis fault hits: on the Redis Cluster, one of its three primaries
        (chosen by the fault's time, so by the seed), else the one Redis."""
        if self.opts.kv != "redis-cluster":
            return None
        return self.stores.cluster_port + int(f.at * 100) % 3

    # --- the run ----------------------------------------------------------------------------
    def go(self) -> Outcome:
        opts = self.opts
        faults = schedule(opts.seed, opts.duration, opts.kinds, self.names, LEASE_PERIOD)
        missing = sorted({f.kind for f in faults} - set(self.actions()))
        if missing:
            raise SystemExit(f"nemesis: this run cannot do {', '.join(missing)} yet")
        print(f"nemesis: seed {opts.seed}, {opts.duration:.0f} s, {opts.nodes} nodes of {opts.processes} process(es), "
              f"kv {opts.kv}, directory {self.dir}", flush=True)  # fmt: skip
        print("nemesis: schedule\n" + "\n".join("  " + f.describe() for f in faults), flush=True)
        try:
            if "upgrade" in opts.kinds:
                self.release = prepare()
                print(f"nemesis: the previous release is {self.release.commit[:12]} ({self.release.tree})", flush=True)
            if self.opts.netns or {"partition-stores", "partition-peers"} & set(opts.kinds):
                self.start_network()
            if "drift" in opts.kinds:
                ok, why = clock_tools()
                if not ok:
                    raise SystemExit(f"nemesis: the drift fault needs libfaketime: {why}")
            self.start_stores()
            self.setup()
            ledger = Ledger()
            ctx = Context(self.recorder, [n.url for n in self.nodes.values()], self.token, self.access_key, ledger,
                          VISIBILITY)  # fmt: skip
            clients = self.clients(ctx)
            for c in clients:
                c.start()
            threading.Thread(target=self.supervise, name="supervisor", daemon=True).start()
            nemesis = Nemesis(faults, self.actions(), self._record_fault, self.stop, self.node_locks)
            started = time.monotonic()
            nemesis.start()
            while time.monotonic() - started < opts.duration and nemesis.is_alive():
                time.sleep(0.5)
            self.stop.set()  # faults still on end now
            nemesis.join()
            self.errors += nemesis.errors
            deadline = time.monotonic() + 120
            for name in self.nodes:  # every node up again
                with self.node_locks[name]:
                    self.signal(name, signal.SIGCONT)
                    node = self.nodes[name]
                    while node.proc is None or node.proc.poll() is not None:
                        if self.start_node(name) or time.monotonic() > deadline:
                            break
                    if name in self.down:
                        self.errors.append(f"{name} could not be started again after the faults")
            ctx.stop_producing.set()
            for c in clients:  # their last calls answered (and confirmed) before the drain counts
                if c.produces:
                    c.join(timeout=30)
            drained = self._drain(ledger)
            ctx.stop.set()
            for c in clients:
                c.join(timeout=30)
                self.errors += [f"{c.process}: {e}" for e in c.errors]
            if not drained:
                print(f"nemesis: {ledger.missing()} confirmed messages still undelivered after the drain",
                      flush=True)  # fmt: skip
            self.finished.set()
            for node in self.nodes.values():
                node.ask_to_stop()
            for node in self.nodes.values():
                node.stop()
            for name in self.nodes:  # (what a stop that hung and was killed never reported)
                self.owners.ended(name)
            self.owners.close()
            self.recorder.close()
            return self._check(faults, ledger)
        finally:
            self._teardown()

    def _record_fault(self, kind: str, event: str, target: str) -> None:
        self.recorder.fault(kind, event, target)  # type: ignore[arg-type]

    def _drain(self, ledger: Ledger) -> bool:
        deadline = time.monotonic() + self.opts.drain
        while time.monotonic() < deadline:
            if ledger.missing() == 0:
                return True
            time.sleep(0.5)
        return ledger.missing() == 0

    def _check(self, faults: list[Fault], ledger: Ledger) -> Outcome:
        history = read(self.dir / "history.jsonl")
        result = check(history, overlap_slack_ns=int(self.opts.overlap_slack_ms * 1e6), group_batch=())
        summary, picture = report.write(
            history,
            result,
            self.dir,
            seed=self.opts.seed,
            commit=_commit(),
            nodes=self.opts.nodes,
            processes=self.opts.processes,
            kv=self.opts.kv,
            kinds=list(self.opts.kinds),
            schedule=[f.__dict__ for f in faults],
            clients=ledger.totals(),
            ownership_events=self.owners.count,
            run_errors=self.errors,
        )
        return Outcome(result, self.dir, summary, picture, faults, self.errors)

    def _teardown(self) -> None:
        self.stop.set()
        self.finished.set()
        for node in self.nodes.values():
            try:
                node.stop(timeout=10)
            except Exception as exc:
                print(f"nemesis: stopping {node.url}: {exc}", file=sys.stderr)
        if hasattr(self, "stores"):
            try:
                self.stores.stop()
            except Exception as exc:
                print(f"nemesis: stopping the stores: {exc}", file=sys.stderr)
        if hasattr(self, "owners") and not self.owners.closed.is_set():
            self.owners.close()
        if self.network is not None:  # after the stores: they listen on its address
            self.network.close()


def run(opts: Options) -> Outcome:
    outcome = Run(opts).go()
    if outcome.valid and not opts.keep:
        for part in ("services", "data"):
            shutil.rmtree(outcome.directory / part, ignore_errors=True)
    return outcome


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("nemesis: terminated; stopping the nodes and the stores", file=sys.stderr, flush=True)
    sys.exit(143)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemesis.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the faults go on (default 5)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one, printed)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1, help="processes of each node (runnode --processes)")
    parser.add_argument("--kv", choices=("redis", "redis-cluster", "postgres"), default="redis")
    parser.add_argument(
        "--faults",
        default=",".join(DEFAULT_KINDS),
        help=f"comma-separated kinds (default {','.join(DEFAULT_KINDS)}; known: {','.join(KINDS)}; 'none')",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "nemesis-runs", help="where the run's directory goes")
    parser.add_argument("--keep", action="store_true", help="keep the stores' and nodes' files of a valid run")
    parser.add_argument(
        "--netns", action="store_true", help="nodes in network namespaces (the partition faults imply it)"
    )
    args = parser.parse_args(argv)
    # SIGTERM as Ctrl-C: the run stops its nodes and stores and removes its namespaces; once
    # (``timeout`` and a process group's kill send it twice: the second must not cut the
    # clean-up short)
    signal.signal(signal.SIGTERM, _terminated)
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    kinds = [] if args.faults == "none" else [k.strip() for k in args.faults.split(",") if k.strip()]
    opts = Options(
        seed, args.minutes * 60, args.nodes, args.processes, args.kv, kinds, args.out, keep=args.keep, netns=args.netns
    )
    outcome = run(opts)
    print(json.dumps(outcome.result.to_json(), indent=2))
    for error in outcome.errors:
        print(f"nemesis: run error: {error}")
    print(f"nemesis: {'VALID' if outcome.valid else 'INVALID'}; seed {seed}; "
          f"summary {outcome.summary}; picture {outcome.picture}")  # fmt: skip
    return 0 if outcome.valid else 1


if __name__ == "__main__":
    sys.exit(main())
