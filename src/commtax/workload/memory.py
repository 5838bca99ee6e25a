"""Per-GPU memory of the fullest pipeline stage: each stage's own layers, embedding (first) or head (last),
and in-flight micro-batches (the first holds the most), the largest total reported.

Model states follow ZeRO (Rajbhandari et al. 2020, §3.1): mixed-precision Adam keeps 2 B of
bf16/fp16 weights, 2 B of gradients (4 B when reduced in fp32) and 12 B of fp32 master
weights + Adam moments per parameter (fp32/tf32 training: 4 B weights, 4 B grads, 8 B moments);
ZeRO stage 1/2/3 shards optimizer / + gradients /
+ weights over the data-parallel (× context-parallel) group. Activations follow Korthikanti
et al. 2022, eq. 1-2 and Table 2, generalised to GQA and gated MLPs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from commtax.spec import Job
from commtax.spec.assumptions import Assumptions, assumptions_for
from commtax.units import GiB
from commtax.workload.step import (
    activation_bytes_per_element,
    grad_bytes_per_param,
    optimizer_bytes_per_param,
    stage_moe_layers,
    stage_param_split,
    stage_params,
    weight_bytes_per_param,
)


@dataclass(frozen=True)
class Memory:
    weights: float  # bytes
    grads: float
    optimizer: float
    activations: float
    reserve: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.reserve

    def gib(self) -> dict[str, float]:
        return {
            "weights": self.weights / GiB,
            "grads": self.grads / GiB,
            "optimizer": self.optimizer / GiB,
            "activations": self.activations / GiB,
            "reserve": self.reserve / GiB,
            "total": self.total / GiB,
        }


def layer_activation_bytes(job: Job, recompute: str | None = None, mlp: bool = True) -> float:
    """Bytes one layer keeps for backward, one micro-batch, one GPU (Korthikanti 2022 §4, generalised).

    Norm inputs 4sbh; GEMM inputs (QKV, projection, MLP up, MLP down) at 2 B, or 1 B under fp8 where
    Transformer Engine saves the fp8 cast; Q 2sbh and K, V 4sb·g·d for attention; the activation input
    2sb·f_up; dropout masks sbh ×2 when dropout is on; + 5·a·s²·b for unfused attention without selective
    recompute. TP shards all but the norm inputs, QKV and MLP inputs and masks, unless SP shards those too.
    MHA, f = 4h, bf16, dropout: 10sbh + 24sbh/t (+5as²b/t), Korthikanti eq. 2.

    Selective recompute modules (Megatron-Core recompute_modules) drop what they re-run: core_attn the scores of
    unfused attention; layernorm the two norm outputs (the QKV and MLP GEMM inputs, 2sbh at the GEMM input width);
    mla_up_proj the up-projected Q, K, V (this formula's Q and K, V terms, 2sbh + 4sb·g·d); mlp, on a dense layer
    (``mlp``), its MLP activations (a·sb·f_up + sb·f at the GEMM input width, over t).
    """
    m, p, tr = job.model, job.plan, job.training
    b, s, t = p.micro_batch, tr.seq_len // p.cp, p.tp
    h, f, gd = m.hidden, m.ffn, m.kv_heads_ * m.head_dim
    recompute = recompute or p.recompute
    a = activation_bytes_per_element(tr.precision)
    h_rep = h / (t if p.sequence_parallel else 1)  # a hidden-sized tensor outside the TP region
    if recompute == "full":
        return a * s * b * h_rep  # only each layer's input is kept
    if recompute == "selective" and p.selective_policy == "per_op":
        return per_op_selective_bytes(job)
    gemm_in = 1.0 if tr.precision == "fp8" else a
    masks = 2.0 if job.dropout else 0.0
    replicated = (2 * a + 2 * gemm_in + masks) * s * b * h  # norm inputs, QKV and MLP inputs, dropout masks
    f_up = (2 if m.gated_mlp else 1) * f
    sharded = (a + gemm_in) * s * b * h + 2 * a * s * b * gd + a * s * b * f_up + gemm_in * s * b * f
    mods = p.recomputed_under(recompute)
    scores = 0.0
    if not p.flash_attention and (recompute == "none" or (mods and "core_attn" not in mods)):
        scores = (5.0 if job.dropout else 2.0) * m.heads * s * tr.seq_len * b
    if "layernorm" in mods:  # output-discarding checkpoint of input_layernorm and pre_mlp_layernorm
        replicated -= 2 * gemm_in * s * b * h
    if "mla_up_proj" in mods and m.mla:  # output-discarding checkpoint of the q/kv up-projections and RoPE
        sharded -= a * s * b * h + 2 * a * s * b * gd
    if "mlp" in mods and mlp:  # the dense MLP checkpointed: its input only (counted as the MLP input)
        sharded -= a * s * b * f_up + gemm_in * s * b * f
    replicated, sharded = max(0.0, replicated), max(0.0, sharded)
    if p.sequence_parallel:
        return (replicated + sharded + scores) / t
    return replicated + (sharded + scores) / t


def moe_layer_activation_bytes(job: Job) -> float:
    """Bytes one MoE layer keeps for backward, one micro-batch, one GPU: the dense layer's minus its MLP
    activations (Korthikanti: a·sb·f_up + sb·f at the GEMM input width, over t), plus the dispatched tokens'
    (``workload.moe.dispatched_activation_bytes``). Full recompute keeps the layer input only, as dense."""
    from commtax.workload.moe import dispatched_activation_bytes

    m, p, tr = job.model, job.plan, job.training
    dense = layer_activation_bytes(job, mlp=False)
    if p.recompute == "full":
        return dense
    b, s, t = p.micro_batch, tr.seq_len // p.cp, p.tp
    a = activation_bytes_per_element(tr.precision)
    gemm_in = 1.0 if tr.precision == "fp8" else a
    mlp = (a * s * b * (2 if m.gated_mlp else 1) * m.ffn + gemm_in * s * b * m.ffn) / t
    return max(0.0, dense - mlp) + dispatched_activation_bytes(job, a, p.recomputed)


def per_op_selective_bytes(job: Job) -> float:
    """Bytes one layer keeps under torchtitan's per-op selective checkpointing, one micro-batch, one GPU.

    torchtitan (models/llama/parallelize_llama.py, ``_save_list`` policy): the block input is kept; of the ops
    inside, the outputs of matmuls (every other one: wq, wv, w1, w2 of wq, wk, wv, wo, w1, w3, w2), of the
    attention kernel and of reduce-scatters are saved, everything else is recomputed in backward. Per token:
    input h + q h/t + v gd/t + w1 f/t + w2 output h + attention output h/t (hidden-sized tensors outside the TP
    region are sharded by sequence parallelism).
    """
    m, p, tr = job.model, job.plan, job.training
    b, s, t = p.micro_batch, tr.seq_len // p.cp, p.tp
    h, f, gd = m.hidden, m.ffn, m.kv_heads_ * m.head_dim
    a = activation_bytes_per_element(tr.precision)
    h_rep = h / (t if p.sequence_parallel else 1)
    return a * s * b * (h_rep + h / t + gd / t + f / t + h_rep + h / t)


def in_flight_micro_batches(job: Job, stage: int = 0) -> float:
    """Micro-batches whose activations pipeline rank ``stage`` holds at peak (the first holds the most):
    ``in_flight_by_stage``'s."""
    return in_flight_by_stage(job, (stage,))[0]


def in_flight_by_stage(job: Job, stages: Iterable[int]) -> list[float]:
    """Micro-batches whose activations each of pipeline ranks ``stages`` holds at peak (the first holds the most).

    1F1B: p − s (Narayanan 2021 §2.2.1: stage s runs p − s − 1 warm-up forwards, then one more before its first
    backward); interleaved: its warm-up chunk forwards, 2(p − s − 1) + (v − 1)·p, plus one, each 1/v of the
    stage's layers (Megatron-Core get_pipeline_parallel_order / schedules.py): p·(1 + (p−1)/(p·v)) on the first
    (Korthikanti §4.2.3); GPipe: all m; ZB-H1 and ZB-V p on every stage (Qi et al. 2023); never more than m.
    The plan and its micro-batch count are read once for all the stages (a search asks for ~10^4 ranks).
    """
    p, m = job.plan, job.micro_batches
    if p.pp == 1:
        return [1.0 for _ in stages]
    if p.schedule == "gpipe":
        return [float(m) for _ in stages]
    if p.schedule in ("zb-h1", "zb-v"):
        # Qi et al. 2023: every stage holds p micro-batches (ZB-H1 defers stage s's W passes by s: p − s − 1 warm-up
        # forwards + 1 + s), 1F1B's first stage; counted in full (a W-pending micro-batch keeps less: an upper bound)
        return [min(float(m), float(p.pp)) for _ in stages]
    if p.schedule in ("dualpipe", "dualpipev"):  # DeepSeek-V3 Table 2: PP + 1 micro-batches' activations
        return [min(float(m), float(p.pp + 1)) for _ in stages]
    if p.vp > 1:
        # the remainder of m mod p joins the first group (1f1b-flexible; schedule.sim.pipeline.interleaved_order)
        first_group = p.pp + m % p.pp if m >= p.pp else m
        return [min(float(m), (2 * (p.pp - stage - 1) + (p.vp - 1) * first_group + 1) / p.vp) for stage in stages]
    return [min(float(m), float(p.pp - stage)) for stage in stages]


@lru_cache(maxsize=4096)
def _kinds(stage_layers: tuple[int, ...]) -> tuple[int, ...]:
    p = len(stage_layers)
    first: dict[tuple[int, bool, bool], int] = {}
    for s, n in enumerate(stage_layers):
        first.setdefault((n, s == 0, s == p - 1), s)
    return tuple(sorted(first.values()))


def stage_kinds(job: Job) -> tuple[int, ...]:
    """The stages that can be the fullest: the first of each kind (its layers; first; last). In-flight
    micro-batches never grow with the stage index (``in_flight_micro_batches``), so a later stage of the
    same kind holds no more."""
    return _kinds(job.stage_layers)


def stage_activation_bytes(job: Job, stages: Iterable[int] | None = None, recompute: str | None = None) -> list[float]:
    """Activation bytes of pipeline ranks ``stages`` (default: all): its layers × in-flight micro-batches, the
    embedding output on the first and the fp32 logits on the last (pp == 1: both). ``recompute``: the plan's, or
    another value of it (a search's grid: no job copy per value; MoE jobs take the plan's)."""
    return stage_activation_bytes_by_recompute(job, stages, (recompute,))[0]


def layer_bytes_by_recompute(job: Job, recomputes: Sequence[str | None]) -> list[tuple[float, float]]:
    """Per value of ``recomputes`` (None: the plan's; MoE: the plan's always): the bytes one layer keeps
    (``layer_activation_bytes``) and, under full recompute, those the recomputed layer materialises once. They read
    the micro-batch, tp, cp, sp and recompute, not the pipeline (pp, vp): ``stage_activation_bytes_by_recompute``
    takes them from a caller that prices many pipelines of one layer (search)."""
    out = []
    for recompute in recomputes:
        recompute = job.plan.recompute if recompute is None or job.model.is_moe else recompute
        per_layer = layer_activation_bytes(job, recompute)
        out.append((per_layer, layer_activation_bytes(job, recompute="none") if recompute == "full" else 0.0))
    return out


def stage_activation_bytes_by_recompute(
    job: Job,
    stages: Iterable[int] | None,
    recomputes: Sequence[str | None],
    layer_bytes: Sequence[tuple[float, float]] | None = None,
) -> list[list[float]]:
    """``stage_activation_bytes`` for each of ``recomputes`` (None: the plan's), what does not depend on it
    (the split, in-flight micro-batches, embedding and logits) computed once. ``layer_bytes``:
    ``layer_bytes_by_recompute(job, recomputes)`` when the caller has it."""
    m, p = job.model, job.plan
    moe_layers = stage_moe_layers(job)
    per_moe_layer = moe_layer_activation_bytes(job) if moe_layers else 0.0
    embedding, logits = end_activation_bytes(job)
    split = job.stage_layers
    ranks = []
    stages = range(p.pp) if stages is None else list(stages)
    for s, in_flight in zip(stages, in_flight_by_stage(job, stages)):
        held = loss_micro_batches(job, in_flight)
        ranks.append((split[s], in_flight, s == 0, s == p.pp - 1, held, moe_layers[s] if moe_layers else 0))
    out = []
    for per_layer, full_layer in layer_bytes or layer_bytes_by_recompute(job, recomputes):
        mtp_layer = per_moe_layer if moe_layers else per_layer
        out.append(
            [
                stage_activations(
                    layers,
                    in_flight,
                    per_layer,
                    full_layer,
                    first,
                    last,
                    embedding,
                    logits,
                    held,
                    n_moe * (per_moe_layer - per_layer),
                    mtp_layer,
                    m.mtp_layers,
                )
                for layers, in_flight, first, last, held, n_moe in ranks
            ]
        )
    return out


def end_activation_bytes(job: Job) -> tuple[float, float]:
    """(embedding output, fp32 logits) bytes of one micro-batch on one GPU: what the first and the last pipeline
    rank keep beside their layers (``stage_activations``)."""
    m, p, tr = job.model, job.plan, job.training
    tokens = job.micro_batch_tokens
    embedding = activation_bytes_per_element(tr.precision) * tokens * m.hidden / (p.tp if p.sequence_parallel else 1)
    return embedding, 4.0 * tokens * m.vocab / p.tp


def stage_activations(
    layers, in_flight, per_layer, full_layer, first, last, embedding, logits, held, moe_extra, mtp_layer, mtp_layers
):
    """Activation bytes of one pipeline rank: its ``layers`` × the bytes one layer keeps × in-flight micro-batches
    (MoE layers: ``moe_extra`` = their count × what an MoE layer keeps beyond a dense one), the layer being
    recomputed once under full recompute (``full_layer``), the embedding output on the first rank, on the last the
    fp32 logits of its ``held`` micro-batches (``loss_micro_batches``) and its MTP modules (their layer, the
    embedding and normed inputs, another fp32 logits: DeepSeek-V3 §2.2). Elementwise: floats, or arrays of a
    search's grid (first, last: bools; a term a rank lacks adds an exact 0)."""
    acts = layers * per_layer * in_flight + moe_extra * in_flight
    acts = acts + full_layer * (layers > 0)  # full recompute: the recomputed layer materialises its activations once
    acts = acts + embedding * first
    acts = acts + logits * held * last
    return acts + mtp_layers * ((mtp_layer + 3 * embedding) * in_flight + logits * held) * last


def loss_micro_batches(job: Job, in_flight: float) -> float:
    """Micro-batches whose fp32 logits the last pipeline rank holds at peak: its in-flight ones; under DualPipe one,
    the rank that ends a direction runs each micro-batch's loss chunk forward then backward in turn (DeepSeek-V3
    §3.2.1, Fig. 5), its PP + 1 in-flight micro-batches (Table 2) being its layer chunks'."""
    if job.plan.pp == 1 or job.plan.schedule in ("dualpipe", "dualpipev"):
        return 1.0
    return in_flight


def activation_bytes(job: Job) -> float:
    """Activation bytes of the fullest stage (``memory``'s)."""
    return memory(job).activations


def fixed_reserve_bytes(tp: int, pp: int, cp: int, dp: int, a: Assumptions) -> float:
    """Device memory outside the model's tensors that does not grow with them: the CUDA context and
    library workspaces, and NCCL's buffers for each parallel group with more than one rank
    (catalog/assumptions.yaml: cuda_context_GiB, nccl_group_GiB)."""
    groups = sum(1 for n in (tp, pp, cp, dp) if n > 1)
    return (a.v("cuda_context_GiB") + groups * a.v("nccl_group_GiB")) * GiB


def reserve_bytes(job: Job, activations: float) -> float:
    """What the framework holds besides weights, grads, optimizer and activations: the fixed part, plus the
    caching allocator's fragmentation, charged on the activations that churn every micro-batch. A 24 GiB card
    running a small job reserves ~1 GiB, an 8-way-parallel job with 40 GiB of activations ~5-6 GiB."""
    fixed, fragmentation = reserve_terms(job)
    return fixed + fragmentation * activations


def reserve_terms(job: Job) -> tuple[float, float]:
    """``reserve_bytes``' two terms: the fixed bytes and the share of the activations (the same for every stage)."""
    a = assumptions_for(job.cluster.profile)
    p = job.plan
    return fixed_reserve_bytes(p.tp, p.pp, p.cp, job.dp, a), a.v("allocator_fragmentation")


def stage_states(job: Job, stages: Iterable[int] | None = None) -> list[tuple[float, float, float]]:
    """(weights, gradients, optimizer) bytes of pipeline ranks ``stages`` (default: all), ZeRO-sharded
    (Rajbhandari et al. 2020 §3.1), at the precision's weight and optimizer widths."""
    p, prec = job.plan, job.training.precision
    shard = job.dp * p.cp
    w_bytes = weight_bytes_per_param(prec)
    g_bytes = max(
        w_bytes, grad_bytes_per_param(job)
    )  # gradients are kept at the weights' width even if sent compressed
    o_bytes = optimizer_bytes_per_param(prec)
    if job.model.is_moe:
        # dense states shard over dp·cp, expert states over edp (Megatron-Core distributed optimizer, per buffer);
        # DualPipe keeps two copies of the parameters (arXiv 2412.19437 Table 2), DualPipeV one
        copies = 2.0 if p.schedule == "dualpipe" else 1.0
        split = stage_param_split(job)
        rows = []
        for d, e in split if stages is None else [split[s] for s in stages]:
            rows.append(
                (
                    copies * w_bytes * (d / (shard if p.zero >= 3 else 1) + e / (job.edp if p.zero >= 3 else 1)),
                    copies * g_bytes * (d / (shard if p.zero >= 2 else 1) + e / (job.edp if p.zero >= 2 else 1)),
                    o_bytes * (d / (shard if p.zero >= 1 else 1) + e / (job.edp if p.zero >= 1 else 1)),
                )
            )
        return rows
    params = stage_params(job)
    return [
        (
            w_bytes * n / (shard if p.zero >= 3 else 1),
            g_bytes * n / (shard if p.zero >= 2 else 1),
            o_bytes * n / (shard if p.zero >= 1 else 1),
        )
        for n in (params if stages is None else [params[s] for s in stages])
    ]


def stage_memory(job: Job, stages: Iterable[int] | None = None) -> list[Memory]:
    """Memory of pipeline ranks ``stages`` (default: all, first to last)."""
    stages = None if stages is None else list(stages)
    fixed, fragmentation = reserve_terms(job)  # ``reserve_bytes``, its terms read once
    return [
        Memory(w, g, o, a, fixed + fragmentation * a)
        for (w, g, o), a in zip(stage_states(job, stages), stage_activation_bytes(job, stages))
    ]


def memory(job: Job) -> Memory:
    """Memory of the fullest pipeline rank (the first of equals; only the first stage of each kind can be it)."""
    return max(stage_memory(job, stage_kinds(job)), key=lambda x: x.total)
