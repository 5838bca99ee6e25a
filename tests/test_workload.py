"""Workload arithmetic against hand-worked cases from the papers it cites."""

import pytest
from conftest import job_dict

from commtax.spec import load_job
from commtax.workload.step import (
    Collective,
    Compute,
    attention_flop,
    build_workload,
    model_flop_per_token,
)


def gpt_job(**plan):
    d = job_dict(**plan)
    d["model"] = {"layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200, "gated_mlp": False}
    d["cluster"]["num_gpus"] = 8
    d["plan"].update({"pp": 1, "dp": None})
    d["plan"] = {k: v for k, v in d["plan"].items() if v is not None}
    d["training"] = {"seq_len": 2048, "global_batch": 64, "precision": "bf16"}
    return load_job(d)


def test_llama2_70b_parameter_count_matches_the_release():
    job = load_job(job_dict())
    assert job.model.params() == 68_976_648_192  # meta-llama/Llama-2-70b-hf safetensors total


def test_model_flops_per_token_is_narayanan_eq3_without_recompute():
    job = gpt_job(tp=1, sequence_parallel=False)
    l, h, s, V = 24, 2048, 2048, 51200
    # Narayanan et al. 2021 eq. 3 without the recompute pass: 72·l·h²·(1 + s/6h + V/12lh) per token
    expected = 72 * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert model_flop_per_token(job) == pytest.approx(expected, rel=1e-12)


def test_layer_forward_gemm_flops_are_24bsh2():
    job = gpt_job(tp=1, sequence_parallel=False, micro_batch=2)
    wl = build_workload(job)
    gemm = sum(op.flop for op in wl.layer.fwd.ops if isinstance(op, Compute) and op.kind == "gemm")
    b, s, h = 2, 2048, 2048
    assert gemm == 24 * b * s * h**2  # Korthikanti 2022 §3: QKV 6bsh², proj 2bsh², MLP 16bsh²


def test_backward_gemms_are_twice_forward_and_tp_shards_them():
    job = gpt_job(tp=4, sequence_parallel=True)
    wl = build_workload(job)
    f = sum(op.flop for op in wl.layer.fwd.ops if isinstance(op, Compute) and op.kind == "gemm")
    b = sum(op.flop for op in wl.layer.bwd.ops if isinstance(op, Compute) and op.kind == "gemm")
    assert b == 2 * f
    assert f == 24 * 1 * 2048 * 2048**2 / 4


def test_causal_flash_attention_does_half_the_score_work():
    job = gpt_job(tp=2, sequence_parallel=False)
    full = attention_flop(job, causal=False)
    assert full == 4 * 1 * (16 // 2) * 2048 * 2048 * 128  # 2 matmuls × 2·b·(a/t)·s²·d
    assert attention_flop(job, causal=True) == full / 2


def test_tp_collectives_per_layer_follow_korthikanti():
    h, s, b = 2048, 2048, 1
    plain = build_workload(gpt_job(tp=4, sequence_parallel=False))
    ops = [o for o in plain.layer.fwd.ops if isinstance(o, Collective)]
    assert [o.op for o in ops] == ["all_reduce", "all_reduce"]  # g and ḡ of Megatron's MLP and attention
    assert all(o.bytes == b * s * h * 2 for o in ops)
    sp = build_workload(gpt_job(tp=4, sequence_parallel=True))
    ops = [o.op for o in sp.layer.fwd.ops if isinstance(o, Collective)]
    assert ops == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]


def test_full_recompute_repeats_the_forward_and_selective_only_attention():
    full = build_workload(gpt_job(tp=1, sequence_parallel=False, recompute="full"))
    assert full.layer.recompute.ops == full.layer.fwd.ops
    sel = build_workload(gpt_job(tp=1, sequence_parallel=False, recompute="selective"))
    assert [o.name for o in sel.layer.recompute.ops] == ["attention_recompute"]


def test_pipeline_send_is_the_sequence_sharded_activation():
    job = load_job(job_dict())  # tp 8, seq 4096, h 8192, micro_batch 1
    wl = build_workload(job)
    assert wl.pp_send.bytes == 1 * 4096 * 8192 * 2 / 8  # Narayanan 2021 §4.1 scatter/gather


def test_dp_traffic_by_zero_stage():
    z0 = build_workload(load_job(job_dict(zero=0)))
    assert [c.op for c in z0.dp_step] == ["all_reduce"]
    z1 = build_workload(load_job(job_dict(zero=1)))
    assert [c.op for c in z1.dp_step] == ["reduce_scatter", "all_gather"]
    assert z1.dp_step[0].bytes == z0.dp_step[0].bytes  # same gradient bytes, bf16
    z3 = build_workload(load_job(job_dict(zero=3)))
    assert z3.dp_step == ()
    assert [c.name for c in z3.dp_microbatch] == ["zero3_gather_fwd", "zero3_gather_bwd", "zero3_grad_reduce_scatter"]


def test_grad_comm_dtype_scales_dp_bytes():
    bf16 = build_workload(load_job(job_dict(zero=0)))
    int8 = build_workload(load_job(job_dict(zero=0, grad_comm_dtype="int8")))
    fp32 = build_workload(load_job(job_dict(zero=0, grad_comm_dtype="fp32")))
    assert int8.dp_step[0].bytes == bf16.dp_step[0].bytes / 2 * (1 + 4 / 256)  # 1 B + one fp32 scale per 256
    assert fp32.dp_step[0].bytes == bf16.dp_step[0].bytes * 2


@pytest.mark.parametrize("precision,act", [("fp32", 4.0), ("tf32", 4.0), ("bf16", 2.0), ("fp16", 2.0), ("fp8", 2.0)])
def test_one_activation_dtype_rule_everywhere(precision, act):
    """TP collectives, pipeline sends, embeddings and the LM head all move activations at one width."""
    from commtax.workload.step import activation_bytes_per_element

    d = job_dict()
    d["training"]["precision"] = precision
    if precision == "fp32":
        d["cluster"]["gpu"] = {"peak_tflops": {"fp32": 67}, "mem_GiB": 80, "mem_bw_GBps": 3350}
    job = load_job(d)
    wl = build_workload(job)
    assert activation_bytes_per_element(precision) == act
    tokens = 1 * 4096  # micro_batch × seq_len
    h = job.model.hidden
    tp_ag = next(c for c in wl.layer.fwd.collectives if c.name == "tp_ag_attn")
    assert tp_ag.bytes == tokens * h * act  # the whole sequence-parallel buffer
    assert wl.pp_send.bytes == tokens * h * act / 8  # scattered over tp = 8 (Narayanan 2021 §4.1)
    embed_rs = next(c for c in wl.embed.fwd.collectives)
    assert embed_rs.bytes == tokens * h * act


def test_layer_parameter_tensors_as_megatron_registers_them():
    # Megatron GPT layer (add_bias_linear, LayerNorm with bias): ln1 w/b, qkv w/b, proj w/b, ln2 w/b, fc1 w/b, fc2 w/b
    from commtax.workload.step import layer_param_tensors

    job = gpt_job(tp=2, zero=3, sequence_parallel=False)
    h, f = 2048, 4 * 2048
    tensors = layer_param_tensors(job)
    assert tensors == (h, h, h * 3 * h / 2, 3 * h / 2, h * h / 2, h, h, h, h * f / 2, f / 2, f * h / 2, h)
    matrices = tensors[2] + tensors[4] + tensors[8] + tensors[10]
    assert matrices * 2 + 2 * h == job.model.layer_params()  # Model.layer_params counts matrices + 2 norm weights
    # Llama-style (gated MLP, RMSNorm, no biases): 2 norm weights and 4 matrices, gate and up fused in fc1
    llama = load_job(job_dict(tp=8, zero=3, pp=1, dp=None, sequence_parallel=False))
    t = layer_param_tensors(llama)
    assert len(t) == 6 and sum(t) == pytest.approx((llama.model.layer_params() - 2 * 8192) / 8 + 2 * 8192)


def test_zero3_workload_carries_the_gather_granularity():
    # FSDP/current DeepSpeed: 2 gathers per micro-batch (the unit stays gathered through its recomputed forward)
    wl = build_workload(gpt_job(tp=1, zero=3, recompute="full", sequence_parallel=False))
    assert wl.zero3_gather_passes == 2  # how the gathers synchronise is the plan's (plan.zero3_gather), read once
    # DeepSpeed < v0.6: the checkpointed forward re-enters every module's pre-forward hook: a third gather
    legacy = build_workload(
        gpt_job(tp=1, zero=3, recompute="full", zero3_gather="per_parameter_sync", sequence_parallel=False)
    )
    assert legacy.zero3_gather_passes == 3 and len(legacy.zero3_layer_tensors) == 12
    # pp = 1, untied: word embedding and LM head (51200 x 2048 each) + the final norm weight
    assert legacy.zero3_other_tensors == (51200 * 2048, 51200 * 2048, 2048)
    assert build_workload(gpt_job(tp=1, zero=1)).zero3_layer_tensors == ()


def test_megatron_core_gradient_bucket_is_40m_params_or_1m_per_dp_rank():
    # megatron/core/distributed/distributed_data_parallel_config.py: bucket_size defaults to
    # max(40000000, 1000000 * dp_size) parameters; the bucket moves fp32 main grads (4 B) by default
    from conftest import job_dict

    from commtax.spec import load_job
    from commtax.workload.step import DDP_BUCKET_BYTES, grad_bucket_bytes

    d = job_dict(framework="megatron-core", tp=8, pp=4, dp=None)  # 256 GPUs: dp 8
    assert grad_bucket_bytes(load_job(d)) == 40e6 * 4
    d = job_dict(framework="megatron-core", tp=1, pp=1, dp=None, sequence_parallel=False)  # dp 256
    assert grad_bucket_bytes(load_job(d)) == 256e6 * 4
    d["plan"]["grad_comm_dtype"] = "bf16"
    assert grad_bucket_bytes(load_job(d)) == 256e6 * 2
    assert grad_bucket_bytes(load_job(job_dict(framework="custom"))) == DDP_BUCKET_BYTES == 25 * 2**20


def test_plans_that_differ_only_outside_the_blocks_share_them_and_others_get_their_own():
    """``build_workload`` builds the layer, embedding and head blocks once per plan fields they read (a sweep over
    dp/zero/pp/schedule reuses them); a field they read (micro_batch, grad dtype, ...) gets a block of its own,
    equal to one built from scratch."""
    from commtax.spec import job_with
    from commtax.workload.step import _embed_block, _head_block, _layer_block

    base = load_job(job_dict(tp=8, pp=4, zero=1, micro_batch=1))
    same = job_with(base, zero=2, schedule="gpipe", overlap={"dp": False, "tp": True, "cp": False, "pp": True})
    a, b = build_workload(base), build_workload(same)
    assert a.layer is b.layer and a.embed is b.embed and a.head is b.head
    for changes in ({"micro_batch": 2}, {"recompute": "full"}, {"sequence_parallel": False}, {"attention": "eager"}):
        other = job_with(base, **changes)
        wl = build_workload(other)
        assert wl.layer is not a.layer
        assert (wl.layer, wl.embed, wl.head) == (_layer_block(other), _embed_block(other), _head_block(other))


def test_blocks_follow_the_assumptions_in_force():
    """fp8 cast bytes come from the assumptions: a block built under other assumptions is not reused."""
    from commtax.spec.assumptions import default_assumptions, using_assumptions

    d = job_dict(tp=8, pp=4, zero=1)
    d["training"] = {**d["training"], "precision": "fp8"}
    job = load_job(d)
    casts = sum(o.bytes for o in build_workload(job).layer.fwd.computes if o.name.endswith("_cast"))
    a = default_assumptions()
    more = a.with_values({"fp8_cast_bytes_delayed": 2 * a.v("fp8_cast_bytes_delayed")})
    with using_assumptions(more):
        doubled = sum(o.bytes for o in build_workload(job).layer.fwd.computes if o.name.endswith("_cast"))
    assert casts > 0 and doubled == pytest.approx(2 * casts, rel=1e-12)


@pytest.mark.parametrize("grad_dtype", ["bf16", "int8", "powersgd_r4"])
def test_blocks_kept_by_their_reads_are_the_blocks_built_from_scratch(grad_dtype):
    """The blocks a job gets from the caches (kept by the values each builder read, ``spec.reads``) equal those its
    builders make from scratch, for plans that differ in fields the blocks do not read (dp/pp layout, ZeRO stage,
    schedule, overlap, stage split, ZeRO-3 gathering) and in fields they do; the former share the base's blocks."""
    from commtax.spec import job_with
    from commtax.workload.step import (
        Block,
        _blocks,
        _build_embed_block,
        _build_head_block,
        _build_layer_passes,
        _layer_recompute,
    )

    def fresh(j):
        passes = _build_layer_passes(j, False)
        return Block("layer", passes.fwd, passes.bwd, _layer_recompute(j, passes, False)), *(
            _build_embed_block(j),
            _build_head_block(j),
        )

    base = load_job(job_dict(tp=8, pp=4, dp=8, zero=1, micro_batch=1, grad_comm_dtype=grad_dtype))
    ref = _blocks(base)
    assert ref[:3] == fresh(base)
    unread = [
        dict(pp=2, dp=16),
        dict(pp=8, dp=4, vp=2),
        dict(zero=3, zero3_gather="per_parameter_sync"),
        dict(zero=2),
        dict(zero=0),
        dict(schedule="gpipe"),
        dict(overlap={"dp": False, "tp": True, "cp": True, "pp": False}),
        dict(first_stage_layers=18, last_stage_layers=20),
        dict(stage_layers=(21, 19, 19, 21)),
        dict(pp=2, dp=16, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True),
    ]
    if grad_dtype != "bf16":  # error feedback exists only for quantized formats
        unread.append(dict(grad_error_feedback=True))
    for changes in unread:
        assert _blocks(job_with(base, **changes)) is ref, changes
    for changes in (dict(micro_batch=2), dict(recompute="full"), dict(sequence_parallel=False), dict(tp=4, dp=16)):
        other = job_with(base, **changes)
        assert _blocks(other)[:3] == fresh(other) != ref[:3], changes


def test_recompute_settings_share_the_layers_forward_and_backward_passes():
    """The layer's forward and backward passes are built once for plans that differ only in their recompute (the
    passes' builder never reads it): one ``_LayerPasses`` object, each recompute pass of its own."""
    from commtax.spec import job_with
    from commtax.workload.step import _layer_block, _layer_passes

    none = gpt_job(tp=2, sequence_parallel=False, recompute="none")
    others = [job_with(none, recompute="full"), job_with(none, recompute="selective", selective_policy="per_op")]
    assert all(_layer_passes(o) is _layer_passes(none) for o in others)
    recomputes = [_layer_block(j).recompute for j in (none, *others)]
    # per-op SAC: the 2 odd GEMMs of 4 and the 3 elementwise ops (norms, residual adds, activation)
    assert [len(r.ops) for r in recomputes] == [0, len(_layer_block(none).fwd.ops), 2 + 3]


def test_deepspeeds_bf16_optimizer_accumulates_fp32_gradients_every_micro_batch():
    # deepspeed/runtime/bf16_optimizer.py update_hp_grads after each backward: 18 B per weight (cast 2 + 4, add
    # 4 + 4 + 4), two kernels per weight tensor; BF16_Optimizer is DeepSpeed's bf16 path for ZeRO stage 0/1 only:
    # the block cache keys on that, not on the stage
    from commtax.spec import job_with
    from commtax.workload.step import _layer_block, _layer_gemms

    job = load_job(job_dict(tp=8, pp=4, dp=8, zero=1, framework="megatron-deepspeed", sequence_parallel=False))
    op = next(o for o in _layer_block(job).bwd.ops if o.name == "bf16_optimizer_grad_accum")
    weights = sum(kk * nn for _, _, nn, kk in _layer_gemms(job, job.training.seq_len))
    assert op.bytes == 18 * weights
    for other in (job_with(job, zero=2), job_with(job, framework="megatron-lm")):
        assert all(o.name != "bf16_optimizer_grad_accum" for o in _layer_block(other).bwd.ops)
        assert all(o.name != "bf16_optimizer_grad_accum" for o in build_workload(other).layer.bwd.ops)
    zero0, zero1 = build_workload(job_with(job, zero=0)).layer, build_workload(job).layer
    assert zero0 == zero1 and zero0.bwd is zero1.bwd  # keyed by the stage read, one interned pass to price


@pytest.mark.parametrize(
    "plan",
    [
        {"tp": 8, "pp": 4, "vp": 2, "zero": 1, "micro_batch": 1, "dp": None},
        {"tp": 4, "pp": 2, "zero": 3, "recompute": "full", "micro_batch": 2, "dp": None},
        {"tp": 2, "pp": 1, "cp": 2, "zero": 0, "sequence_parallel": False, "dp": None},
    ],
)
def test_pass_workload_is_what_the_stages_read_of_the_whole_workload(plan):
    """``pass_workload`` (the search's per-micro-batch template) holds build_workload's blocks, send and split, and
    prices the stages and pipeline sends alike; its per-step DP ops and optimizer are empty."""
    from commtax.costs.pricing import Costs
    from commtax.schedule.analytical import pp_exposed, stage_times
    from commtax.workload.step import pass_workload

    job = load_job(job_dict(**plan))
    whole, passes = build_workload(job), pass_workload(job)
    for f in ("layer", "embed", "head", "moe_layer", "pp_send", "layers_per_stage", "chunk_layers", "micro_batches"):
        assert getattr(passes, f) == getattr(whole, f), f
    assert passes.pp_send.bytes == job.plan.micro_batch * 4096 // job.plan.cp * 8192 * 2 / job.plan.tp  # b·s/cp·h·2 B/t
    assert passes.dp_step == passes.dp_microbatch == passes.dp_codec == () and passes.optimizer.bytes == 0.0
    fresh = lambda: Costs(job)  # noqa: E731  (no price shared between the two)
    st_whole, st_passes = stage_times(job, whole, fresh()), stage_times(job, passes, fresh())
    assert st_whole == st_passes
    assert pp_exposed(job, whole, fresh(), st_whole) == pp_exposed(job, passes, fresh(), st_passes)


def test_equal_phases_of_different_blocks_are_one_object():
    """The blocks' phases are kept one object per value (``step._blocks``): two recompute settings share the forward
    pass, and their recompute passes differ."""
    none = build_workload(gpt_job(tp=2, sequence_parallel=False, recompute="none"))
    full = build_workload(gpt_job(tp=2, sequence_parallel=False, recompute="full"))
    assert none.layer is not full.layer
    assert none.layer.fwd is full.layer.fwd and none.embed.fwd is full.embed.fwd
    assert none.layer.recompute != full.layer.recompute


def test_blocks_are_keyed_by_the_specs_values_not_their_objects():
    """The blocks cache finds a job's blocks by the values of its model, training and assumptions (``_specs_key``
    hashes them once for the objects met last): an equal copy of the model finds the same blocks, another model
    does not."""
    from commtax.spec import replaced

    job = gpt_job(tp=2, sequence_parallel=False)
    copy = replaced(job, model=job.model.model_copy())
    assert copy.model is not job.model and copy.model == job.model
    assert build_workload(copy).layer is build_workload(job).layer
    other = replaced(job, model=job.model.model_copy(update={"ffn_hidden": 2 * job.model.ffn}))
    assert build_workload(other).layer != build_workload(job).layer
    assert build_workload(job).layer is build_workload(copy).layer  # the first specs again, after others


def test_the_head_and_embedding_are_kept_by_their_token_count():
    """The head and embedding read the tokens of a micro-batch (``Job.micro_batch_tokens``), not micro_batch and cp
    apart: plans of equal token counts share one block, equal to the one built from scratch."""
    from commtax.spec import job_with
    from commtax.workload.step import _build_embed_block, _build_head_block, _embed_block, _head_block

    base = load_job(job_dict(tp=8, pp=4, dp=None, zero=1, micro_batch=2, cp=1))
    same = job_with(base, micro_batch=4, cp=2)
    assert same.micro_batch_tokens == base.micro_batch_tokens == 2 * base.training.seq_len
    assert _head_block(same) is _head_block(base) and _embed_block(same) is _embed_block(base)
    assert _head_block(same) == _build_head_block(same) and _embed_block(same) == _build_embed_block(same)
    other = job_with(base, micro_batch=1)
    assert _head_block(other) == _build_head_block(other) != _head_block(base)


def test_op_records_are_one_instance_per_typed_value():
    """``_gemm``, ``_mem`` and ``collective_op`` hand out one frozen record per value; an int and a float of equal
    value stay apart, so a record holds what its call gave."""
    from commtax.workload.step import Collective, _gemm, _mem, collective_op

    assert _gemm("qkv", 8, 16, 32, 2.0) is _gemm("qkv", 8, 16, 32, 2.0)
    assert _mem("loss", 1.0) is _mem("loss", 1.0) and type(_mem("loss", 1).bytes) is int
    assert collective_op("tp_loss", "all_reduce", 4.0, "tp") == Collective("tp_loss", "all_reduce", 4.0, "tp")
    assert collective_op("tp_loss", "all_reduce", 4.0, "tp") is collective_op("tp_loss", "all_reduce", 4.0, "tp")
    assert type(collective_op("tp_loss", "all_reduce", 4, "tp").bytes) is int
