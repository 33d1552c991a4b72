"""The dashboards' server-side SVG charts: axis tops, value formats, gaps, escaping."""

from __future__ import annotations

from consoles.charts import Series, format_value, line_chart, nice_ceiling


def test_axis_tops_are_round_numbers_at_or_above_the_maximum():
    assert [nice_ceiling(v) for v in (0.7, 1.0, 1.3, 2.2, 3.0, 7.0, 0.012, 4500.0)] == [
        1.0,
        1.0,
        2.0,
        2.5,
        5.0,
        10.0,
        0.02,
        5000.0,
    ]
    assert nice_ceiling(0) == 1.0


def test_values_are_written_in_their_unit():
    assert format_value(0.0123, "s") == "12.3 ms"
    assert format_value(2.5, "s") == "2.5 s"
    assert format_value(0.25, "%") == "25.0 %"
    assert format_value(None, "s") == "-"


def test_a_chart_draws_each_run_of_known_values_and_escapes_labels():
    # 3 points, a gap, 2 points: two polylines, five dots with their values as tooltips
    points = [(0, 1.0), (60, 2.0), (120, 4.0), (180, None), (240, 3.0), (300, 1.0)]
    svg = str(line_chart("Wait <p50>", [Series("a&b", points)], unit="s"))
    assert svg.startswith('<svg class="chart"') and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 5
    assert "Wait &lt;p50&gt;" in svg and "a&amp;b" in svg and "<p50>" not in svg
    assert "a&amp;b 00:02:00: 4 s</title>" in svg  # the point at 120 s past the epoch


def test_an_empty_chart_says_so():
    svg = str(line_chart("Throughput", [Series("x", [])]))
    assert '<svg class="chart"' in svg and "no data yet" in svg and "<polyline" not in svg


# --- geometry: what a browser would draw where ----------------------------------------------
# Text boxes are estimated generously (0.62 em a character, 0.8 em above the baseline and
# 0.25 em below), so a layout that passes here leaves room for the widest sans-serif digits.
_SVG = "{http://www.w3.org/2000/svg}"
_EM_WIDTH, _ASCENT, _DESCENT = 0.62, 0.8, 0.25


def _text_box(el) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of an SVG ``<text>``, from its anchor, size and characters."""
    size = float(el.get("font-size"))
    width = len(el.text or "") * size * _EM_WIDTH
    x, y = float(el.get("x")), float(el.get("y"))
    left = {"start": x, "middle": x - width / 2, "end": x - width}[el.get("text-anchor", "start")]
    return left, y - size * _ASCENT, left + width, y + size * _DESCENT


def _rect_box(el) -> tuple[float, float, float, float]:
    x, y = float(el.get("x")), float(el.get("y"))
    return x, y, x + float(el.get("width")), y + float(el.get("height"))


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _latency_chart(**kwargs):
    import xml.etree.ElementTree as ET

    t0 = 1_795_000_000  # a day and more of buckets: the x labels carry the date
    points = [(t0 + 600 * i, 0.2 + i / 100) for i in range(200)]
    series = [Series(f"p{p}", [(x, y * p / 50) for x, y in points]) for p in (50, 95, 99)]
    svg = str(line_chart("End-to-end latency (enqueue to ack, from the archive)", series, unit="s", **kwargs))
    return ET.fromstring(svg)


def test_the_legend_stays_clear_of_the_title():
    # given the dashboards' longest title and three series
    root = _latency_chart()
    title = _text_box(root.find(f"{_SVG}text[@class='chart-title']"))
    legend = root.find(f".//{_SVG}g[@class='legend']")
    # then every swatch and label of the legend lies outside the title's box, inside the chart
    boxes = [_rect_box(r) for r in legend.iter(f"{_SVG}rect")] + [_text_box(t) for t in legend.iter(f"{_SVG}text")]
    assert len(boxes) == 6
    width, height = float(root.get("width")), float(root.get("height"))
    for box in boxes:
        assert not _overlap(box, title), (box, title)
        assert box[0] >= 0 and box[2] <= width and box[1] >= 0 and box[3] <= height, box


def test_every_x_label_lies_inside_the_chart():
    for width in (640, 420):
        # given a chart whose x labels are the widest the axis writes (month-day hour:minute)
        root = _latency_chart(width=width)
        labels = root.findall(f"{_SVG}text[@class='x-label']")
        assert len(labels) == 6 and labels[-1].text.count(":") == 1 and "-" in labels[-1].text
        # then the first and the last label's text are inside the drawing's width
        for label in (labels[0], labels[-1]):
            left, _, right, _ = _text_box(label)
            assert left >= 0 and right <= width, (label.text, left, right, width)
