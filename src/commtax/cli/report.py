"""``commtax report``: the command (a thin layer over ``commtax.report.html``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commtax.cli.io import CatalogOpt, JobArg, TraceJobOpt, search_flag
from commtax.errors import SpecError
from commtax.units import memory_need


def _counts(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecError(f"--scale: expected GPU counts like 64,128,256, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise SpecError(f"--scale: expected positive GPU counts, got {text!r}")
    return counts


def _bench_sets(paths: list[Path], cluster_file: Path | None, job):
    from commtax.measure.cluster import load_cluster_file
    from commtax.measure.results import load_records
    from commtax.report.html import BenchSet

    if cluster_file is not None:
        from commtax.measure.calibrate import check_cluster

        try:
            cluster = load_cluster_file(cluster_file)
        except OSError as e:
            raise SpecError(f"--bench-cluster: cannot read {cluster_file}: {e.strerror}") from None
        except ValueError as e:
            raise SpecError(f"--bench-cluster: {e}") from None
        if not isinstance(cluster, dict) or "intra_node" not in cluster or "inter_node" not in cluster:
            raise SpecError(
                f"--bench-cluster: {cluster_file} is not a cluster YAML (needs intra_node and inter_node "
                "with numbers, e.g. the file `commtax cluster up` writes)"
            )
        cluster = check_cluster(
            cluster, cluster_file, "--bench-cluster"
        )  # numbers the model can price, or one line naming the field
        label = f"{cluster_file.name}"
    else:
        cluster = job.cluster.model_dump()
        label = "the job's cluster (pass --bench-cluster for the cluster the bench ran on)"
    sets = []
    for p in paths:
        try:
            records = load_records(p)
        except OSError as e:
            raise SpecError(f"--bench: cannot read {p}: {e.strerror}") from None
        except ValueError as e:
            raise SpecError(f"--bench: {e}") from None
        sets.append(BenchSet(str(p), records, cluster, label))
    return sets


def report(
    job_file: JobArg,
    out: Annotated[Path, typer.Option("--out", "-o", metavar="HTML", help="page to write (atomically)")] = Path(
        "report.html"
    ),
    bench: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--bench", metavar="FILE", help="bench JSON from `commtax bench collective --out` (repeat for several)"
        ),
    ] = None,
    bench_cluster: Annotated[
        Optional[Path],
        typer.Option(
            "--bench-cluster",
            metavar="FILE",
            help="cluster YAML the bench ran on, for the model curve (default: the job's cluster)",
        ),
    ] = None,
    trace: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--trace", metavar="FILE", help="profiler trace of one rank (repeat for each rank); needs commtax.trace"
        ),
    ] = None,
    trace_job: TraceJobOpt = None,
    compare: Annotated[
        Optional[list[Path]],
        typer.Option("--compare", metavar="JOB.yaml", help="another job to show side by side (repeat for several)"),
    ] = None,
    plots: Annotated[
        Optional[Path],
        typer.Option(
            "--plots", metavar="DIR", help="also write every figure as SVG and PNG (matplotlib) into this folder"
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=50, metavar="N", help="plans from search to show")] = 5,
    scale: Annotated[
        Optional[str],
        typer.Option(
            "--scale", metavar="N,N,...", help="GPU counts for the scaling chart (default: ¼× to 4× the job's)"
        ),
    ] = None,
    search: Annotated[
        bool,
        search_flag(
            "a plans chart, the best plan at each scale and among the changes (about 10-30 s; the page alone ~1 s)"
        ),
    ] = False,
    catalog: CatalogOpt = None,
) -> None:
    """One self-contained HTML page for a job's plan: summary, step, timeline, scaling, changes (works offline).

    --search adds a plan search, the best plan at each scale and the search's best plan among the changes (the slow
    part: tens of seconds on a busy core); --trace and --bench add their files' analysis."""
    from rich.markup import escape

    from commtax.atomic import refuse_overwriting_inputs, write_atomic
    from commtax.cli.io import EXIT_BAD_INPUT, console, fail, safe_text
    from commtax.report.html import TraceUnavailable, collect, figures, load_trace, render_page
    from commtax.spec import load_job

    refuse_overwriting_inputs(
        {"--out": out}, [job_file, bench_cluster, catalog, *(bench or []), *(trace or []), *(compare or [])]
    )
    if trace_job is not None and not trace:
        raise SpecError("--job: picks one job of the --trace files; give --trace, or drop --job")
    job = load_job(job_file, catalog)
    counts = _counts(scale)
    others = [(p.stem, load_job(p, catalog)) for p in compare or []]
    bench_sets = _bench_sets(list(bench or []), bench_cluster, job)
    per_rank = None
    if trace:
        missing = [str(p) for p in trace if not p.exists()]
        if missing:
            raise SpecError(f"--trace: {missing[0]} does not exist")
        try:
            from commtax.cli.io import warn

            per_rank = load_trace([str(p) for p in trace], job, warn, trace_job)
        except TraceUnavailable as e:
            fail(str(e), EXIT_BAD_INPUT)
    data = collect(
        job,
        job_file.stem,
        top=top,
        scale=counts,
        bench=bench_sets,
        trace=per_rank,
        others=others,
        plan_search=search,
    )
    figs = figures(data)
    write_atomic(out, render_page(data, figs))  # a new page 0666 less the umask; an existing file keeps its mode
    console.print(f"wrote {escape(safe_text(str(out)))} ({len(figs)} figures)", highlight=False)
    if plots is not None:
        from commtax.report.png import write_figures

        written = write_figures(figs, plots)
        console.print(f"wrote {len(written)} files to {escape(safe_text(str(plots)))}/ (SVG and PNG)", highlight=False)
    if not data.breakdown.fits:
        console.print(
            f"note: the plan does not fit GPU memory "
            f"({memory_need(data.breakdown.memory_gib_per_gpu['total'], job.cluster.gpu.mem_GiB)} per GPU); "
            "the page says so"
        )
