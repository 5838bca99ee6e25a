"""Transformer Engine's per-tensor current scaling (plan.fp8_recipe current): an amax pass before every fp8 cast
(TE quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax, nvte_compute_scale_from_amax,
nvte_quantize_v2); MXFP8 (plan.fp8_recipe mxfp8): one pass with the block scales; in both, the eager GroupedLinear's
splits quantized one by one (TE v2.10-v2.16 cast.cpp multi_tensor_quantize_impl: the fused multi-tensor kernel is
for delayed scaling only); and the Megatron-Bridge FP8 recipes that run them (H100 FP8_CS, Blackwell FP8_MX)."""

import pytest

from commtax.decide.validate import read_rows, row_plan
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job
from commtax.spec.catalog import load_catalog
from commtax.workload.step import build_workload

H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}
B200 = {"gpu": "b200-sxm-192gb", "intra_node": "nvlink5", "inter_node": "ib-ndr"}


def qwen3_30b(cluster=H100, **plan):
    return load_job(
        {
            "model": "qwen3-30b-a3b",  # hidden 2048, 128 experts, top-8, expert ffn 768
            "cluster": {**cluster, "num_gpus": 16},
            "plan": {"framework": "megatron-core", "tp": 1, "pp": 1, "ep": 16, "recompute": "none", **plan},
            "training": {"seq_len": 4096, "global_batch": 1024, "precision": "fp8"},
        }
    )


def casts(job, name):
    ops = {o.name: o for ph in (build_workload(job).moe_layer.fwd, build_workload(job).moe_layer.bwd) for o in ph.ops}
    return ops[name]


def test_expert_input_cast_hand_worked():
    # mbs 1 × 4096 tokens × top-8 = 32,768 rows over E_loc = 128 / 16 = 8 experts, each row 2,048 wide (the
    # up-projection's input): 67,108,864 elements. Delayed: one fused multi-cast-transpose (read 2 B, write the fp8
    # tensor and its transpose, 1 + 1 B) = 4 B. Current: the amax pass reads them once more (2 B) = 6 B, and
    # each of the 8 splits takes its own amax, scale and cast-transpose kernels (24).
    elems = 32_768 * 2048
    delayed, current = casts(qwen3_30b(), "expert_up_cast"), casts(qwen3_30b(fp8_recipe="current"), "expert_up_cast")
    assert delayed.bytes == 4 * elems and delayed.kernels == 1
    assert current.bytes == 6 * elems and current.kernels == 3 * 8
    # the output gradient of the down projection (32,768 rows × 2,048) is quantized the same way in backward
    grad = casts(qwen3_30b(fp8_recipe="current"), "expert_down_grad_cast")
    assert grad.bytes == 6 * elems and grad.kernels == 24


def test_no_transpose_on_blackwell():
    # SM100's fp8 GEMMs take any layout: TE writes no transposed copy (nvte_is_non_tn_fp8_gemm_supported), so the
    # current-scaling cast is the amax read (2 B), the read (2 B) and one fp8 write (1 B)
    elems = 32_768 * 2048
    assert casts(qwen3_30b(B200, fp8_recipe="current"), "expert_up_cast").bytes == 5 * elems
    assert casts(qwen3_30b(fp8_recipe="current"), "expert_up_cast").bytes == 6 * elems  # the cache tells them apart


def test_dense_gemm_casts_and_step():
    # the attention's linears are one tensor each: 6 B, 3 kernels; the step gets slower, not faster
    job = qwen3_30b(fp8_recipe="current")
    dense = {o.name: o for o in build_workload(job).moe_layer.fwd.ops}
    base = {o.name: o for o in build_workload(qwen3_30b()).moe_layer.fwd.ops}
    qkv = next(n for n in dense if n.endswith("_cast") and not n.startswith("expert"))
    assert dense[qkv].bytes == 1.5 * base[qkv].bytes and dense[qkv].kernels == 3
    assert estimate(job).step_time_s > estimate(qwen3_30b()).step_time_s
    assert estimate(job_with(job, fp8_recipe="delayed")).step_time_s == estimate(qwen3_30b()).step_time_s


def test_bridge_h100_fp8_rows_run_current_scaling(validation_dir):
    # Megatron-Bridge v0.2.0-v0.5.0 name only *_H100_FP8_CS_* configs (get_precision_config("fp8_cs")): rows of the
    # 25.11 container on; the 25.09 scripts defaulted to delayed ("ds"); Blackwell FP8 rows are MXFP8
    catalog = load_catalog()
    rows = {r["id"]: r for r in read_rows(validation_dir / "public_moe_runs.csv")}

    def recipe(i):
        return row_plan(rows[i], catalog).choice.job.plan.fp8_recipe

    assert recipe("mb2606_qwen330ba3b_h100_fp8") == "current"
    assert recipe("mb2511_qwen3235ba22b_h100_fp8") == "current"
    assert recipe("mb2509_qwen330ba3b_h100_fp8") == "delayed"
    assert recipe("mb2509_deepseekv3_gb200_fp8") == "delayed"
    assert recipe("mb260401_qwen330ba3b_b200_fp8") == "mxfp8"
    assert recipe("mb2511_deepseekv3_b200_fp8") == "mxfp8"
    assert recipe("mb2608_qwen330ba3b_gb200") == "mxfp8"


def test_mxfp8_casts_hand_worked():
    # the same 67,108,864 elements on B200: 2 B read, 1 + 1 B written, one E8M0 scale byte per 32 elements in each
    # layout: 4.0625 B. Eager GroupedLinear: one quantize kernel per split (8); the full-iteration recipes' fused
    # grouped MLP: one tex.group_quantize for all of them
    elems = 32_768 * 2048
    eager = casts(qwen3_30b(B200, fp8_recipe="mxfp8"), "expert_up_cast")
    graphed = casts(qwen3_30b(B200, fp8_recipe="mxfp8", cuda_graphs="full_iteration"), "expert_up_cast")
    assert eager.bytes == graphed.bytes == 4.0625 * elems
    assert (eager.kernels, graphed.kernels) == (8, 1)


def test_mxfp8_refused_before_blackwell():
    # Transformer Engine check_mxfp8_support: compute capability 10.0 or higher
    with pytest.raises(Exception, match="fp8_recipe mxfp8 needs a Blackwell GPU"):
        qwen3_30b(fp8_recipe="mxfp8")
