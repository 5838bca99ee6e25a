"""Planning plots (PNG): Pareto front of days-to-train vs $ per B tokens; comm tax and MFU vs GPU count.

matplotlib is imported inside the functions (never at module import); files are written atomically.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from commtax.compare import Point, ScalePoint


def _save(fig, path: Path | str) -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(points: list["Point"], path: Path | str, title: str = "", mode: str = "owned") -> Path:
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


def scaling_plot(points: list["ScalePoint"], path: Path | str, title: str = "") -> Path:
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
