"""Summarise one instrumented run of wire.sh: per variant of wire_variants.py, the call time against the spine's
wire time, the spine's tbf queue and drops (`tc -s qdisc`, sampled), and how node 0 ↔ node 2's connections moved
their bytes (`ss -ti`, sampled): in sample intervals where data moved, the share that moved one way only.

Usage: python wire_summary.py SAMPLES_DIR STEPS_PREFIX BYTES RATE_BIT_S OUT.json"""

from __future__ import annotations

import bisect
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

MOVED = 20_000  # bytes in one sample interval (~0.1 s) that count as moving (200 Mbit/s moves 2.5 MB in 0.1 s)


def tc_samples(path: Path, default_dev: str | None = None) -> list[tuple[float, dict]]:
    """[(unix time, {dev: [sent bytes, dropped, backlog bytes]})] from repeated `tc -s qdisc show` output."""
    out: list[tuple[float, dict]] = []
    dev = None
    for line in path.read_text().splitlines():
        if line.startswith("T "):
            out.append((float(line.split()[1]), {}))
        elif m := re.match(r"qdisc \S+ \S+ (?:dev (\S+) )?root", line):
            dev = m.group(1) or default_dev
        elif (m := re.match(r"\s*Sent (\d+) bytes \d+ pkt \(dropped (\d+)", line)) and out and dev:
            out[-1][1][dev] = [int(m.group(1)), int(m.group(2))]
        elif (m := re.match(r"\s*backlog (\d+)b", line)) and out and dev in out[-1][1]:
            out[-1][1][dev].append(int(m.group(1)))
    return out


def ss_samples(path: Path, peer: str) -> list[tuple[float, dict]]:
    """[(unix time, {connection: (bytes_sent, bytes_received)})] for node connections to ``peer``."""
    out: list[tuple[float, dict]] = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("T "):
            out.append((float(line.split()[1]), {}))
        elif peer in line and "29400" not in line and i + 1 < len(lines) and out:
            info = lines[i + 1]
            sent = re.search(r"bytes_sent:(\d+)", info)
            got = re.search(r"bytes_received:(\d+)", info)
            key = " ".join(line.split()[3:5])
            out[-1][1][key] = (int(sent.group(1)) if sent else 0, int(got.group(1)) if got else 0)
    return out


def at(samples: list, t: float) -> dict:
    k = min(bisect.bisect_left([s[0] for s in samples], t), len(samples) - 1)
    return samples[k][1]


def main(samples: Path, steps: str, nbytes: int, rate_bit_s: float, out: Path) -> None:
    recs = [json.loads(Path(f"{steps}_r{r}.json").read_text()) for r in range(4)]
    wire = nbytes / (rate_bit_s / 8)  # the spine carries S each way (4 pairs × S/4)
    sw = tc_samples(samples / "tc_sw.txt")
    conns = ss_samples(samples / "n0.txt", "10.213.0.3:")
    windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for k in range(len(recs[0])):
        rows = [rec[k] for rec in recs]
        if rows[0]["it"] > 0:
            windows[rows[0]["v"]].append((min(x["t0"] for x in rows), max(x["t1"] for x in rows)))
    result = {"bytes": nbytes, "spine_wire_s": wire, "variants": {}}
    for v, ws in windows.items():
        times = [t1 - t0 for t0, t1 in ws]
        inside_sw = [s for t0, t1 in ws for t, s in sw if t0 <= t <= t1]
        # the spine's two directions in each sample, fuller and emptier: in turns one of them stands idle
        pairs = [[s[d][2] for d in ("u0", "u1")] for s in inside_sw if all(len(s.get(d, ())) > 2 for d in ("u0", "u1"))]
        drops = sum(at(sw, t1)[d][1] - at(sw, t0)[d][1] for t0, t1 in ws for d in ("u0", "u1")) / len(ws)
        alone = total = 0  # node 0 <-> node 2 bytes, and those that moved while the other direction stood idle
        for t0, t1 in ws:
            inside = [s for t, s in conns if t0 <= t <= t1]
            for a, b in zip(inside, inside[1:], strict=False):
                for key in a.keys() & b.keys():
                    ds, dr = b[key][0] - a[key][0], b[key][1] - a[key][1]
                    total += ds + dr
                    alone += (ds if dr < MOVED else 0) + (dr if ds < MOVED else 0)
        result["variants"][v] = {
            "calls": len(ws),
            "median_s": statistics.median(times),
            "median_over_wire": statistics.median(times) / wire,
            "times_s": times,
            "spine_backlog_median_KB": statistics.median(max(p) for p in pairs) / 1e3 if pairs else None,
            "spine_other_direction_backlog_median_KB": statistics.median(min(p) for p in pairs) / 1e3
            if pairs
            else None,
            "spine_drops_per_call": drops,
            "node0_node2_bytes_sampled": total,
            "node0_node2_share_moved_one_way": alone / total if total else None,
        }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'variant':>12} {'median':>8} {'/wire':>6} {'spine queues':>14} {'drops':>6}  node 0↔2 bytes moved one way")
    for v, r in result["variants"].items():
        q = (
            "-"
            if not pairs
            else f"{r['spine_backlog_median_KB']:.0f}/{r['spine_other_direction_backlog_median_KB']:.0f} KB"
        )
        print(
            f"{v:>12} {r['median_s'] * 1e3:6.0f}ms {r['median_over_wire']:6.2f} {q:>14}"
            f" {r['spine_drops_per_call']:6.0f}"
            f"  {r['node0_node2_share_moved_one_way'] or 0:.0%} of {r['node0_node2_bytes_sampled'] / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
