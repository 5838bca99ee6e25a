"""A GPU sweep's results (``commtax.measure.gpu_sweep``) as catalog entries, each with its source.

* catalog/gpus.yaml: ``matmul_efficiency`` = best measured GEMM rate / the datasheet dense peak, per precision
  (the MAMF definition: best shape), and ``clock_fraction`` = sustained / burst rate of the same GEMM.
* catalog/assumptions.yaml: ``memory_efficiency`` = the elementwise add's bytes/s / the datasheet HBM bandwidth.
* catalog/attention.yaml: a ``fa2`` (torch SDPA flash) table for the GPU's architecture: seq, fwd, bwd TFLOP/s.

No torch import: this runs anywhere (the results file comes back from the device).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from commtax.errors import SpecError

REQUIRED = ("device", "date", "torch", "gemm", "clock", "attention", "hbm")


def read_results(path: Path | str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecError(f"{path}: not a readable gpu sweep results file ({e})") from None
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise SpecError(f"{path}: missing {', '.join(missing)}; give the gpu_sweep.json that gpu_sweep wrote")
    return data


def _source(r: dict[str, Any], what: str) -> str:
    return (
        f"measured by commtax.measure.gpu_sweep on {r['device']} ({r['date']}, torch {r['torch']}, "
        f"CUDA {r.get('cuda') or '?'}): {what}"
    )


def entries(r: dict[str, Any], gpu_id: str, peak_tflops: dict[str, float], mem_bw_GBps: float, arch: str) -> dict:
    """Catalog fragments: {"gpus": {gpu_id: {...}}, "assumptions": {...}, "attention": {...}}."""
    best: dict[str, float] = {}
    for row in r["gemm"]:
        best[row["dtype"]] = max(best.get(row["dtype"], 0.0), float(row["tflops"]))
    eff = {}
    for dtype, rate in sorted(best.items()):
        if dtype not in peak_tflops:
            raise SpecError(
                f"gpu {gpu_id}: no {dtype} peak in the catalog to divide the measured {rate:.0f} TFLOP/s by"
            )
        eff["default" if dtype == "bf16" else dtype] = round(rate / peak_tflops[dtype], 3)
    clock = r["clock"]
    clock_fraction = round(clock["sustained_tflops"] / clock["burst_tflops"], 3)
    gemm_src = ", ".join(f"{d} {best[d]:.1f} of {peak_tflops[d]:g}" for d in sorted(best))
    gpus = {
        gpu_id: {
            "matmul_efficiency": eff,
            "clock_fraction": clock_fraction,
            "source": _source(
                r,
                f"best GEMM TFLOP/s {gemm_src} (matmul_efficiency); 8192³ bf16 GEMM {clock['sustained_tflops']:.1f} "
                f"after {clock['sustain_s']:g} s of load / {clock['burst_tflops']:.1f} burst (clock_fraction)",
            ),
        }
    }
    add = float(r["hbm"]["add_GBps"])
    assumptions = {
        "memory_efficiency": {
            "value": round(add / mem_bw_GBps, 3),
            "source": _source(r, f"elementwise add over 1 GiB bf16 tensors, {add:.0f} of {mem_bw_GBps:g} GB/s"),
            "fitted_on": [],
        }
    }
    att = sorted(r["attention"], key=lambda x: x["seq"])
    attention = {
        "fa2": {
            arch: {
                "ref_peak_tflops": peak_tflops["bf16"],
                "seq": [int(x["seq"]) for x in att],
                "fwd": [round(float(x["fwd_tflops"]), 1) for x in att],
                "bwd": [round(float(x["bwd_tflops"]), 1) for x in att],
                "source": _source(r, "torch SDPA flash backend, causal, head dim 128, bf16, 16k tokens per call"),
            }
        }
    }
    return {"gpus": gpus, "assumptions": assumptions, "attention": attention}


def entries_for_catalog_gpu(r: dict[str, Any], gpu_id: str) -> dict:
    """``entries`` with the peaks, HBM bandwidth and architecture of catalog GPU ``gpu_id``."""
    from commtax.spec import load_catalog

    gpus = load_catalog()["gpu"]
    if gpu_id not in gpus:
        raise SpecError(f"--gpu: unknown {gpu_id!r}; use a catalog GPU id (commtax estimate --help lists them)")
    g = gpus[gpu_id]
    return entries(r, gpu_id, dict(g["peak_tflops"]), float(g["mem_bw_GBps"]), str(g.get("arch", "other")))
