"""The plan space of a search: a product over typed axes and a feasibility filter.

An axis is one plan field the search varies (``AXES``): its values come from the user's constraint, the job
file (``fix``, or ``default="job"``: a field that changes the numerics, such as gradient compression, is opt-in)
or the plan space's default candidates (``decide.plans.candidates``). Layout axes (tp, pp, cp and any axis added
with ``role="layout"``) make the *bases*: each base is one parallel layout whose product must divide the GPU
count, and the search evaluates the grid axes of a base together. Adding a plan dimension is one line in
``AXES``; a layout axis is set on every job of its bases through the spec's own validator (``job_with``), so
everything the model reads from it is priced by the model itself.

The MoE axes (``moe=True``: ep, etp, moe_dispatcher, moe_a2a_overlap) exist for MoE models only: a dense job's
bases and plan table (``columns``) are the dense ones, and an MoE flag on a dense job is refused. They default to
the job file's values (``--ep 8,16,64`` or ``--ep 8..64`` spans them); bases that share TP/CP placement and the
MoE fields share their layer blocks and phase prices (``decide.search._shared_key``).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, Literal, get_args

from pydantic import TypeAdapter, ValidationError

from commtax.decide.plans import candidates
from commtax.errors import SpecError
from commtax.spec import Job, Plan


@dataclass(frozen=True)
class Axis:
    """One searched plan field. ``role``: "layout" axes form the bases, "grid" axes the grid inside a base.
    ``default``: "candidates" (the plan space's defaults) or "job" (the job file's value unless the user lists
    values). ``ranged``: whether ``a..b`` is accepted (ordered values). ``moe``: an axis of MoE models only."""

    name: str
    role: Literal["layout", "grid"]
    default: Literal["candidates", "job"] = "candidates"
    ranged: bool = True
    moe: bool = False

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"

    @property
    def choices(self) -> tuple[Any, ...]:
        """The spec's allowed values when the field is a Literal (codes in the plan table are indices into them)."""
        return get_args(Plan.model_fields[self.name].annotation)

    def code(self, value: Any) -> int:
        """The integer code of a value in the plan table: ints as they are, bools 0/1, Literal strings by index."""
        if isinstance(value, str):
            return self.choices.index(value)
        return int(value)

    def decode(self, code: int) -> Any:
        if Plan.model_fields[self.name].annotation is bool:  # sequence_parallel, moe_a2a_overlap
            return bool(code)
        choices = self.choices
        if choices and isinstance(choices[0], str):
            return choices[code]
        return int(code)


# The searched dimensions, layout first; the grid axes in the order of the plan table's columns (``COLUMNS``).
AXES: tuple[Axis, ...] = (
    Axis("tp", "layout"),
    Axis("pp", "layout"),
    Axis("cp", "layout"),
    Axis("vp", "grid"),
    Axis("micro_batch", "grid"),
    Axis("sequence_parallel", "grid", ranged=False),
    Axis("zero", "grid"),
    Axis("recompute", "grid", ranged=False),
    Axis("grad_comm_dtype", "grid", default="job", ranged=False),
    # MoE models only: the expert layout and dispatcher change the MoE block (its all-to-all, expert GEMMs, edp)
    Axis("ep", "layout", default="job", moe=True),
    Axis("etp", "layout", default="job", moe=True),
    Axis("moe_dispatcher", "layout", default="job", ranged=False, moe=True),
    Axis("moe_a2a_overlap", "layout", default="job", ranged=False, moe=True),
)
AXIS = {a.name: a for a in AXES}
SEARCH_FIELDS: tuple[str, ...] = tuple(a.name for a in AXES)
LAYOUT_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.role == "layout")
GRID_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.role == "grid")
MOE_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.moe)
DENSE_LAYOUT_AXES: tuple[str, ...] = tuple(a for a in LAYOUT_AXES if a not in MOE_AXES)
# the plan table: the layout, dp (it follows from the layout), then the grid; MoE jobs add their axes last
COLUMNS: tuple[str, ...] = (*DENSE_LAYOUT_AXES[:3], "dp", *GRID_AXES, *DENSE_LAYOUT_AXES[3:])
MOE_COLUMNS: tuple[str, ...] = (*COLUMNS, *MOE_AXES)


def layout_axes(job: Job) -> tuple[str, ...]:
    """The layout axes of a job's search: a dense model has no MoE axes."""
    return LAYOUT_AXES if job.model.is_moe else DENSE_LAYOUT_AXES


def columns(job: Job) -> tuple[str, ...]:
    """The plan table's columns of a job's search (``COLUMNS``; MoE jobs: ``MOE_COLUMNS``)."""
    return MOE_COLUMNS if job.model.is_moe else COLUMNS


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


def _field_adapter(fieldname: str) -> TypeAdapter:
    """The spec's own type and constraints of a plan field (``Plan.model_fields``)."""
    info = Plan.model_fields[fieldname]
    return TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation)


def convert_value(fieldname: str, text: str) -> Any:
    """One command-line value of a plan field (an axis or any other), parsed and checked by the spec's own type."""
    text = text.strip()
    flag = f"--{fieldname.replace('_', '-')}"
    value: Any = text
    choices = get_args(Plan.model_fields[fieldname].annotation)
    if choices and all(isinstance(c, int) for c in choices):  # an integer Literal (zero): "2" -> 2
        try:
            value = int(text)
        except ValueError:
            raise SpecError(f"{flag}: expected one of {', '.join(map(str, choices))}, got {text!r}") from None
    try:
        return _field_adapter(fieldname).validate_python(value)
    except ValidationError as e:
        raise SpecError(f"{flag}: {e.errors()[0]['msg'].lower()}, got {text!r}") from None


_convert = convert_value


def parse_constraint(fieldname: str, text: str) -> Constraint:
    """``"8"`` / ``"1,2,4"`` (values) or ``"2..16"``, ``"..8"``, ``"4.."`` (range over the default candidates)."""
    if fieldname not in AXIS:
        raise SpecError(f"cannot constrain {fieldname!r}; searchable fields: {', '.join(SEARCH_FIELDS)}")
    text = text.strip()
    if ".." in text:
        if not AXIS[fieldname].ranged:
            raise SpecError(f"{AXIS[fieldname].flag}: give values (a,b), not a range")
        lo_s, hi_s = text.split("..", 1)
        lo = _convert(fieldname, lo_s) if lo_s.strip() else None
        hi = _convert(fieldname, hi_s) if hi_s.strip() else None
        if lo is not None and hi is not None and lo > hi:
            raise SpecError(f"{AXIS[fieldname].flag}: empty range {text!r}")
        return Constraint(lo=lo, hi=hi)
    return Constraint(values=tuple(dict.fromkeys(_convert(fieldname, t) for t in text.split(",") if t.strip())))


@dataclass(frozen=True)
class Space:
    """Constraints per field; an unconstrained field takes its axis's default (``Axis.default``).
    ``fix`` pins fields to the job file's values."""

    constraints: dict[str, Constraint] = field(default_factory=dict)
    fix: tuple[str, ...] = ()

    @staticmethod
    def parse(options: dict[str, str | None], fix: Iterable[str] = ()) -> Space:
        cons = {k: parse_constraint(k, v) for k, v in options.items() if v is not None}
        fix = tuple(fix)
        for f in fix:
            if f not in AXIS:
                raise SpecError(f"--fix: unknown field {f!r}; searchable fields: {', '.join(SEARCH_FIELDS)}")
        return Space(cons, fix)

    def asked(self, fieldname: str, job: Job) -> frozenset:
        """Values of ``fieldname`` the user named: pinned with ``fix`` or listed in a constraint (not a range)."""
        if fieldname in self.fix:
            return frozenset({getattr(job.plan, fieldname)})
        c = self.constraints.get(fieldname)
        return frozenset(c.values) if c is not None and c.values is not None else frozenset()

    def values(self, job: Job, fieldname: str, fixed: dict[str, Any], raw: dict) -> list[Any]:
        if fieldname in self.fix:
            return [getattr(job.plan, fieldname)]
        c = self.constraints.get(fieldname)
        if AXIS[fieldname].default == "job" and c is None:
            return [getattr(job.plan, fieldname)]
        if c is not None and c.values is not None:
            return list(c.values)
        return (c or Constraint()).filter(candidates(fieldname, fixed, raw))


def raw_spec(job: Job) -> dict:
    """The job's model, cluster and training as plain data (what ``candidates`` reads)."""
    return {
        "model": job.model.model_dump(),
        "cluster": job.cluster.model_dump(),
        "training": job.training.model_dump(),
    }


_NUMBERS = re.compile(r"\d+")


@lru_cache(maxsize=4096)
def reason(msg: str) -> str:
    """Group validator messages by their text with the numbers taken out (a search meets ~100 distinct messages
    ~2,000 times)."""
    return _NUMBERS.sub("n", msg).strip()


@dataclass(frozen=True)
class Base:
    """One parallel layout of the space (its layout axes' values) and the values of each grid axis."""

    layout: tuple[tuple[str, Any], ...]  # (field, value) of every layout axis, in AXES order
    axes: dict[str, list[Any]] = field(hash=False)  # grid axis -> its values under this layout
    asked_zero: frozenset[int] = frozenset()  # stages the user named (--fix zero, --zero 3): searched as asked

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.layout)

    @property
    def tp(self) -> int:
        return self.fields["tp"]

    @property
    def pp(self) -> int:
        return self.fields["pp"]

    @property
    def cp(self) -> int:
        return self.fields["cp"]

    @property
    def extra(self) -> dict[str, Any]:
        """Layout axes beyond tp, pp, cp, the MoE ones included (set on the base's jobs as they are)."""
        return {k: v for k, v in self.layout if k not in ("tp", "pp", "cp")}

    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.axes[k]) for k in GRID_AXES)


def bases(job: Job, space: Space) -> tuple[list[Base], Counter, dict[str, str]]:
    """The layouts of the space whose tp·pp·cp divides the GPU count, with their grid axes' values; skipped
    layouts counted by reason (with one full message per reason)."""
    raw = raw_spec(job)
    n = job.cluster.num_gpus
    out: list[Base] = []
    skipped: Counter = Counter()
    examples: dict[str, str] = {}
    _refuse_moe_axes(job, space)
    names = layout_axes(job)
    for values in itertools.product(*(space.values(job, k, {}, raw) for k in names)):
        fixed = dict(zip(names, values))
        tp, pp, cp = fixed["tp"], fixed["pp"], fixed["cp"]
        if n % (tp * pp * cp):
            msg = f"tp({tp}) * pp({pp}) * cp({cp}) = {tp * pp * cp} does not divide num_gpus({n})"
            skipped[reason(msg)] += 1
            examples.setdefault(reason(msg), msg)
            continue
        axes = {k: space.values(job, k, fixed, raw) for k in GRID_AXES}
        if any(not v for v in axes.values()):
            continue
        out.append(Base(tuple(fixed.items()), axes, space.asked("zero", job)))
    return out, skipped, examples


def _refuse_moe_axes(job: Job, space: Space) -> None:
    """An MoE axis asked of a dense model is named, not ignored."""
    if job.model.is_moe:
        return
    for name in MOE_AXES:
        if name in space.constraints or name in space.fix:
            raise SpecError(
                f"{AXIS[name].flag}: the model has no experts ({name} applies to MoE models); drop {AXIS[name].flag} "
                "or give the model num_experts, top_k and moe_ffn_hidden"
            )
