"""Text views: what ``commtax validate`` prints (its summaries) and ``commtax calibrate`` (the residuals of a fit,
the profile a trace implies). The calibrate views return lines; the command prints them. Lines read at 80 columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

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


def print_validation(multi: Any, console: Console, *, loso: bool, wide: bool) -> None:
    """``commtax validate``: each file's rows and summary; with several runs files, their union's summary.
    ``multi``: a ``decide.validate.MultiReport``."""
    from commtax.report.table import print_table, validation_table

    several = len(multi.files) > 1
    for name, report in multi.files.items():
        if several:
            console.print(f"\n[bold]{name}[/bold]")
        print_table(console, validation_table(report, wide), wide)
        print_validation_summary(report, console, loso=loso, subsets=True)
    if multi.union is not None:
        console.print(f"\n[bold]All runs files together ({len(multi.union.rows)} rows)[/bold]")
        print_validation_summary(multi.union, console, loso=loso, subsets=False)


def print_validation_summary(report: Any, console: Console, *, loso: bool, subsets: bool) -> None:
    """The MAPE (by subset and source, on rows no constant was fitted on, leave-one-source-out), the rows refused
    and why, the columns not read, the 80% interval's coverage. ``report``: a ``decide.validate.Report``."""
    if subsets:
        for name, value in report.subsets.items():
            console.print(f"MAPE {name}: {value:.1f}%")
    for name, value in report.by_source.items():
        console.print(f"MAPE by source: {name[:48]} ({report.rows_by_source[name]} rows): {value:.1f}%")
    if report.source_avg_mape_pct is not None:
        console.print(f"MAPE averaged by source ({len(report.by_source)} sources): {report.source_avg_mape_pct:.1f}%")
        console.print(f"MAPE on rows no constant was fitted on: {report.unfitted_mape_pct:.1f}%")
    if report.kind == "runs":
        console.print(f"rows refused: {len(report.refused)}", highlight=False)
    if report.refused:
        reasons = {r.id: r.reason for r in report.rows if r.predicted is None}
        for rid in report.refused:  # one line each, the reason beside the row: reads at 80 columns
            console.print(f"  refused {rid}: {reasons.get(rid) or 'no prediction'}", markup=False, highlight=False)
    if report.unknown_columns:
        console.print(
            f"note: columns this validator does not read (ignored): {', '.join(report.unknown_columns)}",
            markup=False,
            highlight=False,
        )
    if report.kind == "runs":
        if report.coverage_80 is not None:
            console.print(f"80% interval covers {report.coverage_80:.0%} of the rows (coverage_80)")
    if loso and report.kind == "runs":
        console.print(
            f"leave-one-source-out MAPE: {report.loso_mape_pct:.1f}% ({report.loso_note})"
            if report.loso_mape_pct is not None
            else f"leave-one-source-out: {report.loso_note}"
        )
    n_ok = sum(r.error_pct is not None for r in report.rows)
    console.print(
        f"[bold]MAPE ({report.kind}, {n_ok} rows): {report.mape_pct:.1f}%[/bold]"
        if report.mape_pct is not None
        else "no row could be predicted"
    )
