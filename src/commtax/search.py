"""Plan search: every valid plan of a job's model on its cluster, evaluated by the one model, ranked.

How it stays fast without a second copy of the model
----------------------------------------------------
``estimate(job)`` is a sum of parts, each computed by one of the lead's functions that reads only a
few plan fields.  The search groups plans by *base* (tp, pp, cp; dp follows) and, inside a base,
evaluates each part once per distinct sub-configuration, with the model's own functions:

============================  =====================================  ==========================
part                          model function                         depends on (within a base)
============================  =====================================  ==========================
validity                      ``Job`` validator (``spec``)           vp, micro_batch, sp
stage times (slow, average)   ``stage_times`` (*)                    micro_batch, sp, recompute
pipeline sends                ``estimate.pp_exposed``                micro_batch, vp
DP traffic                    ``estimate.dp_exposed``                micro_batch, sp, recompute, zero, grad dtype
optimizer step                ``Costs.compute(wl.optimizer)``        zero, grad dtype
model-state memory            ``memory.memory``                      zero, grad dtype
activation memory             ``memory.activation_bytes``            vp, micro_batch, sp, recompute
============================  =====================================  ==========================

(*) the layer, embedding and head blocks of ``build_workload`` do not depend on pp or dp, so one workload
per (micro_batch, sp, recompute) serves every base with the same TP and CP placement, and their phases are
priced once (``_Shared``). The search then assembles the step on the plan grid with NumPy broadcasting
(``_assemble``: the same sum, in the same order, as ``estimate``). Every search re-estimates its top plans
with ``estimate`` and reports the largest relative difference (``max_rel_diff``, a warning above 1e-9);
the tests and the benchmark check it on random samples, so a change of the model's dependencies shows
up at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commtax import estimate as _est
from commtax.errors import Interrupted, SpecError
from commtax.estimate import (
    BREAKDOWN_KEYS,
    Breakdown,
    Costs,
    estimate,
    stage_times,
    step_parts,
)
from commtax.memory import FRAMEWORK_RESERVE_GiB, activation_bytes, memory
from commtax.plans import candidates
from commtax.spec import Job, job_with
from commtax.topology import layout
from commtax.units import GiB
from commtax.workload import build_workload

RECOMPUTE = ("none", "selective", "full")
GRAD_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
SEARCH_FIELDS = ("tp", "pp", "cp", "vp", "micro_batch", "zero", "recompute", "sequence_parallel", "grad_comm_dtype")
PART_KEYS = _est.BREAKDOWN_KEYS
RANK_BY = ("step", "cost", "tokens_per_dollar")
AGREEMENT_TOL = 1e-9  # relative: the search's numbers must be estimate's
# columns of the plan table: integer codes (recompute and grad dtype as indices into the tuples above)
COLUMNS = ("tp", "pp", "cp", "dp", "vp", "micro_batch", "sequence_parallel", "zero", "recompute", "grad_comm_dtype")


# ----------------------------------------------------------------------------- the space
@dataclass(frozen=True)
class Constraint:
    """What the user allows for one field: explicit values, or a closed range over the default candidates."""

    values: tuple[Any, ...] | None = None
    lo: float | None = None
    hi: float | None = None

    def filter(self, default: Sequence[Any]) -> list[Any]:
        if self.values is not None:
            return list(self.values)
        return [v for v in default if (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)]

    def describe(self) -> str:
        if self.values is not None:
            return ",".join(str(v) for v in self.values)
        return f"{'' if self.lo is None else self.lo}..{'' if self.hi is None else self.hi}"


def _convert(fieldname: str, text: str) -> Any:
    text = text.strip()
    if fieldname == "sequence_parallel":
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise SpecError(f"--{fieldname}: expected true/false, got {text!r}")
    if fieldname == "recompute":
        if text not in RECOMPUTE:
            raise SpecError(f"--recompute: {text!r} is not one of {', '.join(RECOMPUTE)}")
        return text
    if fieldname == "grad_comm_dtype":
        if text not in GRAD_DTYPES:
            raise SpecError(f"--grad-comm-dtype: {text!r} is not one of {', '.join(GRAD_DTYPES)}")
        return text
    try:
        v = int(text)
    except ValueError:
        raise SpecError(f"--{fieldname.replace('_', '-')}: expected an integer, got {text!r}") from None
    if v < 0 or (v == 0 and fieldname != "zero"):
        raise SpecError(f"--{fieldname.replace('_', '-')}: expected a positive integer, got {v}")
    return v


def parse_constraint(fieldname: str, text: str) -> Constraint:
    """``"8"`` / ``"1,2,4"`` (values) or ``"2..16"``, ``"..8"``, ``"4.."`` (range over the default candidates)."""
    if fieldname not in SEARCH_FIELDS:
        raise SpecError(f"cannot constrain {fieldname!r}; searchable fields: {', '.join(SEARCH_FIELDS)}")
    text = text.strip()
    if ".." in text:
        if fieldname in ("recompute", "sequence_parallel", "grad_comm_dtype"):
            raise SpecError(f"--{fieldname.replace('_', '-')}: give values (a,b), not a range")
        lo_s, hi_s = text.split("..", 1)
        lo = _convert(fieldname, lo_s) if lo_s.strip() else None
        hi = _convert(fieldname, hi_s) if hi_s.strip() else None
        if lo is not None and hi is not None and lo > hi:
            raise SpecError(f"--{fieldname.replace('_', '-')}: empty range {text!r}")
        return Constraint(lo=lo, hi=hi)
    return Constraint(values=tuple(dict.fromkeys(_convert(fieldname, t) for t in text.split(",") if t.strip())))


@dataclass(frozen=True)
class Space:
    """Constraints per field; an unconstrained field takes the plan space's default candidates.

    ``grad_comm_dtype`` defaults to the job's own (compression changes the numerics: opt in).
    ``fix`` pins fields to the job file's values.
    """

    constraints: dict[str, Constraint] = field(default_factory=dict)
    fix: tuple[str, ...] = ()

    @staticmethod
    def parse(options: dict[str, str | None], fix: Iterable[str] = ()) -> "Space":
        cons = {k: parse_constraint(k, v) for k, v in options.items() if v is not None}
        fix = tuple(fix)
        for f in fix:
            if f not in SEARCH_FIELDS:
                raise SpecError(f"--fix: unknown field {f!r}; searchable fields: {', '.join(SEARCH_FIELDS)}")
        return Space(cons, fix)

    def values(self, job: Job, fieldname: str, fixed: dict[str, Any], raw: dict) -> list[Any]:
        if fieldname in self.fix:
            return [getattr(job.plan, fieldname)]
        if fieldname == "grad_comm_dtype":
            c = self.constraints.get(fieldname)
            return list(c.values) if c and c.values is not None else [job.plan.grad_comm_dtype]
        c = self.constraints.get(fieldname, Constraint())
        return c.filter(candidates(fieldname, fixed, raw))


def _raw(job: Job) -> dict:
    return {
        "model": job.model.model_dump(),
        "cluster": job.cluster.model_dump(),
        "training": job.training.model_dump(),
    }


# ----------------------------------------------------------------------------- result
@dataclass
class SearchResult:
    """All evaluated plans of one job, as columns; ``order`` ranks the ones that are valid and fit."""

    job: Job
    plans: np.ndarray  # (n, len(COLUMNS)) int codes
    step_s: np.ndarray  # (n,) nan where invalid
    parts_s: np.ndarray  # (n, len(PART_KEYS))
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
    top: list[tuple[dict[str, Any], Breakdown]] = field(default_factory=list)
    max_rel_diff: float = 0.0
    invalid_examples: dict[str, str] = field(default_factory=dict)  # reason -> one full validator message
    warnings: list[str] = field(default_factory=list)

    @property
    def evaluated(self) -> int:
        return int(len(self.step_s))

    @property
    def plans_per_s(self) -> float:
        return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else math.inf

    def plan_dict(self, i: int) -> dict[str, Any]:
        return plan_from_row(self.plans[i])

    def best(self) -> tuple[dict[str, Any], Breakdown] | None:
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
        head = list(COLUMNS) + ["step_time_s"] + [f"{k}_s" for k in PART_KEYS] + ["memory_GiB", "fits"]
        lines = [",".join(head)]
        for i in np.flatnonzero(self.valid):
            p = self.plan_dict(int(i))
            vals = [str(p[c]) for c in COLUMNS] + [repr(float(self.step_s[i]))]
            vals += [repr(float(x)) for x in self.parts_s[i]]
            vals += [repr(float(self.mem_bytes[i] / GiB)), str(bool(self.fits[i]))]
            lines.append(",".join(vals))
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "top": [{"plan": p, "breakdown": b.to_dict()} for p, b in self.top],
        }


def plan_from_row(row: Sequence[int]) -> dict[str, Any]:
    d = dict(zip(COLUMNS, (int(x) for x in row)))
    d["sequence_parallel"] = bool(d["sequence_parallel"])
    d["recompute"] = RECOMPUTE[d["recompute"]]
    d["grad_comm_dtype"] = GRAD_DTYPES[d["grad_comm_dtype"]]
    return d


def job_for(job: Job, plan: dict[str, Any]) -> Job:
    """The job with a searched plan (validated by the spec)."""
    return job_with(job, **plan)


# ----------------------------------------------------------------------------- one base (tp, pp, cp)
class _MemoCosts(Costs):
    """The model's Costs with each phase priced once across all the bases that place TP and CP alike:
    by identity (the layer blocks are shared between bases, see ``_eval_base``), then by content."""

    def __init__(self, job: Job, shared: "_Shared | None" = None):
        super().__init__(job)
        self._shared = shared or _Shared()

    def phase(self, ph):  # type: ignore[override]
        ids = self._shared.phase_ids
        hit = ids.get(id(ph))
        if hit is not None and hit[0] is ph:
            return hit[1]
        try:
            v = self._shared.phases[ph]
        except KeyError:
            v = self._shared.phases[ph] = super().phase(ph)
        ids[id(ph)] = (ph, v)  # holding ph keeps its id from being reused
        return v


@dataclass
class _Shared:
    """What bases with the same TP and CP placement share: phase prices and per-micro-batch workloads."""

    phases: dict[Any, Any] = field(default_factory=dict)
    phase_ids: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    workloads: dict[tuple, Any] = field(default_factory=dict)  # (mb, sp, recompute) -> Workload


def _model_copy(job: Job, **changes: Any) -> Job:
    return job.model_copy(update={"plan": job.plan.model_copy(update=changes)})


def _fast_copy(job: Job, **changes: Any) -> Job:
    """``_model_copy`` without pydantic's generic copy machinery (2x faster; checked against it at import)."""
    plan = object.__new__(type(job.plan))
    for name, value in (("__dict__", {**job.plan.__dict__, **changes}),
                        ("__pydantic_fields_set__", job.plan.__pydantic_fields_set__ | set(changes)),
                        ("__pydantic_extra__", None), ("__pydantic_private__", None)):
        object.__setattr__(plan, name, value)
    new = object.__new__(type(job))
    for name, value in (("__dict__", {**job.__dict__, "plan": plan}),
                        ("__pydantic_fields_set__", job.__pydantic_fields_set__),
                        ("__pydantic_extra__", None), ("__pydantic_private__", None)):
        object.__setattr__(new, name, value)
    return new


def _copy(job: Job, **changes: Any) -> Job:
    """A plan variant of a job already validated for the fields that the validator reads (no re-validation)."""
    return (_fast_copy if _FAST_COPY_OK else _model_copy)(job, **changes)


def _fast_copy_works() -> bool:
    try:
        from commtax.spec import Cluster, Model, Plan, Training

        probe = Job.model_construct(
            model=Model.model_construct(), cluster=Cluster.model_construct(),
            plan=Plan(), training=Training.model_construct(),
        )
        a, b = _fast_copy(probe, zero=3, recompute="full"), _model_copy(probe, zero=3, recompute="full")
        return a.plan == b.plan and a.plan.model_fields_set == b.plan.model_fields_set and a.plan.zero == 3
    except Exception:  # pragma: no cover - a pydantic without these internals
        return False


_FAST_COPY_OK = _fast_copy_works()


def _reason(msg: str) -> str:
    """Group validator messages by their text with the numbers taken out."""
    return re.sub(r"\d+", "n", msg).strip()


@dataclass
class _Base:
    tp: int
    pp: int
    cp: int
    axes: dict[str, list[Any]]  # vp, micro_batch, sequence_parallel, zero, recompute, grad_comm_dtype


AXES = ("vp", "micro_batch", "sequence_parallel", "zero", "recompute", "grad_comm_dtype")


def _bases(job: Job, space: Space) -> tuple[list[_Base], Counter, dict[str, str]]:
    """The (tp, pp, cp) combinations of the space whose product divides the GPU count, with their axes;
    skipped ones counted by reason (with one full message per reason)."""
    raw = _raw(job)
    n = job.cluster.num_gpus
    out: list[_Base] = []
    skipped: Counter = Counter()
    examples: dict[str, str] = {}
    for tp, pp, cp in itertools.product(
        space.values(job, "tp", {}, raw), space.values(job, "pp", {}, raw), space.values(job, "cp", {}, raw)
    ):
        if n % (tp * pp * cp):
            msg = f"tp({tp}) * pp({pp}) * cp({cp}) = {tp * pp * cp} does not divide num_gpus({n})"
            skipped[_reason(msg)] += 1
            examples.setdefault(_reason(msg), msg)
            continue
        fixed = {"tp": tp, "pp": pp, "cp": cp}
        axes = {
            "vp": space.values(job, "vp", fixed, raw),
            "micro_batch": space.values(job, "micro_batch", fixed, raw),
            "sequence_parallel": space.values(job, "sequence_parallel", fixed, raw),
            "zero": space.values(job, "zero", fixed, raw),
            "recompute": space.values(job, "recompute", fixed, raw),
            "grad_comm_dtype": space.values(job, "grad_comm_dtype", fixed, raw),
        }
        if any(not v for v in axes.values()):
            continue
        out.append(_Base(tp, pp, cp, axes))
    return out, skipped, examples


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


def _eval_base(job: Job, base: _Base, phase_cache: dict[Any, _Shared] | None = None) -> _BaseResult:
    """Evaluate every plan of one base on its grid (vp, mb, sp, zero, recompute, grad dtype)."""
    A = base.axes
    VP, MB, SP, Z, RC, GD = (A[k] for k in AXES)
    shape = tuple(len(A[k]) for k in AXES)
    invalid: Counter = Counter()
    nofit: Counter = Counter()
    examples: dict[str, str] = {}
    valid = np.zeros(shape[:3], bool)
    # validity per (vp, mb, sp): the spec's own validator
    jobs_v: dict[tuple[int, int, int], Job] = {}
    for (i, vp), (j, mb), (k, sp) in itertools.product(enumerate(VP), enumerate(MB), enumerate(SP)):
        try:
            jobs_v[i, j, k] = job_with(
                job, tp=base.tp, pp=base.pp, cp=base.cp, dp=None, vp=vp, micro_batch=mb, sequence_parallel=sp
            )
            valid[i, j, k] = True
        except SpecError as e:
            why = _reason(str(e))
            invalid[why] += len(Z) * len(RC) * len(GD)
            examples.setdefault(why, str(e))
    grid = np.stack(np.meshgrid(*(np.arange(s) for s in shape), indexing="ij"), -1).reshape(-1, len(AXES))
    if not jobs_v:
        plans = _codes(job, base, grid)
        z = np.full(len(grid), np.nan)
        return _BaseResult(plans, z, np.full((len(grid), len(PART_KEYS)), np.nan), z, z, np.zeros(len(grid), bool),
                           invalid, nofit, examples)
    any_job = next(iter(jobs_v.values()))
    shared = _Shared() if phase_cache is None else phase_cache.setdefault(_phase_key(any_job), _Shared())
    costs = _MemoCosts(any_job, shared)
    m = np.array([any_job.training.global_batch // (any_job.dp * mb) for mb in MB], float)  # micro-batches per step
    rep_v = {(j, k): jv for (i, j, k), jv in sorted(jobs_v.items(), reverse=True)}  # any valid vp per (mb, sp)
    mbs = sorted({j for j, _ in rep_v})
    n_mb = {j: next(jv for (jj, _), jv in rep_v.items() if jj == j).micro_batches for j in mbs}
    # per (zero, gd): DP ops and optimizer from the model's workload (they do not depend on the micro-batch
    # size; only the micro-batch count does, set per mb); model-state memory
    wl_w: dict[tuple[int, int, int], Any] = {}
    opt = np.full((len(MB), len(Z), len(GD)), np.nan)
    states = np.full((len(Z), len(GD)), np.nan)
    jv0 = next(iter(rep_v.values()))
    for (z, zero), (g, gd) in itertools.product(enumerate(Z), enumerate(GD)):
        jw = _copy(jv0, zero=zero, grad_comm_dtype=gd)
        wl = build_workload(jw)
        mm = memory(jw)
        states[z, g] = mm.weights + mm.grads + mm.optimizer
        t_opt = costs.compute(wl.optimizer)
        for j in mbs:
            wl_w[j, z, g] = (jw, dataclasses.replace(wl, micro_batches=n_mb[j]))
            opt[j, z, g] = t_opt
    layers_per_stage = wl.layers_per_stage
    # per (mb, sp, rc): the model's stage times -> slow stage and average. The layer, embedding and head
    # blocks do not depend on pp or dp: one workload per (mb, sp, rc) serves every base of this TP/CP
    # placement, with this base's layers per stage and micro-batch count.
    slow: dict[tuple[int, int, int], Any] = {}
    st_avg = np.full((len(MB), len(SP), len(RC)), np.nan)
    st_parts = np.full((4, len(MB), len(SP), len(RC)), np.nan)  # compute, recompute, tp_exposed, cp_exposed
    wl_mb: dict[int, Any] = {}  # a workload per micro-batch size (pipeline sends, micro-batch count)
    for (j, k), jv in rep_v.items():
        for r, rc in enumerate(RC):
            jr = _copy(jv, recompute=rc)
            key = (MB[j], SP[k], rc)
            template = shared.workloads.get(key)
            if template is None:
                template = shared.workloads[key] = build_workload(jr)
            wl = wl_mb[j] = dataclasses.replace(template, layers_per_stage=layers_per_stage,
                                                micro_batches=n_mb[j])
            stages = stage_times(jr, wl, costs)
            s = max(stages, key=lambda x: x.total)  # as estimate: the slowest rank sets the pace
            slow[j, k, r] = s
            st_avg[j, k, r] = sum(x.total for x in stages) / len(stages)
            st_parts[:, j, k, r] = (s.compute, s.recompute, s.tp_exposed, s.cp_exposed)
    # DP traffic per (mb, sp, rc, zero, gd); pipeline sends per (vp, mb)
    dp_exp = np.full((len(MB), len(SP), len(RC), len(Z), len(GD)), np.nan)
    for (j, k, r), s in slow.items():
        for (z, _), (g, _) in itertools.product(enumerate(Z), enumerate(GD)):
            jw, wl = wl_w[j, z, g]
            dp_exp[j, k, r, z, g] = _est.dp_exposed(jw, wl, costs, s)[1]
    pp_exp = np.full((len(VP), len(MB)), np.nan)
    acts = np.full((len(VP), len(MB), len(SP), len(RC)), np.nan)
    for (i, j, k), jv in jobs_v.items():
        if np.isnan(pp_exp[i, j]):
            pp_exp[i, j] = _est.pp_exposed(jv, wl_mb[j], costs)[1]
        for r, rc in enumerate(RC):
            acts[i, j, k, r] = activation_bytes(_copy(jv, recompute=rc))
    step, parts, exposed = _assemble(base.pp, VP, m, st_parts, st_avg, pp_exp, dp_exp, opt)
    reserve = FRAMEWORK_RESERVE_GiB * GiB
    # Memory.total order: weights + grads + optimizer + activations + reserve
    mem = states[None, None, None, :, None, :] + acts[:, :, :, None, :, None] + reserve
    valid_full = np.broadcast_to(valid[:, :, :, None, None, None], shape)
    step = np.where(valid_full, step, np.nan)
    mem = np.where(valid_full, mem, np.nan)
    cap = job.cluster.gpu.mem_bytes  # as estimate: fits = total <= gpu.mem_bytes
    over = valid_full & ~(mem <= cap)
    if over.any():
        act_full = np.broadcast_to(acts[:, :, :, None, :, None], shape)
        st_full = np.broadcast_to(states[None, None, None, :, None, :], shape)
        by_acts = over & (act_full >= st_full)
        n_acts, n_states = int(by_acts.sum()), int((over & ~by_acts).sum())
        if n_acts:
            nofit["activations dominate"] += n_acts
        if n_states:
            nofit["weights+grads+optimizer dominate"] += n_states
    flat = len(grid)
    return _BaseResult(
        plans=_codes(job, base, grid),
        step=step.reshape(flat),
        parts=np.moveaxis(parts, 0, -1).reshape(flat, len(PART_KEYS)),
        exposed=np.where(valid_full, exposed, np.nan).reshape(flat),
        mem=mem.reshape(flat),
        valid=valid_full.reshape(flat).copy(),
        invalid_reasons=invalid,
        nofit_reasons=nofit,
        examples=examples,
    )


def _assemble(pp, VP, m, st_parts, st_avg, pp_exp, dp_exp, opt):
    """Step time on the (vp, mb, sp, zero, rc, gd) grid: ``estimate.step_parts`` on arrays, summed in its order.

    Axes of the inputs: st_parts (4, mb, sp, rc); st_avg (mb, sp, rc); pp_exp (vp, mb);
    dp_exp (mb, sp, rc, zero, gd); opt (mb, zero, gd); m (mb,).
    """
    v = np.asarray(VP, float)[:, None, None, None, None, None]
    mm = m[None, :, None, None, None, None]
    stage = st_parts[:, None, :, :, None, :, None]  # -> (4, vp, mb, sp, zero, rc, gd)
    named = step_parts(mm, stage[0], stage[1], stage[2], stage[3], st_avg[None, :, :, None, :, None], pp, v,
                       pp_exp[:, :, None, None, None, None], np.moveaxis(dp_exp, 2, 3)[None],
                       opt[None, :, None, :, None, :])
    parts = [np.asarray(named[k], float) for k in BREAKDOWN_KEYS]
    shape = np.broadcast_shapes(*(p.shape for p in parts))
    parts = [np.broadcast_to(p, shape) for p in parts]
    step = parts[0]
    for p in parts[1:]:
        step = step + p
    exposed = parts[2] + parts[3] + parts[5] + parts[6]
    return step, np.stack(parts), exposed


def _codes(job: Job, base: _Base, grid: np.ndarray) -> np.ndarray:
    A = base.axes
    dp = job.cluster.num_gpus // (base.tp * base.pp * base.cp)
    cols = [
        np.full(len(grid), base.tp),
        np.full(len(grid), base.pp),
        np.full(len(grid), base.cp),
        np.full(len(grid), dp),
        np.asarray(A["vp"])[grid[:, 0]],
        np.asarray(A["micro_batch"])[grid[:, 1]],
        np.asarray(A["sequence_parallel"], int)[grid[:, 2]],
        np.asarray(A["zero"])[grid[:, 3]],
        np.asarray([RECOMPUTE.index(x) for x in A["recompute"]])[grid[:, 4]],
        np.asarray([GRAD_DTYPES.index(x) for x in A["grad_comm_dtype"]])[grid[:, 5]],
    ]
    return np.stack(cols, 1).astype(np.int64)


# ----------------------------------------------------------------------------- the search
def _mp_methods() -> list[str]:
    import multiprocessing as mp

    return mp.get_all_start_methods()


_WORKER_CACHE: dict[Any, _Shared] = {}  # phase prices in a worker process, shared by all its chunks


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's terminate() ends a worker at once
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _die_with_parent()
    _WORKER_CACHE.clear()


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this worker when the search process dies, even by SIGKILL (prctl PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the parent's shutdown still terminates workers
        pass


def _stop_workers(ex: Any) -> None:
    """Cancel what is queued and terminate the worker processes now (a chunk can run for seconds)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


def _eval_chunk(args: tuple[Job, list[_Base]]) -> list[_BaseResult]:
    job, bases = args
    return [_eval_base(job, b, _WORKER_CACHE) for b in bases]


def evaluate_space(
    job: Job,
    space: Space | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[_BaseResult], Counter, dict[str, str], bool]:
    """Evaluate every plan of the space: per-base results, skipped-base reasons and examples, interrupted flag."""
    space = space or Space()
    bases, skipped, skip_examples = _bases(job, space)
    results: list[_BaseResult] = []
    interrupted = False
    if workers is None:
        workers = min(2, os.cpu_count() or 1) if len(bases) >= 16 else 1
    if workers > 1 and "fork" not in _mp_methods():
        workers = 1  # workers inherit the job by fork; elsewhere (Windows) search in one process
    try:
        if workers <= 1:
            cache: dict[Any, _Shared] = {}
            for n, b in enumerate(bases):
                results.append(_eval_base(job, b, cache))
                if progress:
                    progress(n + 1, len(bases))
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            # interleave bases so both workers get a mix of cheap and costly ones
            chunks = [bases[i::workers * 4] for i in range(workers * 4)]
            chunks = [c for c in chunks if c]
            ctx = mp.get_context("fork")
            ex = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker)
            try:
                futs = [ex.submit(_eval_chunk, (job, c)) for c in chunks]
                done = 0
                for f in as_completed(futs):
                    part = f.result()
                    results.extend(part)
                    done += len(part)
                    if progress:
                        progress(done, len(bases))
            except KeyboardInterrupt:
                _stop_workers(ex)
                raise
            ex.shutdown()
    except KeyboardInterrupt:
        interrupted = True
    return results, skipped, skip_examples, interrupted


def search(
    job: Job,
    space: Space | None = None,
    rank_by: str = "step",
    top: int = 5,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Every plan of ``space`` for the job's model and cluster, ranked; the top ``top`` re-estimated exactly.

    rank_by: "step" (fastest), "cost" ($ per step) or "tokens_per_dollar". With one cluster all three
    give the same order (cost per step = GPUs × $/GPU-s × step); they differ across clusters (compare).
    Raises SpecError when the space holds no valid plan, or none that fits memory.
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
            f"{job.cluster.gpu.mem_GiB:g} GiB per GPU (the smallest needs {need:.1f} GiB); allow more GPUs, "
            "ZeRO-3, full recompute or larger tp/pp"
        )
    res.top, res.max_rel_diff = exact_top(job, res, top)
    if res.max_rel_diff > AGREEMENT_TOL:
        # the model changed what one of its parts depends on: the numbers shown are estimate's, the order may not be
        res.warnings.append(
            f"search's assembled step differs from estimate by {res.max_rel_diff:.2e} (relative) on its top plans; "
            "the breakdowns shown are estimate's, but the ranking may be off: report it (benchmarks/bench_search.py)"
        )
        res.top.sort(key=lambda pb: pb[1].step_time_s)
    return res


def _collect(job: Job, parts: list[_BaseResult], skipped: Counter, interrupted: bool, rank_by: str) -> SearchResult:
    cat = (lambda name, width=None: np.concatenate([getattr(p, name) for p in parts]) if parts else
           np.zeros((0, width) if width else 0))
    plans = cat("plans", len(COLUMNS)).astype(np.int64) if parts else np.zeros((0, len(COLUMNS)), np.int64)
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
    # best first; ties (plans the model cannot tell apart) go to the smaller memory, then the table order
    order = idx[np.lexsort((idx, mem[idx], step[idx]))]
    return SearchResult(
        job=job, plans=plans, step_s=step, parts_s=cat("parts", len(PART_KEYS)), exposed_s=cat("exposed"),
        mem_bytes=mem, valid=valid, fits=fits, invalid_reasons=inv, nofit_reasons=nof, order=order,
        rank_by=rank_by, interrupted=interrupted, invalid_examples=examples,
    )


def exact_top(job: Job, res: SearchResult, n: int) -> tuple[list[tuple[dict[str, Any], Breakdown]], float]:
    """Re-estimate the best ``n`` plans with ``estimate``: the numbers shown are always the model's own."""
    out = []
    worst = 0.0
    for i in res.order[:n]:
        plan = res.plan_dict(int(i))
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
        b = estimate(job_for(job, res.plan_dict(int(i))))
        step = max(step, abs(b.step_time_s - res.step_s[i]) / b.step_time_s)
        total = b.memory_gib_per_gpu["total"] * GiB
        mem = max(mem, abs(total - res.mem_bytes[i]) / total)
        fits_mismatch += int(b.fits != bool(res.fits[i]))
    return {"sample": float(len(pick)), "step_rel": step, "mem_rel": mem, "fits_mismatch": float(fits_mismatch)}


def brute_force(job: Job, space: Space | None = None) -> list[tuple[dict[str, Any], Breakdown]]:
    """Every valid plan of the space through ``estimate`` one by one (slow; for tests)."""
    space = space or Space()
    bases, _, _ = _bases(job, space)
    out = []
    for b in bases:
        for vp, mb, sp, zero, rc, gd in itertools.product(*(b.axes[k] for k in AXES)):
            plan = dict(tp=b.tp, pp=b.pp, cp=b.cp, vp=vp, micro_batch=mb, sequence_parallel=sp, zero=zero,
                        recompute=rc, grad_comm_dtype=gd)
            try:
                j = job_with(job, dp=None, **plan)
            except SpecError:
                continue
            out.append(({**plan, "dp": j.dp}, estimate(j)))
    return out
