"""The 80% interval of a prediction, read from the shipped residual table (catalog/intervals.json).

The table holds, per regime value (framework, GPU architecture, scale, precision), the 10th and 90th percentiles
of ln(measured / predicted throughput) over the published validation runs; ``commtax.decide.intervals`` fits and
regenerates it from the validation CSVs. A job's interval averages its four regime values' percentiles (each
shrunk toward the pooled ones by its row count), widened about their middle by the table's ``width``, which was
chosen so that, fitted with each source left out, the interval covers 80% of that source's rows. The estimate
reads only the shipped file (a user's clone has no validation data).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from commtax.spec import CATALOG_DIR, Job

# JSON, not YAML: every estimate reads it, and json parses it in ~1 ms where PyYAML takes ~60 ms
INTERVALS_FILE = CATALOG_DIR / "intervals.json"
REGIME_KEYS = ("framework", "gpu_arch", "scale", "precision")
# scale bands by GPU count: one NVLink domain or a few nodes, a cluster of up to ~1K GPUs, beyond
SCALE_BANDS = ((64, "le64"), (1024, "le1024"), (math.inf, "gt1024"))


@dataclass(frozen=True)
class Quantiles:
    q10: float  # ln(measured / predicted) of throughput, 10th percentile
    q90: float
    rows: int


@dataclass(frozen=True)
class IntervalTable:
    pooled: Quantiles
    regimes: dict[str, dict[str, Quantiles]]  # regime key -> value -> quantiles
    width: float
    shrink_rows: float
    # per validation source: the table fitted without that source's rows (validate reports those rows' intervals
    # from it, so that their coverage is out of sample)
    held_out: dict[str, IntervalTable] = field(default_factory=dict)
    # ``job_bounds``' answers by (framework, GPU arch, GPU count, precision): read for every estimate
    memo: dict[tuple, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)

    def job_bounds(self, framework: str, gpu_arch: str, num_gpus: int, precision: str) -> tuple[float, float]:
        """``log_bounds`` of the regime of a job with these values (``regime_of``), kept per values."""
        key = (framework, gpu_arch, num_gpus, precision)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self.log_bounds(regime_of(*key))
        return hit

    def log_bounds(self, regime: dict[str, str]) -> tuple[float, float]:
        """(lo, hi) of ln(measured / predicted throughput) for a job of this regime."""
        q10s, q90s = [], []
        for key in REGIME_KEYS:
            q = self.regimes.get(key, {}).get(regime.get(key, ""))
            n = q.rows if q else 0
            w = n / (n + self.shrink_rows)  # few rows: lean on the pooled percentiles
            q10s.append(w * q.q10 + (1 - w) * self.pooled.q10 if q else self.pooled.q10)
            q90s.append(w * q.q90 + (1 - w) * self.pooled.q90 if q else self.pooled.q90)
        lo, hi = sum(q10s) / len(q10s), sum(q90s) / len(q90s)
        mid = (lo + hi) / 2
        return mid - self.width * (mid - lo), mid + self.width * (hi - mid)


def scale_band(num_gpus: int) -> str:
    return next(name for limit, name in SCALE_BANDS if num_gpus <= limit)


def precision_class(precision: str) -> str:
    return "fp8" if precision.startswith("fp8") or precision.startswith("mxfp8") else "16bit"


def regime_of(framework: str, gpu_arch: str, num_gpus: int, precision: str) -> dict[str, str]:
    return {
        "framework": framework,
        "gpu_arch": gpu_arch,
        "scale": scale_band(num_gpus),
        "precision": precision_class(precision),
    }


def job_regime(job: Job) -> dict[str, str]:
    return regime_of(job.plan.framework, job.cluster.gpu.arch, job.cluster.num_gpus, job.training.precision)


def table_from_dict(data: dict) -> IntervalTable:
    def q(d: dict) -> Quantiles:
        return Quantiles(float(d["q10"]), float(d["q90"]), int(d["rows"]))

    regimes = {key: {str(v): q(d) for v, d in (data.get("regimes", {}).get(key) or {}).items()} for key in REGIME_KEYS}
    held_out = {str(src): table_from_dict(d) for src, d in (data.get("held_out") or {}).items()}
    return IntervalTable(q(data["pooled"]), regimes, float(data["width"]), float(data["shrink_rows"]), held_out)


@lru_cache(maxsize=4)
def _data(path: str) -> dict | None:
    p = Path(path)
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


@lru_cache(maxsize=4)
def load_table(path: str = str(INTERVALS_FILE)) -> IntervalTable | None:
    """The shipped table (None when the file is absent: predictions then carry no interval)."""
    data = _data(path)
    return table_from_dict(data) if data is not None else None


def throughput_bounds(job: Job, tokens_per_s: float) -> tuple[float, float] | None:
    """(p10, p90) of the job's throughput from its central prediction, or None without a table."""
    table = load_table()
    if table is None:
        return None
    c = job.cluster
    lo, hi = table.job_bounds(job.plan.framework, c.gpu.arch, c.num_gpus, job.training.precision)  # ``job_regime``'s
    return tokens_per_s * math.exp(lo), tokens_per_s * math.exp(hi)


@dataclass(frozen=True)
class PublishedBest:
    """The best published validation runs of one GPU at one peak (``decide.intervals.published_mfu``)."""

    mfu: float  # highest measured MFU
    row: str  # its validation row
    precision: str  # that row's precision (fp16 and bf16 share a peak)
    hfu: float  # highest measured HFU (model + recompute FLOPs): the hardware rate the GPU was seen to sustain
    hfu_row: str
    hfu_row_mfu: float  # that row's MFU (lower when it recomputes)
    hfu_row_recompute: str


def published_best(gpu: str, precision: str) -> PublishedBest | None:
    """The best published runs of this GPU at this precision's peak, or None (no row, or no table)."""
    e = ((_data(str(INTERVALS_FILE)) or {}).get("published_mfu") or {}).get(f"{gpu}/{precision}")
    if not e:
        return None
    mfu = float(e["mfu"])
    return PublishedBest(
        mfu,
        str(e["row"]),
        str(e.get("precision", precision)),
        float(e.get("hfu", mfu)),
        str(e.get("hfu_row", e["row"])),
        float(e.get("hfu_row_mfu", mfu)),
        str(e.get("hfu_row_recompute", "")),
    )


def best_published_mfu(gpu: str, precision: str) -> tuple[float, str] | None:
    """(MFU, row id) of the best published validation run on this GPU at this precision's peak, or None."""
    best = published_best(gpu, precision)
    return (best.mfu, best.row) if best else None
