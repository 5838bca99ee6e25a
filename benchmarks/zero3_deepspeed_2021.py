"""Why the 2021 DeepSpeed ZeRO-3 rows (Narayanan et al. 2021, Table 2) are slow: a worked hypothesis.

    PYTHONPATH=src python benchmarks/zero3_deepspeed_2021.py [validation/public_runs.csv]

DeepSpeed v0.3.13 (2021-03, deepspeed/runtime/zero/partition_parameters.py, ``_allgather_param``) fetches
every parameter tensor separately, after a ``torch.cuda.synchronize()``, with the list form of
``torch.distributed.all_gather`` (one output view per rank). PyTorch's ProcessGroupNCCL (<= 1.8) runs that
as one ncclAllGather into a flat buffer and then one ``copy_`` per rank (``outputTensors[i][j].copy_``), so
each gather costs n small kernel launches on top of NCCL's own ring latency over n ranks. Nothing overlaps
(the host synchronises first), and a parameter is gathered for the forward, again for the recomputed
forward (full activation checkpointing) and again for the backward. Gradients are reduce-scattered in
``reduce_bucket_size`` (5e8 elements) buckets, also with list inputs (n copies each).

Exposed DP time per step
    = Σ_gathers [NCCL all_gather(tensor) + n · t_copy] + Σ_buckets [reduce_scatter + n · t_copy]
with NCCL's times from commtax.costs.collectives (DP group = all GPUs, all NICs of a node) and t_copy the host
cost of one small eager ``copy_`` launch (5-10 µs; not fitted here: both ends are printed). The estimate
now carries it as a framework fact (catalog/frameworks.yaml ``zero3_gather: per_parameter_sync``, applied by
``validate`` to DeepSpeed runs published before 2022; ``estimate.per_parameter_sync_time``), with the
gradients reduce-scattered per tensor as DeepSpeed v0.3.13 does (``_reduce_scatter_gradient``) and
``cpu_op_s`` per rank.
"""

from __future__ import annotations

import csv
import sys

from commtax.costs.collectives import collective_cost
from commtax.costs.topology import placement
from commtax.decide.plans import best_plan
from commtax.decide.validate import run_job_raw
from commtax.spec import Cluster, build, load_catalog, resolve_cluster

BUCKET_ELEMENTS = 5e8  # DeepSpeed reduce_bucket_size default
GATHERS_PER_PARAM = 3  # forward, recomputed forward, backward


def main(path: str = "validation/public_runs.csv") -> None:
    cat = load_catalog()
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["id"].startswith("meg21_t2") and r["zero"] == "3"]
    print(
        f"{'row':12} {'GPUs':>5} {'measured':>9} {'compute':>8} {'gathers':>8} {'rs':>6} "
        f"{'copies 5us':>10} {'copies 10us':>11} {'error 5us':>9} {'error 10us':>10}"
    )
    for r in rows:
        n, h, f, L = (int(r[k]) for k in ("num_gpus", "hidden", "ffn_hidden", "layers"))
        raw, fixed, free = run_job_raw(r, cat)
        b = best_plan(raw, fixed, [x for x in free if x != "dp"]).breakdown
        compute = b.breakdown_s["compute"] + b.breakdown_s["recompute"] + b.breakdown_s.get("optimizer", 0.0)
        measured = b.step_time_s * b.tokens_per_s_per_gpu / float(r["measured_tokens_per_s_per_gpu"])
        p = placement(build(Cluster, resolve_cluster(raw["cluster"], cat), "cluster"), n, 1)
        tensors = [3 * h * h, 3 * h, h * h, h, h * f, f, f * h, h, h, h, h, h]  # one GPT layer's parameters
        gathers = L * GATHERS_PER_PARAM * sum(collective_cost("all_gather", 2.0 * x, p).time_s for x in tensors)
        buckets = L * sum(tensors) / BUCKET_ELEMENTS
        rs = buckets * collective_cost("reduce_scatter", 2.0 * BUCKET_ELEMENTS, p).time_s
        calls = L * GATHERS_PER_PARAM * len(tensors) + buckets
        copies = {t: calls * n * t for t in (5e-6, 10e-6)}
        err = {t: 100 * (measured / (compute + gathers + rs + c) - 1) for t, c in copies.items()}
        print(
            f"{r['id']:12} {n:5d} {measured:8.1f}s {compute:7.1f}s {gathers:7.1f}s {rs:5.1f}s "
            f"{copies[5e-6]:9.1f}s {copies[10e-6]:10.1f}s {err[5e-6]:+8.0f}% {err[10e-6]:+9.0f}%"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
