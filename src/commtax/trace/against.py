"""Predicted vs measured: a trace's figures next to ``commtax estimate`` for the same job, and the
hardware profile a trace implies (``commtax calibrate --trace``).

Measured figures are per step (the mean over the trace's ``ProfilerStep#N`` windows, averaged over
ranks); predicted ones are the estimate's ``Breakdown`` of one step. Collectives are matched to the
plan's process groups by their group size (and send/recv to the pipeline), then compared with what
``commtax collective`` predicts for that message size on that group's placement.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from commtax.costs.collectives import OPS, collective_cost
from commtax.costs.topology import GROUPS, group_placement, layout, placement
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import Breakdown, make_breakdown
from commtax.spec import Job
from commtax.trace.analyze import RankReport, TraceReport
from commtax.units import GB, MB


@dataclass
class Row:
    metric: str
    measured: float | None
    predicted: float | None

    @property
    def ratio(self) -> float | None:
        if self.measured is None or self.predicted is None or self.predicted <= 0:
            return None
        return self.measured / self.predicted


@dataclass
class CollectiveRow:
    kind: str
    group: str  # the plan's group it was matched to ("?" when none matches)
    group_size: int
    message_bytes: float
    count: int
    measured_time_s: float
    predicted_time_s: float
    measured_busbw_GBps: float | None
    predicted_busbw_GBps: float | None
    calls_per_step: float = 0.0

    @property
    def busbw_ratio(self) -> float | None:
        if self.measured_busbw_GBps is None or not self.predicted_busbw_GBps:
            return None
        return self.measured_busbw_GBps / self.predicted_busbw_GBps


@dataclass
class Comparison:
    rows: list[Row]
    collectives: list[CollectiveRow]
    explanations: list[str]
    predicted: Breakdown
    measured: Breakdown | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [{**asdict(r), "ratio": r.ratio} for r in self.rows],
            "collectives": [{**asdict(c), "busbw_ratio": c.busbw_ratio} for c in self.collectives],
            "explanations": list(self.explanations),
            "predicted": self.predicted.to_dict(),
            "measured": self.measured.to_dict() if self.measured is not None else None,
            "notes": list(self.notes),
        }


def per_step(r: RankReport, name: str) -> float:
    """A rank's figure per step: the mean over its steps, or the whole trace when it has none."""
    return statistics.fmean(getattr(s, name) for s in r.steps) if r.steps else getattr(r, name)


def steps_in(r: RankReport) -> int:
    return max(1, len(r.steps))


def group_of(job: Job, kind: str, group_size: int | None) -> str:
    """The plan's process group a measured collective ran on (``?`` when the sizes do not say)."""
    if kind == "all_to_all":  # MoE dispatch and combine (NCCL AllToAll/SendRecv, DeepEP): expert parallel
        return "ep"
    if kind == "send_recv":
        return "pp" if job.plan.pp > 1 else "?"
    sizes = layout(job).size
    matches = [g for g in ("tp", "cp", "dp") if sizes[g] == group_size and sizes[g] > 1]
    if not matches and group_size is None:
        multi = [g for g in ("tp", "cp", "dp") if sizes[g] > 1]
        matches = multi if len(multi) == 1 else []
    if len(matches) == 1:
        return matches[0]
    # tp and dp of the same size: reductions of whole gradients are DP, the rest TP
    if matches and "dp" in matches and kind in ("all_reduce", "reduce_scatter"):
        return "dp"
    return matches[0] if matches else "?"


def _predicted_collective(job: Job, group: str, kind: str, n: int, nbytes: float):
    if kind not in OPS:
        return None
    if group in GROUPS and group != "pp" and layout(job).size[group] == n:
        place = group_placement(job, group, kind)
    elif group == "pp":
        place = group_placement(job, "pp", kind)
    else:
        place = placement(job.cluster, n, 1, kind)
    return collective_cost(kind, nbytes, place)


def collective_rows(job: Job, ranks: list[RankReport]) -> list[CollectiveRow]:
    out = []
    for r in ranks:
        for c in r.collectives:
            n = c.group_size or (2 if c.kind == "send_recv" else None)
            if c.message_bytes is None or n is None or n < 2:
                continue
            group = group_of(job, c.kind, c.group_size)
            cost = _predicted_collective(job, group, c.kind, n, c.message_bytes)
            if cost is None:
                continue
            out.append(
                CollectiveRow(
                    c.kind,
                    group,
                    n,
                    c.message_bytes,
                    c.count,
                    c.mean_time_s,
                    cost.time_s,
                    c.busbw_GBps if c.busbw_GBps is not None else c.algbw_GBps,
                    cost.busbw_bytes_per_s / GB,
                    c.count / steps_in(r),
                )
            )
    return out


def measured_exposed_by_group(job: Job, r: RankReport) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in r.collectives:
        g = group_of(job, c.kind, c.group_size)
        out[g] = out.get(g, 0.0) + c.exposed_s / steps_in(r)
    return out


def _gpu_family(gpu_id: str) -> str:
    """The model token of a catalog GPU id ("a100-sxm4-40gb" -> "a100"; "rtx-4090-24gb" -> "4090")."""
    parts = [p for p in gpu_id.lower().split("-") if p not in ("rtx", "nvidia", "amd", "instinct")]
    return parts[0] if parts else gpu_id.lower()


def job_mismatch(report: TraceReport, job: Job) -> list[str]:
    """Why the trace may not be of ``job``: a world size other than num_gpus, devices other than its GPU."""
    out = []
    worlds = {r.world_size for r in report.ranks if r.world_size is not None}
    if worlds and worlds != {job.cluster.num_gpus}:
        out.append(
            f"the trace's world size ({', '.join(map(str, sorted(worlds)))}) is not the job's num_gpus "
            f"({job.cluster.num_gpus}): is this the job that ran?"
        )
    family = "" if job.cluster.gpu.name == "custom-gpu" else _gpu_family(job.cluster.gpu.name)
    names = {r.device_name for r in report.ranks if r.device_name and r.device.startswith("gpu")}
    if family and names and not any(family in n.lower() for n in names):
        out.append(
            f"the trace ran on {', '.join(sorted(names))}, not the job's {job.cluster.gpu.name}: "
            "is this the job that ran?"
        )
    return out


def compare(report: TraceReport, job: Job) -> Comparison:
    """Measured (mean over ranks, per step) vs the estimate of ``job``, and the largest gaps in words."""
    b = estimate(job)
    ranks = report.ranks
    mean = lambda name: statistics.fmean(per_step(r, name) for r in ranks)
    exposed = {
        g: statistics.fmean(measured_exposed_by_group(job, r).get(g, 0.0) for r in ranks)
        for g in ("tp", "cp", "pp", "dp", "ep", "?")
    }
    rows = [
        Row("step_time_s", statistics.fmean(r.step_time_s for r in ranks), b.step_time_s),
        Row("compute_s", mean("compute_s"), predicted_compute_s(b)),
        Row("comm_s", mean("comm_s"), sum(b.comm_time_s.values())),
    ]
    for g in ("tp", "cp", "pp", "dp", "ep"):  # ep: the MoE all-to-alls (a dense estimate has no ep_exposed: 0)
        predicted = b.breakdown_s.get(f"{g}_exposed", 0.0)
        if exposed[g] > 0 or predicted > 0:
            rows.append(Row(f"{g}_exposed_s", exposed[g], predicted))
    rows += [
        Row("exposed_comm_s", mean("exposed_comm_s"), sum(b.breakdown_s[f"{g}_exposed"] for g in GROUPS)),
        Row("idle_s", mean("idle_s"), None),
        Row("comm_tax", mean("comm_tax"), b.comm_tax),
        Row("comm_share", mean("comm_share"), b.comm_share),
    ]
    colls = collective_rows(job, ranks)
    notes = job_mismatch(report, job)
    if exposed["?"] > 0:
        notes.append(
            f"{exposed['?'] * 1e3:.2f} ms of exposed communication per step ran on groups the plan "
            "does not name (sizes do not match tp/cp/dp)"
        )
    measured = measured_breakdown(report, job)
    rows.insert(3, Row("mfu", measured.mfu, b.mfu))
    return Comparison(rows, colls, explain(rows, colls), b, measured, notes)


def measured_breakdown(report: TraceReport, job: Job) -> Breakdown:
    """The trace as a ``Breakdown`` (source "trace"), field by field comparable with ``estimate``'s.

    Per step, mean over ranks: compute = every non-communication kernel (the optimizer's included, so
    ``optimizer`` is 0), exposed communication per process group, and the GPU's idle time under an
    extra ``idle`` key (so the parts still add up to the step); MFU from the job's model FLOPs over the
    measured step. Memory is the prediction's: a trace of kernels does not measure it.
    """
    from commtax.workload.memory import memory
    from commtax.workload.step import build_workload

    ranks = report.ranks
    mean = lambda name: statistics.fmean(per_step(r, name) for r in ranks)
    groups = (*GROUPS, "ep")  # ep: the all-to-alls (MoE dispatch/combine)
    exposed = {g: statistics.fmean(measured_exposed_by_group(job, r).get(g, 0.0) for r in ranks) for g in groups}
    compute, idle = mean("compute_s"), mean("idle_s")
    parts = {
        "compute": compute,
        "recompute": 0.0,
        "tp_exposed": exposed["tp"],
        "cp_exposed": exposed["cp"],
        "pp_bubble": 0.0,
        "pp_exposed": exposed["pp"],
        "dp_exposed": exposed["dp"],
        "optimizer": 0.0,
    }
    has_ep = any(c.kind == "all_to_all" for r in ranks for c in r.collectives)
    if has_ep:  # an MoE job's Breakdown has ep_exposed (schedule.breakdown.MOE_KEYS); a dense one has not
        parts["ep_exposed"] = exposed["ep"]
    # what the step holds beyond compute and exposed communication on known groups: idle, memcpy, unmatched comm
    parts["idle"] = max(0.0, statistics.fmean(r.step_time_s for r in ranks) - sum(parts.values()))
    link = {g: 0.0 for g in groups if g != "ep" or has_ep}
    nbytes = {g: 0.0 for g in link}
    for r in ranks:
        for c in r.collectives:
            g = group_of(job, c.kind, c.group_size)
            if g in link:
                link[g] += c.time_s / steps_in(r) / len(ranks)
                nbytes[g] += (c.message_bytes or 0.0) * c.count / steps_in(r) / len(ranks)
    mem = memory(job)
    notes = [
        f"measured from {len(ranks)} rank(s), mean per step; idle {idle * 1e3:.3g} ms per step; "
        "comm_time_s is the summed kernel time per group; memory is the prediction's"
    ]
    return make_breakdown(
        job,
        build_workload(job),
        parts,
        link,
        nbytes,
        mem.gib(),
        mem.total <= job.cluster.gpu.mem_bytes,
        source="trace",
        notes=notes,
    )


def predicted_compute_s(b: Breakdown) -> float:
    """What a trace counts as compute: every kernel that is not communication, so the optimizer's too."""
    return b.breakdown_s["compute"] + b.breakdown_s["recompute"] + b.breakdown_s["optimizer"]


def explain(rows: list[Row], colls: list[CollectiveRow], top: int = 4) -> list[str]:
    """The largest measured/predicted gaps in words, largest first by the seconds per step they account for."""
    items: list[tuple[float, str]] = []
    for r in rows:
        if r.ratio is None or not r.metric.endswith("_s") or r.metric == "step_time_s" or not r.measured:
            continue  # ratios (comm tax, share, MFU) are in the table as percentages, not times
        what = r.metric.removesuffix("_s").replace("_", " ")
        text = (
            f"{what} took {r.ratio:.3g}× the predicted time ({r.measured * 1e3:.3g} ms measured, "
            f"{r.predicted * 1e3:.3g} ms predicted per step)"
        )
        items.append((abs(r.measured - r.predicted), text))
    for c in colls:
        if c.busbw_ratio is None or c.busbw_ratio <= 0:
            continue
        text = (
            f"{c.kind} of {c.message_bytes / MB:.3g} MB over {c.group_size} ranks ({c.group}) reached "
            f"{100 * c.busbw_ratio:.0f}% of the predicted busbw ({c.measured_busbw_GBps:.3g} vs "
            f"{c.predicted_busbw_GBps:.3g} GB/s; a kernel's time includes waiting for late peers)"
        )
        items.append((abs(c.measured_time_s - c.predicted_time_s) * c.calls_per_step, text))
    items.sort(key=lambda x: -x[0])
    return [text for _, text in items[:top]]


# ----------------------------------------------------------------------------- calibrate --trace
MAX_SLOWER_THAN_LINK = 10.0  # a trace's link fit this far under the job's link is waiting, not the wire
MAX_COMPUTE_MISFIT = 2.0  # compute still this far off at the efficiency bound: the job is not what ran


def calibration_records(report: TraceReport, job: Job) -> list[dict]:
    """One bench-style record per measured collective size and group (``commtax.measure.calibrate`` reads them)."""
    c = job.cluster
    out = []
    for r in report.ranks:
        for s in r.collectives:
            n = s.group_size or (2 if s.kind == "send_recv" else None)
            if s.message_bytes is None or n is None or n < 2 or s.kind not in OPS:
                continue
            per_node = min(n, c.gpus_per_node)
            out.append(
                {
                    "op": s.kind,
                    "impl": "torch",
                    "message_bytes": s.message_bytes,
                    "world_size": n,
                    "ranks_per_node": per_node,
                    "nodes": math.ceil(n / per_node),
                    # the fastest call: kernel time includes waiting for peers, which is not the wire's
                    "time_s": s.min_time_s or s.mean_time_s,
                    "backend": c.collective_library,
                    "count": s.count,
                }
            )
    return out


def compute_efficiency(report: TraceReport, job: Job, rounds: int = 8) -> tuple[float, float, float]:
    """(GEMM efficiency, measured compute s, predicted compute s) that makes estimate's compute match the trace.

    Only GEMM time scales with the efficiency (memory-bound ops do not), so the efficiency is found by a
    few fixed-point rounds of η ← η · predicted / measured, within (0, 1].
    """
    from commtax.spec import Profile

    measured = statistics.fmean(per_step(r, "compute_s") for r in report.ranks)
    precision = job.training.precision
    eff = job.cluster.gpu.matmul_eff(precision)
    predicted = float("nan")
    for _ in range(rounds):
        prof = {"source": "trace", "levels": {}, "gemm_efficiency": {precision: eff}}
        trial = job.model_copy(update={"cluster": job.cluster.model_copy(update={"profile": Profile(**prof)})})
        b = estimate(trial)
        predicted = predicted_compute_s(b)
        if measured <= 0 or predicted <= 0:
            break
        eff = min(1.0, max(1e-6, eff * predicted / measured))
    return eff, measured, predicted


def profile_from_trace(report: TraceReport, job: Job, source: str) -> dict:
    """The hardware profile (``spec.Profile`` schema) a trace implies: GEMM efficiency and link α/β fits."""
    from commtax.errors import SpecError
    from commtax.measure.calibrate import calibrate, check_profile, levels_from_cluster

    mismatch = job_mismatch(report, job)
    if mismatch:  # a profile fitted to another job's trace would poison every estimate that reads it
        raise SpecError(f"--job: {mismatch[0].replace(': is this the job that ran?', '')}; give the job that ran")
    cluster = job.cluster.model_dump(exclude={"profile", "emulated"})
    records = calibration_records(report, job)
    profile = calibrate(records, cluster, None, source=source)
    for name, link in zip(("intra", "inter"), levels_from_cluster(cluster)):
        fitted = profile["levels"][name]["bw_GBps"] * GB
        if name in profile["residuals"]["levels"] and fitted < link.bw_bytes_per_s / MAX_SLOWER_THAN_LINK:
            raise SpecError(
                f"--trace: the {name} link fits at {fitted / GB:.3g} GB/s, under 1/{MAX_SLOWER_THAN_LINK:g} of the "
                f"job's {link.bw_bytes_per_s / GB:.3g} GB/s: the kernels' durations include waiting for peers or "
                "compute, not only the wire; fit links with `commtax bench collective` and `commtax calibrate`"
            )
    eff, measured, predicted = compute_efficiency(report, job)
    if not (math.isfinite(measured) and measured > 0):
        raise SpecError("--trace: the trace has no measurable compute per step; nothing to calibrate against")
    if not 1 / MAX_COMPUTE_MISFIT <= predicted / measured <= MAX_COMPUTE_MISFIT:
        raise SpecError(
            f"--job: predicted compute stays {predicted * 1e3:.3g} ms per step against {measured * 1e3:.3g} ms "
            f"measured at GEMM efficiency {eff:.3g} (the bound is 1): the job's GPU entry (peak_tflops, "
            "mem_bw_GBps, sms) or model does not describe what ran; fix the job, or give the job that ran"
        )
    profile["gemm_efficiency"] = {job.training.precision: round(eff, 6)}
    if abs(predicted / measured - 1) > 0.02:
        profile["compute_fit"] = (
            f"predicted compute stays {predicted * 1e3:.3g} ms per step against "
            f"{measured * 1e3:.3g} ms measured at GEMM efficiency {eff:.3g}: the GPU entry's "
            "peak_tflops, mem_bw_GBps or sms do not describe this device"
        )
    profile["measured_compute_s_per_step"] = round(measured, 9)
    profile["measured_busbw"] = [
        {
            "op": r["op"],
            "group_size": r["world_size"],
            "message_bytes": r["message_bytes"],
            "calls": r["count"],
            "time_s": round(r["time_s"], 9),
            "busbw_GBps": round(r["message_bytes"] / r["time_s"] / GB * _bus(r["op"], r["world_size"]), 6),
        }
        for r in records
        if r["time_s"] > 0
    ]
    return check_profile(profile, "--trace")


def _bus(op: str, n: int) -> float:
    from commtax.costs.collectives import bus_factor

    return bus_factor(op, n)
