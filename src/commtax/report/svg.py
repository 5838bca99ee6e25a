"""Charts as inline SVG, drawn here in Python: no browser library, no network, no matplotlib.

A chart is a small frozen description (``StackedBars``, ``Bars``, ``Lines``, ``Gantt``) that knows
its own table view (``table()``); ``render(chart, fig_id)`` turns it into one ``<svg>`` string that
stands alone (colours, patterns and fonts as presentation attributes, so the same text is a valid
``.svg`` file) and reads without colour: every series also has a fill pattern or a dash and a
marker, and bars carry their value as text where they are wide enough. ``report.png`` draws the
same descriptions with matplotlib for slides.

Tick placement follows the usual "nice numbers" rule (1, 2, 5 × 10^k; Heckbert, "Nice numbers for
graph labels", Graphics Gems, 1990).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
INK = "#222222"
GRID = "#d0d0d0"
WIDTH = 760  # viewBox width of every chart; the page scales it to the window


@dataclass(frozen=True)
class Style:
    """How one series looks: a fill colour plus a pattern (bars) or a dash and a marker (lines)."""

    color: str
    pattern: str = "solid"  # solid | diag | back | cross | dots | hlines | vlines | grid
    dash: str = ""  # SVG stroke-dasharray for lines
    marker: str = "circle"  # circle | square | triangle | diamond | none


# Paul Tol's colour-blind-safe "bright" and "muted" schemes; a pattern each, so grey print still separates them
BREAKDOWN_STYLES: dict[str, Style] = {
    "compute": Style("#4477aa", "solid"),
    "recompute": Style("#66ccee", "dots"),
    "tp_exposed": Style("#ee6677", "diag"),
    "cp_exposed": Style("#aa3377", "back"),
    "pp_bubble": Style("#bbbbbb", "cross"),
    "pp_exposed": Style("#ccbb44", "hlines"),
    "dp_exposed": Style("#228833", "vlines"),
    "optimizer": Style("#332288", "grid"),
}
SERIES_STYLES: tuple[Style, ...] = (
    Style("#4477aa", "solid", "", "circle"),
    Style("#ee6677", "diag", "6 3", "square"),
    Style("#228833", "dots", "2 3", "triangle"),
    Style("#ccbb44", "cross", "8 3 2 3", "diamond"),
    Style("#66ccee", "hlines", "4 4", "circle"),
    Style("#aa3377", "vlines", "1 2", "square"),
    Style("#bbbbbb", "grid", "10 4", "triangle"),
)


def series_style(i: int) -> Style:
    return SERIES_STYLES[i % len(SERIES_STYLES)]


# ----------------------------------------------------------------------------- chart descriptions
@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    style: Style


@dataclass(frozen=True)
class StackedBars:
    """Horizontal bars, one per row, each split into segments (e.g. the parts of a step)."""

    title: str
    rows: tuple[str, ...]
    segments: tuple[Segment, ...]
    values: tuple[tuple[float, ...], ...]  # values[row][segment]
    unit: str = "s"
    digits: int = 3
    limit: float | None = None  # a vertical reference line (e.g. GPU memory)
    limit_label: str = ""

    def total(self, r: int) -> float:
        return sum(self.values[r])

    def table(self) -> tuple[list[str], list[list[str]]]:
        head = [""] + [s.label for s in self.segments] + [f"total ({self.unit})"]
        rows = []
        for r, name in enumerate(self.rows):
            tot = self.total(r)
            cells = [
                f"{fmt(v, self.digits)} ({100 * v / tot:.1f}%)" if tot else fmt(v, self.digits) for v in self.values[r]
            ]
            rows.append([name] + cells + [fmt(tot, self.digits)])
        if self.limit is not None:
            rows.append([self.limit_label or "limit"] + [""] * len(self.segments) + [fmt(self.limit, self.digits)])
        return head, rows


@dataclass(frozen=True)
class Bars:
    """Horizontal grouped bars: one group per row, one bar per series (negative values grow left)."""

    title: str
    rows: tuple[str, ...]
    series: tuple[str, ...]
    values: tuple[tuple[float, ...], ...]  # values[row][series]
    unit: str = ""
    digits: int = 3
    styles: tuple[Style, ...] = ()
    percent: bool = False  # values are fractions, shown as %

    def style(self, i: int) -> Style:
        return self.styles[i] if i < len(self.styles) else series_style(i)

    def text(self, v: float) -> str:
        return f"{100 * v:+.1f}%" if self.percent else fmt(v, self.digits)

    def table(self) -> tuple[list[str], list[list[str]]]:
        unit = " (%)" if self.percent else (f" ({self.unit})" if self.unit else "")
        head = [""] + [f"{s}{unit}" for s in self.series]
        return head, [[name] + [self.text(v) for v in self.values[r]] for r, name in enumerate(self.rows)]


@dataclass(frozen=True)
class Series:
    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    style: Style | None = None
    points_only: bool = False  # measurements: markers, no line


@dataclass(frozen=True)
class Lines:
    """Line chart with axes and ticks; log axes take a base (2 or 10)."""

    title: str
    series: tuple[Series, ...]
    x_label: str
    y_label: str
    x_log: int = 0
    y_log: int = 0
    y_min: float | None = None
    y_max: float | None = None
    x_fmt: str = "g"  # "bytes" for message sizes
    y_percent: bool = False
    digits: int = 3

    def style(self, i: int) -> Style:
        return self.series[i].style or series_style(i)

    def xtext(self, x: float) -> str:
        return fmt_bytes(x) if self.x_fmt == "bytes" else fmt(x, self.digits)

    def ytext(self, y: float) -> str:
        return f"{100 * y:.1f}%" if self.y_percent else fmt(y, self.digits)

    def table(self) -> tuple[list[str], list[list[str]]]:
        xs = sorted({x for s in self.series for x in s.xs})
        head = [self.x_label] + [s.label for s in self.series]
        lookup = [dict(zip(s.xs, s.ys)) for s in self.series]
        return head, [[self.xtext(x)] + [self.ytext(d[x]) if x in d else "—" for d in lookup] for x in xs]


@dataclass(frozen=True)
class Span:
    row: int
    start_s: float
    dur_s: float
    kind: str


@dataclass(frozen=True)
class Gantt:
    """A timeline: one row per (stage, stream), spans coloured by kind; rows in ``idle_rows`` show their
    gaps hatched (a compute stream with nothing to do: the pipeline bubble or a wait on communication)."""

    title: str
    rows: tuple[str, ...]
    spans: tuple[Span, ...]
    kinds: tuple[Segment, ...]
    total_s: float
    idle_rows: tuple[int, ...] = ()
    window: tuple[float, float] | None = None  # draw only [t0, t1] s of the step (a static close-up)
    zoomable: bool = True  # the page's script may rescale it
    row_groups: tuple[int, ...] = ()  # a group per row (e.g. its pipeline stage): odd groups get a shaded band

    @property
    def shown(self) -> tuple[float, float]:
        return self.window or (0.0, self.total_s)

    def busy(self) -> list[dict[str, float]]:
        """Seconds of each kind per row inside the shown window."""
        t0, t1 = self.shown
        out: list[dict[str, float]] = [{} for _ in self.rows]
        for s in self.spans:
            d = min(t1, s.start_s + s.dur_s) - max(t0, s.start_s)
            if d > 0 or (s.dur_s == 0 and t0 <= s.start_s <= t1):
                out[s.row][s.kind] = out[s.row].get(s.kind, 0.0) + max(d, 0.0)
        return out

    def table(self) -> tuple[list[str], list[list[str]]]:
        kinds = [k for k in self.kinds if any(s.kind == k.key for s in self.spans)]
        head = ["row"] + [k.label + " (s)" for k in kinds] + ["idle (s)", "idle share"]
        rows = []
        for r, busy in enumerate(self.busy()):
            cells = [fmt(busy[k.key], 4) if k.key in busy else "—" for k in kinds]
            if r in self.idle_rows:
                length = self.shown[1] - self.shown[0]
                idle = max(0.0, length - sum(busy.values()))
                cells += [fmt(idle, 4), f"{100 * idle / length:.1f}%" if length > 0 else "—"]
            else:
                cells += ["—", "—"]
            rows.append([self.rows[r]] + cells)
        return head, rows


Chart = StackedBars | Bars | Lines | Gantt


# ----------------------------------------------------------------------------- numbers and ticks
def fmt(x: float, digits: int = 3) -> str:
    """``digits`` significant figures, thousands separated, no exponent for everyday magnitudes."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    mag = math.floor(math.log10(abs(x)))
    if mag >= 15 or mag < -4:
        return f"{x:.{max(0, digits - 1)}e}"
    decimals = max(0, digits - 1 - mag)
    return f"{x:,.{decimals}f}"


def fmt_bytes(n: float) -> str:
    """Binary prefixes, as bench sizes are powers of two: 1 MiB, 256 KiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def nice_step(span: float, target: int = 5) -> float:
    """The 1-2-5 × 10^k step that cuts ``span`` into about ``target`` intervals (Heckbert 1990)."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    k = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * k * 1.0000001:
            return m * k
    return 10 * k


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Multiples of a nice step inside [lo, hi]."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step - 1e-9)
    out = []
    i = first
    while i * step <= hi + step * 1e-9:
        out.append(round(i * step, 12))
        i += 1
    return out


def log_ticks(lo: float, hi: float, base: int) -> list[float]:
    """Powers of ``base`` inside [lo, hi], thinned to at most ~8 labels."""
    a, b = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    powers = list(range(a, b + 1))
    stride = max(1, math.ceil(len(powers) / 8))
    return [float(base**p) for p in powers[::stride] if lo * (1 - 1e-9) <= base**p <= hi * (1 + 1e-9)]


@dataclass(frozen=True)
class Axis:
    """Maps data [lo, hi] onto pixels [a, b], linearly or logarithmically."""

    lo: float
    hi: float
    a: float
    b: float
    log: int = 0

    def __call__(self, v: float) -> float:
        if self.log:
            lo, hi, v = math.log(self.lo), math.log(self.hi), math.log(max(v, self.lo * 1e-12))
        else:
            lo, hi = self.lo, self.hi
        if hi == lo:
            return (self.a + self.b) / 2
        return self.a + (v - lo) / (hi - lo) * (self.b - self.a)

    def ticks(self) -> list[float]:
        return log_ticks(self.lo, self.hi, self.log) if self.log else nice_ticks(self.lo, self.hi)


def axis_range(
    values: Sequence[float], log: int, lo: float | None = None, hi: float | None = None
) -> tuple[float, float]:
    vals = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not vals:
        return (1.0, 10.0) if log else (0.0, 1.0)
    vmin, vmax = min(vals), max(vals)
    if log:
        a = math.floor(math.log(vmin, log) + 1e-9)
        b = math.ceil(math.log(vmax, log) - 1e-9)
        return float(log**a), float(log ** max(b, a + 1))
    vmin = min(vmin, 0.0) if lo is None else lo
    if hi is None:
        step = nice_step(vmax - vmin or abs(vmax) or 1.0)
        vmax = math.ceil(vmax / step - 1e-9) * step if vmax > 0 else vmax
    else:
        vmax = hi
    return vmin, (vmax if vmax > vmin else vmin + 1.0)


# ----------------------------------------------------------------------------- SVG pieces
def _n(x: float) -> str:
    """A coordinate: two decimals, no trailing zeros."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return s if s != "-0" else "0"


def text(
    x: float,
    y: float,
    s: str,
    anchor: str = "start",
    size: int = 12,
    weight: str = "normal",
    cls: str = "",
    fill: str = INK,
) -> str:
    c = f' class="{cls}"' if cls else ""
    w = f' font-weight="{weight}"' if weight != "normal" else ""
    return (
        f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}" font-size="{size}" fill="{fill}"{w}{c}>'
        f"{escape(s)}</text>"
    )


PATTERN_PATHS = {
    "diag": "M-1,1 l2,-2 M0,8 l8,-8 M7,9 l2,-2",
    "back": "M-1,7 l2,2 M0,0 l8,8 M7,-1 l2,2",
    "cross": "M0,8 l8,-8 M0,0 l8,8",
    "hlines": "M0,2 h8 M0,6 h8",
    "vlines": "M2,0 v8 M6,0 v8",
    "grid": "M0,4 h8 M4,0 v8",
}


def pattern_id(fig_id: str, key: str) -> str:
    return f"{fig_id}-p-{key}"


def patterns(fig_id: str, items: Sequence[tuple[str, Style]]) -> str:
    """<defs> with one pattern per (key, style): the colour as background, the pattern drawn over it in ink."""
    out = []
    for key, st in items:
        pid = pattern_id(fig_id, key)
        body = f'<rect width="8" height="8" fill="{st.color}"/>'
        if st.pattern == "dots":
            body += (
                f'<circle cx="2" cy="2" r="1.1" fill="{INK}" fill-opacity="0.55"/>'
                f'<circle cx="6" cy="6" r="1.1" fill="{INK}" fill-opacity="0.55"/>'
            )
        elif st.pattern in PATTERN_PATHS:
            body += f'<path d="{PATTERN_PATHS[st.pattern]}" stroke="{INK}" stroke-opacity="0.55" stroke-width="1"/>'
        out.append(f'<pattern id="{pid}" width="8" height="8" patternUnits="userSpaceOnUse">{body}</pattern>')
    return "<defs>" + "".join(out) + "</defs>"


def fill_of(fig_id: str, key: str, st: Style) -> str:
    return st.color if st.pattern == "solid" else f"url(#{pattern_id(fig_id, key)})"


def marker(shape: str, x: float, y: float, color: str, r: float = 3.5) -> str:
    if shape == "none":
        return ""
    if shape == "square":
        return f'<rect x="{_n(x - r)}" y="{_n(y - r)}" width="{_n(2 * r)}" height="{_n(2 * r)}" fill="{color}"/>'
    if shape == "triangle":
        return (
            f'<path d="M{_n(x)},{_n(y - r * 1.2)} L{_n(x + r * 1.1)},{_n(y + r * 0.8)} '
            f'L{_n(x - r * 1.1)},{_n(y + r * 0.8)} Z" fill="{color}"/>'
        )
    if shape == "diamond":
        return (
            f'<path d="M{_n(x)},{_n(y - r * 1.3)} L{_n(x + r)},{_n(y)} L{_n(x)},{_n(y + r * 1.3)} '
            f'L{_n(x - r)},{_n(y)} Z" fill="{color}"/>'
        )
    return f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{_n(r)}" fill="{color}"/>'


def _open(fig_id: str, title: str, desc: str, width: float, height: float, kind: str, extra: str = "") -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{fig_id}" class="chart chart-{kind}" role="img" '
        f'viewBox="0 0 {_n(width)} {_n(height)}" width="{_n(width)}" height="{_n(height)}" '
        f'font-family="{escape(FONT, quote=True)}" aria-labelledby="{fig_id}-t {fig_id}-d"{extra}>'
        f'<title id="{fig_id}-t">{escape(title)}</title><desc id="{fig_id}-d">{escape(desc)}</desc>'
        f'<rect width="100%" height="100%" fill="#ffffff"/>'
    )


def _legend(
    fig_id: str, items: Sequence[tuple[str, str, Style]], x0: float, y0: float, width: float, line: bool = False
) -> tuple[str, float]:
    """Swatches (or line samples) with labels, wrapped to ``width``; returns (svg, height used)."""
    out, x, y = [], x0, y0
    for key, label, st in items:
        w = 22 + 6.6 * len(label) + 14
        if x + w > x0 + width and x > x0:
            x, y = x0, y + 18
        if line:
            out.append(
                f'<line x1="{_n(x)}" y1="{_n(y + 6)}" x2="{_n(x + 18)}" y2="{_n(y + 6)}" stroke="{st.color}" '
                f'stroke-width="2"{_dash(st)}/>' + marker(st.marker, x + 9, y + 6, st.color)
            )
        else:
            out.append(
                f'<rect x="{_n(x)}" y="{_n(y)}" width="16" height="12" fill="{fill_of(fig_id, key, st)}" '
                f'stroke="{INK}" stroke-width="0.6"/>'
            )
        out.append(text(x + 22, y + 10.5, label, size=11))
        x += w
    return "".join(out), (y - y0) + 18


def _dash(st: Style) -> str:
    return f' stroke-dasharray="{st.dash}"' if st.dash else ""


LABEL_MAX_W = 230.0


def _label_width(labels: Sequence[str], size: int = 12) -> float:
    return min(LABEL_MAX_W, 16 + 0.62 * size * max((len(s) for s in labels), default=4))


def clip_label(s: str, size: int = 12) -> str:
    """A row label that fits the label column (the full text stays in the tooltip and the table)."""
    n = int((LABEL_MAX_W - 16) / (0.62 * size))
    return s if len(s) <= n else s[: n - 1].rstrip() + "…"


# ----------------------------------------------------------------------------- renderers
def render(chart: Chart, fig_id: str) -> str:
    if isinstance(chart, StackedBars):
        return render_stacked(chart, fig_id)
    if isinstance(chart, Bars):
        return render_bars(chart, fig_id)
    if isinstance(chart, Lines):
        return render_lines(chart, fig_id)
    if isinstance(chart, Gantt):
        return render_gantt(chart, fig_id)
    raise TypeError(f"not a chart: {type(chart).__name__}")


def _x_axis(ax: Axis, y: float, label: str, tick_text, top: float) -> str:
    out = [f'<line x1="{_n(ax.a)}" y1="{_n(y)}" x2="{_n(ax.b)}" y2="{_n(y)}" stroke="{INK}"/>']
    for t in ax.ticks():
        x = ax(t)
        out.append(f'<line x1="{_n(x)}" y1="{_n(top)}" x2="{_n(x)}" y2="{_n(y)}" stroke="{GRID}" stroke-width="0.8"/>')
        out.append(f'<line x1="{_n(x)}" y1="{_n(y)}" x2="{_n(x)}" y2="{_n(y + 4)}" stroke="{INK}"/>')
        out.append(text(x, y + 16, tick_text(t), "middle", 11))
    out.append(text((ax.a + ax.b) / 2, y + 32, label, "middle", 12))
    return "".join(out)


def render_stacked(c: StackedBars, fig_id: str) -> str:
    left = _label_width(c.rows)
    right = 90.0
    bar_h, gap, top = 26.0, 12.0, 34.0
    totals = [c.total(r) for r in range(len(c.rows))]
    hi = max(totals + ([c.limit] if c.limit is not None else []) + [0.0])
    lo, hi = axis_range([0.0, hi], 0)
    ax = Axis(lo, hi, left, WIDTH - right)
    plot_bottom = top + len(c.rows) * (bar_h + gap)
    legend, lh = _legend(
        fig_id, [(s.key, s.label, s.style) for s in c.segments], left, plot_bottom + 44, WIDTH - left - 10
    )
    height = plot_bottom + 44 + lh + 6
    desc = "; ".join(
        f"{row}: " + ", ".join(f"{s.label} {fmt(v, c.digits)} {c.unit}" for s, v in zip(c.segments, vals) if v)
        for row, vals in zip(c.rows, c.values)
    )
    out = [
        _open(fig_id, c.title, desc, WIDTH, height, "stacked"),
        patterns(fig_id, [(s.key, s.style) for s in c.segments]),
        text(left, 20, c.title, size=14, weight="bold"),
        _x_axis(ax, plot_bottom, c.unit, lambda t: fmt(t, 3), top - 6),
    ]
    for r, row in enumerate(c.rows):
        y = top + r * (bar_h + gap)
        out.append(text(left - 8, y + bar_h / 2 + 4, clip_label(row), "end"))
        x = ax.a
        for s, v in zip(c.segments, c.values[r]):
            w = ax(v) - ax(0)
            if w <= 0:
                continue
            out.append(
                f'<rect class="seg" data-key="{escape(s.key)}" x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" '
                f'height="{_n(bar_h)}" fill="{fill_of(fig_id, s.key, s.style)}" stroke="#ffffff" '
                f'stroke-width="0.8"><title>{escape(f"{row}: {s.label} {fmt(v, c.digits)} {c.unit}")}'
                "</title></rect>"
            )
            if w > 34 and totals[r] and v / totals[r] >= 0.04:
                out.append(
                    f'<rect x="{_n(x + w / 2 - 18)}" y="{_n(y + bar_h / 2 - 8)}" width="36" height="15" rx="3" '
                    f'fill="#ffffff" fill-opacity="0.85"/>'
                )
                out.append(text(x + w / 2, y + bar_h / 2 + 4, f"{100 * v / totals[r]:.0f}%", "middle", 11))
            x += w
        out.append(text(ax(totals[r]) + 6, y + bar_h / 2 + 4, f"{fmt(totals[r], c.digits)} {c.unit}", size=11))
    if c.limit is not None:
        x = ax(c.limit)
        out.append(
            f'<line x1="{_n(x)}" y1="{_n(top - 8)}" x2="{_n(x)}" y2="{_n(plot_bottom)}" stroke="{INK}" '
            f'stroke-width="2" stroke-dasharray="5 3"/>'
        )
        out.append(
            text(x, top - 12 + 0, f"{c.limit_label} {fmt(c.limit, c.digits)} {c.unit}", "middle", 11, weight="bold")
        )
    out.append(legend)
    out.append("</svg>")
    return "".join(out)


def render_bars(c: Bars, fig_id: str) -> str:
    left = _label_width(c.rows)
    right = 70.0
    ns = max(1, len(c.series))
    bar_h, gap, top = 16.0, 12.0, 34.0
    group_h = ns * bar_h + gap
    vals = [v for row in c.values for v in row]
    lo, hi = axis_range(vals + [0.0], 0, lo=min(vals + [0.0]))
    if lo < 0:  # symmetric room for text on both sides
        step = nice_step(hi - lo)
        lo = math.floor(lo / step) * step
    ax = Axis(lo, hi, left + (40 if lo < 0 else 0), WIDTH - right)
    plot_bottom = top + len(c.rows) * group_h
    legend, lh = _legend(
        fig_id, [(f"s{i}", s, c.style(i)) for i, s in enumerate(c.series)], left, plot_bottom + 44, WIDTH - left - 10
    )
    height = plot_bottom + 44 + (lh if ns > 1 else 0) + 6
    desc = "; ".join(
        f"{row}: " + ", ".join(f"{s} {c.text(v)}" for s, v in zip(c.series, vals_))
        for row, vals_ in zip(c.rows, c.values)
    )
    tick = (lambda t: f"{100 * t:.0f}%") if c.percent else (lambda t: fmt(t, 3))
    unit = "" if c.percent else c.unit
    out = [
        _open(fig_id, c.title, desc, WIDTH, height, "bars"),
        patterns(fig_id, [(f"s{i}", c.style(i)) for i in range(ns)]),
        text(left, 20, c.title, size=14, weight="bold"),
        _x_axis(ax, plot_bottom, unit, tick, top - 6),
    ]
    x0 = ax(0.0)
    out.append(f'<line x1="{_n(x0)}" y1="{_n(top - 6)}" x2="{_n(x0)}" y2="{_n(plot_bottom)}" stroke="{INK}"/>')
    for r, row in enumerate(c.rows):
        y = top + r * group_h
        out.append(text(left - 8, y + ns * bar_h / 2 + 4, clip_label(row), "end"))
        for i, v in enumerate(c.values[r]):
            st = c.style(i)
            xa, xb = sorted((x0, ax(v)))
            yy = y + i * bar_h
            label = f"{row}: {c.series[i]} {c.text(v)}"
            out.append(
                f'<rect class="bar" x="{_n(xa)}" y="{_n(yy + 1)}" width="{_n(max(xb - xa, 0.5))}" '
                f'height="{_n(bar_h - 2)}" fill="{fill_of(fig_id, f"s{i}", st)}" stroke="{INK}" '
                f'stroke-width="0.5"><title>{escape(label)}</title></rect>'
            )
            tx, anchor = (xb + 4, "start") if v >= 0 else (xa - 4, "end")
            out.append(text(tx, yy + bar_h / 2 + 4, c.text(v), anchor, 10))
    if ns > 1:
        out.append(legend)
    out.append("</svg>")
    return "".join(out)


def render_lines(c: Lines, fig_id: str) -> str:
    left, right, top = 70.0, 20.0, 34.0
    plot_h = 260.0
    xs = [x for s in c.series for x in s.xs]
    ys = [y for s in c.series for y in s.ys]
    xlo, xhi = axis_range(xs, c.x_log)
    if not c.x_log and xs:
        xlo, xhi = min(xs), max(xs)
        if xhi == xlo:
            xlo, xhi = xlo - 1, xhi + 1
    ylo, yhi = axis_range(ys, c.y_log, c.y_min, c.y_max)
    ax = Axis(xlo, xhi, left, WIDTH - right, c.x_log)
    ay = Axis(ylo, yhi, top + plot_h, top, c.y_log)
    bottom = top + plot_h
    legend, lh = _legend(
        fig_id,
        [(f"s{i}", s.label, c.style(i)) for i, s in enumerate(c.series)],
        left,
        bottom + 44,
        WIDTH - left - 10,
        line=True,
    )
    height = bottom + 44 + lh + 6
    desc = "; ".join(
        f"{s.label}: " + ", ".join(f"({c.xtext(x)}, {c.ytext(y)})" for x, y in zip(s.xs, s.ys)) for s in c.series
    )
    ytick = (lambda t: f"{100 * t:.0f}%") if c.y_percent else (lambda t: fmt(t, 3))
    xtick = fmt_bytes if c.x_fmt == "bytes" else (lambda t: fmt(t, 3))
    out = [
        _open(fig_id, c.title, desc, WIDTH, height, "lines"),
        text(left, 20, c.title, size=14, weight="bold"),
        _x_axis(ax, bottom, c.x_label, xtick, top),
    ]
    out.append(f'<line x1="{_n(left)}" y1="{_n(top)}" x2="{_n(left)}" y2="{_n(bottom)}" stroke="{INK}"/>')
    for t in ay.ticks():
        y = ay(t)
        out.append(
            f'<line x1="{_n(left)}" y1="{_n(y)}" x2="{_n(ax.b)}" y2="{_n(y)}" stroke="{GRID}" stroke-width="0.8"/>'
        )
        out.append(text(left - 6, y + 4, ytick(t), "end", 11))
    out.append(
        f'<text x="14" y="{_n((top + bottom) / 2)}" transform="rotate(-90 14 {_n((top + bottom) / 2)})" '
        f'text-anchor="middle" font-size="12" fill="{INK}">{escape(c.y_label)}</text>'
    )
    for i, s in enumerate(c.series):
        st = c.style(i)
        pts = [(ax(x), ay(y)) for x, y in zip(s.xs, s.ys) if math.isfinite(y) and (y > 0 or not c.y_log)]
        if len(pts) > 1 and not s.points_only:
            d = " ".join(f"{'M' if k == 0 else 'L'}{_n(x)},{_n(y)}" for k, (x, y) in enumerate(pts))
            out.append(f'<path class="series" d="{d}" fill="none" stroke="{st.color}" stroke-width="2"{_dash(st)}/>')
        for (x, y), xv, yv in zip(pts, s.xs, s.ys):
            out.append(
                f'<g class="point"><title>{escape(f"{s.label}: {c.xtext(xv)}, {c.ytext(yv)}")}</title>'
                f"{marker(st.marker, x, y, st.color)}</g>"
            )
    out.append(legend)
    out.append("</svg>")
    return "".join(out)


GANTT_UNITS = 100000.0  # the step is drawn 0..GANTT_UNITS wide and scaled to the plot: zoom keeps precision


def merge_spans(spans: Sequence[Span], resolution_s: float) -> list[Span]:
    """Spans of the same kind on the same row that touch (gap ≤ ``resolution_s``) merged into one."""
    out: list[Span] = []
    last: dict[tuple[int, str], int] = {}
    for s in sorted(spans, key=lambda s: (s.row, s.kind, s.start_s)):
        k = (s.row, s.kind)
        i = last.get(k)
        if i is not None and s.start_s - (out[i].start_s + out[i].dur_s) <= resolution_s:
            p = out[i]
            out[i] = Span(p.row, p.start_s, max(p.start_s + p.dur_s, s.start_s + s.dur_s) - p.start_s, p.kind)
        else:
            last[k] = len(out)
            out.append(s)
    return out


def render_gantt(c: Gantt, fig_id: str) -> str:
    """Rows of spans; the bars sit in one group the page's script rescales to zoom (``data-*`` say how)."""
    left = _label_width(c.rows, 11)
    right, top, row_h = 16.0, 34.0, 15.0
    plot_w = WIDTH - left - right
    bottom = top + len(c.rows) * row_h
    idle_style = Style("#ffffff", "back")
    legend_items = [(k.key, k.label, k.style) for k in c.kinds] + [("idle", "idle (bubble, waits)", idle_style)]
    legend, lh = _legend(fig_id, legend_items, left, bottom + 44, plot_w)
    height = bottom + 44 + lh + 6
    total = c.total_s or 1.0
    t0, t1 = c.window or (0.0, total)
    k = GANTT_UNITS / total
    ax = Axis(t0, t1, left, left + plot_w)
    spans = [s for s in c.spans if s.start_s <= t1 and s.start_s + s.dur_s >= t0]
    busy = c.busy()
    desc = f"{len(c.spans)} spans over {fmt(total, 4)} s, {fmt(t0, 4)} to {fmt(t1, 4)} s shown; " + "; ".join(
        f"{row}: " + ", ".join(f"{kind} {fmt(v, 3)} s" for kind, v in busy[r].items()) for r, row in enumerate(c.rows)
    )
    extra = (
        (
            f' data-gantt="1" data-left="{_n(left)}" data-plotw="{_n(plot_w)}" data-total="{total!r}" '
            f'data-units="{GANTT_UNITS:g}" data-top="{_n(top)}" data-bottom="{_n(bottom)}"'
        )
        if c.zoomable
        else ""
    )
    out = [
        _open(fig_id, c.title, desc, WIDTH, height, "gantt", extra),
        patterns(fig_id, [(kk.key, kk.style) for kk in c.kinds] + [("idle", Style("#ffffff", "back"))]),
        (
            f'<clipPath id="{fig_id}-clip"><rect x="{_n(left)}" y="{_n(top - 2)}" width="{_n(plot_w)}" '
            f'height="{_n(bottom - top + 4)}"/></clipPath>'
        ),
        text(left, 20, c.title, size=14, weight="bold"),
    ]
    for r, row in enumerate(c.rows):
        y = top + r * row_h
        if r < len(c.row_groups) and c.row_groups[r] % 2:
            out.append(f'<rect x="0" y="{_n(y)}" width="{_n(WIDTH)}" height="{_n(row_h)}" fill="#eef1f5"/>')
        if r in c.idle_rows:
            out.append(
                f'<rect x="{_n(left)}" y="{_n(y + 1)}" width="{_n(plot_w)}" height="{_n(row_h - 2)}" '
                f'fill="url(#{pattern_id(fig_id, "idle")})" fill-opacity="0.7"/>'
            )
        else:
            out.append(
                f'<line x1="{_n(left)}" y1="{_n(y + row_h / 2)}" x2="{_n(left + plot_w)}" '
                f'y2="{_n(y + row_h / 2)}" '
                f'stroke="{GRID}" stroke-width="0.6"/>'
            )
        out.append(text(left - 6, y + row_h / 2 + 4, clip_label(row, 11), "end", 11))
    # bars: one path per (row, kind), in data units; the group's transform maps them onto the plot
    paths: dict[tuple[int, str], list[str]] = {}
    for s in spans:
        if s.dur_s <= 0:
            continue
        y = top + s.row * row_h
        h = row_h - 2 if s.kind != "recompute" else (row_h - 2) * 0.6  # recompute: shorter bars, not just a colour
        x0, w = s.start_s * k, max(s.dur_s * k, 1e-3)
        paths.setdefault((s.row, s.kind), []).append(f"M{x0:.1f} {_n(y + 1)}h{w:.1f}v{_n(h)}h-{w:.1f}z")
    styles = {kk.key: kk.style for kk in c.kinds}
    out.append(
        f'<g clip-path="url(#{fig_id}-clip)"><g class="gantt-bars" '
        f'transform="translate({_n(left)},0) scale({plot_w / ((t1 - t0) * k):.8g},1) '
        f'translate({-t0 * k:.8g},0)">'
    )
    for (_, kind), ds in sorted(paths.items()):
        st = styles.get(kind, Style("#000000"))
        out.append(f'<path data-kind="{escape(kind)}" d="{"".join(ds)}" fill="{st.color}"/>')
    out.append("</g></g>")
    out.append(f'<line x1="{_n(left)}" y1="{_n(bottom)}" x2="{_n(left + plot_w)}" y2="{_n(bottom)}" stroke="{INK}"/>')
    out.append('<g class="gantt-axis">')
    for t in ax.ticks():
        x = ax(t)
        out.append(f'<line x1="{_n(x)}" y1="{_n(bottom)}" x2="{_n(x)}" y2="{_n(bottom + 4)}" stroke="{INK}"/>')
        out.append(text(x, bottom + 16, fmt(t, 3), "middle", 11))
    out.append("</g>")
    out.append(text(left + plot_w / 2, bottom + 32, "time in the step (s)", "middle", 12))
    out.append(legend)
    out.append("</svg>")
    return "".join(out)


def standalone(svg: str) -> str:
    """The chart as an .svg file."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n"
