"""GPT-OSS's YaRN RoPE as Megatron runs it: unfused (Megatron-Bridge utils/fusions.py
validate_rope_fusion_compatibility keeps apply_rope_fusion for position_embedding_type "rope" only; Megatron-Core
rope_utils.apply_rotary_pos_emb falls back when mscale != 1.0), so _apply_rotary_pos_emb_bshd ropes q and k in
eager PyTorch (workload.step.unfused_rope): hand-worked bytes and kernels, and where it does not apply."""

import math

import pytest

from commtax.spec import job_with, load_job
from commtax.workload.step import build_workload

H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}


def gpt_oss(**plan):
    return load_job(
        {
            "model": "gpt-oss-120b",  # 64 query heads, 8 KV heads, head dim 64, YaRN factor 32
            "cluster": {**H100, "num_gpus": 64},
            "plan": {"framework": "megatron-core", "tp": 1, "pp": 4, "ep": 8, "recompute": "none", **plan},
            "training": {"seq_len": 4096, "global_batch": 256},
        }
    )


def rope_ops(job):
    block = build_workload(job).moe_layer
    return next(o for o in block.fwd.ops if o.name == "rope"), next(o for o in block.bwd.ops if o.name == "rope_bwd")


def test_concentration_factor_from_the_config():
    # Megatron-Core _yarn_get_mscale(32) = 0.1 ln 32 + 1 (no mscale / mscale_all_dim in GPT-OSS's rope_scaling)
    assert gpt_oss().model.rope_mscale == pytest.approx(0.1 * math.log(32) + 1, abs=1e-4)


def test_bytes_and_kernels_hand_worked():
    # q and k of one micro-batch: 4,096 tokens × (64 + 8) heads × 64 = 18,874,368 bf16 elements. Forward: t·cos,
    # -x2, cat, ·sin, add, cat = 12 × 2 B per element, 6 kernels on each of q and k plus 6 on the freqs table;
    # backward: 14 × 2 B, 7 kernels each. Fused (the same model under torchtitan, or without the YaRN factor):
    # read and write once forward (4 B), twice backward (8 B), one kernel.
    elems = 4096 * 72 * 64
    fwd, bwd = rope_ops(gpt_oss())
    assert (fwd.bytes, fwd.kernels) == (24 * elems, 24)
    assert (bwd.bytes, bwd.kernels) == (28 * elems, 14)
    fused_f, fused_b = rope_ops(job_with(gpt_oss(), framework="torchtitan"))
    assert (fused_f.bytes, fused_b.bytes) == (4 * elems, 8 * elems)


def test_only_a_yarn_factor_other_than_one():
    qwen3 = load_job(
        {
            "model": "qwen3-30b-a3b",
            "cluster": {**H100, "num_gpus": 16},
            "plan": {"framework": "megatron-core", "ep": 16, "recompute": "none"},
            "training": {"seq_len": 4096, "global_batch": 256},
        }
    )
    fwd, bwd = rope_ops(qwen3)
    assert fwd.kernels == 1 and bwd.bytes == 2 * fwd.bytes
