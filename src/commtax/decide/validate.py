"""Predictions against published measurements (the CSV formats of shared/validation/README.md).

Training runs: predict tokens/s per GPU. The training framework comes from a ``framework`` column, else
the deprecated ``generation`` column, else a sourced mapping from the row's source
(catalog/validation_sources.yaml), else - labelled as a fallback - the year its source cites. Empty plan
cells take the framework's usual default where it has one (reported as ``defaults``), else the tool's own
search over that field (as the authors tuned them, reported as ``chosen``). Collective sweeps: predict busbw
with the row's algorithm. One model for every row: no per-row constants; MAPE is reported per row, per
source and averaged over sources (each source weighs the same), and on the rows no constant was fitted on.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commtax.costs.collectives import collective_cost
from commtax.costs.topology import placement
from commtax.decide.plans import NO_CHOICE, Choice, PlanRow, best_plan, plan_space
from commtax.errors import SpecError, excerpt
from commtax.schedule.interval import job_regime, load_table
from commtax.spec import (
    CATALOG_DIR,
    GENERATION_ALIAS,
    Cluster,
    Job,
    build,
    frameworks,
    load_catalog,
    read_text,
    read_yaml,
    resolve_cluster,
)
from commtax.spec.assumptions import default_assumptions, using_assumptions, without_rows
from commtax.spec.pipeline_split import balanced_layout
from commtax.units import GB, MiB

RUN_COLUMNS = (
    "id",
    "model_name",
    "layers",
    "hidden",
    "heads",
    "gpu",
    "num_gpus",
    "global_batch",
    "seq_len",
    "measured_tokens_per_s_per_gpu",
)
COLLECTIVE_COLUMNS = ("id", "op", "gpu", "num_gpus", "message_bytes", "measured_busbw_GBps")
PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "vp", "sequence_parallel", "zero", "recompute", "micro_batch")
# MoE runs (public_moe_runs.csv): the expert layout and dispatcher; empty = the framework default
MOE_PLAN_COLUMNS = {"ep": "ep", "etp": "etp", "dispatcher": "moe_dispatcher"}
MOE_MODEL_COLUMNS = ("num_experts", "top_k", "moe_ffn_hidden", "shared_experts")
# optional columns a measurement file may carry to state the software instead of leaving it to `generation`
SOFTWARE_COLUMNS = {
    "flash_attention": "flash_attention",
    "overlap_dp": "overlap.dp",
    "overlap_tp": "overlap.tp",
    "overlap_pp": "overlap.pp",
}
# optional columns naming software choices (values as in the job file's plan section)
SOFTWARE_TEXT_COLUMNS = ("attention", "elementwise", "selective_policy", "fp8_recipe", "zero3_gather")
LARGE_MESSAGE_BYTES = 64 * MiB  # the collectives target applies to messages ≥ 64 MiB (bandwidth-bound)
# collectives MAPE is reported per message-size band: latency-bound, in between, bandwidth-bound
SIZE_BANDS = (
    ("messages_lt_1MiB", 0, MiB),
    ("messages_1MiB_to_64MiB", MiB, LARGE_MESSAGE_BYTES),
    ("messages_ge_64MiB", LARGE_MESSAGE_BYTES, float("inf")),
)


# ----------------------------------------------------------------------------- columns: known, not modelled
# Every column a file of each kind may carry that the predictor reads or that only describes the row. A column
# outside these sets is named in the report (never silently ignored); extend the sets as the model learns more.
DESCRIPTIVE_COLUMNS = {"source", "target_note", "note", "model"}
KNOWN_COLUMNS = {
    "runs": {
        *RUN_COLUMNS,
        *PLAN_COLUMNS,
        *SOFTWARE_COLUMNS,
        *SOFTWARE_TEXT_COLUMNS,
        *DESCRIPTIVE_COLUMNS,
        "kv_heads",
        "ffn_hidden",
        "vocab",
        "gated_mlp",
        "gpus_per_node",
        "intra_node",
        "inter_node",
        "nics_per_node",
        "precision",
        "framework",
        "generation",
        *MOE_PLAN_COLUMNS,  # MoE runs (public_moe_runs.csv): the moe branch models them
        *MOE_MODEL_COLUMNS,
        "moe_layers",
    },
    "collectives": {
        *COLLECTIVE_COLUMNS,
        *DESCRIPTIVE_COLUMNS,
        "gpus_per_node",
        "intra_node",
        "inter_node",
        "nics_per_node",
        "algorithm",
    },
}
# Columns whose non-empty value describes something the predictor does not model: such a row is refused with
# the reason, not scored as something else (as an MoE row was once scored as a dense model). column -> what it
# means. Empty now that MoE is modelled (its columns moved to KNOWN_COLUMNS); a future file's column that the
# model cannot honour goes here, e.g. {"pipeline_schedule_override": "a hand-written pipeline schedule"}.
UNMODELLED_COLUMNS: dict[str, str] = {}


def unknown_columns(columns: list[str] | set[str], kind: str) -> list[str]:
    """Columns of the file that the validator neither reads nor refuses rows by, in file order."""
    known = KNOWN_COLUMNS[kind] | set(UNMODELLED_COLUMNS)
    return [c for c in columns if c is not None and c not in known]


def unmodelled(row: dict) -> str | None:
    """Why the row cannot be predicted by this model (a set column it does not model), or None."""
    for col, meaning in UNMODELLED_COLUMNS.items():
        v = (row.get(col) or "").strip()
        if v and v.lower() not in ("0", "1", "none", "false"):  # 1 expert, ep 1: a dense run
            return f"{col}={excerpt(v)}: {meaning} is not modelled; refused rather than scored without it"
    return None


@dataclass
class RowResult:
    id: str
    measured: float | None
    predicted: float | None
    error_pct: float | None
    chosen: PlanRow = NO_CHOICE  # the plan fields the search chose (as the authors tuned them)
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # predicted hardware FLOP utilisation (model + recompute FLOPs) and the plan's recompute: what the search's
    # winner's-curse check compares a plan's hardware rate with (``decide.intervals.published_mfu``); not in to_dict
    hfu: float | None = None
    recompute: str | None = None


@dataclass
class Report:
    kind: str  # "runs" | "collectives"
    rows: list[RowResult]
    mape_pct: float | None
    subsets: dict[str, float] = field(default_factory=dict)  # MAPE of named subsets
    by_source: dict[str, float] = field(default_factory=dict)  # MAPE per source (runs)
    rows_by_source: dict[str, int] = field(default_factory=dict)
    source_avg_mape_pct: float | None = None  # mean of the per-source MAPEs: each source weighs the same
    unfitted_mape_pct: float | None = None  # rows no assumption was fitted on
    fitted: dict[str, list[str]] = field(default_factory=dict)  # assumption -> rows it was fitted on
    refused: list[str] = field(default_factory=list)  # rows without a prediction
    unknown_columns: list[str] = field(default_factory=list)  # columns in the file the validator does not read
    loso_mape_pct: float | None = None  # leave-one-source-out MAPE averaged by source (with --loso)
    loso_note: str = ""
    # share of predicted rows whose measurement lies in the 80% interval (fitted without the row's source)
    coverage_80: float | None = None

    def to_dict(self) -> dict[str, Any]:
        key_m = "measured_tokens_per_s_per_gpu" if self.kind == "runs" else "measured_busbw_GBps"
        key_p = "predicted_tokens_per_s_per_gpu" if self.kind == "runs" else "predicted_busbw_GBps"
        rows = []
        for r in self.rows:
            chosen = r.chosen.to_dict()
            d = {"id": r.id, key_m: r.measured, key_p: r.predicted, "error_pct": r.error_pct, "chosen": chosen}
            if r.reason:
                d["reason"] = r.reason
            d.update(r.extra)
            rows.append(d)
        out = {"kind": self.kind, "mape_pct": self.mape_pct, "subsets": self.subsets, "rows": rows}
        if self.unknown_columns:  # only when there is something to say: a clean file's JSON is unchanged
            out["unknown_columns"] = self.unknown_columns  # (a refused row's reason is its rows[].reason)
        if self.kind == "runs":
            out.update(
                {
                    "by_source": self.by_source,
                    "rows_by_source": self.rows_by_source,
                    "source_avg_mape_pct": self.source_avg_mape_pct,
                    "unfitted_mape_pct": self.unfitted_mape_pct,
                    "fitted": self.fitted,
                    "refused": self.refused,
                    "coverage_80": self.coverage_80,
                }
            )
            if self.loso_mape_pct is not None or self.loso_note:
                out.update({"loso_mape_pct": self.loso_mape_pct, "loso_note": self.loso_note})
        return out


def _bool(x: str) -> bool:
    v = x.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise SpecError(f"expected true/false, got {x!r}")


def _cell(row: dict, key: str, conv=int) -> Any:
    v = (row.get(key) or "").strip()
    if v == "":
        return None
    try:
        return conv(v)
    except ValueError:
        raise SpecError(f"column {key}: cannot read {excerpt(v)}") from None


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def mape(rows: list[RowResult]) -> float | None:
    errs = [abs(r.error_pct) for r in rows if r.error_pct is not None]
    return sum(errs) / len(errs) if errs else None


def nvlink_segment(num_gpus: int | None, domain: int) -> int:
    """GPUs of one NVLink domain a job spanning several domains uses: the domain itself when the job fills whole
    domains, else equal segments of the domain (the largest divisor of the job ≤ the domain). NVIDIA's GB200 NVL72
    Slurm guidance schedules jobs of 128+ GPUs in segments of 16 compute trays (64 of a rack's 72 GPUs; NVIDIA
    technical blog "Unlock exascale performance on GB200 NVL72 with Slurm topology-aware job scheduling")."""
    if num_gpus is None or num_gpus <= domain or num_gpus % domain == 0:
        return domain
    return max(d for d in range(1, domain + 1) if num_gpus % d == 0)


def _cluster_raw(row: dict) -> dict:
    n, domain = _cell(row, "num_gpus"), _cell(row, "gpus_per_node") or 8
    nics = _cell(row, "nics_per_node") or 8
    segment = nvlink_segment(n, domain)
    return {
        "gpu": row["gpu"],
        "num_gpus": n,
        "gpus_per_node": segment,
        "intra_node": row.get("intra_node") or "nvlink4",
        "inter_node": row.get("inter_node") or "ib-ndr",
        "nics_per_node": nics if segment == domain else max(1, nics * segment // domain),  # NICs go with the GPUs
    }


def _moe_cluster_raw(row: dict) -> dict:
    """The MoE rows' cluster: one NIC per GPU (DGX H100/B200/B300 and GB200/GB300 NVL72 alike: 8 ConnectX per 8
    GPUs, one per GPU in the rack) when the row gives none; a job that does not fill whole NVL72 racks (256 GPUs)
    runs on ⌈n/72⌉ racks of n/⌈n/72⌉ GPUs each (4 × 64), the largest even share that divides it."""
    c = _cluster_raw(row)
    if _cell(row, "nics_per_node") is None:
        c["nics_per_node"] = c["gpus_per_node"]
    n, g = c["num_gpus"], c["gpus_per_node"]
    if n and n > g and n % g:
        racks = -(-n // g)
        while n % racks:
            racks += 1
        c["gpus_per_node"] = c["nics_per_node"] = n // racks
    return c


def generation_of(row: dict) -> tuple[str, str]:
    """Fallback only: a software generation from a ``generation`` column, else the year the source cites first
    (before ``legacy_before_year`` in catalog/assumptions.yaml: legacy)."""
    explicit = (row.get("generation") or "").strip()
    if explicit:
        return explicit, "generation column"
    m = re.search(r"\b(19|20)\d\d\b", row.get("source") or "")
    if m is None:
        return "current", "no year in source"
    year = int(m.group(0))
    gen = "legacy" if year < default_assumptions().v("legacy_before_year") else "current"
    return gen, f"source year {year}"


def source_rules() -> list[dict]:
    return read_yaml(CATALOG_DIR / "validation_sources.yaml") or []


def framework_of_row(row: dict) -> tuple[str, str]:
    """(framework, how it was found) of a published run: column, deprecated generation column, the sourced
    mapping from its source, or the labelled year-rule fallback."""
    explicit = (row.get("framework") or "").strip()
    if explicit:
        if explicit not in frameworks():
            raise SpecError(f"column framework: unknown {explicit!r}; use one of {', '.join(frameworks())}")
        return explicit, "framework column"
    gen = (row.get("generation") or "").strip()
    if gen:
        if gen not in GENERATION_ALIAS:
            raise SpecError(f"column generation: expected {' or '.join(GENERATION_ALIAS)}, got {gen!r}")
        return GENERATION_ALIAS[gen], f"generation column ({gen}, deprecated)"
    src = row.get("source") or ""
    for rule in source_rules():
        when = rule.get("when") or {}
        if "framework" not in rule:  # a rule of plan facts only (source_plan)
            continue
        if rule["match"] in src and all((row.get(k) or "").strip() == str(v) for k, v in when.items()):
            return rule["framework"], f"source mapping ({rule['match']})"
    gen, why = generation_of(row)
    return GENERATION_ALIAS[gen], f"fallback year rule: {why} -> {gen}"


def source_min_vp(row: dict) -> int:
    """The fewest virtual stages a publication states its pipeline ran (rules with ``min_vp``: an interleaved
    schedule whose chunk count it does not give); 1 otherwise."""
    src = row.get("source") or ""
    return max([1] + [int(rule["min_vp"]) for rule in source_rules() if "min_vp" in rule and rule["match"] in src])


def source_plan(row: dict) -> dict:
    """Plan facts a published table states for all its rows (validation_sources.yaml rules with ``plan``)."""
    src = row.get("source") or ""
    out: dict[str, Any] = {}
    for rule in source_rules():
        when = rule.get("when") or {}
        applies = all((row.get(k) or "").strip() == str(v) for k, v in when.items())
        if "plan" in rule and rule["match"] in src and applies:
            if rule["plan"].get("recompute", "selective") != "selective":
                out.pop("recompute_modules", None)  # a later rule's recompute none/full: the modules no longer apply
            out.update(rule["plan"])
    if "recompute_modules" in out:
        out["recompute_modules"] = tuple(out["recompute_modules"])
    return out


def source_arch(row: dict) -> dict:
    """Architecture facts a publication states for the catalog model its rows ran (validation_sources.yaml rules
    with ``arch``, e.g. a framework's DeepSeek-V3 without the MTP module); every matching rule applies."""
    src = row.get("source") or ""
    out: dict[str, Any] = {}
    for rule in source_rules():
        applies = all((row.get(k) or "").strip() == str(v) for k, v in (rule.get("when") or {}).items())
        if "arch" in rule and rule["match"] in src and applies:
            out.update(rule["arch"])
    return out


def legacy_software(row: dict, framework: str) -> tuple[dict, str]:
    """(plan fields, why) of an older release of the row's framework (catalog/frameworks.yaml ``legacy``): for a
    ``generation: legacy`` row, or one whose source cites a year before the preset's ``before_year``."""
    legacy = frameworks()[framework].legacy
    if legacy is None:
        return {}, ""
    gen = (row.get("generation") or "").strip()
    if gen:
        return (dict(legacy.plan), "generation column: legacy") if gen == "legacy" else ({}, "")
    m = re.search(r"\b(19|20)\d\d\b", row.get("source") or "")
    if m and int(m.group(0)) < legacy.before_year:
        return dict(legacy.plan), f"source year {m.group(0)} < {legacy.before_year}"
    return {}, ""


def source_key(row_or_source: dict | str) -> str:
    """The publication a row comes from: its source text up to the first ';' (tables of one paper together)."""
    src = row_or_source if isinstance(row_or_source, str) else (row_or_source.get("source") or "")
    return src.split(";")[0].strip() or "(no source)"


def moe_layers_cell(v: str) -> dict:
    """``moe_layers``: all, alternate or first_k_dense=K -> the Model fields."""
    v = v.strip()
    if v in ("", "all"):
        return {"moe_layers": "all"} if v else {}
    if v == "alternate":
        return {"moe_layers": "alternate"}
    m = re.fullmatch(r"first_k_dense=(\d+)", v)
    if m is None:
        raise SpecError(f"column moe_layers: cannot read {excerpt(v)}; use all, alternate or first_k_dense=K")
    return {"moe_layers": "all", "first_k_dense": int(m.group(1))}


def moe_model_raw(row: dict, catalog: dict) -> dict:
    """An MoE row's model: the catalog entry its ``model`` column names (its published config), the row's MoE
    cells where given (they restate it); routing force-balanced (λ = 1), as the benchmark rows run."""
    name = (row.get("model") or "").strip()
    entries = catalog["model"]
    if name not in entries:
        raise SpecError(f"column model: unknown catalog model {excerpt(name)} (known: {', '.join(sorted(entries))})")
    model = {"name": name, **entries[name]}
    for col in MOE_MODEL_COLUMNS:
        v = _cell(row, col)
        if v is not None:
            model[col] = v
    model.update(moe_layers_cell(row.get("moe_layers") or ""))
    return model


def run_job_raw(row: dict, catalog: dict) -> tuple[dict, dict, list[str]]:
    """A CSV row -> (resolved job mapping without plan, fixed plan fields, free plan fields)."""
    if (row.get("model") or "").strip():
        return _moe_run_job_raw(row, catalog)
    model = {
        "name": row.get("model_name") or row["id"],
        "layers": _cell(row, "layers"),
        "hidden": _cell(row, "hidden"),
        "heads": _cell(row, "heads"),
        "kv_heads": _cell(row, "kv_heads"),
        "ffn_hidden": _cell(row, "ffn_hidden"),
        "vocab": _cell(row, "vocab"),
        "gated_mlp": _cell(row, "gated_mlp", _bool) or False,
        "source": row.get("source") or "validation row",
    }
    training = {
        "seq_len": _cell(row, "seq_len"),
        "global_batch": _cell(row, "global_batch"),
        "precision": (row.get("precision") or "bf16").strip(),
    }
    raw = {"model": model, "cluster": resolve_cluster(_cluster_raw(row), catalog), "training": training}
    fw = framework_of_row(row)[0]
    fixed: dict[str, Any] = {"framework": fw, **legacy_software(row, fw)[0], **source_plan(row)}
    free: list[str] = []
    for col in PLAN_COLUMNS:
        if col not in row:
            continue
        conv = _bool if col == "sequence_parallel" else (str if col == "recompute" else int)
        v = _cell(row, col, conv)
        if v is None:
            free.append(col)
        else:
            fixed[col] = v
    for col in SOFTWARE_TEXT_COLUMNS:
        v = (row.get(col) or "").strip()
        if v:
            fixed[col] = v
    # optional software columns: stated, they replace what the framework would assume
    for col, plan_field in SOFTWARE_COLUMNS.items():
        v = _cell(row, col, _bool) if col in row else None
        if v is None:
            continue
        if plan_field.startswith("overlap."):
            fixed.setdefault("overlap", {})[plan_field.split(".", 1)[1]] = v
        else:
            fixed[plan_field] = v
    return raw, fixed, free


def moe_recipes() -> dict:
    return read_yaml(CATALOG_DIR / "moe_recipes.yaml") or {}


def recipe_plan(row: dict, fixed: dict, rules: str = "rules") -> dict:
    """The MoE software of the published recipe a row ran (catalog/moe_recipes.yaml ``rules``: the dispatcher and
    its overlap; ``software``: recompute and the gradient dtype): the plan facts of ``recipe_rule``."""
    return dict(recipe_rule(row, fixed, rules).get("plan") or {})


def recipe_rule(row: dict, fixed: dict, rules: str = "rules") -> dict:
    """The first rule of catalog/moe_recipes.yaml ``rules`` (or ``software``) for the row's model, GPU and
    precision whose stated parallelism and dates match the row's, or {}."""
    model, gpu = (row.get("model") or "").strip(), (row.get("gpu") or "").strip()
    precision = (row.get("precision") or "bf16").strip()
    for rule in moe_recipes().get(rules, []):
        if rule["model"] != model or not gpu.startswith(rule.get("gpu", "")):
            continue
        if rule.get("precision", precision) != precision:
            continue
        if rule.get("since") and not release_at_least(row, rule["since"]):
            continue
        if rule.get("before") and not release_before(row, rule["before"]):
            continue
        if all(fixed.get(k, 1) == v for k, v in (rule.get("when") or {}).items()):
            return rule
    return {}


def recipe_fp8(row: dict) -> dict:
    """The fp8 scaling recipe of a Megatron-Bridge fp8 row (catalog/moe_recipes.yaml ``fp8_recipes``: the first rule
    whose GPU prefix and dates match), as plan facts, or {}."""
    if (row.get("precision") or "").strip() != "fp8":
        return {}
    gpu = (row.get("gpu") or "").strip()
    for rule in moe_recipes().get("fp8_recipes", []):
        if not gpu.startswith(rule["gpu"]):
            continue
        if rule.get("since") and not release_at_least(row, rule["since"]):
            continue
        return dict(rule["plan"])
    return {}


def recipe_layout(row: dict, stages: int) -> tuple[int, ...] | None:
    """Decoder layers per virtual stage that the row's model's recipes set by hand for ``stages`` = pp·vp virtual
    stages (catalog/moe_recipes.yaml ``layouts``), or None."""
    layout = (moe_recipes().get("layouts") or {}).get((row.get("model") or "").strip(), {}).get(stages)
    return tuple(layout) if layout is not None else None


def row_release(row: dict) -> tuple[int, ...] | None:
    """The NeMo container release a row was published under ('25.11 NeMo Container' in its source), as numbers."""
    m = re.search(r"(\d\d\.\d\d(?:\.\d\d)?) NeMo Container", row.get("source") or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def release_before(row: dict, until: str) -> bool:
    """Whether the row's release is older than ``until``; a row that names no release is not."""
    rel = row_release(row)
    return rel is not None and rel < tuple(int(x) for x in until.split("."))


def release_at_least(row: dict, since: str) -> bool:
    """Whether the row's release is ``since`` or later; a row that names no release is not."""
    rel = row_release(row)
    return rel is not None and rel >= tuple(int(x) for x in since.split("."))


def _moe_run_job_raw(row: dict, catalog: dict) -> tuple[dict, dict, list[str]]:
    """``run_job_raw`` for a row naming a catalog model (the MoE set): the model from the catalog, the expert
    columns into the plan; tp > 1 runs sequence-parallel (Megatron-Core requires it with MoE)."""
    dense = dict(row)
    dense.pop("model")
    raw, fixed, free = run_job_raw(dense, catalog)
    raw["model"] = {**moe_model_raw(row, catalog), **source_arch(row)}
    raw["cluster"] = resolve_cluster(_moe_cluster_raw(row), catalog)
    for col, field_ in MOE_PLAN_COLUMNS.items():
        v = (row.get(col) or "").strip()
        if v:
            fixed[field_] = _cell(row, col) if col != "dispatcher" else v
    layers, pp, vp = raw["model"]["layers"], fixed.get("pp", 1), fixed.get("vp", 1)
    # catalog/moe_recipes.yaml holds Megatron-Bridge's recipes: its layouts, dispatcher rules and software apply only
    # to a Megatron-Bridge benchmark row (a source naming its NeMo container release), never to another source's
    bridge = row_release(row) is not None
    layout = recipe_layout(row, pp * vp) if bridge and pp > 1 and "vp" not in free else None
    if layout is not None:  # the recipe's own --pipeline-model-parallel-layout (catalog/moe_recipes.yaml layouts)
        fixed["pipeline_layout"] = layout
    elif pp > 1 and vp > 1 and layers % vp and "pipeline_layout" not in fixed:  # a layout the source states stays
        # the recipe's --pipeline-model-parallel-layout is not in the row: the most even one (spec.balanced_layout)
        fixed["pipeline_layout"] = balanced_layout(layers, pp, vp)
    if "moe_dispatcher" not in fixed and bridge:
        fixed.update(recipe_plan(row, fixed))
    # the recipe's recompute, gradient dtype and interleaving where the row states none of its own
    rule = recipe_rule(row, fixed, "software") if bridge else {}
    # the run's architecture where the publication states it (the 25.11 tables' "DeepSeekV3 (w/o MTP)")
    raw["model"] = {**raw["model"], **(rule.get("arch") or {})}
    software = {k: v for k, v in (rule.get("plan") or {}).items() if k not in fixed}
    software.update({k: v for k, v in (recipe_fp8(row) if bridge else {}).items() if k not in fixed})
    if "recompute_modules" in software and software.get("recompute", fixed.get("recompute")) != "selective":
        software.pop("recompute_modules")  # the row's own recompute is not selective: the modules do not apply
    if "recompute_modules" in software:
        software["recompute_modules"] = tuple(software["recompute_modules"])
    fixed.update(software)
    free = [f for f in free if f not in software]
    if fixed.get("moe_a2a_overlap") and fixed.get("pp", 1) > 1 and fixed.get("vp", 1) == 1:
        fixed.pop("moe_a2a_overlap")  # the recipe overlaps with interleaving only (Megatron's rule)
    if fixed.get("tp", 1) > 1 and "sequence_parallel" not in fixed:
        fixed["sequence_parallel"] = True
        free = [f for f in free if f != "sequence_parallel"]
    return raw, fixed, free


def framework_defaults(fixed: dict, free: list[str]) -> tuple[dict, list[str], dict]:
    """Empty plan cells the framework has a usual default for: (fixed + those, still free, the defaults used)."""
    preset = frameworks()[fixed["framework"]].plan_defaults
    used = {f: preset[f] for f in free if f in preset}
    if used.get("sequence_parallel") and fixed.get("tp", 1) == 1 and "tp" not in free:
        used["sequence_parallel"] = False  # sequence parallelism is a TP feature
    return {**fixed, **used}, [f for f in free if f not in used], used


def no_plan_reason(raw: dict, fixed: dict, free: list[str]) -> str:
    """Why a row has no valid plan: the rule the first plan over its empty fields breaks (the job's own refusal,
    e.g. Megatron's recompute or overlap rules), so that a refused row names what to fix."""
    why = "no plan over the empty fields is valid"
    for plan in plan_space(raw, fixed, free):
        try:
            build(Job, {**raw, "plan": {k: v for k, v in plan.items() if v is not None}}, "")
        except SpecError as e:
            return f"{why}: {e}"
        break
    return why


@dataclass(frozen=True)
class RowPlan:
    """The plan a row is predicted with: the best over its empty cells, the framework's defaults first."""

    choice: Choice | None
    defaults: dict  # the framework defaults the choice kept ({} where the authors must have changed them)
    notes: list[str]
    raw: dict
    with_defaults: dict
    still_free: list[str]  # empty cells the defaults left open


def row_plan(row: dict, catalog: dict) -> RowPlan:
    """The plan ``predict_run`` prices a row with (benchmarks that explain a row's error read this same plan)."""
    raw, fixed, free = run_job_raw(row, catalog)
    with_defaults, still_free, defaults = framework_defaults(fixed, free)
    searchable = [f for f in free if f != "dp"]
    min_vp = source_min_vp(row)
    allow = (lambda plan: plan.get("vp", 1) >= min_vp) if min_vp > 1 else None
    choice = best_plan(raw, with_defaults, [f for f in still_free if f != "dp"], allow=allow)
    notes = []
    if choice is None and defaults:  # the framework's usual setting does not fit here: the authors changed it
        choice, defaults = best_plan(raw, fixed, searchable, allow=allow), {}
        notes.append("framework defaults do not fit memory: searched")
    if choice is None:  # the run did happen: predict its speed even if the memory model says it cannot fit
        choice = best_plan(raw, with_defaults, [f for f in still_free if f != "dp"], False, allow) or best_plan(
            raw, fixed, searchable, require_fit=False, allow=allow
        )
        notes.append("memory model says no plan fits; predicted anyway")
    return RowPlan(choice, defaults, notes, raw, with_defaults, still_free)


def predict_run(row: dict, catalog: dict) -> RowResult:
    rid = row.get("id", "?")
    measured = _cell(row, "measured_tokens_per_s_per_gpu", float)
    try:
        planned = row_plan(row, catalog)
        choice, defaults, notes = planned.choice, planned.defaults, planned.notes
        raw, with_defaults, still_free = planned.raw, planned.with_defaults, planned.still_free
        fw, why = framework_of_row(row)
        legacy, legacy_why = legacy_software(row, fw)
        if legacy:
            why += f"; before {frameworks()[fw].legacy.before_year} ({legacy_why}): " + ", ".join(
                f"{k}={v}" for k, v in legacy.items()
            )
    except SpecError as e:
        return RowResult(rid, measured, None, None, reason=str(e), extra={"source_key": source_key(row)})
    if choice is None:
        return RowResult(
            rid,
            measured,
            None,
            None,
            reason=no_plan_reason(raw, with_defaults, [f for f in still_free if f != "dp"]),
            extra={"source_key": source_key(row)},
        )
    pred = choice.breakdown.tokens_per_s_per_gpu
    b = choice.breakdown
    extra = {
        "mfu": round(b.mfu, 4),
        "regime": job_regime(choice.job),
        "gpu": choice.job.cluster.gpu.name,
        "precision": choice.job.training.precision,
        "comm_tax": round(b.comm_tax, 4),
        "step_time_s": round(b.step_time_s, 4),
        "framework": f"{fw} ({why})",
        "defaults": defaults,
        "source_key": source_key(row),
        "fits": choice.breakdown.fits,
    }
    if b.tokens_per_s_per_gpu_p10 is not None:
        extra["predicted_tokens_per_s_per_gpu_p10"] = b.tokens_per_s_per_gpu_p10
        extra["predicted_tokens_per_s_per_gpu_p90"] = b.tokens_per_s_per_gpu_p90
    if notes:
        extra["note"] = "; ".join(notes)
    err = error_pct(pred, measured) if measured else None
    hfu, recompute = round(b.hfu, 4), choice.job.plan.recompute
    return held_out_interval(
        RowResult(rid, measured, pred, err, chosen=choice.chosen, extra=extra, hfu=hfu, recompute=recompute)
    )


def predict_collective(row: dict, catalog: dict) -> RowResult:
    rid = row.get("id", "?")
    measured = _cell(row, "measured_busbw_GBps", float)
    try:
        cluster: Cluster = build(Cluster, resolve_cluster(_cluster_raw(row), catalog), "cluster")
        n = _cell(row, "num_gpus")
        size = _cell(row, "message_bytes", float)
        algo = (row.get("algorithm") or "").strip() or None
        cost = collective_cost(row["op"].strip(), size, placement(cluster, n, 1), algo)
    except (SpecError, ValueError) as e:
        return RowResult(rid, measured, None, None, reason=str(e))
    pred = cost.busbw_bytes_per_s / GB
    extra = {
        "message_bytes": size,
        "algorithm": cost.algorithm,
        "protocol": cost.protocol,
        "channels": cost.channels,
        "predicted_time_us": cost.time_s * 1e6,
    }
    return RowResult(rid, measured, pred, error_pct(pred, measured) if measured else None, extra=extra)


MAX_ROWS = 2_000  # the published files hold 54-162 rows; a row whose plan is blank costs a search


def read_rows(path: Path | str) -> list[dict]:
    """Rows of a UTF-8 CSV (a BOM is fine); each id once."""
    text = read_text(path, "CSV file")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise SpecError(f"{path}: not a readable CSV ({e})") from None
    if not rows:
        raise SpecError(f"{path}: no rows")
    if len(rows) > MAX_ROWS:
        raise SpecError(
            f"{path}: {len(rows):,} rows, over the limit of {MAX_ROWS:,} per file (rows with blank plan fields "
            "each run a search); split the file"
        )
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, 2):
        rid = (row.get("id") or "").strip()
        if rid and rid in seen:
            raise SpecError(f"{path}: id {excerpt(rid)} appears twice (lines {seen[rid]} and {line}); ids are unique")
        seen[rid] = line
    return rows


def check_measured(rows: list[dict], key: str, path: Path | str) -> None:
    """A measured cell is empty or a positive finite number: one nan would make the MAPE nan and every gate pass."""
    for line, row in enumerate(rows, 2):
        v = _cell(row, key, float)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise SpecError(f"{path}: line {line}, {key}: {v} is not a positive finite measurement")


def kind_of(rows: list[dict], path: Path | str) -> str:
    cols = set(rows[0])
    if set(RUN_COLUMNS) <= cols:
        return "runs"
    if set(COLLECTIVE_COLUMNS) <= cols:
        return "collectives"
    raise SpecError(
        f"{path}: not a runs CSV (needs {', '.join(RUN_COLUMNS)}) nor a collectives CSV "
        f"(needs {', '.join(COLLECTIVE_COLUMNS)})"
    )


def by_source(rows: list[RowResult]) -> tuple[dict[str, float], dict[str, int]]:
    groups: dict[str, list[RowResult]] = {}
    for r in rows:
        groups.setdefault(r.extra.get("source_key", "(no source)"), []).append(r)
    mapes = {k: mape(v) for k, v in groups.items()}
    return {k: v for k, v in mapes.items() if v is not None}, {k: len(v) for k, v in groups.items()}


def source_average(per_source: dict[str, float]) -> float | None:
    return sum(per_source.values()) / len(per_source) if per_source else None


def coverage(results: list[RowResult]) -> float | None:
    """Share of predicted rows whose measurement lies in their 80% interval (the shipped table)."""
    rows = [r for r in results if r.measured and "predicted_tokens_per_s_per_gpu_p10" in r.extra]
    hits = [
        r.extra["predicted_tokens_per_s_per_gpu_p10"] <= r.measured <= r.extra["predicted_tokens_per_s_per_gpu_p90"]
        for r in rows
    ]
    return sum(hits) / len(hits) if hits else None


def held_out_interval(result: RowResult) -> RowResult:
    """A row of a source the shipped interval table was fitted on gets the interval fitted without that source
    (``held_out`` in catalog/intervals.json): its coverage is then out of sample, as for any new run."""
    table = load_table()
    src = result.extra.get("source_key")
    if table is None or result.predicted is None or src not in table.held_out:
        return result
    lo, hi = table.held_out[src].log_bounds(result.extra["regime"])
    result.extra["predicted_tokens_per_s_per_gpu_p10"] = result.predicted * math.exp(lo)
    result.extra["predicted_tokens_per_s_per_gpu_p90"] = result.predicted * math.exp(hi)
    result.extra["interval"] = "fitted without this source"
    return result


def leave_one_source_out(report: Report, rows: list[dict], catalog: dict) -> tuple[float | None, str]:
    """Leave-one-source-out MAPE, averaged by source: each source predicted with the assumptions as they would
    be fitted without its rows (``assumptions.without_rows``: a constant fitted only on them falls back to its
    prior). Sources no constant was fitted on keep their own error.
    """
    base = default_assumptions()
    per_source: dict[str, float] = {}
    notes: list[str] = []
    by_key: dict[str, list[dict]] = {}
    for row in rows:
        by_key.setdefault(source_key(row), []).append(row)
    for key, group in by_key.items():
        ids = {row.get("id", "?") for row in group}
        refit_a, refit, kept = without_rows(base, ids)
        if kept:
            notes.append(f"{key}: {', '.join(kept)} fitted partly elsewhere, not refitted")
        if not refit:
            if key in report.by_source:
                per_source[key] = report.by_source[key]
            continue
        with using_assumptions(refit_a):
            results = [predict_run(row, catalog) for row in group]
        sub = mape(results)
        if sub is not None:
            per_source[key] = sub
            notes.append(f"{key} without its fit ({', '.join(refit)} at prior): {sub:.1f}%")
    if not notes:
        notes.append("no assumption is fitted: leaving a source out changes nothing")
    return source_average(per_source), "; ".join(notes)


def predict_file(path: Path | str, catalog: dict, progress=None) -> tuple[str, list[dict], list[RowResult]]:
    """(kind, CSV rows, one prediction per row) of one measurement file."""
    rows = read_rows(path)
    kind = kind_of(rows, path)
    check_measured(rows, "measured_tokens_per_s_per_gpu" if kind == "runs" else "measured_busbw_GBps", path)
    predict = predict_run if kind == "runs" else predict_collective
    results = []
    for row in rows:
        why = unmodelled(row)
        if why is None:
            results.append(predict(row, catalog))
        else:
            measured = _cell(row, "measured_tokens_per_s_per_gpu" if kind == "runs" else "measured_busbw_GBps", float)
            results.append(RowResult((row.get("id") or "?").strip(), measured, None, None, reason=why))
        if progress is not None:
            progress()
    return kind, rows, results


def summarise(kind: str, rows: list[dict], results: list[RowResult], catalog: dict, loso: bool = False) -> Report:
    """The Report of predicted rows: MAPE per subset and per source, what was fitted, refused rows, the 80%
    interval's coverage (runs) and, with ``loso``, the leave-one-source-out figures."""
    subsets: dict[str, float] = {}
    if kind == "collectives":
        for name, lo, hi in SIZE_BANDS:
            band = mape([r for r in results if lo <= r.extra.get("message_bytes", -1) < hi])
            if band is not None:
                subsets[name] = band
    else:
        for prefix in sorted({r.id.split("_")[0] for r in results}):
            sub = mape([r for r in results if r.id.split("_")[0] == prefix])
            if sub is not None:
                subsets[prefix] = sub
    report = Report(kind, results, mape(results), subsets)
    report.unknown_columns = unknown_columns(list(rows[0]), kind)
    report.refused = [r.id for r in results if r.predicted is None]
    if kind == "runs":
        report.by_source, report.rows_by_source = by_source(results)
        report.source_avg_mape_pct = source_average(report.by_source)
        report.fitted = {k: list(v) for k, v in default_assumptions().fitted().items()}
        fitted_rows = {i for ids in report.fitted.values() for i in ids}
        report.unfitted_mape_pct = mape([r for r in results if r.id not in fitted_rows])
        report.refused = [r.id for r in results if r.predicted is None]
        report.coverage_80 = coverage(results)
        if loso:
            report.loso_mape_pct, report.loso_note = leave_one_source_out(report, rows, catalog)
    return report


def validate(path: Path | str, catalog_file: Path | str | None = None, progress=None, loso: bool = False) -> Report:
    catalog = load_catalog(catalog_file)
    kind, rows, results = predict_file(path, catalog, progress)
    return summarise(kind, rows, results, catalog, loso)


@dataclass
class MultiReport:
    """Several measurement files: each file's Report, and the runs files' rows together (``union``)."""

    files: dict[str, Report]
    union: Report | None  # every runs row of every file, by source; None unless two or more runs files

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": {name: r.to_dict() for name, r in self.files.items()},
            "union": self.union.to_dict() if self.union is not None else None,
        }


def validate_files(
    paths: list[Path | str], catalog_file: Path | str | None = None, progress=None, loso: bool = False
) -> MultiReport:
    """Each file predicted and reported, and the runs files' rows together (each source weighs the same there
    too); a row id may appear in one file only, since the union reports rows by id."""
    catalog = load_catalog(catalog_file)
    files: dict[str, Report] = {}
    all_rows: list[dict] = []
    all_results: list[RowResult] = []
    first_seen: dict[str, str] = {}
    runs_files = 0
    for path in paths:
        name = str(path)
        if name in files:
            raise SpecError(f"{name}: given twice; name each file once")
        kind, rows, results = predict_file(path, catalog, progress)
        files[name] = summarise(kind, rows, results, catalog, loso)
        if kind != "runs":
            continue
        runs_files += 1
        for result in results:
            if result.id in first_seen:
                raise SpecError(
                    f"{name}: id {excerpt(result.id)} is also in {first_seen[result.id]}; ids are unique across files"
                )
            first_seen[result.id] = name
        all_rows += rows
        all_results += results
    union = summarise("runs", all_rows, all_results, catalog, loso) if runs_files > 1 else None
    return MultiReport(files, union)


def validation_record(multi: MultiReport) -> dict[str, Any]:
    """``validate --json``: one file's report as it is; several files' reports and their union."""
    reports = list(multi.files.values())
    return reports[0].to_dict() if len(reports) == 1 else multi.to_dict()


def max_mape_failure(multi: MultiReport, max_mape: float | None) -> str | None:
    """``validate --max-mape PCT``: why the first file above the limit fails it (None: every file passes)."""
    if max_mape is None:
        return None
    for name, report in multi.files.items():
        where = f"{name}: " if len(multi.files) > 1 else ""
        if report.mape_pct is None:
            return f"{where}no row could be predicted, so --max-mape {max_mape:g}% cannot pass"
        if not report.mape_pct <= max_mape:
            return f"{where}MAPE {report.mape_pct:.1f}% is above --max-mape {max_mape:g}%"
    return None
