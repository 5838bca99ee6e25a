"""The training step as operations: what one GPU computes and communicates.

Everything downstream (estimate, simulator, search) reads these ops; nothing downstream
re-derives model arithmetic. Notation (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models"): b micro-batch, s local sequence (seq_len/cp),
h hidden, a heads, g KV heads, d head dim, f FFN size, V vocabulary, t TP degree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commtax.comm_dtypes import bytes_per_element, powersgd_rank
from commtax.spec import BYTES_PER, Job

# torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25): gradients are reduced in 25 MiB buckets
DDP_BUCKET_BYTES = 25 * 2**20
# Bytes/elem of the Adam update in mixed precision: read fp32 param, grad, m, v; write param, m, v, bf16 copy.
ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2


@dataclass(frozen=True, slots=True)
class Compute:
    name: str
    flop: float  # executed FLOPs on this GPU (hardware FLOPs)
    bytes: float  # HBM traffic
    kind: str  # "gemm" | "attention" | "memory"
    m: int = 0  # GEMM shape (m×k)·(k×n); 0 for non-GEMM ops
    n: int = 0
    k: int = 0


@dataclass(frozen=True, slots=True)
class Collective:
    name: str
    op: str  # all_reduce | all_gather | reduce_scatter | send_recv | ...
    bytes: float  # nccl-tests message size: the whole buffer
    group: str  # tp | cp | dp | pp


Op = Compute | Collective


@dataclass(frozen=True)
class Phase:
    """Ops of one pass (forward, backward or recompute) of one layer or one model end."""

    ops: tuple[Op, ...]

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


@dataclass(frozen=True)
class Workload:
    """One training step of one GPU on each pipeline stage, per micro-batch, plus per-step ops."""

    layer: Block  # one transformer layer, one micro-batch
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


def _gemm(name: str, m: int, n: int, k: int, dtype_bytes: float, fp8: bool = False) -> Compute:
    """(m×k)·(k×n): 2mnk FLOPs; reads A and B, writes C (bytes at the activation dtype, fp8 inputs 1 B)."""
    in_bytes = 1.0 if fp8 else dtype_bytes
    return Compute(name, 2.0 * m * n * k, in_bytes * (m * k + k * n) + dtype_bytes * m * n, "gemm", m, n, k)


def _mem(name: str, nbytes: float) -> Compute:
    return Compute(name, 0.0, nbytes, "memory")


def _fp8_casts(name: str, elems: float) -> Compute:
    """Transformer Engine casts each GEMM input to fp8: read 2 B, write 1 B, plus an amax pass (read 2 B)."""
    return _mem(name, 5.0 * elems)


def _layer_gemms(job: Job, tokens: int) -> list[tuple[str, int, int, int]]:
    """Forward GEMMs of one layer on one TP rank: (name, m, n, k)."""
    m, t = job.model, job.plan.tp
    h, d, f = m.hidden, m.head_dim, m.ffn
    q_kv = (m.heads + 2 * m.kv_heads_) * d
    up = (2 if m.gated_mlp else 1) * f
    return [
        ("qkv", tokens, q_kv // t, h),
        ("attn_proj", tokens, h, m.heads * d // t),
        ("mlp_up", tokens, up // t, h),
        ("mlp_down", tokens, h, f // t),
    ]


def attention_flop(job: Job, causal: bool) -> float:
    """Score QKᵀ and context PV: 2 matmuls of 2·b·(a/t)·s·S·d FLOPs each; causal halves the work done.

    With context parallelism each rank's s = S/cp queries meet all S keys (ring attention).
    """
    m, p, tr = job.model, job.plan, job.training
    s_local, s_full = tr.seq_len // p.cp, tr.seq_len
    full = 4.0 * p.micro_batch * (m.heads // p.tp) * s_local * s_full * m.head_dim
    return full / 2 if causal else full


def _tp_comm(job: Job, act_bytes: float, tokens_full: int) -> list[Collective]:
    """TP collectives of one layer-pass: 2 all-reduces, or with SP 2×(all-gather + reduce-scatter) (Korthikanti §4.2.2)."""
    p, h = job.plan, job.model.hidden
    if p.tp == 1:
        return []
    buf = tokens_full * h * act_bytes
    if p.sequence_parallel:
        return [
            Collective("tp_ag_attn", "all_gather", buf, "tp"),
            Collective("tp_rs_attn", "reduce_scatter", buf, "tp"),
            Collective("tp_ag_mlp", "all_gather", buf, "tp"),
            Collective("tp_rs_mlp", "reduce_scatter", buf, "tp"),
        ]
    return [Collective("tp_ar_attn", "all_reduce", buf, "tp"), Collective("tp_ar_mlp", "all_reduce", buf, "tp")]


def _cp_comm(job: Job, act_bytes: float, backward: bool) -> list[Collective]:
    """Ring attention: K and V of every CP rank pass round the ring; backward also returns dK, dV."""
    p, m, tr = job.plan, job.model, job.training
    if p.cp == 1:
        return []
    kv_local = 2 * p.micro_batch * (tr.seq_len // p.cp) * (m.kv_heads_ * m.head_dim // p.tp) * act_bytes
    ops = [Collective("cp_kv", "all_gather", kv_local * p.cp, "cp")]
    if backward:
        ops.append(Collective("cp_dkv", "reduce_scatter", kv_local * p.cp, "cp"))
    return ops


def _elementwise_bytes(job: Job, act_bytes: float) -> dict[str, float]:
    """HBM bytes of one layer's non-GEMM forward ops (norms, activations, dropout, residuals)."""
    m, p, tr = job.model, job.plan, job.training
    b, s, t = p.micro_batch, tr.seq_len // p.cp, p.tp
    bsh = b * s * m.hidden
    # norms, dropout and residual adds are replicated on each TP rank unless sequence-parallel
    bsh_rep = bsh / t if p.sequence_parallel else bsh
    bsf = b * s * m.ffn / t
    # residual add: read 2, write 1; fused dropout adds a mask write (bias-dropout-add, Megatron)
    residual = (3 * act_bytes + (1 if job.dropout else 0)) * bsh_rep
    out = {
        "norms": 2 * 2 * bsh_rep * act_bytes,  # 2 norms: read x, write y
        "residual": 2 * residual,
        "activation": (3 if m.gated_mlp else 2) * bsf * act_bytes,  # SwiGLU reads 2 writes 1; GeLU reads 1 writes 1
    }
    if not p.flash_attention:
        # unfused attention writes the b·(a/t)·s² scores: GEMM out 2 B, softmax r/w 4 B, read by PV 2 B;
        # attention dropout adds r/w + mask 5 B (Megatron's fused scale-mask-softmax, then dropout)
        per_elem = 8.0 + (5.0 if job.dropout else 0.0)
        out["attn_scores"] = per_elem * b * (m.heads / t) * s * tr.seq_len
    return out


def _layer_block(job: Job) -> Block:
    p, tr = job.plan, job.training
    act_bytes = BYTES_PER[tr.precision] if tr.precision not in ("fp8", "int8") else 2.0
    fp8 = tr.precision == "fp8"
    tokens = p.micro_batch * tr.seq_len // p.cp
    gemms = _layer_gemms(job, tokens)
    fwd_gemm = [_gemm(n, mm, nn, kk, act_bytes, fp8) for n, mm, nn, kk in gemms]
    # backward: dgrad (m×n)·(n×k) and wgrad (k×m)·(m×n), each as many FLOPs as forward
    bwd_gemm = []
    for n, mm, nn, kk in gemms:
        bwd_gemm.append(_gemm(f"{n}_dgrad", mm, kk, nn, act_bytes, fp8))
        bwd_gemm.append(_gemm(f"{n}_wgrad", kk, nn, mm, act_bytes, fp8))
    attn_f = attention_flop(job, causal=True)
    # FlashAttention-2 backward runs 5 matmuls to the forward's 2 (Dao 2023, §3.1.2): 2.5× the forward FLOPs
    attn_fwd = Compute("attention", attn_f, 0.0, "attention")
    attn_bwd = Compute("attention_bwd", 2.5 * attn_f, 0.0, "attention")
    ew = _elementwise_bytes(job, act_bytes)
    ew_fwd = [_mem(k, v) for k, v in ew.items()]
    ew_bwd = [_mem(f"{k}_bwd", 2 * v) for k, v in ew.items()]  # backward reads saved input and grad, writes grad
    casts_fwd: list[Compute] = []
    casts_bwd: list[Compute] = []
    if fp8:
        casts_fwd = [_fp8_casts(f"{n}_cast", mm * kk + kk * nn) for n, mm, nn, kk in gemms]
        casts_bwd = [_fp8_casts(f"{n}_grad_cast", mm * nn) for n, mm, nn, kk in gemms]
    tokens_full = p.micro_batch * tr.seq_len // p.cp
    tp_fwd = _tp_comm(job, act_bytes, tokens_full)
    tp_bwd = _tp_comm(job, act_bytes, tokens_full)
    fwd = Phase(tuple(fwd_gemm + [attn_fwd] + ew_fwd + casts_fwd + tp_fwd + _cp_comm(job, act_bytes, False)))
    bwd = Phase(tuple(bwd_gemm + [attn_bwd] + ew_bwd + casts_bwd + tp_bwd + _cp_comm(job, act_bytes, True)))
    if p.recompute == "full":
        recompute = Phase(fwd.ops)
    elif p.recompute == "selective":
        # selective recompute re-runs the core attention (Korthikanti §5); without flash it also rebuilds the scores
        ops: list[Op] = [Compute("attention_recompute", attn_f, 0.0, "attention")]
        if "attn_scores" in ew:
            ops.append(_mem("attn_scores_recompute", ew["attn_scores"]))
        recompute = Phase(tuple(ops))
    else:
        recompute = Phase(())
    return Block("layer", fwd, bwd, recompute)


def _head_block(job: Job) -> Block:
    """Final norm, vocab-parallel logits and cross-entropy (fp32 softmax over V/t per token)."""
    m, p, tr = job.model, job.plan, job.training
    act_bytes = 2.0 if tr.precision in ("fp8", "int8", "bf16", "fp16") else 4.0
    tokens = p.micro_batch * tr.seq_len // p.cp
    v_local = m.vocab // p.tp
    logits = _gemm("logits", tokens, v_local, m.hidden, act_bytes)
    loss_bytes = 3 * 4.0 * tokens * v_local  # upcast + softmax + loss over fp32 logits
    ops_f: list[Op] = [logits, _mem("loss", loss_bytes)]
    ops_b: list[Op] = [
        _gemm("logits_dgrad", tokens, m.hidden, v_local, act_bytes),
        _gemm("logits_wgrad", m.hidden, v_local, tokens, act_bytes),
        _mem("loss_bwd", loss_bytes),
    ]
    if p.tp > 1:
        buf = tokens * m.hidden * act_bytes
        op = "all_gather" if p.sequence_parallel else "all_reduce"
        ops_f.insert(0, Collective("tp_head_gather", "all_gather", buf, "tp") if p.sequence_parallel else
                     Collective("tp_loss", "all_reduce", 3 * 4.0 * tokens, "tp"))
        ops_b.append(Collective("tp_head_grad", "reduce_scatter" if p.sequence_parallel else op, buf, "tp"))
    return Block("head", Phase(tuple(ops_f)), Phase(tuple(ops_b)), Phase(()))


def _embed_block(job: Job) -> Block:
    m, p, tr = job.model, job.plan, job.training
    act_bytes = 2.0
    tokens = p.micro_batch * tr.seq_len // p.cp
    buf = tokens * m.hidden * act_bytes
    fwd: list[Op] = [_mem("embedding_lookup", 2 * buf)]
    bwd: list[Op] = [_mem("embedding_grad", 2 * buf)]
    if p.tp > 1:  # vocab-parallel embedding sums partial lookups across TP
        fwd.append(Collective("tp_embed", "reduce_scatter" if p.sequence_parallel else "all_reduce", buf, "tp"))
        if p.sequence_parallel:
            bwd.append(Collective("tp_embed_grad", "all_gather", buf, "tp"))
    return Block("embed", Phase(tuple(fwd)), Phase(tuple(bwd)), Phase(()))


def model_flop_per_token(job: Job) -> float:
    """Model FLOPs per token, fwd+bwd, no recompute: 3 × (2·params-in-GEMMs + attention 4·S·h per layer non-causal).

    The convention of Narayanan et al. 2021 (eq. 3, without the recompute term) and PaLM
    (Chowdhery et al. 2022, App. B): full (non-causal) attention, logits included.
    """
    m, tr = job.model, job.training
    h, d, f = m.hidden, m.head_dim, m.ffn
    gemm_params = h * (m.heads + 2 * m.kv_heads_) * d + m.heads * d * h + (3 if m.gated_mlp else 2) * h * f
    per_layer = 2 * gemm_params + 4 * tr.seq_len * m.heads * d
    return 3 * (m.layers * per_layer + 2 * h * m.vocab)


def grad_bytes_per_param(job: Job) -> float:
    """Wire bytes per gradient element of ``plan.grad_comm_dtype``, from the one table (commtax.comm_dtypes)."""
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


def params_per_gpu(job: Job) -> dict[str, float]:
    """Parameters held by one GPU of the busiest stage, before ZeRO sharding."""
    m, p = job.model, job.plan
    per_stage_layers = m.layers // p.pp
    layers = per_stage_layers * (m.layer_params() - 2 * m.hidden) / p.tp + per_stage_layers * 2 * m.hidden
    emb = m.vocab * m.hidden / p.tp
    # embedding on the first stage, output layer on the last; with pp == 1 both (one copy if tied)
    embed = emb
    head = emb if (p.pp > 1 or not m.tied_embeddings) else 0.0
    return {"layers": layers, "embed": embed, "head": head}


def _dp_ops(job: Job, params: float) -> tuple[tuple[Collective, ...], tuple[Collective, ...]]:
    """DP traffic (Rajbhandari et al. 2020, ZeRO §5-7): per step for stages 0-2, per micro-batch for stage 3."""
    p = job.plan
    if job.dp * p.cp == 1:
        return (), ()
    g_bytes = grad_bytes_per_param(job)
    p_bytes = 2.0  # bf16/fp16 parameter copies are gathered
    if p.zero == 0:
        return (Collective("dp_grad_allreduce", "all_reduce", params * g_bytes, "dp"),), ()
    if p.zero in (1, 2):
        return (
            Collective("dp_grad_reduce_scatter", "reduce_scatter", params * g_bytes, "dp"),
            Collective("dp_param_all_gather", "all_gather", params * p_bytes, "dp"),
        ), ()
    # ZeRO-3 / FSDP: gather params for forward and again for backward, reduce-scatter grads, every micro-batch
    return (), (
        Collective("zero3_gather_fwd", "all_gather", params * p_bytes, "dp"),
        Collective("zero3_gather_bwd", "all_gather", params * p_bytes, "dp"),
        Collective("zero3_grad_reduce_scatter", "reduce_scatter", params * g_bytes, "dp"),
    )


def build_workload(job: Job) -> Workload:
    p, tr = job.plan, job.training
    params = params_per_gpu(job)
    stage_params = params["layers"] + max(params["embed"], params["head"]) if p.pp > 1 else sum(params.values())
    dp_step, dp_mb = _dp_ops(job, stage_params)
    act_bytes = 2.0 if tr.precision != "fp32" else 4.0
    # Megatron sends the sequence-sharded activation per TP rank (Narayanan 2021 §4.1 scatter/gather)
    send_bytes = p.micro_batch * tr.seq_len // p.cp * job.model.hidden * act_bytes / p.tp
    shard = job.dp * p.cp if p.zero >= 1 else 1
    optimizer = _mem("adam", ADAM_BYTES_PER_PARAM * stage_params / shard)
    tokens_per_step = tr.global_batch * tr.seq_len
    return Workload(
        layer=_layer_block(job),
        embed=_embed_block(job),
        head=_head_block(job),
        layers_per_stage=job.model.layers // p.pp,
        pp_send=Collective("pp_send", "send_recv", send_bytes, "pp"),
        dp_step=dp_step,
        dp_microbatch=dp_mb,
        optimizer=optimizer,
        micro_batches=job.micro_batches,
        model_flop_per_step=model_flop_per_token(job) * tokens_per_step,
        params_per_gpu=params,
        bucket_bytes=DDP_BUCKET_BYTES,
    )
