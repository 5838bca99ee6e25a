"""The report's SVG charts: ticks, scales, geometry that follows the data, and drawings that read without colour."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from commtax.report import svg
from commtax.report.svg import (
    BREAKDOWN_STYLES,
    Axis,
    Bars,
    Gantt,
    Lines,
    Segment,
    Series,
    Span,
    StackedBars,
    Style,
)

NS = {"s": "http://www.w3.org/2000/svg"}


def parse(text: str) -> ET.Element:
    return ET.fromstring(text)


def test_nice_ticks_are_one_two_five_steps():
    assert svg.nice_ticks(0, 17.14) == [0, 5, 10, 15]  # span 17.14 / 5 = 3.4 -> step 5
    assert svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(0.03, 0.07) == [0.03, 0.04, 0.05, 0.06, 0.07]
    assert svg.nice_step(100) == 20
    assert svg.log_ticks(64, 1024, 2) == [64, 128, 256, 512, 1024]
    assert svg.log_ticks(1, 2**30, 2) == [2.0**p for p in range(0, 31, 4)]  # thinned to <= 8 labels


def test_axis_maps_linear_and_log():
    assert Axis(0, 20, 100, 300)(5) == 150
    assert Axis(1, 100, 0, 200, log=10)(10) == pytest.approx(100)
    assert Axis(64, 1024, 0, 400, log=2)(256) == pytest.approx(200)
    lo, hi = svg.axis_range([0.3, 17.1], 0)
    assert (lo, hi) == (0.0, 20.0)
    assert svg.axis_range([3e3, 2e6], 2) == (2.0**11, 2.0**21)


def test_number_formats():
    assert svg.fmt(17.142) == "17.1"
    assert svg.fmt(1234567.8) == "1,234,568"
    assert svg.fmt(0.00123) == "0.00123"
    assert svg.fmt(0) == "0"
    assert svg.fmt_bytes(2**20) == "1 MiB" and svg.fmt_bytes(3 * 2**10) == "3 KiB" and svg.fmt_bytes(8) == "8 B"


def stacked(values=((1.0, 3.0),), limit=None) -> StackedBars:
    segs = (Segment("a", "part a", Style("#111111", "solid")), Segment("b", "part b", Style("#222222", "diag")))
    return StackedBars(
        "t", tuple(f"row {i}" for i in range(len(values))), segs, values, "s", limit=limit, limit_label="cap"
    )


def widths(root: ET.Element) -> dict[str, float]:
    return {
        r.get("data-key"): float(r.get("width"))
        for r in root.iter("{http://www.w3.org/2000/svg}rect")
        if r.get("class") == "seg"
    }


def test_stacked_bar_segments_are_proportional_to_the_values():
    root = parse(svg.render(stacked(), "f"))
    w = widths(root)
    assert w["b"] == pytest.approx(3 * w["a"], abs=0.02)  # 1 s and 3 s, two-decimal coordinates
    # the axis runs to the nice ceiling of the total (4 -> 4, step 1): the bar spans the whole plot width
    assert w["a"] + w["b"] == pytest.approx(svg.WIDTH - 90 - svg._label_width(["row 0"]), abs=0.05)
    assert root.get("role") == "img" and root.find("s:title", NS).text == "t"


def test_stacked_limit_line_and_table():
    c = stacked(((10.0, 20.0),), limit=80.0)
    text = svg.render(c, "m")
    assert "cap 80.0 s" in text
    head, rows = c.table()
    assert head == ["", "part a", "part b", "total (s)"]
    assert rows == [["row 0", "10.0 (33.3%)", "20.0 (66.7%)", "30.0"], ["cap", "", "", "80.0"]]


def test_every_breakdown_part_differs_without_colour():
    patterns = [s.pattern for s in BREAKDOWN_STYLES.values()]
    assert len(set(patterns)) == len(patterns)  # a distinct fill pattern per part, so grey print separates them
    dashes = [(s.dash, s.marker) for s in svg.SERIES_STYLES]
    assert len(set(dashes)) == len(dashes)  # lines: a distinct dash and marker per series


def test_patterns_are_defined_once_per_chart_and_referenced():
    segs = tuple(Segment(k, k, st) for k, st in BREAKDOWN_STYLES.items())
    c = StackedBars("steps", ("x",), segs, (tuple(1.0 for _ in segs),), "s")
    text = svg.render(c, "fig1")
    ids = re.findall(r'<pattern id="([^"]+)"', text)
    assert len(ids) == len(set(ids)) == len(segs)
    for ref in set(re.findall(r"url\(#([^)]+)\)", text)):
        assert ref in ids
    assert all(i.startswith("fig1-") for i in ids)  # ids are unique per figure on one page


def test_bars_grow_both_ways_from_zero():
    c = Bars("changes", ("faster", "slower"), ("step",), ((-0.2,), (0.1,)), percent=True)
    root = parse(svg.render(c, "b"))
    rects = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "bar"]
    faster, slower = (float(r.get("x")) for r in rects)
    wf, ws = (float(r.get("width")) for r in rects)
    assert faster + wf == pytest.approx(slower, abs=0.02)  # both start at the zero line
    assert wf == pytest.approx(2 * ws, abs=0.02)
    assert c.table() == (["", "step (%)"], [["faster", "-20.0%"], ["slower", "+10.0%"]])


def test_lines_points_sit_on_their_values():
    c = Lines(
        "l",
        (Series("s", (64.0, 256.0, 1024.0), (0.1, 0.2, 0.4)),),
        "GPUs",
        "share",
        x_log=2,
        y_min=0.0,
        y_max=0.5,
        y_percent=True,
    )
    root = parse(svg.render(c, "l"))
    pts = [
        (float(e.get("cx")), float(e.get("cy")))
        for e in root.iter("{http://www.w3.org/2000/svg}circle")
        if e.get("fill") == c.style(0).color
    ]
    xs = [p[0] for p in pts[:3]]
    ys = [p[1] for p in pts[:3]]
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.02)  # 64 -> 256 -> 1024: equal steps on log2
    assert (ys[0] - ys[1]) == pytest.approx((ys[1] - ys[2]) / 2, abs=0.02)  # 0.1 -> 0.2 -> 0.4 on a linear axis
    assert c.table() == (["GPUs", "s"], [["64.0", "10.0%"], ["256", "20.0%"], ["1,024", "40.0%"]])


def test_lines_table_aligns_series_on_x():
    c = Lines("l", (Series("a", (1.0, 2.0), (5.0, 6.0)), Series("b", (2.0, 4.0), (7.0, 8.0))), "x", "y")
    head, rows = c.table()
    assert head == ["x", "a", "b"]
    assert rows == [["1.00", "5.00", "—"], ["2.00", "6.00", "7.00"], ["4.00", "—", "8.00"]]


def gantt(**kw) -> Gantt:
    kinds = (Segment("compute", "compute", Style("#4477aa")), Segment("tp", "tp", Style("#ee6677", "diag")))
    spans = (
        Span(0, 0.0, 1.0, "compute"),
        Span(0, 1.0, 1.0, "compute"),
        Span(0, 3.0, 1.0, "compute"),
        Span(1, 2.0, 1.0, "tp"),
    )
    return Gantt("g", ("s0 compute", "s0 tp"), spans, kinds, 4.0, idle_rows=(0,), **kw)


def test_merge_spans_joins_touching_spans_of_one_kind():
    merged = svg.merge_spans(gantt().spans, 1e-9)
    assert merged == [Span(0, 0.0, 2.0, "compute"), Span(0, 3.0, 1.0, "compute"), Span(1, 2.0, 1.0, "tp")]


def test_gantt_draws_every_span_and_tables_idle_time():
    g = gantt()
    root = parse(svg.render(g, "g"))
    paths = {
        p.get("data-kind"): p.get("d") for p in root.iter("{http://www.w3.org/2000/svg}path") if p.get("data-kind")
    }
    assert paths["compute"].count("M") == 3 and paths["tp"].count("M") == 1
    # data units: the whole step is GANTT_UNITS wide; the span at 3 s starts at 3/4 of it
    assert f"M{0.75 * svg.GANTT_UNITS:.1f} " in paths["compute"]
    _, rows = g.table()
    assert rows[0] == ["s0 compute", "3.000", "—", "1.000", "25.0%"]  # 3 s busy of 4: 1 s idle
    assert rows[1] == ["s0 tp", "—", "1.000", "—", "—"]
    assert root.get("data-gantt") == "1"


def test_gantt_window_shows_and_tables_only_that_part():
    g = gantt(window=(2.0, 4.0), zoomable=False)
    root = parse(svg.render(g, "w"))
    assert root.get("data-gantt") is None  # a static close-up: the page's zoom leaves it alone
    _, rows = g.table()
    assert rows[0][-2:] == ["1.000", "50.0%"]  # of the 2 s shown, 1 s computing
    bars = root.find(".//s:g[@class='gantt-bars']", NS).get("transform")
    scale, shift = re.search(r"scale\(([-\d.e]+),1\) translate\(([-\d.e]+),0\)", bars).groups()
    assert float(shift) == pytest.approx(-0.5 * svg.GANTT_UNITS)
    assert float(scale) * 0.5 * svg.GANTT_UNITS == pytest.approx(
        float(root.find(".//s:clipPath/s:rect", NS).get("width")), rel=1e-6
    )


def test_charts_are_standalone_svg_files():
    for chart in (
        stacked(),
        gantt(),
        Bars("b", ("r",), ("x",), ((1.0,),)),
        Lines("l", (Series("s", (1.0, 2.0), (1.0, 4.0)),), "x", "y", y_log=10),
    ):
        root = parse(svg.standalone(svg.render(chart, "x")).split("\n", 1)[1])
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        w, h = (float(v) for v in root.get("viewBox").split()[2:])
        assert w == svg.WIDTH and 60 < h < 2000 and math.isfinite(h)
        assert "url(http" not in svg.render(chart, "x")


def test_long_row_labels_are_clipped_but_kept_in_tooltips_and_tables():
    label = "best plan from search (tp=2, pp=8, vp=10, zero=2, recompute=none)"
    c = Bars("a", (label,), ("step",), ((-0.24,),), percent=True)
    text = svg.render(c, "a")
    assert svg.clip_label(label) + "</text>" in text and svg.clip_label(label).endswith("…")
    assert label in text  # the tooltip
    assert c.table()[1][0][0] == label


def test_plans_whose_labels_collide_are_told_apart_by_the_field_that_differs():
    from commtax.decide.plans import PlanRow
    from commtax.report.html import distinct_labels

    base = {"tp": 2, "pp": 8, "dp": 16, "vp": 10, "micro_batch": 1, "zero": 1, "sequence_parallel": True}
    plans = [{**base, "recompute": "selective"}, {**base, "tp": 4, "recompute": "none"}, {**base, "recompute": "full"}]
    plans = [PlanRow.from_dict(p) for p in plans]
    assert distinct_labels(plans) == [
        "tp2 pp8 dp16 vp10 mb1 z1 recompute=selective",
        "tp4 pp8 dp16 vp10 mb1 z1",
        "tp2 pp8 dp16 vp10 mb1 z1 recompute=full",
    ]


def test_the_timeline_table_appears_once(tmp_path):
    """The close-ups (fill, drain) draw windows of the same spans: only the whole-step figure has the table."""
    from pathlib import Path

    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    job = Path(__file__).resolve().parents[1] / "examples" / "sim" / "llama2-7b-interleaved.yaml"
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", str(job), "--no-search", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert 'id="fig-timeline-start"' in page and 'id="fig-timeline-end"' in page
    assert page.count("whole-step timeline's table above") == 2
    fig = lambda k: page.split(f'id="fig-{k}"', 1)[1].split("</figure>", 1)[0]
    assert fig("timeline").count("<tr>") > 20  # the spans' table, once
    assert fig("timeline-start").count("<tr>") == fig("timeline-end").count("<tr>") == 2  # header and the window
