"""Line charts drawn on the server as inline SVG.

The machines the admin runs on have no internet, so no charting library from a CDN: the page
gets finished ``<svg class="chart">`` elements, which every browser draws and which need no
JavaScript. Each point carries a ``<title>``, so hovering shows its exact value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#2f6fb0", "#d9822b", "#3a9a5b", "#c23b3b", "#7b5ea7", "#8c6d31")
#: margins around the plot; the right one grows to half the last x label (centred on the edge)
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 48, 34
#: baselines of the title row and, under it, the legend row (never beside the title: a long
#: title would run under it)
TITLE_Y, LEGEND_Y = 18, 36
#: a generous width of one character, in em, for laying out text the server cannot measure
EM_WIDTH = 0.62
#: above this many points a series is drawn as lines without a dot (and tooltip) per point
MAX_DOTS = 360


@dataclass
class Series:
    label: str
    #: (x, y) pairs; x is epoch seconds (or any number), y None leaves a gap
    points: list[tuple[float, float | None]]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= ``value`` (axis tops people can read)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power: float = 10 ** math.floor(math.log10(value))  # an int for k >= 0, as before
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def format_value(value: float | None, unit: str = "") -> str:
    """Compact, unit-aware: ``0.0123 s`` -> ``12.3 ms``, rates as percentages."""
    if value is None:
        return "-"
    if unit == "%":
        return f"{value * 100:.1f} %"
    if unit == "s":
        if value and abs(value) < 1:
            return f"{value * 1000:.3g} ms"
        return f"{value:.3g} s"
    text = f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def text_width(text: str, font_size: float) -> float:
    """A generous estimate of ``text``'s drawn width (the server has no font to measure with)."""
    return len(text) * font_size * EM_WIDTH


def _time_label(x: float, span: float) -> str:
    dt = datetime.fromtimestamp(x, tz=UTC)
    return dt.strftime("%m-%d %H:%M" if span > 86400 else "%H:%M" if span > 600 else "%H:%M:%S")


def line_chart(
    title: str, series: list[Series], *, unit: str = "", width: int = 640, height: int = 236, time_axis: bool = True
) -> SafeString:
    """One chart: a y axis from 0 to a round top, x from the first to the last point; the
    title on the first row, the legend on the row under it."""
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM
    out = [
        (
            f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        ),
        f'<text class="chart-title" x="{LEFT}" y="{TITLE_Y}" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    xs = [x for s in series for x, y in s.points if y is not None]
    ys = [y for s in series for x, y in s.points if y is not None]
    if not xs:
        out.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" '
            f'fill="#888" font-size="12">no data yet</text></svg>'
        )
        return mark_safe("".join(out))  # noqa: S308 - every text in the SVG is escaped as it is written
    x0, x1 = min(xs), max(xs)
    if x1 == x0:  # one point (e.g. a single run): centre it in ten minutes
        x0, x1 = x0 - 300, x1 + 300
    ticks = 5
    x_labels = [
        (x, _time_label(x, x1 - x0) if time_axis else f"{x:.3g}")
        for x in (x0 + (x1 - x0) * k / ticks for k in range(ticks + 1))
    ]
    # the last label is centred on the plot's right edge: leave half of it to the right
    plot_w = width - LEFT - max(RIGHT, math.ceil(text_width(x_labels[-1][1], 10) / 2) + 2)
    top = nice_ceiling(max(ys)) if unit != "%" or max(ys) > 0 else 1.0
    if unit == "%":
        top = min(1.0, nice_ceiling(max(ys))) if max(ys) > 0 else 1.0

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - (y / top) * plot_h

    # grid and y labels
    for k in range(5):
        y = top * k / 4
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
            f'stroke="#e3e3e3" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end" font-size="10" '
            f'fill="#555">{escape(format_value(y, unit))}</text>'
        )
    # x labels
    for x, label in x_labels:
        out.append(
            f'<text class="x-label" x="{px(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" font-size="10" '
            f'fill="#555">{escape(label)}</text>'
        )
    out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" stroke="#999"/>')
    # series: a polyline per run of known values, a dot with a tooltip per point
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        runs: list[list[tuple[float, float]]] = [[]]
        for x, known_y in sorted(s.points, key=lambda p: p[0]):
            if known_y is None:
                runs.append([])
            else:
                runs[-1].append((x, known_y))
        out.append(f'<g class="series" data-label="{escape(s.label)}">')
        for run in runs:
            if len(run) > 1:
                coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in run)
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{coords}"/>')
        known = [p for run in runs for p in run]
        if len(known) > MAX_DOTS:  # a dot per point would weigh more than the page: lines only
            known = [p for run in runs if len(run) == 1 for p in run]
        radius = 2.5 if len(known) <= 120 else 1.5
        for x, y in known:
            when = _time_label(x, 1) if time_axis else f"{x:g}"
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{radius}" fill="{color}">'
                f"<title>{escape(s.label)} {escape(when)}: {escape(format_value(y, unit))}</title></circle>"
            )
        out.append("</g>")
    # legend, in its own row under the title, left-aligned with it
    out.append('<g class="legend">')
    lx = LEFT
    for i, s in enumerate(series):
        out.append(
            f'<rect x="{lx}" y="{LEGEND_Y - 9}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{lx + 14}" y="{LEGEND_Y}" font-size="11">{escape(s.label)}</text>'
        )
        lx += 14 + math.ceil(text_width(s.label, 11)) + 16
    out.append("</g></svg>")
    return mark_safe("".join(out))  # noqa: S308 - every text in the SVG is escaped as it is written
