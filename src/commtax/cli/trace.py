"""``commtax trace``: a thin typer command over ``commtax.trace.traced_job`` (tables: ``report.trace_tables``).

Importing this module imports neither torch nor matplotlib. Bad input (a malformed trace, a bad
``--steps``) prints one line naming the file or option and the problem, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commtax.cli.io import CatalogOpt, JsonOpt, OutOpt, TraceJobOpt, emit, fail, warn
from commtax.errors import SpecError

MAX_WIDTH = 100  # the table view fits 100 columns, or the terminal when it is narrower


def width() -> int:
    """The terminal's columns (COLUMNS when not a terminal), at most MAX_WIDTH."""
    import shutil

    return max(40, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def trace_command(
    traces: Annotated[
        list[Path],
        typer.Argument(metavar="TRACE", help="Kineto trace files (.json or .json.gz), one per rank, or directories"),
    ],
    json_out: JsonOpt = False,
    against: Annotated[
        Optional[Path],
        typer.Option("--against", metavar="JOB.yaml", help="job YAML: show its prediction next to the measurement"),
    ] = None,
    steps: Annotated[Optional[str], typer.Option("--steps", metavar="A:B", help="only ProfilerStep#A … #B")] = None,
    job_k: TraceJobOpt = None,
    out: OutOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """Measured communication tax of a real job from PyTorch profiler traces; with --against, vs the prediction.

    Traces of several jobs (a folder of runs) give one set of tables per job; --job K keeps job K, and --against
    compares the one job of the YAML's world size (or job K)."""
    from rich.console import Console

    from commtax.atomic import refuse_overwriting_inputs
    from commtax.report.trace_tables import print_trace
    from commtax.trace.traced_job import traced_job

    try:
        refuse_overwriting_inputs({"--out": out}, [*traces, against, catalog])
        t = traced_job(traces, steps, against, job_k, catalog, warn=warn)
    except SpecError as e:
        fail(str(e))
    emit(t.to_dict(), json_out, out)
    if not json_out:
        print_trace(t, Console(width=width()), warn)
