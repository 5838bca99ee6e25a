"""``commtax report``: the command (a thin layer over ``commtax.report.page``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commtax.cli.io import CatalogOpt, JobArg, TraceJobOpt, search_flag

# the page's options: where it goes, the measurements it analyses, the jobs beside it, its charts and search
PageOutOpt = Annotated[Path, typer.Option("--out", "-o", metavar="HTML", help="page to write (atomically)")]
BenchOpt = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--bench", metavar="FILE", help="bench JSON from `commtax bench collective --out` (repeat for several)"
    ),
]
BenchClusterOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--bench-cluster",
        metavar="FILE",
        help="cluster YAML the bench ran on, for the model curve (default: the job's cluster)",
    ),
]
TraceOpt = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--trace", metavar="FILE", help="profiler trace of one rank (repeat for each rank); needs commtax.trace"
    ),
]
CompareOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--compare", metavar="JOB.yaml", help="another job to show side by side (repeat for several)"),
]
PlotsOpt = Annotated[
    Optional[Path],
    typer.Option("--plots", metavar="DIR", help="also write every figure as SVG and PNG (matplotlib) into this folder"),
]
TopOpt = Annotated[int, typer.Option("--top", min=1, max=50, metavar="N", help="plans from search to show")]
ScaleOpt = Annotated[
    Optional[str],
    typer.Option("--scale", metavar="N,N,...", help="GPU counts for the scaling chart (default: ¼× to 4× the job's)"),
]
PageSearchOpt = Annotated[
    bool,
    search_flag(
        "a plans chart, the best plan at each scale and among the changes (about 10-30 s; the page alone ~1 s)"
    ),
]


def report(
    job_file: JobArg,
    out: PageOutOpt = Path("report.html"),
    bench: BenchOpt = None,
    bench_cluster: BenchClusterOpt = None,
    trace: TraceOpt = None,
    trace_job: TraceJobOpt = None,
    compare: CompareOpt = None,
    plots: PlotsOpt = None,
    top: TopOpt = 5,
    scale: ScaleOpt = None,
    search: PageSearchOpt = False,
    catalog: CatalogOpt = None,
) -> None:
    """One self-contained HTML page for a job's plan: summary, step, timeline, scaling, changes (works offline).

    --search adds a plan search, the best plan at each scale and the search's best plan among the changes (the slow
    part: tens of seconds on a busy core); --trace and --bench add their files' analysis."""
    from commtax.atomic import refuse_overwriting_inputs, write_atomic
    from commtax.cli.io import console, escape, safe_text, warn
    from commtax.report.page import build_page

    refuse_overwriting_inputs(
        {"--out": out}, [job_file, bench_cluster, catalog, *(bench or []), *(trace or []), *(compare or [])]
    )
    page = build_page(
        job_file,
        bench=bench or [],
        bench_cluster=bench_cluster,
        trace=trace or [],
        trace_job=trace_job,
        compare=compare or [],
        top=top,
        scale=scale,
        plan_search=search,
        catalog=catalog,
        warn=warn,
    )
    write_atomic(out, page.html)  # a new page 0666 less the umask; an existing file keeps its mode
    console.print(f"wrote {escape(safe_text(str(out)))} ({len(page.figs)} figures)", highlight=False)
    if plots is not None:
        from commtax.report.png import write_figures

        written = write_figures(page.figs, plots)
        console.print(f"wrote {len(written)} files to {escape(safe_text(str(plots)))}/ (SVG and PNG)", highlight=False)
    if (note := page.fit_note()) is not None:
        console.print(note)
