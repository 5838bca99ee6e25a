"""``commtax simulate``: a thin typer command over ``commtax.schedule.sim.run.simulate_file``.

Registered in ``commtax.cli.main.COMMANDS``; ``python -m commtax.cli.simulate JOB.yaml`` runs it alone.
Errors, JSON and output files: :mod:`commtax.cli.io`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from commtax.cli.io import CatalogOpt, JobArg, JsonOpt, OutOpt, console, does_not_fit, emit, user_errors, warn


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
    from commtax.schedule.sim.run import simulate_file

    sim = simulate_file(job_file, catalog, bucket_mb=bucket_mb, explain=explain_, trace=trace, gantt=gantt, out=out)
    bd = sim.breakdown
    emit(bd.to_dict(), json_out, out)
    if not json_out:
        from commtax.report.table import render_breakdown  # rich: only when a table is printed

        render_breakdown(bd, console, sim.job.cluster.gpu.mem_GiB)
    if not bd.fits:
        if not json_out:
            warn("the simulated step is reported, but the plan would run out of memory")
        does_not_fit(bd, sim.job)


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
