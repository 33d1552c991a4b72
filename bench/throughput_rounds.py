"""The workload of bench/throughput.py: client pools, one timed round (standard or strict),
and the driver that interleaves the systems' rounds and records their samples."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import time
import traceback
import uuid
from contextlib import contextmanager

import throughput_clients as tc
from common import BenchError, fmt_cores, fmt_fwd, fmt_rate, log
from throughput_cpu import background_load, box_busy_seconds, per_message_us
from throughput_systems import System

FIGURES = ("enqueue", "dequeue", "ack", "cycle")
STRICT_FIGURES = ("enqueue", "drain", "cycle")  # drain = the combined dequeue+ack phase
STRICT_LABELS = {"enqueue": "enqueue/s", "drain": "(deq+ack)/s", "cycle": "cycle/s"}


def is_strict(mode: str) -> bool:
    return mode.startswith("strict-")


def figures_of(mode: str) -> tuple:
    return STRICT_FIGURES if is_strict(mode) else FIGURES


# --------------------------------------------------------------------------------------
# client processes
# --------------------------------------------------------------------------------------


class ClientPool:
    """--clients spawned processes, each with one connection to the system under test."""

    def __init__(self, kind: str, spec: dict, n: int, reply_timeout: float) -> None:
        ctx = mp.get_context("spawn")
        self.counter = ctx.Value("q", 0)
        self.barrier = ctx.Barrier(n)
        self.reply_timeout = reply_timeout
        self.conns, self.procs = [], []
        for i in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=tc.worker_main,
                args=(child, kind, spec, i, self.counter, self.barrier),
                name=f"mqbench-{kind}-{i}",
                daemon=True,
            )
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self._collect("start", 120)

    def _collect(self, what: str, timeout: float) -> list:
        out, errors = [], []
        deadline = time.monotonic() + timeout
        for c in self.conns:
            if not c.poll(max(0.0, deadline - time.monotonic())):
                raise BenchError(f"client did not answer {what!r} within {timeout:.0f}s")
            status, payload = c.recv()
            (errors if status == "err" else out).append(payload)
        if errors:
            # the first error is the cause, the others are usually broken barriers
            cause = next((e for e in errors if "BrokenBarrierError" not in e), errors[0])
            raise BenchError(f"client failed during {what}:\n{cause}")
        return out

    def send(self, cmd: str, args_per_client: list, timeout: float | None = None) -> list:
        if self.barrier.broken:
            self.barrier.reset()
        for c, a in zip(self.conns, args_per_client):
            c.send((cmd, a))
        return self._collect(cmd, timeout or self.reply_timeout)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop", None))
            except Exception:
                pass
        deadline = time.monotonic() + 10  # for them all: a client in a long phase is not listening
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)


# --------------------------------------------------------------------------------------
# one round: enqueue N, dequeue N, ack N
# --------------------------------------------------------------------------------------


CPU_KEYS = ("client_cpu_s", "server_cpu_s", "store_cpu_s", "box_cpu_s")


def run_phase(system: System, pool: ClientPool, cmd: str, args_per_client: list, timeout: float) -> dict:
    """One timed phase on every client; its counts, and the CPU seconds each side spent:
    clients (their own process time over the phase), server (:meth:`System.server_cpu`),
    store (ours: :meth:`System.store_cpu`) and the whole machine, read right before the
    clients are released and right after the last one reported; and the calls the node
    forwarded (ours: :meth:`System.forwarded_calls`), read outside the CPU readings so that
    its scrape is not in them."""
    f0 = system.forwarded_calls()
    s0, t0, b0 = system.server_cpu(), system.store_cpu(), box_busy_seconds()
    res = pool.send(cmd, args_per_client, timeout=timeout)
    s1, t1, b1 = system.server_cpu(), system.store_cpu(), box_busy_seconds()
    f1 = system.forwarded_calls()
    wall = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    wall = max(wall, 1e-9)
    count = sum(r["count"] for r in res)
    out = {
        "wall": wall,
        "count": count,
        "rate": count / wall,
        "calls": sum(r["calls"] for r in res),
        "empty": sum(r["empty"] for r in res),
        "errors": sum(r["errors"] for r in res),
        "error_samples": [e for r in res for e in r["error_samples"]][:3],
        "timed_out": any(r["timed_out"] for r in res),
        "client_cpu_s": sum(r["cpu"] for r in res),
        "server_cpu_s": (s1 - s0) if s0 is not None and s1 is not None else None,
        "store_cpu_s": (t1 - t0) if t0 is not None and t1 is not None else None,
        "box_cpu_s": b1 - b0,
        "forwarded": (f1 - f0) if f0 is not None and f1 is not None else None,
    }
    if cmd == "dequeue":
        ids = [i for r in res for i in r["ids"]]
        out["unique"] = len(set(ids))
        out["duplicates"] = len(ids) - out["unique"]
    elif cmd == "drain":
        out["received"] = sum(r["received"] for r in res)
        out["dequeues"] = sum(r["dequeues"] for r in res)
        out["gave_up"] = sum(1 for r in res if r["gave_up"])
        out["deliveries"] = [d for r in res for d in r["deliveries"]]
    return out


def deal(n: int, batch: int, k: int) -> list[list[int]]:
    """Message indexes 0..n-1 in chunks of ``batch``, dealt round-robin to ``k`` clients."""
    chunks = [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]
    return [[i for c in chunks[w::k] for i in c] for w in range(k)]


def add_cycle(phases: dict, count: int) -> None:
    """Add the ``cycle`` figure (every phase taken together, ``count`` messages through), then
    each figure's CPU seconds as cores busy over its wall time and as microseconds per
    message (``*_us_msg``: over the messages of that phase; the cycle's over ``count``) and
    per call (``*_us_call``: over every call the clients made in it, empty dequeues too), and
    the calls the node forwarded per message (``forwarded_per_msg``, ours only)."""
    wall = sum(p["wall"] for p in phases.values())

    def tot(key):
        vals = [p.get(key) for p in phases.values()]
        return None if any(v is None for v in vals) else sum(vals)

    phases["cycle"] = {
        "wall": wall,
        "count": count,
        "rate": count / wall,
        "calls": tot("calls"),
        "forwarded": tot("forwarded"),
        **{key: tot(key) for key in CPU_KEYS},
    }
    for p in phases.values():
        for key in CPU_KEYS:
            v = p.get(key)
            p[key.replace("_s", "_cores")] = None if v is None else v / p["wall"]
            p[key.replace("_s", "_us_msg")] = per_message_us(v, p["count"])
            p[key.replace("_s", "_us_call")] = per_message_us(v, p.get("calls"))
        fwd = p.get("forwarded")
        p["forwarded_per_msg"] = None if fwd is None or not p["count"] else fwd / p["count"]


def request_errors(*phases: dict) -> list[str]:
    """The anomaly line for the phases' failed or retried requests, if any."""
    errs = sum(p["errors"] for p in phases)
    if not errs:
        return []
    samples = [e for p in phases for e in p["error_samples"]]
    return [f"{errs} request errors/retries, e.g. {samples[:2]}"]


@contextmanager
def fresh_target(system: System, pool: ClientPool, tag: str, **options):
    """A new target (queue, stream...) for one round, given to every client; dropped after."""
    target = system.new_target(tag, **options)
    try:
        pool.send("target", [target] * len(pool.conns))
        yield target
    finally:
        try:
            system.drop_target(target)
        except Exception as exc:
            log(f"{system.name}: cleanup of {target}: {exc}")


def enqueue_phase(system: System, pool: ClientPool, tag: str, n: int, batch: int, args, **extra) -> dict:
    """The timed enqueue of messages 0..n-1, ``batch`` per call; then the shared counter the
    next phase counts in starts at 0."""
    k = len(pool.conns)
    enq = run_phase(
        system,
        pool,
        "enqueue",
        [{"tag": tag, "indexes": idx, "batch": batch, **extra} for idx in deal(n, batch, k)],
        args.phase_timeout + 60,
    )
    pool.counter.value = 0
    return enq


def run_round(system: System, pool: ClientPool, mode: str, batch: int, n: int, tag: str, args) -> dict:
    k = len(pool.conns)
    with fresh_target(system, pool, tag):
        enq = enqueue_phase(system, pool, tag, n, batch, args)
        deq = run_phase(
            system,
            pool,
            "dequeue",
            [{"max": batch, "target": enq["count"], "timeout": args.phase_timeout, "empty_sleep": args.empty_sleep}]
            * k,
            args.phase_timeout + 60,
        )
        ack = run_phase(system, pool, "ack", [{"batch": batch}] * k, args.phase_timeout + 60)
    phases = {"enqueue": enq, "dequeue": deq, "ack": ack}
    add_cycle(phases, ack["count"])
    anomalies = []
    if enq["count"] != n:
        anomalies.append(f"enqueued {enq['count']}/{n}")
    if deq["count"] != enq["count"]:
        anomalies.append(f"received {deq['count']}/{enq['count']}")
    if deq["duplicates"]:
        anomalies.append(f"{deq['duplicates']} duplicate deliveries")
    if ack["count"] != deq["unique"]:
        anomalies.append(f"acked {ack['count']}/{deq['unique']}")
    if deq["timed_out"]:
        anomalies.append("dequeue phase hit --phase-timeout")
    anomalies += request_errors(enq, deq, ack)
    return {"tag": tag, "n": n, "mode": mode, "phases": phases, "anomalies": anomalies}


def check_strict_order(deliveries: list) -> dict:
    """From the clients' records (group, sequence, id, t_received, t_ack_sent), all on this
    machine's monotonic clock: per group, in the order the messages reached the clients,
    sequences must increase, and each message must reach a client only after the previous
    message of its group had its ack sent (else two were out at once)."""
    ids = [d[2] for d in deliveries]
    by_group: dict = {}
    for g, seq, _id, t_recv, t_ack in deliveries:
        by_group.setdefault(g, []).append((t_recv, seq, t_ack))
    out_of_order = overlapping = 0
    for items in by_group.values():
        items.sort(key=lambda x: x[0])
        for (_t0, s0, a0), (t1, s1, _a1) in itertools.pairwise(items):
            if s0 is not None and s1 is not None and s1 <= s0:
                out_of_order += 1
            if t1 < a0:
                overlapping += 1
    return {
        "groups_seen": len([g for g in by_group if g is not None]),
        "no_group": len(by_group.get(None, [])),
        "duplicates": len(ids) - len(set(ids)),
        "out_of_order": out_of_order,
        "overlapping": overlapping,
    }


def run_strict_round(system: System, pool: ClientPool, mode: str, batch: int, n: int, tag: str, args) -> dict:
    """Strict queue: enqueue N with group g<i % groups>, then one timed drain phase in which
    every client loops dequeue(max=batch) -> ack those, until all N are acked."""
    k = len(pool.conns)
    with fresh_target(system, pool, tag, strict=True):
        enq = enqueue_phase(system, pool, tag, n, batch, args, groups=args.strict_groups)
        drain = run_phase(
            system,
            pool,
            "drain",
            [
                {
                    "max": batch,
                    "batch": batch,
                    "target": enq["count"],
                    "timeout": args.phase_timeout,
                    "empty_sleep": args.empty_sleep,
                }
            ]
            * k,
            args.phase_timeout + 60,
        )
    if drain["gave_up"]:
        raise BenchError(
            f"{drain['gave_up']} client(s) gave up the drain phase after failed calls, "
            f"e.g. {drain['error_samples'][:2]}"
        )
    check = check_strict_order(drain.pop("deliveries"))
    drain["order_check"] = check
    phases = {"enqueue": enq, "drain": drain}
    add_cycle(phases, drain["count"])
    anomalies = []
    if enq["count"] != n:
        anomalies.append(f"enqueued {enq['count']}/{n}")
    if drain["count"] != enq["count"]:
        anomalies.append(f"acked {drain['count']}/{enq['count']}")
    if drain["received"] != drain["count"]:
        anomalies.append(f"received {drain['received']} but acked {drain['count']}")
    if drain["timed_out"]:
        anomalies.append("drain phase hit --phase-timeout")
    for key, what in (
        ("duplicates", "duplicate deliveries"),
        ("no_group", "deliveries without a group"),
        ("out_of_order", "deliveries out of their group's sequence order"),
        ("overlapping", "deliveries while the group's previous message was still unacked"),
    ):
        if check[key]:
            anomalies.append(f"{check[key]} {what}")
    if check["groups_seen"] != min(n, args.strict_groups):
        anomalies.append(f"{check['groups_seen']} groups delivered, expected {min(n, args.strict_groups)}")
    anomalies += request_errors(enq, drain)
    return {"tag": tag, "n": n, "mode": mode, "phases": phases, "anomalies": anomalies}


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------


class Runner:
    """Starts systems, keeps one client pool per system, runs rounds, records failures."""

    def __init__(self, args, results: dict, notes: list) -> None:
        self.args, self.results, self.notes = args, results, notes
        self.pools: dict[str, ClientPool] = {}
        self.failed: dict[str, str] = results.setdefault("_failures", {})

    def start(self, system: System) -> bool:
        log(f"== start {system.name}")
        try:
            system.start()
            desc = system.describe()
            if desc:
                self.notes.append(desc)
            self.pools[system.name] = ClientPool(
                system.kind, system.client_spec(), self.args.clients, self.args.phase_timeout + 120
            )
            return True
        except Exception as exc:
            self.fail(system, exc)
            self.stop(system)
            return False

    def stop(self, system: System) -> None:
        pool = self.pools.pop(system.name, None)
        if pool is not None:
            pool.close()
        try:
            system.stop()
        except Exception as exc:
            log(f"{system.name}: stop/cleanup failed: {exc}")

    def fail(self, system: System, exc: Exception) -> None:
        log(f"{system.name}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        self.failed.setdefault(system.name, f"{type(exc).__name__}: {exc}")

    def alive(self, system: System) -> bool:
        return system.name in self.pools and system.name not in self.failed

    def round(self, system: System, mode: str, batch: int, n: int, tag: str, group: str, rep: int | None) -> None:
        if not self.alive(system):
            return
        strict = is_strict(mode)
        if strict and f"{system.name} {mode}" in self.failed:
            return
        try:
            if strict:
                r = run_strict_round(system, self.pools[system.name], mode, batch, n, tag, self.args)
            else:
                r = run_round(system, self.pools[system.name], mode, batch, n, tag, self.args)
        except Exception as exc:
            if strict:  # a strict-mode failure (e.g. a node without strict queues) spares the other modes
                log(f"{system.name} {mode}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                self.failed.setdefault(f"{system.name} {mode}", f"{type(exc).__name__}: {exc}")
            else:
                self.fail(system, exc)
            return
        ph = r["phases"]
        what = "warm-up" if rep is None else f"round {rep + 1}/{self.args.repeat}"
        extra = ""
        if strict:
            d = ph["drain"]
            extra = (
                f"  ({d['dequeues']:,} dequeue calls, {d['empty']:,} empty, "
                f"{d['received'] / max(1, d['dequeues'] - d['empty']):.1f} msgs per non-empty dequeue)"
            )
        log(
            f"{system.name} {mode} {what} [{group}]: "
            + "  ".join(f"{f} {fmt_rate(ph[f]['rate'])}/s" for f in figures_of(mode))
            + f"  box CPU {fmt_cores(ph['cycle']['box_cpu_cores'])}"
            + (
                "  forwarded/msg " + " ".join(f"{f} {fmt_fwd(ph[f]['forwarded_per_msg'])}" for f in ph)
                if ph["cycle"]["forwarded_per_msg"] is not None
                else ""
            )
            + extra
            + (f"  ANOMALIES: {r['anomalies']}" if r["anomalies"] else "")
        )
        if rep is None:
            return
        r["group"], r["rep"] = group, rep
        entry = self.results.setdefault(mode, {}).setdefault(system.name, {"samples": [], "anomalies": []})
        entry["samples"].append(r)
        if r["anomalies"]:
            entry["anomalies"].append(f"[{group}] round {rep}: " + "; ".join(r["anomalies"]))


def run_groups(
    groups: list[tuple[str, list[System]]], baselines: list[System], args, modes, results: dict, notes: list
) -> None:
    """Each group = one of our nodes (if any) plus the baselines, their rounds interleaved
    (ours, redis-streams, pgqueuer, ours, ...) so that load from anything else on the machine
    hits all systems alike. Baselines stay up across groups; each node lives for its group."""
    runner = Runner(args, results, notes)
    for b in baselines:
        runner.start(b)
    try:
        ran = False
        if baselines and any(m.is_ours for _g, ms in groups for m in ms):
            # if none of our nodes comes up, the baselines still run, on their own
            groups = [*groups, ("baselines", list(baselines))]
        for group, members in groups:
            if group == "baselines" and ran:
                break
            ours = [m for m in members if m.is_ours]
            for o in ours:
                runner.start(o)
            try:
                live = [m for m in members if runner.alive(m)]
                if not live or (ours and not any(runner.alive(o) for o in ours)):
                    continue  # nothing of ours to pair the baselines with
                ran = True
                idle0 = {m.name: m.server_cpu() for m in live}
                bg = background_load(1.0)
                idle = []
                for m in live:
                    v0, v1 = idle0[m.name], m.server_cpu()
                    idle.append(f"{m.name} {'n/a' if v0 is None or v1 is None else format(v1 - v0, '.2f')}")
                notes.append(
                    f"[{group}] machine busy {bg:.2f} cores over 1 s of idleness before the rounds "
                    f"(other processes on the box{', plus the idle node' if ours else ''}); "
                    f"idle server CPU in that second, cores: {', '.join(idle)}"
                )
                for mode, batch, n in modes:
                    run_id = uuid.uuid4().hex[:6]
                    # strict modes: our nodes only (the baselines have no per-group ordering)
                    live_m = [m for m in live if m.is_ours] if is_strict(mode) else live
                    if args.warmup > 0:
                        for m in live_m:
                            runner.round(m, mode, batch, min(args.warmup, n), f"{mode}-{run_id}-warm", group, None)
                    for rep in range(args.repeat):
                        for m in live_m:
                            runner.round(m, mode, batch, n, f"{mode}-{run_id}-r{rep}", group, rep)
            finally:
                for o in ours:
                    runner.stop(o)
    finally:
        for b in baselines:
            runner.stop(b)
