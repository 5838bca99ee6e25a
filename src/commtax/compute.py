"""Time of one compute op: a roofline with an efficiency that depends on the op's shape.

GEMMs: t = max(F / (P·η(m,n,k)), bytes / (B_mem·η_mem)), where η = η_max(precision) ×
tile/wave quantisation × a short-k penalty. η_max comes from the GPU catalog entry (sourced);
quantisation follows how CUTLASS/cuBLAS tile a GEMM into thread-block tiles that run in
waves over the SMs (NVIDIA "Matrix Multiplication Background" user guide, §"Tile / Wave
Quantization"). Attention is FlashAttention at the catalog's ``attention_efficiency`` of the
bf16/fp16 peak (fp8 runs keep attention in bf16, as Transformer Engine 1.x does).
Memory-bound ops run at ``MEMORY_EFFICIENCY`` of HBM bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commtax.spec import GPU, Cluster
from commtax.workload import Compute

TILE = 128  # thread-block tile edge (CUTLASS/cuBLAS default for large bf16 GEMMs on Ampere/Hopper)
K_HALF = 96  # k at which prologue/epilogue cost halves the main-loop efficiency share: η_k = k / (k + K_HALF)
MEMORY_EFFICIENCY = 0.80  # achieved / peak HBM bandwidth of fused elementwise kernels (STREAM-like copies reach ~0.9)
KERNEL_OVERHEAD_S = 3e-6  # launch + tail of one kernel on a busy stream (CUDA Programming Guide, async launch ~2-5 µs)


@dataclass(frozen=True)
class ComputeModel:
    """Per-GPU compute-speed parameters resolved once per job (calibratable)."""

    peak_flops: float  # at the training precision
    attention_peak_flops: float
    matmul_eff: float
    attention_eff: float
    mem_bw_bytes_per_s: float
    sms: int


def compute_model(cluster: Cluster, precision: str) -> ComputeModel:
    gpu: GPU = cluster.gpu
    attn_precision = "bf16" if precision in ("fp8", "int8") and "bf16" in gpu.peak_tflops else precision
    eff = gpu.matmul_eff(precision)
    prof = cluster.profile
    if prof is not None and prof.gemm_efficiency:
        eff = prof.gemm_efficiency.get(precision, prof.gemm_efficiency.get("default", eff))
    return ComputeModel(
        peak_flops=gpu.peak_flops(precision),
        attention_peak_flops=gpu.peak_flops(attn_precision),
        matmul_eff=eff,
        attention_eff=gpu.attention_efficiency,
        mem_bw_bytes_per_s=gpu.mem_bw_bytes_per_s * MEMORY_EFFICIENCY,
        sms=gpu.sms,
    )


def quantisation_efficiency(m: int, n: int, sms: int) -> float:
    """Useful / issued tile work: partial edge tiles, and a last wave that leaves SMs idle."""
    tiles_m, tiles_n = math.ceil(m / TILE), math.ceil(n / TILE)
    tile_eff = (m * n) / (tiles_m * TILE * tiles_n * TILE)
    tiles = tiles_m * tiles_n
    waves = math.ceil(tiles / sms)
    wave_eff = tiles / (waves * sms)
    return tile_eff * wave_eff


K_REF = 4096  # k at which a GEMM reaches the catalog efficiency (the sweeps the catalog cites use k ≥ 4096)


def short_k_efficiency(k: int) -> float:
    """Main-loop share of a tile's time, k/(k + K_HALF), normalised to 1 at k ≥ K_REF."""
    return min(1.0, (k / (k + K_HALF)) / (K_REF / (K_REF + K_HALF)))


def gemm_efficiency(cm: ComputeModel, m: int, n: int, k: int) -> float:
    return cm.matmul_eff * quantisation_efficiency(m, n, cm.sms) * short_k_efficiency(k)


def op_time(cm: ComputeModel, op: Compute) -> float:
    """Seconds for one compute op on one GPU."""
    t_mem = op.bytes / cm.mem_bw_bytes_per_s
    if op.kind == "gemm":
        t_flop = op.flop / (cm.peak_flops * gemm_efficiency(cm, op.m, op.n, op.k))
        return max(t_flop, t_mem) + KERNEL_OVERHEAD_S
    if op.kind == "attention":
        return max(op.flop / (cm.attention_peak_flops * cm.attention_eff), t_mem) + KERNEL_OVERHEAD_S
    return t_mem + KERNEL_OVERHEAD_S
