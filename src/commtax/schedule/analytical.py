"""Analytical schedule: workload ops + costs -> one ``Breakdown`` of a training step.

step time = compute + recompute + exposed TP + exposed CP + pipeline bubble + exposed PP
            + exposed DP + optimizer                                              (DESIGN.md)

Pipeline (Narayanan et al. 2021, §2.2): with m micro-batches, p stages, v virtual stages and T_s one
micro-batch's forward+backward on stage s, 1F1B takes m·T_max + (Σ_s T_s − T_max)/v: the slowest stage runs
its m micro-batches back to back, and the fill and drain cross the other stages once; GPipe is two flow
shops, forwards then backwards (``pipeline_bubble``). Both hold for every m ≥ 1; for uniform stages the
bubble is (p−1)/(v·m) of the ideal time. Interleaving (v > 1) needs m to be a multiple of p (Megatron's
interleaved schedule refuses other m; the spec does too), so the 1/v holds wherever it is used.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from commtax.costs.compute import ComputeModel, overlap_slowdown_s
from commtax.costs.elementwise import any_true, largest, maximum, minimum, where
from commtax.costs.pricing import EP_GROUPS, Costs, OverlapPieces, PhaseCost, _phase_cost, overlap_pieces
from commtax.schedule.breakdown import Breakdown, make_breakdown
from commtax.spec import Job, per_rank, zero_refusal
from commtax.workload.memory import memory
from commtax.workload.step import (
    Collective,
    Compute,
    Workload,
    build_workload,
    collective_op,
    grad_bytes_per_param,
    grad_codec_ops,
    stage_param_split,
    stage_params,
    weight_bytes_per_param,
    with_dp_stage,
    with_fields,
)


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
    ep_exposed: float = 0.0  # MoE dispatch/combine (and expert-TP) time the step waits for (``ep_exposed``)
    total: float = field(init=False)  # compute + recompute + exposed TP + exposed CP (+ exposed EP)

    def __post_init__(self) -> None:
        total = self.compute + self.recompute + self.tp_exposed + self.cp_exposed
        object.__setattr__(self, "total", total + self.ep_exposed if self.ep_exposed else total)


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
    tp_exp = maximum(tp - pc.gemm, first_chunk(tp, p.tp)) if ov.tp else tp
    cp_exp = maximum(cp - pc.attention, first_chunk(cp, p.cp)) if ov.cp else cp
    if cm is not None and any_true((tp_exp < tp) | (cp_exp < cp)):  # some TP/CP traffic is hidden
        tp_c, cp_c = overlap_contention(cm, pc, tp - tp_exp, cp - cp_exp)
        tp_exp, cp_exp = tp_exp + tp_c, cp_exp + cp_c
    return tp_exp, cp_exp


def overlap_contention(cm: ComputeModel, pc: PhaseCost, tp_hidden_s: float, cp_hidden_s: float) -> tuple[float, float]:
    """Extra compute seconds of a pass from TP and CP traffic hidden under its GEMMs / attention.

    TP overlap is Transformer Engine userbuffers (its own ``userbuffers_sms``), ring attention's K/V exchange is
    NCCL p2p (``nccl_sms``); both hide under compute-bound kernels (memory share 0): ``overlap_slowdown_s``.
    """
    return (
        _hidden_cost(cm, tp_hidden_s, pc.comm.get("tp", 0.0), pc.comm_bytes.get("tp", 0.0), 0.0, cm.userbuffers_sms),
        _hidden_cost(cm, cp_hidden_s, pc.comm.get("cp", 0.0), pc.comm_bytes.get("cp", 0.0), 0.0, cm.nccl_sms),
    )


def _hidden_cost(
    cm: ComputeModel | None, hidden_s: float, link_s: float, wire_bytes: float, memory_share: float, sms: float
) -> float:
    """``overlap_slowdown_s`` for the hidden part of traffic of ``link_s`` seconds and ``wire_bytes`` bytes (none
    without a compute model: costs given directly, as in hand-worked schedules)."""
    if cm is None:
        return 0.0
    on = (hidden_s > 0.0) & (link_s > 0.0)  # plain bools for one plan, arrays on the search's grid
    if on is False:
        return 0.0
    hidden_bytes = wire_bytes * minimum(1.0, hidden_s / where(on, link_s, 1.0))
    return where(on, overlap_slowdown_s(cm, hidden_s, hidden_bytes, memory_share, sms), 0.0)


def memory_share(pc: PhaseCost) -> float:
    """Share of a pass's compute time in memory-bound kernels (neither GEMM nor attention)."""
    return max(0.0, 1.0 - (pc.gemm + pc.attention) / pc.compute) if pc.compute > 0 else 0.0


def dp_contention(cm: ComputeModel | None, link_s: float, exposed_s: float, wire_bytes: float, pc: PhaseCost) -> float:
    """Extra compute seconds from the DP traffic hidden under the step's passes ``pc`` (NCCL, ``nccl_sms``)."""
    return dp_contention_s(cm, link_s, exposed_s, wire_bytes, memory_share(pc))


def dp_contention_s(cm: ComputeModel | None, link_s, exposed_s, wire_bytes, share):
    """``dp_contention`` given the passes' memory-bound share; elementwise on arrays (search's grid)."""
    if cm is None:
        return 0.0
    return _hidden_cost(cm, link_s - exposed_s, link_s, wire_bytes, share, cm.nccl_sms)


def first_chunk(comm_s: float, ranks: int) -> float:
    """The part of an overlapped collective that nothing hides: one of its ``ranks`` chunks.

    Overlap decomposes the work into one chunk per rank of the group (comm-GEMM overlap: Wang et al.
    2022, Transformer Engine userbuffers; ring attention: one K/V step per CP rank); the first
    chunk's transfer has no computation to run under.
    """
    return comm_s / max(1, ranks)


def ep_link(pc: PhaseCost) -> float:
    return sum(pc.comm.get(g, 0.0) for g in EP_GROUPS)


def hides_ep(job: Job) -> bool:
    """Whether the schedule runs one micro-batch's all-to-alls under another's compute: Megatron-Core's
    --overlap-moe-expert-parallel-comm (a forward and a backward chunk merged, each one's dispatch/combine under the
    other's GEMMs) or DeepSeek's DualPipe / DualPipeV (the same pairing, arXiv 2412.19437 §3.2.1, Figure 4)."""
    return job.plan.moe_a2a_overlap or job.plan.schedule in ("dualpipe", "dualpipev")


@dataclass(frozen=True)
class EPPairing:
    """What the overlap of one pipeline rank (or one chunk) pairs: its MoE layers' pieces (summed), how many MoE
    layers and chunk pairs per micro-batch hold them, and the share of its passes that run alone
    (``unpaired_share``)."""

    pieces: OverlapPieces
    layers: int
    chunks: int
    unpaired: float


def paired_exposed(p: OverlapPieces, layers: int, chunks: int) -> float:
    """Exposed EP time of ``layers`` MoE layers run as forward/backward pairs in ``chunks`` chunk pairs (``p``: their
    pieces, summed). Megatron-Core's TransformerLayerSchedulePlan.run (model_chunk_schedule_plan.py @d98e8a6) pairs
    forward layer i with backward layer n−1−i on two streams, each pass's nodes chained by its own event:

        comm: combine_b | dispatch_f → dispatch_b          | combine_f → (next) combine_b
        comp: attn_f    | mlp_b → mlp_w → mlp_f             | attn_b → attn_w → (next) attn_f

    Between the sync points a layer pair takes two half-cycles (dispatch_b waits for mlp_b, mlp_f for dispatch_f;
    combine_b for attn_b, attn_f for combine_f):
        mlp  = max(max(D_f, M_b) + D_b, max(M_b + M_w, D_f) + M_f)
        attn = max(max(C_f, A_b) + C_b, max(A_b + A_w, C_f) + A_f)
    and a chunk pair of k layers max(C_b, A_f) + k·mlp + (k−1)·attn + max(C_f, A_b + A_w) (it starts after the
    embedding's forward and the loss's backward, and the last attn_w runs beside the last combine_f and the sends):
    its ends, once per chunk pair, in place of one attn. Exposed = that − compute. Each term is max-plus, so
    homogeneous: on the summed pieces of equal layers it is the per-layer result times the layers (the ends scaled by
    chunks/layers). The events cost no GPU time (cudaStreamWaitEvent); the host's launches are not priced. DualPipe's
    chunk pair (DeepSeek-V3 report §3.2.1, Figure 4: attention, dispatch, MLP, combine, the backward split into
    input and weight parts; deepseek-ai/DualPipe leaves ``overlapped_forward_backward`` to the model) is priced with
    the same pairing."""
    mlp = maximum(maximum(p.dispatch_f, p.mlp_b) + p.dispatch_b, maximum(p.mlp_b + p.mlp_w, p.dispatch_f) + p.mlp_f)
    attn = maximum(maximum(p.combine_f, p.attn_b) + p.combine_b, maximum(p.attn_b + p.attn_w, p.combine_f) + p.attn_f)
    ends = maximum(p.combine_b, p.attn_f) + maximum(p.combine_f, p.attn_b + p.attn_w) - attn
    return maximum(0.0, mlp + attn + ends * (chunks / max(1, layers)) - p.compute)


def unpaired_share(job: Job, m: int) -> float:
    """Share of the pipeline's forward (and backward) chunk passes the overlap runs alone, their all-to-alls exposed:
    the warm-up forwards and cool-down backwards have no pass to pair with (``rank_unpaired_share``, per rank). The
    mean over the ranks is charged to every rank: the fill and drain cross all of them (1F1B's step is m·T_max plus
    the others' passes once), so a rank's own count would move the slowest stage without moving the step."""
    p = job.plan.pp
    return sum(rank_unpaired_share(job, r, m) for r in range(p)) / p


def rank_unpaired_share(job: Job, rank: int, m: int) -> float:
    """Share of one pipeline rank's forward (and backward) chunk passes that run alone under the overlap.

    * Megatron-Core, no pipelining (combined_1f1b_schedule_for_no_pipelining): the first forward and the last
      backward of m: 1/m.
    * Megatron-Core, interleaved (schedules.py get_pp_rank_microbatches, microbatch_group_size_per_vp_stage = pp):
      W = 2(p − r − 1) + (v − 1)·p + 1 warm-up forwards ("one extra micro-batch forward step" with the overlap) of
      m·v, and as many cool-down backwards (over the ranks W averages v·p: p of every m micro-batches).
    * DualPipe (deepseek-ai/DualPipe dualpipe.py step): the pairs are steps 4 (2 per iteration, m/2 − p + h + 1
      iterations; the middle ranks run the first one apart) and 5 (p/2 − h − 1), h the rank's half rank: m − 1.5p +
      h + 1 of m passes paired. DualPipeV is priced with DualPipe's counts."""
    p, v = job.plan.pp, job.plan.vp
    if job.plan.schedule in ("dualpipe", "dualpipev"):
        h = min(rank, p - 1 - rank)
        alone = 1.5 * p - h - 1 + (1 if h == p // 2 - 1 else 0)
        return min(1.0, max(0.0, alone) / max(1, m))
    if p == 1:
        return min(1.0, 1.0 / max(1, m))
    warmup = 2 * (p - rank - 1) + (v - 1) * p + 1
    return min(1.0, warmup / max(1, m * v))


def rank_moe_chunks(job: Job, chunk_layers: tuple[int, ...]) -> tuple[int, ...]:
    """Per pipeline rank: how many of its chunks (k = chunk·pp + rank; ``chunk_layers`` their layers) hold an MoE
    layer."""
    m, p = job.model, job.plan.pp
    out, start = [0] * p, 0
    for k, n in enumerate(chunk_layers):
        out[k % p] += 1 if m.moe_layers_before(start + n) > m.moe_layers_before(start) else 0
        start += n
    return tuple(out)


def ep_exposed(
    job: Job, fwd: PhaseCost, bwd: PhaseCost, rc: PhaseCost, cm: ComputeModel | None, pairing: EPPairing | None = None
) -> tuple[float, float]:
    """(forward, backward + recompute) exposed EP time of one micro-batch on one stage.

    Without overlap the dispatch and combine sit between the router and the experts, and between the experts and
    the next layer: all of it is exposed. With a forward-backward overlap (``hides_ep``) each exchange runs under the
    compute piece of the other pass the code pairs it with, per layer (``paired_exposed``); the passes that run alone
    (``pairing.unpaired``: warm-up forwards, cool-down backwards) expose all of theirs; the recompute's exchange stays
    exposed. The hidden part holds SMs (DeepEP: catalog deepep.yaml ``sms``; NCCL: ``nccl_sms``) and slows the
    compute it runs under (``overlap_slowdown_s``). The paired exposure is split over the passes as their links."""
    a_f, a_b, a_r = ep_link(fwd), ep_link(bwd), ep_link(rc)
    if not hides_ep(job) or pairing is None or pairing.layers == 0:
        return a_f, a_b + a_r
    link = a_f + a_b
    u = pairing.unpaired
    exposed = minimum(link, (1.0 - u) * paired_exposed(pairing.pieces, pairing.layers, pairing.chunks) + u * link)
    if cm is not None:
        from commtax.costs.collectives import deepep_table

        sms = deepep_table()["sms"] if job.plan.moe_dispatcher in ("deepep", "hybridep") else cm.nccl_sms
        exposed = exposed + _hidden_cost(cm, link - exposed, link, pairing.pieces.nbytes, 0.0, sms)
    share = a_f / link if link > 0 else 0.5
    return exposed * share, exposed * (1.0 - share) + a_r


def _combine(
    job: Job,
    parts: list[tuple[tuple[PhaseCost, PhaseCost, PhaseCost], float]],
    cm: ComputeModel | None = None,
    pairing: EPPairing | None = None,
) -> StageTime:
    fwd = bwd = rc = None  # the first part as it is (0 + x = x): one sum fewer per pass
    for (f, b, r), count in parts:
        f, b, r = (f.scaled(count), b.scaled(count), r.scaled(count)) if count != 1 else (f, b, r)
        fwd, bwd, rc = (f, b, r) if fwd is None else (fwd + f, bwd + b, rc + r)
    if fwd is None:
        fwd = bwd = rc = PhaseCost()
    exp_f, exp_b, exp_r = _exposed(job, fwd, cm), _exposed(job, bwd, cm), _exposed(job, rc, cm)
    if job.model.is_moe:
        ep_f, ep_b = ep_exposed(job, fwd, bwd, rc, cm, pairing)
        return StageTime(
            compute=fwd.compute + bwd.compute,
            recompute=rc.compute,
            tp_exposed=exp_f[0] + exp_b[0] + exp_r[0],
            cp_exposed=exp_f[1] + exp_b[1] + exp_r[1],
            fwd=fwd.compute + sum(exp_f) + ep_f,
            bwd=bwd.compute + rc.compute + sum(exp_b) + sum(exp_r) + ep_b,
            link=fwd + bwd + rc,
            ep_exposed=ep_f + ep_b,
        )
    return StageTime(
        compute=fwd.compute + bwd.compute,
        recompute=rc.compute,
        tp_exposed=exp_f[0] + exp_b[0] + exp_r[0],
        cp_exposed=exp_f[1] + exp_b[1] + exp_r[1],
        fwd=fwd.compute + sum(exp_f),
        bwd=bwd.compute + rc.compute + sum(exp_b) + sum(exp_r),
        link=fwd + bwd + rc,
    )


class HashedKey(int):
    """A tuple key whose hash is computed once (it is looked up many times); equal when the tuples are equal.

    An int whose value is the tuple's hash, so that hashing it (and the stage keys that hold it, ~10^5 times a search)
    is the int's own C hash, not a Python ``__hash__`` call; it equals another HashedKey of an equal tuple only."""

    def __new__(cls, value: tuple) -> HashedKey:
        self = super().__new__(cls, hash(value))
        self.value = value
        return self

    __hash__ = int.__hash__  # the C slot: no Python call per hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashedKey) and int.__eq__(self, other) and self.value == other.value

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __reduce__(self) -> tuple:
        return HashedKey, (self.value,)


def stage_layer_counts(job: Job, wl: Workload) -> tuple[int, ...]:
    """Layers of each pipeline rank: the workload's virtual stages k = chunk·pp + stage, summed per rank."""
    p, v = job.plan.pp, job.plan.vp
    return per_rank(wl.chunk_layers, p, v)


PASSES = ("fwd", "bwd", "recompute")  # a block's passes, in the order a stage sums them


def stage_times(
    job: Job, wl: Workload, costs: Costs, priced: dict[str, tuple[PhaseCost, ...]] | None = None
) -> list[StageTime]:
    """Every pipeline rank, first to last: its layers, the embedding on the first, the head on the last.
    Ranks alike (same layers, neither end) share one StageTime; ``costs.stage_cache`` keeps them across calls.
    ``priced``: MoE only (``_moe_stage_times``)."""
    p = job.plan.pp
    if wl.moe_layer is not None:
        return _moe_stage_times(job, wl, costs, priced)
    cache = costs.stage_cache
    base_key = _stage_base_key(job, wl)

    passes = PASSES
    layers_of: dict[int, tuple[PhaseCost, ...]] = {}  # n layers' passes, scaled once per n

    def stage(n: int, first: bool, last: bool) -> StageTime:
        key = (base_key, n, first, last)
        hit = cache.get(key)
        if hit is None:
            if n and n not in layers_of:
                layers_of[n] = tuple(costs.phase(getattr(wl.layer, w)).scaled(n) for w in passes)
            parts = [(layers_of[n], 1)] if n else []
            if first:
                parts.insert(0, (tuple(costs.phase(getattr(wl.embed, w)) for w in passes), 1))
            if last:
                parts.append((tuple(costs.phase(getattr(wl.head, w)) for w in passes), 1))
            hit = cache[key] = _combine(job, parts, costs.cm)
        return hit

    counts = stage_layer_counts(job, wl)
    whole = cache.get((base_key, counts))
    if whole is not None:
        return whole
    if p == 1:
        out = [stage(counts[0], True, True)]
    else:
        middle = {n: stage(n, False, False) for n in set(counts[1:-1])}
        out = [stage(counts[0], True, False)] + [middle[n] for n in counts[1:-1]] + [stage(counts[-1], False, True)]
    cache[base_key, counts] = out  # callers read the list, never change it
    return out


def _stage_base_key(job: Job, wl: Workload) -> HashedKey:
    """What a dense stage's time depends on beside its layers and ends (``stage_times``' cache): the blocks (by value:
    equal blocks price alike) and what ``_combine`` reads besides their phases, the TP/CP overlap flags and degrees."""
    plan = job.plan
    return HashedKey((wl.embed, wl.layer, wl.head, plan.overlap.tp, plan.overlap.cp, plan.tp, plan.cp))


def _stage_kinds(counts: tuple[int, ...]) -> list[tuple[int, bool, bool]]:
    """The distinct (layers, first, last) of a pipeline's ranks (``stage_times``)."""
    if len(counts) == 1:
        return [(counts[0], True, True)]
    middle = [(n, False, False) for n in dict.fromkeys(counts[1:-1])]
    return [(counts[0], True, False), *middle, (counts[-1], False, True)]


def stage_key(job: Job, wl: Workload) -> tuple[HashedKey, tuple[int, ...]]:
    """A dense plan's whole-pipeline key in ``stage_times``' cache: its base key and the layers of each rank."""
    return _stage_base_key(job, wl), stage_layer_counts(job, wl)


def prefill_stage_times(
    plans: list[tuple[Job, Workload]],
    costs: Costs,
    templates: dict[HashedKey, StageTemplate] | None = None,
    keys: list[tuple[HashedKey, tuple[int, ...]] | None] | None = None,
) -> list[list[StageTime] | None]:
    """Price every stage kind of these dense plans that ``costs.stage_cache`` lacks in one pass on arrays: each
    stage's passes are (embedding if first) + n × layer + (head if last), summed in ``stage_times``' order (an absent
    part adds an exact 0), and ``_combine`` runs once on the arrays. The StageTimes it leaves in the cache are those
    ``stage_times`` would build one by one, to the last bit; a search fills a whole base's stages with it.
    ``templates``: each workload's priced blocks (``StageTemplate``), kept by a caller that prices many plans of the
    same blocks (search: one workload per micro-batch, sp and recompute serves every base of a TP/CP placement).
    ``keys``: each plan's ``stage_key`` where the caller has it (search: plans of one template share a base key,
    plans of one split their layer counts). Returns each plan's ``stage_times`` (None for an MoE plan:
    ``stage_times`` prices those one by one)."""
    priced, wanted = prefill_stages(plans, costs, templates, keys)
    priced.build_all()
    return [None if key is None else _pipeline(costs.stage_cache, *key) for key in wanted]


def prefill_stages(
    plans: list[tuple[Job, Workload]],
    costs: Costs,
    templates: dict[HashedKey, StageTemplate] | None = None,
    keys: list[tuple[HashedKey, tuple[int, ...]] | None] | None = None,
) -> tuple[PrefilledStages, list[tuple[HashedKey, tuple[int, ...]] | None]]:
    """``prefill_stage_times``' array pass without building a StageTime per stage kind: the priced stages (each
    one's total per micro-batch at hand, its StageTime built when asked: ``PrefilledStages``) and each plan's
    whole-pipeline key (base key, layers per rank; None for an MoE plan). A search reads every stage's total but
    the whole StageTime of the slowest only."""
    cache = costs.stage_cache
    templates = {} if templates is None else templates
    # the stage kinds to price, by what _combine reads of the plan (one array pass per value; a stage key, whose base
    # key holds those, is in one group), in the order met
    groups: dict[tuple, dict[tuple, tuple[Job, Workload, int, bool, bool]]] = {}
    kinds_of: dict[tuple[int, ...], list[tuple[int, bool, bool]]] = {}  # a split's stage kinds, listed once
    wanted: list[tuple | None] = []  # per plan: its whole-pipeline cache key
    for i, (job, wl) in enumerate(plans):
        if wl.moe_layer is not None:
            wanted.append(None)
            continue
        base_key, counts = stage_key(job, wl) if keys is None else keys[i]
        wanted.append((base_key, counts))
        if (base_key, counts) in cache:
            continue
        kinds = kinds_of.get(counts)
        if kinds is None:
            kinds = kinds_of[counts] = _stage_kinds(counts)
        todo = None
        for n, first, last in kinds:
            key = (base_key, n, first, last)
            if key not in cache:
                if todo is None:
                    plan = job.plan
                    todo = groups.setdefault((plan.overlap.tp, plan.overlap.cp, plan.tp, plan.cp), {})
                if key not in todo:
                    todo[key] = (job, wl, n, first, last)
    priced = PrefilledStages(cache)
    for todo in groups.values():
        _prefill_group(list(todo.items()), costs, templates, priced)
    return priced, wanted


def _pipeline(cache: dict, base_key: HashedKey, counts: tuple[int, ...]) -> list[StageTime]:
    """``stage_times``' list from the cache, every stage kind of it priced: first, middle ranks, last."""
    whole = cache.get((base_key, counts))
    if whole is None:
        if len(counts) == 1:
            whole = [cache[base_key, counts[0], True, True]]
        else:
            middle = {n: cache[base_key, n, False, False] for n in set(counts[1:-1])}
            first, last = cache[base_key, counts[0], True, False], cache[base_key, counts[-1], False, True]
            whole = [first] + [middle[n] for n in counts[1:-1]] + [last]
        cache[base_key, counts] = whole  # callers read the list, never change it
    return whole


class PrefilledStages:
    """Dense stage kinds priced on arrays (``prefill_stages``), by their key in the stage cache: each one's total per
    micro-batch, and its StageTime built when first asked (``stage``), to the last bit the one ``stage_times``
    builds, and left in the cache. Stages the cache held before are read from it."""

    def __init__(self, cache: dict) -> None:
        self.cache = cache
        self.at: dict[tuple, tuple[_PricedGroup, int]] = {}  # stage key -> the pass that priced it, its position

    def total(self, key: tuple) -> float:
        at = self.at.get(key)
        return self.cache[key].total if at is None else at[0].totals[at[1]].item()

    def stage(self, key: tuple) -> StageTime:
        st = self.cache.get(key)
        if st is None:
            group, i = self.at[key]
            st = self.cache[key] = group.stage(i, key)
        return st

    def build_all(self) -> None:
        """Every prefilled stage's StageTime in the cache."""
        for key in self.at:
            self.stage(key)

    def pipeline_totals(self, base_key: HashedKey, counts: tuple[int, ...]) -> list[float]:
        """The totals of a pipeline's ranks, first to last (``_pipeline``'s stages' totals)."""
        if len(counts) == 1:
            return [self.total((base_key, counts[0], True, True))]
        middle = {n: self.total((base_key, n, False, False)) for n in set(counts[1:-1])}
        first, last = self.total((base_key, counts[0], True, False)), self.total((base_key, counts[-1], False, True))
        return [first] + [middle[n] for n in counts[1:-1]] + [last]

    def slowest(self, base_key: HashedKey, counts: tuple[int, ...], totals: list[float]) -> StageTime:
        """``slowest_stage`` of the pipeline: the rank with the largest total, the first of equals."""
        rank = totals.index(max(totals))  # the first of equals, as ``max(range(p), key=totals.__getitem__)``
        p = len(counts)
        return self.stage((base_key, counts[rank], rank == 0, rank == p - 1))

    def slowest_row(self, base_key: HashedKey, counts: tuple[int, ...], totals: list[float]) -> SlowRow:
        """``slowest``'s fields as a ``SlowRow``, read off the prefilled arrays: no StageTime built unless the cache
        holds one already (``SlowRow.stage`` builds it for a caller that needs the whole)."""
        rank = totals.index(max(totals))  # the first of equals, as ``max(range(p), key=totals.__getitem__)``
        key = (base_key, counts[rank], rank == 0, rank == len(counts) - 1)
        at = self.at.get(key)
        if at is None or key in self.cache:
            return slow_row(self.stage(key), self, key)
        group, i = at
        compute, recompute, tp_exposed, cp_exposed, fwd, bwd = group.row(i)
        share = memory_share(_LinkScalars(*group.scalars(i)))  # the link's compute, gemm, attention
        return SlowRow(compute, recompute, tp_exposed, cp_exposed, fwd, bwd, share, 0.0, self, key)

    def split_rows(self, base_keys: list[HashedKey], counts: tuple[int, ...]) -> tuple[Any, list[SlowRow]] | None:
        """``pipeline_totals`` and ``slowest_row`` of pipelines with the same layers per rank (a split's plans, one base
        key each), read off the arrays at once: the ranks' totals (plans × ranks, the same numbers) and each plan's
        SlowRow, its slowest rank the first of equals. None unless one pass (``_prefill_group``) priced every stage
        kind of them: the caller reads those one by one."""
        import numpy as np

        kinds = _stage_kinds(counts)
        p = len(counts)
        rank_kind = np.array([kinds.index((n, s == 0, s == p - 1)) for s, n in enumerate(counts)])
        at, group, rows = self.at, None, []
        for base_key in base_keys:
            for n, first, last in kinds:
                hit = at.get((base_key, n, first, last))
                if hit is None or (group is not None and hit[0] is not group):
                    return None
                group = hit[0]
                rows.append(hit[1])
        kind_rows = np.array(rows).reshape(len(base_keys), len(kinds))
        totals = group.totals[kind_rows][:, rank_kind]  # (plan, rank)
        slow_rank = np.argmax(totals, axis=1)  # the first of equals, as ``slowest_row``
        slow_at = kind_rows[np.arange(len(base_keys)), rank_kind[slow_rank]]
        rows = zip(*(c[slow_at].tolist() for c in group.cols))  # the slowest stages' rows, the values ``row`` reads
        scalars = zip(*(c[slow_at].tolist() for c in group.scalar_cols))
        out = []
        for base_key, rank, row, link in zip(base_keys, slow_rank.tolist(), rows, scalars):
            share = memory_share(_LinkScalars(*link))
            key = (base_key, counts[rank], rank == 0, rank == p - 1)
            out.append(SlowRow(*row, share, 0.0, self, key))
        return totals, out

    def pipeline(self, base_key: HashedKey, counts: tuple[int, ...]) -> list[StageTime]:
        """``stage_times``' list of the pipeline, every stage of it built."""
        for n, first, last in _stage_kinds(counts):
            self.stage((base_key, n, first, last))
        return _pipeline(self.cache, base_key, counts)


class _LinkScalars(NamedTuple):
    """What ``memory_share`` reads of a pass's PhaseCost."""

    compute: float
    gemm: float
    attention: float


class SlowRow(NamedTuple):
    """The slowest stage's numbers a search reads on its grid (StageTime's fields, the memory-bound share of its
    link), and where its StageTime comes from (``stage``) for a caller that needs the whole."""

    compute: float
    recompute: float
    tp_exposed: float
    cp_exposed: float
    fwd: float
    bwd: float
    share: float  # ``memory_share(link)``
    ep_exposed: float
    source: Any  # the PrefilledStages that priced it, or None where ``key`` is the StageTime itself
    key: Any  # the stage's cache key, or its StageTime

    def stage(self) -> StageTime:
        return self.key if self.source is None else self.source.stage(self.key)


def slow_row(st: StageTime, source: PrefilledStages | None = None, key: tuple | None = None) -> SlowRow:
    """A StageTime's ``SlowRow`` (``source``/``key``: where it is cached, else the row keeps the StageTime)."""
    fields = (st.compute, st.recompute, st.tp_exposed, st.cp_exposed, st.fwd, st.bwd, memory_share(st.link))
    return SlowRow(*fields, st.ep_exposed, source, st if source is None else key)


@dataclass(frozen=True)
class StageTemplate:
    """A workload's embedding, layer and head priced: per pass (fwd, bwd, recompute), the three PhaseCosts; and
    per parts present (embedding, layers, head) the groups of a stage's link in ``stage_times``' order."""

    priced: tuple[tuple[PhaseCost, PhaseCost, PhaseCost], ...]
    groups: dict[tuple[bool, bool, bool], tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)

    def link_groups(self, present: tuple[bool, bool, bool]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        hit = self.groups.get(present)
        if hit is None:
            phases = [pc for by_block in self.priced for pc, on in zip(by_block, present) if on]
            hit = self.groups[present] = (
                tuple(dict.fromkeys(g for pc in phases for g in pc.comm)),
                tuple(dict.fromkeys(g for pc in phases for g in pc.comm_bytes)),
            )
        return hit


def _prefill_group(
    items: list[tuple], costs: Costs, templates: dict[HashedKey, StageTemplate], priced: PrefilledStages
) -> None:
    """``prefill_stage_times`` for stages whose plans agree on what ``_combine`` reads: each stage an index into
    the templates (the priced blocks of one workload) it is built of."""
    import numpy as np

    job = items[0][1][0]
    index: dict[HashedKey, int] = {}
    used: list[StageTemplate] = []
    at: list[int] = []  # per stage: its template's place in ``used``
    for key, (_, wl, _, _, _) in items:
        x = index.get(key[0])
        if x is None:
            tmpl = templates.get(key[0])
            if tmpl is None:
                blocks = (wl.embed, wl.layer, wl.head)
                by_pass = tuple(tuple(costs.phase(getattr(b, w)) for b in blocks) for w in PASSES)
                tmpl = templates[key[0]] = StageTemplate(by_pass)
            x = index[key[0]] = len(used)
            used.append(tmpl)
        at.append(x)
    t = np.array(at)
    n = np.array([it[2] for _, it in items], float)
    first = np.array([it[3] for _, it in items])
    last = np.array([it[4] for _, it in items])
    passes = tuple(_stage_pass([u.priced[w] for u in used], t, n, first, last) for w in range(len(PASSES)))
    st = _combine(job, [(passes, 1)], costs.cm)
    # each field a column over the stages, a stage's values read off them when asked (``_PricedGroup.row``): the few
    # stages a search reads whole, not ~2 x 10^4 rows of Python floats made and freed
    col = lambda x: np.broadcast_to(x, n.shape)  # a part no stage has stays a plain 0.0 (``.item()``)
    cols = [col(getattr(st, f)) for f in ("compute", "recompute", "tp_exposed", "cp_exposed", "fwd", "bwd")]
    link = st.link
    scalar_cols = [col(link.compute), col(link.gemm), col(link.attention)]
    comm, comm_bytes = _LinkRows(link.comm, col), _LinkRows(link.comm_bytes, col)
    totals = ((cols[0] + cols[1]) + cols[2]) + cols[3]  # as StageTime sums it
    group = _PricedGroup(used, index, cols, scalar_cols, comm, comm_bytes, np.asarray(totals, float))
    keys = [key for key, _ in items]
    priced.at.update(zip(keys, zip(itertools.repeat(group), range(len(keys)))))  # in C loops (~2 x 10^4 a search)


@dataclass(frozen=True)
class _PricedGroup:
    """One ``_prefill_group`` pass: per stage (by position) its StageTime fields and link, the blocks' templates."""

    used: list[StageTemplate]
    index: dict[HashedKey, int]
    cols: list[Any]  # per field an array over the stages: compute, recompute, tp_exposed, cp_exposed, fwd, bwd
    scalar_cols: list[Any]  # the link's compute, gemm, attention
    comm: _LinkRows
    comm_bytes: _LinkRows
    totals: Any  # per stage, its total (StageTime.total), as an array

    def row(self, i: int) -> tuple:
        """Stage ``i``'s fields (``cols``) as Python numbers: the values ``tolist`` gives."""
        return tuple(c[i].item() for c in self.cols)

    def scalars(self, i: int) -> tuple:
        return tuple(c[i].item() for c in self.scalar_cols)

    def stage(self, i: int, key: tuple) -> StageTime:
        groups = self.used[self.index[key[0]]].link_groups((key[2], key[1] > 0, key[3]))
        link = _phase_cost(*self.scalars(i), self.comm.of(i, groups[0]), self.comm_bytes.of(i, groups[1]))
        return _stage_time(*self.row(i), link)


class _LinkRows:
    """The prefilled stages' per-group link times (or bytes) as columns: stage ``i``'s dict of ``groups`` (a stage's
    ``link_groups``, in that order) is read off the columns, the values those of the arrays."""

    def __init__(self, by_group: dict, col: Callable) -> None:
        self.cols = {g: col(v) for g, v in by_group.items()}

    def of(self, i: int, groups: tuple[str, ...]) -> dict[str, float]:
        cols = self.cols
        return {g: cols[g][i].item() for g in groups}


def _stage_time(compute, recompute, tp_exposed, cp_exposed, fwd, bwd, link) -> StageTime:
    """``StageTime(...)`` of a dense stage (no EP) without the frozen dataclass's per-field ``object.__setattr__``
    (a search builds ~10^4): the same fields, the total summed as ``__post_init__`` sums it."""
    st = object.__new__(StageTime)
    total = compute + recompute + tp_exposed + cp_exposed
    st.__dict__.update(
        compute=compute,
        recompute=recompute,
        tp_exposed=tp_exposed,
        cp_exposed=cp_exposed,
        fwd=fwd,
        bwd=bwd,
        link=link,
        ep_exposed=0.0,
        total=total,
    )
    return st


def _stage_pass(priced: list[tuple[PhaseCost, PhaseCost, PhaseCost]], t, n, first, last) -> PhaseCost:
    """One pass of many stages as a PhaseCost of arrays: (embedding if first + n × layer) + head if last, the
    blocks' prices those of template ``t`` (per stage)."""
    import numpy as np

    groups = list({g: None for p in priced for pc in p for g in (*pc.comm, *pc.comm_bytes)})
    zeros = [0.0] * len(groups)

    def row(pc: PhaseCost) -> list[float]:  # a block's fields: compute, gemm, attention, per group time, bytes
        return [
            pc.compute,
            pc.gemm,
            pc.attention,
            *map(pc.comm.get, groups, zeros),
            *map(pc.comm_bytes.get, groups, zeros),
        ]

    # every field at once: (template, block, field) -> per stage (stage, field); each column the formula above
    blocks = np.array([[row(pc) for pc in p] for p in priced], float)[t]
    e, lay, h = blocks[:, 0], blocks[:, 1], blocks[:, 2]
    at = (np.where(first[:, None], e, 0.0) + lay * n[:, None]) + np.where(last[:, None], h, 0.0)
    col = list(at.T)
    k = len(groups)
    return PhaseCost(col[0], col[1], col[2], dict(zip(groups, col[3 : 3 + k])), dict(zip(groups, col[3 + k :])))


def _moe_stage_times(
    job: Job, wl: Workload, costs: Costs, priced: dict[str, tuple[PhaseCost, ...]] | None = None
) -> list[StageTime]:
    """``stage_times`` of an MoE model: each rank's dense layers and MoE layers (``Workload.stage_moe_layers``).
    ``priced``: block name -> its passes' prices, filled here; a caller that prices many splits of the same blocks
    (search, one template per micro-batch, sp and recompute) keeps it for them."""
    p = job.plan.pp
    counts = stage_layer_counts(job, wl)
    out: list[StageTime] = []
    memo: dict[tuple, StageTime] = {}
    priced = {} if priced is None else priced  # each block's passes, priced once

    def passes(block: str) -> tuple[PhaseCost, ...]:
        if block not in priced:
            priced[block] = tuple(costs.phase(getattr(getattr(wl, block), w)) for w in ("fwd", "bwd", "recompute"))
        return priced[block]

    pairs = hides_ep(job)
    chunks = rank_moe_chunks(job, wl.chunk_layers) if pairs else ()
    u = unpaired_share(job, wl.micro_batches) if pairs else 0.0
    for s, (n, e) in enumerate(zip(counts, wl.stage_moe_layers)):
        key = (n, e, s == 0, s == p - 1, chunks[s] if pairs else 0)
        hit = memo.get(key)
        if hit is None:
            parts = []
            if n - e:
                parts.append((passes("layer"), n - e))
            if e:
                parts.append((passes("moe_layer"), e))
            if s == 0:
                parts.insert(0, (passes("embed"), 1))
            if s == p - 1:
                parts.append((passes("head"), 1))
            pairing = EPPairing(moe_pieces(wl, costs, priced).scaled(e), e, chunks[s], u) if pairs and e else None
            hit = memo[key] = _combine(job, parts, costs.cm, pairing)
        out.append(hit)
    return out


def moe_pieces(wl: Workload, costs: Costs, priced: dict | None = None) -> OverlapPieces:
    """One MoE layer's ``OverlapPieces`` (``priced``: a caller's per-block price cache, as ``_moe_stage_times``')."""
    if priced is not None and "moe_pieces" in priced:
        return priced["moe_pieces"]
    from commtax.workload.moe import overlap_phases  # the MoE module builds on the step module

    pieces = overlap_pieces(costs, overlap_phases(wl.moe_layer))
    if priced is not None:
        priced["moe_pieces"] = pieces
    return pieces


DPRank = tuple[Workload, "DPStepParts | None"]  # one pipeline rank's DP workload and its bucketed traffic


def dp_ranks_with_count(ranks: list[DPRank], m: int, costs: Costs) -> list[DPRank]:
    """``dp_ranks`` for ``m`` micro-batches: the bucketed traffic depends on m only where the gradients are reduced
    every micro-batch (ZeRO-2, ``reduce_passes``)."""
    out: list[DPRank] = []
    for rank, parts in ranks:
        rank = replace(rank, micro_batches=m)
        out.append((rank, dp_step_parts(rank, costs) if parts is not None and rank.grads_sharded else parts))
    return out


def dp_ranks(job: Job, wl: Workload, costs: Costs) -> list[DPRank]:
    """MoE: each kind of pipeline rank's DP workload (``Workload.dp_stage_splits``) with its per-step traffic
    (``dp_step_parts``, where ``dp_timeline`` reads it), each carrying the optimizer of the rank with the most
    optimizer work (``slowest_optimizer``: the step waits for the slowest): what ``slowest_dp_workload`` compares,
    independent of the stage times, so a caller pricing many stage times (search) computes it once."""
    splits = dp_splits(job, wl)
    ranks = [with_dp_stage(job, wl, split) for split in splits]
    if splits is wl.dp_stage_splits:
        optimizer = max((r.optimizer for r in ranks), key=lambda c: c.bytes)  # = slowest_optimizer(job, wl)
    else:  # DualPipe: one stage's optimizer states per rank (``dp_splits``)
        optimizer = slowest_optimizer(job, wl)
    out: list[DPRank] = []
    for rank in ranks:
        rank = rank if rank.optimizer == optimizer else replace(rank, optimizer=optimizer)
        out.append((rank, dp_step_parts(rank, costs) if rank.dp_step and not rank.dp_microbatch else None))
    return out


def dp_splits(job: Job, wl: Workload) -> tuple[tuple[float, float], ...]:
    """MoE: the (dense, expert) parameters each kind of pipeline rank reduces per step, ``wl.dp_stage_splits``;
    under DualPipe rank r holds model stages r and p − 1 − r and reduces both stages' gradients (the 2×
    parameters of DeepSeek-V3 Table 2; deepseek-ai/DualPipe example_dualpipe.py sums each stage's gradient over
    the two ranks that hold it), so the pairs' sums. ZeRO-2 reduces after every backward (``reduce_passes``), and
    a backward runs through one of the rank's stages, m/2 through each: m reductions of the pair's mean (the
    step's one parameter all-gather, of both stages, is then counted at half: a small part of ZeRO-2's traffic).
    The optimizer stays one stage's (``slowest_optimizer``), as ``workload.memory`` keeps one copy of the optimizer
    states and two of the weights and gradients."""
    if job.plan.schedule != "dualpipe" or job.plan.pp < 2 or not wl.dp_stage_splits:
        return wl.dp_stage_splits
    s = stage_param_split(job)
    p, share = len(s), 0.5 if job.plan.zero == 2 else 1.0
    pairs = ((share * (s[r][0] + s[p - 1 - r][0]), share * (s[r][1] + s[p - 1 - r][1])) for r in range(p))
    return tuple(dict.fromkeys(pairs))


def dualpipe_dp_workload(job: Job, wl: Workload) -> Workload:
    """A dense workload's per-step DP traffic (ZeRO 0-2) under DualPipe, sized for the rank whose two stages hold the
    most parameters (``dp_splits`` does it for MoE ranks): the workload's is one stage's (the fullest), and a rank
    reduces both of its stages' gradients once per step, or under ZeRO-2 their mean after every backward. The
    collectives' bytes scale with the parameters; the codec is priced for the rank's."""
    p = job.plan.pp
    if job.plan.schedule != "dualpipe" or p < 2 or wl.dp_stage_splits or not wl.dp_step:
        return wl
    params = stage_params(job)
    share = 0.5 if job.plan.zero == 2 else 1.0
    rank = share * max(params[r] + params[p - 1 - r] for r in range(p))
    f = rank / max(params)
    return with_fields(
        wl,
        dp_step=tuple(replace(c, bytes=c.bytes * f) for c in wl.dp_step),
        dp_codec=grad_codec_ops(job, rank) if wl.dp_codec else (),
    )


def ranks_apart(job: Job, wl: Workload) -> bool:
    """Whether the pipeline ranks' DP traffic differs (MoE: ``dp_splits`` holds more than the workload's one split),
    so that the slowest of them is priced (``slowest_dp_rank``)."""
    splits = dp_splits(job, wl)
    return len(splits) > 1 or splits is not wl.dp_stage_splits


def slowest_dp_workload(
    job: Job, wl: Workload, costs: Costs, st: StageTime, ranks: list[DPRank] | None = None
) -> Workload:
    """``slowest_dp_rank``'s workload."""
    return slowest_dp_rank(job, wl, costs, st, ranks)[0]


def slowest_dp_rank(job: Job, wl: Workload, costs: Costs, st: StageTime, ranks: list[DPRank] | None = None) -> DPRank:
    """MoE: ``wl`` with its DP/EDP ops sized for the pipeline rank whose DP (dense gradients over dp plus expert
    gradients over edp) leaves the most exposed (``dp_exposed``; then the longest link time), and the optimizer of
    the rank with the most optimizer work: each rank runs its own DP and optimizer and the step waits for the
    slowest. The rank with the most parameters may hold no experts (DeepSeek-V3's first stage: the embedding and the
    dense layers), so sizing by parameters alone drops the expert gradients of every other rank.
    Dense workloads (one split, or none) are returned as they are (with no traffic parts). ``ranks``: ``dp_ranks``
    when the caller has them."""
    if not ranks_apart(job, wl):
        return wl, None
    ranks = dp_ranks(job, wl, costs) if ranks is None else ranks
    splits = dp_splits(job, wl)
    link_exposed = [dp_exposed(job, r, costs, st, parts)[1::-1] for r, parts in ranks]
    return ranks[max(range(len(ranks)), key=lambda i: (*link_exposed[i], splits[i] == wl.dp_split))]


def slowest_optimizer(job: Job, wl: Workload) -> Compute:
    """The optimizer step of the pipeline rank with the most optimizer work (MoE: dense states over dp, expert
    states over edp, ``wl.dp_stage_splits``); a dense workload's own."""
    if len(wl.dp_stage_splits) < 2:
        return wl.optimizer
    return max((with_dp_stage(job, wl, s).optimizer for s in wl.dp_stage_splits), key=lambda c: c.bytes)


def dp_exposed(
    job: Job, wl: Workload, costs: Costs, st: StageTime, parts: DPStepParts | None = None
) -> tuple[float, float, float]:
    """(link time, exposed time, bytes) of data-parallel traffic per step: what the timeline leaves exposed
    (``dp_timeline``) plus what the hidden part costs the compute it runs under (``dp_contention``). ``parts``:
    ``dp_step_parts(wl, costs)`` when the caller has it."""
    link, exposed, nbytes = dp_timeline(job, wl, costs, st, parts)
    return link, exposed + dp_contention(costs.cm, link, exposed, nbytes, st.link), nbytes


def dp_timeline(
    job: Job, wl: Workload, costs: Costs, st: StageTime, parts: DPStepParts | None = None
) -> tuple[float, float, float]:
    """(link time per step, exposed time per step, bytes per step) of data-parallel traffic.

    Overlapped reduction hides under the last micro-batch's backward; the last bucket stays exposed
    (PyTorch DDP / Megatron-Core overlap_grad_reduce). ZeRO-1/2 parameter all-gather hides under
    the next step's first forward (overlap_param_gather). With interleaving each model chunk is reduced
    and gathered on its own (``dp_step_exposed``). ZeRO-3 prefetches each layer's gather under the
    previous layer's compute; the first layer's gather and the last reduce-scatter are exposed; DeepSpeed's
    legacy per-parameter gathers overlap nothing (``per_parameter_sync_time``).
    """
    ov = job.plan.overlap.dp
    m = wl.micro_batches
    if wl.dp_microbatch and not zero3_prefetches(job):
        per_mb, nbytes = per_parameter_sync_time(job, wl, costs)
        return per_mb * m, per_mb * m, nbytes * m  # synchronised before every gather: nothing overlaps
    if wl.dp_microbatch:
        gf, gb, rs, units, mb_bytes = zero3_traffic(wl, costs)
        nbytes = mb_bytes * m
        link = (gf + gb + rs) * m
        if not ov:
            return link, link, nbytes
        return link, zero3_exposed_s(gf, gb, rs, units, st.fwd, st.bwd, m), nbytes
    if not wl.dp_step:
        return 0.0, 0.0, 0.0
    parts = dp_step_parts(wl, costs) if parts is None else parts
    if not ov:
        return parts.link, parts.link, parts.nbytes
    return parts.link, dp_step_exposed(parts, st, job.plan.pp, job.plan.vp, m, reduce_passes(wl)), parts.nbytes


def zero3_prefetches(job: Job) -> bool:
    """Whether ZeRO-3 gathers a unit at a time with prefetch (FSDP, DeepSpeed >= v0.6), so they can overlap, or each
    parameter tensor after a synchronize (``plan.zero3_gather`` per_parameter_sync: ``per_parameter_sync_time``)."""
    return job.plan.zero3_gather != "per_parameter_sync"


def zero3_traffic(wl: Workload, costs: Costs) -> tuple[float, float, float, int, float]:
    """One micro-batch's FSDP / ZeRO-3 traffic (``dp_timeline``): (forward gather, backward gather, reduce-scatter)
    seconds on the link, the units they are cut in and the bytes sent. Each gathers and reduce-scatters one layer
    (unit) at a time: L collectives, each paying α."""
    units = max(1, wl.layers_per_stage)
    gf, gb, rs = (units * costs.collective_time(c.group, c.op, c.bytes / units) for c in wl.dp_microbatch)
    return gf, gb, rs, units, sum(costs.sent_bytes(c) for c in wl.dp_microbatch)


def zero3_exposed_s(gather_fwd_s, gather_bwd_s, reduce_s, units, fwd_s, bwd_s, m):
    """Exposed overlapped FSDP / ZeRO-3 traffic of one step (``dp_timeline``); elementwise, so ``search`` evaluates
    it on the plan grid. Per micro-batch the forward's and the backward's gathers (and reduce-scatters) of its
    ``units`` layers hide under the stage's passes, but the first unit's gather has nothing to hide under (every
    micro-batch: FSDP reshards after backward); the last unit's reduce-scatter ends the step's backward: the
    optimizer waits for it (PyTorch FSDP notes, "FSDP Prefetch Nuances": "The 1st all-gather will not be able to
    overlap with anything")."""
    first_layer, last_rs = gather_fwd_s / units, reduce_s / units
    per_mb = maximum(0.0, gather_fwd_s - fwd_s) + maximum(0.0, gather_bwd_s + reduce_s - bwd_s) + first_layer
    return per_mb * m + last_rs


def reduce_passes(wl: Workload) -> int:
    """Gradient reductions per step: one per micro-batch when only a shard of the gradients is kept (ZeRO-2,
    ``Workload.grads_sharded``), else one (gradients accumulate in full, reduced after the last backward)."""
    return wl.micro_batches if wl.grads_sharded else 1


@dataclass(frozen=True)
class DPStepParts:
    """Per-step DP traffic of ZeRO 0-2, bucketed as PyTorch DDP / Megatron-Core do (``dp_step_parts``)."""

    link: float  # the reduction and gather on the link, plus the codec: the DP time of the step
    nbytes: float  # bytes sent
    times: list[float]  # [reduce time (all passes), gather time] on the link, the codec apart
    tail: float  # the last reduce bucket on the link
    first_bucket: float  # the first gather bucket
    codec: float  # the gradient codec of one reduction pass, whole gradient (``Workload.dp_codec``)


def dp_step_parts(wl: Workload, costs: Costs) -> DPStepParts:
    """Per-step DP traffic (ZeRO 0-2): reduce and gather time, bytes, last reduce bucket, first gather bucket, codec.
    ZeRO-2 reduces every micro-batch (``reduce_passes``): the reduce time and bytes are per step, all passes.
    ``wl.micro_batches`` may be an array of counts (a search's micro-batch sizes): what reads it, elementwise."""
    n = reduce_passes(wl)
    nbytes = sum(costs.sent_bytes(c) * (n if i == 0 else 1) for i, c in enumerate(wl.dp_step))
    times = [bucketed_time(costs, c, wl.bucket_bytes) * (n if i == 0 else 1) for i, c in enumerate(wl.dp_step)]
    if wl.edp_step:  # expert gradients over edp, on the same link after the dense ones (Megatron-Core: two buffers)
        nbytes += sum(costs.sent_bytes(c) * (n if i == 0 else 1) for i, c in enumerate(wl.edp_step))
        for i, c in enumerate(wl.edp_step):
            times[min(i, len(times) - 1)] += bucketed_time(costs, c, wl.bucket_bytes) * (n if i == 0 else 1)
    reduce_op = wl.dp_step[0]
    tail = costs.collective(collective_op("bucket", reduce_op.op, min(wl.bucket_bytes, reduce_op.bytes), "dp"))
    ratio = min(1.0, wl.bucket_bytes / max(1.0, reduce_op.bytes))
    codec = sum(costs.compute(op) for op in wl.dp_codec)
    first = times[1] * ratio if len(times) > 1 else 0.0
    return DPStepParts(sum(times) + codec * n, nbytes, times, tail, first, codec)


def edp_traffic(job: Job, wl: Workload, costs: Costs) -> tuple[float, float]:
    """(link time, bytes) per step of the expert gradients' reduction over edp: the share of the DP link time and
    bytes (``dp_step_parts``) that the edp collectives carry, reported as their own group. ZeRO-3 prices the experts
    with the dense ones and has none apart."""
    if job.plan.zero >= 3:
        return 0.0, 0.0
    n = reduce_passes(wl)
    ops = [c for c in (*wl.dp_step, *wl.edp_step) if c.group == "edp"]
    first = {c.name for c in ops[:1]}  # the reduction runs once per pass, the gather once per step
    link = sum((bucketed_time(costs, c, wl.bucket_bytes) * (n if c.name in first else 1) for c in ops), 0.0)
    nbytes = sum((costs.sent_bytes(c) * (n if c.name in first else 1) for c in ops), 0.0)
    return link, nbytes


def dp_step_exposed(parts: DPStepParts, st: StageTime, pp: int, vp: int, m: int, passes: int = 1) -> float:
    """Exposed part of overlapped per-step DP traffic: the reduction under the last backwards, the ZeRO-1/2
    gather under the first forwards. Interleaved 1F1B reduces and gathers each model chunk on its own
    (Megatron-Core schedules.py: grad_sync_func after a chunk's last backward, param_sync_func before its
    first forward), so chunks other than the last to finish hide under the pipeline's cool-down / warm-up.

    With ``passes`` > 1 (ZeRO-2: one reduction per micro-batch, ``reduce_passes``) the last pass is exposed as
    above and each earlier one runs under the compute of one micro-batch (its forward and backward): what it
    takes beyond that is exposed, (passes − 1) · max(0, r − (fwd + bwd)), r = one pass.

    The gradient codec (``Workload.dp_codec``: quantize/dequantize passes, PowerSGD's GEMMs, DDP's bucket copies)
    is the device's own work — memory-bound kernels sharing HBM with the backward they overlap; on a CPU rank,
    the core backward runs on — so it never hides: all of it is charged. Only the wire hides under compute."""
    gather = len(parts.times) > 1
    return dp_step_exposed_s(
        parts.times[0],
        parts.times[1] if gather else 0.0,
        gather,
        parts.tail,
        parts.first_bucket,
        parts.codec,
        st.fwd,
        st.bwd,
        pp,
        vp,
        m,
        passes,
    )


def dp_step_exposed_s(reduce_s, gather_s, gathers, tail_s, first_bucket_s, codec_s, fwd_s, bwd_s, pp, vp, m, passes):
    """``dp_step_exposed`` on its numbers: elementwise, so ``search`` evaluates it on the whole plan grid.

    reduce_s, gather_s: ``DPStepParts.times`` (gathers: whether there is a gather); fwd_s, bwd_s: the slowest
    stage's passes; passes: ``reduce_passes``."""
    v = where(pp > 1, vp, 1)
    spacing = where(v > 1, minimum(m, pp), 0)
    r = reduce_s / passes
    exposed = chunked_reduce_exposed(r, v, bwd_s / v, spacing * bwd_s / v, tail_s)
    exposed = exposed + (passes - 1) * maximum(0.0, r - (fwd_s + bwd_s))
    exposed = exposed + codec_s * passes
    gather = chunked_gather_exposed(gather_s, v, fwd_s / v, spacing * fwd_s / v, first_bucket_s)
    return where(gathers, exposed + gather, exposed)


def chunked_reduce_exposed(total_s: float, chunks: int, own_s: float, spacing_s: float, floor_s: float) -> float:
    """Exposed time of a gradient reduction split over ``chunks`` model chunks (interleaved 1F1B, v = chunks).

    On the first pipeline rank (the last to finish) chunk k's last backward ends k·spacing before the end of the
    step's compute (spacing = p backward passes of one chunk: Megatron's interleaved schedule runs the last
    micro-batches in groups of p per chunk, chunk v−1 first); its reduction (total/v) can start as that backward
    produces gradients (``own_s`` earlier) and the reductions share one link, in order. Exposed = when the last
    one ends after the compute does, at least the last bucket (``floor_s``). With one chunk: max(floor, total − own).

    Unrolled, the last reduction ends at max_j (−j·spacing − own + (j+1)·r), r = total/v, linear in j: at j = v−1
    when r > spacing, else at j = 0, so  end = r − own + (v−1)·max(0, r − spacing).
    """
    r = total_s / chunks
    return maximum(floor_s, r - own_s + (chunks - 1) * maximum(0.0, r - spacing_s))


def chunked_gather_exposed(total_s: float, chunks: int, own_s: float, spacing_s: float, floor_s: float) -> float:
    """Exposed time of a ZeRO-1/2 parameter all-gather split over ``chunks`` model chunks, all launched when the
    step starts and run in order on one link: chunk k's first forward starts k·spacing in (p forwards of each
    earlier chunk) and can consume its gathered buckets over its own forward (``own_s``). Exposed = the largest
    lateness, at least the first bucket (``floor_s``). With one chunk: max(floor, total − own).
    Lateness of chunk k: (k+1)·g − k·spacing − own, g = total/v, largest at k = v−1 when g > spacing, else k = 0."""
    g = total_s / chunks
    return maximum(floor_s, g - own_s + (chunks - 1) * maximum(0.0, g - spacing_s))


def per_parameter_sync_time(job: Job, wl: Workload, costs: Costs) -> tuple[float, float]:
    """(time, bytes sent) of one micro-batch's ZeRO-3 traffic when every parameter tensor moves on its own
    (plan.zero3_gather = per_parameter_sync: DeepSpeed v0.3.13-v0.5.10, catalog/frameworks.yaml).

    Each tensor is all-gathered ``zero3_gather_passes`` times (forward, recomputed forward under full recompute,
    backward) and its gradient reduce-scattered once, each call after a ``torch.cuda.synchronize()``, so nothing
    overlaps. A call passes a list of n per-rank views: DeepSpeed builds them with one ``narrow`` each (Python),
    ProcessGroupNCCL then copies each view in or out of its flat buffer (one ``copy_`` each, PyTorch <= 1.10
    ``ProcessGroupNCCL::allgather``/``reduce_scatter``): about one eager op per rank, ``cpu_op_s`` (assumptions.yaml,
    host time of one op issued from Python; the view costs the Python half, the copy the dispatch-and-launch half).

        t_call = NCCL(op, tensor bytes, DP group)  +  n · cpu_op_s
    """
    n = costs.group_size("dp", "all_gather")
    host = n * costs.cm.cpu_op_s
    p_bytes, g_bytes = weight_bytes_per_param(job.training.precision), grad_bytes_per_param(job)

    def calls(tensors: tuple[float, ...]) -> tuple[float, float, float, float]:
        gather = sum(costs.collective_time("dp", "all_gather", e * p_bytes) + host for e in tensors)
        reduce = sum(costs.collective_time("dp", "reduce_scatter", e * g_bytes) + host for e in tensors)
        elems = sum(tensors)
        return gather, reduce, elems * p_bytes, elems * g_bytes

    L = wl.layers_per_stage
    lg, lr, lpb, lgb = calls(wl.zero3_layer_tensors)
    og, orr, opb, ogb = calls(wl.zero3_other_tensors)
    passes = wl.zero3_gather_passes
    time = passes * (L * lg + og) + L * lr + orr
    bus = (n - 1) / n
    return time, bus * (passes * (L * lpb + opb) + L * lgb + ogb)


def bucketed_time(costs: Costs, c: Collective, bucket_bytes: float) -> float:
    """DP traffic goes in buckets (PyTorch DDP, Megatron-Core): ⌈S/bucket⌉ collectives, each paying its α."""
    n = max(1, math.ceil(c.bytes / bucket_bytes))
    return n * costs.collective_time(c.group, c.op, c.bytes / n)


def pp_exposed(job: Job, wl: Workload, costs: Costs, stages: list[StageTime], vp=None) -> tuple[float, float, float]:
    """(link time, exposed time, bytes) of pipeline sends for one step on the busiest rank.

    The fill and drain cross every stage boundary in turn: 2(p − 1) sends (GPipe: nothing else; its
    passes do not wait on a round trip). Interleaved 1F1B crosses every virtual-stage boundary, 2(p·v − 1)
    sends, the rest overlapping compute (Megatron overlap_p2p_comm); without that overlap each micro-batch's
    blocking send/recv pair adds 2 (Megatron-LM p2p_communication, send_forward_recv_backward). Plain 1F1B
    alternates one forward and one backward per stage, and a backward waits for the gradient of the
    forward it sent on: a round trip over k boundaries holds k + 1 stages' passes and 2k sends, so the
    steady state runs at C = max over stage ranges of (Σ T_s + 2k·t_send)/(k + 1) per micro-batch
    (``steady_cycle``; uniform: T + 2(p−1)/p·t_send), beyond T_max m times, plus 2(p − 2) sends of the fill.
    ``vp``: the plan's, or an array of values of it (a search's grid, the stages alike).
    """
    p, v, m = job.plan.pp, job.plan.vp if vp is None else vp, wl.micro_batches
    if p == 1:
        return 0.0, 0.0, 0.0
    t_send = costs.collective(wl.pp_send)
    sends = 2 * v * m  # each micro-batch: forward activation and backward gradient, per model chunk
    exposed = sends_exposed(job.plan.schedule, p, v, m, t_send, list(map(_total, stages)), job.plan.overlap.pp)
    return sends * t_send, exposed, sends * costs.sent_bytes(wl.pp_send)


def sends_exposed(
    schedule: str, p: int, v: int, m: int, t_send: float, totals: list[float], overlap_pp: bool = True
) -> float:
    """Exposed pipeline-send time of one step (``pp_exposed``), from the stages' per-micro-batch totals; ``v``, ``m``,
    ``t_send`` and each stage's total may be arrays (elementwise: a search's plans of one split, ``steady_cycle``)."""
    fill = 2 * (p - 1) * t_send
    if schedule == "gpipe":
        return fill
    chunked = v > 1
    interleaved = 2 * (p * v - 1) * t_send + (0.0 if overlap_pp else 2 * m * t_send)
    if chunked is True:
        return interleaved
    slowest = largest(totals)
    plain = maximum(fill, m * (steady_cycle(totals, t_send, slowest) - slowest) + 2 * (p - 2) * t_send)
    return where(chunked, interleaved, plain)


def steady_cycle(totals: list, t_send, slowest=None):
    """1F1B's time per micro-batch in the steady state: the slowest stage, or a round trip over k stage
    boundaries (k + 1 stages' passes and 2k sends per k + 1 micro-batches), whichever is longer (max-plus).

    Over a run of equal stages the mean of a range moves monotonically as an end moves, so only ranges
    that start and end at the first or last stage of a run need trying (stages come in a few runs).
    ``totals``: per stage a float, or an array of many plans' (``t_send`` too): elementwise, each plan's runs its own
    (a range is tried where both its ends end a run of that plan), so each element is the scalar result.
    ``slowest``: ``largest(totals)``, where the caller has it."""
    best = largest(totals) if slowest is None else slowest
    if all(type(t) in (float, int) for t in totals):  # one plan (estimate, simulate): plain Python, no NumPy
        return _cycle_of_floats(totals, t_send, best)
    return _cycle_of_arrays(totals, t_send, best)


def _round_trip(span, k, t_send):
    """A round trip over k boundaries per micro-batch: its k + 1 stages' passes (``span``) and 2k sends, over k + 1."""
    return (span + 2 * k * t_send) / (k + 1)


def _cycle_of_floats(totals: list, t_send, best):
    """``steady_cycle`` of one plan's stages, range by range, from the slowest stage's ``best``."""
    prefix = [0.0]
    for t in totals:
        prefix.append(prefix[-1] + t)
    n = len(totals)
    ends = [i for i in range(n) if i in (0, n - 1) or totals[i] != totals[i - 1] or totals[i] != totals[i + 1]]
    for x, a in enumerate(ends):
        for b in ends[x + 1 :]:
            best = maximum(best, _round_trip(prefix[b + 1] - prefix[a], b - a, t_send))
    return best


def _cycle_of_arrays(totals: list, t_send, best):
    """``steady_cycle`` of many plans, the stages stacked on a first axis and every range between stages that end a
    run in some plan priced at once (~20 NumPy calls, not ~10 a stage): the same IEEE operations, element by element
    (each prefix sum left to right from 0.0; a maximum rounds nothing, so the order of the ranges does not matter),
    from the slowest stage's ``best``."""
    import numpy as np

    stacked = _stacked(totals, t_send)  # (stage, *plans)
    prefix = np.add.accumulate(np.concatenate((np.zeros((1, *stacked.shape[1:])), stacked)))
    change = stacked[1:] != stacked[:-1]  # stage i + 1's total is not stage i's
    end = np.ones(stacked.shape, bool)  # the first and last stages end a run in every plan
    end[1:-1] = change[:-1] | change[1:]
    ends = np.flatnonzero(end.reshape(len(end), -1).any(axis=1)).tolist()
    pairs = [(a, b) for x, a in enumerate(ends) for b in ends[x + 1 :]]  # every range a < b
    if not pairs:
        return best
    first, last = np.array(pairs).T
    k = (last - first).reshape(-1, *(1,) * (stacked.ndim - 1))
    cycle = _round_trip(prefix[last + 1] - prefix[first], k, t_send)
    return maximum(best, np.where(end[first] & end[last], cycle, -np.inf).max(axis=0))


def _stacked(totals: list, t_send):
    """The stages' totals as one array, stage first; broadcast with ``t_send`` where they differ in shape or it has
    axes beyond theirs (as the stage-by-stage arithmetic broadcasts them)."""
    import numpy as np

    try:
        stacked = np.array(totals)
    except ValueError:  # NumPy refuses a ragged list: floats beside arrays, or arrays of other shapes
        stacked = None
    if stacked is None or np.ndim(t_send) >= stacked.ndim:
        stacked = np.array(np.broadcast_arrays(*totals, t_send)[:-1])
    return stacked


def step_parts(
    *, micro_batches, compute, recompute, tp_exposed, cp_exposed, bubble_s, pp_exposed, dp_exposed, optimizer
):
    """The step's parts (BREAKDOWN_KEYS order): m × one micro-batch on the slowest stage (compute, recompute,
    exposed TP and CP), the pipeline bubble (``pipeline_bubble``), exposed PP, exposed DP, optimizer.

    Plain arithmetic, so it works elementwise on NumPy arrays too (``commtax.decide.search`` evaluates whole grids).
    """
    m = micro_batches
    return {
        "compute": m * compute,
        "recompute": m * recompute,
        "tp_exposed": m * tp_exposed,
        "cp_exposed": m * cp_exposed,
        "pp_bubble": bubble_s,
        "pp_exposed": pp_exposed,
        "dp_exposed": dp_exposed,
        "optimizer": optimizer,
    }


_total = operator.attrgetter("total")


def slowest_and_rest(stages: list[StageTime]) -> tuple[StageTime, float]:
    """The slowest stage (it sets the pace) and Σ T_s − T_max, the time of the other stages per micro-batch."""
    return slowest_stage(stages), pipeline_rest(list(map(_total, stages)))


def pipeline_ranks(schedule: str, stages: list[StageTime]) -> list[StageTime]:
    """Per pipeline rank, one micro-batch's share of its work: the stages themselves, except under DualPipe, where
    rank r holds model stages r and p − 1 − r (deepseek-ai/DualPipe examples/example_dualpipe.py: ``local_modules``
    = stages r and p − 1 − r) and runs m/2 micro-batches through each (``dualpipe.py`` ``step``: half the chunks
    fed at each end), so m × its (T_r + T_{p−1−r})/2 (``rank_pair``). DualPipeV's V (rank r holding virtual stages
    r and 2p − 1 − r) needs a layer split of its own and keeps the stages (docs/moe.md)."""
    if schedule != "dualpipe" or len(stages) < 2:
        return stages
    p = len(stages)
    return [rank_pair(stages[r], stages[p - 1 - r]) for r in range(p)]


def rank_pair(a: StageTime, b: StageTime) -> StageTime:
    """A DualPipe rank's mean micro-batch over its two model stages ``a`` and ``b``, every field (a + b)/2: m of
    them are the m/2 micro-batches it runs through each."""
    if a is b:
        return a
    return StageTime(
        compute=(a.compute + b.compute) / 2,
        recompute=(a.recompute + b.recompute) / 2,
        tp_exposed=(a.tp_exposed + b.tp_exposed) / 2,
        cp_exposed=(a.cp_exposed + b.cp_exposed) / 2,
        fwd=(a.fwd + b.fwd) / 2,
        bwd=(a.bwd + b.bwd) / 2,
        link=(a.link + b.link).scaled(0.5),
        ep_exposed=(a.ep_exposed + b.ep_exposed) / 2,
    )


def slowest_stage(stages: list[StageTime]) -> StageTime:
    """The stage with the largest per-micro-batch total (the first of equals): it sets the pace."""
    return max(stages, key=_total)


def pipeline_rest(totals: list):
    """Σ T_s − T_max from the stages' totals (floats, or arrays of many plans': elementwise)."""
    return maximum(0.0, sum(totals) - largest(totals))


def one_f_one_b_bubble(totals: list, vp):
    """1F1B's (and interleaved 1F1B's) bubble, Σ_{s≠max} T_s / v (``pipeline_bubble``): floats or arrays."""
    return pipeline_rest(totals) / vp


def pipeline_bubble(schedule: str, m: int, vp: int, stages: list[StageTime]) -> float:
    """Time the slowest stage waits per step, beyond its m micro-batches (T_s: one micro-batch fwd+bwd on stage s).
    ``vp`` may be an array of values (a search's grid, the stages alike): elementwise.

    1F1B (and interleaved): in the steady state every stage alternates one forward and one backward, so the
    slowest stage paces the pipeline and the fill and drain cross the others once:
        bubble = Σ_{s≠max} T_s / v      (uniform: (p−1)/v·T, Narayanan et al. 2021 §2.2; v > 1 needs p | m).
    GPipe: all forwards, then all backwards: two flow shops of m identical jobs, each (m−1)·max + Σ over stages
    (Huang et al. 2019; the permutation flow-shop makespan for identical jobs):
        step_pipeline = Σ_s T_s + (m−1)·(max_s F_s + max_s B_s);  bubble = that − m·T_max.
    Both hold for every m ≥ 1, m < p included ((m + p − 1)·T for uniform stages).
    """
    if schedule == "dualpipe":
        return dualpipe_bubble(stages, m)
    slow, others = slowest_and_rest(stages)
    if schedule == "dualpipev":
        # DeepSeek-V3 Table 2 on the 1F1B stages (DualPipeV's V is not split apart, ``pipeline_ranks``): the
        # paired chunk F&B takes F + B and W half of B (zero-bubble's split), so per stage (PP/2−1)(F + B/2)
        p = len(stages)
        if p < 2 or slow.total <= 0:
            return 0.0
        share = (slow.fwd + 0.5 * slow.bwd) / (slow.fwd + slow.bwd) if slow.fwd + slow.bwd > 0 else 1.0
        return others * (p / 2 - 1) / (p - 1) * share
    if schedule == "gpipe":
        span = sum(map(_total, stages)) + (m - 1) * (max(s.fwd for s in stages) + max(s.bwd for s in stages))
        return max(0.0, span - m * slow.total)
    if schedule in ("zb-h1", "zb-v") and m >= len(stages):
        return zero_bubble(schedule, stages, slow)
    return one_f_one_b_bubble(list(map(_total, stages)), vp)  # 1f1b, interleaved, 1f1b-flexible (Llama 3 §3.3.2)


def dualpipe_bubble(stages: list[StageTime], m: int) -> float:
    """DualPipe's bubble on the pipeline ranks (``pipeline_ranks``), beyond m × the slowest rank's micro-batch.

    DeepSeek-V3 report Table 2 and the DualPipe README's table give (PP/2 − 1)(F&B + B − 3W) for equal stages: F&B
    the overlapped forward-backward pair (here F + B: each pass's exposed exchanges are already in it,
    ``ep_exposed``), B a full backward (recompute included), W its weight-gradient part (``weight_grad_s``). Ranks
    r and p − 1 − r hold the same two stages: p/2 kinds of rank, h = min(r, p − 1 − r) from the ends. Both ends
    feed micro-batches, so rank h waits for the fill and drain through the h kinds between it and the ends, each
    once with its own times, U_h = F_h + 2·B_h − 3·W_h (the paper's term), and the step is the longest rank's:
        pipeline = max_h (m·T_h + Σ_{h' < h} U_h'),   bubble = pipeline − m·T_max
    = (PP/2 − 1)(F&B + B − 3W) when the stages are equal (the middle rank, h = PP/2 − 1, ends last), and 0 where
    the rank at the ends is the slowest by more than the others' fill (its own work spans the step)."""
    if len(stages) < 2:
        return 0.0
    return dualpipe_ranks_bubble(pipeline_ranks("dualpipe", stages), m)


def dualpipe_ranks_bubble(ranks: list[StageTime], m: int) -> float:
    """``dualpipe_bubble`` on the pipeline ranks' own micro-batches (``rank_pair``; stages on GPU pools,
    ``schedule.pools``, give ranks r and p − 1 − r their own pools' times): each kind h of rank, h from the ends,
    is paced by the slower of ranks h and p − 1 − h."""
    p = len(ranks)
    if p < 2:
        return 0.0
    ranks = [max(ranks[h], ranks[p - 1 - h], key=_total) for h in range(p // 2)]
    slow = max(x.total for x in ranks)
    span, fill = m * slow, 0.0
    for x in ranks:
        span = max(span, m * x.total + fill)
        fill += max(0.0, x.fwd + 2 * x.bwd - 3 * weight_grad_s(x))
    return span - m * slow


def weight_grad_s(s: StageTime) -> float:
    """W of one micro-batch on a stage: the weight-gradient GEMMs, half of the backward without recompute (each
    linear layer's backward is a data-gradient and a weight-gradient GEMM of the forward's FLOPs; Qi et al. 2023
    §2 take T_B = T_W)."""
    return (s.bwd - s.recompute) / 2


def zero_bubble(schedule: str, stages: list[StageTime], slow: StageTime) -> float:
    """Zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Table 1 / §6): the backward is
    split into B (input gradient) and W (weight gradient), and W passes fill the fill/drain bubble.

    * ZB-H1, on every stage the peak memory of 1F1B's first: (p − 1)(T_F + T_B − T_W): Σ_{s≠max} (T_s − 2 W_s),
      a third of 1F1B's (p − 1)(T_F + T_B + T_W) when T_F = T_B = T_W.
    * ZB-V, two chunks per stage in a V, the same peak memory: (p − 1)(T_F + T_B − 2 T_W) with a chunk's times
      (half a stage's): Σ_{s≠max} (T_s − 3 W_s) / 2, zero when T_F = T_B = T_W.

    Both need m ≥ p micro-batches (fewer: 1F1B's bubble, ``pipeline_bubble``).
    """
    others = [s for s in stages if s is not slow]
    if schedule == "zb-h1":
        return sum(max(0.0, s.total - 2 * weight_grad_s(s)) for s in others)
    return sum(max(0.0, s.total - 3 * weight_grad_s(s)) / 2 for s in others)


def plan_notes(job: Job, wl: Workload) -> list[str]:
    """Things about the plan a user should know when reading the numbers."""
    p, c = job.plan, job.cluster
    notes = []
    if p.tp > c.gpus_per_node:
        notes.append(
            f"TP group ({p.tp}) is larger than the NVLink domain ({c.gpus_per_node}): TP traffic crosses the network"
        )
    if p.tp * p.cp > c.gpus_per_node and p.cp > 1:
        notes.append("CP ring spans nodes: K/V exchange crosses the network")
    if p.pp > 1 and p.tp * p.cp * job.dp >= c.gpus_per_node:
        notes.append("pipeline sends cross nodes and share the NICs with DP traffic")
    if not p.flash_attention:
        notes.append(
            f"{p.framework}: attention scores materialised (attention: eager); DP reduction "
            f"{'overlaps backward' if p.overlap.dp else 'after backward'}"
        )
    refusal = zero_refusal(p.framework, p.zero)
    if refusal:
        notes.append(f"{refusal}: priced as stated")
    if p.pp > 1 and wl.micro_batches < p.pp:
        notes.append(f"fewer micro-batches ({wl.micro_batches}) than pipeline stages ({p.pp}): the bubble dominates")
    return notes


def estimate(job: Job, workload: Workload | None = None, costs: Costs | None = None) -> Breakdown:
    """Predict one training step of ``job`` (analytical schedule).

    ``workload`` and ``costs`` default to the job's own; passing them lets a caller (the simulator's
    agreement tests, search) evaluate the same ops and prices both ways.
    """
    if job.cluster.pools and workload is None and costs is None:
        from commtax.schedule.pools import pooled_estimate  # it builds on this module's functions

        return pooled_estimate(job)
    wl = workload or build_workload(job)
    costs = costs or Costs(job)
    stages = stage_times(job, wl, costs)
    m = wl.micro_batches
    slow = slowest_stage(pipeline_ranks(job.plan.schedule, stages))  # DualPipe: the busiest rank's two stages
    wl = dualpipe_dp_workload(job, slowest_dp_workload(job, wl, costs, slow))
    pp_link, pp_exp, pp_bytes = pp_exposed(job, wl, costs, stages)
    dp_link, dp_exp, dp_bytes = dp_exposed(job, wl, costs, slow)
    optimizer = costs.compute(wl.optimizer)
    parts = step_parts(
        micro_batches=m,
        compute=slow.compute,
        recompute=slow.recompute,
        tp_exposed=slow.tp_exposed,
        cp_exposed=slow.cp_exposed,
        bubble_s=pipeline_bubble(job.plan.schedule, m, job.plan.vp, stages),
        pp_exposed=pp_exp,
        dp_exposed=dp_exp,
        optimizer=optimizer,
    )
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
    if wl.moe_layer is not None:
        parts = {**dict(list(parts.items())[:4]), "ep_exposed": m * slow.ep_exposed, **dict(list(parts.items())[4:])}
        comm_time["ep"] = m * sum(slow.link.comm.get(g, 0.0) for g in EP_GROUPS)
        comm_bytes["ep"] = m * sum(slow.link.comm_bytes.get(g, 0.0) for g in EP_GROUPS)
        edp_link, edp_bytes = edp_traffic(job, wl, costs)
        comm_time["dp"], comm_bytes["dp"] = max(0.0, dp_link - edp_link), max(0.0, dp_bytes - edp_bytes)
        comm_time["edp"], comm_bytes["edp"] = edp_link, edp_bytes
    mem = memory(job)
    return make_breakdown(
        job,
        wl,
        parts,
        comm_time,
        comm_bytes,
        mem.gib(),
        mem.total <= job.cluster.gpu.mem_bytes,
        notes=plan_notes(job, wl) + dualpipe_notes(job, m, stages, slow) + dualpipe_dp_notes(job, wl, costs, stages),
    )


def dualpipe_notes(job: Job, m: int, stages: list[StageTime], slow: StageTime) -> list[str]:
    """What a DualPipe breakdown counts: the pipeline rank it is read from and its two model stages."""
    p = job.plan.pp
    if job.plan.schedule != "dualpipe" or p < 2:
        return []
    rk = pipeline_ranks("dualpipe", stages).index(slow)
    return [
        f"DualPipe priced per pipeline rank: rank r holds model stages r and {p - 1}−r and runs m/2 = {m / 2:g} "
        f"micro-batches through each; breakdown and comm_time_s (dp, edp apart: below) of rank {rk} (model "
        f"stages {rk} and {p - 1 - rk}), the busiest; each rank reduces both stages' gradients; bubble "
        "(PP/2 − 1)(F&B + B − 3W) per kind of rank (DeepSeek-V3 Table 2)"
    ]


def dualpipe_dp_rank(job: Job, wl: Workload) -> int:
    """The DualPipe rank whose DP ``estimate`` prices (``wl``: the workload after ``slowest_dp_workload`` and
    ``dualpipe_dp_workload``): MoE, the first rank holding the chosen split (``dp_splits``); dense, the first rank
    whose two stages hold the most parameters (``dualpipe_dp_workload``)."""
    p = job.plan.pp
    if wl.dp_stage_splits:
        s, share = stage_param_split(job), 0.5 if job.plan.zero == 2 else 1.0
        pairs = [(share * (s[r][0] + s[p - 1 - r][0]), share * (s[r][1] + s[p - 1 - r][1])) for r in range(p)]
        return pairs.index(wl.dp_split) if wl.dp_split in pairs else 0
    params = stage_params(job)
    pairs = [params[r] + params[p - 1 - r] for r in range(p)]
    return pairs.index(max(pairs))


def dualpipe_zero2_tail_s(reduce_s: float, w_s: float, h: int, last_s: float) -> float:
    """ZeRO-2 under DualPipe: the time a rank's last gradient reductions run past its compute. A reduction follows
    each W pass (a micro-batch's weight gradients are complete only after it: deepseek-ai/DualPipe ``_weight_chunk``
    pops ``WeightGradStore``), and the rank's last h + 1 W passes run back to back (``dualpipe.py`` step 8: nW,
    h = min(r, p − 1 − r)). On one link, in order, reductions of r seconds each stream bucket by bucket under their
    W (w seconds), none ending before its last bucket (``last_s``) after its W: the j-th from last ends
    max((j + 1)(r − w), last + j(r − w)) after the compute; linear in j, so over j = 0..h
        tail = max(last, r − w) + h·max(0, r − w)
    (r ≤ w: the last bucket alone, each reduction hiding under the next W; one bucket, last = r: r + h(r − w))."""
    return max(last_s, reduce_s - w_s) + h * max(0.0, reduce_s - w_s)


def dualpipe_dp_notes(job: Job, wl: Workload, costs: Costs, stages: list[StageTime]) -> list[str]:
    """The DualPipe rank whose DP traffic dp_exposed and comm_time_s dp/edp are of, and under ZeRO-2 the tail
    of reductions after the last W passes (``dualpipe_zero2_tail_s``), named with its figure, not priced."""
    p = job.plan.pp
    if job.plan.schedule != "dualpipe" or p < 2 or not wl.dp_step or wl.dp_microbatch:
        return []
    k = dualpipe_dp_rank(job, wl)
    out = [
        f"DualPipe DP: dp_exposed and comm_time_s dp{'/edp' if wl.edp_step else ''} of rank {k} (model stages {k} and "
        f"{p - 1 - k}), the rank whose DP the step waits for longest (simulate reports the same rank's)"
    ]
    if wl.grads_sharded and wl.micro_batches > 1:
        h, mb = min(k, p - 1 - k), wl.micro_batches
        parts = dp_step_parts(wl, costs)
        r = parts.times[0] / mb
        pair = pipeline_ranks("dualpipe", stages)[k]
        w = weight_grad_s(pair)
        tail = dualpipe_zero2_tail_s(r, w, h, parts.tail)
        last = max(parts.tail, r - pair.bwd)
        out.append(
            f"DualPipe with ZeRO-2: a reduction follows each W pass and rank {k}'s last {h + 1} W pass(es) run back "
            f"to back (dualpipe.py step 8): its last reductions (r = {r * 1e3:.1f} ms each, W = {w * 1e3:.1f} ms, "
            f"last bucket {parts.tail * 1e3:.1f} ms) run max(last, r − W) + h·max(0, r − W) = {tail * 1e3:.1f} ms "
            f"past its compute, where the estimate exposes the last pass's max(last, r − B) = {last * 1e3:.1f} ms "
            "(not priced: simulate plays it out)"
        )
    return out
