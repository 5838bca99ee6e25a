"""gloo all_to_all duplex probe, run by ``commtax cluster up`` on two nodes under torchrun.

gloo keeps one TCP connection per pair of ranks and, over it, sometimes moves the two directions in turns
(docs/remedies.md "gloo duplex": 2× at 2 ranks); with several connections on one node link the turns partly
overlap (docs/moe_bench.md "Why κ"). So the probe puts on one node link as many connections as the cluster's own
all_to_all does: ``c`` ranks on each of the two nodes, rank k exchanging only with rank k of the other node
(``all_to_all_single``, the same bytes each way, nothing inside a node), timed back to back as `commtax bench
collective` times (the slowest rank's median), on several process groups (each its own connections), their
mean. κ, the share of the lighter direction that does not overlap the heavier one (the ``reverse_share`` of
costs.collectives.link_time_s), is then t · B / (bytes one way) − 1 after one α, clipped to [0, 1].
Rank 0 writes one JSON object to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from commtax.measure.bench import init_distributed, time_op

CPU = torch.device("cpu")


def duplex_share(t_s: float, one_way_bytes: float, bw_bytes_per_s: float, latency_s: float) -> float:
    """κ from a symmetric exchange: t = α + (1 + κ) · bytes / B (link_time_s with out = in), solved for κ."""
    return min(1.0, max(0.0, (t_s - latency_s) * bw_bytes_per_s / one_way_bytes - 1.0))


def probe(per_pair: int, iters: int, groups: int = 1) -> list[float]:
    """Times of a partner-only all_to_all_single (local rank k ↔ local rank k of the other node), one per process
    group, each timed as ``commtax bench collective`` times every op (``bench.time_op``: back to back after one
    barrier, each rank's median, the slowest rank's): κ is what the link loses in the steady state the bench
    measures and `collective` predicts. Back to back, one call's tail overlaps the next call's start and gloo's
    turns line up worse than in an isolated call (on the 4 × 1 cluster: 1.6-1.9× the wire time against 1.25-1.3×
    barrier to barrier). Each group makes its own TCP connections, and which end of a connection sends first is
    settled when it is made (a 2- or 4-connection probe gave κ 0.04-0.66 from one set of connections to the next),
    so several groups sample that race: the bench's collective runs on connections of its own."""
    n, rank = dist.get_world_size(), dist.get_rank()
    c = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    partner = (rank + c) % n
    splits = [per_pair if j == partner else 0 for j in range(n)]
    a, b = torch.zeros(per_pair, dtype=torch.uint8), torch.zeros(per_pair, dtype=torch.uint8)
    out = []
    for _ in range(groups):
        g = dist.new_group(list(range(n)))  # fresh connections: a fresh draw of who sends first
        median_s, _ = time_op(lambda g=g: dist.all_to_all_single(b, a, splits, splits, group=g), 1, iters, CPU)
        out.append(median_s)
        dist.destroy_process_group(g)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m commtax.measure.a2a_probe")
    ap.add_argument("--bytes-one-way", type=int, required=True, help="bytes on the node link, each direction")
    ap.add_argument("--link-bit-s", type=float, required=True, help="the node link's rate per direction")
    ap.add_argument("--latency-us", type=float, required=True, help="one message step across the link (α)")
    ap.add_argument("--iters", type=int, default=5, help="timed calls per process group (their median)")
    ap.add_argument("--groups", type=int, default=5, help="process groups, each its own TCP connections")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    init_distributed("gloo", 30.0)
    c = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # connections on the node link
    per_pair = max(1, a.bytes_one_way // c)
    ts = probe(per_pair, a.iters, a.groups)
    t = sum(ts) / len(ts)  # the expectation over the race: what a collective on connections of its own should take
    B, one_way = a.link_bit_s / 8, c * per_pair
    if dist.get_rank() == 0:
        rec = {
            "connections": c,
            "bytes_one_way": one_way,
            "probe_s": t,
            "probe_s_per_group": ts,
            "wire_s": one_way / B,
            "gloo_a2a_duplex": round(duplex_share(t, one_way, B, a.latency_us * 1e-6), 3),
        }
        a.out.write_text(json.dumps(rec))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
