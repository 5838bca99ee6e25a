"""Rich tables for a Breakdown, per-GPU memory, validation reports and collective predictions."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from commtax.estimate import BREAKDOWN_KEYS, Breakdown
from commtax.units import GB


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def breakdown_table(b: Breakdown, title: str = "Step") -> Table:
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("component")
    t.add_column("seconds", justify="right")
    t.add_column("share of step", justify="right")
    for key in BREAKDOWN_KEYS:
        v = b.breakdown_s[key]
        t.add_row(key, f"{v:.4f}", _pct(v / b.step_time_s if b.step_time_s else 0.0))
    t.add_row("[bold]step_time[/bold]", f"[bold]{b.step_time_s:.4f}[/bold]", "100.0%")
    return t


def summary_table(b: Breakdown) -> Table:
    t = Table(title="Throughput and communication", show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("tokens/s", f"{b.tokens_per_s:,.0f}"),
        ("tokens/s per GPU", f"{b.tokens_per_s_per_gpu:,.1f}"),
        ("model TFLOP/s per GPU", f"{b.tflops_per_gpu:.1f}"),
        ("MFU (model FLOPs / peak)", _pct(b.mfu)),
        ("HFU (incl. recompute)", _pct(b.hfu)),
        ("comm tax (exposed comm / step)", _pct(b.comm_tax)),
        ("comm share (comm / (comm + compute), no overlap)", _pct(b.comm_share)),
    ]
    if b.days_to_train is not None:
        rows.append(("days to train", f"{b.days_to_train:,.1f}"))
    for r in rows:
        t.add_row(*r)
    return t


def comm_table(b: Breakdown) -> Table:
    t = Table(title="Communication per GPU per step (before overlap)", show_header=True, header_style="bold")
    t.add_column("group")
    t.add_column("bytes sent", justify="right")
    t.add_column("link time s", justify="right")
    for g in ("tp", "cp", "pp", "dp"):
        t.add_row(g, f"{b.comm_bytes_per_gpu[g] / GB:,.2f} GB", f"{b.comm_time_s[g]:.4f}")
    return t


def memory_table(b: Breakdown, capacity_gib: float | None = None) -> Table:
    t = Table(title="Memory per GPU (busiest pipeline stage)", show_header=True, header_style="bold")
    t.add_column("part")
    t.add_column("GiB", justify="right")
    for k, v in b.memory_gib_per_gpu.items():
        style = "bold" if k == "total" else ""
        t.add_row(f"[{style}]{k}[/{style}]" if style else k, f"{v:.2f}")
    if capacity_gib is not None:
        t.add_row("capacity", f"{capacity_gib:.2f}")
    return t


def render_breakdown(b: Breakdown, console: Console, capacity_gib: float | None = None) -> None:
    console.print(breakdown_table(b, f"One training step ({b.source})"))
    console.print(summary_table(b))
    console.print(comm_table(b))
    console.print(memory_table(b, capacity_gib))
    for note in b.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
