"""A job simulated as ``commtax simulate`` runs it: the bucket size, the explanation of how the simulation differs
from the estimate, and the timeline written as a Chrome trace or a Gantt chart. The CLI reads options, calls
:func:`simulate_file`, prints the breakdown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from commtax.errors import SpecError
from commtax.schedule.breakdown import Breakdown
from commtax.spec import Job, load_job
from commtax.units import MiB

T = TypeVar("T")
GANTT_SUFFIXES = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class SimulatedJob:
    job: Job
    breakdown: Breakdown  # its notes name the files written


def check_outputs(bucket_mb: float | None, trace: Path | None, gantt: Path | None, out: Path | None) -> None:
    """Refuse, before simulating, a bucket that is not positive and a file that could not be written."""
    if bucket_mb is not None and not bucket_mb > 0:
        raise SpecError(f"--bucket-mb must be > 0 MiB, got {bucket_mb}")
    for path in (trace, gantt, out):
        if path is not None and not path.resolve().parent.is_dir():
            raise SpecError(f"{path}: directory {path.resolve().parent} does not exist")
    if gantt is not None and gantt.suffix.lower() not in GANTT_SUFFIXES:
        raise SpecError(f"--gantt {gantt}: the suffix names the format; use .png, .svg or .pdf")


def simulate_file(
    job_file: Path,
    catalog: Path | None = None,
    *,
    bucket_mb: float | None = None,
    explain: bool = False,
    trace: Path | None = None,
    gantt: Path | None = None,
    out: Path | None = None,
) -> SimulatedJob:
    """Simulate one step of ``job_file``'s job (gradient buckets of ``bucket_mb`` MiB, default the framework's);
    with ``explain``, notes on why it differs from the estimate; ``trace``/``gantt``: the timeline written there.
    ``out`` is only checked (the caller writes the record there)."""
    from commtax.schedule.sim.events import SimError
    from commtax.schedule.sim.simulate import simulate
    from commtax.schedule.sim.step import SimOptions
    from commtax.workload.step import grad_bucket_bytes

    check_outputs(bucket_mb, trace, gantt, out)
    job = load_job(job_file, catalog)
    try:
        bucket = grad_bucket_bytes(job) if bucket_mb is None else bucket_mb * MiB
        result = simulate(job, SimOptions(bucket_bytes=bucket))
    except SimError as e:
        raise SpecError(str(e)) from None
    bd = result.breakdown
    if explain:
        from commtax.schedule.sim.explain import explain as why

        bd.notes.extend(why(result))
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
    return SimulatedJob(job, bd)


def _write(path: Path, write: Callable[[], T]) -> T:
    try:
        return write()
    except OSError as e:
        raise SpecError(f"cannot write {path}: {e.strerror}") from None
