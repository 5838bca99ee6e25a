"""``commtax estimate``'s work, without typer: the entry point runs it directly for a plain command line
(:mod:`commtax.cli.entry`), the typer command (:func:`commtax.cli.main.estimate`) for every other one.

Importing this module imports the whole estimate path (spec, workload, costs, the analytical schedule) and
nothing else: rich only to print a table, matplotlib only for ``--plot``, typer only to report an error.
"""

from __future__ import annotations

from pathlib import Path

from commtax.cli.output import emit
from commtax.schedule.analytical import estimate
from commtax.spec import load_job


def estimate_job(
    job_file: Path,
    json_out: bool = False,
    out: Path | None = None,
    plot: Path | None = None,
    catalog: Path | None = None,
) -> None:
    """Predict one training step of ``job_file``: its breakdown as JSON (``--json``, ``--out``) or a table; a plan
    that does not fit memory exits 1 after the output, naming the need and the fixes."""
    job = load_job(job_file, catalog)
    b = estimate(job)
    if plot is not None:
        from commtax.report.plots import breakdown_plot

        breakdown_plot([(job_file.stem, b)], plot)
    emit(b.to_dict(), json_out, out)
    if not json_out:
        from commtax.cli.io import console
        from commtax.report.table import render_breakdown  # rich: only when a table is printed

        render_breakdown(b, console, job.cluster.gpu.mem_GiB)
    if not b.fits:
        from commtax.cli.io import does_not_fit

        does_not_fit(b, job)
