#!/usr/bin/env bash
# The knobs on one 300 Mbit/s 2-node cluster: DDP bucket size (25 MiB: one bucket, 1 MiB: eight) and
# gradient accumulation (1 vs 4 micro-batches per step), for none, bf16 and int8.
set -euo pipefail
PY=${PY:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli.measure"
out=${OUT:-$(cd "$(dirname "$0")" && pwd)/results}
c="$out/cluster_knobs_300mbit.yaml"
$CT cluster up --nodes 2 --ranks-per-node 1 --link 300mbit --out "$c"
trap '$CT cluster down --cluster "$c"' EXIT
for knobs in "--bucket-mb 25" "--bucket-mb 1" "--accumulate 4"; do
  tag=$(echo "$knobs" | tr -d ' -')
  $CT cluster run --cluster "$c" -- "$PY" -m commtax.cli.measure bench ddp --hook none,bf16,int8 $knobs \
      --steps 10 --cluster "$c" --out "$out/knobs_$tag.json"
done
"$PY" "$(dirname "$0")/plot.py" "$out"
