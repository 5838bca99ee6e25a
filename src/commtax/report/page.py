"""The HTML page of ``commtax report``, from the files the command names: the job, others to compare, bench
records and the cluster they ran on, profiler traces. The CLI reads options, calls :func:`build_page`, writes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commtax.errors import SpecError
from commtax.report.html import BenchSet, ReportData, TraceUnavailable, collect, figures, load_trace, render_page
from commtax.spec import Job, load_job
from commtax.units import memory_need


def scale_counts(text: str | None) -> list[int] | None:
    """``--scale 64,128,256``: the GPU counts of the scaling chart, sorted, each once."""
    if text is None:
        return None
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecError(f"--scale: expected GPU counts like 64,128,256, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise SpecError(f"--scale: expected positive GPU counts, got {text!r}")
    return counts


def bench_sets(paths: list[Path], cluster_file: Path | None, job: Job) -> list[BenchSet]:
    """Each ``--bench`` file's records, drawn against the cluster they ran on (``--bench-cluster``, or the job's)."""
    from commtax.measure.cluster import load_cluster_file
    from commtax.measure.results import load_records

    if cluster_file is not None:
        from commtax.measure.calibrate import check_cluster

        cluster = _read("--bench-cluster", cluster_file, load_cluster_file)
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
        sets.append(BenchSet(str(p), _read("--bench", p, load_records), cluster, label))
    return sets


def _read(flag: str, path: Path, load: Callable[[Path], Any]) -> Any:
    """``load(path)``, its failures as one line naming the flag."""
    try:
        return load(path)
    except OSError as e:
        raise SpecError(f"{flag}: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise SpecError(f"{flag}: {e}") from None


@dataclass(frozen=True)
class Page:
    """The page's data, its figures and its HTML."""

    job: Job
    data: ReportData
    figs: list
    html: str

    def fit_note(self) -> str | None:
        """A plan that does not fit memory still gets its page, which says so: the line that says it here."""
        b = self.data.breakdown
        if b.fits:
            return None
        return (
            f"note: the plan does not fit GPU memory "
            f"({memory_need(b.memory_gib_per_gpu['total'], self.job.cluster.gpu.mem_GiB)} per GPU); "
            "the page says so"
        )


def build_page(
    job_file: Path,
    *,
    bench: list[Path] = (),
    bench_cluster: Path | None = None,
    trace: list[Path] = (),
    trace_job: int | None = None,
    compare: list[Path] = (),
    top: int = 5,
    scale: str | None = None,
    plan_search: bool = False,
    catalog: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> Page:
    """The page for ``job_file``'s plan; ``warn`` hears why a trace may be of another job."""
    if trace_job is not None and not trace:
        raise SpecError("--job: picks one job of the --trace files; give --trace, or drop --job")
    job = load_job(job_file, catalog)
    counts = scale_counts(scale)
    others = [(p.stem, load_job(p, catalog)) for p in compare]
    sets = bench_sets(list(bench), bench_cluster, job)
    per_rank = None
    if trace:
        missing = [str(p) for p in trace if not p.exists()]
        if missing:
            raise SpecError(f"--trace: {missing[0]} does not exist")
        try:
            per_rank = load_trace([str(p) for p in trace], job, warn, trace_job)
        except TraceUnavailable as e:
            raise SpecError(str(e)) from None
    data = collect(
        job, job_file.stem, top=top, scale=counts, bench=sets, trace=per_rank, others=others, plan_search=plan_search
    )
    figs = figures(data)
    return Page(job, data, figs, render_page(data, figs))
