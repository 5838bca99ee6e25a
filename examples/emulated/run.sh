#!/usr/bin/env bash
# up → bench → calibrate → predict → down, on a 4-node emulated cluster with 300 Mbit/s links.
set -euo pipefail
PY=${PY:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli.measure"
work=$(mktemp -d)
$CT cluster up --nodes 4 --ranks-per-node 1 --link 300mbit --out "$work/cluster.yaml"
trap '$CT cluster down --cluster "$work/cluster.yaml"' EXIT   # also on Ctrl-C and errors
$CT cluster run --cluster "$work/cluster.yaml" -- "$PY" -m commtax.cli.measure bench collective \
    --ops all_reduce,all_gather,reduce_scatter --min 1MiB --max 8MiB --impl torch,ring --out "$work/bench.json"
$CT calibrate "$work/bench.json" --cluster "$work/cluster.yaml" --out "$work/profile.yaml" \
    --cluster-out "$work/calibrated.yaml"
"$(dirname "$PY")/commtax" collective all_reduce --bytes 4MiB --cluster "$work/calibrated.yaml" --algorithm ring
echo "results in $work"
