"""The run's picture: faults as coloured bands on a timeline; beneath, throughput, p99 latency and
errors per second, all on one time axis (Jepsen's reports draw the same).

Drawn with matplotlib's Agg canvas through ``Figure`` itself, never ``pyplot``: no display, no
global state, safe from any thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from matplotlib.patches import Patch

if TYPE_CHECKING:  # the report computes the series and imports this module to draw them
    from nemesis.report import Series

#: one colour per fault kind, in the order kinds first appear (matplotlib's qualitative tab10)
COLOURS = [f"tab:{c}" for c in ("red", "orange", "purple", "brown", "pink", "olive", "cyan", "blue", "green", "gray")]


def draw(series: Series, faults: list[tuple[float, float, str]], path: str | Path, title: str = "") -> None:
    """Draw ``series`` under the fault windows ``(start_s, stop_s, kind)`` into a PNG at ``path``."""
    figure = Figure(figsize=(12, 8), layout="constrained")
    timeline, throughput, latency, errors = figure.subplots(
        4, 1, sharex=True, gridspec_kw={"height_ratios": [1, 3, 3, 2]}
    )
    kinds = list(dict.fromkeys(kind for _, _, kind in faults))
    colour = {kind: COLOURS[i % len(COLOURS)] for i, kind in enumerate(kinds)}

    for start, stop, kind in faults:
        row = kinds.index(kind)
        timeline.broken_barh([(start, max(stop - start, 0.01))], (row, 0.8), color=colour[kind])
        for axes in (throughput, latency, errors):
            axes.axvspan(start, stop, color=colour[kind], alpha=0.15, linewidth=0)
    timeline.set_yticks([row + 0.4 for row in range(len(kinds))], kinds)
    timeline.set_ylim(0, max(len(kinds), 1))
    timeline.set_title(title)
    if kinds:
        timeline.legend(
            handles=[Patch(color=colour[k], label=k) for k in kinds],
            loc="upper right",
            ncols=len(kinds),
            fontsize="small",
        )

    throughput.plot(series.seconds, series.throughput, color="tab:blue", drawstyle="steps-post")
    throughput.set_ylabel("ok / s")
    latency.plot(
        series.seconds,
        [float("nan") if p is None else p for p in series.p99_ms],
        color="tab:green",
        drawstyle="steps-post",
    )
    latency.set_ylabel("p99 latency (ms)")
    errors.plot(series.seconds, series.errors, color="tab:red", drawstyle="steps-post")
    errors.set_ylabel("fail + unknown / s")
    errors.set_xlabel("seconds from the start of the run")
    for axes in (throughput, latency, errors):
        axes.grid(True, alpha=0.3)
        axes.set_ylim(bottom=0)
    figure.savefig(path, format="png", dpi=100)
