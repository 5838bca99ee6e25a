"""The Breakdown: one step, predicted, simulated or measured, in one record; MFU, comm tax and share defined once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from commtax.schedule.interval import throughput_bounds
from commtax.spec import Job
from commtax.units import SECONDS_PER_DAY, TFLOPS
from commtax.workload.step import (
    Workload,
)

BREAKDOWN_KEYS = (
    "compute",
    "recompute",
    "tp_exposed",
    "cp_exposed",
    "pp_bubble",
    "pp_exposed",
    "dp_exposed",
    "optimizer",
)
# parts only MoE jobs have (after cp_exposed): dense outputs keep BREAKDOWN_KEYS alone
MOE_KEYS = ("ep_exposed",)


def part_keys(b: Breakdown) -> tuple[str, ...]:
    """The parts of a Breakdown in display order (MoE jobs: the exposed EP all-to-all after exposed CP)."""
    if "ep_exposed" not in b.breakdown_s:
        return BREAKDOWN_KEYS
    return (*BREAKDOWN_KEYS[:4], *MOE_KEYS, *BREAKDOWN_KEYS[4:])


@dataclass
class Breakdown:
    """One step, predicted, simulated or measured: the same record, comparable field by field."""

    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    comm_tax: float
    comm_share: float
    breakdown_s: dict[str, float]
    comm_bytes_per_gpu: dict[str, float]
    comm_time_s: dict[str, float]
    memory_gib_per_gpu: dict[str, float]
    fits: bool
    days_to_train: float | None = None
    source: str = "estimate"
    notes: list[str] = field(default_factory=list)
    # the 80% interval (schedule.interval: validation residuals by regime); None where no table applies.
    # p10 of the step time is the fast end: it goes with the p90 of throughput
    step_time_s_p10: float | None = None
    step_time_s_p90: float | None = None
    tokens_per_s_per_gpu_p10: float | None = None
    tokens_per_s_per_gpu_p90: float | None = None
    pools: list[dict[str, Any]] | None = None  # a cluster of GPU pools: what each pool does (schedule/pools.py)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in INTERVAL_KEYS:
            if d[k] is None:
                del d[k]
        if d["pools"] is None:  # single-pool records read as they always have
            del d["pools"]
        return d

    def with_interval(self, tps_p10: float, tps_p90: float) -> Breakdown:
        """This record with the 80% interval of a throughput interval (step time is its inverse)."""
        self.tokens_per_s_per_gpu_p10, self.tokens_per_s_per_gpu_p90 = tps_p10, tps_p90
        self.step_time_s_p10 = self.step_time_s * self.tokens_per_s_per_gpu / tps_p90
        self.step_time_s_p90 = self.step_time_s * self.tokens_per_s_per_gpu / tps_p10
        return self


INTERVAL_KEYS = ("step_time_s_p10", "step_time_s_p90", "tokens_per_s_per_gpu_p10", "tokens_per_s_per_gpu_p90")


def within_each_other(a: Breakdown, b: Breakdown) -> bool:
    """Each central step time lies inside the other's 80% interval: the model cannot tell the two apart."""
    if a.step_time_s_p10 is None or b.step_time_s_p10 is None:
        return False
    return (b.step_time_s_p10 <= a.step_time_s <= b.step_time_s_p90) and (
        a.step_time_s_p10 <= b.step_time_s <= a.step_time_s_p90
    )


def fmt_step_interval(b: Breakdown, digits: int = 2) -> str:
    """\"1.87 s (1.71–2.05)\": the central step time and its 80% interval."""
    central = f"{b.step_time_s:.{digits}f} s"
    if b.step_time_s_p10 is None:
        return central
    return f"{central} ({b.step_time_s_p10:.{digits}f}–{b.step_time_s_p90:.{digits}f})"


def model_flops_per_gpu_step(job: Job, wl: Workload) -> float:
    return wl.model_flop_per_step / job.cluster.num_gpus


def recompute_model_flops(job: Job, wl: Workload) -> float:
    """Extra model FLOPs of recomputation, whole step (Narayanan 2021 eq. 3's fourth forward)."""
    mode = job.plan.recompute
    if mode == "none":
        return 0.0
    m, tr = job.model, job.training
    tokens = tr.global_batch * tr.seq_len
    if mode == "full":
        head = 2 * m.hidden * m.vocab
        return (wl.model_flop_per_step / 3) - head * tokens
    return 4 * tr.seq_len * m.hidden * m.layers * tokens  # attention scores + context, forward once more


def make_breakdown(
    job: Job,
    wl: Workload,
    parts: dict[str, float],
    comm_time: dict[str, float],
    comm_bytes: dict[str, float],
    memory_gib: dict[str, float],
    fits: bool,
    source: str = "estimate",
    notes: list[str] | None = None,
) -> Breakdown:
    """The Breakdown record from the step's parts: the derived rates, shares and MFU are defined once, here.

    Used by the analytical schedule and by the event simulator (``commtax.schedule.sim``), so the two agree
    on every definition (DESIGN.md): comm tax = exposed / step, comm share = comm / (comm + compute).
    """
    step = sum(parts.values())
    exposed = parts["tp_exposed"] + parts["cp_exposed"] + parts["pp_exposed"] + parts["dp_exposed"]
    if "ep_exposed" in parts:
        exposed += parts["ep_exposed"]
    total_comm = sum(comm_time.values())
    busy = parts["compute"] + parts["recompute"]
    tr, c = job.training, job.cluster
    peak = c.gpu.peak_flops(tr.precision)
    model_flops = model_flops_per_gpu_step(job, wl) / step
    hw_flops = model_flops + recompute_model_flops(job, wl) / c.num_gpus / step
    tokens_per_s = tr.global_batch * tr.seq_len / step
    b = Breakdown(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / c.num_gpus,
        tflops_per_gpu=model_flops / TFLOPS,
        mfu=model_flops / peak,
        hfu=hw_flops / peak,
        comm_tax=exposed / step,
        comm_share=total_comm / (total_comm + busy) if total_comm + busy > 0 else 0.0,
        breakdown_s=dict(parts),
        comm_bytes_per_gpu=dict(comm_bytes),
        comm_time_s=dict(comm_time),
        memory_gib_per_gpu=dict(memory_gib),
        fits=fits,
        days_to_train=(tr.tokens / tokens_per_s / SECONDS_PER_DAY) if tr.tokens else None,
        source=source,
        notes=list(notes or []),
    )
    # a prediction (analytical or simulated) carries the 80% interval of the validation residuals of its regime
    bounds = throughput_bounds(job, b.tokens_per_s_per_gpu) if source in ("estimate", "simulate") else None
    return b.with_interval(*bounds) if bounds else b
