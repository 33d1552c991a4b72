"""The report of bench/throughput.py: medians and ratios of the recorded rounds, printed."""

from __future__ import annotations

import os
import platform

from common import fmt_cores, fmt_rate, median
from throughput_rounds import FIGURES, STRICT_FIGURES, STRICT_LABELS, is_strict
from throughput_systems import System


def summarize(results: dict, modes, systems: list[System]) -> dict:
    """Medians per system (all its rounds); ratios pair each node with the baseline rounds
    of its own group (run interleaved with it)."""

    def med_of(samples: list, figures=FIGURES) -> dict:
        med = {f: median([x["phases"][f]["rate"] for x in samples]) for f in figures}
        for key in ("client_cpu_cores", "server_cpu_cores", "box_cpu_cores"):
            med[key] = median([x["phases"]["cycle"][key] for x in samples])
            med["phase_" + key] = {f: median([x["phases"][f][key] for x in samples]) for f in figures}
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
            for base in ("redis-streams", "pgqueuer"):
                paired = [x for x in per.get(base, {}).get("samples", []) if x.get("group") == s.name]
                if paired:
                    b = med_of(paired)
                    ratios[f"{s.name} / {base}"] = {
                        f: (o[f] / b[f] if o[f] is not None and b[f] else None) for f in FIGURES
                    }
        summary[mode]["_ratios"] = ratios
    return summary


def system_row(name: str, m: dict, figures) -> str:
    """A system's line of a mode's table: its median rates, CPU in cores, rounds."""
    return (
        f"{name:<18}"
        + "".join(f"{fmt_rate(m[f]):>12}" for f in figures)
        + f"  {fmt_cores(m['client_cpu_cores']):>10}{fmt_cores(m['server_cpu_cores']):>11}"
        f"{fmt_cores(m['box_cpu_cores']):>9}{m['rounds']:>8}"
    )


def not_measured_row(name: str, failure: str | None, width: int) -> str:
    return f"{name:<18}{'(not measured' + (': ' + failure[:width] if failure else '') + ')'}"


def print_report(args, modes, systems, results, summary, notes) -> None:
    out = []
    w = out.append
    w("")
    w("=" * 100)
    w("THROUGHPUT (messages per second, medians over rounds; higher is better)")
    w("=" * 100)
    w(
        f"machine: {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    w(f"clients: {args.clients} client processes (Python, one connection each) on the SAME machine as the servers;")
    w("         their CPU is part of the load: see the client/server/box CPU columns (in cores busy, averaged")
    w(
        f"         over the full cycle; box = whole machine from /proc/stat ticks, at most {os.cpu_count()}). Rates are lower"
    )
    w("         bounds of what each server alone could do, and the cheapest server is held back the most.")
    w("workload: enqueue N (~100-byte bodies) -> dequeue all (no ack yet) -> ack all; each phase timed separately;")
    w("          cycle/s = acked messages / (enqueue + dequeue + ack seconds)")
    w(f"rounds:   {args.repeat} per system and mode after one untimed warm-up, interleaved (ours, redis-streams,")
    w("          pgqueuer, ours, ...); the baselines run alongside each of our nodes, so they get more rounds;")
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
            f"{'system':<18}{'enqueue/s':>12}{'dequeue/s':>12}{'ack/s':>12}{'cycle/s':>12}  "
            f"{'client CPU':>10}{'server CPU':>11}{'box CPU':>9}{'rounds':>8}"
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
        for s in systems:
            an = results.get(mode, {}).get(s.name, {}).get("anomalies", [])
            for a in an:
                w(f"  ! {s.name}: {a}")
    fails = results.get("_failures", {})
    if fails:
        w("")
        for k, v in fails.items():
            w(f"not measured: {k}: {v}")
    w("")
    w("notes: redis XACK only removes the entry from the group's pending list; the stream keeps the")
    w("       message until the stream is deleted (XDEL/XTRIM would be extra calls). pgqueuer's ack")
    w("       (log_jobs) deletes the job row and writes a log row. Dequeue/ack figures are measured with")
    w("       every message in flight at once (all dequeued before the first ack).")
    print("\n".join(out), flush=True)


def print_strict_mode(w, args, mode, batch, n, systems, results, summary) -> None:
    std_mode = mode[len("strict-") :]
    per_call = "1 message per call" if batch == 1 else f"{batch} messages per call"
    w(
        f"--- mode {mode}: N={n:,} per round, strict queue, {args.strict_groups:,} groups, {per_call} "
        f"(dequeue max {batch}, ack {batch} per call)"
    )
    hdr = (
        f"{'system':<18}"
        + "".join(f"{STRICT_LABELS[f]:>12}" for f in STRICT_FIGURES)
        + f"  {'client CPU':>10}{'server CPU':>11}{'box CPU':>9}{'rounds':>8}{'msgs/deq':>10}"
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
    w("baselines: not run in strict modes (Redis Streams and pgqueuer have no per-group, one-at-a-time delivery)")
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
