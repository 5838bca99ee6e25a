"""Megatron-Core's MXFP8 LM head (plan.fp8_output_proj; fp8_output_proj, core_v0.18.0
fp8_utils.is_mxfp8_output_proj_active -> TELMHeadColumnParallelLinear): the head's three GEMMs at the fp8 rate, its
input quantized before the forward and the logits' gradient before the backward; set by the Megatron-Bridge
GB300/GB200 MXFP8 recipes of DeepSeek-V3 and GPT-OSS from v0.5.0 (deepseek_llm_pretrain.py, gpt_oss_llm_pretrain.py:
"if cfg.mixed_precision.fp8_recipe == 'mxfp8': cfg.model.fp8_output_proj = True")."""

import pytest

from commtax.decide.validate import read_rows, row_plan
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job
from commtax.spec.catalog import load_catalog
from commtax.workload.step import build_workload

GB300 = {"gpu": "gb300", "intra_node": "nvlink5", "inter_node": "ib-xdr", "gpus_per_node": 72}


def gpt_oss(precision="fp8", **plan):
    return load_job(
        {
            "model": "gpt-oss-120b",  # hidden 2880, vocabulary 201,088, untied head
            "cluster": {**GB300, "num_gpus": 64},
            "plan": {"framework": "megatron-core", "ep": 16, "micro_batch": 4, "recompute": "none", **plan},
            "training": {"seq_len": 4096, "global_batch": 1280, "precision": precision},
        }
    )


def head_ops(job):
    head = build_workload(job).head
    return {o.name: o for ph in (head.fwd, head.bwd) for o in ph.ops}


def test_head_gemms_fp8_and_casts_hand_worked():
    # MBS 4 × 4096 = 16,384 tokens: the head's input 16,384 × 2,880 = 47,185,920 elements, the logits' gradient
    # 16,384 × 201,088 = 3,294,625,792, each at the MXFP8 cast's 4.0625 B: 191,692,800 B and 13,384,417,280 B
    on, off = head_ops(gpt_oss(fp8_recipe="mxfp8", fp8_output_proj=True)), head_ops(gpt_oss(fp8_recipe="mxfp8"))
    for name in ("logits", "logits_dgrad", "logits_wgrad"):
        assert on[name].fp8 and not off[name].fp8
        assert on[name].flop == off[name].flop == 2 * 16_384 * 201_088 * 2_880
    assert on["logits_cast"].bytes == 191_692_800
    assert on["logits_grad_cast"].bytes == 13_384_417_280
    assert "logits_cast" not in off


def test_step_faster_and_refused_outside_mxfp8():
    job = gpt_oss(fp8_recipe="mxfp8", fp8_output_proj=True)
    assert estimate(job).step_time_s < estimate(job_with(job, fp8_output_proj=False)).step_time_s
    with pytest.raises(Exception, match="fp8_output_proj"):
        gpt_oss(precision="bf16", fp8_output_proj=True)
    with pytest.raises(Exception, match="fp8_output_proj"):
        gpt_oss(fp8_recipe="delayed", fp8_output_proj=True)


def test_bridge_recipes_that_set_fp8_output_proj(validation_dir):
    catalog = load_catalog()
    rows = {r["id"]: r for r in read_rows(validation_dir / "public_moe_runs.csv")}

    def outproj(i):
        return row_plan(rows[i], catalog).choice.job.plan.fp8_output_proj

    for i in ("mb2608_deepseekv3_gb300", "mb2608_deepseekv3_gb200", "mb2606_deepseekv3_gb300_fp8"):
        assert outproj(i), i
    assert outproj("mb2608_gptoss120b_gb300") and outproj("mb2608_gptoss120b_gb200")
    # not before the 26.06 container (core 0.18), nor the Qwen3 recipes, nor B200/B300
    for i in ("mb260401_deepseekv3_gb200_fp8", "mb2608_qwen330ba3b_gb300", "mb2606_deepseekv3_b300_fp8"):
        assert not outproj(i), i
