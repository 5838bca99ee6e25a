"""Profiler traces as ``commtax trace`` and ``commtax calibrate --trace`` read them: the step range, the jobs among
the files, the one job a YAML (``--against``) or ``--job K`` picks, its comparison with the prediction, and the
hardware profile a trace implies. The CLI reads options, calls one of these and prints (``report.trace_tables``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commtax.errors import SpecError
from commtax.trace.analyze import RankReport, TraceReport, analyze, jobs_of, one_job

ALL_STEPS = 2**62  # ``a:`` runs to the trace's last step


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``a:b`` (inclusive ProfilerStep numbers), ``a:`` or ``:b``, or one step ``a``."""
    if not text:
        return None
    try:
        lo, _, hi = text.partition(":") if ":" in text else (text, ":", text)
        a = int(lo) if lo.strip() else 0
        b = int(hi) if hi.strip() else ALL_STEPS
    except ValueError:
        raise SpecError(f"--steps: expected a:b with ProfilerStep numbers (e.g. 3:7), got {text!r}") from None
    if a > b:
        raise SpecError(f"--steps: the first step ({a}) is after the last ({b})")
    return a, b


@dataclass(frozen=True)
class TracedJob:
    """What a set of traces measured: ``report`` (every rank, or the chosen job's), every job among the files,
    which one was chosen (1-based, or None for all) and, with a job YAML, the comparison with its prediction."""

    report: TraceReport
    every_job: list[list[RankReport]]
    chosen: int | None = None
    comparison: Any = None  # trace.against.Comparison

    def groups(self) -> list[list[RankReport]]:
        """The jobs among the reported ranks: one set of tables each."""
        return jobs_of(self.report.ranks)

    def to_dict(self) -> dict[str, Any]:
        data = self.report.to_dict()
        data["jobs"] = [
            {"world_size": g[0].world_size, "start_s": g[0].start_s, "files": list(dict.fromkeys(r.file for r in g))}
            for g in self.every_job
        ]
        if self.chosen is not None:
            data["job"] = self.chosen  # 1-based, in data["jobs"]
        if self.comparison is not None:
            data["against"] = self.comparison.to_dict()
        return data


def traced_job(
    traces: list[Path],
    steps: str | None = None,
    against: Path | None = None,
    job_k: int | None = None,
    catalog: Path | None = None,
    warn: Callable[[str], None] = lambda line: None,
) -> TracedJob:
    """Analyse ``traces`` (files or folders) over ``steps`` (``a:b``); with ``against`` (a job YAML) or ``job_k``,
    keep one job, and with ``against`` compare it with the job's prediction. ``warn`` hears, as they arise, which
    job was picked and how the traces differ from the YAML's job."""
    report = analyze(traces, parse_steps(steps))
    every_job = jobs_of(report.ranks)
    job = None
    if against is not None:
        from commtax.spec import load_job

        job = load_job(against, catalog)
    chosen, how = None, ""
    if job is not None or job_k is not None:  # without either, every job's tables
        report, chosen, how = one_job(report, job_k, job.cluster.num_gpus if job else None, "--against")
    if how and job_k is None:
        warn(f"--against: comparing {how}; --job K picks another")
    cmp = None
    if job is not None:
        from commtax.trace.against import compare, job_mismatch

        for line in job_mismatch(report, job):  # on stderr too: the figures below may compare two jobs
            warn(f"--against: {line}")
        cmp = compare(report, job)
    return TracedJob(report, every_job, chosen, cmp)


def calibrate_from_trace(
    traces: list[Path], job_file: Path | None, out: Path, steps: str | None = None, catalog: Path | None = None
) -> dict:
    """``commtax calibrate --trace …``: write the profile YAML a trace implies (needs the job that ran); return it."""
    from commtax.measure.calibrate import write_profile
    from commtax.spec import load_job
    from commtax.trace.against import profile_from_trace

    if job_file is None:
        raise SpecError(
            "--job: calibrating from a trace needs the job YAML that ran (its model gives the FLOPs, "
            "its cluster the topology)"
        )
    job = load_job(job_file, catalog)
    report = analyze(traces, parse_steps(steps))
    profile = profile_from_trace(report, job, f"commtax calibrate --trace {', '.join(p.name for p in traces)}")
    write_profile(profile, out)
    return profile
