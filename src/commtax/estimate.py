"""Analytical schedule: workload ops + costs -> one ``Breakdown`` of a training step.

step time = compute + recompute + exposed TP + exposed CP + pipeline bubble + exposed PP
            + exposed DP + optimizer                                              (DESIGN.md)

Pipeline (Narayanan et al. 2021, §2.2): with m micro-batches, p stages, v virtual stages,
step ≈ m·T_max + (p−1)/v·T_avg, where T is one micro-batch's forward+backward on a stage;
for uniform stages the bubble fraction is (p−1)/(v·m) of the ideal time (1F1B and GPipe alike).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from commtax.collectives import bus_factor, collective_cost
from commtax.compute import ComputeModel, compute_model, op_time, overlap_slowdown_s
from commtax.memory import memory
from commtax.spec import Job
from commtax.topology import group_placement
from commtax.units import SECONDS_PER_DAY, TFLOPS
from commtax.workload import Collective, Compute, Phase, Workload, build_workload

BREAKDOWN_KEYS = ("compute", "recompute", "tp_exposed", "cp_exposed", "pp_bubble", "pp_exposed", "dp_exposed", "optimizer")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PhaseCost:
    """Time of one pass over one block: compute, and per-group communication (link time)."""

    compute: float = 0.0
    gemm: float = 0.0  # the part of compute that TP communication can hide under (comm-GEMM overlap)
    attention: float = 0.0  # the part that ring-attention K/V exchange hides under
    comm: dict[str, float] = field(default_factory=dict)
    comm_bytes: dict[str, float] = field(default_factory=dict)

    def __add__(self, o: "PhaseCost") -> "PhaseCost":
        if not (o.compute or o.comm):
            return self
        comm, nbytes = dict(self.comm), dict(self.comm_bytes)
        for k, v in o.comm.items():
            comm[k] = comm.get(k, 0.0) + v
        for k, v in o.comm_bytes.items():
            nbytes[k] = nbytes.get(k, 0.0) + v
        return PhaseCost(self.compute + o.compute, self.gemm + o.gemm, self.attention + o.attention, comm, nbytes)

    def scaled(self, x: float) -> "PhaseCost":
        return PhaseCost(
            self.compute * x,
            self.gemm * x,
            self.attention * x,
            {k: v * x for k, v in self.comm.items()},
            {k: v * x for k, v in self.comm_bytes.items()},
        )


# Both are pure functions of frozen (hashable) values: searches and sweeps re-ask the same questions.
_cached_collective_cost = functools.lru_cache(maxsize=1 << 16)(collective_cost)
_cached_op_time = functools.lru_cache(maxsize=1 << 16)(op_time)


class Costs:
    """Op costs of one job: compute by roofline, collectives by α-β on each group's placement."""

    def __init__(self, job: Job):
        self.job = job
        self.cm: ComputeModel = compute_model(job.cluster, job.training.precision)
        self._placements: dict[tuple[str, str], Any] = {}
        self._times: dict[tuple[str, str, float], float] = {}
        self._phases: dict[int, tuple[Phase, PhaseCost]] = {}

    def collective(self, c: Collective) -> float:
        return self.collective_time(c.group, c.op, c.bytes)

    def collective_time(self, group: str, op: str, nbytes: float) -> float:
        key = (group, op, nbytes)
        t = self._times.get(key)
        if t is None:
            pkey = (group, op)
            if pkey not in self._placements:
                self._placements[pkey] = group_placement(self.job, group, op)
            t = self._times[key] = _cached_collective_cost(op, nbytes, self._placements[pkey]).time_s
        return t

    def sent_bytes(self, c: Collective) -> float:
        """Bytes one GPU puts on the wire: message × bus factor (nccl-tests)."""
        key = (c.group, c.op)
        if key not in self._placements:
            self._placements[key] = group_placement(self.job, c.group, c.op)
        return c.bytes * bus_factor(c.op, self._placements[key].n)

    def compute(self, op: Compute) -> float:
        return _cached_op_time(self.cm, op)

    def phase(self, ph: Phase) -> PhaseCost:
        hit = self._phases.get(id(ph))
        if hit is not None and hit[0] is ph:  # the same layer block is shared by every stage
            return hit[1]
        cost = self._phase(ph)
        self._phases[id(ph)] = (ph, cost)
        return cost

    def _phase(self, ph: Phase) -> PhaseCost:
        compute = gemm = attention = 0.0
        comm: dict[str, float] = {}
        nbytes: dict[str, float] = {}
        for op in ph.ops:
            if isinstance(op, Compute):
                t = self.compute(op)
                compute += t
                if op.kind == "gemm":
                    gemm += t
                elif op.kind == "attention":
                    attention += t
            else:
                comm[op.group] = comm.get(op.group, 0.0) + self.collective(op)
                nbytes[op.group] = nbytes.get(op.group, 0.0) + self.sent_bytes(op)
        return PhaseCost(compute, gemm, attention, comm, nbytes)


@dataclass(frozen=True)
class StageTime:
    """One micro-batch (fwd + bwd + recompute) on one pipeline rank, split as the Breakdown splits it."""

    compute: float
    recompute: float
    tp_exposed: float
    cp_exposed: float
    fwd: float  # forward wall time (for overlap windows)
    bwd: float  # backward + recompute wall time
    link: PhaseCost  # link time and bytes, all passes

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_exposed + self.cp_exposed


def _exposed(job: Job, pc: PhaseCost, cm: ComputeModel | None = None) -> tuple[float, float]:
    """Exposed TP and CP time of a pass: all of it, or what the GEMMs / attention cannot hide.

    Comm-GEMM overlap (Transformer Engine userbuffers, Wang et al. 2022 "Overlap communication with
    dependent computation via decomposition") splits each GEMM into tp chunks: the first chunk's
    transfer cannot hide, so at least 1/tp of the TP traffic stays exposed. Ring attention likewise
    exposes its first K/V step (1/cp). With ``cm``, the hidden part also slows the compute it runs
    under (``overlap_contention``), charged as exposed time of that group.
    """
    ov, p = job.plan.overlap, job.plan
    tp, cp = pc.comm.get("tp", 0.0), pc.comm.get("cp", 0.0)
    tp_exp = max(tp - pc.gemm, first_chunk(tp, p.tp)) if ov.tp else tp
    cp_exp = max(cp - pc.attention, first_chunk(cp, p.cp)) if ov.cp else cp
    if cm is not None and (tp_exp < tp or cp_exp < cp):  # some TP/CP traffic is hidden
        tp_c, cp_c = overlap_contention(cm, pc, tp - tp_exp, cp - cp_exp)
        tp_exp, cp_exp = tp_exp + tp_c, cp_exp + cp_c
    return tp_exp, cp_exp


def overlap_contention(cm: ComputeModel, pc: PhaseCost, tp_hidden_s: float, cp_hidden_s: float) -> tuple[float, float]:
    """Extra compute seconds of a pass from TP and CP traffic hidden under its GEMMs / attention.

    TP overlap is Transformer Engine userbuffers (its own ``userbuffers_sms``), ring attention's K/V exchange is
    NCCL p2p (``nccl_sms``); both hide under compute-bound kernels (memory share 0): ``overlap_slowdown_s``.
    """
    return (_hidden_cost(cm, tp_hidden_s, pc.comm.get("tp", 0.0), pc.comm_bytes.get("tp", 0.0), 0.0, cm.userbuffers_sms),
            _hidden_cost(cm, cp_hidden_s, pc.comm.get("cp", 0.0), pc.comm_bytes.get("cp", 0.0), 0.0, cm.nccl_sms))


def _hidden_cost(cm: ComputeModel, hidden_s: float, link_s: float, wire_bytes: float, memory_share: float,
                 sms: float) -> float:
    """``overlap_slowdown_s`` for the hidden part of traffic of ``link_s`` seconds and ``wire_bytes`` bytes."""
    if hidden_s <= 0.0 or link_s <= 0.0:
        return 0.0
    return overlap_slowdown_s(cm, hidden_s, wire_bytes * min(1.0, hidden_s / link_s), memory_share, sms)


def memory_share(pc: PhaseCost) -> float:
    """Share of a pass's compute time in memory-bound kernels (neither GEMM nor attention)."""
    return max(0.0, 1.0 - (pc.gemm + pc.attention) / pc.compute) if pc.compute > 0 else 0.0


def dp_contention(cm: ComputeModel, link_s: float, exposed_s: float, wire_bytes: float, pc: PhaseCost) -> float:
    """Extra compute seconds from the DP traffic hidden under the step's passes ``pc`` (NCCL, ``nccl_sms``)."""
    return _hidden_cost(cm, link_s - exposed_s, link_s, wire_bytes, memory_share(pc), cm.nccl_sms)


def first_chunk(comm_s: float, ranks: int) -> float:
    """The part of an overlapped collective that nothing hides: one of its ``ranks`` chunks.

    Overlap decomposes the work into one chunk per rank of the group (comm-GEMM overlap: Wang et al.
    2022, Transformer Engine userbuffers; ring attention: one K/V step per CP rank); the first
    chunk's transfer has no computation to run under.
    """
    return comm_s / max(1, ranks)


def _combine(job: Job, parts: list[tuple[tuple[PhaseCost, PhaseCost, PhaseCost], float]],
             cm: ComputeModel | None = None) -> StageTime:
    fwd = bwd = rc = PhaseCost()
    for (f, b, r), count in parts:
        fwd = fwd + (f.scaled(count) if count != 1 else f)
        bwd = bwd + (b.scaled(count) if count != 1 else b)
        rc = rc + (r.scaled(count) if count != 1 else r)
    exp_f, exp_b, exp_r = _exposed(job, fwd, cm), _exposed(job, bwd, cm), _exposed(job, rc, cm)
    return StageTime(
        compute=fwd.compute + bwd.compute,
        recompute=rc.compute,
        tp_exposed=exp_f[0] + exp_b[0] + exp_r[0],
        cp_exposed=exp_f[1] + exp_b[1] + exp_r[1],
        fwd=fwd.compute + sum(exp_f),
        bwd=bwd.compute + rc.compute + sum(exp_b) + sum(exp_r),
        link=fwd + bwd + rc,
    )


def stage_times(job: Job, wl: Workload, costs: Costs) -> list[StageTime]:
    """First, middle and last pipeline ranks (one rank when pp == 1); middle ranks are identical."""
    cost = {name: (costs.phase(b.fwd), costs.phase(b.bwd), costs.phase(b.recompute))
            for name, b in (("embed", wl.embed), ("layer", wl.layer), ("head", wl.head))}
    L = wl.layers_per_stage
    layers = (tuple(c.scaled(L) for c in cost["layer"]), 1)
    p, cm = job.plan.pp, costs.cm
    if p == 1:
        return [_combine(job, [(cost["embed"], 1), layers, (cost["head"], 1)], cm)]
    first = _combine(job, [(cost["embed"], 1), layers], cm)
    last = _combine(job, [layers, (cost["head"], 1)], cm)
    if p == 2:
        return [first, last]
    return [first] + [_combine(job, [layers], cm)] * (p - 2) + [last]


def dp_exposed(job: Job, wl: Workload, costs: Costs, st: StageTime) -> tuple[float, float, float]:
    """(link time, exposed time, bytes) of data-parallel traffic per step: what the timeline leaves exposed
    (``dp_timeline``) plus what the hidden part costs the compute it runs under (``dp_contention``)."""
    link, exposed, nbytes = dp_timeline(job, wl, costs, st)
    return link, exposed + dp_contention(costs.cm, link, exposed, nbytes, st.link), nbytes


def dp_timeline(job: Job, wl: Workload, costs: Costs, st: StageTime) -> tuple[float, float, float]:
    """(link time per step, exposed time per step, bytes per step) of data-parallel traffic.

    Overlapped reduction hides under the last micro-batch's backward; the last bucket stays exposed
    (PyTorch DDP / Megatron-Core overlap_grad_reduce). ZeRO-1/2 parameter all-gather hides under
    the next step's first forward (overlap_param_gather). ZeRO-3 prefetches each layer's gather
    under the previous layer's compute; the first layer's gather is exposed.
    """
    ov = job.plan.overlap.dp
    m = wl.micro_batches
    if wl.dp_microbatch:
        # FSDP / ZeRO-3 gather and reduce-scatter one layer (unit) at a time: L collectives, each paying α
        units = max(1, wl.layers_per_stage)
        gf, gb, rs = (units * costs.collective_time(c.group, c.op, c.bytes / units) for c in wl.dp_microbatch)
        nbytes = sum(costs.sent_bytes(c) for c in wl.dp_microbatch) * m
        link = (gf + gb + rs) * m
        if not ov:
            return link, link, nbytes
        first_layer = gf / units
        per_mb = max(0.0, gf - st.fwd) + max(0.0, gb + rs - st.bwd) + first_layer
        return link, per_mb * m, nbytes
    if not wl.dp_step:
        return 0.0, 0.0, 0.0
    nbytes = sum(costs.sent_bytes(c) for c in wl.dp_step)
    times = [bucketed_time(costs, c, wl.bucket_bytes) for c in wl.dp_step]
    link = sum(times)
    if not ov:
        return link, link, nbytes
    reduce_op = wl.dp_step[0]
    tail = costs.collective(Collective("bucket", reduce_op.op, min(wl.bucket_bytes, reduce_op.bytes), "dp"))
    exposed = max(tail, times[0] - st.bwd)
    if len(times) > 1:
        ratio = min(1.0, wl.bucket_bytes / max(1.0, reduce_op.bytes))
        exposed += max(times[1] * ratio, times[1] - st.fwd)
    return link, exposed, nbytes


def bucketed_time(costs: Costs, c: Collective, bucket_bytes: float) -> float:
    """DP traffic goes in buckets (PyTorch DDP, Megatron-Core): ⌈S/bucket⌉ collectives, each paying its α."""
    n = max(1, math.ceil(c.bytes / bucket_bytes))
    return n * costs.collective_time(c.group, c.op, c.bytes / n)


def pp_exposed(job: Job, wl: Workload, costs: Costs) -> tuple[float, float, float]:
    """(link time, exposed time, bytes) of pipeline sends for one step on the busiest rank."""
    p, v, m = job.plan.pp, job.plan.vp, wl.micro_batches
    if p == 1:
        return 0.0, 0.0, 0.0
    t_send = costs.collective(wl.pp_send)
    sends = 2 * v * m  # each micro-batch: forward activation and backward gradient, per model chunk
    fill = 2 * (p - 1) * t_send  # the first forward and the last backward cross every boundary in turn
    # Megatron overlaps p2p with compute only in the interleaved schedule (overlap_p2p_comm); plain 1F1B
    # exchanges send-forward/recv-backward pairs between passes, two sends per micro-batch on the path
    overlapped = job.plan.overlap.pp and v > 1
    exposed = fill if overlapped else fill + 2 * m * t_send
    return sends * t_send, exposed, sends * costs.sent_bytes(wl.pp_send)


def step_parts(m, compute, recompute, tp_exposed, cp_exposed, t_avg, pp, vp, pp_exposed, dp_exposed, optimizer):
    """The step's parts (BREAKDOWN_KEYS order) from one micro-batch on the slowest stage.

    step = m·(compute + recompute + exposed TP + exposed CP) of the slowest stage + (p−1)/v·T_avg
    + exposed PP + exposed DP + optimizer (Narayanan et al. 2021 §2.2 for the bubble). Plain
    arithmetic, so it works elementwise on NumPy arrays too (``commtax.search`` evaluates whole grids).
    """
    return {
        "compute": m * compute,
        "recompute": m * recompute,
        "tp_exposed": m * tp_exposed,
        "cp_exposed": m * cp_exposed,
        "pp_bubble": (pp - 1) / vp * t_avg,
        "pp_exposed": pp_exposed,
        "dp_exposed": dp_exposed,
        "optimizer": optimizer,
    }


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


def plan_notes(job: Job, wl: Workload) -> list[str]:
    """Things about the plan a user should know when reading the numbers."""
    p, c = job.plan, job.cluster
    notes = []
    if p.tp > c.gpus_per_node:
        notes.append(f"TP group ({p.tp}) is larger than the NVLink domain ({c.gpus_per_node}): TP traffic crosses the network")
    if p.tp * p.cp > c.gpus_per_node and p.cp > 1:
        notes.append("CP ring spans nodes: K/V exchange crosses the network")
    if p.pp > 1 and p.tp * p.cp * job.dp >= c.gpus_per_node:
        notes.append("pipeline sends cross nodes and share the NICs with DP traffic")
    if not p.flash_attention:
        notes.append(f"{p.framework}: attention scores materialised (attention: eager); DP reduction "
                     f"{'overlaps backward' if p.overlap.dp else 'after backward'}")
    if p.pp > 1 and wl.micro_batches < p.pp:
        notes.append(f"fewer micro-batches ({wl.micro_batches}) than pipeline stages ({p.pp}): the bubble dominates")
    return notes


def estimate(job: Job, workload: Workload | None = None, costs: Costs | None = None) -> Breakdown:
    """Predict one training step of ``job`` (analytical schedule).

    ``workload`` and ``costs`` default to the job's own; passing them lets a caller (the simulator's
    agreement tests, search) evaluate the same ops and prices both ways.
    """
    wl = workload or build_workload(job)
    costs = costs or Costs(job)
    stages = stage_times(job, wl, costs)
    p, v, m = job.plan.pp, job.plan.vp, wl.micro_batches
    slow = max(stages, key=lambda s: s.total)
    t_avg = sum(s.total for s in stages) / len(stages)
    pp_link, pp_exp, pp_bytes = pp_exposed(job, wl, costs)
    dp_link, dp_exp, dp_bytes = dp_exposed(job, wl, costs, slow)
    optimizer = costs.compute(wl.optimizer)
    parts = step_parts(m, slow.compute, slow.recompute, slow.tp_exposed, slow.cp_exposed, t_avg, p, v,
                       pp_exp, dp_exp, optimizer)
    comm_time = {
        "tp": m * slow.link.comm.get("tp", 0.0),
        "cp": m * slow.link.comm.get("cp", 0.0),
        "pp": pp_link,
        "dp": dp_link,
    }
    comm_bytes = {
        "tp": m * slow.link.comm_bytes.get("tp", 0.0),
        "cp": m * slow.link.comm_bytes.get("cp", 0.0),
        "pp": pp_bytes,
        "dp": dp_bytes,
    }
    mem = memory(job)
    return make_breakdown(job, wl, parts, comm_time, comm_bytes, mem.gib(), mem.total <= job.cluster.gpu.mem_bytes,
                          notes=plan_notes(job, wl))


def make_breakdown(job: Job, wl: Workload, parts: dict[str, float], comm_time: dict[str, float],
                   comm_bytes: dict[str, float], memory_gib: dict[str, float], fits: bool,
                   source: str = "estimate", notes: list[str] | None = None) -> Breakdown:
    """The Breakdown record from the step's parts: the derived rates, shares and MFU are defined once, here.

    Used by the analytical schedule and by the event simulator (``commtax.sim``), so the two agree
    on every definition (DESIGN.md): comm tax = exposed / step, comm share = comm / (comm + compute).
    """
    step = sum(parts.values())
    exposed = parts["tp_exposed"] + parts["cp_exposed"] + parts["pp_exposed"] + parts["dp_exposed"]
    total_comm = sum(comm_time.values())
    busy = parts["compute"] + parts["recompute"]
    tr, c = job.training, job.cluster
    peak = c.gpu.peak_flops(tr.precision)
    model_flops = model_flops_per_gpu_step(job, wl) / step
    hw_flops = model_flops + recompute_model_flops(job, wl) / c.num_gpus / step
    tokens_per_s = tr.global_batch * tr.seq_len / step
    return Breakdown(
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
