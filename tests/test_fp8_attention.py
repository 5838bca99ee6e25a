"""Transformer Engine's FP8 dot-product attention (plan.fp8_attention; Megatron-Core --fp8-dot-product-attention, the
MXFP8 recipe's fp8_dpa): cuDNN's MXFP8 fused attention on Blackwell at its measured time over the BF16 kernel's
(catalog/attention.yaml mxfp8_time_ratio: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training results, cuDNN
9.22.0 on GB200), TE's quantization of q, k, v and the output gradient (attention/dot_product_attention/backends.py
FusedAttnFunc, v2.16), the sliding-window layers' MXFP8 backward computing every causal block, and the 26.06+ NVL72
MXFP8 Megatron-Bridge recipes that set it (v0.5.0 *_FP8_MX_V1/V2 fp8_dot_product_attention=True; v0.6.0
perf_recipes)."""

from dataclasses import replace

import pytest

from commtax.costs.compute import attention_time, mxfp8_attention_ratio
from commtax.costs.pricing import Costs
from commtax.decide.validate import read_rows, row_plan
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job
from commtax.spec.catalog import load_catalog
from commtax.workload.step import attention_flop, build_workload

GB300 = {"gpu": "gb300", "intra_node": "nvlink5", "inter_node": "ib-xdr", "gpus_per_node": 72}


def gpt_oss(**plan):
    return load_job(
        {
            "model": "gpt-oss-120b",  # 64 heads, 8 kv heads, head dim 64, a 128-key window on every other layer
            "cluster": {**GB300, "num_gpus": 64},
            "plan": {
                "framework": "megatron-core",
                "ep": 16,
                "micro_batch": 4,
                "recompute": "none",
                "fp8_recipe": "mxfp8",
                "attention": "cudnn",
                **plan,
            },
            "training": {"seq_len": 4096, "global_batch": 1280, "precision": "fp8"},
        }
    )


def ops(job):
    layer = build_workload(job).moe_layer
    return {o.name: o for ph in (layer.fwd, layer.bwd, layer.recompute) for o in ph.ops}


def test_ratio_read_from_the_measured_table():
    # cudnn-frontend GB200 runs at 4096 keys (ms, bf16 -> mxfp8): head dim 128 forward 0.391 -> 0.326 (0.834),
    # backward 1.198 -> 1.305 (1.089, slower); MLA's 192/128 backward 3.383 -> 2.620 (0.774)
    assert mxfp8_attention_ratio("cudnn", "blackwell", 4096, 128, False) == pytest.approx(0.834)
    assert mxfp8_attention_ratio("cudnn", "blackwell", 4096, 128, True) == pytest.approx(1.089)
    assert mxfp8_attention_ratio("cudnn", "blackwell", 4096, 192, True) == pytest.approx(0.774)
    # GPT-OSS's head dim 64 is not measured: the nearest, 128; log-linear between lengths (5,793 keys: midway
    # between 4096 and 8192 in log2), clamped past the ends
    assert mxfp8_attention_ratio("cudnn", "blackwell", 4096, 64, False) == pytest.approx(0.834)
    assert mxfp8_attention_ratio("cudnn", "blackwell", 5793, 128, False) == pytest.approx((0.834 + 0.827) / 2, 1e-3)
    assert mxfp8_attention_ratio("cudnn", "blackwell", 65536, 192, False) == pytest.approx(0.749)
    # nothing measured elsewhere: no change (the plan refuses fp8 attention there)
    assert mxfp8_attention_ratio("cudnn", "hopper", 4096, 128, False) == 1.0


def test_attention_priced_at_the_ratio():
    job, base = gpt_oss(fp8_attention=True), gpt_oss()
    cm = Costs(job).cm
    for name in ("attention", "attention_bwd"):
        op = ops(job)[name]
        assert op.fp8 and not ops(base)[name].fp8
        ratio = mxfp8_attention_ratio("cudnn", "blackwell", 4096, 64, name.endswith("bwd"))
        assert attention_time(cm, op) == pytest.approx(attention_time(cm, replace(op, fp8=False)) * ratio)


def test_window_backward_computes_every_causal_block():
    # cuDNN's MXFP8 backward of a 128-key window grows as s² (GB200: 2.08, 7.43, 27.9 ms at 4k, 8k, 16k) where the
    # BF16 one grows as s (0.465, 0.911, 1.818 ms); the MXFP8 forward keeps the BF16 window's time (0.210 ms both)
    job, base = gpt_oss(fp8_attention=True), gpt_oss()
    win_b, base_b = ops(job)["attention_window_bwd"], ops(base)["attention_window_bwd"]
    share = job.model.windowed_share  # every other layer: 0.5
    assert share == 0.5
    assert win_b.flop == pytest.approx(2.5 * attention_flop(job, causal=True) * share)
    assert (win_b.n, win_b.fp8, win_b.backward) == (4096, True, True)
    assert (base_b.n, base_b.fp8) == (128, False)
    assert ops(job)["attention_window"] == ops(base)["attention_window"]
    # the measured check (catalog/attention.yaml): cudnn-frontend's GPT-OSS preset, 128 heads of dim 64, batch 2,
    # 4096 keys: 2.080 ms (GB200) and 1.871 ms (GB300) for the MXFP8 window backward, a causal backward of
    # 2.5 × 4·s²·d·h·b/2 = 1.374 TFLOP; GPT-OSS at MBS 4 × 64 heads has the same FLOPs, and the model prices all
    # of them (both halves of the windowed share) at the BF16 causal rate × the MXFP8 ratio: 2.013 ms
    full = replace(win_b, flop=win_b.flop / share)
    assert full.flop == pytest.approx(2.5 * 4 * 4096**2 * 64 * 128 * 2 / 2)
    assert attention_time(Costs(job).cm, full) == pytest.approx(2.080e-3, rel=0.04)


def test_quantization_hand_worked():
    # MBS 4 × 4096 = 16,384 tokens; q 64 heads × 64, k and v 8 heads × 64 each: 16,384 × (4,096 + 1,024) =
    # 83,886,080 elements at the MXFP8 cast's 4.0625 B (read 2 B, both layouts 1 + 1 B with a scale per 32):
    # 340,787,200 B, one kernel each for q, k, v; the output gradient 16,384 × 64 × 64 = 67,108,864 elements,
    # 272,629,760 B
    got = ops(gpt_oss(fp8_attention=True))
    assert got["attention_fp8_cast"].bytes == 340_787_200 and got["attention_fp8_cast"].kernels == 3
    assert got["attention_fp8_grad_cast"].bytes == 272_629_760
    assert "attention_fp8_cast" not in ops(gpt_oss())


def test_step_moves_and_refusals():
    job, base = gpt_oss(fp8_attention=True), gpt_oss()
    # GPT-OSS: the windowed layers' backward outweighs the full layers' faster forward
    assert estimate(job).step_time_s > estimate(base).step_time_s
    with pytest.raises(Exception, match="fp8_attention"):
        gpt_oss(fp8_attention=True, fp8_recipe="current")
    with pytest.raises(Exception, match="cuDNN"):
        gpt_oss(fp8_attention=True, attention="fa3")


def test_bridge_recipes_that_set_fp8_attention(validation_dir):
    # v0.5.0 DEEPSEEK_V3_..._GB300_FP8_MX_V1/V2, the GPT-OSS GB300/GB200 FP8_MX_V2, the Qwen3 GB FP8_MX configs, and
    # their v0.6.0 perf_recipes (26.08) set fp8_dot_product_attention; DeepSeek-V3 on GB200 does not (v0.6.0
    # _enable_deepseek_full_iteration_mxfp8(cfg, fp8_output_proj=True)), nor any eager recipe
    catalog = load_catalog()
    rows = {r["id"]: r for r in read_rows(validation_dir / "public_moe_runs.csv")}

    def fp8_attn(i):
        return row_plan(rows[i], catalog).choice.job.plan.fp8_attention

    for i in (
        "mb2608_deepseekv3_gb300",
        "mb2606_deepseekv3_gb300_fp8",
        "mb2608_gptoss120b_gb300",
        "mb2608_gptoss120b_gb200",
        "mb2608_qwen330ba3b_gb300",
        "mb2608_qwen3235ba22b_gb200",
    ):
        assert fp8_attn(i), i
    for i in ("mb2608_deepseekv3_gb200", "mb2606_gptoss120b_b300_fp8", "mb260401_qwen3235ba22b_gb300_fp8"):
        assert not fp8_attn(i), i


def test_search_agrees_with_estimate_with_fp8_attention():
    # the price is the workload's (estimate, search and simulate read the same ops): a small windowed MoE model on
    # B200, MXFP8 attention on, searched over tp, pp and the micro-batch
    from commtax.decide.search import Space, agreement, search

    job = load_job(
        {
            "model": {
                "layers": 8,
                "hidden": 2048,
                "heads": 32,
                "kv_heads": 4,
                "head_dim": 64,
                "ffn_hidden": 8192,
                "vocab": 32000,
                "gated_mlp": True,
                "num_experts": 16,
                "top_k": 2,
                "moe_ffn_hidden": 1024,
                "sliding_window": 128,
                "full_attention_every": 2,
            },
            "cluster": {"gpu": "b200-sxm-192gb", "intra_node": "nvlink5", "inter_node": "ib-ndr", "num_gpus": 16},
            "plan": {
                "framework": "megatron-core",
                "ep": 4,
                "zero": 1,
                "fp8_recipe": "mxfp8",
                "attention": "cudnn",
                "fp8_attention": True,
            },
            "training": {"seq_len": 4096, "global_batch": 64, "precision": "fp8"},
        }
    )
    space = Space.parse({"tp": "1,2", "pp": "1,2", "cp": "1", "micro_batch": "1,2", "zero": "1", "vp": "1"})
    res = search(job, space, top=3, workers=1)
    a = agreement(job, res, sample=12, seed=0)
    assert a["step_rel"] <= 1e-9 and a["mem_rel"] <= 1e-9
    assert res.max_rel_diff <= 1e-9
    assert estimate(job).step_time_s != estimate(job_with(job, fp8_attention=False)).step_time_s
