"""Predictions against published measurements (the CSV formats of shared/validation/README.md).

Training runs: predict tokens/s per GPU; empty plan cells are filled by the tool's own search
over that field (as the authors tuned them) and reported as ``chosen``. Collective sweeps:
predict busbw with the row's algorithm. One model for every row: no per-row constants.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commtax.collectives import collective_cost
from commtax.errors import SpecError, excerpt
from commtax.plans import best_plan
from commtax.spec import Cluster, build, load_catalog, read_text, resolve_cluster
from commtax.topology import placement
from commtax.units import GB, MiB

RUN_COLUMNS = ("id", "model_name", "layers", "hidden", "heads", "gpu", "num_gpus", "global_batch", "seq_len",
               "measured_tokens_per_s_per_gpu")
COLLECTIVE_COLUMNS = ("id", "op", "gpu", "num_gpus", "message_bytes", "measured_busbw_GBps")
PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "vp", "sequence_parallel", "zero", "recompute", "micro_batch")
# optional columns a measurement file may carry to state the software instead of leaving it to `generation`
SOFTWARE_COLUMNS = {"flash_attention": "flash_attention", "overlap_dp": "overlap.dp", "overlap_tp": "overlap.tp",
                    "overlap_pp": "overlap.pp"}
LARGE_MESSAGE_BYTES = 64 * MiB  # the collectives target applies to messages ≥ 64 MiB (bandwidth-bound)


@dataclass
class RowResult:
    id: str
    measured: float | None
    predicted: float | None
    error_pct: float | None
    chosen: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    kind: str  # "runs" | "collectives"
    rows: list[RowResult]
    mape_pct: float | None
    subsets: dict[str, float] = field(default_factory=dict)  # MAPE of named subsets

    def to_dict(self) -> dict[str, Any]:
        key_m = "measured_tokens_per_s_per_gpu" if self.kind == "runs" else "measured_busbw_GBps"
        key_p = "predicted_tokens_per_s_per_gpu" if self.kind == "runs" else "predicted_busbw_GBps"
        rows = []
        for r in self.rows:
            d = {"id": r.id, key_m: r.measured, key_p: r.predicted, "error_pct": r.error_pct, "chosen": r.chosen}
            if r.reason:
                d["reason"] = r.reason
            d.update(r.extra)
            rows.append(d)
        return {"kind": self.kind, "mape_pct": self.mape_pct, "subsets": self.subsets, "rows": rows}


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


def _cluster_raw(row: dict) -> dict:
    return {
        "gpu": row["gpu"],
        "num_gpus": _cell(row, "num_gpus"),
        "gpus_per_node": _cell(row, "gpus_per_node") or 8,
        "intra_node": row.get("intra_node") or "nvlink4",
        "inter_node": row.get("inter_node") or "ib-ndr",
        "nics_per_node": _cell(row, "nics_per_node") or 8,
    }


LEGACY_BEFORE_YEAR = 2023  # Megatron-LM gained flash attention and overlapped DP reduction in 2023 (core_r0.x)


def generation_of(row: dict) -> tuple[str, str]:
    """Software generation of a published run: a ``generation`` column, else the year its source cites first."""
    explicit = (row.get("generation") or "").strip()
    if explicit:
        return explicit, "generation column"
    m = re.search(r"\b(19|20)\d\d\b", row.get("source") or "")
    if m is None:
        return "current", "no year in source"
    year = int(m.group(0))
    gen = "legacy" if year < LEGACY_BEFORE_YEAR else "current"
    return gen, f"source year {year}"


def run_job_raw(row: dict, catalog: dict) -> tuple[dict, dict, list[str]]:
    """A CSV row -> (resolved job mapping without plan, fixed plan fields, free plan fields)."""
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
    fixed: dict[str, Any] = {"generation": generation_of(row)[0]}
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
    # optional software columns: stated, they replace what the generation rule would assume
    for col, plan_field in SOFTWARE_COLUMNS.items():
        v = _cell(row, col, _bool) if col in row else None
        if v is None:
            continue
        if plan_field.startswith("overlap."):
            fixed.setdefault("overlap", {})[plan_field.split(".", 1)[1]] = v
        else:
            fixed[plan_field] = v
    return raw, fixed, free


def predict_run(row: dict, catalog: dict) -> RowResult:
    rid = row.get("id", "?")
    measured = _cell(row, "measured_tokens_per_s_per_gpu", float)
    try:
        raw, fixed, free = run_job_raw(row, catalog)
        choice = best_plan(raw, fixed, [f for f in free if f != "dp"])
    except SpecError as e:
        return RowResult(rid, measured, None, None, reason=str(e))
    if choice is None:
        return RowResult(rid, measured, None, None, reason="no plan over the empty fields is valid and fits memory")
    pred = choice.breakdown.tokens_per_s_per_gpu
    b = choice.breakdown
    gen, why = generation_of(row)
    extra = {
        "mfu": round(b.mfu, 4),
        "comm_tax": round(b.comm_tax, 4),
        "step_time_s": round(b.step_time_s, 4),
        "generation": f"{gen} ({why})",
    }
    err = error_pct(pred, measured) if measured else None
    return RowResult(rid, measured, pred, err, chosen=choice.chosen, extra=extra)


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
    extra = {"message_bytes": size, "algorithm": cost.algorithm, "predicted_time_us": cost.time_s * 1e6}
    return RowResult(rid, measured, pred, error_pct(pred, measured) if measured else None, extra=extra)


def read_rows(path: Path | str) -> list[dict]:
    """Rows of a UTF-8 CSV (a BOM is fine); each id once."""
    text = read_text(path, "CSV file")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise SpecError(f"{path}: not a readable CSV ({e})") from None
    if not rows:
        raise SpecError(f"{path}: no rows")
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


def validate(path: Path | str, catalog_file: Path | str | None = None, progress=None) -> Report:
    rows = read_rows(path)
    kind = kind_of(rows, path)
    check_measured(rows, "measured_tokens_per_s_per_gpu" if kind == "runs" else "measured_busbw_GBps", path)
    catalog = load_catalog(catalog_file)
    predict = predict_run if kind == "runs" else predict_collective
    results = []
    for row in rows:
        results.append(predict(row, catalog))
        if progress is not None:
            progress()
    subsets: dict[str, float] = {}
    if kind == "collectives":
        large = [r for r in results if r.extra.get("message_bytes", 0) >= LARGE_MESSAGE_BYTES]
        if large:
            subsets["messages_ge_64MiB"] = mape(large)
    else:
        for prefix in sorted({r.id.split("_")[0] for r in results}):
            sub = mape([r for r in results if r.id.split("_")[0] == prefix])
            if sub is not None:
                subsets[prefix] = sub
    return Report(kind, results, mape(results), subsets)
