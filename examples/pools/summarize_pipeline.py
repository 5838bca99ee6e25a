"""Summarise `commtax bench pipeline` records (examples/pools/measure_pipeline.sh): per schedule and split, the
median measured and predicted step over the repeats, the error, and whether the prediction ranks the splits as
the measurement does."""

import json
import statistics
import sys
from collections import defaultdict

records = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "examples/pools/pipeline_results.json"))
by = defaultdict(list)
for r in records:
    by[r["schedule"], ",".join(map(str, r["stage_layers"]))].append(r)
print(
    "| schedule | split | runs | measured step s | predicted s | error | from blocks s | stage compute s (n0, n1) "
    "| waiting to run s/step (n0, n1) | load (1 min) |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
med = {}
for (sched, split), rs in sorted(by.items()):
    m = statistics.median(r["step_time_s"] for r in rs)
    p = statistics.median(r["predicted_step_time_s"] for r in rs)
    b = statistics.median(r["predicted_from_blocks_s"] for r in rs)
    comp = [statistics.median(r["stages"][s]["compute_s"] for r in rs) for s in (0, 1)]
    thr = [[r["stages"][s].get("runqueue_wait_s_per_step") for r in rs] for s in (0, 1)]
    thr_txt = ", ".join(f"{statistics.median(x):.3f}" if None not in x else "-" for x in thr)
    load = statistics.median(r["host_load"]["before"][0] for r in rs)
    med[sched, split] = (m, p)
    print(
        f"| {sched} | {split} | {len(rs)} | {m:.3f} | {p:.3f} | {p / m - 1:+.1%} | {b:.3f} | "
        f"{comp[0]:.3f}, {comp[1]:.3f} | {thr_txt} | {load:.1f} |"
    )
for sched in sorted({s for s, _ in med}):
    a, b = med.get((sched, "2,2")), med.get((sched, "3,1"))
    if a and b:
        same = (a[0] < b[0]) == (a[1] < b[1])
        print(
            f"\n{sched}: measured {'2,2' if a[0] < b[0] else '3,1'} faster, predicted "
            f"{'2,2' if a[1] < b[1] else '3,1'} faster: ranking {'agrees' if same else 'DISAGREES'}"
        )
