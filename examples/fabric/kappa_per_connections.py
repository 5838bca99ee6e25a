"""gloo all_to_all's duplex κ against the number of TCP connections on one node link (docs/fabric.md).

A 2-node emulated cluster at 200 Mbit/s; ``commtax.measure.a2a_probe`` (what `cluster up` runs) with c = 1..4 ranks
per node, rank k exchanging only with rank k of the other node, REPEATS times each. Root; about 15 s a repeat.
Usage: python examples/fabric/kappa_per_connections.py REPEATS OUT.json"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from commtax.measure.cluster import EmulatedCluster

RATE = 200e6


def probe(c: EmulatedCluster, conns: int) -> dict:
    one_way = int(min(16 * 2**20, max(2**20, RATE / 8 * 0.2)))  # as `cluster up`: 0.2 s at the link rate
    with tempfile.TemporaryDirectory(prefix=f"commtax-{c.name}-a2a-") as tmp:
        os.chmod(tmp, 0o755)
        out = Path(tmp) / "probe.json"
        cmd = ["timeout", "90", sys.executable, "-m", "commtax.measure.a2a_probe", "--bytes-one-way", str(one_way)]
        cmd += ["--link-bit-s", str(RATE), "--latency-us", "50", "--out", str(out)]
        rc = EmulatedCluster(2, conns, RATE, name=c.name).run(cmd, grace_s=5.0, log=lambda m: None)
        return json.loads(out.read_text()) if out.exists() else {"error": f"probe exited with code {rc}"}


def main(repeats: int, out: Path) -> None:
    c = EmulatedCluster(2, 1, RATE).up()
    try:
        runs = {conns: [probe(c, conns) for _ in range(repeats)] for conns in (1, 2, 3, 4)}
    finally:
        c.down()
    out.write_text(json.dumps({str(k): v for k, v in runs.items()}, indent=1) + "\n")
    for conns, rs in runs.items():
        print(conns, [r.get("gloo_a2a_duplex") for r in rs])


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
