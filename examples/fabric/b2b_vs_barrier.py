"""gloo's all_to_all on the 4 × 1 cluster timed two ways (docs/fabric.md "Back to back"): calls back to back, as
`bench collective` times them, and each call after a barrier. Every rank stamps each call's entry and exit.

Usage (under `commtax cluster run`): python b2b_vs_barrier.py OUT_PREFIX [MIB,...]; each rank writes
OUT_PREFIX_r<rank>.json: [{mib, mode, it, t0, t1}] (time.time(): the namespaces share the host's clock); then
python b2b_vs_barrier.py --summary OUT_PREFIX RATE_BIT_S OUT.json: per size and mode, the slowest rank's median
(back to back: period; barrier: call) over the spine's wire time S / B."""

from __future__ import annotations

import json
import statistics
import sys
import time


def measure(out: str, sizes: list[int]) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r = dist.get_rank()
    rec = []
    for mib in sizes:
        send, recv = torch.ones(mib << 20, dtype=torch.uint8), torch.empty(mib << 20, dtype=torch.uint8)
        for mode in ("b2b", "barrier"):
            for _ in range(2):  # warm-up
                dist.all_to_all_single(recv, send)
            dist.barrier()
            for it in range(16 if mib < 32 else 8):
                if mode == "barrier":
                    dist.barrier()
                t0 = time.time()
                dist.all_to_all_single(recv, send)
                rec.append({"mib": mib, "mode": mode, "it": it, "t0": t0, "t1": time.time()})
    with open(f"{out}_r{r}.json", "w") as fh:
        json.dump(rec, fh)
    dist.barrier()
    dist.destroy_process_group()


def summary(prefix: str, rate_bit_s: float, ranks: int = 4) -> dict:
    recs = [json.load(open(f"{prefix}_r{r}.json")) for r in range(ranks)]
    out = {}
    for mib in sorted({x["mib"] for x in recs[0]}):
        wire = (mib << 20) / (rate_bit_s / 8)  # the spine's one direction carries S per call
        for mode in ("b2b", "barrier"):
            rows = [[x for x in recs[r] if x["mib"] == mib and x["mode"] == mode] for r in range(ranks)]
            if mode == "b2b":  # bench.time_op: periods between successive ends
                each = [[b["t1"] - a["t1"] for a, b in zip(rw, rw[1:])] for rw in rows]
            else:
                each = [[x["t1"] - x["t0"] for x in rw] for rw in rows]
            out[f"{mib}MiB_{mode}"] = round(max(statistics.median(e) for e in each) / wire, 3)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        res = summary(sys.argv[2], float(sys.argv[3]))
        with open(sys.argv[4], "w") as fh:
            json.dump(res, fh, indent=1)
        print(res)
    else:
        measure(sys.argv[1], [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "4,8,32").split(",")])
