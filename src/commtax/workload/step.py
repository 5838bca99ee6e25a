"""The training step as operations: what one GPU computes and communicates.

Everything downstream (estimate, simulator, search) reads these ops; nothing downstream
re-derives model arithmetic. Notation (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models"): b micro-batch, s local sequence (seq_len/cp),
h hidden, a heads, g KV heads, d head dim, f FFN size, V vocabulary, t TP degree.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from commtax.spec import Job
from commtax.spec.assumptions import default_assumptions
from commtax.spec.base import HashedOnce, held_key
from commtax.spec.reads import ReadsCache
from commtax.spec.wire_dtypes import (
    CONVERT_BYTES,
    POWERSGD_ERROR_FEEDBACK_BYTES,
    bytes_per_element,
    codec_bytes_per_element,
    codec_conversions,
    powersgd_compresses,
    powersgd_rank,
)

# torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25): gradients are reduced in 25 MiB buckets
DDP_BUCKET_BYTES = 25 * 2**20


# the process group a collective runs on (Megatron-Core's names; ep/etp/edp: expert, expert-tensor and expert-data)
Group = Literal["tp", "cp", "pp", "dp", "ep", "etp", "edp"]
# what a compute op is, for the roofline's efficiency and for what overlap hides under (``costs.compute``)
ComputeKind = Literal["gemm", "attention", "memory"]
# the collectives the cost model prices (``costs.collectives.OPS`` and ``DEEPEP_OPS``)
CollectiveOp = Literal[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all",
    "send_recv",
    "deepep_dispatch",
    "deepep_combine",
]


@dataclass(frozen=True, slots=True)
class Compute:
    name: str
    flop: float  # executed FLOPs on this GPU (hardware FLOPs)
    bytes: float  # HBM traffic
    kind: ComputeKind
    m: int = 0  # GEMM shape (m×k)·(k×n); attention: m query rows of all (batch, head) pairs, n keys, k head dim
    n: int = 0
    k: int = 0
    kernels: int = 1  # kernels the op launches (eager PyTorch splits one norm into several)
    kernel: str = ""  # attention: the kernel (fa2, fa3, cudnn, triton, eager)
    backward: bool = False  # attention: the backward kernel
    fp8: bool = False  # GEMM with fp8 inputs
    convert: str = ""  # memory op that converts dtypes (comm_dtypes.CONVERSIONS; CONVERT_BYTES per element)
    groups: int = 1  # grouped GEMM (MoE experts): ``groups`` problems of m×n×k in one kernel, their tiles in one grid


@dataclass(frozen=True, slots=True)
class Collective:
    name: str
    op: CollectiveOp
    bytes: float  # nccl-tests message size: the whole buffer
    group: Group
    # DeepEP/HybridEP (op deepep_dispatch / deepep_combine): the bytes they move as a share of a pairwise
    # all-to-all's: a group spanning nodes, its inter-node bytes after node deduplication
    # (``workload.moe.internode_dedup``); inside one node or NVLink domain, after rank deduplication
    # (``workload.moe.rank_dedup``)
    dedup: float = 1.0
    # DeepEP/HybridEP: which kernel and dtype ("hybridep", "deepep"; dispatch "fp8" or "bf16"), to read its rate
    kernel: str = ""


Op = Compute | Collective


# The op records are built by these three, each one instance per value (typed: an int and a float of equal value
# stay apart, so a record holds what its call gave): a cold search of GPT-3 175B on 4,096 H100 built ~15,000
# Computes and ~9,300 Collectives of ~2,700 distinct values, ~20,000 instructions each through the frozen
# dataclass's __init__; shared, they also compare by identity in the price caches (2026-12-07, 2-core KVM host:
# 4.85 -> 4.49 G instructions for that search). The records are frozen: sharing one changes nothing they hold.
@functools.lru_cache(maxsize=8192, typed=True)
def collective_op(name: str, op: CollectiveOp, nbytes: float, group: Group) -> Collective:
    """``Collective(name, op, nbytes, group)``, one instance per value (as ``_gemm`` and ``_mem``)."""
    return Collective(name, op, nbytes, group)


@dataclass(frozen=True)
class Phase:
    """Ops of one pass (forward, backward or recompute) of one layer or one model end."""

    ops: tuple[Op, ...]

    def __hash__(self) -> int:
        """Hashed once: phases key the price caches (``costs.pricing``), and hashing ~30 ops each time is slow."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(self.ops)
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {"ops": self.ops}  # not the hash: string hashes are salted per process

    @property
    def computes(self) -> tuple[Compute, ...]:
        return tuple(o for o in self.ops if isinstance(o, Compute))

    @property
    def collectives(self) -> tuple[Collective, ...]:
        return tuple(o for o in self.ops if isinstance(o, Collective))


@dataclass(frozen=True)
class Block:
    """A unit of the model on one pipeline rank: forward, backward, recompute phases."""

    name: str
    fwd: Phase
    bwd: Phase
    recompute: Phase

    def __hash__(self) -> int:
        """Hashed once, as ``Phase``: blocks key the stage prices (``schedule.analytical.stage_times``)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.name, self.fwd, self.bwd, self.recompute))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {"name": self.name, "fwd": self.fwd, "bwd": self.bwd, "recompute": self.recompute}


@dataclass(frozen=True)
class Workload:
    """One training step of one GPU on each pipeline stage, per micro-batch, plus per-step ops."""

    layer: Block  # one transformer layer, one micro-batch (MoE models: a dense layer; ``moe_layer`` the others)
    embed: Block  # first stage only
    head: Block  # last stage only: final norm, logits, loss
    layers_per_stage: int
    pp_send: Collective  # activation (fwd) or its gradient (bwd) across one stage boundary
    dp_step: tuple[Collective, ...]  # gradient sync once per step (ZeRO 0-2)
    dp_microbatch: tuple[Collective, ...]  # ZeRO-3 gathers and reduce-scatters, per micro-batch, per layer
    optimizer: Compute
    micro_batches: int
    model_flop_per_step: float  # model FLOPs of the whole step, all GPUs (no recompute): for MFU
    params_per_gpu: dict[str, float] = field(default_factory=dict)  # "layers", "embed", "head"
    bucket_bytes: float = 0.0
    chunk_layers: tuple[int, ...] = ()  # layers of each virtual stage k = chunk·pp + stage (``Job.chunk_layers``)
    zero3_layer_tensors: tuple[float, ...] = ()  # elements of each parameter tensor of one layer on this GPU
    zero3_other_tensors: tuple[float, ...] = ()  # embedding / LM head / final norm tensors of the stage
    zero3_gather_passes: int = 2  # all-gathers of every parameter per micro-batch (forward, backward, + recompute)
    # ZeRO-2 keeps only its shard of the gradients, so every micro-batch's backward reduces them (DeepSpeed
    # stage_1_and_2.py reduce_ready_partitions_and_remove_grads: "if self.partition_gradients or
    # self.is_gradient_accumulation_boundary"; FSDP SHARD_GRAD_OP reduce-scatters in each post-backward hook);
    # ZeRO-0/1 accumulate full gradients and reduce once per step
    grads_sharded: bool = False
    # the gradient codec of a compressed ``grad_comm_dtype`` (quantize/dequantize passes, PowerSGD's GEMMs), whole
    # gradient of the fullest stage, per reduction (``grad_codec_ops``); on the DP reduction's critical path
    dp_codec: tuple[Compute, ...] = ()
    # MoE: the layer with experts, and how many of each pipeline rank's layers are MoE layers (first to last)
    moe_layer: Block | None = None
    stage_moe_layers: tuple[int, ...] = ()
    # expert gradients reduce over the expert-data-parallel group (edp), not dp: per step, ZeRO-1/2 style
    edp_step: tuple[Collective, ...] = ()
    # MoE: the distinct (dense, expert) parameters per GPU of the pipeline ranks (``stage_param_split``), and the
    # one the DP/EDP ops above are sized for (``with_dp_stage``); the schedule prices the slowest DP of them
    dp_stage_splits: tuple[tuple[float, float], ...] = ()
    dp_split: tuple[float, float] = (0.0, 0.0)


def with_fields(wl: Workload, **changes: Any) -> Workload:
    """``dataclasses.replace(wl, **changes)`` without ``__init__``'s frozen setattr per field (a search makes ~10^4
    of them; Workload has no ``__post_init__``, so the copy holds what ``replace`` would)."""
    if not _WORKLOAD_FIELDS.issuperset(changes):
        raise TypeError(f"Workload has no field {sorted(set(changes) - _WORKLOAD_FIELDS)[0]!r}")
    out = object.__new__(Workload)
    values = wl.__dict__.copy()
    values.update(changes)
    object.__setattr__(out, "__dict__", values)
    return out


_WORKLOAD_FIELDS = frozenset(f.name for f in dataclasses.fields(Workload))
# every field in order, those with a default holding it (``params_per_gpu``'s factory: a new dict per workload)
_WORKLOAD_TEMPLATE = {f.name: f.default for f in dataclasses.fields(Workload)}
_WORKLOAD_REQUIRED = frozenset(f.name for f in dataclasses.fields(Workload) if f.default is dataclasses.MISSING)
_WORKLOAD_REQUIRED -= {f.name for f in dataclasses.fields(Workload) if f.default_factory is not dataclasses.MISSING}


def new_workload(**values: Any) -> Workload:
    """``Workload(**values)`` without ``__init__``'s frozen setattr per field (~20 of them; every estimate builds one,
    a search ~2,000): the same fields, in the same order, each value given or its default."""
    if not _WORKLOAD_REQUIRED <= values.keys() or not _WORKLOAD_FIELDS.issuperset(values):
        return Workload(**values)  # its own TypeError
    out = object.__new__(Workload)
    fields = _WORKLOAD_TEMPLATE.copy()
    if "params_per_gpu" not in values:
        fields["params_per_gpu"] = {}
    fields.update(values)
    object.__setattr__(out, "__dict__", fields)
    return out


def activation_bytes_per_element(precision: str) -> float:
    """Bytes of one activation element between kernels, for every use (TP/CP collectives, pipeline sends,
    embeddings, the LM head, saved activations).

    fp32 and tf32 runs keep fp32 tensors (tf32 is a matmul mode, not a storage type: 4 B); bf16/fp16 keep 2 B;
    fp8/int8 runs keep bf16 activations and cast only GEMM inputs (Transformer Engine and torchao float8 cover
    linear layers only), so 2 B as well.
    """
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def weight_bytes_per_param(precision: str) -> float:
    """Working copy of a weight: fp32 (4 B) in fp32/tf32 training, else the bf16/fp16 copy of mixed precision (2 B)."""
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def optimizer_bytes_per_param(precision: str) -> float:
    """Adam states: m and v in fp32 (8 B), plus an fp32 master copy under mixed precision (12 B; ZeRO §3.1)."""
    return 8.0 if precision in ("fp32", "tf32") else 12.0


@functools.lru_cache(maxsize=8192, typed=True)
def _gemm(name: str, m: int, n: int, k: int, dtype_bytes: float, fp8: bool = False) -> Compute:
    """(m×k)·(k×n): 2mnk FLOPs; reads A and B, writes C (bytes at the activation dtype, fp8 inputs 1 B)."""
    in_bytes = 1.0 if fp8 else dtype_bytes
    return Compute(name, 2.0 * m * n * k, in_bytes * (m * k + k * n) + dtype_bytes * m * n, "gemm", m, n, k, fp8=fp8)


@functools.lru_cache(maxsize=8192, typed=True)
def _mem(name: str, nbytes: float, kernels: int = 1) -> Compute:
    return Compute(name, 0.0, nbytes, "memory", kernels=kernels)


_NO_OPTIMIZER = _mem("adam", 0.0)  # ``pass_workload``'s: it prices no optimizer step


# GPU generations whose fp8 GEMMs accept non-TN layouts: Transformer Engine keeps no transposed fp8 copy there
# (transformer_engine/common/transformer_engine.cpp nvte_is_non_tn_fp8_gemm_supported: SM 10.0 and later;
# pytorch/csrc/quantizer.cpp with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported)
NON_TN_FP8_ARCHS = ("blackwell",)


def _fp8_casts(job: Job, name: str, elems: float, groups: int = 1) -> Compute:
    """Preparing fp8 GEMM operands: bytes per element by scaling recipe (catalog/assumptions.yaml).

    Eager dynamic scaling runs an amax pass and two casts; under torch.compile the amax reduction fuses into
    the producing kernel and one cast kernel writes both layouts, as Transformer Engine's cast-transpose does.
    Transformer Engine's current scaling runs an amax kernel, a scale kernel and a cast-transpose per tensor, MXFP8
    one kernel that takes each 32-element block's scale as it casts. The eager GroupedLinear quantizes a grouped
    GEMM's ``groups`` splits one by one (TE v2.10-v2.16 split_quantize -> multi_tensor_quantize_impl: a fused
    multi-tensor kernel for delayed scaling only), 3 or 1 kernels per split; the full-iteration recipes' fused
    grouped MLP (TE ops ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8) quantizes all splits in one tex.group_quantize.
    """
    a = default_assumptions()
    if job.plan.fp8_recipe == "current":
        # Blackwell's fp8 GEMMs take any layout, so TE writes no transpose (nvte_is_non_tn_fp8_gemm_supported)
        per_elem = a.v("fp8_cast_bytes_current") - (1.0 if job.cluster.gpu.arch in NON_TN_FP8_ARCHS else 0.0)
        return _mem(name, per_elem * elems, kernels=3 * groups)
    if job.plan.fp8_recipe == "mxfp8":
        split = groups if job.plan.cuda_graphs != "full_iteration" else 1
        return _mem(name, a.v("fp8_cast_bytes_mxfp8") * elems, kernels=split)
    eager_dynamic = job.plan.fp8_recipe == "dynamic" and job.plan.elementwise == "eager"
    per_elem = a.v("fp8_cast_bytes_dynamic") if eager_dynamic else a.v("fp8_cast_bytes_delayed")
    return _mem(name, per_elem * elems, kernels=3 if eager_dynamic else 1)


# HBM traffic of non-GEMM ops relative to a hand-fused kernel, and kernels launched, by elementwise style.
# Fused (Megatron/TE: fused LayerNorm/RMSNorm, bias-SwiGLU/GeLU, bias-dropout-add, RoPE) and compiled
# (torch.compile/inductor fuses each norm and pointwise chain into one kernel) move each tensor once.
# Eager PyTorch: RMSNorm as torch.nn.RMSNorm / HF LlamaRMSNorm runs to(fp32), pow, mean, rsqrt, mul, to(bf16),
# mul: 36 B per element against 4 B fused (x9, 6 kernels); LayerNorm is one native kernel (x1);
# SwiGLU silu(a)·b: silu r2 w2 + mul r4 w2 = 10 B against 6 B fused (x1.67, 2 kernels); GeLU one kernel;
# RoPE on q and k as complex multiply: view/mul/type_as ≈ 3 passes (x3, 4 kernels). Llama-family models
# (gated MLP) use RMSNorm and RoPE; GPT/MPT/BLOOM-style models (plain MLP) LayerNorm and learned/ALiBi positions.
ELEMENTWISE = {
    "fused": {"rmsnorm": (1.0, 1), "layernorm": (1.0, 1), "swiglu": (1.0, 1), "gelu": (1.0, 1), "rope": (1.0, 1)},
    "compiled": {"rmsnorm": (1.0, 1), "layernorm": (1.0, 1), "swiglu": (1.0, 1), "gelu": (1.0, 1), "rope": (1.0, 1)},
    "eager": {"rmsnorm": (9.0, 6), "layernorm": (1.0, 1), "swiglu": (10 / 6, 2), "gelu": (1.0, 1), "rope": (3.0, 4)},
}


# RoPE in eager PyTorch where Megatron cannot fuse a YaRN RoPE: Megatron-Bridge's providers turn apply_rope_fusion
# off for any position_embedding_type but "rope" (utils/fusions.py validate_rope_fusion_compatibility, v0.2.0-v0.6.0;
# GPT-OSS runs "yarn"), and Megatron-Core's rope_utils.apply_rotary_pos_emb takes the unfused path when mscale != 1.0
# ("mscale=... is not supported by TE's fused RoPE. Using unfused implementation.", #2038 2025-11-22; attention.py
# passes the YaRN concentration factor since ADLR/megatron-lm!4044 "YaRN support for gpt-oss", 2025-09-29).
# _apply_rotary_pos_emb_bshd on q and on k, bytes per element in units of the activation dtype: forward
# t * cos (r 1, w 1), -x2 on half (0.5 + 0.5), cat(-x2, x1) (1 + 1), * sin (1 + 1), the add (2 + 1),
# cat((t, t_pass)) (1 + 1) = 12, in 6 kernels, plus cos, sin, their mscale products and casts of the small freqs
# table (6 kernels); backward (autograd) the two products' gradients (2 + 2), the neg (1), chunk's cat (2), the
# accumulation of t's two gradients (3), the empty t_pass slice's zeros (1) and their accumulation (3) = 14, in
# 7 kernels. The full-range t[..., :rot_dim] is t itself (PyTorch's slice of the whole dimension returns self).
MEGATRON_ROPE = ("megatron-core", "megatron-lm", "nemo")
ROPE_UNFUSED_FWD, ROPE_UNFUSED_FWD_KERNELS = 12.0, 12  # per element of q or k; kernels per tensor
ROPE_UNFUSED_BWD, ROPE_UNFUSED_BWD_KERNELS = 14.0, 7


def unfused_rope(job: Job) -> bool:
    """Whether the job's RoPE runs in eager PyTorch (a YaRN factor Megatron-Core's fused RoPE cannot take)."""
    m, p = job.model, job.plan
    return m.rope_mscale not in (None, 1.0) and p.framework in MEGATRON_ROPE and p.elementwise == "fused" and not m.mla


def _ew_backward(job: Job, name: str, fwd_bytes: float, kernels: int) -> tuple[float, int]:
    """Bytes and kernels of an elementwise op's backward: it reads its saved input and the gradient and writes the
    gradient (2 × the forward's bytes), except the unfused RoPE, counted op by op above."""
    if name == "rope" and unfused_rope(job):
        return fwd_bytes * ROPE_UNFUSED_BWD / ROPE_UNFUSED_FWD, 2 * ROPE_UNFUSED_BWD_KERNELS
    return 2 * fwd_bytes, kernels


# A bool mask element (PyTorch comparison outputs)
BOOL_BYTES = 1.0


def glu_clamp_ops(name: str, out_elems: float, act_bytes: float) -> tuple[Compute, Compute]:
    """(forward, backward) passes of a clamped GLU's input clamps, for ``out_elems`` activation outputs U.

    Megatron-Core's GPT-OSS activation (weighted_bias_quick_geglu_impl, megatron/core/fusions/fused_bias_geglu.py)
    clamps the two halves of the up-projection output in eager PyTorch and concatenates them before its fused
    kernel: forward x_glu.clamp(max), x_linear.clamp(±) (each reads and writes U elements) and cat (2U each way),
    8·a·U bytes in 3 kernels. Backward (PyTorch FunctionsManual.cpp clamp_backward: where(mask, grad, 0)): the
    max-only clamp compares (r a, w b) and selects (r b + a, w a), 3a + 2b; the two-sided one compares twice, ands
    the masks in place (r 2b, w b) and selects, 4a + 6b; chunk's backward concatenates the two halves' grads, 4a:
    (11a + 8b)·U bytes in 7 kernels (a: activation bytes, b: a bool mask byte)."""
    fwd = _mem(f"{name}_clamp", 8 * act_bytes * out_elems, kernels=3)
    bwd = _mem(f"{name}_clamp_bwd", (11 * act_bytes + 8 * BOOL_BYTES) * out_elems, kernels=7)
    return fwd, bwd


def _layer_gemms(job: Job, tokens: int, mlp: bool = True) -> list[tuple[str, int, int, int]]:
    """Forward GEMMs of one layer on one TP rank: (name, m, n, k); the MLP's unless ``mlp`` is False (MoE layers
    price theirs in ``workload.moe``)."""
    m, t = job.model, job.plan.tp
    h, d, f = m.hidden, m.head_dim, m.ffn
    up = (2 if m.gated_mlp else 1) * f
    if m.mla:
        # MLA (DeepSeek-V2 §2.1.2): down-projections of q and kv (replicated over TP, Megatron-Core MLASelfAttention),
        # up-projections to the heads, output projection from the value heads
        a, dv = m.heads, m.value_head_dim
        q = [("q_down", tokens, m.q_lora_rank, h), ("q_up", tokens, a * d // t, m.q_lora_rank)] if m.q_lora_rank else []
        attn = q or [("q_proj", tokens, a * d // t, h)]
        attn += [
            ("kv_down", tokens, m.kv_lora_rank + m.qk_rope_head_dim, h),
            ("kv_up", tokens, a * (m.qk_nope_head_dim + dv) // t, m.kv_lora_rank),
            ("attn_proj", tokens, h, a * dv // t),
        ]
    else:
        q_kv = (m.heads + 2 * m.kv_heads_) * d
        attn = [("qkv", tokens, q_kv // t, h), ("attn_proj", tokens, h, m.heads * d // t)]
    if not mlp:
        return attn
    return attn + [("mlp_up", tokens, up // t, h), ("mlp_down", tokens, h, f // t)]


def attention_flop(job: Job, causal: bool) -> float:
    """Score QKᵀ and context PV: 2 matmuls of 2·b·(a/t)·s·S·d FLOPs each; causal halves the work done.

    With context parallelism each rank's s = S/cp queries meet all S keys (ring attention).
    """
    m, p, tr = job.model, job.plan, job.training
    s_local, s_full = tr.seq_len // p.cp, tr.seq_len
    full = 4.0 * p.micro_batch * (m.heads // p.tp) * s_local * s_full * m.head_dim
    return full / 2 if causal else full


def _tp_comm(job: Job, act_bytes: float, tokens_full: int) -> list[Collective]:
    """TP collectives of one layer-pass: 2 all-reduces, or with SP 2×(all-gather + reduce-scatter)
    (Korthikanti §4.2.2)."""
    p, h = job.plan, job.model.hidden
    if p.tp == 1:
        return []
    buf = tokens_full * h * act_bytes
    if p.sequence_parallel:
        return [
            collective_op("tp_ag_attn", "all_gather", buf, "tp"),
            collective_op("tp_rs_attn", "reduce_scatter", buf, "tp"),
            collective_op("tp_ag_mlp", "all_gather", buf, "tp"),
            collective_op("tp_rs_mlp", "reduce_scatter", buf, "tp"),
        ]
    return [collective_op("tp_ar_attn", "all_reduce", buf, "tp"), collective_op("tp_ar_mlp", "all_reduce", buf, "tp")]


def _cp_comm(job: Job, act_bytes: float, backward: bool) -> list[Collective]:
    """Ring attention: K and V of every CP rank pass round the ring; backward also returns dK, dV."""
    p, m, tr = job.plan, job.model, job.training
    if p.cp == 1:
        return []
    kv_local = 2 * p.micro_batch * (tr.seq_len // p.cp) * (m.kv_heads_ * m.head_dim // p.tp) * act_bytes
    ops = [collective_op("cp_kv", "all_gather", kv_local * p.cp, "cp")]
    if backward:
        ops.append(collective_op("cp_dkv", "reduce_scatter", kv_local * p.cp, "cp"))
    return ops


# Ring attention merges each step's partial result into fp32 accumulators: (HBM bytes per element, kernels) per
# step. Fused (Transformer Engine, transformer_engine/common/fused_attn/context_parallel.cu: LseCorrectionFunctor,
# out correction, AddFunctor): forward reads the step's bf16 output (2 B) and reads and writes the fp32 output
# (8 B); backward adds each step's dQ into an fp32 dQ and dK, dV into the dK/dV travelling round the ring (10 B
# each). Eager (torch.distributed.tensor.experimental._attention._SDPAMerger, convert_to_f32): the step's output is
# cast to fp32 (2 + 4 B), out - sigmoid(lse_b - lse)·(out - out_b) runs as three ops (10 + 8 + 12 B) and the
# load-balanced partial update rebuilds the tensor with torch.cat (8 B): 44 B, 6 kernels; backward casts and adds
# each gradient (6 + 10 B), 2 kernels per tensor.
CP_MERGE = {
    "fused": {"fwd": (10.0, 2), "bwd": (10.0, 1)},
    "compiled": {"fwd": (10.0, 2), "bwd": (10.0, 1)},
    "eager": {"fwd": (44.0, 6), "bwd": (16.0, 2)},
}


def _cp_merge_ops(job: Job, backward: bool) -> list[Compute]:
    """Per-step merging of ring attention's partial results (one of ``cp`` steps per layer pass): HBM passes
    over the local output (forward) or the local dQ and the dK, dV that travel round the ring (backward)."""
    p, m, tr = job.plan, job.model, job.training
    if p.cp == 1:
        return []
    s_local = p.micro_batch * (tr.seq_len // p.cp)
    q_elems = s_local * (m.heads // p.tp) * m.head_dim
    kv_elems = 2 * s_local * max(1, m.kv_heads_ // p.tp) * m.head_dim
    per_elem, kernels = CP_MERGE.get(p.elementwise, CP_MERGE["eager"])["bwd" if backward else "fwd"]
    elems = q_elems + kv_elems if backward else q_elems
    tensors = 3 if backward else 1
    return [_mem("cp_merge_bwd" if backward else "cp_merge", p.cp * per_elem * elems, p.cp * kernels * tensors)]


def _elementwise_ops(job: Job, act_bytes: float, mlp: bool = True) -> dict[str, tuple[float, int]]:
    """HBM bytes and kernels of one layer's non-GEMM forward ops (norms, activations, RoPE, dropout, residuals)."""
    m, p, tr = job.model, job.plan, job.training
    b, s, t = p.micro_batch, tr.seq_len // p.cp, p.tp
    bsh = b * s * m.hidden
    # norms, dropout and residual adds are replicated on each TP rank unless sequence-parallel
    bsh_rep = bsh / t if p.sequence_parallel else bsh
    bsf = b * s * m.ffn / t
    style = ELEMENTWISE[p.elementwise]
    norm_x, norm_k = style["rmsnorm" if m.gated_mlp else "layernorm"]
    act_x, act_k = style["swiglu" if m.gated_mlp else "gelu"]
    # residual add: read 2, write 1; fused dropout adds a mask write (bias-dropout-add, Megatron)
    residual = (3 * act_bytes + (1 if job.dropout else 0)) * bsh_rep
    out = {
        "norms": (norm_x * 2 * 2 * bsh_rep * act_bytes, 2 * norm_k),  # 2 norms: read x, write y (fused)
        "residual": (2 * residual, 2),
        # SwiGLU reads 2 writes 1; GeLU reads 1 writes 1 (fused)
        "activation": (act_x * (3 if m.gated_mlp else 2) * bsf * act_bytes, act_k),
    }
    if not mlp:  # MoE layer: the experts' activations are priced on the tokens they receive (workload.moe)
        del out["activation"]
    if m.gated_mlp:  # rotary embedding of q and k (Llama family): read and write both once (fused)
        rope_x, rope_k = style["rope"]
        # MLA (heads = kv_heads, d = nope + rope): Megatron-Core's fused MLA RoPE rewrites q and builds each head's
        # key [k_nope; k_pe] and value from the up-projected kv (fused_apply_mla_rope_for_q / _for_kv), about as
        # many bytes as roping q and k of every head
        qk = b * s * (m.heads + m.kv_heads_) * m.head_dim / t
        out["rope"] = (rope_x * 2 * qk * act_bytes, rope_k)
        if unfused_rope(job):
            out["rope"] = (ROPE_UNFUSED_FWD * qk * act_bytes, 2 * ROPE_UNFUSED_FWD_KERNELS)
    if m.mla:  # RMSNorm of the compressed q and kv latents, replicated over TP (DeepSeek-V2 §2.1.2; q/kv_a_layernorm)
        latent = b * s * ((m.q_lora_rank or 0) + m.kv_lora_rank)
        out["mla_norms"] = (norm_x * 2 * latent * act_bytes, (2 if m.q_lora_rank else 1) * norm_k)
    if m.qk_norm:  # per-head RMSNorm of q and k (Qwen3): read and write both once, as the layer norms
        qk_heads = b * s * (m.heads + m.kv_heads_) * m.head_dim / t
        out["qk_norm"] = (norm_x * 2 * qk_heads * act_bytes, 2 * norm_k)
    if not p.flash_attention:
        # unfused attention's softmax reads and writes the b·(a/t)·s² scores (4 B; Megatron's fused
        # scale-mask-softmax); attention dropout adds r/w + mask 5 B. The GEMMs' own score traffic (QKᵀ writes
        # 2 B, PV reads 2 B) is part of the attention op's roofline (_attention_ops).
        per_elem = 4.0 + (5.0 if job.dropout else 0.0)
        out["attn_scores"] = (per_elem * b * (m.heads / t) * s * tr.seq_len, 2 if job.dropout else 1)
    return out


def window_attention_flop(job: Job) -> float:
    """Causal attention through a sliding window of w keys: query i meets min(i + 1, w) keys, Σ = s·w − w(w − 1)/2
    (s ≥ w), each key 4·d FLOPs per head (QKᵀ and PV); w = s gives the causal s(s + 1)/2."""
    m, p, tr = job.model, job.plan, job.training
    s, w = tr.seq_len, min(job.model.sliding_window, tr.seq_len)
    return 4.0 * p.micro_batch * (m.heads // p.tp) * m.head_dim * (s * w - w * (w - 1) / 2)


def _windowed_share(job: Job) -> float:
    """Share of the layers whose fused kernel skips the blocks outside the sliding window. Eager attention
    masks the full scores (no saving); with CP the windowed layers are priced as ring attention over the full
    context (not modelled)."""
    m, p, tr = job.model, job.plan, job.training
    if m.sliding_window is None or m.sliding_window >= tr.seq_len or p.attention == "eager" or p.cp > 1:
        return 0.0
    return m.windowed_share


def _attention_ops(job: Job) -> tuple[Compute, Compute, list[Compute], list[Compute]]:
    """Forward and backward attention kernels of one layer, and the sliding-window share of them ([] unless the
    model has windowed layers; MXFP8 attention's casts with them).

    Fused kernels skip the masked half of causal attention; eager attention computes the full s×S scores
    (then masks them), so it executes the non-causal FLOPs. FlashAttention-2 backward runs 5 matmuls to the
    forward's 2 (Dao 2023, §3.1.2): 2.5× the forward FLOPs. A model whose layers alternate sliding-window and
    full attention (GPT-OSS) is priced per layer as the mean: the full kernel for the full layers' share, the
    windowed one (its rate at w keys) for the rest.
    """
    m, p, tr = job.model, job.plan, job.training
    kernel = p.attention
    share = _windowed_share(job)
    flop = attention_flop(job, causal=kernel != "eager") * (1.0 - share)
    s_local = tr.seq_len // p.cp
    # eager: QKᵀ writes the scores and PV reads the probabilities, 2 B each; backward moves twice as much
    scores = p.micro_batch * (m.heads / p.tp) * s_local * tr.seq_len
    nbytes = 4.0 * scores if kernel == "eager" else 0.0
    rows = int(p.micro_batch * (m.heads // p.tp) * s_local)  # query rows of all (batch, head) pairs
    # ring attention runs a fused kernel per step on the local chunk against one K/V chunk (s_local keys): its
    # rate is the kernel's at that length (the causal diagonal step; the others are half-masked blocks)
    keys = tr.seq_len if p.cp == 1 or kernel == "eager" else s_local
    fp8 = p.fp8_attention  # Transformer Engine's MXFP8 dot-product attention: costs.compute.mxfp8_attention_ratio
    fwd = Compute("attention", flop, nbytes, "attention", rows, keys, m.head_dim, kernel=kernel, fp8=fp8)
    bwd = Compute(
        "attention_bwd",
        2.5 * flop,
        2 * nbytes,
        "attention",
        rows,
        keys,
        m.head_dim,
        kernel=kernel,
        backward=True,
        fp8=fp8,
    )
    extra_f, extra_b = _fp8_attention_casts(job) if fp8 else ([], [])
    if not share:
        return fwd, bwd, extra_f, extra_b
    wf, w = share * window_attention_flop(job), m.sliding_window
    # the MXFP8 window forward keeps the BF16 one's time (cuDNN 9.22, catalog/attention.yaml): priced as BF16
    win_f = Compute("attention_window", wf, 0.0, "attention", rows, w, m.head_dim, kernel=kernel)
    win_b = Compute("attention_window_bwd", 2.5 * wf, 0.0, "attention", rows, w, m.head_dim, kernel=kernel)
    win_b = replace(win_b, backward=True)
    if fp8:
        # cuDNN's MXFP8 backward computes every causal block of a windowed layer (its time grows as s², as full
        # causal attention: catalog/attention.yaml mxfp8_time_ratio): the windowed layers' share of a causal backward
        causal = 2.5 * attention_flop(job, causal=True) * share
        win_b = replace(bwd, name="attention_window_bwd", flop=causal)
    return fwd, bwd, [win_f, *extra_f], [win_b, *extra_b]


def _fp8_attention_casts(job: Job) -> tuple[list[Compute], list[Compute]]:
    """Transformer Engine's quantization for MXFP8 attention (attention/dot_product_attention/backends.py
    FusedAttnFunc, v2.16): q, k and v before the forward (``combine_and_quantize`` with ``used_in_backward``: both
    layouts, the backward's transposed GEMMs read the columnwise copy) and the output gradient before the backward
    (``mxfp8_quantize_fast_path``), at the MXFP8 cast's bytes per element (catalog/assumptions.yaml
    fp8_cast_bytes_mxfp8); one kernel each. The output and dq, dk, dv stay BF16."""
    m, p = job.model, job.plan
    tokens = job.micro_batch_tokens
    heads, kv = m.heads // p.tp, max(1, m.kv_heads_ // p.tp)
    qkv = tokens * (heads * m.head_dim + kv * (m.head_dim + m.value_head_dim))
    per_elem = default_assumptions().v("fp8_cast_bytes_mxfp8")
    return (
        [_mem("attention_fp8_cast", per_elem * qkv, 3)],
        [_mem("attention_fp8_grad_cast", per_elem * tokens * heads * m.value_head_dim)],
    )


# DeepSpeed's BF16_Optimizer (bf16 with ZeRO stage 0/1, the Megatron-DeepSpeed bf16 path of BLOOM and MT-NLG)
# keeps fp32 gradients and, after every micro-batch's backward, adds the bf16 ones into them, tensor by tensor:
# `hp.grad.data.add_(lp.grad.data.to(hp.dtype))` (deepspeed/runtime/bf16_optimizer.py update_hp_grads, called from
# engine.backward and from the pipeline engine's _exec_backward_pass "because we don't call optimizer.backward()").
# Per parameter: the cast reads 2 B and writes a 4 B temporary, the add reads 4 + 4 B and writes 4 B.
BF16_OPTIMIZER_ACCUM_BYTES_PER_PARAM = 2 + 4 + 4 + 4 + 4
BF16_OPTIMIZER_FRAMEWORKS = ("megatron-deepspeed", "deepspeed")


def uses_bf16_optimizer(job: Job) -> bool:
    """DeepSpeed runs bf16 with ZeRO stage 0/1 through its BF16_Optimizer."""
    p = job.plan
    return p.framework in BF16_OPTIMIZER_FRAMEWORKS and job.training.precision == "bf16" and p.zero <= 1


def bf16_optimizer_grad_accum(job: Job, gemms: list) -> list[Op]:
    """The per-micro-batch fp32 gradient accumulation of DeepSpeed's BF16_Optimizer over one layer's weights
    (two kernels per weight tensor), or nothing for other frameworks, precisions or ZeRO stages."""
    if not uses_bf16_optimizer(job):
        return []
    weights = sum(kk * nn for _, _, nn, kk in gemms)  # (k × n) weight of each GEMM, this GPU's TP shard
    return [_mem("bf16_optimizer_grad_accum", BF16_OPTIMIZER_ACCUM_BYTES_PER_PARAM * weights, 2 * len(gemms))]


# What each Megatron-Core recompute module re-runs of a layer's forward, by op name (transformer_config.py
# recompute_modules @d98e8a6; transformer_layer.py input/pre-MLP layernorm and MLP checkpoints,
# multi_latent_attention.py qkv_up_checkpoint over the up-projections and RoPE, experts.py activation checkpoint,
# moe_layer.py the MoE layer and shared-expert checkpoints). core_attn is priced with the attention kernel itself.
RECOMPUTE_OPS: dict[str, tuple[str, ...]] = {
    "layernorm": ("norms",),
    "mla_up_proj": ("q_up", "kv_up", "q_up_cast", "kv_up_cast", "rope"),
    "mlp": ("mlp_up", "mlp_down", "mlp_up_cast", "mlp_down_cast", "activation", "tp_ag_mlp", "tp_rs_mlp", "tp_ar_mlp"),
    "moe_act": ("expert_activation", "expert_activation_clamp"),
    "shared_experts": ("shared_up", "shared_down", "shared_up_cast", "shared_down_cast", "shared_activation"),
}


def _module_recompute(mods: frozenset[str], dense_fwd: list[Op], moe_fwd: list[Op], moe: bool) -> list[Op]:
    """Forward ops the recompute modules other than core_attn re-run in backward, renamed ``*_recompute``:
    mlp on dense layers only, moe (all of the MoE MLP's forward, its dispatch and combine too), moe_act and
    shared_experts on MoE layers."""
    names = {n for mod in mods - {"core_attn", "moe"} for n in RECOMPUTE_OPS[mod]}
    if moe:
        names -= set(RECOMPUTE_OPS["mlp"])
    picked = [o for o in dense_fwd if o.name in names]
    if moe:
        picked += moe_fwd if "moe" in mods else [o for o in moe_fwd if o.name in names]
    return [replace(o, name=f"{o.name}_recompute") for o in picked]


@dataclass(frozen=True)
class _LayerPasses:
    """A layer's forward and backward passes, and the forward's pieces its recompute pass re-runs."""

    fwd: Phase
    bwd: Phase
    gemms: tuple[Compute, ...]
    attention: Compute
    window: tuple[Compute, ...]  # the sliding-window attention's forward, MXFP8 attention's casts
    elementwise: tuple[Compute, ...]
    scores_bytes: float | None  # unfused attention's softmax over the scores (``_elementwise_ops`` attn_scores)
    casts: tuple[Compute, ...]
    tp: tuple[Collective, ...]
    ring: tuple[Op, ...]  # ring attention's per-step merges and K/V exchange, forward
    moe: tuple[Op, ...]


def _layer_block(job: Job, moe: bool = False) -> Block:
    """One transformer layer (MoE: a layer with experts), its phases interned (``_PHASES``)."""
    passes = _layer_passes(job, moe)
    return Block("layer", passes.fwd, passes.bwd, _intern(_layer_recompute(job, passes, moe)))


def _layer_passes(job: Job, moe: bool = False) -> _LayerPasses:
    """``_build_layer_passes``, built once per values it reads: plans differing in their recompute (or anything
    else the passes do not read) share one."""
    return _LAYER_PASSES.get(_specs_root(job, moe), job, _build_moe_passes if moe else _build_dense_passes)


def _build_dense_passes(job: Job) -> _LayerPasses:
    return _build_layer_passes(job, False)


def _build_moe_passes(job: Job) -> _LayerPasses:
    return _build_layer_passes(job, True)


def _build_layer_passes(job: Job, moe: bool) -> _LayerPasses:
    p, tr = job.plan, job.training
    act_bytes = activation_bytes_per_element(tr.precision)
    fp8 = tr.precision == "fp8"
    tokens = job.micro_batch_tokens
    gemms = _layer_gemms(job, tokens, mlp=not moe)
    fwd_gemm = [_gemm(n, mm, nn, kk, act_bytes, fp8) for n, mm, nn, kk in gemms]
    # backward: dgrad (m×n)·(n×k) and wgrad (k×m)·(m×n), each as many FLOPs as forward
    bwd_gemm = []
    for n, mm, nn, kk in gemms:
        bwd_gemm.append(_gemm(f"{n}_dgrad", mm, kk, nn, act_bytes, fp8))
        bwd_gemm.append(_gemm(f"{n}_wgrad", kk, nn, mm, act_bytes, fp8))
    attn_fwd, attn_bwd, win_fwd, win_bwd = _attention_ops(job)
    ew = _elementwise_ops(job, act_bytes, mlp=not moe)
    ew_fwd = [_mem(k, v, n) for k, (v, n) in ew.items()]
    # backward reads saved input and grad, writes grad
    ew_bwd = [_mem(f"{k}_bwd", *_ew_backward(job, k, v, n)) for k, (v, n) in ew.items()]
    casts_fwd: list[Compute] = []
    casts_bwd: list[Compute] = []
    if fp8:
        # inputs (m×k) every micro-batch; weights (k×n): Transformer Engine caches their fp8 copy for the step,
        # dynamic scaling (torchao) re-casts them in every forward; gradients of the outputs (m×n) in backward
        weights = p.fp8_recipe == "dynamic"
        casts_fwd = [_fp8_casts(job, f"{n}_cast", mm * kk + (kk * nn if weights else 0)) for n, mm, nn, kk in gemms]
        casts_bwd = [_fp8_casts(job, f"{n}_grad_cast", mm * nn) for n, mm, nn, kk in gemms]
    tokens_full = job.micro_batch_tokens
    tp_fwd = _tp_comm(job, act_bytes, tokens_full)
    tp_bwd = _tp_comm(job, act_bytes, tokens_full) + bf16_optimizer_grad_accum(job, gemms)
    moe_fwd: list[Op] = []
    moe_bwd: list[Op] = []
    if moe:
        from commtax.workload.moe import moe_mlp_ops  # the MoE module builds on this one's op helpers

        moe_fwd, moe_bwd = moe_mlp_ops(job, act_bytes, fp8)
    merge_fwd, kv_fwd = _cp_merge_ops(job, False), _cp_comm(job, act_bytes, False)
    fwd = Phase(tuple(fwd_gemm + [attn_fwd] + win_fwd + merge_fwd + ew_fwd + casts_fwd + tp_fwd + kv_fwd + moe_fwd))
    bwd = Phase(
        tuple(
            bwd_gemm
            + [attn_bwd]
            + win_bwd
            + _cp_merge_ops(job, True)
            + ew_bwd
            + casts_bwd
            + tp_bwd
            + _cp_comm(job, act_bytes, True)
            + moe_bwd
        )
    )
    fwd, bwd = _intern(fwd), _intern(bwd)
    scores = ew["attn_scores"][0] if "attn_scores" in ew else None
    return _LayerPasses(
        fwd,
        bwd,
        tuple(fwd_gemm),
        attn_fwd,
        tuple(win_fwd),
        tuple(ew_fwd),
        scores,
        tuple(casts_fwd),
        tuple(tp_fwd),
        tuple(merge_fwd + kv_fwd),
        tuple(moe_fwd),
    )


_NO_PASS = Phase(())


def _layer_recompute(job: Job, passes: _LayerPasses, moe: bool) -> Phase:
    """The pass the plan's recompute re-runs in backward, of the layer's forward ``passes``."""
    p = job.plan
    if p.recompute == "full":
        return passes.fwd
    if p.recompute == "selective" and p.selective_policy == "per_op":
        # torchtitan op-level SAC keeps matmul and attention outputs except every other mm: the odd GEMMs,
        # the pointwise ops and their TP collectives run again; attention does not
        return Phase(passes.gemms[1::2] + passes.elementwise + passes.casts)
    if p.recompute != "selective":
        return _NO_PASS
    mods = p.recomputed
    ops: list[Op] = []
    if "core_attn" in mods:
        # the core attention re-runs (Korthikanti §5); without flash it also rebuilds the scores
        a = passes.attention
        ops.append(
            Compute("attention_recompute", a.flop, a.bytes, "attention", a.m, a.n, a.k, kernel=a.kernel, fp8=a.fp8)
        )
        ops += [replace(w, name=f"{w.name}_recompute") for w in passes.window]
        if passes.scores_bytes is not None:
            ops.append(_mem("attn_scores_recompute", passes.scores_bytes))
        # with CP the recomputed core is ring attention: its K/V exchange and per-step merges run again
        ops += passes.ring
    dense_fwd = [*passes.gemms, *passes.elementwise, *passes.casts, *passes.tp]
    ops += _module_recompute(mods, dense_fwd, list(passes.moe), moe)
    return Phase(tuple(ops))


def _build_head_block(job: Job) -> Block:
    """Final norm, vocab-parallel logits and cross-entropy (fp32 softmax over V/t per token)."""
    m, p, tr = job.model, job.plan, job.training
    act_bytes = activation_bytes_per_element(tr.precision)
    tokens = job.micro_batch_tokens
    v_local = m.vocab // p.tp
    # Megatron-Core fp8_output_proj: the head as Transformer Engine's MXFP8 linear (TELMHeadColumnParallelLinear,
    # core_v0.18.0), its GEMMs at the fp8 rate, its input quantized in forward and the logits' gradient in backward
    # (the weights' fp8 copy cached for the step, as the layers' linears); else a bf16 GEMM in fp8 runs
    fp8 = p.fp8_output_proj
    logits = _gemm("logits", tokens, v_local, m.hidden, act_bytes, fp8)
    loss_bytes = 3 * 4.0 * tokens * v_local  # upcast + softmax + loss over fp32 logits
    ops_f: list[Op] = [logits, _mem("loss", loss_bytes)]
    ops_b: list[Op] = [
        _gemm("logits_dgrad", tokens, m.hidden, v_local, act_bytes, fp8),
        _gemm("logits_wgrad", m.hidden, v_local, tokens, act_bytes, fp8),
        _mem("loss_bwd", loss_bytes),
    ]
    if fp8:
        ops_f.insert(0, _fp8_casts(job, "logits_cast", tokens * m.hidden))
        ops_b.insert(0, _fp8_casts(job, "logits_grad_cast", tokens * v_local))
    if p.tp > 1:
        buf = tokens * m.hidden * act_bytes
        op = "all_gather" if p.sequence_parallel else "all_reduce"
        ops_f.insert(
            0,
            collective_op("tp_head_gather", "all_gather", buf, "tp")
            if p.sequence_parallel
            else collective_op("tp_loss", "all_reduce", 3 * 4.0 * tokens, "tp"),
        )
        ops_b.append(collective_op("tp_head_grad", "reduce_scatter" if p.sequence_parallel else op, buf, "tp"))
    head = Block("head", Phase(tuple(ops_f)), Phase(tuple(ops_b)), Phase(()))
    return _with_mtp(job, head) if m.mtp_layers else head


def _with_mtp(job: Job, head: Block) -> Block:
    """The head followed by the multi-token prediction modules, all on the last pipeline stage (Megatron-Core
    places MTP with the loss; Megatron-Bridge layouts "...|tmL"). Each depth (DeepSeek-V3 §2.2): the next tokens'
    embedding, RMSNorm of it and of the hidden state, their concatenation projected 2h → h (replicated over TP), a
    transformer layer (the MoE layer in an MoE model), and the shared output head and loss again."""
    m, tr = job.model, job.training
    act_bytes = activation_bytes_per_element(tr.precision)
    tokens = job.micro_batch_tokens
    buf = tokens * m.hidden * act_bytes
    layer = _layer_block(job, moe=m.is_moe)
    # the projection is a TE column-parallel linear run inside the MTP layer's fp8 context (Megatron-Core
    # multi_token_prediction.py: `with rng_context, fp8_context:` around the norms and eh_proj): fp8 in fp8 runs
    fp8 = tr.precision == "fp8"
    proj = ("mtp_proj", tokens, m.hidden, 2 * m.hidden)
    norms = _mem("mtp_norms", 2 * 2 * buf, 2)  # two RMSNorms: read and write h per token each
    fwd = [_mem("mtp_embedding", 2 * buf), norms, _gemm(*proj, act_bytes, fp8), *layer.fwd.ops, *head.fwd.ops]
    bwd = [
        _mem("mtp_embedding_grad", 2 * buf),
        _mem("mtp_norms_bwd", 2 * norms.bytes, 2),
        _gemm("mtp_proj_dgrad", tokens, 2 * m.hidden, m.hidden, act_bytes, fp8),
        _gemm("mtp_proj_wgrad", 2 * m.hidden, m.hidden, tokens, act_bytes, fp8),
        *layer.bwd.ops,
        *head.bwd.ops,
    ]
    if fp8:  # its input cast forward (2h per token) and its output gradient's backward (h per token)
        fwd.insert(3, _fp8_casts(job, "mtp_proj_cast", tokens * 2 * m.hidden))
        bwd.insert(2, _fp8_casts(job, "mtp_proj_grad_cast", tokens * m.hidden))
    d = m.mtp_layers
    return Block(
        "head",
        Phase(head.fwd.ops + tuple(fwd) * d),
        Phase(head.bwd.ops + tuple(bwd) * d),
        Phase(layer.recompute.ops * d),
    )


def _build_embed_block(job: Job) -> Block:
    m, p, tr = job.model, job.plan, job.training
    act_bytes = activation_bytes_per_element(tr.precision)
    tokens = job.micro_batch_tokens
    buf = tokens * m.hidden * act_bytes
    fwd: list[Op] = [_mem("embedding_lookup", 2 * buf)]
    bwd: list[Op] = [_mem("embedding_grad", 2 * buf)]
    if p.tp > 1:  # vocab-parallel embedding sums partial lookups across TP
        fwd.append(collective_op("tp_embed", "reduce_scatter" if p.sequence_parallel else "all_reduce", buf, "tp"))
        if p.sequence_parallel:
            bwd.append(collective_op("tp_embed_grad", "all_gather", buf, "tp"))
    return Block("embed", Phase(tuple(fwd)), Phase(tuple(bwd)), Phase(()))


def model_flop_per_token(job: Job) -> float:
    """Model FLOPs per token, fwd+bwd, no recompute: 3 × (2·params-in-GEMMs + attention 4·S·h per layer non-causal).

    The convention of Narayanan et al. 2021 (eq. 3, without the recompute term) and PaLM
    (Chowdhery et al. 2022, App. B): full (non-causal) attention, logits included.
    """
    m, tr = job.model, job.training
    h, d, f = m.hidden, m.head_dim, m.ffn
    if m.is_moe:
        # active experts only (Megatron-Bridge's MoE model FLOPs): router, top_k routed and the shared experts
        attn = 2 * m.attention_params() + 4 * tr.seq_len * m.heads * d
        moe = attn + 2 * m.moe_layer_params(active=True)
        dense = attn + 2 * m.mlp_params(f)
        mtp = m.mtp_layers * (moe + 2 * 2 * h * h + 2 * h * m.vocab)  # DeepSeek-V3 §2.2: layer, projection, head
        return 3 * (m.moe_layer_count * moe + m.moe_dense_layers * dense + 2 * h * m.vocab + mtp)
    gemm_params = h * (m.heads + 2 * m.kv_heads_) * d + m.heads * d * h + (3 if m.gated_mlp else 2) * h * f
    per_layer = 2 * gemm_params + 4 * tr.seq_len * m.heads * d
    mtp = m.mtp_layers * (per_layer + 2 * 2 * h * h + 2 * h * m.vocab)
    return 3 * (m.layers * per_layer + 2 * h * m.vocab + mtp)


def adam_bytes_per_param(precision: str) -> float:
    """HBM bytes of the Adam update per parameter: read fp32 master (or weight), grad, m, v; write them back
    (fused/foreach Adam, one pass); mixed precision also writes the 2 B working copy: 4·4 + 3·4 + 2 = 30 B."""
    if precision in ("fp32", "tf32"):
        return 4 * 4 + 3 * 4
    return 4 * 4 + 3 * 4 + weight_bytes_per_param(precision)


def grad_bytes_per_param(job: Job) -> float:
    """Wire bytes per gradient element of ``plan.grad_comm_dtype``, from the one table (commtax.spec.wire_dtypes)."""
    g = job.plan.grad_comm_dtype
    return bytes_per_element(g, weight_shapes(job) if powersgd_rank(g) else None)


def weight_shapes(job: Job) -> list[tuple[int, ...]]:
    """Shapes of one GPU's parameters (torch nn.Linear: out×in), for PowerSGD's per-matrix P and Q.

    Column-parallel weights (QKV, MLP up/gate, embeddings) split rows by tp, row-parallel ones
    (attention output, MLP down) split columns (Shoeybi et al. 2019, Megatron-LM §3).
    """
    m, p = job.model, job.plan
    h, f, t = m.hidden, m.ffn, p.tp
    qkv = (h + 2 * m.kv_heads_ * m.head_dim) // t
    layer = [(qkv, h), (h, h // t), *[(f // t, h)] * (2 if m.gated_mlp else 1), (h, f // t), (h,), (h,)]
    per_stage = m.layers // p.pp
    emb = [(m.vocab // t, h)] * (1 if m.tied_embeddings else 2)
    return layer * per_stage + emb + [(h,)]


def stage_moe_layers(job: Job) -> tuple[int, ...]:
    """MoE layers of each pipeline rank, first to last: the layers of its chunks (k = chunk·pp + rank, in model
    order) that ``Model.is_moe_layer``."""
    m, p = job.model, job.plan
    if not m.is_moe:
        return ()
    out = [0] * p.pp
    start = 0
    for k, n in enumerate(job.chunk_layers):
        out[k % p.pp] += m.moe_layers_before(start + n) - m.moe_layers_before(start)
        start += n
    return tuple(out)


def stage_param_split(job: Job) -> list[tuple[float, float]]:
    """(dense, expert) parameters one GPU of each pipeline rank holds, before ZeRO: dense ones (attention, norms,
    router, shared experts, dense layers, embedding/head) are replicated over dp, routed experts over edp."""
    from commtax.workload.moe import expert_params_per_gpu, moe_dense_params_per_layer

    m, p = job.model, job.plan
    params = params_per_gpu(job)
    attn_layer = (m.attention_params() + 2 * m.hidden) / p.tp  # norms counted sharded: a few h, as dense
    dense_layer = m.layer_params() / p.tp
    moe_layer = attn_layer + moe_dense_params_per_layer(job)
    out = []
    for s, (n, e) in enumerate(zip(job.stage_layers, stage_moe_layers(job))):
        dense = (n - e) * dense_layer + e * moe_layer
        dense += params["embed"] if s == 0 else 0.0
        experts = expert_params_per_gpu(job, e)
        if s == p.pp - 1:
            mtp_dense, mtp_experts = mtp_params_per_gpu(job)
            dense += params["head"] + mtp_dense
            experts += mtp_experts
        out.append((dense, experts))
    return out


def mtp_params_per_gpu(job: Job) -> tuple[float, float]:
    """(dense, expert) parameters of the MTP modules on one GPU of the last stage: the layer's attention, norms
    and dense or shared MLP TP-sharded, the projection replicated, routed experts as a MoE layer's."""
    m, p = job.model, job.plan
    if not m.mtp_layers:
        return 0.0, 0.0
    from commtax.workload.moe import expert_params_per_gpu, moe_dense_params_per_layer  # built on this module; MTP only

    attn = (m.attention_params() + 2 * m.hidden) / p.tp
    mlp = moe_dense_params_per_layer(job) if m.is_moe else m.mlp_params(m.ffn) / p.tp
    dense = 2 * m.hidden + 2 * m.hidden * m.hidden + attn + mlp
    experts = expert_params_per_gpu(job, 1) if m.is_moe else 0.0
    return m.mtp_layers * dense, m.mtp_layers * experts


def params_per_gpu(job: Job) -> dict[str, float]:
    """Parameters held by one GPU of the stage with the most layers, before ZeRO sharding."""
    return _params_per_gpu(job, job.stage_layers)


def _params_per_gpu(job: Job, stage_layers: tuple[int, ...]) -> dict[str, float]:
    """``params_per_gpu`` given the job's ``stage_layers`` (read once by ``build_workload``)."""
    m, p = job.model, job.plan
    per_stage_layers = max(stage_layers)
    layers = per_stage_layers * (m.layer_params() - 2 * m.hidden) / p.tp + per_stage_layers * 2 * m.hidden
    emb = m.vocab * m.hidden / p.tp
    # embedding on the first stage, output layer on the last; with pp == 1 both (one copy if tied)
    embed = emb
    head = emb if (p.pp > 1 or not m.tied_embeddings) else 0.0
    return {"layers": layers, "embed": embed, "head": head}


def stage_params(job: Job) -> list[float]:
    """Parameters held by one GPU of each pipeline stage (its layers; the embedding on the first, the head on the
    last; pp == 1: both, one copy if tied), before ZeRO sharding. MoE: dense and expert parameters together."""
    if job.model.is_moe:
        return [d + e for d, e in stage_param_split(job)]
    return _stage_params(job, params_per_gpu(job), job.stage_layers)


def _stage_params(job: Job, params: dict[str, float], stage_layers: tuple[int, ...]) -> list[float]:
    """``stage_params`` of a dense job given its ``params_per_gpu`` and ``stage_layers`` (``build_workload``)."""
    per_layer = params["layers"] / max(1, max(stage_layers))
    out = [n * per_layer for n in stage_layers]
    out[0] += params["embed"]
    out[-1] += params["head"] + sum(mtp_params_per_gpu(job))
    return out


def grad_bucket_bytes(job: Job) -> float:
    """Bytes of one gradient bucket of the overlapped DP reduction: the framework's bucket in parameters
    (Megatron-Core: max(40e6, 1e6 · dp) parameters, catalog/frameworks.yaml) at the reduce dtype, else PyTorch
    DDP's 25 MiB."""
    fw = job.plan.preset
    if fw.bucket_params is None:
        return DDP_BUCKET_BYTES
    return max(fw.bucket_params, fw.bucket_params_per_dp * job.dp) * grad_bytes_per_param(job)


def _gradient_dtype_bytes(job: Job) -> float:
    """Bytes of one gradient element as the framework holds it before the reduction: fp32 gradients in fp32/tf32
    training; mixed precision reduces its main gradients in fp32 (Megatron-Core accumulate_allreduce_grads_in_fp32,
    PyTorch AMP's fp32 master gradients) unless the plan reduces bf16, which then needs no cast."""
    return 4.0


def grad_codec_ops(job: Job, params: float) -> tuple[Compute, ...]:
    """Compute the gradient codec adds per reduction of ``params`` gradients: memory-bound passes
    (``comm_dtypes.codec_bytes_per_element``, counted op by op from commtax.measure.hooks and torch's
    fp16/bf16 hooks) or PowerSGD's GEMMs and orthogonalisation (``powersgd_codec_ops``). None when the
    gradients travel in the dtype they are held in (fp32; bf16 reduced from a bf16 training's own gradients
    is left uncast too: Megatron's bf16 reduction buffers hold the gradients themselves). A framework that copies
    gradients into its buckets and back (PyTorch DDP, ``Framework.grad_bucket_copies``) adds those passes."""
    if job.dp * job.plan.cp == 1:
        return ()
    copies = ()
    if job.plan.zero == 0 and job.plan.preset.grad_bucket_copies:
        # PyTorch DDP (gradient_as_bucket_view=False): gradient → bucket before, bucket → gradient after, g + g each
        copies = (_mem("ddp_bucket_copies", 4 * _gradient_dtype_bytes(job) * params),)
    return _format_codec_ops(job, params) + copies


def _format_codec_ops(job: Job, params: float) -> tuple[Compute, ...]:
    g = job.plan.grad_comm_dtype
    if g == "fp32" or (g in ("bf16", "fp16") and job.training.precision not in ("fp32", "tf32")):
        return ()
    rank = powersgd_rank(g)
    if rank is not None:
        ops = powersgd_codec_ops(weight_shapes(job), rank, job.dp * job.plan.cp, params)
        if job.plan.grad_error_feedback:
            ops += (_mem("powersgd_error_feedback", POWERSGD_ERROR_FEEDBACK_BYTES * params),)
        return ops
    n, ef = job.dp * job.plan.cp, job.plan.grad_error_feedback
    per_elem = codec_bytes_per_element(g, n, _gradient_dtype_bytes(job), ef)
    # fp8 conversions apart: a device may convert slower than it streams memory (GPU.convert_Gelem_s)
    casts = tuple(
        Compute(f"grad_codec_{c}", 0.0, k * CONVERT_BYTES * params, "memory", convert=c)
        for c, k in codec_conversions(g, n, ef).items()
    )
    return (_mem(f"grad_codec_{g}", per_elem * params - sum(c.bytes for c in casts)), *casts)


def powersgd_codec_ops(shapes: list[tuple[int, ...]], rank: int, n: int, params: float) -> tuple[Compute, ...]:
    """torch powerSGD_hook (fp32 bucket, warm start, no error feedback), per step, scaled to ``params`` elements.

    Per compressed m×k matrix M (``powersgd_compresses``): P = M·Q (torch.bmm, m×k·k×r), orthogonalise P,
    Q = Mᵀ·P (k×m·m×r), M = P·Qᵀ (m×r·r×k), plus the warm-started Q orthogonalised first. Gram-Schmidt
    (powerSGD_hook._orthogonalize_gram_schmidt) on an m×r matrix, column i with c = r−i−1 columns after it:
    ``col /= norm(col)`` 4m (norm) + 8m, and for c > 0 ``rest -= sum(col * rest) * col``: col·rest 4m + 8mc,
    sum 4mc, ·col 4m + 4mc, -= 12mc: 12m + (8m + 28mc). Vectors and matrices it does not compress: torch.cat
    4+4, ``.div_(n)`` 4+4, copied back 4+4: 24 B per element.
    """

    def ortho_bytes(m: int) -> float:
        return sum(12.0 * m + (8.0 * m + 28.0 * m * (rank - i - 1) if i + 1 < rank else 0.0) for i in range(rank))

    numel = sum(math.prod(s) for s in shapes)
    scale = params / max(1, numel)
    ops: list[Compute] = []
    flat, ortho, ortho_kernels = 0.0, 0.0, 0
    for s in shapes:
        rows, cols = s[0], math.prod(s) // s[0]
        if len(s) < 2 or not powersgd_compresses(rows, cols, rank):
            flat += math.prod(s)
            continue
        ops += [
            _gemm("powersgd_p", rows, rank, cols, 4.0),
            _gemm("powersgd_q", cols, rank, rows, 4.0),
            _gemm("powersgd_decompress", rows, cols, rank, 4.0),
        ]
        ortho += ortho_bytes(rows) + ortho_bytes(cols)
        ortho_kernels += 2 * (2 * rank + 4 * (rank - 1))
    ops = [Compute(o.name, o.flop * scale, o.bytes * scale, o.kind, o.m, o.n, o.k) for o in ops]
    ops.append(_mem("powersgd_orthogonalise", ortho * scale, kernels=max(1, ortho_kernels)))
    if flat:
        ops.append(_mem("powersgd_uncompressed", 24.0 * flat * scale))
    return tuple(ops)


def _dp_ops(job: Job, params: float) -> tuple[tuple[Collective, ...], tuple[Collective, ...]]:
    """DP traffic (Rajbhandari et al. 2020, ZeRO §5-7): per step for stages 0-2, per micro-batch for stage 3."""
    p = job.plan
    if job.dp * p.cp == 1:
        return (), ()
    g_bytes = grad_bytes_per_param(job)
    p_bytes = weight_bytes_per_param(job.training.precision)  # the working copies of the weights are gathered
    if p.zero == 0:
        return (collective_op("dp_grad_allreduce", "all_reduce", params * g_bytes, "dp"),), ()
    if p.zero == 1 and uses_bf16_optimizer(job):
        # BF16_Optimizer all-reduces the fp32 gradients (pipe/engine.py _exec_reduce_grads:
        # buffered_allreduce_fallback), then each rank updates its shard and the bf16 weights are all-gathered
        return (
            collective_op("dp_grad_allreduce", "all_reduce", params * g_bytes, "dp"),
            collective_op("dp_param_all_gather", "all_gather", params * p_bytes, "dp"),
        ), ()
    if p.zero in (1, 2):
        return (
            collective_op("dp_grad_reduce_scatter", "reduce_scatter", params * g_bytes, "dp"),
            collective_op("dp_param_all_gather", "all_gather", params * p_bytes, "dp"),
        ), ()
    # ZeRO-3 / FSDP: gather params for forward and again for backward, reduce-scatter grads, every micro-batch
    return (), (
        collective_op("zero3_gather_fwd", "all_gather", params * p_bytes, "dp"),
        collective_op("zero3_gather_bwd", "all_gather", params * p_bytes, "dp"),
        collective_op("zero3_grad_reduce_scatter", "reduce_scatter", params * g_bytes, "dp"),
    )


def layer_param_tensors(job: Job) -> tuple[float, ...]:
    """Elements of each parameter tensor of one transformer layer on one GPU (TP-sharded), as a framework
    registers them: what a per-tensor ZeRO-3 gather moves one call at a time.

    Megatron GPT layers (Megatron-LM/-DeepSpeed gpt_model, add_bias_linear default on; GPT-2/3 LayerNorm has a
    bias): input LayerNorm weight and bias, fused QKV weight and bias, attention output weight and bias, post-
    attention LayerNorm weight and bias, fc1 weight and bias, fc2 weight and bias: 12 tensors. Gated-MLP models
    (Llama family: RMSNorm, no linear biases, Touvron et al. 2023) have 2 norm weights and 4 matrices (the gate and
    up projections fused in one fc1, as Megatron does): 6 tensors. The matrices' elements sum to
    ``Model.layer_params`` (biases excepted: a few h per layer, not counted there).
    """
    m, t = job.model, job.plan.tp
    h, f = m.hidden, m.ffn
    qkv_out = h + 2 * m.kv_heads_ * m.head_dim
    fc1_out = (2 if m.gated_mlp else 1) * f
    mats = (h * qkv_out / t, h * h / t, h * fc1_out / t, f * h / t)
    if m.gated_mlp:
        return (float(h), mats[0], mats[1], float(h), mats[2], mats[3])
    return (
        float(h),
        float(h),
        mats[0],
        qkv_out / t,
        mats[1],
        float(h),
        float(h),
        float(h),
        mats[2],
        fc1_out / t,
        mats[3],
        float(h),
    )


def _zero3_tensors(job: Job, params: dict[str, float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(one layer's tensors, the stage's other tensors: word embedding, LM head, final norm) for per-tensor gathers."""
    p = job.plan
    if p.zero != 3 or job.dp * p.cp == 1:
        return (), ()
    others: list[float] = []
    if p.pp == 1:
        others += [params["embed"]] + ([params["head"]] if params["head"] else [])
    else:
        others.append(max(params["embed"], params["head"]))
    others.append(float(job.model.hidden))  # final norm weight
    return layer_param_tensors(job), tuple(others)


# The builders' results, each kept by the values it read of the job (``spec.reads``): the blocks of plans that differ
# only in fields a builder never read (dp, pp, ZeRO stage, schedule; recompute for the layer's forward and backward)
# are one object. Model, training and the assumptions in force are the root key (``_specs_root``), not traced.
_UNTRACED = frozenset({"model", "training"})
# (layer, embed, head, MoE layer) of a job
_BLOCKS: ReadsCache[tuple[Block, Block, Block, Block | None]] = ReadsCache(_UNTRACED)
_LAYER_PASSES: ReadsCache[_LayerPasses] = ReadsCache(_UNTRACED)
_HEADS: ReadsCache[Block] = ReadsCache(_UNTRACED)
_EMBEDS: ReadsCache[Block] = ReadsCache(_UNTRACED)
# each distinct phase of those blocks, by value: equal phases of different blocks (a head's forward for equal token
# counts) are one object, so that the price caches (``costs.pricing``) find a phase by identity instead of
# comparing its ~30 ops each time. Equal values: the same prices.
_PHASES: dict[Phase, Phase] = {}
_PHASES_LIMIT = 16384


def _specs_root(job: Job, *extra: Hashable) -> tuple:
    """The root key of the builders' caches: the model, training and assumptions in force (the fp8 casts read
    them), hashed once for the specs met last."""
    return (_specs_key(job.model, job.training, default_assumptions()), *extra)


def _blocks(job: Job) -> tuple[Block, Block, Block, Block | None]:
    """(layer, embed, head, MoE layer) of the job, made once per values they read, their phases interned."""
    return _BLOCKS.get(_specs_root(job), job, _build_blocks)


def _build_blocks(job: Job) -> tuple[Block, Block, Block, Block | None]:
    moe = _layer_block(job, moe=True) if job.model.is_moe else None
    return _layer_block(job), _embed_block(job), _head_block(job), moe


def _head_block(job: Job) -> Block:
    """The last stage's final norm, logits and loss (and MTP modules), built once per values it reads."""
    return _HEADS.get(_specs_root(job), job, _interned_head)


def _interned_head(job: Job) -> Block:
    return _interned(_build_head_block(job))


def _embed_block(job: Job) -> Block:
    """The first stage's embedding, built once per values it reads."""
    return _EMBEDS.get(_specs_root(job), job, _interned_embed)


def _interned_embed(job: Job) -> Block:
    return _interned(_build_embed_block(job))


def _specs_key(model: Any, training: Any, assumptions: Any) -> HashedOnce:
    """The builders' root key's specs part, hashed once (a search builds ~2,000 workloads of one job's specs)."""
    return held_key("blocks specs", (model, training, assumptions), lambda *v: HashedOnce(v, hash(v)))


def _intern(ph: Phase) -> Phase:
    """``ph``, or the equal phase met before (``_PHASES``)."""
    if len(_PHASES) >= _PHASES_LIMIT:
        _PHASES.clear()
    return _PHASES.setdefault(ph, ph)


def _interned(b: Block) -> Block:
    """``b`` with each phase replaced by an equal one met before (``_PHASES``)."""
    f, bw, r = _intern(b.fwd), _intern(b.bwd), _intern(b.recompute)
    return b if f is b.fwd and bw is b.bwd and r is b.recompute else Block(b.name, f, bw, r)


def _moe_dp_fields(job: Job, split: tuple[float, float]) -> dict:
    """The DP fields of an MoE workload sized for one pipeline rank's (dense, expert) parameters: dense gradients
    reduce over dp, expert gradients over edp (Megatron-Core expert_data_parallel group), and the distributed
    optimizer shards dense states over dp·cp, expert states over edp."""
    p = job.plan
    dense, experts = split
    dp_step, dp_mb = _dp_ops(job, dense)
    edp_step = _edp_ops(job, experts)
    if not dp_step and not dp_mb:  # dense weights unreplicated (dp·cp = 1): only the experts' reduction runs
        dp_step, edp_step = edp_step, ()
    shard = job.dp * p.cp if p.zero >= 1 else 1
    adam = adam_bytes_per_param(job.training.precision)
    optimizer_bytes = adam * (dense / shard + experts / (job.edp if p.zero >= 1 else 1))
    return {
        "dp_step": dp_step,
        "dp_microbatch": dp_mb,
        "edp_step": edp_step,
        "optimizer": _mem("adam", optimizer_bytes),
        "dp_codec": grad_codec_ops(job, dense) if dp_step else (),  # what the dense DP codec sees
        "dp_split": split,
    }


def with_dp_stage(job: Job, wl: Workload, split: tuple[float, float]) -> Workload:
    """``wl`` with its DP/EDP ops and optimizer sized for the pipeline rank holding ``split`` (dense, expert)
    parameters, one of ``wl.dp_stage_splits`` (MoE jobs; a dense workload is returned as it is)."""
    if not job.model.is_moe or split == wl.dp_split:
        return wl
    return replace(wl, **_moe_dp_fields(job, split))


def pp_send(job: Job) -> Collective:
    """The activation (forward) or its gradient (backward) one micro-batch sends across a stage boundary: Megatron
    sends the sequence-sharded activation per TP rank (Narayanan 2021 §4.1 scatter/gather)."""
    p, tr = job.plan, job.training
    act_bytes = activation_bytes_per_element(tr.precision)
    send_bytes = job.micro_batch_tokens * job.model.hidden * act_bytes / p.tp
    return collective_op("pp_send", "send_recv", send_bytes, "pp")


def pass_workload(job: Job) -> Workload:
    """What the stages' passes read of ``build_workload(job)``: the blocks, the pipeline send, the split and the
    micro-batch count, as ``build_workload`` has them; no per-step DP ops, optimizer step or parameter counts (left
    empty). A search prices the stages of many plans that differ in their DP from one of these
    (``schedule.analytical.stage_times``, ``pp_exposed``)."""
    layer, embed, head, moe_layer = _blocks(job)
    return new_workload(
        layer=layer,
        embed=embed,
        head=head,
        layers_per_stage=max(job.stage_layers),
        pp_send=pp_send(job),
        dp_step=(),
        dp_microbatch=(),
        optimizer=_NO_OPTIMIZER,
        micro_batches=job.micro_batches,
        model_flop_per_step=0.0,
        chunk_layers=job.chunk_layers,
        moe_layer=moe_layer,
        stage_moe_layers=stage_moe_layers(job),
    )


def build_workload(job: Job) -> Workload:
    p, tr = job.plan, job.training
    chunk_layers, stage_layers = job.chunk_layers, job.stage_layers  # read once (each read runs pipeline_split)
    params = _params_per_gpu(job, stage_layers)
    if job.model.is_moe:
        # sized for the rank with the most parameters; the schedule re-sizes them for the rank whose DP (dense +
        # expert) time is the largest (``analytical.slowest_dp_workload``): a rank without experts has no edp
        splits = tuple(dict.fromkeys(stage_param_split(job)))
        dp = _moe_dp_fields(job, max(splits, key=sum)) | {"dp_stage_splits": splits}
    else:
        fullest = max(_stage_params(job, params, stage_layers))  # DP and the optimizer of the fullest stage
        shard = job.dp * p.cp if p.zero >= 1 else 1
        dp_step, dp_mb = _dp_ops(job, fullest)
        dp = {
            "dp_step": dp_step,
            "dp_microbatch": dp_mb,
            "optimizer": _mem("adam", adam_bytes_per_param(tr.precision) * fullest / shard),
            "dp_codec": grad_codec_ops(job, fullest) if dp_step else (),
        }
    tokens_per_step = tr.global_batch * tr.seq_len
    layer_tensors, other_tensors = _zero3_tensors(job, params)
    # DeepSpeed's per-parameter hooks gather again for the recomputed forward (checkpointed layers re-enter the
    # module's pre-forward hook); FSDP keeps the unit gathered through its backward, recompute included
    sync = p.zero3_gather == "per_parameter_sync"
    layer, embed, head, moe_layer = _blocks(job)
    return new_workload(
        layer=layer,
        embed=embed,
        head=head,
        layers_per_stage=max(stage_layers),
        pp_send=pp_send(job),
        micro_batches=job.micro_batches,
        model_flop_per_step=model_flop_per_token(job) * tokens_per_step,
        params_per_gpu=params,
        bucket_bytes=grad_bucket_bytes(job),
        chunk_layers=chunk_layers,
        zero3_layer_tensors=layer_tensors,
        zero3_other_tensors=other_tensors,
        zero3_gather_passes=3 if sync and p.recompute == "full" else 2,
        grads_sharded=p.zero == 2,
        moe_layer=moe_layer,
        stage_moe_layers=stage_moe_layers(job),
        **dp,
    )


def _edp_ops(job: Job, params: float) -> tuple[Collective, ...]:
    """Expert-gradient traffic over the expert-data-parallel group, once per step: all-reduce (ZeRO-0) or the
    distributed optimizer's reduce-scatter and parameter all-gather (Megatron-Core shards expert optimizer
    states over edp); ZeRO-3 is priced the same way for the experts."""
    if job.edp == 1 or params == 0:
        return ()
    g_bytes = grad_bytes_per_param(job)
    p_bytes = weight_bytes_per_param(job.training.precision)
    if job.plan.zero == 0:
        return (collective_op("edp_grad_allreduce", "all_reduce", params * g_bytes, "edp"),)
    return (
        collective_op("edp_grad_reduce_scatter", "reduce_scatter", params * g_bytes, "edp"),
        collective_op("edp_param_all_gather", "all_gather", params * p_bytes, "edp"),
    )
