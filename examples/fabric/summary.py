"""The runs of measure.sh side by side: measured / predicted per (background, op, size), one column per run, and how
many cases are within 15%. Usage: python summary.py results/fabric_4x1_*.json  -> a markdown table on stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = {"none": 0, "50mbit": 1, "200mbit": 2}


def table(files: list[Path]) -> str:
    runs = [(f.stem.removeprefix("fabric_4x1_"), json.loads(f.read_text())) for f in files]
    keys = sorted(
        {(r["background"], r["op"], r["message_bytes"]) for _, rows in runs for r in rows},
        key=lambda k: (k[1], ORDER.get(k[0], 9), k[2]),
    )
    kappa_runs = any(r.get("gloo_a2a_duplex") is not None for _, rows in runs for r in rows)
    ratio = {(name, r["background"], r["op"], r["message_bytes"]): r for name, rows in runs for r in rows}
    what = "κ" if kappa_runs else "range"  # range: measured over the slowest and the fastest order
    head = "| background 0→2 | op | MiB | " + " | ".join(f"run {n} ({what})" for n, _ in runs) + " |"
    lines = [head, "|---|---|---:|" + "---:|" * len(runs)]
    inside = {}
    for bg, op, nbytes in keys:
        cells = []
        for name, _ in runs:
            r = ratio.get((name, bg, op, nbytes))
            if r is None:
                cells.append("—")
                continue
            ok = abs(r["ratio"] - 1) <= 0.15
            inside.setdefault((op, name), []).append(ok)
            kappa = f" ({r['gloo_a2a_duplex']:.2f})" if r.get("gloo_a2a_duplex") is not None else ""
            if r.get("rendezvous_range_s"):  # measured over the luckiest and the unluckiest entry order's time
                hi, lo = (r["measured_s"] / x for x in r["rendezvous_range_s"])
                kappa = f" ({lo:.2f}–{hi:.2f})"
            cells.append(f"{r['ratio']:.2f}{kappa}" if ok else f"**{r['ratio']:.2f}**{kappa}")
        lines.append(f"| {bg} | {op} | {nbytes / 2**20:.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    for (op, name), oks in sorted(inside.items()):
        lines.append(f"- {op}, run {name}: {sum(oks)} of {len(oks)} within 15%")
    for name, rows in runs:
        loads = {r["background"]: r.get("load_before_after") for r in rows if r.get("load_before_after")}
        if loads:
            each = ", ".join(
                f"{bg} {'→'.join(f'{x:.2f}' for x in v)}"
                for bg, v in sorted(loads.items(), key=lambda kv: ORDER.get(kv[0], 9))
            )
            lines.append(f"- run {name}, host load (1-min average, before → after each case): {each}")
        drops = {r["background"]: r["tc_drops"] for r in rows if r.get("tc_drops") is not None}
        if drops:
            each = ", ".join(f"{bg} {v}" for bg, v in sorted(drops.items(), key=lambda kv: ORDER.get(kv[0], 9)))
            lines.append(f"- run {name}, packets the shaped links dropped per case (tc -s): {each}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(a) for a in sys.argv[1:]]))
