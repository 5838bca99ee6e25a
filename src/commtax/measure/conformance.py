"""Check our collective algorithms against torch.distributed's own, on every rank.

Runs inside an initialised process group (torchrun, ``commtax cluster run`` or
``spawn_check``): ``python -m commtax.measure.conformance`` under torchrun prints failures and
exits 1 if any. Sums must match ``dist.all_reduce``: exactly for integers, allclose for floats.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist

from commtax.measure import algorithms
from commtax.measure.schedules import ALGORITHMS, chunk_bounds

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}  # (rtol, atol) for float sums


def _data(numel: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    return torch.randint(-(2**40), 2**40, (numel,), generator=g, dtype=dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    if not got.dtype.is_floating_point or want.numel() == 0:
        return torch.equal(got, want)
    rtol, atol = TOLERANCE[got.dtype]
    return torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol * max(1.0, want.float().abs().max().item()))


def sizes_for(dtype: torch.dtype, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """fp32 gets every size; bf16 and int64 the tiny, the uneven and the large ones (keeps the 8-rank run short)."""
    if dtype == torch.float32 or len(sizes) <= 2:
        return sizes
    return tuple(s for s in sizes if s == 1 or s == max(sizes) or s % 2 == 1 and s > 10)


def check_all(sizes: tuple[int, ...], per_node: int = 1) -> list[str]:
    """Every algorithm × dtype × size against the library; returns failure descriptions (empty = all good)."""
    n, r = dist.get_world_size(), dist.get_rank()
    algs = [a for a in ALGORITHMS if a != "hierarchical" or (n % per_node == 0 and per_node > 1)]
    failures = []
    for dtype in DTYPES:
        for numel in sizes_for(dtype, sizes):
            x = _data(numel, dtype, r)
            want = x.clone()
            dist.all_reduce(want)
            for alg in algs:
                got = algorithms.all_reduce(x.clone(), alg, per_node)
                if not _same(got, want):
                    failures.append(f"all_reduce {alg} {dtype} numel={numel} n={n}")
            b = chunk_bounds(0, numel, n)
            got_rs = algorithms.reduce_scatter(x.clone())
            if not _same(got_rs, want[b[r] : b[r + 1]]):
                failures.append(f"reduce_scatter ring {dtype} numel={numel} n={n}")
            full = torch.cat([_data(numel, dtype, k)[b[k] : b[k + 1]] for k in range(n)])
            got_ag = algorithms.all_gather(torch.zeros_like(x), x[b[r] : b[r + 1]])
            if not torch.equal(got_ag, full):
                failures.append(f"all_gather ring {dtype} numel={numel} n={n}")
    return failures


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, port: int, sizes: tuple[int, ...], per_node: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        failures = check_all(sizes, per_node)
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
            f.write("\n".join(failures))
    finally:
        dist.destroy_process_group()


def spawn_check(world: int, sizes: tuple[int, ...], per_node: int, out_dir: str) -> list[str]:
    """Spawn ``world`` gloo ranks on this machine, run ``check_all``; returns every rank's failures."""
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(world, _free_port(), sizes, per_node, out_dir), nprocs=world, join=True)
    failures = []
    for rank in range(world):
        with open(os.path.join(out_dir, f"rank{rank}.txt")) as f:
            failures += [f"rank {rank}: {line}" for line in f.read().splitlines() if line]
    return failures


def main() -> int:
    dist.init_process_group("gloo")
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    failures = check_all((1, 7, 1000, 1 << 18), per_node)
    dist.destroy_process_group()
    for line in failures:
        print(f"rank {os.environ.get('RANK')}: FAIL {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
