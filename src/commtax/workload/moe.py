"""The MoE layer's MLP as operations: router, permute, dispatch all-to-all, grouped expert GEMMs, shared experts,
combine all-to-all, unpermute, and the expert-parallel layout they run on.

Notation: T tokens entering the router on one GPU per micro-batch (b·s/cp, and /tp under sequence parallelism,
which Megatron-Core requires with MoE and TP), E experts, k = top_k, ep / etp expert-parallel and expert tensor-
parallel sizes, E_loc = E/ep experts per GPU, f_e = moe_ffn_hidden, λ = max/mean tokens per EP rank.

Balanced routing sends each GPU T·k tokens (etp ranks all-gather theirs: T·k·etp), E_loc experts of
T·k·etp/E_loc rows each; λ stretches the busiest GPU's rows and what it receives, and that GPU paces the step.
Dispatch moves T·k hidden vectors per GPU at the dispatch dtype, combine the same at bf16 (DeepSeek-V3 report §3.3:
fp8 dispatch, bf16 combine; Megatron-Core's alltoall dispatcher moves bf16 both ways).
"""

from __future__ import annotations

import math

from commtax.spec import Job
from commtax.workload.step import Block, Collective, Compute, Op, Phase, _fp8_casts, _gemm, _mem, glu_clamp_ops

# DeepEP FP8 dispatch: 1 B per element plus one fp32 scale per 128 elements (deep_ep tests: (1 + 4/128) B)
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128
DEDUP_DISPATCHERS = ("deepep", "hybridep")
# TE's grouped GEMM (nvte_multi_stream_cublas_gemm, transformer_engine/common/gemm/cublaslt_gemm.cu) runs each
# expert's GEMM as its own cuBLAS call on the next of num_compute_streams = 4 streams (common/util/multi_stream.cpp)
TE_GEMM_STREAMS = 4


def router_tokens(job: Job) -> int:
    """T: tokens one GPU routes per micro-batch (sequence-sharded over tp: Megatron-Core MoE needs SP with TP)."""
    p = job.plan
    return max(1, job.micro_batch_tokens // p.tp)


def routing_stretch(job: Job) -> float:
    """λ_eff: the busiest EP rank's load / the mean. A capacity factor caps it (tokens beyond it are dropped)."""
    m = job.model
    lam = m.routing_imbalance
    return min(lam, max(1.0, m.capacity_factor)) if m.capacity_factor is not None else lam


def local_experts(job: Job) -> int:
    return job.model.num_experts // job.plan.ep


def expert_rows(job: Job) -> int:
    """Rows of one local expert's GEMM on the busiest GPU: T·k·etp·λ / E_loc."""
    m, p = job.model, job.plan
    return max(1, math.ceil(router_tokens(job) * m.top_k * p.etp * routing_stretch(job) / local_experts(job)))


def ep_per_node(job: Job) -> int:
    """EP-group members on one node: expert ranks run etp fastest, then ep (Megatron-Core expert rank order
    tp-ep-dp-pp), so an EP group is etp apart."""
    g, ep, stride = job.cluster.gpus_per_node, job.plan.ep, job.plan.etp
    return 1 if stride >= g else max(1, min(ep, g // stride))


def ep_nodes(job: Job) -> int:
    """Nodes (NVLink domains) one EP group spans."""
    return max(1, job.plan.ep // ep_per_node(job))


def distinct_nodes(nodes: int, k: int, max_nodes: int | None = None) -> float:
    """Expected distinct nodes a token's k experts sit on, experts uniform over ``nodes``: N·(1 − (1 − 1/N)^k),
    at most M under node-limited routing (DeepSeek-V3 §2.1.2: each token to at most M = 4 nodes)."""
    d = nodes * (1.0 - (1.0 - 1.0 / nodes) ** k)
    return min(d, float(max_nodes)) if max_nodes else d


def internode_dedup(job: Job) -> float:
    """DeepEP/HybridEP send a token once per remote node and fan it out over NVLink there (DeepEP
    README, 'asymmetric-domain bandwidth forwarding'): their inter-node bytes over a pairwise all-to-all's,
    distinct remote nodes · (N−1)/N / (k · (N−1)/N) = distinct / k; dedup · S is also the RDMA bytes their tests
    count, a token once per distinct node with its own included, on which ``costs.collectives.deepep_time`` reads
    their published rate. Other dispatchers: 1."""
    n = ep_nodes(job)
    if job.plan.moe_dispatcher not in DEDUP_DISPATCHERS or n == 1:
        return 1.0
    return min(1.0, distinct_nodes(n, job.model.top_k, job.model.route_max_nodes) / job.model.top_k)


def rank_dedup(job: Job) -> float:
    """DeepEP/HybridEP inside one node or NVLink domain send a token once to each rank that holds one of its
    experts and permute the copies there (DeepEP ``is_token_in_rank``; tests/test_intranode.py and
    test_hybrid_ep.py count the received tokens, one per rank): their bytes over a pairwise all-to-all's,
    distinct ranks per token / k = ep·(1 − (1 − 1/ep)^k) / k (uniform routing). Other dispatchers, or a group
    spanning nodes (``internode_dedup``): 1."""
    m, p = job.model, job.plan
    if p.moe_dispatcher not in DEDUP_DISPATCHERS or ep_nodes(job) > 1 or p.ep == 1:
        return 1.0
    return min(1.0, distinct_nodes(p.ep, m.top_k) / m.top_k)


def dispatch_bytes_per_element(job: Job, act_bytes: float) -> float:
    """DeepEP/HybridEP dispatch fp8 tokens in fp8 runs (DeepSeek-V3 §3.3); NCCL dispatchers the bf16 activations."""
    if job.plan.moe_dispatcher in DEDUP_DISPATCHERS and job.training.precision == "fp8":
        return FP8_DISPATCH_BYTES
    return act_bytes


def token_exchange(job: Job, act_bytes: float, backward: bool) -> list[Collective]:
    """Dispatch and combine of one MoE layer-pass (backward: the gradients travel the other way, both bf16)."""
    m, p = job.model, job.plan
    if p.ep * p.etp == 1:
        return []
    t, h, lam = router_tokens(job), m.hidden, routing_stretch(job)
    routed = t * m.top_k * h * lam  # elements the busiest GPU receives (and the mean GPU sends)
    d_bytes = act_bytes if backward else dispatch_bytes_per_element(job, act_bytes)
    tag = "_bwd" if backward else ""
    ops: list[Collective] = []
    if p.ep > 1:
        if p.moe_dispatcher == "allgather":  # every token to every EP rank, reduce-scattered back
            buf = t * h * p.ep * act_bytes
            ops += [Collective(f"ep_allgather{tag}", "all_gather", buf, "ep")]
            ops += [Collective(f"ep_reduce_scatter{tag}", "reduce_scatter", buf, "ep")]
        elif p.moe_dispatcher in DEDUP_DISPATCHERS:
            dd = internode_dedup(job) if ep_nodes(job) > 1 else rank_dedup(job)
            kd = f"{p.moe_dispatcher}-{'fp8' if d_bytes < 2 else 'bf16'}"
            ops += [Collective(f"ep_dispatch{tag}", "deepep_dispatch", routed * d_bytes, "ep", dedup=dd, kernel=kd)]
            kc = f"{p.moe_dispatcher}-bf16"
            ops += [Collective(f"ep_combine{tag}", "deepep_combine", routed * act_bytes, "ep", dedup=dd, kernel=kc)]
        else:
            ops += [Collective(f"ep_dispatch{tag}", "all_to_all", routed * d_bytes, "ep")]
            ops += [Collective(f"ep_combine{tag}", "all_to_all", routed * act_bytes, "ep")]
    if p.etp > 1:  # expert TP: the dispatched tokens are gathered over etp, the outputs reduce-scattered
        buf = routed * p.etp * act_bytes
        ops += [Collective(f"etp_gather{tag}", "all_gather", buf, "etp")]
        ops += [Collective(f"etp_reduce_scatter{tag}", "reduce_scatter", buf, "etp")]
    return ops


def expert_gemms(job: Job) -> list[tuple[str, int, int, int, int]]:
    """Forward GEMMs of the MoE MLP on one GPU: (name, m, n, k, groups); router, routed experts (grouped),
    shared experts (a TP-sharded dense MLP over the local sequence)."""
    m, p = job.model, job.plan
    h, fe, e_loc = m.hidden, m.moe_ffn_hidden, local_experts(job)
    up = 2 if m.gated_mlp else 1
    rows = expert_rows(job)
    out = [
        ("router", router_tokens(job), m.num_experts, h, 1),
        ("expert_up", rows, up * fe // p.etp, h, e_loc),
        ("expert_down", rows, h, fe // p.etp, e_loc),
    ]
    if m.shared_experts:
        tokens = job.micro_batch_tokens
        fs = m.shared_experts * m.shared_ffn
        out += [("shared_up", tokens, up * fs // p.tp, h, 1), ("shared_down", tokens, h, fs // p.tp, 1)]
    return out


def _grouped(name: str, mm: int, nn: int, kk: int, groups: int, act_bytes: float, fp8: bool) -> Compute:
    """One projection of all local experts: TE GroupedLinear issues one cuBLAS GEMM per expert, round-robin over
    TE_GEMM_STREAMS compute streams, so at most that many experts' tiles share the SMs at once (their waves
    quantise together) and every expert is its own kernel launch."""
    g = _gemm(name, mm, nn, kk, act_bytes, fp8)
    if groups == 1:
        return g
    in_flight = min(groups, TE_GEMM_STREAMS)
    return Compute(
        name, g.flop * groups, g.bytes * groups, "gemm", mm, nn, kk, fp8=fp8, groups=in_flight, kernels=groups
    )


# ----------------------------------------------------------------------------- the host sync of an eager MoE layer
# An eager MoE layer's forward stops the host once: the dropless dispatchers need the token counts on the host before
# they can size the exchange (Megatron-Core token_dispatcher.py MoEAlltoAllTokenDispatcher: input/output splits moved
# D2H, then ``self.d2h_event.synchronize()`` at cuda_sync_point "before_ep_alltoall"; the flex dispatcher's DeepEP
# normal kernels: "the CPU will wait for GPU's signal to arrive, so this is not compatible with CUDA graph", DeepEP
# README and csrc/deep_ep.cpp intranode_dispatch's busy-wait on moe_recv_counter; TEGroupedMLP: "tokens_per_expert
# .tolist() synchronizes", experts.py). By then the GPU has drained its queue, and it idles until the host has
# issued the ops up to the next kernel: ``MOE_HOST_SYNC`` is that gap, an op of no GPU work whose ``kernels`` are
# those host ops (each ``cpu_op_s``, costs.compute.launch_floor). Only the gap is priced: from the first kernel on the
# host issues ahead of the exchange and the experts. A full-iteration CUDA graph (plan.cuda_graphs) has no sync.
MOE_HOST_SYNC = "moe_host_sync"
# after the sync returns, before the first kernel (each a torch.empty-like allocation or a launch):
# alltoall: megatron/core/tensor_parallel/mappings.py _AllToAll.forward: the output ``input.new_empty`` + NCCL's
# all_to_all_single launch (with ep == 1 and etp > 1 the same two in gather_from_sequence_parallel_region)
ALLTOALL_RESTART_OPS = 2
# deepep/hybridep: DeepEP Buffer::intranode_dispatch after the busy-wait: torch::empty of recv_x, recv_src_idx,
# recv_channel_prefix_matrix, send_head, recv_topk_idx, recv_topk_weights (+ recv_x_scales with fp8 tokens), then
# the dispatch kernel's launch (deepseek-ai/DeepEP @91bb69a csrc/deep_ep.cpp). HybridEP sizes its buffers on the
# host the same way (Megatron token_dispatcher.py: "HybridEP sizes buffers dynamically (CPU sync"): DeepEP's count.
FLEX_RESTART_OPS = 7


def grouped_restart_ops(job: Job, fp8: bool) -> int:
    """Host ops from a sync in the experts (``tokens_per_expert.tolist()``, TEGroupedMLP) to their first kernel: the
    ``.tolist()``, GroupedLinear's ``torch.split``, then fp8: 2 × num_gemms ``torch.empty`` of the multi-cast-transpose
    and its launch (TransformerEngine #1499, maintainer's answer); bf16: the first expert GEMM's launch."""
    return 2 + (2 * local_experts(job) + 1 if fp8 else 1)


def host_sync_restart_ops(job: Job, fp8: bool) -> int:
    """Host ops the GPU waits on after an eager MoE layer's forward sync (see ``MOE_HOST_SYNC``); 0 under a
    full-iteration CUDA graph."""
    p = job.plan
    if p.cuda_graphs == "full_iteration":
        return 0
    if p.moe_dispatcher == "alltoall" and job.model.capacity_factor is not None:
        return (
            0  # token drop padded to capacity (drop_and_pad): static shapes, _maybe_dtoh_and_synchronize does nothing
        )
    if p.moe_dispatcher in DEDUP_DISPATCHERS and p.ep > 1:
        return FLEX_RESTART_OPS + (1 if dispatch_bytes_per_element(job, 2.0) < 2 else 0)  # + fp8 scales
    if p.moe_dispatcher in ("alltoall", *DEDUP_DISPATCHERS) and p.ep * p.etp > 1:
        return ALLTOALL_RESTART_OPS
    # allgather, or no exchange at all: the experts' .tolist() is the sync (cuda_sync_point "before_finish")
    return grouped_restart_ops(job, fp8)


# ----------------------------------------------------------------------------- the alltoall dispatcher's own passes
# Megatron-Core MoEAlltoAllTokenDispatcher (token_dispatcher.py @d98e8a6) does more than the exchange of tokens:
# preprocess all-gathers each rank's tokens per expert over the expert TP×EP group (gather_from_sequence_parallel_
# region(num_local_tokens_per_expert), E int64 per rank) to size it; token_dispatch exchanges the routing probs with a
# second all_to_all beside the tokens'; with E_loc > 1, dispatch_postprocess sorts the received chunks by local expert
# (sort_chunks_by_idxs: "Permutation 2") and combine_preprocess restores their order ("Unpermutation 2"), a read and a
# write of every received row each (moe_layer.py routed_experts_compute runs both with the experts). DeepEP and
# HybridEP take the routing map and return tokens grouped by expert; they have none of these. A model with a
# capacity_factor is taken to run Megatron's token drop padded to capacity, as the sources that set one do
# (moe_expert_capacity_factor with moe_pad_expert_input_to_capacity: NeMo's MegatronTokenDropCallback, Megatron-Bridge
# training/utils/moe_token_drop.py): then the counts are not gathered, nothing syncs, and the sort is the padded
# buffer's view-transpose-contiguous copy, the same bytes at capacity factor 1.
COUNTS_BYTES = 8  # int64 token counts
PROBS_BYTES = 4  # the routing probs in fp32 (Megatron moe_router_dtype fp32, as the recipes set it)


def alltoall_dispatcher_ops(job: Job, act_bytes: float, backward: bool) -> list[Op]:
    """The alltoall dispatcher's ops besides the token exchange, in one MoE layer-pass (backward: the probs'
    gradients travel back, the sort and restore run as each other's inverse; the counts are not gathered again)."""
    m, p = job.model, job.plan
    if p.moe_dispatcher != "alltoall" or p.ep == 1:
        return []
    tag = "_bwd" if backward else ""
    routed = router_tokens(job) * m.top_k * routing_stretch(job)  # rows the busiest GPU receives
    # token drop padded to capacity (drop_and_pad) sizes everything from the capacity: preprocess gathers no counts
    gather = not backward and m.capacity_factor is None
    ops: list[Op] = (
        [Collective("ep_counts", "all_gather", COUNTS_BYTES * m.num_experts * p.ep * p.etp, "ep")] if gather else []
    )
    ops.append(Collective(f"ep_dispatch_probs{tag}", "all_to_all", PROBS_BYTES * routed, "ep"))
    if local_experts(job) > 1:
        rows = routed * p.etp  # after the expert-TP all-gather
        ops += [_mem(f"{n}{tag}", 2 * rows * m.hidden * act_bytes) for n in ("sort_chunks", "unsort_chunks")]
    return ops


# ----------------------------------------------------------------------------- the experts' down-projection bias
# Megatron-Core TEGroupedMLP adds the down projection's bias in eager PyTorch after the grouped GEMM, one expert at a
# time (experts.py ``_apply_bias``, the same at the Megatron-LM commits of Megatron-Bridge v0.2.0-v0.5.0:
# ``torch.cat([t + b * p for t, b, p in zip(torch.split(out, tokens_per_expert), biases, torch.split(probs, ...))])``).
# Per element of the output, bf16: b * p writes one (2 B), t + (b * p) reads two and writes one (6 B), the cat reads
# and writes one (4 B): 12 B forward, two kernels an expert and the cat. Backward: the cat's split is a view, the
# add passes its gradient through, the product's two gradients each read it once (b: a sum over rows, p: over the
# hidden): 4 B. The fc1 bias goes into the fused activation (weighted_bias_quick_geglu_impl), already priced. The
# full-iteration graphs run the sync-free fused grouped MLP (use_transformer_engine_op_fuser, docs/user-guide/
# features/paged_stash.md), whose fc2 takes the bias itself (scale_bias): nothing apart there.
MEGATRON_EXPERTS = ("megatron-core", "megatron-lm", "nemo")  # the frameworks that run Megatron-Core's TEGroupedMLP
BIAS_FWD_BYTES = 12.0  # per output element, bf16 (above)
BIAS_BWD_BYTES = 4.0


def expert_bias_ops(job: Job, act_bytes: float) -> tuple[list[Compute], list[Compute]]:
    """(forward, backward) passes of the experts' down-projection bias (Megatron-Core ``_apply_bias``), or nothing."""
    m, p = job.model, job.plan
    if not m.expert_bias or p.framework not in MEGATRON_EXPERTS or p.cuda_graphs == "full_iteration":
        return [], []
    elems = expert_rows(job) * local_experts(job) * m.hidden
    e = local_experts(job)
    scale = act_bytes / 2.0  # the bytes above are bf16's
    fwd = _mem("expert_bias", BIAS_FWD_BYTES * scale * elems, 2 * e + 1)
    bwd = _mem("expert_bias_bwd", BIAS_BWD_BYTES * scale * elems, 2 * e)
    return [fwd], [bwd]


# Megatron-Core TEGroupedMLP.forward (experts.py, every Megatron-LM commit of the rows' containers): under fp8 each
# local expert's rows are padded to the quantization alignment (16 per-tensor, 32 MXFP8: moe_utils
# get_align_size_for_quantization) by Transformer Engine's Fp8Padding, which copies the bf16 input whole into the
# padded buffer (tex.fused_multi_row_padding: read and write), and the down projection's output is unpadded by
# Fp8Unpadding (fused_multi_row_unpadding), each the other's inverse in backward; the permuted probs are padded
# alike (fp32, one row each). Fp8Padding returns its input untouched only when every count is already aligned:
# the router's moe_router_padding_for_quantization (off in the recipes: moe_router_padding_for_fp8 False) or
# HybridEP's in-kernel pad_multiple (token_dispatcher.py _HybridEPManager) make them so, as does token drop padded
# to capacity (every expert holds the capacity); the dropless alltoall, allgather and DeepEP paths leave random
# counts (the benchmarks' random logits). The full-iteration recipes' fused grouped MLP pads nothing apart.
QUANT_PAD_DISPATCHERS = ("alltoall", "allgather", "deepep")


def expert_quant_padding_ops(job: Job, act_bytes: float, fp8: bool) -> tuple[list[Compute], list[Compute]]:
    """(forward, backward) copies of Transformer Engine's Fp8Padding / Fp8Unpadding around the routed experts."""
    m, p = job.model, job.plan
    if (
        not fp8
        or p.framework not in MEGATRON_EXPERTS
        or p.moe_dispatcher not in QUANT_PAD_DISPATCHERS
        or p.cuda_graphs == "full_iteration"
        or m.capacity_factor is not None
    ):
        return [], []
    rows = expert_rows(job) * local_experts(job)
    nbytes = 2 * (2 * act_bytes * rows * m.hidden) + 2 * 4.0 * rows  # input pad, output unpad; the probs' pad
    return [_mem("expert_quant_padding", nbytes, 3)], [_mem("expert_quant_padding_bwd", nbytes, 3)]


def host_sync_op(job: Job, fp8: bool) -> list[Compute]:
    n = host_sync_restart_ops(job, fp8)
    return [_mem(MOE_HOST_SYNC, 0.0, n)] if n else []


def moe_mlp_ops(job: Job, act_bytes: float, fp8: bool) -> tuple[list[Op], list[Op]]:
    """(forward, backward) ops of one MoE layer's MLP on one GPU (the attention half is the dense layer's)."""
    m, p = job.model, job.plan
    gemms = expert_gemms(job)
    fwd: list[Op] = [_grouped(n, a, b, c, g, act_bytes, fp8 and n != "router") for n, a, b, c, g in gemms]
    bwd: list[Op] = []
    for n, a, b, c, g in gemms:
        f8 = fp8 and n != "router"
        bwd += [_grouped(f"{n}_dgrad", a, c, b, g, act_bytes, f8), _grouped(f"{n}_wgrad", c, b, a, g, act_bytes, f8)]
    t, h, k, lam = router_tokens(job), m.hidden, m.top_k, routing_stretch(job)
    rows_all = expert_rows(job) * local_experts(job)
    fe = m.moe_ffn_hidden // p.etp
    # router: fp32 softmax/sigmoid and top-k over T·E scores, read and written (Megatron moe_router_dtype fp32)
    route = _mem("router_topk", 3 * 4.0 * t * m.num_experts)
    # permute: read T·h, write the T·k copies in expert order; unpermute: read them, write the weighted sum
    permute = _mem("permute", act_bytes * (t * h + t * k * lam * h))
    unpermute = _mem("unpermute", act_bytes * (t * k * lam * h + t * h))
    act_x = 3 if m.gated_mlp else 2  # SwiGLU reads 2 writes 1, GeLU reads 1 writes 1
    act = _mem("expert_activation", act_x * rows_all * fe * act_bytes)
    mem_ops = [route, permute, act, unpermute]
    tokens = job.micro_batch_tokens
    if m.shared_experts:
        mem_ops.append(_mem("shared_activation", act_x * tokens * m.shared_experts * m.shared_ffn / p.tp * act_bytes))
    clamps = [glu_clamp_ops("expert_activation", rows_all * fe, act_bytes)] if m.swiglu_limit is not None else []
    if clamps and m.shared_experts:
        clamps.append(glu_clamp_ops("shared_activation", tokens * m.shared_experts * m.shared_ffn / p.tp, act_bytes))
    fwd += mem_ops + [f for f, _ in clamps] + host_sync_op(job, fp8) + token_exchange(job, act_bytes, backward=False)
    fwd += alltoall_dispatcher_ops(job, act_bytes, backward=False)
    bias_f, bias_b = expert_bias_ops(job, act_bytes)
    fwd += bias_f
    pad_f, pad_b = expert_quant_padding_ops(job, act_bytes, fp8)
    fwd += pad_f
    bwd += pad_b
    bwd += [_mem(f"{o.name}_bwd", 2 * o.bytes) for o in mem_ops] + [b for _, b in clamps]
    bwd += token_exchange(job, act_bytes, backward=True) + alltoall_dispatcher_ops(job, act_bytes, backward=True)
    bwd += bias_b
    if fp8:
        fwd += [_fp8_casts(job, f"{n}_cast", a * c * g, g) for n, a, b, c, g in gemms if n != "router"]
        bwd += [_fp8_casts(job, f"{n}_grad_cast", a * b * g, g) for n, a, b, c, g in gemms if n != "router"]
    return fwd, bwd


def expert_params_per_gpu(job: Job, moe_layers: int) -> float:
    """Routed-expert weights one GPU holds for ``moe_layers`` MoE layers: E/ep experts, each 1/etp."""
    m = job.model
    return moe_layers * local_experts(job) * m.expert_params() / job.plan.etp


def moe_dense_params_per_layer(job: Job) -> float:
    """The MoE MLP's non-expert weights on one GPU: router (replicated) and shared experts (TP-sharded)."""
    m = job.model
    return m.hidden * m.num_experts + m.shared_experts * m.mlp_params(m.shared_ffn) / job.plan.tp


def dispatched_activation_bytes(job: Job, act_bytes: float, recomputed: frozenset[str] = frozenset()) -> float:
    """What one MoE layer keeps for backward beyond the attention half, one micro-batch, one GPU: the permuted
    tokens (expert GEMM input), the up-projection output (activation input) and activation output (down
    input), router probabilities; shared experts as a dense MLP. Selective recompute modules (Megatron-Core
    recompute_modules) drop what they re-run: moe the whole MoE layer's (its input is the pre-MLP norm's, kept
    with the attention half), moe_act the experts' activation outputs (output-discarding checkpoint),
    shared_experts the shared experts'."""
    m, p, tr = job.model, job.plan, job.training
    rows = expert_rows(job) * local_experts(job)
    fe = m.moe_ffn_hidden // p.etp
    up = 2 if m.gated_mlp else 1
    gemm_in = 1.0 if tr.precision == "fp8" else act_bytes
    if "moe" in recomputed:
        return 0.0
    routed = rows * (gemm_in * m.hidden + act_bytes * up * fe + (0.0 if "moe_act" in recomputed else gemm_in * fe))
    if m.swiglu_limit is not None:  # the clamps keep their input, the fused kernel the clamped copy (glu_clamp_ops)
        routed += rows * act_bytes * up * fe
    probs = 4.0 * router_tokens(job) * m.num_experts
    shared = 0.0
    if m.shared_experts and "shared_experts" not in recomputed:
        tokens = job.micro_batch_tokens
        fs = m.shared_experts * m.shared_ffn
        shared = tokens * (gemm_in * m.hidden / p.tp + (act_bytes * up * fs + gemm_in * fs) / p.tp)
    return routed + probs + shared


# Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm, the combined 1F1B) runs an MoE layer as
# four nodes (megatron/core/models/gpt/fine_grained_callables.py @d98e8a6, build_transformer_layer_callables):
# pre_dispatch_computation (attention, pre-MLP norm, router, dispatch preprocess = permute, the shared experts),
# moe_dispatch, mlp (the routed experts), moe_combine. With delay_wgrad_compute (set with the overlap by the
# Megatron-MoE-ModelZoo's A2A_OVERLAP=1 and Megatron-Bridge's _set_moe_a2a_overlap_overrides) the attention's, the
# shared experts' and the routed experts' weight gradients run apart (``backward_dw``), after their node's backward.
# The pieces of one MoE layer, per pass ("_w": the delayed weight gradients):
OVERLAP_PIECES = (
    "attn_f",
    "mlp_f",
    "dispatch_f",
    "combine_f",
    "attn_b",
    "attn_w",
    "mlp_b",
    "mlp_w",
    "dispatch_b",
    "combine_b",
)
# the ops of the mlp node (routed experts; the unpermute, which Megatron runs with the combine on the comm stream
# after the exchange, is priced with the experts: a memory-bound pass beside the expert GEMMs) and of the exchanges
MLP_NODE_OPS = frozenset(
    {
        "expert_up",
        "expert_down",
        "expert_activation",
        "expert_activation_clamp",
        "unpermute",
        "sort_chunks",
        "unsort_chunks",
        "expert_bias",
        "expert_quant_padding",
    }
)
DISPATCH_OPS = frozenset({"ep_dispatch", "ep_allgather", "etp_gather", "ep_counts", "ep_dispatch_probs"})
COMBINE_OPS = frozenset({"ep_combine", "ep_reduce_scatter", "etp_reduce_scatter"})
_PASS_SUFFIXES = ("_recompute", "_grad_cast", "_cast", "_dgrad", "_wgrad", "_bwd")


def _forward_name(name: str) -> str:
    """The forward op an op of a pass derives from (``expert_up_grad_cast`` -> ``expert_up``)."""
    while True:
        for suffix in _PASS_SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        else:
            return name


def overlap_piece(name: str, backward: bool) -> str:
    """Which of ``OVERLAP_PIECES`` an MoE layer's op belongs to (``backward``: an op of the backward or recompute)."""
    base = _forward_name(name)
    node = "dispatch" if base in DISPATCH_OPS else "combine" if base in COMBINE_OPS else "attn"
    node = "mlp" if base in MLP_NODE_OPS else node
    if not backward:
        return f"{node}_f"
    # the router's weight gradient is not delayed (backward_dw: attention, shared and routed experts' linears)
    delayed = name.endswith("_wgrad") and node in ("attn", "mlp") and base != "router"
    return f"{node}_w" if delayed else f"{node}_b"


def overlap_phases(block: Block) -> tuple[Phase, ...]:
    """An MoE layer's ops as the ``OVERLAP_PIECES`` the overlap schedules (one Phase each, that order). The
    recompute's compute runs inside its node's backward; its exchanges (recompute moe) stay apart (priced exposed,
    ``schedule.analytical.ep_exposed``)."""
    pieces: dict[str, list[Op]] = {k: [] for k in OVERLAP_PIECES}
    for phase, backward in ((block.fwd, False), (block.bwd, True), (block.recompute, True)):
        for op in phase.ops:
            if phase is block.recompute and isinstance(op, Collective):
                continue
            pieces[overlap_piece(op.name, backward)].append(op)
    return tuple(Phase(tuple(pieces[k])) for k in OVERLAP_PIECES)
