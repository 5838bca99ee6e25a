"""The plan space: candidate values per plan field, and the best plan for a job's free fields.

A flat product over typed candidate lists plus a feasibility filter (STYLE.md: no nested
loops). Used by ``validate`` to fill the plan cells a publication leaves out, "as the authors
tuned them", and by ``search``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import Breakdown
from commtax.spec import Job, build

MAX_MICRO_BATCH = 32


def divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (limit or n) + 1) if n % d == 0 and d <= n]


def candidates(field: str, fixed: dict[str, Any], raw: dict[str, Any]) -> list[Any]:
    """Values worth trying for one empty plan field, given the ones already fixed."""
    model, cluster, training = raw["model"], raw["cluster"], raw["training"]
    n_gpus = cluster["num_gpus"]
    if field == "sequence_parallel":
        return [False, True] if fixed.get("tp", 1) > 1 else [False]
    if field == "recompute":
        return ["none", "selective", "full"]
    if field == "zero":
        return [0, 1, 2, 3]
    if field == "schedule":
        return ["1f1b"]
    if field == "tp":
        return [d for d in divisors(n_gpus, min(n_gpus, cluster.get("gpus_per_node", 8)))]
    if field in ("pp", "cp"):
        return divisors(n_gpus, min(n_gpus, 64))
    if field == "ep":  # Megatron: num_experts % ep == 0
        return [d for d in divisors(model.get("num_experts") or 1) if d <= n_gpus]
    if field == "etp":  # expert TP: inside the node, as TP
        return divisors(n_gpus, min(n_gpus, cluster.get("gpus_per_node", 8)))
    if field == "dp":
        return [None]
    if field == "vp":
        pp = fixed.get("pp", 1)
        if pp == 1:
            return [1]
        layers = model["layers"]
        extra = int(bool(fixed.get("account_for_embedding_in_pipeline_split"))) + int(
            bool(fixed.get("account_for_loss_in_pipeline_split"))
        )
        if extra:  # the embedding and/or loss count as layers: layers + extra divide over pp·vp (spec.pipeline_split)
            return divisors((layers + extra) // pp) if (layers + extra) % pp == 0 else [1]
        if layers % pp == 0:
            return divisors(layers // pp)
        # uneven stages: the balanced split gives each stage a multiple of vp layers (spec.pipeline_split)
        return [v for v in divisors(layers) if pp * v <= layers]
    if field == "micro_batch":
        mp = fixed.get("tp", 1) * fixed.get("pp", 1) * fixed.get("cp", 1)
        dp = fixed.get("dp") or max(1, n_gpus // mp)
        per_replica = training["global_batch"] // dp if training["global_batch"] % dp == 0 else 1
        return divisors(per_replica, MAX_MICRO_BATCH) or [1]
    raise SpecError(f"plan.{field}: cannot search over this field")


# order matters: later fields' candidates depend on earlier ones (vp on pp, micro_batch on dp)
_SEARCH_ORDER = ("tp", "pp", "cp", "dp", "zero", "recompute", "sequence_parallel", "schedule", "vp", "micro_batch")


@dataclass(frozen=True)
class Choice:
    job: Job
    breakdown: Breakdown
    chosen: PlanRow  # the free fields' values: its columns are the free fields


def _expand(raw: dict, fixed: dict, free: list[str]) -> Iterator[dict]:
    if not free:
        yield dict(fixed)
        return
    head, rest = free[0], free[1:]
    for value in candidates(head, fixed, raw):
        yield from _expand(raw, {**fixed, head: value}, rest)


def plan_space(raw: dict, fixed: dict[str, Any], free: Iterable[str]) -> Iterator[dict]:
    """Every assignment of the free fields (in dependency order) on top of the fixed ones."""
    order = [f for f in _SEARCH_ORDER if f in set(free)]
    yield from _expand(raw, dict(fixed), order)


def feasible_jobs(raw: dict, plans: Iterable[dict]) -> Iterator[Job]:
    for plan in plans:
        try:
            yield build(Job, {**raw, "plan": {k: v for k, v in plan.items() if v is not None}}, "")
        except SpecError:
            continue


def best_plan(
    raw: dict,
    fixed: dict[str, Any],
    free: Iterable[str],
    require_fit: bool = True,
    allow: Callable[[dict], bool] | None = None,
) -> Choice | None:
    """Fastest plan (tokens/s) over the free fields that fits memory (any valid plan when ``require_fit`` is
    false) and that ``allow`` accepts (a fact the publication states about the free fields); None when none
    qualifies."""
    free = list(free)
    best: Choice | None = None
    plans = plan_space(raw, fixed, free)
    for job in feasible_jobs(raw, plans if allow is None else filter(allow, plans)):
        b = estimate(job)
        if require_fit and not b.fits:
            continue
        if best is None or b.tokens_per_s > best.breakdown.tokens_per_s:
            best = Choice(job, b, PlanRow.of(job, free))
    return best


@dataclass(frozen=True)
class PlanRow:
    """A plan as one row of a plan table, the form in which plans travel between search, compare, pool search and
    the reports: typed, frozen, hashable, and written as a dict only at the edge (:meth:`to_dict`, JSON and CSV).

    ``columns`` are the table's columns, in its order (a dense search: ``space.COLUMNS``; an MoE search adds its
    axes; the pool search has its own, :data:`POOL_COLUMNS`): they are the keys ``to_dict`` writes, so each
    output keeps its keys and their order; a field outside them keeps its default and is not written."""

    columns: tuple[str, ...]
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    vp: int = 1
    micro_batch: int = 1
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 1
    recompute: Literal["none", "selective", "full"] = "selective"
    grad_comm_dtype: str = "bf16"
    schedule: str = "1f1b"
    ep: int = 1
    etp: int = 1
    moe_dispatcher: str = "alltoall"
    moe_a2a_overlap: bool = False
    stage_pools: tuple[int | str, ...] | None = None
    stage_layers: tuple[int, ...] | None = None
    pool_batch_share: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.columns) - PLAN_ROW_FIELDS
        assert not unknown, f"PlanRow has no field {sorted(unknown)}"  # a programmer's error: a column misnamed

    @classmethod
    def of(cls, job: Job, columns: Iterable[str]) -> PlanRow:
        """The job's own plan (dp resolved) written with ``columns``."""
        columns = tuple(columns)
        return cls(columns, **{c: _job_value(job, c) for c in columns})

    @classmethod
    def from_dict(cls, plan: Mapping[str, Any]) -> PlanRow:
        """A row as JSON wrote it (``to_dict``'s inverse: a ``search --json`` plan read back): its keys are the
        columns, lists become tuples."""
        return cls(tuple(plan), **{k: tuple(v) if isinstance(v, list) else v for k, v in plan.items()})

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON writes it: the columns in order, tuples as lists."""
        return {c: list(v) if isinstance(v := getattr(self, c), tuple) else v for c in self.columns}

    def values(self) -> dict[str, Any]:
        """The plan fields the row sets (its columns) as the spec takes them (``spec.job_with``'s changes)."""
        return {c: getattr(self, c) for c in self.columns}

    def get(self, field: str, default: Any = None) -> Any:
        """A column's value, ``default`` for a field outside the columns (it is not part of this row)."""
        return getattr(self, field) if field in self.columns else default

    def without(self, fields: Iterable[str]) -> PlanRow:
        """The row with ``fields`` taken out of its columns (a label that leaves them to another)."""
        drop = set(fields)
        return replace(self, columns=tuple(c for c in self.columns if c not in drop))

    @property
    def label(self) -> str:
        return plan_label(self)


def _job_value(job: Job, field: str) -> Any:
    """A plan field of ``job`` as a plan table writes it: dp and the stages' layers resolved (the plan may leave
    them to the spec)."""
    if field == "dp":
        return job.dp
    if field == "stage_layers":
        return tuple(job.stage_layers)
    return getattr(job.plan, field)


PLAN_ROW_FIELDS = frozenset(f.name for f in fields(PlanRow)) - {"columns"}
NO_CHOICE = PlanRow(())  # a row of no columns: nothing chosen
# the pool search's plans: the layout, the batch, and where the stages, layers and batch shares go
POOL_COLUMNS = ("tp", "pp", "dp", "micro_batch", "recompute", "stage_pools", "stage_layers", "pool_batch_share")


def plan_label(row: PlanRow) -> str:
    """A plan in one token: ``tp8·pp4·dp8·mb1``, then what differs from the defaults (cp/vp > 1, ZeRO stage,
    recompute, sequence parallelism, a gradient dtype other than bf16): ``tp8·pp4·dp8·mb1·vp2·z1·sel·sp``. A
    plan's fields outside its row's columns are not shown."""
    p = row.to_dict()  # the label writes what the row's columns hold, as JSON does
    parts = [f"tp{p['tp']}", f"pp{p['pp']}", f"dp{p['dp']}", f"mb{p['micro_batch']}"]
    if p.get("cp", 1) > 1:
        parts.insert(2, f"cp{p['cp']}")
    if p.get("vp", 1) > 1:
        parts.append(f"vp{p['vp']}")
    if p.get("zero"):
        parts.append(f"z{p['zero']}")
    parts.append({"none": "", "selective": "sel", "full": "full"}.get(p.get("recompute", "none"), p.get("recompute")))
    if p.get("sequence_parallel"):
        parts.append("sp")
    if p.get("grad_comm_dtype", "bf16") != "bf16":
        parts.append(f"g:{p['grad_comm_dtype']}")
    # MoE plans: the expert layout and dispatcher, each where the plan has it (dense plans have no such keys)
    parts += [f"ep{p['ep']}" if "ep" in p else "", f"etp{p['etp']}" if p.get("etp", 1) > 1 else ""]
    parts += [DISPATCHER_LABEL.get(p.get("moe_dispatcher", ""), ""), "ovl" if p.get("moe_a2a_overlap") else ""]
    return "·".join(x for x in parts if x)


DISPATCHER_LABEL = {"alltoall": "a2a", "allgather": "ag", "deepep": "dep", "hybridep": "hep"}
PLAN_LABEL_KEY = "plan: tp·pp·(cp)·dp·mb, then vp, z=ZeRO stage, sel/full=recompute, sp, g:=grad dtype"
MOE_LABEL_KEY = "MoE: ep·(etp), then a2a/ag/dep/hep = dispatcher, ovl = all-to-all overlap"
