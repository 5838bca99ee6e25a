"""Could host launch time explain the 8-GPU-node MoE rows? The check behind docs/moe.md "The host sync of an eager
MoE layer".

    PYTHONPATH=src .venv/bin/python benchmarks/moe_host_sync.py [../shared/validation/public_moe_runs.csv]

For every row `commtax validate` predicts: the plan it chose, local experts, micro-batch, the model's priced time of
one MoE layer and micro-batch (forward + backward, per ``overlap_pieces``), the kernels the model's op list launches
for it, the miss per MoE layer and micro-batch (measured minus predicted step, spread over the stage's layer-passes),
and the host cost per launch the whole measured layer-pass would imply if the layer were host-bound:
measured layer-pass / kernels. The sourced cost is 4-10 us per eager op (catalog/assumptions.yaml cpu_op_s: 5 us).
"""

from __future__ import annotations

import sys
from pathlib import Path

from commtax.costs.pricing import Costs, overlap_pieces
from commtax.decide import validate as V
from commtax.spec.catalog import load_catalog
from commtax.workload.moe import local_experts, overlap_phases
from commtax.workload.step import Compute, build_workload

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "validation" / "public_moe_runs.csv"


def layer_kernels(block) -> int:
    """Kernel launches of one MoE layer-pass in the model's ops: compute ops' ``kernels``, one per collective."""
    return sum(o.kernels if isinstance(o, Compute) else 1 for ph in (block.fwd, block.bwd) for o in ph.ops)


def predicted_rows(path: Path):
    """Each row `commtax validate` predicts, with its result, the plan it was priced with and that plan's workload;
    and the miss per MoE layer-pass (measured minus predicted step, spread over one stage's layer-passes)."""
    catalog = load_catalog()
    results = {r.id: r for r in V.validate(path).rows}
    for row in V.read_rows(path):
        r = results[row["id"]]
        if r.predicted is None:
            continue
        choice = V.row_plan(row, catalog).choice  # the plan validate priced the row with
        job = choice.job
        passes = job.micro_batches * job.model.layers / job.plan.pp  # layer-passes of one stage per step
        miss = choice.breakdown.step_time_s * (r.predicted / r.measured - 1.0) / passes
        yield row, r, job, build_workload(job), miss


def main(path: Path) -> None:
    print("| row | err % | E_loc | mbs | priced ms | kernels | miss ms | implied us/launch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row, r, job, wl, miss in predicted_rows(path):
        priced = overlap_pieces(Costs(job), overlap_phases(wl.moe_layer))
        layer_s = priced.compute + priced.dispatch_f + priced.combine_f + priced.dispatch_b + priced.combine_b
        kernels = layer_kernels(wl.moe_layer)
        implied = (layer_s + miss) / kernels
        print(
            f"| {row['id']} | {r.error_pct:+.1f} | {local_experts(job)} | {job.plan.micro_batch} | "
            f"{layer_s * 1e3:.2f} | {kernels} | {miss * 1e3:+.2f} | {implied * 1e6:.0f} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
