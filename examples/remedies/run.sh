#!/usr/bin/env bash
# Gradient-compression remedies, measured and predicted: bench ddp on 2-node emulated clusters at three
# link rates (all hooks, then the error-feedback variants), the quality run, and the figures.
# Needs root (network namespaces + tc) and the dist extra (torch); the plot needs matplotlib.
set -euo pipefail
PY=${PY:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli.measure"
out=${OUT:-$(cd "$(dirname "$0")" && pwd)/results}
mkdir -p "$out"
# the host is shared: every hook runs interleaved in one process, and each rate is run twice (run 2: *_rep2.json)
for rep in 1 2; do
for rate in 100mbit 300mbit 1gbit; do
  sfx=$([ $rep = 1 ] && echo "" || echo "_rep$rep")
  c="$out/cluster_$rate$sfx.yaml"
  $CT cluster up --nodes 2 --ranks-per-node 1 --link $rate --out "$c"
  trap '$CT cluster down --cluster "$c"' EXIT
  echo "$rate run $rep: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
  $CT cluster run --cluster "$c" -- "$PY" -m commtax.cli.measure bench ddp --hook none,fp16,bf16,fp8,int8,int4,powersgd \
      --steps 12 --cluster "$c" --out "$out/ddp_$rate$sfx.json"
  if [ $rep = 1 ]; then
    $CT cluster run --cluster "$c" -- "$PY" -m commtax.cli.measure bench ddp --hook int8,int4,powersgd --error-feedback \
        --steps 12 --cluster "$c" --out "$out/ddp_ef_$rate.json"
  fi
  echo "$rate run $rep done: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
  $CT cluster down --cluster "$c"
  trap - EXIT
done
done
# quality: plain SGD (it shows the bias Adam hides), 40 steps, the same batches for every hook; no shaped links needed
Q="--hidden 64 --vocab 256 --seq-len 32 --optimizer sgd --lr 0.3 --steps 40 --warmup 0"
$CT bench ddp --nproc 2 --hook none,fp16,bf16,fp8,int8,int4,powersgd $Q --out "$out/quality.json"
$CT bench ddp --nproc 2 --hook int8,int4,powersgd --error-feedback $Q --out "$out/quality_ef.json"
"$PY" "$(dirname "$0")/plot.py" "$out"
