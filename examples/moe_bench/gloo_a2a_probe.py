"""gloo ``all_to_all_single`` with uneven splits on the emulated cluster: what bounds its time (the data behind
the routed all-to-all model in docs/moe_bench.md). Run under `commtax cluster run` on 2 nodes × 2 ranks; rank 0
prints one line per traffic pattern: the time (median of 5, barrier to barrier) and the node-link bytes each way."""

import statistics
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
rpn = int(sys.argv[1]) if len(sys.argv) > 1 else 2  # ranks per node
C = 256 * 1024  # bytes: one unit of a pattern


def node(i: int) -> int:
    return i // rpn


def timed(fn, iters: int = 5) -> float:
    fn()
    ts = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run(mat: list[list[int]]) -> float:
    """mat[i][j]: units rank i sends rank j."""
    send = [mat[r][j] * C for j in range(n)]
    recv = [mat[j][r] * C for j in range(n)]
    a, b = torch.zeros(sum(send), dtype=torch.uint8), torch.zeros(sum(recv), dtype=torch.uint8)
    return timed(lambda: dist.all_to_all_single(b, a, recv, send))


def uniform(u):
    return [[0 if i == j else u for j in range(n)] for i in range(n)]


patterns = {
    "uniform 4": uniform(4),
    "uniform 8": uniform(8),
    "one way A->B 4": [[4 if node(i) == 0 and node(j) == 1 else 0 for j in range(n)] for i in range(n)],
    "A->B 4, B->A 1": [
        [4 if node(i) == 0 and node(j) == 1 else (1 if node(i) == 1 and node(j) == 0 else 0) for j in range(n)]
        for i in range(n)
    ],
    "A->B 4, B->A 2": [
        [4 if node(i) == 0 and node(j) == 1 else (2 if node(i) == 1 and node(j) == 0 else 0) for j in range(n)]
        for i in range(n)
    ],
    "one pair 0<->2 4 each": [[4 if {i, j} == {0, n - 1} else 0 for j in range(n)] for i in range(n)],
    "one pair 0->2 4": [[4 if (i, j) == (0, n - 1) else 0 for j in range(n)] for i in range(n)],
    "hot rank 3 (others send 8 to it, it sends 2)": [
        [0 if i == j else (8 if j == n - 1 else (2 if i == n - 1 else 2)) for j in range(n)] for i in range(n)
    ],
}
for name, mat in patterns.items():
    t = run(mat)
    ab = sum(mat[i][j] for i in range(n) for j in range(n) if node(i) == 0 and node(j) == 1) * C
    ba = sum(mat[i][j] for i in range(n) for j in range(n) if node(i) == 1 and node(j) == 0) * C
    if r == 0:
        print(f"{name:46s} {t * 1e3:8.1f} ms  A->B {ab / 1e6:6.3f} MB  B->A {ba / 1e6:6.3f} MB", flush=True)
dist.destroy_process_group()
