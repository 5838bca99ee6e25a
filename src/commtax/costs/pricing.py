"""Prices of a block's passes: compute and per-group link time on the cluster, shared across plans."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from commtax.costs.collectives import DEEPEP_OPS, Placement, bus_factor, collective_cost, deepep_time
from commtax.costs.compute import ComputeModel, compute_model, op_time
from commtax.costs.topology import group_placement, layout
from commtax.spec import Cluster, Job
from commtax.spec.assumptions import default_assumptions
from commtax.spec.base import HashedOnce, held_key
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
        if not o.comm and type(o.compute) is float and not o.compute:  # nothing to add (arrays: always added)
            return self
        comm, nbytes = dict(self.comm), dict(self.comm_bytes)
        for k, v in o.comm.items():
            comm[k] = comm.get(k, 0.0) + v
        for k, v in o.comm_bytes.items():
            nbytes[k] = nbytes.get(k, 0.0) + v
        return _phase_cost(self.compute + o.compute, self.gemm + o.gemm, self.attention + o.attention, comm, nbytes)

    def scaled(self, x: float) -> PhaseCost:
        return _phase_cost(
            self.compute * x,
            self.gemm * x,
            self.attention * x,
            {k: v * x for k, v in self.comm.items()},
            {k: v * x for k, v in self.comm_bytes.items()},
        )


def _phase_cost(compute: float, gemm: float, attention: float, comm: dict, comm_bytes: dict) -> PhaseCost:
    """``PhaseCost(...)`` without the frozen dataclass's five ``object.__setattr__`` calls: a search sums and scales
    ~10^5 of them (the fields are the class's, so equality and repr are the dataclass's)."""
    pc = object.__new__(PhaseCost)
    pc.__dict__.update(compute=compute, gemm=gemm, attention=attention, comm=comm, comm_bytes=comm_bytes)
    return pc


# Both are pure functions of frozen (hashable) values: searches and sweeps re-ask the same questions.
_cached_collective_cost = functools.lru_cache(maxsize=1 << 16)(collective_cost)
_cached_op_time = functools.lru_cache(maxsize=1 << 16)(op_time)


# Shared across jobs (and so across the plans of a sweep), every key a value: what a price depends on, no identity.
_MODELS: dict[tuple, ComputeModel] = {}  # (cluster, precision, assumptions in force) -> compute model
_PLACEMENTS: dict[tuple, Placement] = {}  # (cluster, group layout, group, op) -> placement
# (compute model, placements of its collectives, phase) -> PhaseCost: a phase's price is its ops' prices, and an
# op's price depends on the compute model (``op_time``) or on the placement of its group (``collective_cost``) only
_PHASES: dict[tuple, PhaseCost] = {}
# (compute model, cluster, group layout) -> stage cache (``stage_times``: keyed by the blocks' values and the plan
# fields ``_combine`` reads; the rest of what a stage's time depends on is this key)
_STAGES: dict[tuple, dict] = {}
_SHARED_LIMIT = 1 << 14


def _bounded(cache: dict, limit: int = _SHARED_LIMIT) -> dict:
    """``cache``, emptied first when it is full (sweeps of many clusters must not grow it without end)."""
    if len(cache) >= limit:
        cache.clear()
    return cache


def cluster_key(cluster: Cluster) -> str:
    """A cluster's value as a key: its JSON (a Cluster holds dicts, so it has no hash)."""
    return held_key("cluster", (cluster,), Cluster.model_dump_json)


def _assumptions_key(a: object) -> HashedOnce:
    return held_key("assumptions", (a,), lambda v: HashedOnce(v, hash(v)))


def layout_key(job: Job) -> tuple:
    """The job's group layout (sizes and strides of every group) as a key: what placements depend on."""
    lay = layout(job)
    return tuple(sorted(lay.size.items())), tuple(sorted(lay.stride.items()))


@functools.lru_cache(maxsize=64)
def _prices_as_costs(cls: type) -> bool:
    """Whether ``cls`` prices ops as ``Costs`` does (a subclass may override the pricing: then nothing is shared)."""
    return all(
        getattr(cls, f) is getattr(Costs, f)
        for f in ("_phase", "compute", "collective", "collective_time", "sent_bytes", "_placement")
    )


def shared_compute_model(cluster: Cluster, precision: str, key: str | None = None) -> ComputeModel:
    """``compute_model``, once per (cluster, precision, assumptions in force) by value."""
    k = (key or cluster_key(cluster), precision, _assumptions_key(default_assumptions()))
    cm = _MODELS.get(k)
    if cm is None:
        cm = _bounded(_MODELS)[k] = compute_model(cluster, precision)
    return cm


class Costs:
    """Op costs of one job: compute by roofline, collectives by α-β on each group's placement."""

    def __init__(self, job: Job):
        self.job = job
        self._cluster = cluster_key(job.cluster)
        self.cm: ComputeModel = shared_compute_model(job.cluster, job.training.precision, self._cluster)
        self._layout = layout_key(job)
        # the shared prices hold only while this class's own pricing is used (a subclass may price otherwise)
        self._share_phases = _prices_as_costs(type(self))
        self._placements: dict[tuple[str, str], Placement] = {}
        self._times: dict[tuple[str, str, float], float] = {}
        self._phases: dict[Phase, PhaseCost] = {}
        self.stage_cache: dict[tuple, object] = {}  # stage_times: (blocks, overlap, tp, cp, layers, ends) -> StageTime
        if self._share_phases:  # shared with every job of this compute model, cluster and layout
            key = (self.cm, self._cluster, self._layout)
            cache = _STAGES.get(key)
            if cache is None or len(cache) >= _SHARED_LIMIT:
                cache = _bounded(_STAGES, 256)[key] = {}
            self.stage_cache = cache

    def _placement(self, group: str, op: str) -> Placement:
        """The placement of a ``group`` collective, shared by every job on this cluster with this layout."""
        key = (self._cluster, self._layout, group, op)
        pl = _PLACEMENTS.get(key)
        if pl is None:
            pl = _bounded(_PLACEMENTS)[key] = group_placement(self.job, group, op)
        self._placements[group, op] = pl
        return pl

    def placement(self, group: str, op: str) -> Placement:
        return self._placements.get((group, op)) or self._placement(group, op)

    def collective(self, c: Collective) -> float:
        if c.op in DEEPEP_OPS:  # DeepEP/HybridEP kernels: their own measured rates, node-deduplicated bytes
            key = (c.group, c.op, c.bytes, c.dedup, c.kernel)
            t = self._times.get(key)
            if t is None:
                t = self._times[key] = deepep_time(c.op, c.bytes, self.placement(c.group, c.op), c.dedup, c.kernel)
            return t
        return self.collective_time(c.group, c.op, c.bytes)

    def collective_time(self, group: str, op: str, nbytes: float) -> float:
        key = (group, op, nbytes)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = _cached_collective_cost(op, nbytes, self.placement(group, op)).time_s
        return t

    def sent_bytes(self, c: Collective) -> float:
        """Bytes one GPU puts on the wire: message × bus factor (nccl-tests)."""
        return c.bytes * bus_factor(c.op, self.placement(c.group, c.op).n)

    def group_size(self, group: str, op: str) -> int:
        """Ranks of one ``group`` collective on this job's placement."""
        return self.placement(group, op).n

    def compute(self, op: Compute) -> float:
        return _cached_op_time(self.cm, op)

    def phase(self, ph: Phase) -> PhaseCost:
        cost = self._phases.get(ph)  # the same layer block is shared by every stage (phases hash once)
        if cost is not None:
            return cost
        if self._share_phases:
            groups = dict.fromkeys((c.group, c.op) for c in ph.collectives)
            key = (self.cm, tuple((g, op, self.placement(g, op)) for g, op in groups), ph)
            cost = _PHASES.get(key)
            if cost is None:
                cost = _bounded(_PHASES)[key] = self._phase(ph)
        else:
            cost = self._phase(ph)
        self._phases[ph] = cost
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


EP_GROUPS = ("ep", "etp")  # the MoE token exchange: dispatch/combine over ep, the expert-TP gather over etp


@dataclass(frozen=True)
class OverlapPieces:
    """One MoE layer (or a stage's MoE layers, summed) as the EP all-to-all overlap schedules it, in seconds: the
    compute of each node per pass (``workload.moe.OVERLAP_PIECES``: attention side, routed experts; backward input
    gradients ``_b`` and delayed weight gradients ``_w``) and the link time of the dispatch and the combine; ``nbytes``
    the bytes the exchanges send (the SM slowdown of their hidden part reads them)."""

    attn_f: float = 0.0
    mlp_f: float = 0.0
    dispatch_f: float = 0.0
    combine_f: float = 0.0
    attn_b: float = 0.0
    attn_w: float = 0.0
    mlp_b: float = 0.0
    mlp_w: float = 0.0
    dispatch_b: float = 0.0
    combine_b: float = 0.0
    nbytes: float = 0.0

    def scaled(self, x: float) -> OverlapPieces:
        return OverlapPieces(*(getattr(self, f) * x for f in self.__dataclass_fields__))

    @property
    def compute(self) -> float:
        return self.attn_f + self.mlp_f + self.attn_b + self.attn_w + self.mlp_b + self.mlp_w


def overlap_pieces(costs: Costs, phases: tuple[Phase, ...]) -> OverlapPieces:
    """Price ``workload.moe.overlap_phases``: compute seconds of the compute nodes, EP link seconds (and bytes) of
    the exchanges, each op priced as in its pass (``Costs.phase``)."""
    priced = [costs.phase(ph) for ph in phases]
    comm = [sum(pc.comm.get(g, 0.0) for g in EP_GROUPS) for pc in priced]
    nbytes = sum(pc.comm_bytes.get(g, 0.0) for pc in priced for g in EP_GROUPS)
    af, mf, df, cf, ab, aw, mb, mw, db, cb = (
        pc.compute if i not in (2, 3, 8, 9) else comm[i] for i, pc in enumerate(priced)
    )
    return OverlapPieces(af, mf, df, cf, ab, aw, mb, mw, db, cb, nbytes)
