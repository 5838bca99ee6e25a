"""Architecture facts of the MoE catalog models that change their cost: GPT-OSS's clamped GLU and its alternating
sliding-window attention (hand-worked bytes and FLOPs, the kernel rate below the attention table); DeepSeek-V3's
multi-token prediction module and the layouts its recipes give the last stage."""

import pytest

from commtax.costs.compute import attention_efficiency, attention_tables, causal_block_share
from commtax.decide.validate import recipe_layout
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import load_job
from commtax.spec.catalog import load_catalog
from commtax.workload.memory import loss_micro_batches
from commtax.workload.moe import expert_rows, local_experts
from commtax.workload.step import (
    attention_flop,
    build_workload,
    glu_clamp_ops,
    model_flop_per_token,
    mtp_params_per_gpu,
    stage_param_split,
    window_attention_flop,
)

B200 = {"gpu": "b200-sxm-192gb", "intra_node": "nvlink5", "inter_node": "ib-ndr", "num_gpus": 64}


def gpt_oss(model=None, **plan):
    return load_job(
        {
            "model": model or "gpt-oss-120b",
            "cluster": B200,
            "plan": {"ep": 8, "micro_batch": 1, **plan},
            "training": {"seq_len": 4096, "global_batch": 512, "precision": "bf16"},
        }
    )


def ops_by_name(phase):
    return {o.name: o for o in phase.ops}


def test_glu_clamp_passes_hand_worked():
    # U = 1000 outputs at bf16 (a = 2), bool masks 1 B: forward two clamps (r+w U each) and cat (r+w 2U): 8·a·U;
    # backward: max-only clamp 3a + 2b, two-sided clamp 4a + 6b, chunk's cat 4a: (11a + 8b)·U = 30 B per output
    fwd, bwd = glu_clamp_ops("x", 1000, 2.0)
    assert fwd.bytes == 8 * 2 * 1000 and fwd.kernels == 3
    assert bwd.bytes == (3 * 2 + 2 + 4 * 2 + 6 + 4 * 2) * 1000 == 30_000 and bwd.kernels == 7


def test_gpt_oss_experts_run_the_clamp_and_others_do_not():
    job = gpt_oss()
    assert job.model.swiglu_limit == 7.0  # config.json swiglu_limit; Megatron-Bridge activation_func_clamp_value
    layer = build_workload(job).moe_layer
    u = expert_rows(job) * local_experts(job) * job.model.moe_ffn_hidden  # activation outputs of the local experts
    assert ops_by_name(layer.fwd)["expert_activation_clamp"].bytes == pytest.approx(8 * 2 * u)
    assert ops_by_name(layer.bwd)["expert_activation_clamp_bwd"].bytes == pytest.approx(30 * u)
    plain = gpt_oss(model={**_catalog_entry("gpt-oss-120b"), "swiglu_limit": None})
    assert "expert_activation_clamp" not in ops_by_name(build_workload(plain).moe_layer.fwd)
    assert estimate(plain).step_time_s < estimate(job).step_time_s


def test_window_attention_flop_hand_worked_and_full_window_is_causal():
    job = gpt_oss()
    b, a, d, s, w = 1, 64, 64, 4096, 128
    assert window_attention_flop(job) == 4 * b * a * d * (s * w - w * (w - 1) / 2)  # query i meets min(i+1, w) keys
    wide = gpt_oss(model={**_catalog_entry("gpt-oss-120b"), "sliding_window": s})
    # w = s: s(s+1)/2 pairs, the causal s²/2 plus the diagonal
    assert window_attention_flop(wide) == pytest.approx(attention_flop(wide, causal=True) * (1 + 1 / s))


def test_alternating_window_prices_half_the_layers_at_the_window():
    job = gpt_oss()
    assert job.model.windowed_share == 0.5  # 36 layers, every 2nd full (window_attn_skip_freq 2)
    fwd = ops_by_name(build_workload(job).moe_layer.fwd)
    assert fwd["attention"].flop == pytest.approx(attention_flop(job, causal=True) / 2)
    assert fwd["attention_window"].flop == pytest.approx(window_attention_flop(job) / 2)
    assert fwd["attention_window"].n == 128  # the kernel's rate at w keys
    bwd = ops_by_name(build_workload(job).moe_layer.bwd)
    assert bwd["attention_window_bwd"].flop == pytest.approx(2.5 * fwd["attention_window"].flop)
    # eager attention masks the full scores: no saving, one op
    eager = ops_by_name(build_workload(gpt_oss(attention="eager")).moe_layer.fwd)
    assert "attention_window" not in eager and eager["attention"].flop == attention_flop(job, causal=False)


def test_windowed_share_counts_the_full_layers():
    entry = _catalog_entry("gpt-oss-120b")
    five = load_job({**_job_raw(), "model": {**entry, "layers": 5}})
    assert five.model.windowed_share == pytest.approx(1 - 2 / 5)  # layers 2 and 4 full
    every = load_job({**_job_raw(), "model": {**entry, "full_attention_every": None}})
    assert every.model.windowed_share == 1.0


def test_full_attention_every_needs_a_window():
    entry = {**_catalog_entry("gpt-oss-120b"), "sliding_window": None}
    with pytest.raises(SpecError, match="full_attention_every applies to sliding-window models"):
        load_job({**_job_raw(), "model": entry})


def test_block_share_and_rate_below_the_table():
    # n = keys/128 query blocks: n²/2 useful of n(n+1)/2 computed
    assert causal_block_share(128) == 0.5 and causal_block_share(512) == pytest.approx(4 / 5)
    shortest = attention_tables()["kernels"]["cudnn"]["hopper"]["seq"][0]
    assert shortest == 512
    at_table = attention_efficiency("cudnn", "hopper", 512, 128, False)
    assert attention_efficiency("cudnn", "hopper", 128, 128, False) == pytest.approx(at_table * 0.5 / 0.8)
    assert attention_efficiency("cudnn", "hopper", 1024, 128, False) > at_table  # the table itself: unchanged


def _catalog_entry(name):
    return {"name": name, **load_catalog()["model"][name]}


def _job_raw():
    return {
        "cluster": B200,
        "plan": {"ep": 8, "micro_batch": 1},
        "training": {"seq_len": 4096, "global_batch": 512, "precision": "bf16"},
    }


# ----------------------------------------------------------------------------- multi-token prediction (DeepSeek-V3)
H800 = {"gpu": "h800-sxm5-80gb", "intra_node": "nvlink-h800", "inter_node": "ib-ndr", "num_gpus": 256}


def deepseek(mtp=None, **plan):
    model = {**_catalog_entry("deepseek-v3"), **({} if mtp is None else {"mtp_layers": mtp})}
    return load_job(
        {
            "model": model,
            "cluster": H800,
            "plan": {"ep": 64, "pp": 4, "micro_batch": 1, "recompute": "full", **plan},
            "training": {"seq_len": 4096, "global_batch": 1024, "precision": "fp8"},
        }
    )


def test_mtp_module_size_against_the_report():
    # DeepSeek-V3 report: 671B main model + a 14B MTP module (its checkpoint also stores the shared embedding and head)
    m = deepseek().model
    assert m.mtp_layers == 1 and m.params() == pytest.approx(671e9, rel=0.01)  # params() leaves MTP out, as the card
    assert m.mtp_params() + 2 * m.vocab * m.hidden == pytest.approx(14e9, rel=0.05)


def test_mtp_runs_a_layer_projection_and_second_head_on_the_last_stage():
    job, plain = deepseek(), deepseek(mtp=0)
    h, t = job.model.hidden, 4096
    head = build_workload(job).head
    names = [o.name for o in head.fwd.ops]
    assert names.count("logits") == 2 and names.count("expert_up") == 1  # the main head, then the MTP layer and head
    proj = ops_by_name(head.fwd)["mtp_proj"]
    assert (proj.m, proj.n, proj.k) == (t, h, 2 * h)  # [RMSNorm(h_i); RMSNorm(Emb(t_i+1))] · M, M ∈ R^{h×2h}
    # eh_proj is a TE linear inside the MTP layer's fp8 context: fp8 inputs, its 2h-wide input cast (4 B each, delayed
    # scaling's cast-transpose), as the decoder's linears; the main head's logits stay bf16
    assert proj.fp8 and not ops_by_name(head.fwd)["logits"].fp8
    assert ops_by_name(head.fwd)["mtp_proj_cast"].bytes == pytest.approx(4.0 * t * 2 * h)
    assert ops_by_name(head.bwd)["mtp_proj_dgrad"].fp8 and ops_by_name(head.bwd)["mtp_proj_wgrad"].fp8
    assert [o.name for o in build_workload(plain).head.fwd.ops] == ["logits", "loss"]
    # model FLOPs: one more MoE layer, the projection and another logits GEMM, fwd+bwd (×3)
    m = job.model
    moe = 2 * m.attention_params() + 4 * t * m.heads * m.head_dim + 2 * m.moe_layer_params(active=True)
    extra = 3 * (moe + 2 * 2 * h * h + 2 * h * m.vocab)
    assert model_flop_per_token(job) - model_flop_per_token(plain) == pytest.approx(extra)


def test_mtp_weights_sit_on_the_last_stage():
    job, plain = deepseek(), deepseek(mtp=0)
    split, base = stage_param_split(job), stage_param_split(plain)
    assert split[:-1] == base[:-1]
    dense, experts = mtp_params_per_gpu(job)
    assert split[-1] == pytest.approx((base[-1][0] + dense, base[-1][1] + experts))
    assert experts == pytest.approx(256 / 64 * job.model.expert_params())  # 4 local experts of the MTP MoE layer


def test_dualpipe_holds_one_micro_batch_of_logits():
    assert loss_micro_batches(deepseek(schedule="dualpipe"), 5.0) == 1.0
    assert loss_micro_batches(deepseek(), 3.0) == 3.0  # 1F1B: the last stage's own in-flight count (1 there)


def test_recipe_layout_by_virtual_stages():
    row = {"model": "deepseek-v3"}
    assert recipe_layout(row, 16) == (4,) * 15 + (1,)  # "Et*4|(t*4|)*14tmL"
    assert recipe_layout(row, 32) == (1,) + (2,) * 30 + (0,)  # "Et|(tt|)*30mL"
    assert sum(recipe_layout(row, 8)) == sum(recipe_layout(row, 4)) == 61
    assert recipe_layout(row, 12) is None and recipe_layout({"model": "qwen3-30b-a3b"}, 16) is None


def test_search_agrees_with_estimate_on_the_new_architecture_fields():
    # a small MoE model with all three: the search's shared blocks price them as estimate does
    from commtax.decide.search import Space, agreement, search

    model = {
        "layers": 8,
        "hidden": 2048,
        "heads": 16,
        "kv_heads": 4,
        "vocab": 32000,
        "gated_mlp": True,
        "head_dim": 64,
        "num_experts": 16,
        "top_k": 2,
        "moe_ffn_hidden": 1024,
        "swiglu_limit": 7.0,
        "sliding_window": 128,
        "full_attention_every": 2,
        "mtp_layers": 1,
    }
    cluster = {"gpu": "h100-sxm5-80gb", "gpus_per_node": 8, "intra_node": "nvlink4", "inter_node": "ib-ndr"}
    job = load_job(
        {
            "model": model,
            "cluster": {**cluster, "num_gpus": 32},
            "plan": {"framework": "megatron-core", "ep": 4, "zero": 1},
            "training": {"seq_len": 2048, "global_batch": 128},
        }
    )
    space = Space.parse({"tp": "1,2", "pp": "1,2,4", "cp": "1", "vp": "1,2", "micro_batch": "1,2", "zero": "1"})
    res = search(job, space, top=3, workers=1)
    a = agreement(job, res, sample=12, seed=0)
    assert a["step_rel"] < 1e-9 and a["mem_rel"] < 1e-9 and a["fits_mismatch"] == 0


def test_qwen3_normalises_every_query_and_key_head():
    # Qwen3-30B-A3B: 32 query + 4 key heads of 128 per token, read and written once at bf16 (fused RMSNorm)
    job = load_job(
        {
            "model": "qwen3-30b-a3b",
            "cluster": {**B200, "num_gpus": 8},
            "plan": {"ep": 8, "micro_batch": 1},
            "training": {"seq_len": 4096, "global_batch": 64, "precision": "bf16"},
        }
    )
    fwd = ops_by_name(build_workload(job).moe_layer.fwd)
    assert fwd["qk_norm"].bytes == 2 * 2 * 4096 * (32 + 4) * 128 and fwd["qk_norm"].kernels == 2
    assert "qk_norm" not in ops_by_name(build_workload(gpt_oss()).moe_layer.fwd)


def test_mla_latents_are_normalised():
    # DeepSeek-V3: RMSNorm of the 1536-wide q latent and the 512-wide kv latent per token, replicated over TP
    job = deepseek(tp=2, sequence_parallel=True)
    fwd = ops_by_name(build_workload(job).moe_layer.fwd)
    assert fwd["mla_norms"].bytes == 2 * 2 * 4096 * (1536 + 512) and fwd["mla_norms"].kernels == 2
    # RoPE: Megatron-Core's fused MLA RoPE also builds each head's key and value, ~ q and k of every head once
    assert fwd["rope"].bytes == 2 * 2 * 4096 * (128 + 128) * 192 / 2
