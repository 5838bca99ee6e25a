"""Time of one compute op: a roofline whose efficiency comes from component-level data, by op kind.

* GEMMs: t = max(F / (P·η(m,n,k,dtype)), bytes / (B_mem·η_mem)). η = η_max(dtype) × tile/wave quantisation ×
  a short-k loss. η_max is the GPU's maximum achievable matmul rate (catalog, MAMF sweeps); quantisation follows
  how cuBLAS/CUTLASS tile a GEMM into thread-block tiles that run in waves over the SMs (NVIDIA "Matrix
  Multiplication Background" guide, "Tile / Wave Quantization"); the short-k loss is the tile's fixed
  prologue/epilogue against its main loop, k/(k + k_half), with k_half doubled for fp8 (a 2× faster main loop).
* Attention: the kernel's measured forward/backward rate against sequence length and head dim
  (catalog/attention.yaml: FlashAttention-2/-3, cuDNN, Triton; Dao 2023, Shah et al. 2024), scaled to this
  GPU's bf16 peak. Eager attention: two batched GEMMs at GEMM efficiency, its scores through HBM.
* Memory-bound ops (norms, activations, softmax, cross-entropy, Adam, fp8 casts) at ``memory_efficiency`` of
  HBM bandwidth.
* Every kernel costs ``kernel_gap_s`` on the GPU; an op of k kernels never takes less than k × ``cpu_op_s``,
  the host's time to issue them (small models and eager frameworks are launch-bound).
* GEMM rates scale with ``gpu.clock_fraction``, the sustained clock under the power limit (a power-capped GPU:
  a custom peak); the attention tables are measured rates under load already.
* Communication that overlaps compute is not free (``overlap_slowdown_s``): its kernels hold SMs (NCCL: one CTA per
  channel; Transformer Engine userbuffers: its configured ``num_sm``) and move their data through HBM while the
  compute runs.

Constants live in catalog/assumptions.yaml (``commtax.spec.assumptions``), each with its source.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from commtax.costs.elementwise import minimum, where
from commtax.spec import CATALOG_DIR, GPU, Cluster, read_catalog_yaml
from commtax.spec.assumptions import Assumptions, assumptions_for
from commtax.spec.wire_dtypes import CONVERT_BYTES
from commtax.units import TFLOPS
from commtax.workload.step import Compute

ATTENTION_FILE = CATALOG_DIR / "attention.yaml"
HOPPER = "hopper"
# fused attention kernels are compiled for head dims 32, 64, 96, ..., 256 and pad the others up to the next one
# (Dao-AILab/flash-attention csrc/flash_attn/src: flash_fwd_hdim{32,64,96,128,160,192,224,256} instantiations)
HEAD_DIM_STEP = 32
# query and key block of the fused attention kernels at head dim <= 128 (FlashAttention-2/-3 kBlockM = kBlockN = 128
# on sm80/sm90 forward): a causal or banded pass computes whole blocks, the masked-out parts of diagonal ones too
ATTENTION_BLOCK = 128


@dataclass(frozen=True)
class ComputeModel:
    """Per-GPU compute-speed parameters resolved once per job (calibratable)."""

    peak_flops: float  # tensor-core peak at the training precision, × the GPU's sustained clock fraction
    attention_peak_flops: float  # datasheet bf16/fp16 peak the attention tables scale by (fp8 runs keep attention bf16)
    matmul_eff: float  # η_max at the training precision
    mem_bw_bytes_per_s: float  # achieved HBM bandwidth of elementwise kernels
    sms: int
    arch: str = HOPPER
    tile: int = 128
    k_half: float = 96.0  # at the training precision (fp8: × fp8_k_half_factor)
    k_ref: float = 4096.0
    kernel_gap_s: float = 3e-6
    cpu_op_s: float = 5e-6
    bf16_matmul_eff: float = 0.0  # η_max of bf16 GEMMs (eager attention in fp8 runs); 0 -> matmul_eff
    # fp8 runs: the rate of their GEMMs with bf16 inputs (LM head, router), × the clock fraction;
    # 0 -> every GEMM at the training precision (bf16/fp16/fp32 runs, and int8 ones, whose GEMMs carry no fp8 flag)
    bf16_peak_flops: float = 0.0
    bf16_k_half: float = 0.0  # k_half of a bf16 main loop (fp8 runs' bf16 GEMMs); 0 -> k_half
    # least time of one expert's GEMM in TE's multi-stream grouped GEMM, by GPU generation (catalog/grouped_gemm.yaml)
    expert_gemm_floor_s: float = 0.0
    nccl_sms: float = 24.0  # SMs an NCCL collective holds while it runs (one CTA per channel)
    userbuffers_sms: float = 8.0  # SMs a comm-GEMM overlap (TE userbuffers) collective holds, mean per collective
    comm_hbm_bytes_per_wire_byte: float = 3.0  # HBM traffic of a collective per byte it puts on the wire
    # dtype conversions slower than the memory stream (GPU.convert_Gelem_s), elements/s
    convert_elems_per_s: tuple[tuple[str, float], ...] = ()

    def __hash__(self) -> int:
        """The fields' hash, computed once: every op time is cached under (model, op) (``estimate.Costs``)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}  # str hashes differ between processes


def compute_model(cluster: Cluster, precision: str, assumptions: Assumptions | None = None) -> ComputeModel:
    gpu: GPU = cluster.gpu
    a = assumptions or assumptions_for(cluster.profile)
    attn_precision = "bf16" if precision in ("fp8", "int8") and "bf16" in gpu.peak_tflops else precision
    eff = gpu.matmul_eff(precision)
    prof = cluster.profile
    bf16_eff = gpu.matmul_eff(attn_precision)
    if prof is not None and prof.gemm_efficiency:
        eff = prof.gemm_efficiency.get(precision, prof.gemm_efficiency.get("default", eff))
        if precision == "fp8":  # an fp8 run's bf16 GEMMs at the profile's measured bf16 rate, where it has one
            bf16_eff = prof.gemm_efficiency.get(attn_precision, bf16_eff)
    k_half = a.v("gemm_k_half") * (a.v("fp8_k_half_factor") if precision in ("fp8", "int8") else 1.0)
    return ComputeModel(
        peak_flops=gpu.peak_flops(precision) * clock_fraction(gpu, a),
        attention_peak_flops=gpu.peak_flops(attn_precision),
        matmul_eff=eff,
        mem_bw_bytes_per_s=gpu.mem_bw_bytes_per_s * a.v("memory_efficiency"),
        sms=gpu.sms,
        arch=gpu.arch,
        tile=int(a.v("gemm_tile")),
        k_half=k_half,
        k_ref=a.v("gemm_k_ref"),
        kernel_gap_s=a.v("kernel_gap_s"),
        cpu_op_s=a.v("cpu_op_s"),
        bf16_matmul_eff=bf16_eff,
        bf16_peak_flops=gpu.peak_flops(attn_precision) * clock_fraction(gpu, a) if precision == "fp8" else 0.0,
        bf16_k_half=a.v("gemm_k_half"),
        expert_gemm_floor_s=grouped_gemm_floor_s(gpu.arch),
        nccl_sms=_comm_sms(cluster, a),
        userbuffers_sms=a.v("userbuffers_sms"),
        comm_hbm_bytes_per_wire_byte=a.v("comm_hbm_bytes_per_wire_byte"),
        convert_elems_per_s=tuple((k, v * 1e9) for k, v in sorted(gpu.convert_Gelem_s.items())),
    )


def _comm_sms(cluster: Cluster, a: Assumptions) -> float:
    """Compute units a collective holds while it runs: NCCL one CTA per channel (src/enqueue.cc); gloo none — it
    runs on host threads (TCP sends, its sums), whose memory traffic ``overlap_slowdown_s``'s HBM term prices."""
    if cluster.collective_library == "gloo":
        return 0.0
    return a.v("nccl_ctas_nvlink") if cluster.intra_node.kind in ("nvlink", "xgmi") else a.v("nccl_ctas_pcie")


def clock_fraction(gpu: GPU, a: Assumptions) -> float:
    """Sustained / datasheet-peak SM clock: the GPU entry's, else the Hopper assumption, else 1."""
    if gpu.clock_fraction is not None:
        return gpu.clock_fraction
    return a.v("hopper_clock_fraction") if gpu.arch == HOPPER else 1.0


def quantisation_efficiency(m: int, n: int, sms: int, tile: int = 128, groups: int = 1) -> float:
    """Useful / issued tile work: partial edge tiles, and a last wave that leaves SMs idle. A grouped GEMM
    (CUTLASS grouped GEMM, TE GroupedLinear for MoE experts) tiles each of its ``groups`` problems on its own and
    runs all their tiles in one grid."""
    tiles_m, tiles_n = math.ceil(m / tile), math.ceil(n / tile)
    tile_eff = (m * n) / (tiles_m * tile * tiles_n * tile)
    tiles = tiles_m * tiles_n * groups
    waves = math.ceil(tiles / sms)
    wave_eff = tiles / (waves * sms)
    return tile_eff * wave_eff


def short_k_efficiency(k: int, k_half: float = 96.0, k_ref: float = 4096.0) -> float:
    """Main-loop share of a tile's time, k/(k + k_half), normalised to 1 at k ≥ k_ref."""
    return min(1.0, (k / (k + k_half)) / (k_ref / (k_ref + k_half)))


def gemm_efficiency(cm: ComputeModel, m: int, n: int, k: int, groups: int = 1, bf16: bool = False) -> float:
    """η of one GEMM at the training precision, or (``bf16``) at the bf16 rate: bf16 η_max and the short-k
    loss of a main loop at the bf16 speed (k_half not doubled)."""
    eff_max, k_half = cm.matmul_eff, cm.k_half
    if bf16:
        eff_max, k_half = cm.bf16_matmul_eff or cm.matmul_eff, cm.bf16_k_half or cm.k_half
    return eff_max * quantisation_efficiency(m, n, cm.sms, cm.tile, groups) * short_k_efficiency(k, k_half, cm.k_ref)


# ----------------------------------------------------------------------------- attention kernel tables
@lru_cache(maxsize=1)
def attention_tables() -> dict[str, Any]:
    return read_catalog_yaml(ATTENTION_FILE)


def _interp_log(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear in log2(x) between measured points; clamped to the end points."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1 = math.log2(xs[i - 1]), math.log2(xs[i])
    w = (math.log2(x) - x0) / (x1 - x0)
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


def _head_dim_factor(kernel: str, head_dim: int) -> float:
    f = attention_tables()["head_dim_factor"].get(kernel, {128: 1.0})
    dims = sorted(int(d) for d in f)
    vals = [f[d] for d in dims]
    if head_dim <= dims[0]:
        return vals[0]
    if head_dim >= dims[-1]:
        return vals[-1]
    i = bisect.bisect_right(dims, head_dim)
    w = (head_dim - dims[i - 1]) / (dims[i] - dims[i - 1])
    return vals[i - 1] + w * (vals[i] - vals[i - 1])


def _attention_table(kernel: str, arch: str) -> tuple[str, dict]:
    """(kernel whose numbers apply, its table) for this architecture."""
    tables = attention_tables()
    kernels, fallback = tables["kernels"], tables.get("fallback", {})
    name = kernel
    while arch not in kernels.get(name, {}) and name in fallback:
        name = fallback[name]
    if arch in kernels.get(name, {}):
        return name, kernels[name][arch]
    name = kernel if HOPPER in kernels.get(kernel, {}) else "fa2"  # an architecture without tables: Hopper's
    return name, kernels[name][HOPPER]


def causal_block_share(keys: float, block: int = ATTENTION_BLOCK) -> float:
    """Useful share of the blocks a causal kernel computes over ``keys`` keys, n = keys/block query blocks:
    n²/2 useful of n(n+1)/2 computed (the diagonal blocks are computed whole), n/(n + 1). A sliding window of w
    keys computes w/block + 1 blocks per query block for w/block useful ones: the same share at ``keys`` = w."""
    n = keys / block
    return n / (n + 1.0)


@lru_cache(maxsize=4096)
def attention_efficiency(kernel: str, arch: str, seq: int, head_dim: int, backward: bool) -> float:
    """Fraction of the bf16 peak a fused attention kernel reaches (measured tables, catalog/attention.yaml).

    The kernel's table for this architecture, else its fallback kernel's (FA3 is Hopper-only: FA2 elsewhere),
    else the Hopper table, as a fraction of the table's reference peak; sequence by log-linear interpolation,
    head dim by the kernel's head-dim factor at the padded head dim, times the useful share d / padded d.
    """
    name, entry = _attention_table(kernel, arch)
    rate = _interp_log(entry["seq"], entry["bwd" if backward else "fwd"], seq)
    if seq < entry["seq"][0]:  # shorter than the table: fewer useful blocks per computed one
        rate *= causal_block_share(seq) / causal_block_share(entry["seq"][0])
    padded = HEAD_DIM_STEP * math.ceil(head_dim / HEAD_DIM_STEP)
    return rate / entry["ref_peak_tflops"] * _head_dim_factor(name, padded) * head_dim / padded


def _eager_attention_time(cm: ComputeModel, op: Compute) -> float:
    """Unfused attention: QKᵀ (s×S×d) and PV (s×d×S) as batched GEMMs on the tensor cores, the tiles of all
    (batch, head) pairs filling the waves together (``op.m`` counts their query rows); backward runs 2.5× the
    work at the same efficiency. The GEMMs' score traffic is in ``op.bytes`` (roofline), softmax/dropout passes
    are separate memory ops (workload)."""
    rows, kv, d = op.m, op.n, op.k
    eff_qk = quantisation_efficiency(rows, kv, cm.sms, cm.tile) * short_k_efficiency(d, cm.k_half, cm.k_ref)
    eff_pv = quantisation_efficiency(rows, d, cm.sms, cm.tile) * short_k_efficiency(kv, cm.k_half, cm.k_ref)
    eta = (cm.bf16_matmul_eff or cm.matmul_eff) * 2 / (1 / eff_qk + 1 / eff_pv)
    return op.flop / (cm.attention_peak_flops * eta)


@lru_cache(maxsize=1024)
def mxfp8_attention_ratio(kernel: str, arch: str, seq: int, head_dim: int, backward: bool) -> float:
    """Time of the kernel's MXFP8 fused attention over its BF16 time at the same shape (catalog/attention.yaml
    ``mxfp8_time_ratio``, measured with cuDNN 9.22 on GB200): the nearest measured head dim, log-linear in the
    sequence length between the measured ones, clamped at the ends. 1 where nothing is measured (the plan refuses
    fp8 attention there: spec/job.py)."""
    entry = (attention_tables().get("mxfp8_time_ratio", {}).get(kernel) or {}).get(arch)
    if not entry:
        return 1.0
    dims = sorted(int(d) for d in entry["head_dim"])
    nearest = min(dims, key=lambda d: (abs(d - head_dim), d))
    return _interp_log(entry["seq"], entry["head_dim"][nearest]["bwd" if backward else "fwd"], seq)


def attention_time(cm: ComputeModel, op: Compute) -> float:
    if op.kernel == "eager":
        return _eager_attention_time(cm, op)
    eff = attention_efficiency(op.kernel or "fa2", cm.arch, op.n, op.k, op.backward)
    t = op.flop / (cm.attention_peak_flops * eff)
    # fp8 attention (plan.fp8_attention: Transformer Engine's MXFP8 dot-product attention): the measured MXFP8 / BF16
    # time of the same kernel and shape
    return t * mxfp8_attention_ratio(op.kernel or "fa2", cm.arch, op.n, op.k, op.backward) if op.fp8 else t


def launch_floor(cm: ComputeModel, t_gpu: float, kernels: int) -> float:
    """GPU time plus the gap each kernel leaves, but never less than the host needs to issue the kernels."""
    return max(t_gpu + kernels * cm.kernel_gap_s, kernels * cm.cpu_op_s)


@lru_cache(maxsize=16)
def grouped_gemm_floor_s(arch: str) -> float:
    """Least time of one expert's GEMM in TE's multi-stream grouped GEMM on a GPU generation (catalog/grouped_gemm.yaml:
    SM100 from TE PR #3134, SM90 from TE PR #2045; other generations the fallback's)."""
    data = read_catalog_yaml(CATALOG_DIR / "grouped_gemm.yaml")
    floors = data["per_expert_gemm_s"]
    return float(floors.get(arch, floors[data["fallback"]]))


def op_time(cm: ComputeModel, op: Compute) -> float:
    """Seconds for one compute op on one GPU."""
    t_mem = op.bytes / cm.mem_bw_bytes_per_s
    if op.kind == "gemm":
        bf16 = cm.bf16_peak_flops > 0.0 and not op.fp8  # bf16 inputs in an fp8 run: the bf16 tensor-core rate
        peak = cm.bf16_peak_flops if bf16 else cm.peak_flops
        t_flop = op.flop / (peak * gemm_efficiency(cm, op.m, op.n, op.k, op.groups, bf16))
        t = launch_floor(cm, max(t_flop, t_mem), op.kernels)
        # MoE experts (``groups`` > 1, one kernel per expert): TE's per-expert GEMM loop has a floor per expert
        return max(t, op.kernels * cm.expert_gemm_floor_s) if op.groups > 1 else t
    if op.kind == "attention":
        return launch_floor(cm, max(attention_time(cm, op), t_mem), op.kernels)
    if op.convert:
        return launch_floor(cm, max(t_mem, convert_time(cm, op)), op.kernels)
    return launch_floor(cm, t_mem, op.kernels)


def convert_time(cm: ComputeModel, op: Compute) -> float:
    """Elements / the device's conversion rate, where it lists one (else 0: the conversion streams with memory)."""
    rate = dict(cm.convert_elems_per_s).get(op.convert)
    return op.bytes / CONVERT_BYTES / rate if rate else 0.0


def achieved_tflops(cm: ComputeModel, op: Compute) -> float:
    """The op's FLOP rate in TFLOP/s (for reports and tests)."""
    return op.flop / op_time(cm, op) / TFLOPS


# ----------------------------------------------------------------------------- overlapped communication
def overlap_slowdown_s(
    cm: ComputeModel, hidden_s: float, hidden_wire_bytes: float, memory_share: float, comm_sms: float
) -> float:
    """Extra compute seconds when a collective runs for ``hidden_s`` under compute (it is "hidden", not free).

    Two shared resources (Pati et al. 2024, T3, ASPLOS'24 §2-3: concurrent collectives slow the GEMMs they overlap
    by taking SMs and memory bandwidth; Agrawal et al. 2025, arXiv 2507.03114: compute slows 18.9% on average, up
    to 40%, on A100/H100 while it overlaps collectives):

    * SMs: the collective's ``comm_sms`` CTAs each hold an SM for as long as it runs (NCCL launches one CTA per
      channel, src/enqueue.cc), so compute-bound kernels run on sms − comm_sms SMs for ``hidden_s``:
      + (1 − memory_share) · hidden_s · comm_sms / sms.
    * HBM: the collective reads and writes ``comm_hbm_bytes_per_wire_byte`` bytes of HBM per byte it sends;
      memory-bound kernels (``memory_share`` of the compute it overlaps) lose that bandwidth:
      + memory_share · hidden_wire_bytes · k / B_mem.
    """
    on = hidden_s > 0.0  # elementwise on the search's arrays (``costs.elementwise``)
    if on is False:
        return 0.0
    sm = (1.0 - memory_share) * hidden_s * min(1.0, comm_sms / cm.sms)
    hbm = memory_share * minimum(hidden_s, hidden_wire_bytes * cm.comm_hbm_bytes_per_wire_byte / cm.mem_bw_bytes_per_s)
    return where(on, sm + hbm, 0.0)
