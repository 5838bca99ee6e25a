"""The measured-vs-predicted table of docs/moe_bench.md from the records in a results folder."""

import json
import sys
from pathlib import Path

PHASES = ("router", "permute", "dispatch", "experts", "combine", "unpermute", "layer")
rows = []
for f in sorted(Path(sys.argv[1]).glob("moe_*_r*.json")):
    for r in json.loads(f.read_text()):
        rows.append((f.stem, r))
print(
    "| run | λ measured | κ | load | "
    + " | ".join(f"{p} ms meas / pred" for p in PHASES)
    + " | layer err | all-to-all share meas / pred |"
)
print("|---" * (len(PHASES) + 6) + "|")
errs = []
for name, r in rows:
    cells = [f"{r[f'{p}_s'] * 1e3:.1f} / {r[f'predicted_{p}_s'] * 1e3:.1f}" for p in PHASES]
    err = r["predicted_layer_s"] / r["layer_s"] - 1
    errs.append(abs(err))
    print(
        f"| {name} | {r['measured_imbalance']:.2f} | {r['reverse_share']:.2f} | {r['load_average']:.1f} | "
        + " | ".join(cells)
        + f" | {err:+.1%} | {r.get('a2a_share', float('nan')):.0%} / {r['predicted_a2a_share']:.0%} |"
    )
if errs:
    print(f"\nlayer time: mean |error| {sum(errs) / len(errs):.1%}, largest {max(errs):.1%}, {len(errs)} runs")
