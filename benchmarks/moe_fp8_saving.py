"""Is the FP8 gain of the other sources' Blackwell rows overpriced, or is the BF16 base? The check behind docs/moe.md
"What branch moe17 found" (the FP8 saving in seconds against the BF16 twin's miss).

    PYTHONPATH=src .venv/bin/python benchmarks/moe_fp8_saving.py [validation/other_moe_runs.csv]

For every pair of rows that differ only in precision (ids `..._bf16_...` and `..._fp8_...`, as the DGX Cloud
Benchmarking Grok-1 and Llama-4 Maverick tables publish them): the step time measured and predicted for each (tokens
per step / (tokens/s per GPU × GPUs)), the miss of each (measured − predicted), and the seconds FP8 saves, measured
and priced. A miss of the same size in both rows is time the model lacks whatever the GEMMs' precision; a saving
priced above the measured one is the FP8 gain itself overpriced.
"""

from __future__ import annotations

import sys
from pathlib import Path

from commtax.decide import validate as V

DEFAULT = Path(__file__).resolve().parents[1] / "validation" / "other_moe_runs.csv"


def step_s(row: dict, tokens_per_s_per_gpu: float) -> float:
    """Seconds per step from tokens/s per GPU: seq_len × global batch / (rate × GPUs)."""
    tokens = int(row["seq_len"]) * int(row["global_batch"])
    return tokens / (tokens_per_s_per_gpu * int(row["num_gpus"]))


def main(path: Path) -> None:
    rows = {r["id"]: r for r in V.read_rows(path)}
    results = {r.id: r for r in V.validate(path).rows}
    print("| pair | BF16 step meas / pred s | FP8 step meas / pred s | miss BF16 / FP8 s | FP8 saves meas / priced s |")
    print("|---|---:|---:|---:|---:|")
    for rid in rows:
        if "_bf16_" not in rid or rid.replace("_bf16_", "_fp8_") not in rows:
            continue
        fid = rid.replace("_bf16_", "_fp8_")
        b, f = results[rid], results[fid]
        bm, bp = step_s(rows[rid], b.measured), step_s(rows[rid], b.predicted)
        fm, fp = step_s(rows[fid], f.measured), step_s(rows[fid], f.predicted)
        print(
            f"| {rid.replace('_bf16', '')} | {bm:.3f} / {bp:.3f} | {fm:.3f} / {fp:.3f} "
            f"| {bm - bp:+.3f} / {fm - fp:+.3f} | {bm - fm:.3f} / {bp - fp:.3f} ({(bm - fm) / (bp - fp):.0%}) |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
