"""The report's figures for slides: each chart description as SVG (``report.svg``) and PNG (matplotlib).

matplotlib is imported inside ``write_png`` only; files are written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from commtax.atomic import write_atomic, write_atomic_with
from commtax.report import svg

if TYPE_CHECKING:  # pragma: no cover
    from commtax.report.html import Fig

HATCH = {
    "solid": "",
    "diag": "///",
    "back": "\\\\\\",
    "cross": "xx",
    "dots": "..",
    "hlines": "--",
    "vlines": "||",
    "grid": "++",
}
MARKER = {"circle": "o", "square": "s", "triangle": "^", "diamond": "D", "none": ""}


def _stacked(ax, c: svg.StackedBars) -> None:
    for r in range(len(c.rows)):
        left = 0.0
        for s, v in zip(c.segments, c.values[r]):
            ax.barh(
                r,
                v,
                left=left,
                color=s.style.color,
                hatch=HATCH[s.style.pattern],
                edgecolor="white",
                label=s.label if r == 0 else None,
            )
            left += v
        ax.text(left, r, f"  {svg.fmt(left, c.digits)} {c.unit}", va="center", fontsize=8)
    if c.limit is not None:
        ax.axvline(c.limit, color="black", ls="--", lw=1.5, label=f"{c.limit_label} {svg.fmt(c.limit, c.digits)}")
    ax.set_yticks(range(len(c.rows)), list(c.rows))
    ax.invert_yaxis()
    ax.set_xlabel(c.unit)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18))


def _bars(ax, c: svg.Bars) -> None:
    n = max(1, len(c.series))
    h = 0.8 / n
    for i, name in enumerate(c.series):
        st = c.style(i)
        ys = [r + (i - (n - 1) / 2) * h for r in range(len(c.rows))]
        vals = [row[i] * (100 if c.percent else 1) for row in c.values]
        ax.barh(
            ys, vals, height=h, color=st.color, hatch=HATCH[st.pattern], edgecolor="black", linewidth=0.4, label=name
        )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(c.rows)), list(c.rows))
    ax.invert_yaxis()
    ax.set_xlabel("%" if c.percent else c.unit)
    if n > 1:
        ax.legend(fontsize=7)


def _lines(ax, c: svg.Lines) -> None:
    for i, s in enumerate(c.series):
        st = c.style(i)
        ys = [y * (100 if c.y_percent else 1) for y in s.ys]
        ls = "none" if s.points_only else ((0, tuple(float(x) for x in st.dash.split())) if st.dash else "-")
        ax.plot(s.xs, ys, marker=MARKER[st.marker] or None, ls=ls, color=st.color, label=s.label)
    if c.x_log:
        from matplotlib.ticker import FixedLocator, FuncFormatter

        ax.set_xscale("log", base=c.x_log)
        xs = [x for s in c.series for x in s.xs]
        if xs:
            ax.xaxis.set_major_locator(FixedLocator(svg.log_ticks(min(xs), max(xs), c.x_log)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: c.xtext(v) if c.x_fmt == "bytes" else f"{v:g}"))
    if c.y_log:
        ax.set_yscale("log", base=c.y_log)
    if c.y_min is not None or c.y_max is not None:
        k = 100 if c.y_percent else 1
        ax.set_ylim(None if c.y_min is None else c.y_min * k, None if c.y_max is None else c.y_max * k)
    ax.set_xlabel(c.x_label)
    ax.set_ylabel(c.y_label + (" (%)" if c.y_percent else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _gantt(ax, c: svg.Gantt) -> None:
    styles = {k.key: k.style for k in c.kinds}
    t0, t1 = c.shown
    for row in c.idle_rows:  # hatched where the compute stream has nothing to do (bubble, waits)
        ax.barh(
            row, t1 - t0, left=t0, height=0.8, color="white", hatch="\\\\", edgecolor="#999999", linewidth=0, zorder=0
        )
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for s in c.spans:
        bars.setdefault((s.row, s.kind), []).append((s.start_s, s.dur_s))
    for (row, kind), xs in bars.items():
        h = 0.8 if kind != "recompute" else 0.5
        ax.broken_barh(xs, (row - 0.4, h), facecolors=styles.get(kind, svg.Style("#000000")).color, linewidth=0)
    ax.set_yticks(range(len(c.rows)), list(c.rows), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(t0, t1)
    ax.set_xlabel("time in the step (s)")
    from matplotlib.patches import Patch

    handles = [Patch(color=k.style.color, label=k.label) for k in c.kinds]
    handles.append(Patch(facecolor="white", hatch="\\\\", edgecolor="#999999", label="idle (bubble, waits)"))
    ax.legend(handles=handles, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))


def write_png(chart: svg.Chart, path: Path | str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(getattr(chart, "rows", ())) or 6
    height = 4.5 if isinstance(chart, svg.Lines) else 1.6 + 0.35 * rows * (len(getattr(chart, "series", ())) or 1)
    fig, ax = plt.subplots(figsize=(10, min(max(height, 2.8), 14)))
    try:
        {svg.StackedBars: _stacked, svg.Bars: _bars, svg.Lines: _lines, svg.Gantt: _gantt}[type(chart)](ax, chart)
        ax.set_title(chart.title, fontsize=11)
        fig.tight_layout()
        return write_atomic_with(path, lambda tmp: fig.savefig(tmp, dpi=150, format="png"))
    finally:
        plt.close(fig)


def write_figures(figs: Sequence[Fig], folder: Path | str) -> list[Path]:
    """``folder/<id>.svg`` (the page's own SVG) and ``folder/<id>.png`` for every figure."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in figs:
        out.append(write_atomic(folder / f"{f.id}.svg", svg.standalone(svg.render(f.chart, f.id))))
        out.append(write_png(f.chart, folder / f"{f.id}.png"))
    return out
