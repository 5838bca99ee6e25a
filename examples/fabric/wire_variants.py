"""What gloo's all_to_all does on the wire, 4 nodes × 1 rank under two leaves (docs/fabric.md "What the all_to_all
does on the wire"): the same bytes moved five ways, each call timed barrier to barrier on every rank.

* a2a: ``all_to_all_single``, S bytes per rank, S/4 to each peer (gloo: send to r+i, then recv from r−i);
* spine_a2a: the same call with only the cross-leaf chunks (the spine's traffic alone);
* spine_split: those chunks as isend/irecv, each direction of a pair on a process group of its own, so every TCP
  connection carries data one way only (no rendezvous turns);
* p2p_split: every pair's chunks that way;
* oneway: leaf 0 → leaf 1 only (the spine one way: its wire time).

Usage (under `commtax cluster run`): python wire_variants.py BYTES ITERS OUT_PREFIX [VARIANTS]; each rank writes
OUT_PREFIX_r<rank>.json: [{v, it, t0, t1}] (time.time(), the namespaces share the host's clock)."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    S, iters, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    g_up = dist.new_group(list(range(n)))  # lower rank -> higher rank
    g_down = dist.new_group(list(range(n)))  # higher rank -> lower rank
    chunk = S // n
    send, recv = torch.ones(S, dtype=torch.uint8), torch.empty(S, dtype=torch.uint8)

    def leaf(k: int) -> int:
        return k // 2

    def part(t: torch.Tensor, k: int) -> torch.Tensor:
        return t[k * chunk : (k + 1) * chunk]

    def split(peers: list[int]) -> None:
        reqs = [dist.isend(part(send, d), d, group=g_up if r < d else g_down) for d in peers]
        reqs += [dist.irecv(part(recv, s), s, group=g_up if s < r else g_down) for s in peers]
        for q in reqs:
            q.wait()

    def spine_a2a() -> None:
        sp = [chunk if leaf(d) != leaf(r) else 0 for d in range(n)]
        dist.all_to_all_single(recv[: sum(sp)], send[: sum(sp)], sp, sp)

    def oneway() -> None:
        reqs = [dist.isend(part(send, d), d) for d in range(n) if leaf(r) == 0 and leaf(d) == 1]
        reqs += [dist.irecv(part(recv, d), d) for d in range(n) if leaf(r) == 1 and leaf(d) == 0]
        for q in reqs:
            q.wait()

    variants = {
        "a2a": lambda: dist.all_to_all_single(recv, send),
        "spine_a2a": spine_a2a,
        "spine_split": lambda: split([d for d in range(n) if leaf(d) != leaf(r)]),
        "p2p_split": lambda: split([d for d in range(n) if d != r]),
        "oneway": oneway,
    }
    order = sys.argv[4].split(",") if len(sys.argv) > 4 else list(variants)
    rec = []
    for it in range(iters + 1):  # iteration 0 is a warm-up; variants interleaved so host load hits all alike
        for name in order:
            dist.barrier()
            t0 = time.time()
            variants[name]()
            rec.append({"v": name, "it": it, "t0": t0, "t1": time.time()})
    with open(f"{out}_r{r}.json", "w") as fh:
        json.dump(rec, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
