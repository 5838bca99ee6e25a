"""``commtax simulate``: a thin typer command over ``commtax.sim.simulate``.

The main CLI calls ``register(app)``; ``python -m commtax.sim.cli JOB.yaml`` runs it alone.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Callable, NoReturn, Optional, TypeVar

import typer

from commtax.atomic import strict_json
from commtax.errors import SpecError
from commtax.units import MiB

T = TypeVar("T")


def _render(breakdown, console) -> None:  # noqa: ANN001 - rich Console, Breakdown
    try:
        from commtax.report.table import (
            render_breakdown,  # the lead's renderer, when it exists
        )
    except ImportError:
        render_breakdown = None
    if render_breakdown is not None:
        render_breakdown(breakdown, console)
    else:
        _minimal_table(breakdown, console)
    for note in breakdown.notes:
        console.print(note, highlight=False, soft_wrap=True)


def _minimal_table(breakdown, console) -> None:  # noqa: ANN001
    from rich.table import Table

    b = breakdown
    table = Table(title=f"one step ({b.source})", show_header=True)
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for k, x in b.breakdown_s.items():
        table.add_row(k, f"{x:.4f}", f"{x / b.step_time_s:.1%}")
    table.add_row("step", f"{b.step_time_s:.4f}", "100.0%", style="bold")
    console.print(table)
    console.print(
        f"tokens/s/GPU {b.tokens_per_s_per_gpu:,.0f}   TFLOP/s/GPU {b.tflops_per_gpu:.1f}   MFU {b.mfu:.1%}   "
        f"comm tax {b.comm_tax:.1%}   comm share {b.comm_share:.1%}   "
        f"memory {b.memory_gib_per_gpu.get('total', 0):.1f} GiB ({'fits' if b.fits else 'does not fit'})"
    )


def simulate_cmd(
    job_file: Annotated[Path, typer.Argument(help="job YAML (model, cluster, plan, training)")],
    json_out: Annotated[bool, typer.Option("--json", help="print the Breakdown as JSON (same fields as estimate)")] = False,
    trace: Annotated[Optional[Path], typer.Option(help="write a Chrome trace (Perfetto, chrome://tracing)")] = None,
    gantt: Annotated[Optional[Path], typer.Option(help="write a Gantt chart (PNG/SVG/PDF by suffix)")] = None,
    explain_: Annotated[bool, typer.Option("--explain", help="say why the simulation differs from the estimate")] = False,
    bucket_mb: Annotated[float, typer.Option(help="gradient bucket size in MiB (PyTorch DDP bucket_cap_mb)")] = 25.0,
    catalog: Annotated[Optional[Path], typer.Option(help="extra catalog YAML (gpu/intra_node/inter_node/model)")] = None,
) -> None:
    """Simulate one training step event by event: the same Breakdown as estimate, plus a timeline."""
    from rich.console import Console

    from commtax.sim.events import SimError
    from commtax.sim.simulate import simulate
    from commtax.sim.step import SimOptions
    from commtax.spec import load_job

    try:
        if not bucket_mb > 0:
            raise SpecError(f"--bucket-mb must be > 0 MiB, got {bucket_mb}")
        for out in (trace, gantt):
            if out is not None and not out.resolve().parent.is_dir():
                raise SpecError(f"{out}: directory {out.resolve().parent} does not exist")
        if gantt is not None and gantt.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise SpecError(f"--gantt {gantt}: the suffix names the format; use .png, .svg or .pdf")
        job = load_job(job_file, catalog)
        result = simulate(job, SimOptions(bucket_bytes=bucket_mb * MiB))
    except (SpecError, SimError) as e:
        _fail(str(e))
    bd = result.breakdown
    if explain_:
        from commtax.sim.explain import explain

        bd.notes.extend(explain(result))
    if trace is not None:
        from commtax.sim.trace import write_trace

        meta = {"job": str(job_file), "step_time_s": bd.step_time_s}
        n = _write(trace, lambda: write_trace(result.sim, trace, result.builder.v, meta))
        bd.notes.append(f"trace: {trace} ({n:,} events; open in https://ui.perfetto.dev or chrome://tracing)")
    if gantt is not None:
        from commtax.sim.gantt import write_gantt

        _write(gantt, lambda: write_gantt(result.sim, gantt, f"{job_file.name}: step {bd.step_time_s:.3f} s (simulated)"))
        bd.notes.append(f"gantt: {gantt}")
    if json_out:
        typer.echo(strict_json(bd.to_dict(), indent=2))
    else:
        _render(bd, Console())


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _write(path: Path, write: Callable[[], T]) -> T:
    try:
        return write()
    except OSError as e:
        _fail(f"cannot write {path}: {e.strerror}")
    except SpecError as e:  # atomic writes: a special file refused, a missing folder, a name too long
        _fail(str(e))


def register(app: typer.Typer) -> None:
    from commtax.cli import user_errors  # Ctrl-C/SIGTERM: exit 130; any OSError: one line

    app.command("simulate")(user_errors(simulate_cmd))


def main() -> None:
    app = typer.Typer(add_completion=False)
    register(app)

    @app.callback()
    def _root() -> None:
        """commtax (simulator only)."""

    app(args=["simulate", *sys.argv[1:]], prog_name="commtax")


if __name__ == "__main__":
    main()
