"""gloo all_to_all, all_gather and all_reduce against the bus-bandwidth wire time, on n ranks (the data behind
"Not done" in docs/remedies.md). Run under `commtax cluster run`; results/gloo_collectives_4nodes_100mbit.txt."""

import torch
import torch.distributed as dist
from gloo_duplex import timed  # this folder: python puts the script's folder on the path

dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()


res = {}
for N in (2 * 2**20, 8 * 2**20):
    full = torch.zeros(N, dtype=torch.uint8)
    out = torch.zeros_like(full)
    part = torch.zeros(N // n, dtype=torch.uint8)
    f32 = torch.zeros(N // 4)
    res[f"a2a {N >> 20}MiB"] = timed(lambda out=out, full=full: dist.all_to_all_single(out, full))
    res[f"ag_into {N >> 20}MiB"] = timed(lambda out=out, part=part: dist.all_gather_into_tensor(out, part))
    res[f"ag list {N >> 20}MiB"] = timed(lambda out=out, part=part: dist.all_gather(list(out.chunk(n)), part))
    res[f"ar {N >> 20}MiB"] = timed(lambda f32=f32: dist.all_reduce(f32))
    res[f"bus wire {N >> 20}MiB"] = (n - 1) / n * N / 12.5e6
    res[f"bus wire ar {N >> 20}MiB"] = 2 * (n - 1) / n * N / 12.5e6
if r == 0:
    for k, v in res.items():
        print(f"n={n} {k:22s} {v * 1e3:8.1f} ms")
dist.destroy_process_group()
