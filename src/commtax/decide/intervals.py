"""Fitting the 80% interval from validation residuals, and regenerating catalog/intervals.yaml.

A residual is r = ln(measured / predicted) of a published run's throughput. Per regime value (framework, GPU
architecture, scale band, precision class: ``schedule.interval``) the table keeps the 10th and 90th percentiles of
r; a prediction's interval averages its four values' percentiles (shrunk toward the pooled ones by row count) and
widens them about their middle by ``width``. ``width`` is the one fitted number: the value at which, with each
source's rows left out of the percentiles, the interval covers 80% of the left-out rows (leave-one-source-out), so
that the coverage carries to runs of sources the table has not seen.

Regenerate (from the repository root, with ``shared/`` beside it)::

    python -m commtax.decide.intervals ../shared/validation/public_runs.csv ../shared/validation/public_runs_more.csv
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commtax.atomic import write_atomic
from commtax.schedule.interval import (
    INTERVALS_FILE,
    REGIME_KEYS,
    IntervalTable,
    Quantiles,
    load_table,
)

TARGET_COVERAGE = 0.80
SHRINK_ROWS = 5.0  # a regime value with 5 rows weighs half against the pooled percentiles
WIDTHS = [round(0.50 + 0.01 * i, 2) for i in range(301)]  # the width grid searched: 0.50 … 3.50


@dataclass(frozen=True)
class Residual:
    id: str
    source: str
    regime: dict[str, str]
    r: float  # ln(measured / predicted) of throughput


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (NumPy's default, "linear"), of a non-empty list."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


def _q(xs: list[float]) -> Quantiles:
    return Quantiles(quantile(xs, 0.10), quantile(xs, 0.90), len(xs))


def fit(residuals: list[Residual], width: float, shrink_rows: float = SHRINK_ROWS) -> IntervalTable:
    """Percentiles per regime value and pooled, with the given width."""
    regimes: dict[str, dict[str, Quantiles]] = {}
    for key in REGIME_KEYS:
        groups: dict[str, list[float]] = {}
        for x in residuals:
            groups.setdefault(x.regime[key], []).append(x.r)
        regimes[key] = {v: _q(rs) for v, rs in sorted(groups.items())}
    return IntervalTable(_q([x.r for x in residuals]), regimes, width, shrink_rows)


def inside(table: IntervalTable, x: Residual) -> bool:
    lo, hi = table.log_bounds(x.regime)
    return lo <= x.r <= hi


def coverage_of(table: IntervalTable, residuals: list[Residual]) -> float | None:
    return sum(inside(table, x) for x in residuals) / len(residuals) if residuals else None


def loso_coverage_of(residuals: list[Residual], width: float, shrink_rows: float = SHRINK_ROWS) -> float | None:
    """Share of rows inside the interval fitted on the other sources' rows (every row counts once)."""
    sources = sorted({x.source for x in residuals})
    if len(sources) < 2:
        return None
    hit = 0
    for src in sources:
        rest = [x for x in residuals if x.source != src]
        table = fit(rest, width, shrink_rows)
        hit += sum(inside(table, x) for x in residuals if x.source == src)
    return hit / len(residuals)


def calibrate_width(residuals: list[Residual]) -> tuple[float, float]:
    """(width, its leave-one-source-out coverage): the grid width whose coverage is nearest 80% (the smallest
    such width on ties)."""
    best = min(WIDTHS, key=lambda w: (abs(loso_coverage_of(residuals, w) - TARGET_COVERAGE), w))
    return best, loso_coverage_of(residuals, best)


def residuals_of(results: list[Any]) -> list[Residual]:
    """Residuals of predicted validation rows (``decide.validate.RowResult`` with a regime)."""
    out = []
    for r in results:
        if r.predicted and r.measured and "regime" in r.extra:
            out.append(Residual(r.id, r.extra["source_key"], r.extra["regime"], math.log(r.measured / r.predicted)))
    return out


def published_mfu(results: list[Any]) -> dict[str, dict[str, Any]]:
    """The highest measured MFU per GPU and precision ("gpu/precision"): the measured throughput over the
    predicted one times the predicted MFU (the same FLOP count for both), with the row it comes from."""
    best: dict[str, dict[str, Any]] = {}
    for r in results:
        if not (r.predicted and r.measured and "mfu" in r.extra and "gpu" in r.extra):
            continue
        key = f"{r.extra['gpu']}/{r.extra['precision']}"
        mfu = r.extra["mfu"] * r.measured / r.predicted
        if key not in best or mfu > best[key]["mfu"]:
            best[key] = {"mfu": round(mfu, 4), "row": r.id}
    return dict(sorted(best.items()))


def table_data(table: IntervalTable) -> dict[str, Any]:
    def q(x: Quantiles) -> dict[str, Any]:
        return {"q10": round(x.q10, 5), "q90": round(x.q90, 5), "rows": x.rows}

    return {
        "width": table.width,
        "shrink_rows": table.shrink_rows,
        "pooled": q(table.pooled),
        "regimes": {k: {v: q(x) for v, x in table.regimes[k].items()} for k in REGIME_KEYS},
    }


def regenerate(paths: list[Path | str], out: Path | str = INTERVALS_FILE) -> dict[str, Any]:
    """Predict every row of the runs CSVs with the central model, fit the table, write it with its provenance."""
    from commtax.decide.validate import validate_files

    report = validate_files(paths)
    runs = report.union or next(r for r in report.files.values() if r.kind == "runs")
    residuals = residuals_of(runs.rows)
    width, loso = calibrate_width(residuals)
    table = fit(residuals, width)
    held_out = {
        src: table_data(fit([x for x in residuals if x.source != src], width))
        for src in sorted({x.source for x in residuals})
    }
    files = [
        {"file": Path(p).name, "rows": len(rep.rows), "sha256": hashlib.sha256(Path(p).read_bytes()).hexdigest()}
        for p, rep in zip(paths, report.files.values())
    ]
    data = {
        "source": (
            "Residuals ln(measured / predicted tokens/s per GPU) of the published runs in the files below, "
            "predicted by this version of the model; regenerate with `make intervals` (python -m "
            "commtax.decide.intervals FILES) after any change to the model."
        ),
        "fitted_on": f"every predicted row of {', '.join(f['file'] for f in files)} ({len(residuals)} rows)",
        "files": files,
        "coverage_80_loso": round(loso, 4),
        "coverage_80_in_sample": round(coverage_of(table, residuals), 4),
        **table_data(table),
        "held_out": held_out,
        # search --verify flags a plan above every published run of its GPU and precision
        "published_mfu": published_mfu(runs.rows),
    }
    import yaml

    header = "# Generated by commtax.decide.intervals: do not edit by hand (see the module's docstring).\n"
    write_atomic(Path(out), header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    load_table.cache_clear()
    return data


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m commtax.decide.intervals RUNS.csv [RUNS.csv ...]", file=sys.stderr)
        return 2
    data = regenerate(argv)
    print(
        f"wrote {INTERVALS_FILE}: width {data['width']}, coverage {data['coverage_80_loso']:.1%} "
        f"leave-one-source-out ({data['coverage_80_in_sample']:.1%} in-sample)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
