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
