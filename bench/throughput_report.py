"""The report of bench/throughput.py: medians and ratios of the recorded rounds, printed."""

from __future__ import annotations

import os
import platform

from common import fmt_box_speed, fmt_cores, fmt_fwd, fmt_rate, fmt_ratio, median
from throughput_rounds import FIGURES, STRICT_FIGURES, STRICT_LABELS, is_strict
from throughput_systems import System

BASELINES = ("skip-locked", "pgqueuer", "redis-streams", "thin[wsgi]", "thin[rsgi]")
#: the thin queue's systems (bench/serving_apps.py): a reference whose ratio to Redis Streams is the ceiling
THIN = ("thin[wsgi]", "thin[rsgi]")
CORES = ("client_cpu_cores", "server_cpu_cores", "store_cpu_cores", "box_cpu_cores")
PER_MESSAGE = ("client_cpu_us_msg", "server_cpu_us_msg", "store_cpu_us_msg", "server_cpu_us_call", "forwarded_per_msg")


def summarize(results: dict, modes, systems: list[System]) -> dict:
    """Medians per system (all its rounds); ratios pair each node with the baseline rounds
    of its own group (run interleaved with it)."""

    def med_of(samples: list, figures=FIGURES) -> dict:
        med = {f: median([x["phases"][f]["rate"] for x in samples]) for f in figures}
        for key in CORES + PER_MESSAGE:
            med[key] = median([x["phases"]["cycle"].get(key) for x in samples])
            med["phase_" + key] = {f: median([x["phases"][f].get(key) for x in samples]) for f in figures}
        med["rounds"] = len(samples)
        return med

    def deq_ack_rate(x: dict) -> float:
        """A standard round's dequeue + ack phases taken together, like a strict drain phase."""
        ph = x["phases"]
        return ph["ack"]["count"] / (ph["dequeue"]["wall"] + ph["ack"]["wall"])

    summary: dict = {}
    for mode, _batch, _n in modes:
        per = results.get(mode, {})
        summary[mode] = {}
        if is_strict(mode):
            std_mode = mode[len("strict-") :]
            vs = {}
            for s in systems:
                samples = per.get(s.name, {}).get("samples", [])
                if not samples:
                    continue
                m = med_of(samples, STRICT_FIGURES)
                d = [x["phases"]["drain"] for x in samples]
                m["dequeue_calls"] = median([x["dequeues"] for x in d])
                m["empty_dequeues"] = median([x["empty"] for x in d])
                m["msgs_per_dequeue"] = median([x["received"] / max(1, x["dequeues"] - x["empty"]) for x in d])
                summary[mode][s.name] = m
                std = results.get(std_mode, {}).get(s.name, {}).get("samples", [])
                if std:
                    b = {
                        "enqueue": median([x["phases"]["enqueue"]["rate"] for x in std]),
                        "drain": median([deq_ack_rate(x) for x in std]),
                        "cycle": median([x["phases"]["cycle"]["rate"] for x in std]),
                        "rounds": len(std),
                    }
                    vs[s.name] = {
                        "standard_mode": std_mode,
                        "standard": b,
                        "ratio": {f: (m[f] / b[f] if m[f] is not None and b[f] else None) for f in STRICT_FIGURES},
                    }
            summary[mode]["_vs_standard"] = vs
            continue
        for s in systems:
            samples = per.get(s.name, {}).get("samples", [])
            if samples:
                summary[mode][s.name] = med_of(samples)
        ratios = {}
        for s in systems:
            if not s.is_ours or s.name not in summary[mode]:
                continue
            o = summary[mode][s.name]
            for base in BASELINES:
                paired = [x for x in per.get(base, {}).get("samples", []) if x.get("group") == s.name]
                if paired:
                    b = med_of(paired)
                    ratios[f"{s.name} / {base}"] = {
                        f: (o[f] / b[f] if o[f] is not None and b[f] else None) for f in FIGURES
                    }
        summary[mode]["_ratios"] = ratios
        # The thin queue's own ratio to Redis Streams, over every round (both ran in every group).
        streams = summary[mode].get("redis-streams")
        summary[mode]["_ceiling"] = {
            name: summary[mode][name]["cycle"] / streams["cycle"]
            for name in THIN
            if streams and streams["cycle"] and name in summary[mode]
        }
    return summary


def system_row(name: str, m: dict, figures) -> str:
    """A system's line of a mode's table: its median rates, CPU in cores, rounds."""
    return (
        f"{name:<22}"
        + "".join(f"{fmt_rate(m[f]):>12}" for f in figures)
        + f"  {fmt_cores(m['client_cpu_cores']):>10}{fmt_cores(m['server_cpu_cores']):>11}"
        f"{fmt_cores(m.get('store_cpu_cores')):>10}{fmt_cores(m['box_cpu_cores']):>9}{m['rounds']:>8}"
    )


def not_measured_row(name: str, failure: str | None, width: int) -> str:
    return f"{name:<22}{'(not measured' + (': ' + failure[:width] if failure else '') + ')'}"


def print_report(args, modes, systems, results, summary, notes, speed=None) -> None:
    out = []
    w = out.append
    w("")
    w("=" * 100)
    w("THROUGHPUT (messages per second, medians over rounds; higher is better)")
    w("=" * 100)
    w(
        f"machine: {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    for when, figures in (speed or {}).items():
        w(f"box speed at the {when}: {fmt_box_speed(figures)} (bench/common.py box_speed: compare runs by these)")
    w(f"clients: {args.clients} client processes (Python, one connection each) on the SAME machine as the servers;")
    w("         their CPU is part of the load: see the client/server/store/box CPU columns (in cores busy, averaged")
    w(
        f"         over the full cycle; box = whole machine from /proc/stat ticks, at most {os.cpu_count()}). Rates are lower"
    )
    w("         bounds of what each server alone could do, and the cheapest server is held back the most.")
    w("workload: enqueue N (~100-byte bodies) -> dequeue all (no ack yet) -> ack all; each phase timed separately;")
    w("          cycle/s = acked messages / (enqueue + dequeue + ack seconds)")
    w(f"rounds:   {args.repeat} per system and mode after one untimed warm-up, interleaved (ours, skip-locked,")
    w("          pgqueuer, redis-streams, ours, ...); the baselines run alongside each of our nodes, so they get")
    w("          more rounds;")
    w("          ratios pair each node with the baseline rounds interleaved with it")
    if any(is_strict(m) for m, _b, _n in modes):
        w(f'strict:   queue created with "strict": true, message i in group g<i % {args.strict_groups}>; enqueue N,')
        w("          then ONE timed drain phase: each client loops dequeue(max B) -> ack those (B per call) until")
        w("          all N are acked (a group's next message is only delivered after the previous one is acked,")
        w("          so dequeue-all-then-ack-all cannot drain it). (deq+ack)/s = acked / drain seconds; cycle/s =")
        w("          acked / (enqueue + drain seconds). Compared with the standard mode of the same batch on the")
        w("          same node in this run, whose (deq+ack)/s = acked / (dequeue + ack seconds).")
    for n_ in notes:
        w(f"  - {n_}")
    for mode, batch, n in modes:
        w("")
        if is_strict(mode):
            print_strict_mode(w, args, mode, batch, n, systems, results, summary)
            continue
        label = (
            "1 message per call"
            if batch == 1
            else f"{batch} messages per call (redis: pipeline of {batch} XADD, XREADGROUP COUNT {batch}, XACK {batch} ids)"
        )
        w(f"--- mode {mode}: N={n:,} per round, {label}")
        hdr = (
            f"{'system':<22}{'enqueue/s':>12}{'dequeue/s':>12}{'ack/s':>12}{'cycle/s':>12}  "
            f"{'client CPU':>10}{'server CPU':>11}{'store CPU':>10}{'box CPU':>9}{'rounds':>8}"
        )
        w(hdr)
        w("-" * len(hdr))
        for s in systems:
            m = summary.get(mode, {}).get(s.name)
            if m is None:
                w(not_measured_row(s.name, results.get("_failures", {}).get(s.name), 60))
                continue
            w(system_row(s.name, m, FIGURES))
        ratios = summary.get(mode, {}).get("_ratios", {})
        if ratios:
            w("")
            hdr2 = f"{'ratio (ours / baseline)':<34}" + "".join(f"{f:>10}" for f in FIGURES)
            w(hdr2)
            w("-" * len(hdr2))
            for label2, r in ratios.items():
                w(f"{label2:<34}" + "".join(f"{('n/a' if r[f] is None else f'{r[f]:.3f}x'):>10}" for f in FIGURES))
        print_cpu_table(w, mode, systems, summary)
        for s in systems:
            an = results.get(mode, {}).get(s.name, {}).get("anomalies", [])
            for a in an:
                w(f"  ! {s.name}: {a}")
    fails = results.get("_failures", {})
    if fails:
        w("")
        for k, v in fails.items():
            w(f"not measured: {k}: {v}")
    closing = closing_summary(modes, systems, summary)
    if closing:
        w("")
        w("=" * 100)
        w("SUMMARY (this run only; paste as is)")
        w("=" * 100)
        out.extend(closing)
    w("")
    w("notes: redis XACK only removes the entry from the group's pending list; the stream keeps the")
    w("       message until the stream is deleted (XDEL/XTRIM would be extra calls). pgqueuer's ack")
    w("       (log_jobs) deletes the job row and writes a log row; skip-locked's ack deletes the row.")
    w("       Dequeue/ack figures are measured with every message in flight at once (all dequeued")
    w("       before the first ack). CPU from /proc is counted in clock ticks (1/100 s): a phase")
    w("       that burns few ticks rounds coarsely; redis-server's INFO cpu is finer.")
    print("\n".join(out), flush=True)


def fmt_us(x) -> str:
    """CPU microseconds as printed: whole numbers from 100 up, one decimal below."""
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def print_cpu_table(w, mode: str, systems, summary: dict) -> None:
    """A standard mode's CPU per message: each side apart, the server's per phase and per call."""
    per = summary.get(mode, {})
    measured = [s for s in systems if s.name in per]
    if not measured:
        return
    w("")
    w(f"CPU per message, {mode}: microseconds of CPU time per acked message over the full cycle (medians);")
    w("  server = ours: every process of the node; redis-streams: redis-server; pgqueuer, skip-locked: the")
    w("  PostgreSQL backends of their connections. store = ours only: redis-server (every node of a cluster)")
    w("  + the node's PostgreSQL backends. client = the client processes' own CPU. srv/call = server CPU")
    w("  over every call of the cycle (enqueue, dequeue with the empty ones, ack); srv enq/deq/ack = the")
    w("  server's CPU in each phase per message of that phase. fwd = ours only: calls the node forwarded to")
    w("  another node or a sibling process (mq_forwarded_calls_total), per message of the cycle and of each phase.")
    hdr = (
        f"{'system':<22}{'server':>9}{'store':>9}{'srv+store':>10}{'client':>9}{'srv/call':>10}"
        f"{'srv enq':>9}{'srv deq':>9}{'srv ack':>9}{'fwd':>8}{'fwd enq':>9}{'fwd deq':>9}{'fwd ack':>9}"
    )
    w(hdr)
    w("-" * len(hdr))
    for s in measured:
        m = per[s.name]
        srv, store = m.get("server_cpu_us_msg"), m.get("store_cpu_us_msg")
        both = srv if store is None else (None if srv is None else srv + store)
        ph = m.get("phase_server_cpu_us_msg") or {}
        fwd = m.get("phase_forwarded_per_msg") or {}
        w(
            f"{s.name:<22}{fmt_us(srv):>9}{('-' if not s.is_ours else fmt_us(store)):>9}{fmt_us(both):>10}"
            f"{fmt_us(m.get('client_cpu_us_msg')):>9}{fmt_us(m.get('server_cpu_us_call')):>10}"
            + "".join(f"{fmt_us(ph.get(f)):>9}" for f in ("enqueue", "dequeue", "ack"))
            + f"{fmt_fwd(m.get('forwarded_per_msg')):>8}"
            + "".join(f"{fmt_fwd(fwd.get(f)):>9}" for f in ("enqueue", "dequeue", "ack"))
        )


# The goals (issue 17), printed beside the figures; the benchmark never passes or fails.
GOALS = {
    # (mode, backend family, what): (comparison, threshold)
    ("batch100", "redis", "vs pgqueuer"): (">=", 2.0),
    ("batch100", "redis", "vs redis-streams"): (">=", 0.5),
    ("single", "redis", "vs redis-streams"): (">=", 0.6),
    ("batch100", "redis", "node us/msg"): ("<=", 40.0),
    ("single", "redis", "node us/call"): ("<=", 200.0),
    ("batch100", "postgres", "vs pgqueuer"): (">=", 1.0),
}


def family(system) -> str:
    """redis for ours on redis or redis-cluster; the backend otherwise."""
    backend = getattr(system, "backend", "")
    return "redis" if backend.startswith("redis") else backend


def goal_text(mode: str, system, what: str, value) -> str:
    goal = GOALS.get((mode, family(system), what))
    if goal is None or value is None:
        return ""
    op, limit = goal
    met = value >= limit if op == ">=" else value <= limit
    return f" (goal {op} {limit:g}: {'met' if met else 'NOT met'})"


def closing_summary(modes, systems, summary: dict) -> list[str]:
    """The figures the closing note quotes, from this run: a markdown table of full-cycle rates
    with the server (node) CPU per message, then the same-run ratios of each of our nodes to the
    baselines interleaved with it, the node CPU per message and per call beside the issue's
    goals with the calls the node forwarded per message, and our nodes compared with each other (1 vs N processes, Redis vs Redis Cluster)."""
    std = [(m, b) for m, b, _n in modes if not is_strict(m)]
    measured = [s for s in systems if any(s.name in summary.get(m, {}) for m, _b in std)]
    if not std or not measured:
        return []
    out = []
    w = out.append
    w("full cycle (enqueue + dequeue + ack), msg/s, with the server's CPU per message in parentheses")
    w("(ours: the node's processes; redis-streams: redis-server; pgqueuer, skip-locked: their PostgreSQL backends)")
    w("")
    w("| full cycle, msg/s (server µs/msg) | " + " | ".join(s.name for s in measured) + " |")
    w("| --- |" + " --- |" * len(measured))
    for mode, batch in std:
        label = "one message per call" if batch == 1 else f"{batch} per call"
        cells = []
        for s in measured:
            m = summary.get(mode, {}).get(s.name)
            cells.append("n/a" if m is None else f"{fmt_rate(m['cycle'])} ({fmt_us(m.get('server_cpu_us_msg'))})")
        w(f"| {label} ({mode}) | " + " | ".join(cells) + " |")
    ours = [s for s in measured if s.is_ours]
    if not ours:
        return out
    w("")
    w("same-run ratios, full cycle (each node / the baseline rounds interleaved with it):")
    for mode, _batch in std:
        ratios = summary.get(mode, {}).get("_ratios", {})
        for s in ours:
            parts = []
            for base in BASELINES:
                r = ratios.get(f"{s.name} / {base}", {}).get("cycle")
                if r is not None:
                    parts.append(f"vs {base} {r:.3f}x{goal_text(mode, s, 'vs ' + base, r)}")
            if parts:
                w(f"  {mode:<9} {s.name}: " + "; ".join(parts))
    ceilings = [(mode, summary.get(mode, {}).get("_ceiling", {})) for mode, _batch in std]
    if any(c for _m, c in ceilings):
        w("")
        w("the ceiling: the thin queue (our calls with nothing but our node's store round trips) / redis-streams,")
        w("full cycle, every round (about the best a Python HTTP queue over this Redis shows on this machine):")
        for mode, ceiling in ceilings:
            if ceiling:
                w(f"  {mode:<9} " + "; ".join(f"{name} {r:.3f}x" for name, r in ceiling.items()))
    w("")
    w("node CPU (every process of the node), medians over the full cycle:")
    for mode, _batch in std:
        for s in ours:
            m = summary.get(mode, {}).get(s.name)
            if m is None:
                continue
            us_msg, us_call = m.get("server_cpu_us_msg"), m.get("server_cpu_us_call")
            w(
                f"  {mode:<9} {s.name}: {fmt_us(us_msg)} µs/msg{goal_text(mode, s, 'node us/msg', us_msg)}, "
                f"{fmt_us(us_call)} µs/call{goal_text(mode, s, 'node us/call', us_call)}, "
                f"{fmt_cores(m.get('server_cpu_cores'))} cores busy; store {fmt_us(m.get('store_cpu_us_msg'))} µs/msg; "
                f"{fmt_fwd(m.get('forwarded_per_msg'))} forwarded calls/msg"
            )
    pairs = ours_pairs(ours)
    if pairs:
        w("")
        w("our nodes compared (each ran in its own group, one after the other: not interleaved):")
        for mode, _batch in std:
            per = summary.get(mode, {})
            for a, b in pairs:
                ma, mb = per.get(a.name), per.get(b.name)
                if ma is None or mb is None:
                    continue
                w(
                    f"  {mode:<9} {a.name} / {b.name}: cycle {fmt_ratio(ma['cycle'], mb['cycle'])}, "
                    f"node µs/msg {fmt_ratio(ma.get('server_cpu_us_msg'), mb.get('server_cpu_us_msg'))}, "
                    f"node cores busy {fmt_cores(ma.get('server_cpu_cores'))} vs {fmt_cores(mb.get('server_cpu_cores'))}"
                )
    return out


def ours_pairs(ours: list) -> list[tuple]:
    """Pairs of our nodes worth a ratio: the same backend with more processes over fewer, and
    Redis Cluster over Redis with the same processes."""
    pairs = []
    for a in ours:
        for b in ours:
            if a is b:
                continue
            pa, pb = getattr(a, "processes", None), getattr(b, "processes", None)
            if (a.backend == b.backend and pa is not None and pb is not None and pa > pb) or (
                a.backend == "redis-cluster" and b.backend == "redis" and pa == pb
            ):
                pairs.append((a, b))
    return pairs


def print_strict_mode(w, args, mode, batch, n, systems, results, summary) -> None:
    std_mode = mode[len("strict-") :]
    per_call = "1 message per call" if batch == 1 else f"{batch} messages per call"
    w(
        f"--- mode {mode}: N={n:,} per round, strict queue, {args.strict_groups:,} groups, {per_call} "
        f"(dequeue max {batch}, ack {batch} per call)"
    )
    hdr = (
        f"{'system':<22}"
        + "".join(f"{STRICT_LABELS[f]:>12}" for f in STRICT_FIGURES)
        + f"  {'client CPU':>10}{'server CPU':>11}{'store CPU':>10}{'box CPU':>9}{'rounds':>8}{'msgs/deq':>10}"
    )
    w(hdr)
    w("-" * len(hdr))
    fails = results.get("_failures", {})
    ours = [s for s in systems if s.is_ours]
    for s in ours:
        m = summary.get(mode, {}).get(s.name)
        if m is None:
            w(not_measured_row(s.name, fails.get(f"{s.name} {mode}") or fails.get(s.name), 70))
            continue
        w(system_row(s.name, m, STRICT_FIGURES) + f"{m['msgs_per_dequeue']:>10.1f}")
    if not ours:
        w("(our service is not run: --skip-ours)")
    w("baselines: not run in strict modes (Redis Streams, pgqueuer and skip-locked have no per-group, one-at-a-time")
    w("           delivery)")
    vs = summary.get(mode, {}).get("_vs_standard", {})
    measured = [s for s in ours if s.name in summary.get(mode, {})]
    if measured:
        w("")
        hdr2 = (
            f"{'strict vs standard (' + std_mode + ')':<34}"
            + "".join(f"{STRICT_LABELS[f]:>13}" for f in STRICT_FIGURES)
            + f"{'rounds':>8}"
        )
        w(hdr2)
        w("-" * len(hdr2))
        for s in measured:
            v = vs.get(s.name)
            if v is None:
                w(f"{s.name:<34}(no {std_mode} rounds of this node in this run: add {std_mode} to --modes)")
                continue
            m = summary[mode][s.name]
            w(
                f"{s.name + ' strict':<34}"
                + "".join(f"{fmt_rate(m[f]):>13}" for f in STRICT_FIGURES)
                + f"{m['rounds']:>8}"
            )
            w(
                f"{s.name + ' ' + std_mode:<34}"
                + "".join(f"{fmt_rate(v['standard'][f]):>13}" for f in STRICT_FIGURES)
                + f"{v['standard']['rounds']:>8}"
            )
            w(
                f"{'  ratio strict / ' + std_mode:<34}"
                + "".join(
                    f"{('n/a' if v['ratio'][f] is None else format(v['ratio'][f], '.3f') + 'x'):>13}"
                    for f in STRICT_FIGURES
                )
            )
    for s in ours:
        for a in results.get(mode, {}).get(s.name, {}).get("anomalies", []):
            w(f"  ! {s.name}: {a}")
        m = summary.get(mode, {}).get(s.name)
        if m is not None:
            w(
                f"  {s.name}: drain phase, medians per round: {m['dequeue_calls']:,.0f} dequeue calls, "
                f"{m['empty_dequeues']:,.0f} of them empty; per-group order and one-at-a-time checked on every round"
                + (
                    " (see anomalies above)"
                    if results.get(mode, {}).get(s.name, {}).get("anomalies")
                    else ": no violation"
                )
            )
