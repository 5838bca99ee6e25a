#!/usr/bin/env bash
# Two-way traffic on one-way connections (docs/fabric.md "Two-way traffic"): the 4 × 1 cluster of measure.sh (2
# leaves, 2:1 spine, 5 ms buffers, reno), wire_variants.py's `oneway` (leaf 0 -> leaf 1 only) and `spine_split`
# (the same chunks both ways, each direction on connections of its own), each in a run of its own so that the nodes'
# TCP counters (nstat: segments sent, retransmitted, timeouts) and the switch's tc drops belong to one variant.
# Usage: [BYTES=8388608] [ITERS=8] [NICE=-10] examples/fabric/two_way.sh OUT.json; root, ~2 min. Writes OUT.json
# (median call over the spine's wire time, and the counters per variant; results/two_way_4x1_reno5ms.json keeps
# the runs so far).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-$(cd "$here/../.." && pwd)/.venv/bin/python}
CT="$PY -m commtax.cli"
BYTES=${BYTES:-8388608}
ITERS=${ITERS:-8}
out=$(realpath -m "${1:?usage: two_way.sh OUT.json}")
renice -n "${NICE:--10}" -p $$ >/dev/null
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
$CT cluster up --nodes 4 --ranks-per-node 1 --link 200mbit --leaves 2 --spine 200mbit --queue-ms 5 --tcp reno \
    --no-duplex-probe --out "$work/cluster.yaml"
trap '$CT cluster down --cluster "$work/cluster.yaml"' EXIT
name=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["emulated"]["name"])' "$work/cluster.yaml")
counters() {  # $1: out file: every node's TCP counters, the switch's qdiscs
    for i in 0 1 2 3; do
        echo "NODE $i"; ip netns exec "$name-n$i" nstat -az TcpOutSegs TcpRetransSegs TcpExtTCPTimeouts
    done > "$1"
    ip netns exec "$name-sw" tc -s qdisc show >> "$1"
}
for v in oneway spine_split; do
    counters "$work/before_$v.txt"
    timeout 300 $CT cluster run --cluster "$work/cluster.yaml" -- "$PY" "$here/wire_variants.py" "$BYTES" "$ITERS" \
        "$work/steps_$v" "$v" >&2
    counters "$work/after_$v.txt"
done
"$PY" - "$work" "$BYTES" "$out" <<'PYEOF'
import json, re, statistics, sys, time
from pathlib import Path
work, nbytes, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
wire = nbytes / 25e6  # the spine's one direction carries S per call at 200 Mbit/s

def counts(f):
    txt = f.read_text()
    c = {k: sum(int(v) for v in re.findall(rf"^{k}\s+(\d+)", txt, re.M)) for k in ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPTimeouts")}
    c["tc_dropped"] = sum(int(v) for v in re.findall(r"dropped (\d+)", txt))
    return c

res = {"when_unix": time.time(), "bytes": nbytes, "variants": {}}
for v in ("oneway", "spine_split"):
    recs = [json.loads((work / f"steps_{v}_r{r}.json").read_text()) for r in range(4)]
    its = sorted({x["it"] for x in recs[0]} - {0})  # iteration 0: warm-up
    spans = [max(x["t1"] for rr in recs for x in rr if x["it"] == i) - min(x["t0"] for rr in recs for x in rr if x["it"] == i) for i in its]
    b, a = counts(work / f"before_{v}.txt"), counts(work / f"after_{v}.txt")
    d = {k: a[k] - b[k] for k in a}
    res["variants"][v] = {
        "median_over_wire": round(statistics.median(spans) / wire, 3),
        "each_over_wire": [round(s / wire, 3) for s in spans],
        **d,
        "retransmitted_share": round(d["TcpRetransSegs"] / max(1, d["TcpOutSegs"]), 4),
    }
out.write_text(json.dumps(res, indent=1) + "\n")
print(json.dumps(res["variants"], indent=1))
PYEOF
