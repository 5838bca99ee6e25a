#!/usr/bin/env bash
# Issue 20, measured: 4 nodes x 1 rank under two leaf bridges joined by one shaped spine link (2:1: two
# 200 Mbit/s nodes per leaf, a 200 Mbit/s spine), gloo all_reduce and all_to_all 4-32 MiB, with and without
# another job's flow node 0 -> node 2 across the spine; each time next to `commtax collective OP --cluster C`
# (priced at the moment the bench ran: --at, the flows alive then).
# Usage: [RUN=label] [QUEUE_MS=5] [TCP=reno] [NICE=-10] [ROUNDS=3 ITERS=5 WARMUP=2] examples/fabric/measure.sh
# [RATE ...] (background rates, default 50mbit 200mbit); root, ~12 min a run. Everything it starts (torchrun, the
# ranks, the background flow) runs at nice NICE: the host is shared, and a rank another process preempts stalls every
# peer of its all_to_all (0: as started). Each size is measured ROUNDS times (bench --rounds: a barrier, WARMUP calls
# to settle, ITERS timed), their mean. Each shaped link holds QUEUE_MS of traffic (a shallow switch buffer, written as
# the fabric's standing queue) and every node runs TCP (docs/fabric.md "Why reno and a 5 ms buffer"); the load
# average and every qdisc's drop count (tc -s) before and after each case go into the results. Writes
# results/fabric_4x1_<RUN>.json; summary.py turns the runs into the table of docs/fabric.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-$(cd "$here/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli"
RUN=${RUN:-1}
QUEUE_MS=${QUEUE_MS:-5}
TCP=${TCP:-reno}
NICE=${NICE:--10}
WARMUP=${WARMUP:-2}
ITERS=${ITERS:-5}
ROUNDS=${ROUNDS:-3}  # each size 3 times: a barrier (a fresh draw of gloo's turns), 2 calls to settle, 5 timed
renice -n "$NICE" -p $$ >/dev/null  # the children inherit it: ranks, torchrun, the load generator
rates=("${@:-50mbit}")
[ $# -eq 0 ] && rates=(50mbit 200mbit)
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
out="$here/results"
mkdir -p "$out"
drops() {  # $1: out file: every namespace's qdiscs with their counters (compare.py sums the drops)
    local name
    name=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["emulated"]["name"])' "$work/cluster.yaml")
    for ns in $(ip netns list | cut -d' ' -f1 | grep "^$name-"); do echo "NS $ns"; ip netns exec "$ns" tc -s qdisc show; done > "$1"
}
bench() {  # $1: label
    cut -d' ' -f1 /proc/loadavg > "$work/load_$1.txt"
    drops "$work/tc_$1_before.txt"
    $CT cluster run --cluster "$work/cluster.yaml" -- "$PY" -m commtax.cli bench collective \
        --ops all_reduce,all_to_all --min 4MiB --max 32MiB --warmup "$WARMUP" --iters "$ITERS" --rounds "$ROUNDS" \
        --timeout 300 --out "$work/bench_$1.json" >&2
    cut -d' ' -f1 /proc/loadavg >> "$work/load_$1.txt"
    drops "$work/tc_$1_after.txt"
    cp "$work/cluster.yaml" "$work/cluster_$1.yaml"   # what the prediction reads: κ and the flows recorded
}
for rate in "" "${rates[@]}"; do
    label=${rate:-none}
    $CT cluster up --nodes 4 --ranks-per-node 1 --link 200mbit --leaves 2 --spine 200mbit --queue-ms "$QUEUE_MS" \
        --tcp "$TCP" --out "$work/cluster.yaml"
    trap '$CT cluster down --cluster "$work/cluster.yaml"' EXIT
    [ -n "$rate" ] && $CT cluster load --cluster "$work/cluster.yaml" --from 0 --to 2 --rate "$rate" --seconds 420
    bench "$label"
    $CT cluster down --cluster "$work/cluster.yaml"
    trap - EXIT
done
"$PY" "$here/compare.py" "$work" "$out/fabric_4x1_$RUN.json"
echo "results in $out/fabric_4x1_$RUN.json (work files in $work)"
