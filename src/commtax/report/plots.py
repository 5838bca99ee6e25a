"""Plots (PNG): step breakdowns, validation parity, Pareto front of days vs $ per B tokens, scaling.

matplotlib is imported inside the functions (never at module import); files are written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from commtax.atomic import write_atomic_with

if TYPE_CHECKING:  # pragma: no cover
    from commtax.decide.compare import Comparison, Point, ScalePoint
    from commtax.decide.validate import Report
    from commtax.schedule.breakdown import Breakdown


def _save(fig, path: Path | str) -> Path:
    return write_atomic_with(path, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(points: list[Point], path: Path | str, title: str = "", mode: str = "owned") -> Path:
    """Every fitting plan of every cluster; the front (nothing both faster and cheaper) joined by a line."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    try:
        for p in points:
            ax.scatter(p.days, p.usd_per_B, s=6, alpha=0.35, label=p.cluster)
        days = np.concatenate([p.days[p.pareto] for p in points]) if points else np.zeros(0)
        usd = np.concatenate([p.usd_per_B[p.pareto] for p in points]) if points else np.zeros(0)
        if len(days):
            o = np.argsort(days)
            ax.plot(days[o], usd[o], "k-o", ms=4, lw=1.2, label="Pareto front")
        ax.set_xlabel("days to train")
        ax.set_ylabel(f"$ per billion tokens ({mode})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title or "Plans and clusters: time vs cost")
        ax.legend(fontsize=7, loc="best")
        return _save(fig, path)
    finally:
        plt.close(fig)


def scaling_plot(points: list[ScalePoint], path: Path | str, title: str = "") -> Path:
    """Comm tax and MFU of the best plan at each GPU count."""
    plt = _pyplot()
    ok = [p for p in points if p.breakdown is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        n = [p.num_gpus for p in ok]
        ax.plot(n, [100 * p.breakdown.comm_tax for p in ok], "o-", label="comm tax (exposed comm / step)")
        ax.plot(n, [100 * p.breakdown.comm_share for p in ok], "s--", label="comm share (no overlap)")
        ax.plot(n, [100 * p.breakdown.mfu for p in ok], "^-", label="MFU")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("%")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
        ax.set_title(title or "Best plan at each scale")
        ax.legend(fontsize=8)
        return _save(fig, path)
    finally:
        plt.close(fig)


BREAKDOWN_COLORS = {
    "compute": "#4c72b0",
    "recompute": "#8fa9d6",
    "tp_exposed": "#dd8452",
    "cp_exposed": "#e8b07f",
    "pp_bubble": "#bbbbbb",
    "pp_exposed": "#c44e52",
    "dp_exposed": "#8172b3",
    "optimizer": "#55a868",
}


def comparison_plots(c: Comparison, pareto: Path | None, scaling: Path | None) -> dict[str, str]:
    """``compare --pareto PNG --scaling PNG``: each chart asked for, drawn; the record's keys naming them. With no
    chart asked for, an empty record and nothing imported: this module, unlike report.planning, loads neither rich
    nor matplotlib, so ``compare --json`` calls it as it is."""
    written = {}
    if pareto is not None:
        pareto_plot(c.pareto, pareto, mode=c.mode)
        written["pareto_png"] = str(pareto)
    if scaling is not None:
        scaling_plot(c.scaling, scaling, "" if c.searched else "The job's plan at each scale")
        written["scaling_png"] = str(scaling)
    return written


def breakdown_plot(rows: list[tuple[str, Breakdown]], path: Path | str, title: str = "") -> Path:
    """One horizontal bar per job: the step split into its parts, communication in warm colours."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(rows)))
    try:
        for i, (_label, b) in enumerate(rows):
            left = 0.0
            for key, color in BREAKDOWN_COLORS.items():
                share = b.breakdown_s[key] / b.step_time_s
                ax.barh(i, share * 100, left=left, color=color, label=key if i == 0 else None)
                left += share * 100
            ax.text(101, i, f"{b.step_time_s:.3g} s, tax {100 * b.comm_tax:.0f}%", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.invert_yaxis()
        ax.set_xlim(0, 125)
        ax.set_xlabel("% of step time")
        ax.set_title(title or "Where the step goes")
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.45, -0.25 if len(rows) > 1 else -0.6))
        return _save(fig, path)
    finally:
        plt.close(fig)


def parity_plot(report: Report, path: Path | str, title: str = "") -> Path:
    """Predicted vs measured for every predicted validation row, log-log, with the ±10% band."""
    import numpy as np

    plt = _pyplot()
    rows = [r for r in report.rows if r.predicted is not None and r.measured]
    fig, ax = plt.subplots(figsize=(6, 6))
    try:
        groups: dict[str, list] = {}
        for r in rows:
            groups.setdefault(r.id.split("_")[0], []).append(r)
        for name, rs in groups.items():
            ax.scatter([r.measured for r in rs], [r.predicted for r in rs], s=18, label=name)
        if rows:
            lo = min(min(r.measured, r.predicted) for r in rows) * 0.8
            hi = max(max(r.measured, r.predicted) for r in rows) * 1.25
            x = np.geomspace(lo, hi, 50)
            ax.plot(x, x, "k-", lw=1)
            ax.fill_between(x, 0.9 * x, 1.1 * x, color="k", alpha=0.08, label="±10%")
        unit = "tokens/s per GPU" if report.kind == "runs" else "busbw GB/s"
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        mape = f"MAPE {report.mape_pct:.1f}%" if report.mape_pct is not None else ""
        ax.set_title(title or f"commtax validate: {report.kind}, {mape}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        return _save(fig, path)
    finally:
        plt.close(fig)
