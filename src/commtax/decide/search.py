"""Plan search: every valid plan of a job's model on its cluster, evaluated by the one model, ranked.

The space is ``decide.space`` (typed axes: layout axes make the bases, grid axes the grid of a base). Inside a
base each part of ``estimate`` is computed once per value of what it depends on, with the analytical schedule's
own functions, and the step is assembled on the grid with ``schedule.analytical.step_parts`` on NumPy arrays, in
estimate's order (docs/search.md):

============================  =====================================  ==========================
part                          model function                         depends on (within a base)
============================  =====================================  ==========================
validity                      ``Job`` checks (``plan_variants``)     vp, micro_batch, sp
stage times, bubble           ``stage_times``, ``pipeline_bubble``   split (*), micro_batch, sp, recompute; vp
pipeline sends                ``analytical.pp_exposed``              vp, micro_batch, sp, recompute
DP traffic                    ``analytical.dp_exposed``              split, micro_batch, sp, recompute, zero, gd
optimizer step                ``Costs.compute(wl.optimizer)``        split, zero, grad dtype
model-state memory per stage  ``memory.stage_states``                split, zero, grad dtype
activations per stage         ``memory.stage_activation_bytes``      vp, micro_batch, sp, recompute
============================  =====================================  ==========================

(*) the split is the layers of each pipeline rank (``Job.stage_layers``): it depends on vp only when the
layers do not divide evenly. Memory is the fullest stage's. Where a part is a formula over the grid it is estimate's
own function given arrays (``costs.elementwise``: the builtins on floats, ufuncs on arrays): the dense stages of
every base of a TP/CP placement in one pass (``analytical.prefill_stages``, after ``_prepare``: every rank's total,
a StageTime for the slowest only), the bubble and sends for every vp of a split (1F1B: of every plan of a split at
once, ``_pipeline_on_arrays``), a dense base's activations on its whole grid (``memory.stage_activations``), and the
formulas on the plan grid, once for every plan of a placement's bases, one row per plan (``_finish_bases``): the
exposed overlapped DP traffic (``dp_step_exposed_s``, ZeRO-3's ``zero3_exposed_s``), the step's parts and sum, the
fullest stage's memory (docs/search.md). Phase prices and stage times are shared, by value, by the bases that place
TP and CP alike (``_Shared``, ``costs.pricing``); the cyclic garbage collector is paused while the bases are
evaluated (``_no_gc``). The table is checked, not trusted: every search re-estimates
its top plans with ``estimate`` and reports the largest relative difference (``max_rel_diff``, a warning above
1e-9); the tests and the benchmark check random samples.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import signal
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commtax import signals
from commtax.costs.pricing import Costs
from commtax.costs.topology import layout
from commtax.decide.plans import PlanRow
from commtax.decide.space import (
    AXIS,
    COLUMNS,
    GRID_AXES,
    MOE_AXES,
    Base,
    Space,
    bases,
    columns,
    raw_spec,
    reason,
)
from commtax.decide.space import SEARCH_FIELDS as SEARCH_FIELDS  # re-exported: the search's public names
from commtax.decide.space import Constraint as Constraint
from commtax.decide.space import parse_constraint as parse_constraint
from commtax.errors import Interrupted, SpecError
from commtax.schedule import analytical as _est
from commtax.schedule.analytical import (
    SlowRow,
    estimate,
    pipeline_bubble,
    prefill_stages,
    stage_times,
    step_parts,
)
from commtax.schedule.breakdown import BREAKDOWN_KEYS, MOE_KEYS, Breakdown
from commtax.schedule.interval import published_best
from commtax.spec import Job, job_unchecked, job_with, plan_variant_of, plan_variants, replaced, zero_refusal
from commtax.spec.assumptions import assumptions_for
from commtax.units import TFLOPS, GiB, memory_need
from commtax.workload.memory import (
    end_activation_bytes,
    fixed_reserve_bytes,
    in_flight_by_stage,
    layer_bytes_by_recompute,
    loss_micro_batches,
    memory,
    stage_activation_bytes,
    stage_activations,
    stage_kinds,
    stage_states,
)
from commtax.workload.step import Workload, build_workload, pass_workload, stage_moe_layers, with_fields

# the allowed values, as the spec declares them
RECOMPUTE: tuple[str, ...] = AXIS["recompute"].choices
GRAD_DTYPES: tuple[str, ...] = AXIS["grad_comm_dtype"].choices
# the explicit split of a plan's layers over its pp stages: dropped when the search changes pp
STAGE_SPLIT_FIELDS = ("stage_layers", "first_stage_layers", "last_stage_layers")
PART_KEYS = BREAKDOWN_KEYS
MOE_PART_KEYS = (*BREAKDOWN_KEYS[:4], *MOE_KEYS, *BREAKDOWN_KEYS[4:])  # MoE: the exposed all-to-all after CP


def part_keys(job: Job) -> tuple[str, ...]:
    """The step parts of a job's plan table, in estimate's order (``breakdown.part_keys``)."""
    return MOE_PART_KEYS if job.model.is_moe else PART_KEYS


RANK_BY = ("step", "cost", "tokens_per_dollar")
AGREEMENT_TOL = 1e-9  # relative: the search's numbers must be estimate's
AXES = GRID_AXES  # the grid of one base, in the plan table's order


# ----------------------------------------------------------------------------- result
@dataclass
class SearchResult:
    """All evaluated plans of one job, as columns; ``order`` ranks the ones that are valid and fit."""

    job: Job
    plans: np.ndarray  # (n, len(columns(job))) int codes
    step_s: np.ndarray  # (n,) nan where invalid
    parts_s: np.ndarray  # (n, len(part_keys(job)))
    exposed_s: np.ndarray
    mem_bytes: np.ndarray
    valid: np.ndarray  # bool
    fits: np.ndarray  # bool (False where invalid)
    invalid_reasons: Counter
    nofit_reasons: Counter
    order: np.ndarray  # indices of valid, fitting plans, best first
    rank_by: str = "step"
    interrupted: bool = False
    elapsed_s: float = 0.0
    top: list[tuple[PlanRow, Breakdown]] = field(default_factory=list)
    max_rel_diff: float = 0.0
    invalid_examples: dict[str, str] = field(default_factory=dict)  # reason -> one full validator message
    warnings: list[str] = field(default_factory=list)
    verified: list[Verified] = field(default_factory=list)  # --verify: plan, estimate and simulated step
    moe_choices: list[MoeChoice] = field(default_factory=list)  # MoE: each (ep, etp, dispatcher, overlap) tried

    @property
    def evaluated(self) -> int:
        return int(len(self.step_s))

    @property
    def plans_per_s(self) -> float:
        return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else math.inf

    def row(self, i: int) -> PlanRow:
        """Plan ``i`` of the table, typed: its columns are the table's (``space.columns``)."""
        return plan_row(self.plans[i], columns(self.job))

    def best(self) -> tuple[PlanRow, Breakdown] | None:
        return self.top[0] if self.top else None

    def summary(self) -> dict[str, Any]:
        return {
            "evaluated": self.evaluated,
            "valid": int(self.valid.sum()),
            "fit": int(self.fits.sum()),
            "invalid": int((~self.valid).sum()),
            "do_not_fit": int((self.valid & ~self.fits).sum()),
            "invalid_reasons": dict(self.invalid_reasons.most_common()),
            "do_not_fit_reasons": dict(self.nofit_reasons.most_common()),
            "rank_by": self.rank_by,
            "interrupted": self.interrupted,
            "elapsed_s": self.elapsed_s,
            "plans_per_s": self.plans_per_s,
            "max_rel_diff_vs_estimate": self.max_rel_diff,
            "warnings": self.warnings,
        }

    def to_csv(self) -> str:
        """Every valid plan, one row each: plan fields, step and its parts (s), memory (GiB), fits."""
        cols = columns(self.job)
        head = list(cols) + ["step_time_s"] + [f"{k}_s" for k in part_keys(self.job)] + ["memory_GiB", "fits"]
        lines = [",".join(head)]
        for i in np.flatnonzero(self.valid):
            vals = [str(v) for v in row_values(self.plans[i], cols)] + [repr(float(self.step_s[i]))]
            vals += [repr(float(x)) for x in self.parts_s[i]]
            vals += [repr(float(self.mem_bytes[i] / GiB)), str(bool(self.fits[i]))]
            lines.append(",".join(vals))
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        out = {
            **self.summary(),
            "top": [{"plan": p.to_dict(), "breakdown": b.to_dict()} for p, b in self.top],
        }
        if self.verified:
            out["verified"] = [v.to_dict() for v in self.verified]
        if self.moe_choices:
            out["moe_choices"] = [c.to_dict() for c in self.moe_choices]
        return out


@dataclass(frozen=True)
class Verified:
    """One plan of ``--verify``: the estimate and the event simulator's step of it, and whether its MFU is above
    every published run of its GPU (``above_published``)."""

    plan: PlanRow
    estimate: Breakdown
    simulate: Breakdown
    above_published: str | None

    def to_dict(self) -> dict[str, Any]:
        """As ``search --json`` writes it under ``verified``."""
        b = self.estimate
        return {
            "plan": self.plan.to_dict(),
            "estimate_step_s": b.step_time_s,
            "estimate_step_s_p10": b.step_time_s_p10,
            "estimate_step_s_p90": b.step_time_s_p90,
            "simulate_step_s": self.simulate.step_time_s,
            "simulate_breakdown": self.simulate.to_dict(),
            "mfu": b.mfu,
            "hfu": b.hfu,
            "above_published": self.above_published,
        }


@dataclass(frozen=True)
class MoeChoice:
    """One combination of the MoE plan fields an MoE search tried: its best step among the plans that fit, or why
    it has none (``refused``: the spec's refusal on the job's own plan, or that no plan of the space is valid and
    fits). ``fields`` holds the combination, its columns the MoE fields searched."""

    fields: PlanRow
    best_step_s: float | None = None
    refused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As ``search --json`` writes it under ``moe_choices``: the fields, then the best step or the refusal."""
        extra = {"refused": self.refused} if self.best_step_s is None else {"best_step_s": self.best_step_s}
        return {**self.fields.to_dict(), **extra}


def row_values(codes: Sequence[int], cols: Sequence[str] = COLUMNS) -> list[Any]:
    """A row of the plan table's codes as plan values, column by column (``space.Axis.decode``; dp as it is)."""
    return [AXIS[c].decode(int(x)) if c in AXIS else int(x) for c, x in zip(cols, codes)]


def plan_row(codes: Sequence[int], cols: Sequence[str] = COLUMNS) -> PlanRow:
    """A row of the plan table as a typed plan whose columns are the table's."""
    cols = tuple(cols)
    return PlanRow(cols, **dict(zip(cols, row_values(codes, cols))))


def job_for(job: Job, plan: PlanRow) -> Job:
    """The job with a searched plan (validated by the spec)."""
    return job_with(job, **split_reset(job, plan.pp), **plan.values())


def split_reset(job: Job, pp: int) -> dict[str, None]:
    """An explicit stage split belongs to the job's pp: a plan with another pp takes the balanced split."""
    return {} if pp == job.plan.pp else dict.fromkeys(STAGE_SPLIT_FIELDS)


# ----------------------------------------------------------------------------- one base (tp, pp, cp)
class _MemoCosts(Costs):
    """The model's Costs with each phase priced once across all the bases that place TP and CP alike (phases
    are keyed by value; the layer blocks are shared between bases, see ``_eval_base``)."""

    def __init__(self, job: Job, shared: _Shared | None = None):
        super().__init__(job)
        self._shared = shared or _Shared()
        self.stage_cache = self._shared.stages
        self._phases = self._shared.phases


@dataclass
class _Shared:
    """What bases with the same TP and CP placement share: phase prices and per-micro-batch workloads."""

    phases: dict[Any, Any] = field(default_factory=dict)  # Phase -> PhaseCost
    workloads: dict[tuple, Any] = field(default_factory=dict)  # (mb, sp, recompute) -> Workload
    priced: dict[tuple, dict] = field(default_factory=dict)  # MoE: (mb, sp, recompute) -> its blocks' pass prices
    stages: dict[tuple, Any] = field(default_factory=dict)  # estimate.stage_times' cache
    templates: dict[Any, Any] = field(default_factory=dict)  # each workload's priced blocks (``StageTemplate``)
    base_keys: dict[tuple, Any] = field(default_factory=dict)  # (mb, sp, recompute, TP/CP overlap, tp, cp) -> key
    layer_bytes: dict[tuple, Any] = field(default_factory=dict)  # (mb, sp, recomputes) -> a layer's activations


def _copy(job: Job, **changes: Any) -> Job:
    """A plan variant of a job already validated for the fields the validator reads (pydantic's own copy: the
    grid axes it changes here, recompute, zero and gradient dtype, are checked for the base by ``_valid_jobs``)."""
    plan = job.plan
    if all(getattr(plan, k) == v for k, v in changes.items()):  # already so: no copy (a third of the calls)
        return job
    return replaced(job, plan=replaced(plan, **changes))


@dataclass
class _BaseResult:
    plans: np.ndarray
    step: np.ndarray
    parts: np.ndarray
    exposed: np.ndarray
    mem: np.ndarray
    valid: np.ndarray
    invalid_reasons: Counter
    nofit_reasons: Counter
    examples: dict[str, str] = field(default_factory=dict)


def _phase_key(job: Job) -> tuple:
    """Layer, embedding and head phases hold only TP and CP collectives: their prices depend on where those
    two groups sit (size, stride), so bases that share them share phase prices."""
    lay = layout(job)
    return tuple((lay.size[g], lay.stride[g]) for g in ("tp", "cp"))


def _shared_key(job: Job, base: Base) -> tuple:
    """Bases share phase prices and workloads when they place TP and CP alike and agree on every layout axis
    beyond tp, pp and cp (an added axis may change the blocks)."""
    return (_phase_key(job), tuple(sorted(base.extra.items())))


class _ValidJobs:
    """A base's valid (vp, micro_batch, sequence_parallel) and the job of each, built when first read (``job``):
    the search reads one per vp, per (vp, mb) and per (split, mb, sp) of ~10^4 (``plan_variants(build=False)``)."""

    def __init__(self, valid: Job | None = None, axes: dict[str, Sequence[Any]] | None = None) -> None:
        self.built: dict[tuple[int, int, int], Job | None] = {}  # in the grid's order; None: not built yet
        self.valid, self.axes = valid, axes

    def __contains__(self, idx: object) -> bool:
        return idx in self.built

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return iter(self.built)

    def __len__(self) -> int:
        return len(self.built)

    def job(self, idx: tuple[int, int, int]) -> Job:
        got = self.built[idx]
        if got is None:
            got = self.built[idx] = plan_variant_of(self.valid, self.axes, idx)
        return got

    def first(self) -> Job:
        return self.job(next(iter(self.built)))


def _valid_jobs(job: Job, base: Base) -> tuple[_ValidJobs, Counter, dict[str, str]]:
    """The spec's own validator on every (vp, micro_batch, sequence_parallel) of a base: the valid jobs by index,
    and the refused plans counted by reason (each refusal stands for its zero × recompute × grad-dtype plans). The
    base's plan is validated once (``spec.job_unchecked``) and the Job's checks run on its variants, each once per
    value of the fields it reads (``spec.plan_variants``); a plan the Plan itself refuses is validated in full
    (``job_with``), combination by combination."""
    axes = base.axes
    others = len(axes["zero"]) * len(axes["recompute"]) * len(axes["grad_comm_dtype"])
    reset = split_reset(job, base.pp) | _moe_recompute(job, base)
    jobs = _ValidJobs()
    invalid: Counter = Counter()
    examples: dict[str, str] = {}
    reasons: dict[str, str] = {}  # refusal -> its reason (``space.reason``), once per distinct message

    def refused(msg: str) -> None:
        why = reasons.get(msg)
        if why is None:
            why = reasons[msg] = reason(msg)
        invalid[why] += others
        examples.setdefault(why, msg)

    variant_axes = {k: axes[k] for k in ("vp", "micro_batch", "sequence_parallel")}
    first = {k: v[0] for k, v in variant_axes.items()}
    unchecked = job_unchecked(job, **base.fields, dp=None, **first, **reset)
    if unchecked is not None:
        jobs.valid, jobs.axes = unchecked, variant_axes
        for idx, got in plan_variants(unchecked, variant_axes, checked=False, build=False):
            if isinstance(got, str):
                refused(got)
            else:
                jobs.built[idx] = got
        return jobs, invalid, examples
    for idx in itertools.product(*(range(len(v)) for v in variant_axes.values())):
        changes = {k: v[i] for (k, v), i in zip(variant_axes.items(), idx)}
        try:
            jobs.built[idx] = job_with(job, **base.fields, dp=None, **changes, **reset)
        except SpecError as e:
            refused(str(e))
    return jobs, invalid, examples


def _moe_recompute(job: Job, base: Base) -> dict[str, str]:
    """MoE: the recompute the base's jobs are validated with. Megatron refuses moe_a2a_overlap with full recompute
    (``spec.moe_refusal``): a base that overlaps is validated with another recompute of its axis when the job's is
    full, so its other plans are not refused with it; ``_recompute_mask`` then refuses the full ones by name."""
    if not (base.fields.get("moe_a2a_overlap") and job.plan.recompute == "full"):
        return {}
    others = [r for r in base.axes["recompute"] if r != "full"]
    return {"recompute": others[0]} if others else {}


def _recompute_mask(
    job: Job, base: Base, jobs: _ValidJobs, valid: np.ndarray, invalid: Counter, examples: dict[str, str]
) -> np.ndarray:
    """MoE: plans whose recompute the spec refuses with the base's MoE fields (``spec.moe_refusal``: the overlap
    does not run with full recompute) made invalid, counted by the spec's own message. The recompute axis is not
    part of the per-job validator pass (``_valid_jobs``); the refusal depends on the MoE fields only, so one
    valid job of the base stands for all. Dense jobs: unchanged."""
    if not job.model.is_moe or not jobs:
        return valid
    sample = jobs.first()
    axis = AXES.index("recompute")
    for r, rc in enumerate(base.axes["recompute"]):
        if rc == sample.plan.recompute:
            continue
        try:
            job_with(sample, recompute=rc)
            continue
        except SpecError as e:
            msg = str(e)
        index = [slice(None)] * valid.ndim
        index[axis] = r
        n_refused = int(valid[tuple(index)].sum())
        if n_refused:
            valid = valid.copy() if not valid.flags.writeable else valid
            valid[tuple(index)] = False
            invalid[reason(msg)] += n_refused
            examples.setdefault(reason(msg), msg)
    return valid


@dataclass
class _Grid:
    """One base's plan grid while it is evaluated: the axes' values, the valid jobs, and the stage splits."""

    base: Base
    jobs: _ValidJobs  # valid (vp, micro_batch, sequence_parallel) -> its job
    costs: _MemoCosts
    shared: _Shared
    n_micro: np.ndarray  # micro-batches per replica, per micro-batch size
    splits: list[tuple]  # distinct layers-per-rank tuples among the valid jobs (``_split_key``)
    split_of_vp: np.ndarray  # vp index -> split index
    sample: dict[tuple[int, int, int], Job]  # (split, micro_batch, sp) -> one valid job with that split
    stage_plans: dict[tuple[int, int, int, int], tuple[Job, Workload, tuple]] = field(default_factory=dict)
    stage_keys: dict[tuple[int, int, int, int], tuple] = field(default_factory=dict)  # dense: ``_est.stage_key``
    # ``_prefill``'s dense stages: (``analytical.PrefilledStages``, the pipeline's base key, its layers per rank)
    stages: dict[tuple[int, int, int, int], tuple] = field(default_factory=dict)
    valid_jobs: np.ndarray | None = None  # ``valid_mask``'s, built once

    def axis(self, name: str) -> list[Any]:
        return self.base.axes[name]

    def valid_mask(self) -> np.ndarray:
        """The valid (vp, mb, sp): the indices of ``jobs`` as a mask (read by the stages and the activations)."""
        if self.valid_jobs is None:
            valid = np.zeros(tuple(len(self.axis(k)) for k in ("vp", "micro_batch", "sequence_parallel")), bool)
            valid[tuple(_table(self.jobs, 3, np.intp).T)] = True
            self.valid_jobs = valid
        return self.valid_jobs

    def sample_of_split(self, si: int) -> Job:
        return next(x for (sj, _, _), x in self.sample.items() if sj == si)


def _grid(job: Job, base: Base, jobs: _ValidJobs, phase_cache: dict[Any, _Shared] | None) -> _Grid:
    any_job = jobs.first()
    shared = _Shared() if phase_cache is None else phase_cache.setdefault(_shared_key(any_job, base), _Shared())
    n_micro = np.array([any_job.training.global_batch // (any_job.dp * mb) for mb in base.axes["micro_batch"]], float)
    splits: list[tuple] = []
    split_of_vp = np.zeros(len(base.axes["vp"]), int)
    of_vp: dict[int, Job] = {}  # the split depends on vp alone: one valid job per vp reads it
    for i, j, k in jobs:
        if i not in of_vp:
            of_vp[i] = jobs.job((i, j, k))
    for i in sorted(of_vp):
        key = _split_key(of_vp[i])
        if key not in splits:
            splits.append(key)
        split_of_vp[i] = splits.index(key)
    sample: dict[tuple[int, int, int], Job] = {}
    split_at = split_of_vp.tolist()  # as Python ints, read once per vp (not a NumPy scalar per combination)
    for i, j, k in jobs:
        at = (split_at[i], j, k)
        if at not in sample:
            sample[at] = jobs.job((i, j, k))
    return _Grid(base, jobs, _MemoCosts(any_job, shared), shared, n_micro, splits, split_of_vp, sample)


def _table(rows: Iterable, width: int, dtype: Any) -> np.ndarray:
    """``rows`` (each a tuple of ``width`` numbers) as an (n, width) array: ``np.array(list(rows))``'s values, read
    with one ``np.fromiter`` (a list of small tuples is the slow case of ``np.array``)."""
    rows = list(rows)
    return np.fromiter(itertools.chain.from_iterable(rows), dtype, width * len(rows)).reshape(len(rows), width)


def _split_key(job: Job) -> tuple:
    """What a pipeline rank's stage-level parts depend on: its layers; MoE also which of them are MoE, which moves
    with vp when the first layers are dense (8 layers, 3 dense, PP2: (1, 4) MoE layers per rank; with vp 2 the
    chunks interleave, (2, 3)), as do the rank's parameters and activations."""
    if not job.model.is_moe:
        return job.stage_layers
    return job.stage_layers, stage_moe_layers(job)


def _moe_split(job: Job) -> dict[str, Any]:
    """MoE: which of this base's layers are MoE, per pipeline rank (``step.stage_moe_layers``): the shared template
    was built for another pp, and a first_k_dense model puts its dense layers on the first ranks only."""
    return {"stage_moe_layers": stage_moe_layers(job)} if job.model.is_moe else {}


def _stage_plans(g: _Grid) -> dict[tuple[int, int, int, int], tuple[Job, Workload, tuple]]:
    """Per (split, mb, sp, recompute): a job and its workload (the shared template for (mb, sp, recompute) with this
    base's split and micro-batch count), and the template's key. A template is what the stages read of a workload
    (``step.pass_workload``): its blocks' phases are one object per value (``step._blocks``), so that the price caches
    find them by identity."""
    micro_sizes, seq_pars, recomputes = g.axis("micro_batch"), g.axis("sequence_parallel"), g.axis("recompute")
    # per split: the rank's layers, read once (each read runs pipeline_split), and the stage cache's layer counts
    of_split: dict[int, tuple[dict[str, Any], tuple[int, ...] | None]] = {}
    plans: dict[tuple[int, int, int, int], tuple[Job, Workload, tuple]] = {}
    for (si, j, k), sample_job in g.sample.items():
        if si not in of_split:
            fields = {
                "layers_per_stage": max(sample_job.stage_layers),
                "chunk_layers": sample_job.chunk_layers,
                **_moe_split(sample_job),
            }
            of_split[si] = fields, None
        fields, counts = of_split[si]
        split = {**fields, "micro_batches": int(g.n_micro[j])}
        plan = sample_job.plan
        for r, rc in enumerate(recomputes):
            key = (micro_sizes[j], seq_pars[k], rc)
            template = g.shared.workloads.get(key)
            if template is None:
                job_rc = _copy(sample_job, recompute=rc)
                template = g.shared.workloads[key] = pass_workload(job_rc)
            wl = with_fields(template, **split)
            # the stages read the plan's layout and schedule, the recompute only through the workload's blocks
            plans[si, j, k, r] = (sample_job, wl, key)
            if wl.moe_layer is None:  # the stage cache's key: the blocks' (the template's) and the split's counts
                base_of = (key, plan.overlap.tp, plan.overlap.cp, plan.tp, plan.cp)
                base_key = g.shared.base_keys.get(base_of)
                if base_key is None:
                    base_key = g.shared.base_keys[base_of] = _est.stage_key(sample_job, wl)[0]
                if counts is None:  # the split's: the same for every micro-batch size, sp and recompute
                    counts = _est.stage_layer_counts(sample_job, wl)
                    of_split[si] = fields, counts
                g.stage_keys[si, j, k, r] = (base_key, counts)
    return plans


def _stage_parts(g: _Grid) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """Per (split, mb, sp, recompute): the slowest stage (its compute, recompute, exposed TP and CP, and the passes DP
    traffic hides under: ``_SLOW_COLUMNS``, last axis); per (vp, mb, sp, recompute): the bubble and the exposed
    pipeline sends. The layer, embedding and head blocks do not depend on pp or dp: one workload per (mb, sp,
    recompute) serves every base of this TP/CP placement, given this base's split and micro-batch count."""
    vps, micro_sizes = g.axis("vp"), g.axis("micro_batch")
    seq_pars, recomputes = g.axis("sequence_parallel"), g.axis("recompute")
    vps_of_split = [[i for i in range(len(vps)) if g.split_of_vp[i] == si] for si in range(len(g.splits))]
    dims = (len(g.splits), len(micro_sizes), len(seq_pars), len(recomputes))
    slowest: dict[tuple[int, int, int, int], Any] = {}
    moe = g.jobs.first().model.is_moe
    slow_parts = np.full(dims + (len(_SLOW_COLUMNS[moe]),), np.nan)
    bubble = np.full((len(vps),) + dims[1:], np.nan)
    pp_exposed = np.full((len(vps),) + dims[1:], np.nan)
    on_arrays: dict[tuple, list] = {}  # (split, schedule, overlap.pp) -> its 1F1B plans, priced together
    # prefilled 1F1B plans (their ranks are their stages, ``pipeline_ranks``), per (split, schedule, overlap.pp): every
    # rank's total and the slowest rank's fields read off the prefilled arrays, all the split's plans at once
    prefilled_1f1b: dict[tuple, list] = {}
    for (si, j, k, r), (plan_job, wl, key) in g.stage_plans.items():
        plan, prefilled = plan_job.plan, g.stages.get((si, j, k, r))
        if prefilled is not None and plan.schedule in _ONE_F_ONE_B:
            slowest[si, j, k, r] = None  # its place in the order, filled below
            prefilled_1f1b.setdefault((si, plan.schedule, plan.overlap.pp), []).append(((j, k, r), prefilled, wl))
            continue
        if prefilled is not None:
            stages = prefilled[0].pipeline(*prefilled[1:])
        else:
            stages = stage_times(plan_job, wl, g.costs, g.shared.priced.setdefault(key, {}))
        slowest[si, j, k, r] = _est.slow_row(_est.slowest_stage(_est.pipeline_ranks(plan.schedule, stages)))
        if plan.schedule in _ONE_F_ONE_B:
            totals = [st.total for st in stages]
            on_arrays.setdefault((si, plan.schedule, plan.overlap.pp), []).append(((j, k, r), totals, wl))
            continue
        here = [i for i in vps_of_split[si] if (i, j, k) in g.jobs]  # the others are invalid plans
        if here:  # every vp of this split at once (the stages are the same)
            v = np.array([vps[i] for i in here]) if len(here) > 1 else vps[here[0]]
            bubble[here, j, k, r] = pipeline_bubble(plan.schedule, int(g.n_micro[j]), v, stages)
            pp_exposed[here, j, k, r] = _est.pp_exposed(plan_job, wl, g.costs, stages, vp=v)[1]
    valid = g.valid_mask()  # the valid (vp, mb, sp)
    for (si, schedule, overlap_pp), plans in prefilled_1f1b.items():
        at = on_arrays.setdefault((si, schedule, overlap_pp), [])
        priced, _, counts = plans[0][1]  # one pass (``PrefilledStages``) and one split: the same layers per rank
        rows = None
        if all(x[1][0] is priced for x in plans):
            rows = priced.split_rows([x[1][1] for x in plans], counts)
        if rows is not None:  # no StageTime unless one is asked (``SlowRow.stage``)
            totals, slow = rows
            for ((j, k, r), _, wl), row, plan_totals in zip(plans, slow, totals):
                slowest[si, j, k, r] = row
                at.append(((j, k, r), plan_totals, wl))
            continue
        for (j, k, r), (priced, base_key, counts), wl in plans:  # stages priced apart: one by one
            totals = priced.pipeline_totals(base_key, counts)
            slowest[si, j, k, r] = priced.slowest_row(base_key, counts, totals)
            at.append(((j, k, r), totals, wl))
    for (si, schedule, overlap_pp), plans in on_arrays.items():
        _pipeline_on_arrays(g, vps_of_split[si], schedule, overlap_pp, plans, valid, bubble, pp_exposed)
    if slowest:  # every (split, mb, sp, recompute) at once
        at = tuple(_table(slowest, 4, np.intp).T)
        table = _table((s[:_SLOW_FLOATS] for s in slowest.values()), _SLOW_FLOATS, float)  # SlowRow: its floats first
        slow_parts[at] = table[:, _SLOW_COLUMNS[moe]]
    return slowest, slow_parts, bubble, pp_exposed


_SLOW_FIELDS = ("compute", "recompute", "tp_exposed", "cp_exposed", "ep_exposed")  # ``_assemble``'s slow parts
_PASS_FIELDS = ("fwd", "bwd", "share")  # the slowest stage's passes, what DP traffic hides under (``_dp_grid``)
# the SlowRow columns ``_stage_parts`` keeps per (split, mb, sp, recompute), dense and MoE (ep_exposed fifth)
_SLOW_COLUMNS = {
    moe: [SlowRow._fields.index(f) for f in (*_SLOW_FIELDS[: 5 if moe else 4], *_PASS_FIELDS)] for moe in (False, True)
}
_SLOW_FLOATS = SlowRow._fields.index("ep_exposed") + 1  # SlowRow's numbers: the fields before ``source``
_ONE_F_ONE_B = ("1f1b", "1f1b-flexible")  # schedules whose bubble and sends read the stages' totals only


def _pipeline_on_arrays(
    g: _Grid,
    vis: list[int],
    schedule: str,
    overlap_pp: bool,
    plans: list,
    valid: np.ndarray,
    bubble: np.ndarray,
    pp_exposed: np.ndarray,
) -> None:
    """The bubble and exposed sends of one split's 1F1B plans, every (vp, mb, sp, recompute) at once: estimate's
    ``one_f_one_b_bubble`` and ``sends_exposed`` with a plan axis (each stage's totals an array over the plans) and
    a vp axis; entries of invalid (vp, mb, sp) stay NaN. plans: per plan its (mb, sp, recompute) indices, its ranks'
    totals (first to last) and its workload; valid: the grid's valid (vp, mb, sp)."""
    if not vis:
        return
    jkr = _table((x for x, _, _ in plans), 3, np.intp).T
    vis_at = np.array(vis)[:, None]
    ok = valid[vis_at, jkr[0], jkr[1]]
    p = len(plans[0][1])
    totals = list(np.array([totals for _, totals, _ in plans]).T)  # per stage, over the plans
    v = np.array([g.axis("vp")[i] for i in vis])[:, None]
    at = (vis_at, *jkr[:, None, :])
    bubble[at] = np.where(ok, _est.one_f_one_b_bubble(totals, v), np.nan)
    if p == 1:
        pp_exposed[at] = np.where(ok, 0.0, np.nan)
        return
    m = g.n_micro[jkr[0]].astype(np.int64)
    t_send = np.array([g.costs.collective(wl.pp_send) for _, _, wl in plans])  # priced once per value (``Costs``)
    pp_exposed[at] = np.where(ok, _est.sends_exposed(schedule, p, v, m, t_send, totals, overlap_pp), np.nan)


@dataclass(frozen=True)
class _DpParts:
    """A base's DP parts (``_dp_parts``). Per (split, zero, gd): the model states of its stage kinds (kinds last) and
    the optimizer step. The exposed DP traffic: priced per slowest stage on (vp, mb, sp, recompute, zero, gd)
    (``per_stage``, NaN elsewhere), or overlapped traffic left to the grid formulas (``_dp_grid``, ``_zero3_grid``),
    per (split, mb, zero, gd) where ``on_grid`` (``_dp_fields``, last axis) and ``on_z3`` (``zero3_traffic``)."""

    states: np.ndarray
    optimizer: np.ndarray
    per_stage: np.ndarray | None  # None: no plan of the base is priced per stage
    on_grid: np.ndarray | None  # None: none is on the grid
    traffic: np.ndarray
    on_z3: np.ndarray | None
    z3: np.ndarray


def _dp_parts(g: _Grid, slowest: dict, kinds: list[tuple[int, ...]]) -> _DpParts:
    """Per (split, zero, grad dtype): the model states of the stages that can be the fullest and the optimizer
    step; the exposed DP traffic under the slowest stage, or the overlapped traffic the grid formulas read."""
    zeros, grad_dtypes = g.axis("zero"), g.axis("grad_comm_dtype")
    n_kinds = max(len(x) for x in kinds)
    dp_jobs: dict[tuple[int, int, int], tuple[Job, Any]] = {}
    zds = list(itertools.product(range(len(zeros)), range(len(grad_dtypes))))
    state_rows, optimizer_steps = [], []  # per (split, zero, gd) in C order: one array each, not a write per key
    for si in range(len(g.splits)):
        sample = g.sample_of_split(si)
        for z, d in zds:
            job_zd = _copy(sample, zero=zeros[z], grad_comm_dtype=grad_dtypes[d])
            dp_jobs[si, z, d] = (job_zd, _est.dualpipe_dp_workload(job_zd, build_workload(job_zd)))
            row = [sum(x) for x in stage_states(job_zd, kinds[si])]
            state_rows.append(row + [np.nan] * (n_kinds - len(row)))  # NaN past the split's kinds
            optimizer_steps.append(g.costs.compute(_est.slowest_optimizer(job_zd, dp_jobs[si, z, d][1])))
    by_key = (len(g.splits), len(zeros), len(grad_dtypes))
    states = _table(state_rows, n_kinds, float).reshape(by_key + (n_kinds,))
    optimizer = np.array(optimizer_steps, float).reshape(by_key)
    vps = g.axis("vp")
    dims = (len(vps), len(g.axis("micro_batch")), len(g.axis("sequence_parallel")), len(g.axis("recompute")))
    dp_exposed = np.full(dims + (len(zeros), len(grad_dtypes)), np.nan)
    with_count: dict[tuple[int, int, int, int], Any] = {}  # the DP workload with each micro-batch count
    ranks: dict[tuple, list] = {}  # MoE: the DP ranks (``dp_ranks``: no stage time in them), per micro-batch count
    # overlapped per-step traffic of a dense workload (``dp_step_parts``) is that of (split, zero, grad dtype,
    # micro-batch count), whichever stage is the slowest: priced once per key (ZeRO 0-1: per (split, zero, grad
    # dtype)), its exposed part on the whole grid
    on_grid = np.zeros((len(g.splits), len(g.axis("micro_batch")), len(zeros), len(grad_dtypes)), bool)
    traffic = np.full(on_grid.shape + (9,), np.nan)  # ``_dp_grid``'s fields
    # so is overlapped ZeRO-3 traffic (``zero3_traffic``, one micro-batch's): per (split, zero, grad dtype)
    on_z3 = np.zeros_like(on_grid)
    z3 = np.full(on_grid.shape + (5,), np.nan)  # ``_zero3_grid``'s fields
    per_stage: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (split, mb) -> the (zero, gd) priced per stage
    mbs_of: dict[int, dict[int, None]] = {}  # split -> the micro-batch sizes of its stages, in the order met
    for si, j, _, _ in slowest:
        mbs_of.setdefault(si, {})[j] = None
    for si, mbs in mbs_of.items():
        js = list(mbs)
        for z, d in zds:
            job_zd, wl = dp_jobs[si, z, d]
            by_rank, overlapped = _est.ranks_apart(job_zd, wl), job_zd.plan.overlap.dp  # MoE: the slowest DP rank
            if not by_rank and wl.dp_step and not wl.dp_microbatch and overlapped:
                on_grid[si, js, z, d] = True
                if not wl.grads_sharded:  # one reduction per step (``reduce_passes``): it reads no micro-batch count
                    counted = with_fields(wl, micro_batches=int(g.n_micro[js[0]]))
                    fields = _dp_fields(_est.dp_step_parts(counted, g.costs), counted)
                    traffic[si, js, z, d] = fields
                    continue
                # ZeRO-2 reduces every micro-batch: priced for all the micro-batch counts at once (an array of them)
                counted = with_fields(wl, micro_batches=g.n_micro[js].astype(np.int64))
                fields = _dp_fields(_est.dp_step_parts(counted, g.costs), counted)
                block = np.empty((len(js), len(fields)))  # each field a number or one per micro-batch count
                for x, f in enumerate(fields):
                    block[:, x] = f
                traffic[si, js, z, d] = block
                continue
            if not by_rank and wl.dp_microbatch and _est.zero3_prefetches(job_zd) and overlapped:
                on_z3[si, js, z, d] = True  # one micro-batch's traffic (``zero3_traffic``) reads no micro-batch count
                z3[si, js, z, d] = _est.zero3_traffic(wl, g.costs)
                continue
            for j in js:
                m = int(g.n_micro[j])
                with_count[si, z, d, j] = with_fields(wl, micro_batches=m)
                if by_rank:
                    if (si, z, d) not in ranks:
                        ranks[si, z, d] = _est.dp_ranks(job_zd, wl, g.costs)
                    ranks[si, z, d, j] = _est.dp_ranks_with_count(ranks[si, z, d], m, g.costs)
                per_stage.setdefault((si, j), []).append((z, d))
    if per_stage:
        _dp_per_stage(g, slowest, per_stage, dp_jobs, with_count, ranks, dp_exposed)
    return _DpParts(
        states,
        optimizer,
        dp_exposed if per_stage else None,
        on_grid if on_grid.any() else None,
        traffic,
        on_z3 if on_z3.any() else None,
        z3,
    )


def _dp_per_stage(
    g: _Grid, slowest: dict, per_stage: dict, dp_jobs: dict, with_count: dict, ranks: dict, dp_exposed: np.ndarray
) -> None:
    """The exposed DP traffic ``_dp_parts`` does not put on the grid, per slowest stage: estimate's ``dp_exposed``
    (MoE: the slowest DP rank; plans without overlapped per-step traffic), in place."""
    vps = g.axis("vp")
    vps_of = [[i for i in range(len(vps)) if g.split_of_vp[i] == si] for si in range(len(g.splits))]
    for (si, j, k, r), row in slowest.items():
        vps_here = vps_of[si]
        zds = per_stage.get((si, j), ())
        slow = row.stage() if zds else None  # the whole StageTime, built only here
        for z, d in zds:
            job_zd, _ = dp_jobs[si, z, d]
            counted = with_count[si, z, d, j]
            # MoE: the slowest DP rank, as estimate
            counted, dp_traffic = _est.slowest_dp_rank(job_zd, counted, g.costs, slow, ranks.get((si, z, d, j)))
            if dp_traffic is None or not (counted.dp_step and job_zd.plan.overlap.dp and g.base.pp > 1):
                # vp does not change it
                dp_exposed[vps_here, j, k, r, z, d] = _est.dp_exposed(job_zd, counted, g.costs, slow, dp_traffic)[1]
                continue
            # interleaving reduces and gathers each model chunk on its own (``estimate.dp_step_exposed``)
            for i in vps_here:  # MoE: the slowest rank's traffic, priced with its ranks
                exposed = _est.dp_step_exposed(
                    dp_traffic, slow, g.base.pp, vps[i], counted.micro_batches, _est.reduce_passes(counted)
                )
                # as estimate.dp_exposed: the timeline's exposed part + what the hidden part costs the compute
                dp_exposed[i, j, k, r, z, d] = exposed + _est.dp_contention(
                    g.costs.cm, dp_traffic.link, exposed, dp_traffic.nbytes, slow.link
                )


def _dp_fields(parts: Any, wl: Workload) -> tuple[float, ...]:
    """A dense workload's overlapped per-step DP traffic (``dp_step_parts``) as the numbers ``_dp_grid`` reads."""
    gathers = len(parts.times) > 1
    return (
        parts.times[0],
        parts.times[1] if gathers else 0.0,
        float(gathers),
        parts.tail,
        parts.first_bucket,
        parts.codec,
        parts.link,
        parts.nbytes,
        _est.reduce_passes(wl),
    )


def _zero3_grid(cm: Any, rows: _PlanRows, passes: tuple[np.ndarray, ...]) -> np.ndarray:
    """Exposed overlapped ZeRO-3 traffic of every plan of ``rows``: ``estimate.dp_exposed`` (its ``zero3_exposed_s``
    and ``dp_contention_s``) on arrays; passes: the slowest stage's forward, backward and memory-bound share."""
    fwd, bwd, share = passes
    gf, gb, rs, units, mb_bytes = rows.z3.T
    m = rows.m
    link, nbytes = (gf + gb + rs) * m, mb_bytes * m
    with np.errstate(invalid="ignore"):  # nan where a plan is invalid
        exposed = _est.zero3_exposed_s(gf, gb, rs, units, fwd, bwd, m)
        return exposed + _est.dp_contention_s(cm, link, exposed, nbytes, share)


def _dp_grid(cm: Any, rows: _PlanRows, passes: tuple[np.ndarray, ...]) -> np.ndarray:
    """Exposed overlapped DP traffic of every plan of ``rows``: ``estimate.dp_exposed`` (its ``dp_step_exposed_s`` and
    ``dp_contention_s``) on arrays; passes: the slowest stage's forward, backward and memory-bound share."""
    fwd, bwd, share = passes
    reduce_s, gather_s, gathers, tail, first, codec, link, nbytes, n_passes = rows.traffic.T
    with np.errstate(invalid="ignore"):  # nan where a plan is invalid
        exposed = _est.dp_step_exposed_s(
            reduce_s, gather_s, gathers > 0, tail, first, codec, fwd, bwd, rows.pp, rows.vp, rows.m, n_passes
        )
        return exposed + _est.dp_contention_s(cm, link, exposed, nbytes, share)


def _activations(g: _Grid, kinds: list[tuple[int, ...]]) -> np.ndarray:
    """Activation bytes per (vp, mb, sp, recompute, stage kind) of the stages that can be the fullest: dense,
    ``memory.stage_activations`` on the whole grid; MoE, per plan."""
    recomputes = g.axis("recompute")
    shape = tuple(len(g.axis(k)) for k in ("vp", "micro_batch", "sequence_parallel")) + (len(recomputes),)
    n_kinds = max(len(x) for x in kinds)
    sample = g.jobs.first()
    if sample.model.is_moe:
        return _moe_activations(g, kinds, shape + (n_kinds,))
    n_vp, n_mb, n_sp, n_rc = shape

    def padded(row: list, fill: Any) -> list:  # a split's row of stage kinds, to the base's most kinds
        return row + [fill] * (n_kinds - len(row))

    # per (vp, stage kind): the rank's layers, whether it is the first or the last (NaN past a split's kinds), read
    # once per split (a dense split is the layers of each rank, ``_split_key``)
    by_vp = g.split_of_vp
    layers = np.array([padded([split[s] for s in x], np.nan) for x, split in zip(kinds, g.splits)], float)[by_vp]
    first = np.array([padded([s == 0 for s in x], False) for x in kinds], bool)[by_vp]
    last = np.array([padded([s == g.base.pp - 1 for s in x], False) for x in kinds], bool)[by_vp]
    in_flight, held = np.full((2, n_vp, n_mb, n_kinds), np.nan)  # per (vp, mb, stage kind): the pipeline's
    per_layer, full_layer = np.full((2, n_mb, n_sp, n_rc), np.nan)  # per (mb, sp, recompute): the layer's
    embedding, logits = np.full((2, n_mb, n_sp), np.nan)
    valid = g.valid_mask()
    pipelines: dict[tuple[int, int], Job] = {}  # a job per (vp, mb): sp does not change its pipeline
    layer_jobs: dict[tuple[int, int], Job] = {}  # per (mb, sp): nor the pipeline (vp, pp) a layer's bytes
    for i, j, k in g.jobs:
        if (i, j) not in pipelines:
            pipelines[i, j] = g.jobs.job((i, j, k))
        if (j, k) not in layer_jobs:
            layer_jobs[j, k] = g.jobs.job((i, j, k))
    # each job's numbers gathered in rows, then written with one index per array (not a NumPy call per job)
    flights, holds = [], []
    split_at = by_vp.tolist()
    for (i, _), valid_job in pipelines.items():
        flight = in_flight_by_stage(valid_job, kinds[split_at[i]])
        flights.append(padded(flight, np.nan))
        holds.append(padded([loss_micro_batches(valid_job, f) for f in flight], np.nan))
    at = tuple(_table(pipelines, 2, np.intp).T)
    in_flight[at], held[at] = _table(flights, n_kinds, float), _table(holds, n_kinds, float)
    by_layers, ends = [], []
    for valid_job in layer_jobs.values():  # a layer's bytes: the same in every base of this placement
        key = (valid_job.plan.micro_batch, valid_job.plan.sequence_parallel, tuple(recomputes))
        by_layer = g.shared.layer_bytes.get(key)
        if by_layer is None:
            by_layer = g.shared.layer_bytes[key] = np.array(layer_bytes_by_recompute(valid_job, recomputes)).T
        by_layers.append(by_layer)
        ends.append(end_activation_bytes(valid_job))
    at = tuple(_table(layer_jobs, 2, np.intp).T)
    layer_table, end_table = np.array(by_layers), _table(ends, 2, float)  # (jobs, 2, recompute), (jobs, 2)
    per_layer[at], full_layer[at] = layer_table[:, 0], layer_table[:, 1]
    embedding[at], logits[at] = end_table[:, 0], end_table[:, 1]
    acts = stage_activations(
        layers=layers[:, None, None, None, :],
        in_flight=in_flight[:, :, None, None, :],
        per_layer=per_layer[None, :, :, :, None],
        full_layer=full_layer[None, :, :, :, None],
        first=first[:, None, None, None, :],
        last=last[:, None, None, None, :],
        embedding=embedding[None, :, :, None, None],
        logits=logits[None, :, :, None, None],
        held=held[:, :, None, None, :],
        moe_extra=0.0,
        mtp_layer=per_layer[None, :, :, :, None],
        mtp_layers=sample.model.mtp_layers,
    )
    return np.where(valid[:, :, :, None, None], acts, np.nan)


def _moe_activations(g: _Grid, kinds: list[tuple[int, ...]], shape: tuple[int, ...]) -> np.ndarray:
    """MoE: activation bytes per (vp, mb, sp, recompute, stage kind), plan by plan (an MoE layer's activations read
    the plan's recompute: a copy per value)."""
    acts = np.full(shape, np.nan)
    for i, j, k in g.jobs:
        valid_job = g.jobs.job((i, j, k))
        stages = kinds[g.split_of_vp[i]]
        for r, rc in enumerate(g.axis("recompute")):
            acts[i, j, k, r, : len(stages)] = stage_activation_bytes(_copy(valid_job, recompute=rc), stages)
    return acts


def _fullest_memory(
    rows: _PlanRows, fragmentation: float, cap: float
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Memory of the fullest stage of every plan of ``rows``: states + activations + reserve (the fixed part and the
    allocator's fragmentation of the activations, ``memory.reserve_bytes``) per stage kind, the largest; (memory, the
    plans over ``cap``, those of them that activations dominate), the last two None when every plan fits."""
    acts = rows.acts
    per_stage = rows.states + acts + (rows.fixed_reserve[:, None] + fragmentation * acts)
    fullest = np.argmax(np.where(np.isnan(per_stage), -np.inf, per_stage), axis=-1)[..., None]  # the first of equals
    mem = np.where(rows.valid, np.take_along_axis(per_stage, fullest, -1)[..., 0], np.nan)
    over = rows.valid & ~(mem <= cap)  # as estimate: fits = total <= gpu.mem_bytes
    if not over.any():
        return mem, None, None
    acts_fullest = np.take_along_axis(acts, fullest, -1)[..., 0]
    by_acts = over & (acts_fullest >= mem - rows.fixed_reserve - (1 + fragmentation) * acts_fullest)
    return mem, over, by_acts


def _framework_zero_mask(
    job: Job, base: Base, valid: np.ndarray, invalid: Counter, examples: dict[str, str]
) -> np.ndarray:
    """Plans whose ZeRO stage the job's framework cannot run (``spec.zero_refusal``) made invalid, counted by
    reason: the zero axis is not part of the per-job validator pass (``_valid_jobs``). A stage the user named
    (``--fix zero``, ``--zero 3``) is searched as asked, as ``estimate`` prices a plan that states it."""
    zero_axis = AXES.index("zero")
    for z, zero in enumerate(base.axes["zero"]):
        msg = zero_refusal(job.plan.framework, zero)
        if msg is None or zero in base.asked_zero:
            continue
        index = [slice(None)] * valid.ndim
        index[zero_axis] = z
        n_refused = int(valid[tuple(index)].sum())
        if n_refused:
            valid = valid.copy() if not valid.flags.writeable else valid
            valid[tuple(index)] = False
            why = reason(msg)
            invalid[why] += n_refused
            examples.setdefault(why, msg)
    return valid


@dataclass
class _Prepared:
    """A base up to its stages: the valid jobs, the validity mask and the grid with its stage plans
    (``_stage_plans``); ``_finish`` prices it once its stages are in the cache (``_prefill``)."""

    base: Base
    shape: tuple[int, ...]
    grid_codes: np.ndarray
    invalid: Counter
    examples: dict[str, str]
    valid: np.ndarray | None = None
    g: _Grid | None = None


def _eval_base(job: Job, base: Base, phase_cache: dict[Any, _Shared] | None = None) -> _BaseResult:
    """Evaluate every plan of one base on its grid (vp, micro_batch, sequence_parallel, zero, recompute, grad dtype).

    Each part of ``estimate`` is computed once per value of what it depends on (the module docstring's table),
    with the model's own functions; the stage split (the layers of each pipeline rank) depends on vp only when
    the layers do not divide evenly, so the stage-level parts are kept per distinct split.
    """
    return _eval_bases(job, [base], phase_cache)[0]


def _eval_bases(job: Job, todo: list[Base], phase_cache: dict[Any, _Shared] | None = None) -> list[_BaseResult]:
    """``_eval_base`` of each base, the stages of all of them priced together first (``_prefill``), the grid formulas
    of all of them last (``_finish_bases``)."""
    cache: dict[Any, _Shared] = {} if phase_cache is None else phase_cache
    prepared = [_prepare(job, b, cache) for b in todo]
    _prefill(prepared)
    return _finish_bases(job, prepared, [_base_parts(job, p) for p in prepared])


def _prefill(prepared: list[_Prepared]) -> None:
    """Every dense stage of these bases priced in one array pass per TP/CP placement (``prefill_stage_times``:
    the bases of one placement share their blocks, prices and stage cache)."""
    groups: list[tuple[_Grid, list]] = []
    for p in prepared:
        if p.g is None:
            continue
        group = next((plans for g, plans in groups if g.shared is p.g.shared), None)
        if group is None:
            groups.append((p.g, group := []))
        group.extend(((p, key), plan) for key, plan in p.g.stage_plans.items())
    for g, plans in groups:
        keys = [p.g.stage_keys.get(key) for (p, key), _ in plans]
        priced, wanted = prefill_stages([(x, wl) for _, (x, wl, _) in plans], g.costs, g.shared.templates, keys)
        for ((p, key), _), pipeline in zip(plans, wanted):
            if pipeline is not None:  # MoE plans: ``stage_times`` one by one (``_stage_parts``)
                p.g.stages[key] = (priced, *pipeline)


def _prepare(job: Job, base: Base, phase_cache: dict[Any, _Shared]) -> _Prepared:
    shape = tuple(len(base.axes[k]) for k in AXES)
    grid = np.indices(shape).reshape(len(AXES), -1).T  # every plan's index on each axis, in the grid's C order
    jobs, invalid, examples = _valid_jobs(job, base)
    prep = _Prepared(base, shape, _codes(job, base, grid), invalid, examples)
    if not jobs:
        return prep
    prep.g = _grid(job, base, jobs, phase_cache)
    valid = np.broadcast_to(prep.g.valid_mask()[:, :, :, None, None, None], shape)  # read-only: masks copy it
    valid = _framework_zero_mask(job, base, valid, invalid, examples)
    prep.valid = _recompute_mask(job, base, jobs, valid, invalid, examples)
    prep.g.stage_plans = _stage_plans(prep.g)
    return prep


@dataclass(frozen=True)
class _BaseParts:
    """One base's parts before the grid formulas (``_finish_bases``): what ``estimate`` prices per slowest stage,
    per split or per (vp, mb, sp), on the base's own axes."""

    prep: _Prepared
    slow: np.ndarray  # (split, mb, sp, recompute, column): ``_stage_parts``' slowest stages (``_SLOW_COLUMNS``)
    bubble: np.ndarray  # (vp, mb, sp, recompute)
    pp_exposed: np.ndarray  # (vp, mb, sp, recompute)
    dp: _DpParts
    acts: np.ndarray  # (vp, mb, sp, recompute, stage kind): the stages that can be the fullest
    fixed_reserve: float


def _base_parts(job: Job, prep: _Prepared) -> _BaseParts | None:
    """A prepared base's parts, its stages priced (``_prefill``); None for a base without a valid plan."""
    base, g = prep.base, prep.g
    if g is None:
        return None
    slowest, slow, bubble, pp_exposed = _stage_parts(g)
    # only the first stage of each kind can be the fullest (``memory.stage_kinds``), per split
    kinds = [stage_kinds(g.sample_of_split(si)) for si in range(len(g.splits))]
    dp = _dp_parts(g, slowest, kinds)
    a = assumptions_for(job.cluster.profile)
    fixed_reserve = fixed_reserve_bytes(
        base.tp, base.pp, base.cp, job.cluster.num_gpus // (base.tp * base.pp * base.cp), a
    )
    return _BaseParts(prep, slow, bubble, pp_exposed, dp, _activations(g, kinds), fixed_reserve)


@dataclass(frozen=True)
class _PlanRows:
    """The inputs of the grid formulas for every plan of some bases, one row per plan (each base's grid in C order,
    the bases one after another; ``at``: each base's rows), so that the formulas run once for all of them: each
    part as ``estimate`` reads it for that plan (split-indexed parts on their vp, stage kinds last, NaN past a
    base's kinds)."""

    at: list[slice]
    valid: np.ndarray  # bool
    m: np.ndarray  # micro-batches per replica
    vp: np.ndarray
    pp: np.ndarray
    fixed_reserve: np.ndarray
    slow: np.ndarray  # (plans, ``_SLOW_COLUMNS``)
    bubble: np.ndarray
    pp_exposed: np.ndarray
    dp_exposed: np.ndarray  # priced per slowest stage (NaN where it is on the grid)
    optimizer: np.ndarray
    on_grid: np.ndarray  # bool: ``_dp_grid``'s plans, ``traffic`` its fields
    traffic: np.ndarray
    on_z3: np.ndarray  # bool: ``_zero3_grid``'s plans, ``z3`` its fields
    z3: np.ndarray
    states: np.ndarray  # (plans, stage kinds)
    acts: np.ndarray  # (plans, stage kinds)


def _plan_rows(done: list[_BaseParts]) -> _PlanRows:
    """The bases' parts as rows of plans (``_PlanRows``): each part written once per base, broadcast to its grid."""
    sizes = [len(x.prep.grid_codes) for x in done]
    ends = list(itertools.accumulate(sizes))
    at = [slice(e - n, e) for n, e in zip(sizes, ends)]
    n, n_kinds, width = ends[-1], max(x.acts.shape[-1] for x in done), done[0].slow.shape[-1]
    empty, nan = (lambda *shape: np.empty(shape)), (lambda *shape: np.full(shape, np.nan))
    rows = _PlanRows(
        at,
        np.empty(n, bool),
        empty(n),
        np.empty(n, np.int64),
        np.empty(n, np.int64),
        empty(n),
        empty(n, width),
        empty(n),
        empty(n),
        nan(n),
        empty(n),
        np.zeros(n, bool),
        nan(n, 9),
        np.zeros(n, bool),
        nan(n, 5),
        nan(n, n_kinds),
        nan(n, n_kinds),
    )
    for x, rows_of in zip(done, at):
        _put_base(rows, rows_of, x)
    return rows


def _put_base(rows: _PlanRows, at: slice, x: _BaseParts) -> None:
    """One base's parts written into its rows of ``rows``: each part indexed by its axes of the base's grid (vp, mb,
    sp, zero, recompute, gd), the split-indexed ones by each vp's split."""
    g, shape = x.prep.g, x.prep.shape

    def grid(a: np.ndarray) -> np.ndarray:  # the base's rows of ``a`` as its grid (a view: written in place)
        return a[at].reshape(shape + a.shape[1:])

    by_vp, dp = g.split_of_vp, x.dp
    grid(rows.valid)[...] = x.prep.valid
    grid(rows.m)[...] = g.n_micro[:, None, None, None, None]
    grid(rows.vp)[...] = np.asarray(g.axis("vp"))[:, None, None, None, None, None]
    rows.pp[at] = x.prep.base.pp
    rows.fixed_reserve[at] = x.fixed_reserve
    grid(rows.slow)[...] = x.slow[by_vp][:, :, :, None, :, None, :]
    grid(rows.bubble)[...] = x.bubble[:, :, :, None, :, None]
    grid(rows.pp_exposed)[...] = x.pp_exposed[:, :, :, None, :, None]
    if dp.per_stage is not None:  # (vp, mb, sp, recompute, zero, gd): zero before recompute on the grid
        grid(rows.dp_exposed)[...] = dp.per_stage.transpose(0, 1, 2, 4, 3, 5)
    grid(rows.optimizer)[...] = dp.optimizer[by_vp][:, None, None, :, None, :]
    if dp.on_grid is not None:
        grid(rows.on_grid)[...] = dp.on_grid[by_vp][:, :, None, :, None, :]
        grid(rows.traffic)[...] = dp.traffic[by_vp][:, :, None, :, None, :, :]
    if dp.on_z3 is not None:
        grid(rows.on_z3)[...] = dp.on_z3[by_vp][:, :, None, :, None, :]
        grid(rows.z3)[...] = dp.z3[by_vp][:, :, None, :, None, :, :]
    kinds = x.acts.shape[-1]
    grid(rows.states)[..., :kinds] = dp.states[by_vp][:, None, None, :, None, :, :]
    grid(rows.acts)[..., :kinds] = x.acts[:, :, :, None, :, None, :]


def _finish_bases(job: Job, prepared: list[_Prepared], parts: list[_BaseParts | None]) -> list[_BaseResult]:
    """The bases' results: the grid formulas (exposed overlapped DP traffic, the step, the fullest stage's memory) once
    for every plan of all of them (``_PlanRows``: a formula's NumPy calls cost the same on a few plans as on
    thousands), then each base's rows."""
    done = [x for x in parts if x is not None]
    if not done:
        return [_empty_result(job, p) for p in prepared]
    rows = _plan_rows(done)
    moe = job.model.is_moe
    width = len(_SLOW_COLUMNS[moe]) - len(_PASS_FIELDS)
    passes = tuple(rows.slow[:, width + i] for i in range(len(_PASS_FIELDS)))
    cm = done[0].prep.g.costs.cm  # the job's compute model: every base's
    dp_exposed = rows.dp_exposed
    if rows.on_grid.any():
        dp_exposed = np.where(rows.on_grid, _dp_grid(cm, rows, passes), dp_exposed)
    if rows.on_z3.any():
        dp_exposed = np.where(rows.on_z3, _zero3_grid(cm, rows, passes), dp_exposed)
    step, table, exposed = _assemble(rows, dp_exposed, moe)
    step, exposed = np.where(rows.valid, step, np.nan), np.where(rows.valid, exposed, np.nan)
    a = assumptions_for(job.cluster.profile)
    mem, over, by_acts = _fullest_memory(rows, a.v("allocator_fragmentation"), job.cluster.gpu.mem_bytes)
    n_acts = n_states = [0] * len(done)
    if over is not None:
        n_acts, n_states = _counts(by_acts, rows.at), _counts(over & ~by_acts, rows.at)
    out: list[_BaseResult] = []
    got = iter(zip(done, rows.at, n_acts, n_states))
    for p, x in zip(prepared, parts):
        if x is None:
            out.append(_empty_result(job, p))
            continue
        _, at, acts_over, states_over = next(got)
        nofit: Counter = Counter()
        if acts_over:
            nofit["activations dominate"] += acts_over
        if states_over:
            nofit["weights+grads+optimizer dominate"] += states_over
        out.append(
            _BaseResult(
                plans=p.grid_codes,
                step=step[at],
                parts=table[at],
                exposed=exposed[at],
                mem=mem[at],
                valid=rows.valid[at],
                invalid_reasons=p.invalid,
                nofit_reasons=nofit,
                examples=p.examples,
            )
        )
    return out


def _counts(mask: np.ndarray, at: list[slice]) -> list[int]:
    """How many rows of each base ``mask`` holds (``at``: the bases' rows, one after another)."""
    seen = np.concatenate(([0], np.cumsum(mask)))
    return (seen[[s.stop for s in at]] - seen[[s.start for s in at]]).tolist()


def _empty_result(job: Job, prep: _Prepared) -> _BaseResult:
    """A base without a valid plan: every plan invalid, counted by reason."""
    flat = len(prep.grid_codes)
    nan = np.full(flat, np.nan)
    return _BaseResult(
        prep.grid_codes,
        nan,
        np.full((flat, len(part_keys(job))), np.nan),
        nan,
        nan,
        np.zeros(flat, bool),
        prep.invalid,
        Counter(),
        prep.examples,
    )


def _assemble(rows: _PlanRows, dp_exposed: np.ndarray, moe: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step time of every plan of ``rows``: ``estimate.step_parts`` on arrays, summed in its order; (step, the parts
    one row per plan in ``part_keys`` order (MoE: ep_exposed after cp_exposed, as estimate), the exposed time)."""
    slow, m = rows.slow, rows.m
    named = step_parts(
        micro_batches=m,
        compute=slow[:, 0],
        recompute=slow[:, 1],
        tp_exposed=slow[:, 2],
        cp_exposed=slow[:, 3],
        bubble_s=rows.bubble,
        pp_exposed=rows.pp_exposed,
        dp_exposed=dp_exposed,
        optimizer=rows.optimizer,
    )
    keys = BREAKDOWN_KEYS
    if moe:  # MoE: m × the exposed all-to-all of the slowest stage, as estimate's ep_exposed
        named["ep_exposed"] = m * slow[:, 4]
        keys = MOE_PART_KEYS
    parts = [named[k] for k in keys]
    table = np.empty((len(m), len(parts)))  # parts last: a plan's parts are one row of the table
    for i, p in enumerate(parts):
        table[:, i] = p
    step = parts[0]
    for p in parts[1:]:
        step = step + p
    exposed = parts[2] + parts[3] + parts[keys.index("pp_exposed")] + parts[keys.index("dp_exposed")]
    if moe:
        exposed = exposed + parts[4]
    return step, table, exposed


def _codes(job: Job, base: Base, grid: np.ndarray) -> np.ndarray:
    """The plan table of a base's grid (``COLUMNS``): layout and dp repeated, grid axes by their codes."""
    dp = job.cluster.num_gpus // (base.tp * base.pp * base.cp)
    fixed = {**base.fields, "dp": dp}
    cols = columns(job)
    out = np.empty((len(grid), len(cols)), np.int64)
    for c, k in enumerate(cols):
        if k in GRID_AXES:
            i = GRID_AXES.index(k)
            out[:, c] = np.asarray([AXIS[k].code(x) for x in base.axes[k]], np.int64)[grid[:, i]]
        else:
            out[:, c] = AXIS[k].code(fixed[k]) if k in AXIS else fixed[k]
    return out


# ----------------------------------------------------------------------------- the search
def _mp_methods() -> list[str]:
    import multiprocessing as mp

    return mp.get_all_start_methods()


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's kill ends a worker at once
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this worker when the search process dies, even by SIGKILL (prctl PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the parent's clean-up still kills workers
        pass


def _eval_placement(
    job: Job, group: list[tuple[int, Base]], between: Callable[[], None] = lambda: None
) -> list[tuple[int, _BaseResult]]:
    """The bases of one TP/CP placement (``_by_placement``), with their positions: prepared, their dense stages priced
    in one array pass (``_prefill``), their parts priced base by base (``_base_parts``), the grid formulas evaluated
    for all of their plans at once (``_finish_bases``); ``between`` runs after each of those steps (the search process
    reads its workers' results there, ``_run_workers``). What the bases built (valid jobs, workloads, phase prices,
    stage times: ``_Shared``) is theirs alone and freed on return, so the next placement reuses its memory instead of
    faulting in fresh pages (~5 µs a page on a VM; a forked worker starts with none of its own)."""
    cache: dict[Any, _Shared] = {}
    prepared, parts = [], []
    for _, b in group:
        prepared.append(_prepare(job, b, cache))
        between()
    _prefill(prepared)
    between()
    for p in prepared:
        parts.append(_base_parts(job, p))
        between()
    done = _finish_bases(job, prepared, parts)
    between()
    return [(i, r) for (i, _), r in zip(group, done)]


def _worker(job: Job, groups: list[list[tuple[int, Base]]], conn: Any) -> None:
    """One worker process: its placements (``_by_placement``) one at a time, each one's results sent as it ends
    (``_send_results``), then "done". An error is sent to the parent, which raises it."""
    _init_worker()
    try:
        for group in groups:
            _send_results(conn, _eval_placement(job, group))
        conn.send(("done", None))
    except Exception as e:  # the parent re-raises it: a bug in the model must not read as a partial result
        conn.send(("error", e))
    finally:
        conn.close()


# the arrays of a base's result, sent as raw bytes after their header (dtype and shape)
_RESULT_ARRAYS = ("plans", "step", "parts", "exposed", "mem", "valid")


def _send_results(conn: Any, numbered: list[tuple[int, _BaseResult]]) -> None:
    """Results to the parent: a header (each base's position, counters, examples and its arrays' dtypes and shapes),
    then each array's bytes straight from its memory (no pickled copy; ``_recv_results`` reads them into arrays)."""
    arrays = [[np.ascontiguousarray(getattr(r, k)) for k in _RESULT_ARRAYS] for _, r in numbered]
    head = [
        (i, [(a.dtype.str, a.shape) for a in arrs], r.invalid_reasons, r.nofit_reasons, r.examples)
        for (i, r), arrs in zip(numbered, arrays)
    ]
    conn.send(("results", head))
    for arrs in arrays:
        for a in arrs:
            conn.send_bytes(a.reshape(-1).view(np.uint8))  # as bytes: a memoryview of an empty 2-D array cannot be cast


def _recv_results(conn: Any, head: list) -> list[tuple[int, _BaseResult]]:
    """The results ``_send_results`` announced in ``head``, each array read from the pipe into its own memory."""
    out = []
    for i, specs, invalid, nofit, examples in head:
        arrs = [np.empty(shape, np.dtype(dt)) for dt, shape in specs]
        for a in arrs:
            _recv_into(conn, a)
        out.append((i, _BaseResult(*arrs, invalid_reasons=invalid, nofit_reasons=nofit, examples=examples)))
    return out


def _recv_into(conn: Any, a: np.ndarray) -> None:
    """One ``send_bytes`` message read into ``a`` (its size checked): the connection's own ``recv_bytes_into``
    would gather it in a BytesIO first, 64 KiB at a time."""
    fd = conn.fileno()
    (size,) = struct.unpack("!i", _read_exact(fd, 4))
    if size == -1:  # the framing of a message over 2 GiB
        (size,) = struct.unpack("!Q", _read_exact(fd, 8))
    if size != a.nbytes:
        raise RuntimeError(f"a search worker sent {size} bytes for an array of {a.nbytes}")
    view = memoryview(a).cast("B") if a.nbytes else memoryview(b"")
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError
        got += n


def _read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _run_workers(
    job: Job, todo: list[Base], workers: int, progress: Callable[[int, int], None] | None
) -> tuple[list[_BaseResult], bool]:
    """Evaluate ``todo`` in ``workers`` processes, this one and ``workers - 1`` forked workers with a result pipe each;
    (results, interrupted).

    This process evaluates a share too (``_by_placement``'s first), reading what the workers have sent between its
    own bases (``drain``): a worker costs a fork, a start with none of its own memory and its results' way through a
    pipe, and this process has its memory already. The processes and pipes are this function's own (no pool
    machinery, no locks a signal could leave held): signals are deferred while it runs and checked between results
    and between this process's placements, and on a signal, an error or a worker that died, every worker is
    SIGKILLed and joined before it returns (a worker forked a moment ago may not have run ``_init_worker`` yet and
    still hold the parent's deferring handler: SIGTERM could be ignored)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")
    # each result comes back with its base's position: the results are put in the bases' order, whichever worker
    # ends first (the CSV rows, the first example of a refusal and the order of equal plans do not depend on it)
    own, *forked = _by_placement(list(enumerate(todo)), workers)
    results: list[tuple[int, _BaseResult]] = []
    procs, conns, live = [], [], []

    def take(conn: Any) -> None:  # one message of a worker
        try:
            kind, payload = conn.recv()
            if kind == "results":
                payload = _recv_results(conn, payload)
        except EOFError:
            raise RuntimeError("a search worker died before it sent its results") from None
        if kind == "error":
            raise payload
        if kind == "done":
            live.remove(conn)
            return
        results.extend(payload)
        if progress:
            progress(len(results), len(todo))

    def drain() -> None:  # what the workers have sent so far, without waiting for more; a signal ends this share
        if stop:
            raise _Stopped
        for conn in wait(live, timeout=0) if live else ():
            take(conn)

    with signals.deferred() as stop:
        try:
            for mine in forked:
                if not mine or stop:
                    continue
                reader, writer = ctx.Pipe(duplex=False)
                _widen(reader)
                proc = ctx.Process(target=_worker, args=(job, mine, writer), daemon=True)
                proc.start()
                writer.close()  # the worker holds the write end: its death gives EOF here
                procs.append(proc)
                conns.append(reader)
            live.extend(conns)
            try:
                for group in own:
                    results.extend(_eval_placement(job, group, between=drain))
                    if progress:
                        progress(len(results), len(todo))
            except _Stopped:  # the placement under way is dropped: what ended before the signal is the result
                pass
            while live and not stop:
                for conn in wait(live, timeout=0.2):
                    take(conn)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
            for proc in procs:
                proc.join(timeout=30)
            for conn in conns:
                conn.close()
        return [r for _, r in sorted(results, key=lambda ir: ir[0])], bool(stop)


class _Stopped(Exception):
    """A deferred signal seen between this process's own bases (``_run_workers``)."""


def _widen(conn: Any) -> None:
    """A result pipe of 1 MiB (Linux ``F_SETPIPE_SZ``; 64 KiB by default), so that a worker seldom waits for this
    process to finish a base before it can send a placement's results; elsewhere, or refused, it stays as it is."""
    import fcntl

    try:
        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except (AttributeError, OSError):
        pass


def _by_placement(numbered: list[tuple[int, Base]], workers: int) -> list[list[list[tuple[int, Base]]]]:
    """The bases shared out to ``workers`` processes as placements: the bases that place TP and CP alike go to the
    same process (they share workloads, block prices and stages: ``_Shared``), placements handed out largest first to
    the least loaded worker (load: plans on the grid); each worker's placements in the order of their first base."""
    groups: dict[tuple, list[tuple[int, Base]]] = {}
    for i, b in numbered:
        groups.setdefault((b.tp, b.cp, tuple(sorted(b.extra.items()))), []).append((i, b))
    size = lambda bs: sum(math.prod(len(b.axes[k]) for k in AXES) for _, b in bs)
    shares: list[list[list[tuple[int, Base]]]] = [[] for _ in range(workers)]
    load = [0] * workers
    for bs in sorted(groups.values(), key=size, reverse=True):
        w = load.index(min(load))
        shares[w].append(bs)
        load[w] += size(bs)
    return [sorted(share, key=lambda bs: bs[0][0]) for share in shares]


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused (as the simulator's ``_no_gc``), re-enabled as it was on the way out."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# The default number of processes, from the work a search has (``default_workers``). A worker costs CPU whatever
# it saves: the fork, the pages it and the search process then copy on write, its results through a pipe, and two
# processes slowing each other down. Measured on 2026-12-07 (2-core KVM host, warm, GPT-3 175B on 4,096 H100,
# 143,880 plans in ~1.7 CPU-s): a second process cost +0.12 to +0.64 CPU-s per search (median +0.3, 2.3k -> 19k page
# faults), and it bought 0.55 s of wall time only while the host had a core free (1.65 -> 1.09 s): with the other core
# busy it lost 0.1-0.6 s. The DeepSeek-V3 search (46,188 plans, ~2.5 CPU-s) paid +0.1 CPU-s and gained ~1.4 s on a
# quiet host. So a process is added per ``WORKER_S`` of estimated one-process work, not below it.
WORKER_S = 2.0
# the one-process CPU seconds of a base, per cell of its (vp, micro_batch, sp, recompute) grid and per plan (the
# zero x grad-dtype arrays), dense and MoE (an MoE stage is priced plan by plan), measured as above over the
# default spaces of the example jobs and wider ones (--grad-comm-dtype, --micro-batch, --vp, --ep)
CELL_S = {False: 35e-6, True: 250e-6}
PLAN_S = 3.6e-6


def serial_estimate(job: Job, todo: Sequence[Base]) -> float:
    """The CPU seconds the bases of a search are estimated to take in one process (``CELL_S``, ``PLAN_S``)."""
    cell_s, cells, plans = CELL_S[job.model.is_moe], 0, 0
    for b in todo:
        n = math.prod(len(b.axes[k]) for k in ("vp", "micro_batch", "sequence_parallel", "recompute"))
        cells += n
        plans += n * len(b.axes["zero"]) * len(b.axes["grad_comm_dtype"])
    return cells * cell_s + plans * PLAN_S


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(job: Job, todo: Sequence[Base]) -> int:
    """Processes for a search with no ``--workers``: one per ``WORKER_S`` of its estimated one-process work
    (``serial_estimate``), at least one, at most the CPUs it may use; a search under ``WORKER_S`` runs in this
    process and forks nothing."""
    est = serial_estimate(job, todo)
    return 1 if est < WORKER_S else max(1, min(available_cpus(), math.ceil(est / WORKER_S)))


def evaluate_space(
    job: Job,
    space: Space | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[_BaseResult], Counter, dict[str, str], bool]:
    """Evaluate every plan of the space: per-base results, skipped-base reasons and examples, interrupted flag."""
    space = space or Space()
    todo, skipped, skip_examples = bases(job, space)
    results: list[_BaseResult] = []
    numbered: list[tuple[int, _BaseResult]] = []  # one process: (position, result), placement by placement
    interrupted = False
    if workers is None:
        workers = default_workers(job, todo)
    if workers > 1 and "fork" not in _mp_methods():
        workers = 1  # workers inherit the job by fork; elsewhere (Windows) search in one process
    # the search allocates ~10^5 acyclic objects (phases, stage times, workloads) that live to its end: the cyclic
    # collector would rescan the whole heap again and again (about a sixth of a search's CPU time)
    with _no_gc():
        try:
            if workers <= 1:  # placement by placement, as a worker does (``_eval_placement``)
                for group in _by_placement(list(enumerate(todo)), 1)[0]:
                    numbered.extend(_eval_placement(job, group))
                    if progress:
                        progress(len(numbered), len(todo))
            else:
                results, interrupted = _run_workers(job, todo, workers, progress)
        except KeyboardInterrupt:  # one process: Ctrl-C/SIGTERM raise between plans, no pool lock to leave held
            interrupted = True
    if numbered:  # in the bases' order, as the workers' results
        results = [r for _, r in sorted(numbered, key=lambda ir: ir[0])]
    return results, skipped, skip_examples, interrupted


def search(
    job: Job,
    space: Space | None = None,
    rank_by: str = "step",
    top: int = 5,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    verify: int = 0,
) -> SearchResult:
    """Every plan of ``space`` for the job's model and cluster, ranked; the top ``top`` re-estimated exactly.

    rank_by: "step" (fastest), "cost" ($ per step) or "tokens_per_dollar". With one cluster all three
    give the same order (cost per step = GPUs × $/GPU-s × step); they differ across clusters (compare).
    verify: re-run the best ``verify`` plans through the event simulator and rank those by the simulated
    step (``verify_top``). Raises SpecError when the space holds no valid plan, or none that fits memory.
    """
    import time

    if rank_by not in RANK_BY:
        raise SpecError(f"--rank: {rank_by!r} is not one of {', '.join(RANK_BY)}")
    t0 = time.perf_counter()
    space = space or Space()
    parts, skipped, skip_examples, interrupted = evaluate_space(job, space, workers, progress)
    res = _collect(job, parts, skipped, interrupted, rank_by)
    res.elapsed_s = time.perf_counter() - t0
    if res.evaluated == 0 or not res.valid.any():
        if interrupted:
            raise Interrupted("search interrupted before any valid plan was found")  # exit 130, not bad input
        examples = {**skip_examples, **res.invalid_examples}
        why = "; ".join(f"{examples.get(k, k)}" for k, _ in (res.invalid_reasons + skipped).most_common(2))
        cons = ", ".join(f"{k}={c.describe()}" for k, c in space.constraints.items())
        raise SpecError(
            f"search space is empty: no valid plan{(' with ' + cons) if cons else ''} "
            f"for {job.cluster.num_gpus} GPUs: {why or 'no candidates'}"
        )
    if not res.order.size:
        need = np.nanmin(res.mem_bytes) / GiB
        raise SpecError(
            f"no plan fits memory: each of the {int(res.valid.sum())} valid plans needs more than "
            f"{job.cluster.gpu.mem_GiB:g} GiB per GPU (the smallest needs "
            f"{memory_need(need, job.cluster.gpu.mem_GiB).replace(' needed per GPU', '')}); "
            "allow more GPUs, "
            "ZeRO-3, full recompute or larger tp/pp"
        )
    res.top, res.max_rel_diff = exact_top(job, res, max(top, verify))
    if res.max_rel_diff > AGREEMENT_TOL:
        # the model changed what one of its parts depends on: the numbers shown are estimate's, the order may not be
        res.warnings.append(
            f"search's assembled step differs from estimate by {res.max_rel_diff:.2e} (relative) on its top plans; "
            "the breakdowns shown are estimate's, but the ranking may be off: report it (benchmarks/bench_search.py)"
        )
        res.top.sort(key=lambda pb: pb[1].step_time_s)
    if verify and not interrupted:  # Ctrl-C/SIGTERM: show the partial ranking now, not after K simulations
        verify_top(job, res, verify)
    res.top = res.top[: max(top, verify)]
    if not res.verified and res.top:  # --verify flags its best simulated plan itself (``verify_top``)
        plan, b = res.top[0]
        why = above_published(job_for(job, plan), b.mfu, b.hfu)
        if why:
            res.warnings.append(f"best plan: {why}")
    return res


# ----------------------------------------------------------------------------- MoE dimensions
MOE_SEARCH_FIELDS = MOE_AXES  # ep, etp, moe_dispatcher, moe_a2a_overlap: layout axes of MoE jobs (decide.space)


def moe_values(job: Job, options: dict[str, str | None]) -> dict[str, list[Any]]:
    """Values of each MoE plan field to try: the ones given (comma lists or ranges, parsed by the spec's types),
    else the job's."""
    space = Space.parse({f: options.get(f) for f in MOE_SEARCH_FIELDS})
    return {f: space.values(job, f, {}, raw_spec(job)) for f in MOE_SEARCH_FIELDS}


def search_moe(
    job: Job, moe_options: dict[str, str | None], space: Space | None = None, top: int = 5, **kw: Any
) -> SearchResult:
    """``search`` with the MoE plan fields (ep, etp, moe_dispatcher, moe_a2a_overlap) as given in ``moe_options``
    (layout axes of the one grid search); ``moe_choices`` holds each combination's best step, or why it has none
    (the spec's refusal on the job's own plan, or that none of its plans is valid and fits)."""
    space = space or Space()
    given = {f: v for f, v in moe_options.items() if v is not None}
    moe_space = Space.parse(given)
    merged = Space({**space.constraints, **moe_space.constraints}, space.fix)
    vals = moe_values(job, moe_options)
    try:
        res = search(job, merged, top=top, **kw)
    except SpecError as e:
        if not job.model.is_moe:  # the MoE flags themselves are refused (``space.bases``)
            raise
        refused = _refusals(job, vals)
        if refused and len(refused) == _combinations(vals):
            raise SpecError(f"no MoE combination is valid: {refused[0].refused}") from e
        raise
    res.moe_choices = _moe_choices(job, res, vals)
    return res


def _combinations(vals: dict[str, list[Any]]) -> int:
    return math.prod(len(v) for v in vals.values())


def _refusals(job: Job, vals: dict[str, list[Any]]) -> list[MoeChoice]:
    """Each MoE combination the spec refuses on the job's own plan, with the refusal."""
    out = []
    for combo in itertools.product(*vals.values()):
        change = dict(zip(vals, combo))
        try:
            job_with(job, **change)
        except SpecError as e:
            out.append(MoeChoice(PlanRow(tuple(vals), **change), refused=str(e)))
    return out


def _moe_choices(job: Job, res: SearchResult, vals: dict[str, list[Any]]) -> list[MoeChoice]:
    """Per MoE combination: the best step among the plans that fit (by the ranking's order), else why none."""
    cols = columns(job)
    codes = {f: res.plans[:, cols.index(f)] for f in vals}
    best: dict[tuple, float] = {}
    for i in res.order:  # best first
        key = tuple(AXIS[f].decode(int(codes[f][i])) for f in vals)
        best.setdefault(key, float(res.step_s[i]))
    refused = {tuple(getattr(r.fields, f) for f in vals): r for r in _refusals(job, vals)}
    tried, others = [], []
    for combo in itertools.product(*vals.values()):
        fields = PlanRow(tuple(vals), **dict(zip(vals, combo)))
        if combo in best:
            tried.append(MoeChoice(fields, best_step_s=best[combo]))
        elif combo in refused:
            others.append(refused[combo])
        else:
            others.append(MoeChoice(fields, refused="no plan of the space with these fields is valid and fits memory"))
    tried.sort(key=lambda c: c.best_step_s)
    return tried + others


def above_published(job: Job, mfu: float, hfu: float | None = None) -> str | None:
    """Why a plan's predicted MFU is suspect: above every published run of its GPU at its precision's peak (the
    winner's curse: the search lands where the model is most optimistic), naming the best run; None otherwise.

    MFU counts model FLOPs only, so a plan without activation recompute can beat every published run's MFU at the
    hardware rate those runs sustained: full recompute spends a quarter of a step's FLOPs on a second forward
    (mosaicml/llm-foundry scripts/train/benchmarking/README.md "MFU and HFU": hfu = 4·flops_per_seq where
    mfu = 3·flops_per_seq). The message says which: a hardware rate (HFU, ``hfu``) within the best published one
    names that run and its recompute as the reason; one above it too is optimistic outright."""
    best = published_best(job.cluster.gpu.name, job.training.precision)
    if best is None or mfu <= best.mfu:
        return None
    gpu, prec = job.cluster.gpu.name, job.training.precision
    peak = job.cluster.gpu.peak_flops(prec) / TFLOPS
    head = (
        f"MFU {mfu:.1%} is above every published {gpu} {prec} run in the validation data (best {best.mfu:.1%}, "
        f"{best.row}" + (f", {best.precision}: the same {peak:g} TFLOP/s peak)" if best.precision != prec else ")")
    )
    hfu = mfu if hfu is None else hfu
    if hfu > best.hfu:
        return (
            f"{head}, and its hardware rate (HFU {hfu:.1%}) is above every published run's too (best {best.hfu:.1%}, "
            f"{best.hfu_row}): treat this plan's figure as optimistic"
        )
    recomputes = best.hfu_row_recompute not in ("", "none") and best.hfu_row_mfu < best.hfu
    if not recomputes:
        return f"{head}; its hardware rate (HFU {hfu:.1%}) is within {best.hfu_row}'s ({best.hfu:.1%})"
    mine = (
        f"this plan does not recompute: it keeps {memory(job).activations / GiB:.1f} GiB of activations per GPU instead"
        if job.plan.recompute == "none"
        else f"this plan's recompute is {job.plan.recompute}"
    )
    return (
        f"{head}; its hardware rate is not: HFU {hfu:.1%} against {best.hfu:.1%} for {best.hfu_row}. The gap is "
        f"activation recompute: that run recomputes (recompute {best.hfu_row_recompute}, so its MFU is "
        f"{best.hfu_row_mfu:.1%}); {mine}. Its MFU holds if it fits memory as estimated"
    )


def verify_top(job: Job, res: SearchResult, k: int) -> None:
    """Simulate the best ``k`` plans (``commtax.schedule.sim``) and put them first in ``res.top`` in order of
    the simulated step; ``res.verified`` keeps both times of each, the estimate's 80% interval and a flag on an
    MFU above every published run of the GPU (``above_published``). The simulator runs the schedule the estimate
    averages (send stalls, bucket tails, a shared NIC), so its order is the one to trust when the two disagree."""
    from commtax.schedule.sim import SimOptions, simulate
    from commtax.workload.step import grad_bucket_bytes

    rows: list[Verified] = []
    for plan, b in res.top[:k]:
        verify_job = job_for(job, plan)  # the framework's gradient bucket, as the estimate's
        sim = simulate(verify_job, SimOptions(bucket_bytes=grad_bucket_bytes(verify_job)), compare=False).breakdown
        rows.append(Verified(plan, b, sim, above_published(verify_job, b.mfu, b.hfu)))
    rows.sort(key=lambda v: v.simulate.step_time_s)  # stable: ties keep the estimate's order
    res.top = [(v.plan, v.estimate) for v in rows] + res.top[k:]
    res.verified = rows


def _collect(job: Job, parts: list[_BaseResult], skipped: Counter, interrupted: bool, rank_by: str) -> SearchResult:
    cat = lambda name, width=None: (
        np.concatenate([getattr(p, name) for p in parts]) if parts else np.zeros((0, width) if width else 0)
    )
    width = len(columns(job))
    plans = cat("plans", width).astype(np.int64, copy=False) if parts else np.zeros((0, width), np.int64)
    step = cat("step")
    mem = cat("mem")
    valid = cat("valid").astype(bool) if parts else np.zeros(0, bool)
    fits = valid & (mem <= job.cluster.gpu.mem_bytes)
    inv: Counter = Counter()
    nof: Counter = Counter()
    examples: dict[str, str] = {}
    for p in parts:
        inv.update(p.invalid_reasons)
        nof.update(p.nofit_reasons)
        for k, v in p.examples.items():
            examples.setdefault(k, v)
    idx = np.flatnonzero(fits)
    # best first; ties (plans the model cannot tell apart) go to the smaller memory, then the table order (``idx``
    # ascends and lexsort is stable)
    order = idx[np.lexsort((mem[idx], step[idx]))]
    return SearchResult(
        job=job,
        plans=plans,
        step_s=step,
        parts_s=cat("parts", len(part_keys(job))),
        exposed_s=cat("exposed"),
        mem_bytes=mem,
        valid=valid,
        fits=fits,
        invalid_reasons=inv,
        nofit_reasons=nof,
        order=order,
        rank_by=rank_by,
        interrupted=interrupted,
        invalid_examples=examples,
    )


def exact_top(job: Job, res: SearchResult, n: int) -> tuple[list[tuple[PlanRow, Breakdown]], float]:
    """Re-estimate the best ``n`` plans with ``estimate``: the numbers shown are always the model's own."""
    out = []
    worst = 0.0
    for i in res.order[:n]:
        plan = res.row(int(i))
        b = estimate(job_for(job, plan))
        worst = max(worst, abs(b.step_time_s - res.step_s[i]) / b.step_time_s)
        out.append((plan, b))
    return out, worst


def agreement(job: Job, res: SearchResult, sample: int = 50, seed: int = 0) -> dict[str, float]:
    """Max relative difference between the search's numbers and ``estimate`` on a random sample of valid plans."""
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(res.valid)
    pick = rng.choice(idx, size=min(sample, len(idx)), replace=False) if len(idx) else idx
    step = mem = 0.0
    fits_mismatch = 0
    for i in pick:
        b = estimate(job_for(job, res.row(int(i))))
        step = max(step, abs(b.step_time_s - res.step_s[i]) / b.step_time_s)
        total = b.memory_gib_per_gpu["total"] * GiB
        mem = max(mem, abs(total - res.mem_bytes[i]) / total)
        fits_mismatch += int(b.fits != bool(res.fits[i]))
    return {"sample": float(len(pick)), "step_rel": step, "mem_rel": mem, "fits_mismatch": float(fits_mismatch)}


def brute_force(job: Job, space: Space | None = None) -> list[tuple[PlanRow, Breakdown]]:
    """Every valid plan of the space through ``estimate`` one by one (slow; for tests)."""
    space = space or Space()
    out = []
    for b in bases(job, space)[0]:
        for values in itertools.product(*(b.axes[k] for k in AXES)):
            plan = {**b.fields, **dict(zip(AXES, values))}
            try:
                j = job_with(job, dp=None, **split_reset(job, b.pp), **plan)
            except SpecError:
                continue
            out.append((PlanRow.of(j, columns(job)), estimate(j)))
    return out
