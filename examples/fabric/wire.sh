#!/usr/bin/env bash
# What gloo's all_to_all does on the wire (docs/fabric.md): the 4 × 1 cluster of measure.sh (2 leaves, 2:1 spine,
# 5 ms buffers, reno), wire_variants.py's five ways of moving the same bytes, while `tc -s qdisc` (the switch) and
# `ss -ti` (node 0) are sampled every ~0.1 s. Usage: [BYTES=8388608] [ITERS=8] examples/fabric/wire.sh; root,
# ~2 min. Writes results/wire_4x1_reno5ms.json (wire_summary.py) and keeps the raw samples in the work dir.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-$(cd "$here/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli"
BYTES=${BYTES:-8388608}
ITERS=${ITERS:-8}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work/samples"
$CT cluster up --nodes 4 --ranks-per-node 1 --link 200mbit --leaves 2 --spine 200mbit --queue-ms 5 --tcp reno \
    --no-duplex-probe --out "$work/cluster.yaml"
name=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["emulated"]["name"])' "$work/cluster.yaml")
stop="$work/stop"
sample() {  # $1: namespace, $2: out file, $3...: the command, repeated until $stop exists (at most 300 s)
    local ns=$1 out=$2; shift 2
    for _ in $(seq 3000); do
        [ -e "$stop" ] && break
        echo "T $(date +%s.%N)"; ip netns exec "$ns" "$@"; sleep 0.1
    done > "$out"
}
cleanup() { touch "$stop"; wait; $CT cluster down --cluster "$work/cluster.yaml"; }
trap cleanup EXIT
sample "$name-sw" "$work/samples/tc_sw.txt" tc -s qdisc show &
sample "$name-n0" "$work/samples/n0.txt" ss -tinH &
timeout 300 $CT cluster run --cluster "$work/cluster.yaml" -- "$PY" "$here/wire_variants.py" "$BYTES" "$ITERS" \
    "$work/steps" >&2
"$PY" "$here/wire_summary.py" "$work/samples" "$work/steps" "$BYTES" 2e8 "$here/results/wire_4x1_reno5ms.json"
echo "results in $here/results/wire_4x1_reno5ms.json (raw samples in $work)"
