#!/usr/bin/env bash
# The emulated-cluster check of issue 19 (docs/pools.md): 2 nodes x 1 rank, node 1 at half speed (a cgroup CPU
# quota), 1 Gbit/s links; a 4-block GPT as 2,2 and 3,1 stages under 1F1B and GPipe, repeated in turn so that both
# splits see the same host load; each record holds the measured and the predicted step.
# Run as root from the repository root:  bash examples/pools/measure_pipeline.sh [REPEATS] [SPEEDS] [OUT]
# SPEEDS (default 1,0.5): CPUs per rank of node 0 and node 1. On a busy host a rank's fair share of the CPUs can be
# below its quota, and then the quota does not bind; 0.2,0.1 binds where the share is above 0.1 CPU.
set -euo pipefail
repeats=${1:-2}
speeds=${2:-1,0.5}
out=${3:-examples/pools/pipeline_results.json}
cluster=$(mktemp --suffix=.yaml)
python=${PYTHON:-python}
$python -m commtax.cli cluster up --nodes 2 --ranks-per-node 1 --node-speed "$speeds" --link 1gbit --out "$cluster"
trap '$python -m commtax.cli cluster down --cluster "$cluster"; rm -f "$cluster"' EXIT
rm -f "$out" "${out%.json}.csv"
for r in $(seq "$repeats"); do
  for schedule in 1f1b gpipe; do
    for split in 2,2 3,1; do
      $python -m commtax.cli cluster run --cluster "$cluster" -- commtax bench pipeline --layers 4 \
        --stage-layers "$split" --schedule "$schedule" --micro-batches 4 --micro-batch 4 --hidden 192 \
        --steps 6 --warmup 1 --cluster "$cluster" --out "$out" --append
    done
  done
done
$python examples/pools/summarize_pipeline.py "$out"
