"""One GPU, about ten minutes: the component figures the catalog borrows, measured on the device at hand.

* GEMM rate in bf16 and fp8 over the job's layer shapes (QKV, attention output, MLP up/down at its micro-batch
  tokens) and a square best-shape sweep: the best is the MAMF (maximum achievable matmul FLOP/s).
* Burst vs sustained clock: the same large bf16 GEMM in its first second and after ``sustain_s`` seconds of
  continuous load (the board power limit lowers the SM clock: MAMF vs MSMF).
* Fused attention (torch SDPA, flash backend) forward and forward+backward against sequence length, causal,
  head dim 128, FLOPs as the kernels' authors count them (4·s²·d per head forward, halved when causal;
  backward 2.5x the forward).
* HBM-bound elementwise passes: a copy and an add over 1 GiB tensors (bytes read + written / time).
* A profiled training step of a small transformer (torch.profiler chrome trace) for ``commtax trace``.

The results go to one JSON file naming the device, torch and CUDA versions and the date;
``commtax bench gpu-entries`` (``commtax.measure.sweep_entries``) turns it into catalog entries with that source.
Run it on the device: ``python -m commtax.measure.gpu_sweep --job JOB.yaml --out DIR``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from commtax.errors import SpecError
from commtax.measure.gemm import gemm_shapes

SQUARE = (2048, 4096, 6144, 8192)  # best-shape sweep edges (MAMF-style)
ATTN_SEQ = (1024, 2048, 4096, 8192, 16384)
ATTN_TOKENS = 16384  # batch × seq per attention call: the rate is per token budget, as FlashAttention's figures
HEAD_DIM = 128
ELEMENTWISE_BYTES = 1 << 30


def _timed(fn, iters: int, warmup: int = 3) -> float:
    """Mean seconds per call, CUDA events around ``iters`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _gemm_fn(m: int, n: int, k: int, dtype: str):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        return lambda: a @ b.t()
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return None
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def gemm_rows(shapes: dict[str, tuple[int, int, int]], dtypes=("bf16", "fp8"), iters: int = 20) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for name, (m, n, k) in shapes.items():
            fn = _gemm_fn(m, n, k, dtype)
            if fn is None:
                continue
            t = _timed(fn, iters)
            rows.append({"name": name, "dtype": dtype, "m": m, "n": n, "k": k, "tflops": 2 * m * n * k / t / 1e12})
    return rows


def clock_rows(sustain_s: float) -> dict[str, float]:
    """The same 8192³ bf16 GEMM: its rate in the first iterations (burst) and after ``sustain_s`` of load."""
    n = 8192
    fn = _gemm_fn(n, n, n, "bf16")
    flop = 2 * n**3
    burst = flop / _timed(fn, 20) / 1e12
    t_end = time.monotonic() + sustain_s
    while time.monotonic() < t_end:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
    sustained = flop / _timed(fn, 50, warmup=0) / 1e12
    return {"burst_tflops": burst, "sustained_tflops": sustained, "sustain_s": sustain_s}


def _attention_rate(s: int, heads: int) -> dict[str, float]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = max(1, ATTN_TOKENS // s)
    q, k, v = (
        torch.randn(b, heads, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    fwd_flop = 4 * s * s * HEAD_DIM * heads * b / 2  # causal: half the score matrix

    def fwd():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t_f = _timed(fwd, 10)
        grad = torch.randn_like(fwd())
        t_fb = _timed(lambda: torch.autograd.grad(fwd(), (q, k, v), grad), 10)
    return {"seq": s, "fwd_tflops": fwd_flop / t_f / 1e12, "bwd_tflops": 2.5 * fwd_flop / max(t_fb - t_f, 1e-9) / 1e12}


def attention_rows(seqs=ATTN_SEQ, heads: int = 16) -> list[dict]:
    return [_attention_rate(s, heads) for s in seqs]


def hbm_rows() -> dict[str, float]:
    n = ELEMENTWISE_BYTES // 2
    a = torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_()
    b, c = torch.empty_like(a), torch.empty_like(a).normal_()
    copy = 2 * ELEMENTWISE_BYTES / _timed(lambda: b.copy_(a), 20)
    add = 3 * ELEMENTWISE_BYTES / _timed(lambda: torch.add(a, c, out=b), 20)
    return {"copy_GBps": copy / 1e9, "add_GBps": add / 1e9}


def profiled_step(out: Path, hidden: int = 1024, layers: int = 2, seq: int = 2048) -> str:
    """One training step of a small transformer under torch.profiler; the chrome trace for ``commtax trace``."""
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(hidden, hidden // 64, 4 * hidden, batch_first=True), layers
    ).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4, seq, hidden, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        step()
        torch.cuda.synchronize()
    path = out / "trace.json"
    prof.export_chrome_trace(str(path))
    return path.name


def job_shapes(job_file: Path | None) -> dict[str, tuple[int, int, int]]:
    """The job's four layer GEMMs at its micro-batch tokens (per tensor-parallel rank), plus square best shapes."""
    shapes = {f"square_{n}": (n, n, n) for n in SQUARE}
    if job_file is not None:
        from commtax.spec import load_job

        job = load_job(job_file)
        tokens = job.micro_batch_tokens
        for name, (m, n, k) in gemm_shapes(job.model.hidden, tokens).items():
            # the TP shard: column-parallel layers split n, row-parallel ones split k
            shard = (m, n // job.plan.tp, k) if name in ("qkv", "mlp_up") else (m, n, k // job.plan.tp)
            shapes[f"{job.model.name}_{name}"] = shard
    return shapes


def run(job_file: Path | None, out: Path, sustain_s: float = 120.0) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise SpecError("gpu sweep: no CUDA device here; run it on the GPU machine (it measures that device)")
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": dt.date.today().isoformat(),
        "gemm": gemm_rows(job_shapes(job_file)),
        "clock": clock_rows(sustain_s),
        "attention": attention_rows(),
        "hbm": hbm_rows(),
        "trace": profiled_step(out),
    }
    (out / "gpu_sweep.json").write_text(json.dumps(results, indent=1))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", type=Path, default=None, help="job YAML whose layer GEMM shapes to measure")
    ap.add_argument("--out", type=Path, required=True, help="directory for gpu_sweep.json and trace.json")
    ap.add_argument("--sustain-s", type=float, default=120.0, help="seconds of load before the sustained rate")
    args = ap.parse_args(argv)
    try:
        r = run(args.job, args.out, args.sustain_s)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{r['device']}: wrote {args.out / 'gpu_sweep.json'} and {args.out / r['trace']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
