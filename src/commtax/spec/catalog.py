"""The built-in catalog, user overrides, name resolution and job loading: one clear error per bad field."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from commtax.errors import SpecError, excerpt
from commtax.spec.base import CATALOG_DIR, replaced, replaced_with, unvalidated
from commtax.spec.files import read_catalog_yaml, read_yaml
from commtax.spec.job import JOB_CHECKS, Job, _eager_attention
from commtax.spec.plan import Plan

# ----------------------------------------------------------------------------- catalog
CATALOG_FILES = {"gpu": "gpus.yaml", "intra_node": "links.yaml", "inter_node": "networks.yaml", "model": "models.yaml"}
FABRIC_FILE = "fabrics.yaml"  # cluster.fabric presets: a catalog section of their own (docs/fabric.md)


@lru_cache(maxsize=1)
def _builtin_catalog() -> dict[str, dict[str, dict]]:
    return {kind: read_catalog_yaml(CATALOG_DIR / f) or {} for kind, f in CATALOG_FILES.items()}


def read_overrides(
    path: Path | str, sections: Iterable[str], required: tuple[str, ...] = ("source",), kind: str = "catalog"
) -> dict[str, dict[str, dict]]:
    """A user file adding or overriding entries: {section: {name: {field: value}}}, each entry sourced."""
    sections = tuple(sections)
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a {kind} file is a mapping with sections {', '.join(sections)}")
    out: dict[str, dict[str, dict]] = {}
    for section, entries in data.items():
        if section not in sections:
            raise SpecError(f"{path}: unknown {kind} section {section!r}; use one of {', '.join(sections)}")
        if not isinstance(entries, dict):
            raise SpecError(f"{path}: {section}: expected a mapping of entries")
        for name, entry in entries.items():
            if not isinstance(entry, dict):
                raise SpecError(f"{path}: {section}.{name}: expected a mapping of fields")
            missing = [f for f in required if f not in entry]
            if missing:
                raise SpecError(
                    f"{path}: {section}.{name}: missing field {missing[0]!r} "
                    f"(every {kind} entry needs {' and '.join(required)})"
                )
            out.setdefault(section, {})[name] = dict(entry)
    return out


@lru_cache(maxsize=1)
def builtin_fabrics() -> dict[str, dict]:
    return read_catalog_yaml(CATALOG_DIR / FABRIC_FILE) or {}


def load_catalog(extra: Path | str | None = None) -> dict[str, dict[str, dict]]:
    """Built-in catalog, plus/overridden by a user file with sections gpu/intra_node/inter_node/model/fabric."""
    cat = {k: dict(v) for k, v in _builtin_catalog().items()}
    cat["fabric"] = dict(builtin_fabrics())
    if extra is not None:
        for section, entries in read_overrides(extra, (*CATALOG_FILES, "fabric")).items():
            cat[section].update(entries)
    return cat


def resolve_entry(kind: str, value: Any, catalog: dict, field: str) -> dict:
    """A catalog id -> its mapping (with name); a mapping passes through."""
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, str):
        hint = (
            "; GPUs of several kinds are pools: give cluster.pools, a list of {gpu, num_gpus, …}"
            if (isinstance(value, list) and field.endswith(".gpu"))
            else ""
        )
        raise SpecError(f"{field}: expected a catalog id or a mapping, got {excerpt(value)}{hint}")
    entries = catalog[kind]
    if value not in entries:
        import difflib  # an unknown id only

        close = difflib.get_close_matches(value, entries.keys(), n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SpecError(f"{field}: unknown {kind} {excerpt(value)}{hint} (known: {', '.join(sorted(entries))})")
    return {"name": value, **entries[value]}


# plan fields the Plan validates one by one (their type and bounds: no Plan-level validator reads them), so that a
# validated job with other values of them needs only the Job's cross-field check (``plan_variant``)
VARIANT_FIELDS = frozenset({"vp", "micro_batch", "sequence_parallel"})


def plan_variant(valid: Job, **changes: Any) -> Job:
    """``job_with(valid, **changes)`` for changes of ``VARIANT_FIELDS``, without validating the model, cluster,
    training and the plan's other fields again (a search validates ~10^4 variants of a job): each value is checked
    by the Plan's own field type (``_plan_accepts``; a value it refuses goes through ``job_with``), the changed plan
    by the Job's validator, whose refusal is worded as ``job_with`` words it."""
    assert changes.keys() <= VARIANT_FIELDS, changes
    if not all(_plan_accepts(k, type(v), v) for k, v in changes.items()):
        return job_with(valid, **changes)
    variant = replaced(valid, plan=replaced(valid.plan, **changes))  # Job.model_construct's job, without its path
    try:
        return variant._consistent()  # the Job's model validator: it returns the job (attention set to eager where due)
    except ValueError as e:  # SpecError included: pydantic words a Job validator's refusal "plan: <it>"
        raise SpecError(f"plan: {e}") from None  # (_format_validation_error; tests/test_plan_variant.py)
    except AssertionError:
        return job_with(valid, **changes)  # a programmer's check: as the full validation reports it


def plan_variants(
    valid: Job, axes: dict[str, Sequence[Any]], checked: bool = True, build: bool = True
) -> Iterator[tuple[tuple[int, ...], Job | str | None]]:
    """``plan_variant(valid, **combination)`` of every combination of the values of ``axes`` (fields of
    ``VARIANT_FIELDS``), by position in ``itertools.product`` order: (the values' indices, the job, or the refusal
    as ``job_with`` words it). Each of the Job's checks (``JOB_CHECKS``) runs once per combination of the values of
    the axes it reads, a combination's verdict the first check that refuses it, in the validator's order (a search
    validates ~10^4 variants of ~200 layouts). ``checked``: ``valid`` passed the checks (a validated job), so those
    that read no axis are not run again; ``checked=False``: ``valid`` is a ``job_unchecked`` and they run once. A
    value the Plan's field refuses sends every combination through ``plan_variant``. ``build=False``: a combination
    the checks pass whose job was not built to run them yields None, its job ``plan_variant_of(valid, axes, idx)``
    (a search reads a few of ~10^4)."""
    names = tuple(axes)
    assert set(names) <= VARIANT_FIELDS, names
    index = list(itertools.product(*(range(len(axes[k])) for k in names)))
    if not all(_plan_accepts(k, type(v), v) for k in names for v in axes[k]):
        for idx in index:
            try:
                yield idx, plan_variant(valid, **{k: axes[k][i] for k, i in zip(names, idx)})
            except SpecError as e:
                yield idx, str(e)
        return
    # the checks that read an axis, by the axes they read: each set's verdict (the indices of its axes -> the
    # validator position of its first refusing check and that refusal) is filled once per value. A combination's
    # verdict is the first refusal in the validator's order: the sets are walked by their first check's position,
    # each read (and its checks run) only where no earlier refusal was met, as walking the checks one by one reads it
    layout, lead = _check_sets(names, checked)
    tables = [(places[0], get, runs, places, {}) for get, runs, places in layout]
    head, rest = tables[:lead], tables[lead:]
    led = (_PASSED, None)
    make = _variants(valid, names, axes)
    for idx in index:
        variant = None
        if names and idx[-1]:  # the head's verdict of this combination's other values, walked at their first
            (first_refused, refusal), walks = led, (rest,)
        else:
            first_refused, refusal, walks = _PASSED, None, (head, rest)
        for walk in walks:
            for first_place, get, runs, places, seen in walk:  # in the order of their first check (dicts keep it)
                if first_place >= first_refused:
                    break
                key = get(idx)
                verdict = seen.get(key)
                if verdict is None:
                    if variant is None:
                        variant = make(idx)
                    verdict = seen[key] = _first_refusal(runs, places, variant)
                if verdict[0] < first_refused:
                    first_refused, refusal = verdict
            if walk is head:
                led = first_refused, refusal
        if refusal is _PROGRAMMER:
            try:
                yield idx, plan_variant(valid, **{k: axes[k][i] for k, i in zip(names, idx)})
            except SpecError as e:
                yield idx, str(e)
        elif refusal is not None:
            yield idx, refusal
        elif variant is not None:
            yield idx, _eager_attention(variant)
        else:
            yield idx, _eager_attention(make(idx)) if build else None


@lru_cache(maxsize=64)
def _check_sets(names: tuple[str, ...], checked: bool) -> tuple[tuple[tuple[Callable, tuple, tuple], ...], int]:
    """``plan_variants``' check sets for axes ``names``, in the order of their first check: (the key of a combination's
    values that the set reads, its checks, their validator positions) each; and how many lead, reading no last axis
    (the same for every search of the same axes: built once)."""
    sets: dict[tuple[int, ...], tuple[list[Callable[[Job], None]], list[int]]] = {}  # axes -> its checks, positions
    for check in JOB_CHECKS:
        at = tuple(a for a, k in enumerate(names) if k in check.reads)
        if at or not checked:
            runs, places = sets.setdefault(at, ([], []))
            places.append(sum(len(r) for r, _ in sets.values()))
            runs.append(check.run)
    layout = tuple(
        (operator.itemgetter(*at) if at else _nothing, tuple(runs), tuple(places))
        for at, (runs, places) in sets.items()
    )
    # the leading sets that do not read the last axis give every combination of the other axes' values one verdict:
    # walked at its first combination (the last axis' first value, in product order), that walk's outcome kept for
    # the others (there each of those sets' verdicts is already filled, so the walk would read them again only)
    lead = len(layout)
    if names:
        last_axis = len(names) - 1
        lead = next((x for x, at in enumerate(sets) if last_axis in at), len(layout))
    return layout, lead


def plan_variant_of(valid: Job, axes: dict[str, Sequence[Any]], idx: tuple[int, ...]) -> Job:
    """The job ``plan_variants(valid, axes)`` yields for the combination ``idx`` that its checks pass."""
    return _eager_attention(_variant(valid, tuple(axes), idx, axes))


def _nothing(idx: tuple[int, ...]) -> tuple[()]:
    """The key of the checks that read no axis: one verdict for every combination."""
    return ()


def _variant(valid: Job, names: tuple[str, ...], idx: tuple[int, ...], axes: dict[str, Sequence[Any]]) -> Job:
    """One combination of ``plan_variants``: ``valid`` with those values of the axes, not validated."""
    plan = replaced_with(valid.plan, {k: axes[k][i] for k, i in zip(names, idx)})
    return replaced_with(valid, {"plan": plan})


def _variants(valid: Job, names: tuple[str, ...], axes: dict[str, Sequence[Any]]) -> Callable[[tuple[int, ...]], Job]:
    """``_variant(valid, names, idx, axes)`` as a function of ``idx``: the same copies (``spec.replaced_with``'s, to
    the fields set's order), what they read of ``valid`` and ``axes`` read once (``plan_variants`` builds ~5,000
    variants of ~200 jobs a search)."""
    plan = valid.plan
    if any(x is not None for m in (valid, plan) for x in (m.__pydantic_extra__, m.__pydantic_private__)):
        return lambda idx: _variant(valid, names, idx, axes)
    job_cls, job_values, job_set = type(valid), valid.__dict__, valid.__pydantic_fields_set__
    plan_cls, plan_values, plan_set = type(plan), plan.__dict__, plan.__pydantic_fields_set__
    columns = tuple(zip(names, (axes[k] for k in names)))

    def make(idx: tuple[int, ...]) -> Job:
        values = plan_values.copy()
        for (k, column), i in zip(columns, idx):
            values[k] = column[i]
        fields_set = plan_set.copy()
        fields_set.update(names)
        job = job_values.copy()
        job["plan"] = unvalidated(plan_cls, values, fields_set)
        fields_set = job_set.copy()
        fields_set.add("plan")
        return unvalidated(job_cls, job, fields_set)

    return make


_UNSEEN = object()
_PROGRAMMER = "a programmer's check failed"  # ``_first_refusal`` of an AssertionError: the full validation reports it


_PASSED = 1 << 30  # ``plan_variants``: the position of "no check refuses"


def _first_refusal(runs: Sequence[Callable[[Job], None]], places: Sequence[int], job: Job) -> tuple[int, str | None]:
    """A set's checks run on ``job`` in turn, as the validator runs them, up to the first that refuses: (its
    validator position, its refusal as ``job_with`` words it: ``plan_variant``); (``_PASSED``, None) where all pass."""
    for place, run in zip(places, runs):
        try:
            run(job)
        except ValueError as e:  # SpecError included: pydantic words a Job validator's refusal "plan: <it>"
            return place, f"plan: {e}"
        except AssertionError:
            return place, _PROGRAMMER
    return _PASSED, None


@lru_cache(maxsize=1024)
def _plan_accepts(name: str, kind: type, value: Any) -> bool:
    """Whether the Plan's field ``name`` takes ``value`` as it is (keyed by type too: True == 1, but a bool is no
    micro-batch size)."""
    try:
        got = getattr(Plan.model_validate({name: value}), name)
    except ValidationError:
        return False
    return type(got) is kind and got == value


def _format_validation_error(e: ValidationError, prefix: str = "") -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    field = ".".join(p for p in (prefix, loc) if p)
    msg = err["msg"].removeprefix("Value error, ")
    extra = (
        f" (got {excerpt(err['input'])})"
        if err["type"] not in ("value_error", "missing") and not isinstance(err.get("input"), dict)
        else ""
    )
    return f"{field or 'plan'}: {msg}{extra}"  # cross-field checks of a Job are about the plan


def build(model_cls: type[BaseModel], data: Any, field: str) -> Any:
    """Construct a spec model, turning pydantic's report into one SpecError line naming the field."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise SpecError(_format_validation_error(e, field)) from None


def resolve_cluster(raw: Any, catalog: dict, base_dir: Path | None = None, field: str = "cluster") -> dict:
    """Cluster section: a mapping or a path to a cluster YAML; ids resolved; profile file loaded."""
    if isinstance(raw, str):
        path = _relative_to(Path(raw), base_dir)
        data = read_yaml(path)
        if isinstance(data, dict) and "cluster" in data:
            data = data["cluster"]
        base_dir = path.parent
        raw = data
    if not isinstance(raw, dict):
        raise SpecError(f"{field}: expected a mapping or the path of a cluster YAML file")
    out = dict(raw)
    if out.get("pools") is not None:  # a dumped single-pool cluster carries pools: None
        out["pools"] = resolve_pools(out["pools"], catalog, f"{field}.pools")
        return out
    for key in ("gpu", "intra_node", "inter_node"):
        if key not in out:
            raise SpecError(f"{field}.{key}: missing (a catalog id or a mapping of numbers)")
        out[key] = resolve_entry(key, out[key], catalog, f"{field}.{key}")
    if out.get("fabric") is not None:
        out["fabric"] = resolve_fabric(out["fabric"], catalog, f"{field}.fabric")
        co = out["fabric"].get("colocated")
        if isinstance(co, list):
            first = _nodes_of(out, out["fabric"])
            resolved = []
            for i, entry in enumerate(co):
                resolved.append(_colocated(entry, base_dir, first, f"{field}.fabric.colocated.{i}"))
                if isinstance(entry, dict) and "job" in entry and not entry.get("nodes"):
                    first += len({n for ring in resolved[-1]["rings"] for n in ring})
            out["fabric"]["colocated"] = resolved
    if isinstance(out.get("profile"), str):
        p = _relative_to(Path(out["profile"]), base_dir)
        out["profile"] = read_yaml(p)
        if not isinstance(out["profile"], dict):  # never echo the file: `profile:` can name any file
            raise SpecError(
                f"{field}.profile: {p} is not a hardware profile (a mapping with source and levels, "
                "written by `commtax calibrate`)"
            )
    return out


def resolve_fabric(value: Any, catalog: dict, field: str) -> dict:
    """A fabric preset id, or a mapping; ``preset: id`` in a mapping starts from that preset, the mapping's own
    fields (a placement, background load) replacing the preset's."""
    if isinstance(value, dict) and "preset" in value:
        own = {k: v for k, v in value.items() if k != "preset"}
        base = resolve_entry("fabric", value["preset"], catalog, f"{field}.preset")
        return {**base, **own}
    return resolve_entry("fabric", value, catalog, field)


def _nodes_of(cluster: dict, fabric: dict) -> int:
    """The first fabric node after ours (where a co-located job lands unless it lists its nodes)."""
    placed = fabric.get("placement")
    if isinstance(placed, list) and placed and all(isinstance(x, int) for x in placed):
        return max(placed) + 1
    try:
        return max(1, -(-int(cluster["num_gpus"]) // int(cluster.get("gpus_per_node", 8))))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 1  # the cluster's own validation names what is wrong


def _colocated(entry: Any, base_dir: Path | None, first_node: int, field: str) -> Any:
    """``{job: FILE, nodes: [...]}`` -> the other job's DP rings on the fabric (``FabricJob``); Megatron's rank
    order (tp fastest, then cp, dp, pp), as commtax.costs.topology lays out our own groups."""
    if not isinstance(entry, dict) or "job" not in entry:
        return entry  # the resolved form, validated as a FabricJob
    unknown = set(entry) - {"job", "nodes"}
    if unknown:
        raise SpecError(f"{field}: unknown field(s) {', '.join(sorted(unknown))}; use job and nodes")
    if not isinstance(entry["job"], str):
        raise SpecError(f"{field}.job: expected the path of a job file")
    path = _relative_to(Path(entry["job"]), base_dir)
    other = load_job(path)
    oc = other.cluster
    if oc.fabric is not None and oc.fabric.colocated:
        raise SpecError(f"{field}.job: {path} has co-located jobs of its own; list every job in one fabric")
    G, N = oc.gpus_per_node, oc.nodes
    nodes = entry.get("nodes") or list(range(first_node, first_node + N))
    if not isinstance(nodes, list) or len(nodes) != N or not all(isinstance(x, int) and x >= 0 for x in nodes):
        raise SpecError(f"{field}.nodes: {path} runs on {N} nodes; list {N} fabric node ids (or leave nodes out)")
    n, stride = other.dp * other.plan.cp, other.plan.tp  # its gradient groups: DP × CP ranks, tp apart
    block = n * stride
    rings = [
        [nodes[(b * block + t + j * stride) // G] for j in range(n)]
        for b in range(max(1, oc.num_gpus // block))
        for t in range(stride)
    ]
    per_node = 1 if stride >= G else max(1, min(n, G // stride))
    share_Gbps = oc.nics_per_node * oc.inter_node.bw_Gbps * oc.inter_node.efficiency / G  # a GPU's NIC share
    return {"name": path.stem, "rings": rings, "rate_Gbps": per_node * share_Gbps}


def resolve_pools(raw: Any, catalog: dict, field: str) -> list[dict]:
    """``cluster.pools``: a list of pools, each naming its gpu, intra_node and inter_node (catalog ids or numbers)."""
    if not isinstance(raw, list) or not raw:
        raise SpecError(
            f"{field}: expected a list of pools, each {{gpu, num_gpus, gpus_per_node, intra_node, "
            f"inter_node, nics_per_node}}, got {excerpt(raw)}"
        )
    out = []
    for i, pool in enumerate(raw):
        if not isinstance(pool, dict):
            raise SpecError(f"{field}.{i}: expected a mapping {{gpu, num_gpus, …}}, got {excerpt(pool)}")
        pool = dict(pool)
        for key in ("gpu", "intra_node", "inter_node"):
            if key not in pool:
                raise SpecError(f"{field}.{i}.{key}: missing (a catalog id or a mapping of numbers)")
            pool[key] = resolve_entry(key, pool[key], catalog, f"{field}.{i}.{key}")
        out.append(pool)
    return out


def _relative_to(path: Path, base_dir: Path | None) -> Path:
    """A relative path in a file is relative to that file's folder (as an include is), not to the current folder."""
    return base_dir / path if base_dir is not None and not path.is_absolute() else path


def load_job(source: Path | str | dict, catalog_file: Path | str | None = None) -> Job:
    """A job file (or mapping) -> a validated Job. Bad input raises one SpecError naming the field."""
    catalog = load_catalog(catalog_file)
    base_dir = None
    if isinstance(source, (str, Path)):
        base_dir = Path(source).parent
        data = read_yaml(Path(source))
    else:
        data = source
    if not isinstance(data, dict):
        raise SpecError("job: expected a mapping with model, cluster, plan, training")
    unknown = set(data) - {"model", "cluster", "plan", "training"}
    if unknown:
        raise SpecError(f"job: unknown section(s) {', '.join(sorted(unknown))}; use model, cluster, plan, training")
    for key in ("model", "cluster", "training"):
        if key not in data:
            raise SpecError(f"{key}: missing section")
    resolved = {
        "model": resolve_entry("model", data["model"], catalog, "model"),
        "cluster": resolve_cluster(data["cluster"], catalog, base_dir),
        "plan": data.get("plan") or {},
        "training": data["training"],
    }
    for key in ("plan", "training"):
        if not isinstance(resolved[key], dict):
            raise SpecError(f"{key}: expected a mapping")
    return build(Job, resolved, "")


def job_with(job: Job, **plan_changes: Any) -> Job:
    """The same job with some plan fields changed, validated again (used by search and advice)."""
    # the plan's fields as data, validated with the job in one pass: the search's hot path (Plan.replace validates
    # the plan on its own first, a fifth slower here)
    plan = _plan_data(job, plan_changes)
    return build(Job, {"model": job.model, "cluster": job.cluster, "plan": plan, "training": job.training}, "")


def _plan_data(job: Job, plan_changes: dict[str, Any]) -> dict[str, Any]:
    """The plan ``job_with`` validates: the job's plan fields with the changes."""
    plan = {**job.plan.model_dump(), **plan_changes}
    if plan_changes.get("recompute", "selective") != "selective" and "recompute_modules" not in plan_changes:
        plan["recompute_modules"] = None  # the modules are selective recompute's: none or full recompute drops them
    return plan


def job_unchecked(job: Job, **plan_changes: Any) -> Job | None:
    """``job_with(job, **plan_changes)`` before the Job's cross-field checks (``JOB_CHECKS``): its plan validated as
    ``job_with`` validates it, the checks left to ``plan_variants(..., checked=False)``; None where the plan itself
    is refused (``job_with`` words that refusal). The model, cluster and training are the job's, as ``job_with``
    keeps them."""
    try:
        plan = Plan.model_validate(_plan_data(job, plan_changes))
    except ValidationError:
        return None
    return replaced(job, plan=plan)
