"""A Gantt chart of the simulated step (matplotlib, imported only when a chart is drawn)."""

from __future__ import annotations

from pathlib import Path

from commtax.schedule.sim.chrome_trace import spans, write_atomic
from commtax.schedule.sim.events import Sim

COLORS = {
    "compute": "#4477aa",
    "recompute": "#66ccee",
    "optimizer": "#228833",
    "tp": "#ee6677",
    "cp": "#aa3377",
    "pp": "#ccbb44",
    "dp": "#bbbbbb",
}


def write_gantt(sim: Sim, path: Path | str, title: str = "") -> None:
    """One row per (stage, stream) that has work, one colour per kind of time; saved atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for _, sid, start, dur, kind in spans(sim):
        if dur > 0:
            rows.setdefault(sid, {}).setdefault(kind, []).append((start, dur))
    order = sorted(rows, key=lambda sid: (sim.streams[sid].device, sid))
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.28 * max(1, len(order))))
    for y, sid in enumerate(order):
        for kind, bars in rows[sid].items():
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLORS.get(kind, "#000000"), linewidth=0)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"stage {sim.streams[s].device} {sim.streams[s].name}" for s in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title, fontsize=9)
    kinds = sorted({k for r in rows.values() for k in r}, key=list(COLORS).index)
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper right", fontsize=7, ncol=len(kinds))
    fig.tight_layout()
    fmt = Path(path).suffix.lstrip(".") or "png"
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format=fmt))
    plt.close(fig)
