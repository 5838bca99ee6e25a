"""Achieved FLOP/s of transformer-shaped matmuls per dtype (feeds the compute-efficiency model).

For hidden size h and T tokens, the four GEMMs of a layer: QKV (T×h)·(h×3h), attention
output (T×h)·(h×h), MLP up (T×h)·(h×4h), MLP down (T×4h)·(4h×h); FLOP = 2·m·n·k.
"""

from __future__ import annotations

import time

import torch

from commtax.measure.bench import DTYPES

LAYER_GEMMS = {"qkv": (1, 3), "attn_out": (1, 1), "mlp_up": (1, 4), "mlp_down": (4, 1)}  # (k/h, n/h)


def gemm_shapes(hidden: int, tokens: int) -> dict[str, tuple[int, int, int]]:
    """name → (m, n, k) for one transformer layer."""
    return {name: (tokens, nh * hidden, kh * hidden) for name, (kh, nh) in LAYER_GEMMS.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_gemm(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, warmup: int, iters: int) -> float:
    """Mean seconds of one (m×k)·(k×n) matmul after warm-up."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    for _ in range(warmup):
        torch.matmul(a, b)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b)
    _sync(device)
    return (time.perf_counter() - t0) / iters


def gemm_sweep(hiddens: list[int], tokens: int, dtypes: list[str], warmup: int, iters: int) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = []
    for dtype in dtypes:
        for h in hiddens:
            for name, (m, n, k) in gemm_shapes(h, tokens).items():
                t = time_gemm(m, n, k, DTYPES[dtype], device, warmup, iters)
                flop = 2 * m * n * k  # multiply + add per term
                out.append(
                    {
                        "op": "gemm",
                        "impl": "torch",
                        "backend": device.type,
                        "world_size": 1,
                        "name": name,
                        "m": m,
                        "n": n,
                        "k": k,
                        "dtype": dtype,
                        "time_s": t,
                        "flop": flop,
                        "tflops": flop / t / 1e12,
                    }
                )
    return out
