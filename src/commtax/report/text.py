"""Plain-text views: what ``commtax calibrate`` prints (the residuals of a fit, the profile a trace implies).

Each function returns the lines; the command prints them. Lines read at 80 columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from commtax.errors import safe_text
from commtax.units import MB


def calibration_lines(c: Any, out: Path, cluster_out: Path | None = None) -> list[str]:
    """Each record's measured time, the model's before and after calibrating, and where the profile went.
    ``c``: a ``measure.calibrate.Calibration``."""
    lines = [  # 77 columns: reads at 80
        f"{'op':>14} {'impl':>5} {'bytes':>9} {'measured ms':>11} {'model ms':>8} {'err':>6} "
        f"{'calibrated':>10} {'err':>6}"
    ]
    for b, a in c.residuals():
        lines.append(
            f"{b['op']:>14} {b['impl']:>5} {b['message_bytes']:>9} {b['measured_s'] * 1e3:11.3f} "
            f"{b['predicted_s'] * 1e3:8.3f} {b['error']:+6.1%} {a['predicted_s'] * 1e3:10.3f} "
            f"{a['error']:+6.1%}"
        )
    lines.append(
        f"wrote {safe_text(str(out))}"
        + (f" and {safe_text(str(cluster_out))}" if cluster_out else "")
        + f"; in a job file: `cluster: {{..., profile: {out}}}` replaces the catalog link numbers"
    )
    return lines


def profile_summary_lines(profile: dict, out: Path) -> list[str]:
    """``calibrate --trace``: the GEMM efficiencies, the measured collectives and links, where the profile went."""
    eff = ", ".join(f"{k} {v:.3f}" for k, v in profile.get("gemm_efficiency", {}).items())
    lines = [f"GEMM efficiency: {eff}; measured compute {profile['measured_compute_s_per_step'] * 1e3:.2f} ms/step"]
    if "compute_fit" in profile:
        lines.append(f"warning: {profile['compute_fit']}")
    for m in profile.get("measured_busbw", []):
        lines.append(
            f"{m['op']:>14} n={m['group_size']:<4} {m['message_bytes'] / MB:10.3g} MB  "
            f"{m['time_s'] * 1e3:9.3f} ms  busbw {m['busbw_GBps']:.3g} GB/s"
        )
    lv = profile.get("levels", {})
    links = ", ".join(f"{k} {v['bw_GBps']:.3g} GB/s α {v['latency_us']:.1f} µs" for k, v in lv.items())
    lines.append("links: " + links)
    lines.append(f"wrote {safe_text(str(out))}; in a job file: `cluster: {{..., profile: {safe_text(str(out))}}}`")
    return lines
