"""Which priced op class could the fine-grained MoE rows' miss come from? The check behind docs/moe.md "What the
fine-grained rows miss, by op class" (branch moe15).

    PYTHONPATH=src .venv/bin/python benchmarks/moe_miss_by_class.py [../shared/validation/public_moe_runs.csv]

For every row `commtax validate` predicts: the miss per MoE layer and micro-batch (measured minus predicted step,
spread over the stage's layer-passes, as benchmarks/moe_host_sync.py), the model's priced time of that layer-pass
by op class (forward + backward + recompute: routed-expert GEMMs, the other GEMMs, attention, memory-bound passes,
the EP exchange's link time), and for each class the factor its price would have to grow by to close the miss on
its own, 1 + miss / class time. A mechanism inside one class can close a row only if that factor is one its
sources could support.
"""

from __future__ import annotations

import sys
from pathlib import Path

from moe_host_sync import DEFAULT, predicted_rows  # the same rows, plans and misses

from commtax.costs.pricing import EP_GROUPS, Costs
from commtax.workload.moe import local_experts
from commtax.workload.step import Compute

CLASSES = ("experts", "gemm", "attention", "memory", "ep")


def op_class(op) -> str:
    """The class of one op of a MoE layer-pass."""
    if not isinstance(op, Compute):
        return "ep" if op.group in EP_GROUPS else "other"
    if op.kind == "gemm":
        return "experts" if op.groups > 1 or op.kernels > 1 else "gemm"
    return "attention" if op.kind == "attention" else "memory"


def layer_by_class(costs: Costs, block) -> dict[str, float]:
    """Priced seconds of one MoE layer-pass (forward, backward, recompute) by op class."""
    out = dict.fromkeys((*CLASSES, "other"), 0.0)
    for ph in (block.fwd, block.bwd, block.recompute):
        for op in ph.ops:
            out[op_class(op)] += costs.compute(op) if isinstance(op, Compute) else costs.collective(op)
    return out


def main(path: Path) -> None:
    head = " | ".join(f"{c} ms (×)" for c in CLASSES)
    print(f"| row | err % | E_loc | rows/expert | miss ms | {head} |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(CLASSES))
    for row, r, job, wl, miss in predicted_rows(path):
        by = layer_by_class(Costs(job), wl.moe_layer)
        rows = next(o.m for o in wl.moe_layer.fwd.ops if o.name == "expert_up")
        cells = " | ".join(f"{by[c] * 1e3:.2f} ({1 + miss / by[c]:.1f})" if by[c] else "0 (-)" for c in CLASSES)
        print(f"| {row['id']} | {r.error_pct:+.1f} | {local_experts(job)} | {rows} | {miss * 1e3:+.2f} | {cells} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
