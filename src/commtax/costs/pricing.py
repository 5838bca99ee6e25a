"""Prices of a block's passes: compute and per-group link time on the cluster, shared across plans."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from commtax.costs.collectives import DEEPEP_OPS, bus_factor, collective_cost, deepep_time
from commtax.costs.compute import ComputeModel, compute_model, op_time
from commtax.costs.topology import group_placement
from commtax.spec import Job
from commtax.spec.assumptions import default_assumptions
from commtax.workload.step import (
    Collective,
    Compute,
    Phase,
)


@dataclass(frozen=True)
class PhaseCost:
    """Time of one pass over one block: compute, and per-group communication (link time)."""

    compute: float = 0.0
    gemm: float = 0.0  # the part of compute that TP communication can hide under (comm-GEMM overlap)
    attention: float = 0.0  # the part that ring-attention K/V exchange hides under
    comm: dict[str, float] = field(default_factory=dict)
    comm_bytes: dict[str, float] = field(default_factory=dict)

    def __add__(self, o: PhaseCost) -> PhaseCost:
        if not (o.compute or o.comm):
            return self
        comm, nbytes = dict(self.comm), dict(self.comm_bytes)
        for k, v in o.comm.items():
            comm[k] = comm.get(k, 0.0) + v
        for k, v in o.comm_bytes.items():
            nbytes[k] = nbytes.get(k, 0.0) + v
        return PhaseCost(self.compute + o.compute, self.gemm + o.gemm, self.attention + o.attention, comm, nbytes)

    def scaled(self, x: float) -> PhaseCost:
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


# Shared across jobs (and so across the plans of a sweep): what depends only on the cluster and the parallel layout.
# Keys hold the cluster's id, values the cluster itself, so an id is never reused while its entry lives.
_MODELS: dict[tuple, tuple[Any, Any, ComputeModel]] = {}  # (id(cluster), precision, id(assumptions)) -> model
_PLACEMENTS: dict[tuple, tuple[Any, Any]] = {}  # (id(cluster), tp, cp, dp, pp, group, op) -> (cluster, Placement)
# (compute model, id(cluster), tp, cp, dp, pp, id(phase)) -> (cluster, phase, PhaseCost): a phase's price depends
# on its ops, the compute model and the groups' placements (cluster and layout) only; blocks are shared between
# plans (``workload._blocks``), so their phases are priced once.
_PHASES: dict[tuple, tuple[Any, Phase, PhaseCost]] = {}
# (compute model, id(cluster), tp, cp, dp, pp) -> (cluster, stage cache): ``stage_times`` keys its entries by the
# blocks' identity and the plan fields ``_combine`` reads, the rest of what they depend on is this key
_STAGES: dict[tuple, tuple[Any, dict]] = {}
_SHARED_LIMIT = 1 << 14


@functools.lru_cache(maxsize=64)
def _prices_as_costs(cls: type) -> bool:
    """Whether ``cls`` prices ops as ``Costs`` does (a subclass may override the pricing: then nothing is shared)."""
    return all(
        getattr(cls, f) is getattr(Costs, f)
        for f in ("_phase", "compute", "collective", "collective_time", "sent_bytes", "_placement")
    )


def _shared_compute_model(cluster, precision: str) -> ComputeModel:
    """``compute_model``, once per (cluster, precision, assumptions in force)."""
    a = default_assumptions()
    key = (id(cluster), precision, id(a))
    hit = _MODELS.get(key)
    if hit is None or hit[0] is not cluster or hit[1] is not a:
        if len(_MODELS) >= _SHARED_LIMIT:
            _MODELS.clear()
        hit = _MODELS[key] = (cluster, a, compute_model(cluster, precision))
    return hit[2]


class Costs:
    """Op costs of one job: compute by roofline, collectives by α-β on each group's placement."""

    def __init__(self, job: Job):
        self.job = job
        self.cm: ComputeModel = _shared_compute_model(job.cluster, job.training.precision)
        p = job.plan
        self._layout_key = (id(job.cluster), p.tp, p.cp, job.dp, p.pp)
        if job.model.is_moe:  # the ep, etp and edp groups' placements depend on the expert grid too
            self._layout_key += (p.ep, p.etp)
        # the shared phase prices hold only while this class's own pricing is used (a subclass may price otherwise)
        self._share_phases = _prices_as_costs(type(self))
        self._placements: dict[tuple[str, str], Any] = {}
        self._times: dict[tuple[str, str, float], float] = {}
        self._phases: dict[int, tuple[Phase, PhaseCost]] = {}
        self.stage_cache: dict[tuple, tuple] = {}  # stage_times: (blocks, layers, ends, overlap, tp, cp) -> StageTime
        if self._share_phases:  # shared with every job of this compute model, cluster and layout
            key = (self.cm, *self._layout_key)
            hit = _STAGES.get(key)
            if hit is None or hit[0] is not job.cluster or len(hit[1]) >= _SHARED_LIMIT:
                if len(_STAGES) >= 256:
                    _STAGES.clear()
                hit = _STAGES[key] = (job.cluster, {})
            self.stage_cache = hit[1]

    def _placement(self, group: str, op: str):
        """The placement of a ``group`` collective, shared by every job on this cluster with this layout."""
        key = (*self._layout_key, group, op)
        hit = _PLACEMENTS.get(key)
        if hit is None or hit[0] is not self.job.cluster:
            if len(_PLACEMENTS) >= _SHARED_LIMIT:
                _PLACEMENTS.clear()
            hit = _PLACEMENTS[key] = (self.job.cluster, group_placement(self.job, group, op))
        self._placements[group, op] = hit[1]
        return hit[1]

    def collective(self, c: Collective) -> float:
        if c.op in DEEPEP_OPS:  # DeepEP/HybridEP kernels: their own measured rates, node-deduplicated bytes
            key = (c.group, c.op, c.bytes, c.dedup)
            t = self._times.get(key)
            if t is None:
                pl = self._placements.get((c.group, c.op)) or self._placement(c.group, c.op)
                t = self._times[key] = deepep_time(c.op, c.bytes, pl, c.dedup)
            return t
        return self.collective_time(c.group, c.op, c.bytes)

    def collective_time(self, group: str, op: str, nbytes: float) -> float:
        key = (group, op, nbytes)
        t = self._times.get(key)
        if t is None:
            pl = self._placements.get((group, op)) or self._placement(group, op)
            t = self._times[key] = _cached_collective_cost(op, nbytes, pl).time_s
        return t

    def sent_bytes(self, c: Collective) -> float:
        """Bytes one GPU puts on the wire: message × bus factor (nccl-tests)."""
        pl = self._placements.get((c.group, c.op)) or self._placement(c.group, c.op)
        return c.bytes * bus_factor(c.op, pl.n)

    def group_size(self, group: str, op: str) -> int:
        """Ranks of one ``group`` collective on this job's placement."""
        return (self._placements.get((group, op)) or self._placement(group, op)).n

    def compute(self, op: Compute) -> float:
        return _cached_op_time(self.cm, op)

    def phase(self, ph: Phase) -> PhaseCost:
        hit = self._phases.get(id(ph))
        if hit is not None and hit[0] is ph:  # the same layer block is shared by every stage
            return hit[1]
        if self._share_phases:
            key = (self.cm, *self._layout_key, id(ph))
            shared = _PHASES.get(key)
            if shared is not None and shared[0] is self.job.cluster and shared[1] is ph:
                cost = shared[2]
            else:
                if len(_PHASES) >= _SHARED_LIMIT:
                    _PHASES.clear()
                cost = self._phase(ph)
                _PHASES[key] = (self.job.cluster, ph, cost)
        else:
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
