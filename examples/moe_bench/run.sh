#!/usr/bin/env bash
# bench moe on a 2-node × 2-rank emulated cluster at 50 Mbit/s: balanced (λ ≈ 1) and skewed (λ = 2) routing, each
# run three times, interleaved; the gloo all-to-all probe; load averages beside. Needs root (netns + tc) and torch.
set -euo pipefail
PY=${PY:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli.measure"
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/results}
rate=${RATE:-50mbit}
mkdir -p "$out"
c="$out/cluster_$rate.yaml"
$CT cluster up --nodes 2 --ranks-per-node 2 --link "$rate" --out "$c"
trap '$CT cluster down --cluster "$c"' EXIT
: > "$out/load.txt"
for rep in 1 2 3; do
  for lam in 1 2; do
    echo "rep $rep imbalance $lam start: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
    $CT cluster run --cluster "$c" -- "$PY" -m commtax.cli.measure bench moe --experts 8 --top-k 2 --hidden 256 \
        --ffn 512 --tokens 1024 --imbalance $lam --steps 8 --cluster "$c" --out "$out/moe_${rate}_l${lam}_r$rep.json"
    echo "rep $rep imbalance $lam end: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
  done
done
# the probe behind the routed all-to-all model: gloo all_to_all_single with chosen traffic patterns
$CT cluster run --cluster "$c" -- "$PY" "$here/gloo_a2a_probe.py" 2 > "$out/gloo_a2a_probe_$rate.txt"
"$PY" "$here/table.py" "$out" > "$out/table.md"
