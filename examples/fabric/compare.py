"""Measured (bench JSON) against predicted (`commtax collective OP --bytes B --cluster C --json`) per run of measure.sh.

Usage: python compare.py WORK_DIR OUT.json -- WORK_DIR holds bench_<label>.json and cluster_<label>.yaml pairs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def predicted(op: str, nbytes: int, cluster: Path, at: float) -> dict:
    """`commtax collective` at the moment the bench ran (``--at``: the background flows alive then)."""
    cmd = [sys.executable, "-m", "commtax.cli", "collective", op, "--bytes", str(nbytes), "--cluster", str(cluster)]
    cmd += ["--at", str(at)]
    return json.loads(subprocess.run([*cmd, "--json"], check=True, capture_output=True, text=True).stdout)


def tc_drops(path: Path) -> int | None:
    """Packets every shaped link dropped, summed over the namespaces' qdiscs (``tc -s qdisc show`` dumps)."""
    if not path.exists():
        return None
    return sum(int(m) for m in re.findall(r"dropped (\d+)", path.read_text()))


def main(work: Path, out: Path) -> None:
    rows = []
    for bench in sorted(work.glob("bench_*.json")):
        label = bench.stem.removeprefix("bench_")
        load = work / f"load_{label}.txt"  # measure.sh: the 1-minute load average before and after the case
        loads = [float(x) for x in load.read_text().split()] if load.exists() else []
        before, after = (tc_drops(work / f"tc_{label}_{w}.txt") for w in ("before", "after"))
        drops = after - before if before is not None and after is not None else None
        for r in json.loads(bench.read_text()):
            p = predicted(r["op"], r["message_bytes"], work / f"cluster_{label}.yaml", r["unix_time"])
            rows.append(
                {
                    "background": label,
                    "op": r["op"],
                    "message_bytes": r["message_bytes"],
                    "measured_s": r["time_s"],
                    "predicted_s": p["time_s"],
                    "ratio": r["time_s"] / p["time_s"],
                    "round_times_s": r.get("round_times_s"),  # bench --rounds: each round's time (time_s: their mean)
                    "binding_link": p.get("binding_link", ""),
                    "gloo_a2a_duplex": p.get("gloo_a2a_duplex"),  # κ the prediction used (all_to_all; None: unmeasured)
                    # gloo on the fabric: the luckiest and unluckiest entry order's time (costs/rendezvous.py)
                    "rendezvous_range_s": p.get("rendezvous_range_s"),
                    "load_before_after": loads,
                    "tc_drops": drops,  # packets the shaped links dropped during the case (both ops, all sizes)
                }
            )
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{'background':>10} {'op':>10} {'MiB':>4} {'measured':>9} {'predicted':>9} {'ratio':>6}  binding link")
    for r in rows:
        print(
            f"{r['background']:>10} {r['op']:>10} {r['message_bytes'] / 2**20:4.0f} {r['measured_s'] * 1e3:7.0f}ms "
            f"{r['predicted_s'] * 1e3:7.0f}ms {r['ratio']:6.2f}  {r['binding_link']}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
