"""Why the quantized hooks exchange over one gloo connection per direction: 2 MiB each way between 2 ranks.

    sudo commtax cluster up --nodes 2 --link 100mbit --out c.yaml
    sudo commtax cluster run --cluster c.yaml -- python examples/remedies/gloo_duplex.py

Each row is the median of 7 runs, timed from a barrier to a barrier (both ranks done); the ring model of one
direction is 2 MiB / link rate (100 Mbit/s: 168 ms). gloo moves one message at a time per connection, so when both
ranks send at once over one group the directions take turns; with a second group each direction has its own.
"""

import statistics
import time

import torch
import torch.distributed as dist


def timed(fn, iters: int = 7) -> float:
    fn()
    ts = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def p2p(rank: int, n: int, full: torch.Tensor, out: torch.Tensor, segment: int | None = None, groups=None):
    """Send block p of ``full`` to every rank p and receive its block into ``out``, all at once; ``groups``:
    (up, down), the lower rank of a pair sending on ``up``, the higher on ``down``."""
    size = full.numel() // n

    def run():
        works = []
        for p in range(n):
            if p == rank:
                continue
            step = segment or size
            for o in range(0, size, step):
                send_group = (groups[0] if rank < p else groups[1]) if groups else None
                recv_group = (groups[0] if p < rank else groups[1]) if groups else None
                works.append(dist.isend(full[p * size + o : p * size + o + step], p, group=send_group))
                works.append(dist.irecv(out[p * size + o : p * size + o + step], p, group=recv_group))
        for w in works:
            w.wait()

    return run


def main() -> None:
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    up, down = dist.new_group(list(range(n))), dist.new_group(list(range(n)))
    N = 4 * 2**20  # bytes per rank; each rank keeps 1/n and sends the rest
    S = N // n
    full, out = torch.zeros(N, dtype=torch.uint8), torch.zeros(N, dtype=torch.uint8)
    rows = {
        "all_reduce fp32, 4 MiB (ring: 2 MiB each way, twice)": lambda: dist.all_reduce(full.view(torch.float32)),
        "all_to_all_single, equal splits": lambda: dist.all_to_all_single(out, full),
        "all_to_all_single, explicit splits": lambda: dist.all_to_all_single(out, full, [S] * n, [S] * n),
        "isend/irecv, one group": p2p(rank, n, full, out),
        "isend/irecv, one group, 64 KiB pieces": p2p(rank, n, full, out, 64 * 1024),
        "isend/irecv, one group per direction": p2p(rank, n, full, out, groups=(up, down)),
    }
    res = {name: timed(fn) for name, fn in rows.items()}
    if rank == 0:
        for name, t in res.items():
            print(f"{name:55s} {t * 1e3:8.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
