"""``commtax simulate``: a thin typer command over ``commtax.schedule.sim.simulate``.

Registered in ``commtax.cli.main.COMMANDS``; ``python -m commtax.cli.simulate JOB.yaml`` runs it alone.
Errors, JSON and output files: :mod:`commtax.cli.io`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional, TypeVar

import typer

from commtax.cli.io import CatalogOpt, JobArg, JsonOpt, OutOpt, console, does_not_fit, emit, user_errors, warn
from commtax.errors import SpecError

T = TypeVar("T")


def simulate_cmd(
    job_file: JobArg,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    trace: Annotated[
        Optional[Path],
        typer.Option("--trace", metavar="FILE", help="write a Chrome trace (Perfetto, chrome://tracing)"),
    ] = None,
    gantt: Annotated[
        Optional[Path], typer.Option("--gantt", metavar="FILE", help="write a Gantt chart (PNG/SVG/PDF by suffix)")
    ] = None,
    explain_: Annotated[
        bool, typer.Option("--explain", metavar="", help="say why the simulation differs from the estimate")
    ] = False,
    bucket_mb: Annotated[
        Optional[float],
        typer.Option(
            "--bucket-mb",
            help="gradient bucket in MiB (default: the framework's: PyTorch DDP bucket_cap_mb 25 MiB, "
            "Megatron-Core max(40e6, 1e6*dp) parameters)",
        ),
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Simulate one training step event by event: the same Breakdown as estimate, plus a timeline."""
    from commtax.report.table import render_breakdown
    from commtax.schedule.sim.events import SimError
    from commtax.schedule.sim.simulate import simulate
    from commtax.schedule.sim.step import SimOptions
    from commtax.spec import load_job
    from commtax.units import MiB

    if bucket_mb is not None and not bucket_mb > 0:
        raise SpecError(f"--bucket-mb must be > 0 MiB, got {bucket_mb}")
    for path in (trace, gantt, out):
        if path is not None and not path.resolve().parent.is_dir():
            raise SpecError(f"{path}: directory {path.resolve().parent} does not exist")
    if gantt is not None and gantt.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"--gantt {gantt}: the suffix names the format; use .png, .svg or .pdf")
    job = load_job(job_file, catalog)
    try:
        from commtax.workload.step import grad_bucket_bytes

        bucket = grad_bucket_bytes(job) if bucket_mb is None else bucket_mb * MiB
        result = simulate(job, SimOptions(bucket_bytes=bucket))
    except SimError as e:
        raise SpecError(str(e)) from None
    bd = result.breakdown
    if explain_:
        from commtax.schedule.sim.explain import explain

        bd.notes.extend(explain(result))
    if trace is not None:
        from commtax.schedule.sim.chrome_trace import write_trace

        meta = {"job": str(job_file), "step_time_s": bd.step_time_s}
        n = _write(trace, lambda: write_trace(result.sim, trace, result.builder.v, meta))
        bd.notes.append(f"trace: {trace} ({n:,} events; open in https://ui.perfetto.dev or chrome://tracing)")
    if gantt is not None:
        from commtax.schedule.sim.gantt import write_gantt

        title = f"{job_file.name}: step {bd.step_time_s:.3f} s (simulated)"
        _write(gantt, lambda: write_gantt(result.sim, gantt, title))
        bd.notes.append(f"gantt: {gantt}")
    emit(bd.to_dict(), json_out, out)
    if not json_out:
        render_breakdown(bd, console, job.cluster.gpu.mem_GiB)
    if not bd.fits:
        if not json_out:
            warn("the simulated step is reported, but the plan would run out of memory")
        does_not_fit(bd, job)


def _write(path: Path, write: Callable[[], T]) -> T:
    try:
        return write()
    except OSError as e:
        raise SpecError(f"cannot write {path}: {e.strerror}") from None


def register(app: typer.Typer) -> None:
    app.command("simulate")(user_errors(simulate_cmd))


def main() -> None:
    app = typer.Typer(add_completion=False, rich_markup_mode=None)
    register(app)

    @app.callback()
    def _root() -> None:
        """commtax (simulator only)."""

    app(args=["simulate", *sys.argv[1:]], prog_name="commtax")


if __name__ == "__main__":
    main()
