"""The experts' down-projection bias as Megatron-Core's TEGroupedMLP adds it (workload.moe.expert_bias_ops):
hand-worked bytes, and where it is not a pass of its own."""

import pytest

from commtax.spec import job_with, load_job
from commtax.workload.moe import expert_bias_ops, overlap_piece
from commtax.workload.step import build_workload

H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}


def gpt_oss(**plan):
    return load_job(
        {
            "model": "gpt-oss-120b",  # hidden 2880, 128 experts, top-4, expert biases
            "cluster": {**H100, "num_gpus": 64},
            "plan": {"framework": "megatron-core", "tp": 1, "pp": 4, "ep": 8, "recompute": "none", **plan},
            "training": {"seq_len": 4096, "global_batch": 256},
        }
    )


def test_bytes_hand_worked():
    # T·k = 4096 · 4 = 16,384 rows over E_loc = 16 experts, 2880 wide, bf16: experts.py _apply_bias per element
    # 12 B forward (b * p written, t + (b * p) read twice written once, the cat read and written), 4 B backward
    job = gpt_oss()
    (fwd,), (bwd,) = expert_bias_ops(job, 2.0)
    elems = 16_384 * 2880
    assert fwd.bytes == 12 * elems and bwd.bytes == 4 * elems
    assert fwd.kernels == 2 * 16 + 1  # a product and an add per expert, then the cat
    assert overlap_piece("expert_bias", False) == "mlp_f" and overlap_piece("expert_bias_bwd", True) == "mlp_b"
    assert "expert_bias" in {o.name for o in build_workload(job).moe_layer.fwd.ops}


def test_not_a_pass_of_its_own():
    # the full-iteration graphs' fused grouped MLP takes the bias in its GEMM; other frameworks are not Megatron's
    # TEGroupedMLP; models without expert biases have none
    assert expert_bias_ops(gpt_oss(cuda_graphs="full_iteration"), 2.0) == ([], [])
    assert expert_bias_ops(job_with(gpt_oss(), framework="torchtitan"), 2.0) == ([], [])
    mixtral = load_job(
        {
            "model": "mixtral-8x7b",
            "cluster": {**H100, "num_gpus": 8},
            "plan": {"ep": 8},
            "training": {"seq_len": 4096, "global_batch": 64},
        }
    )
    assert not mixtral.model.expert_bias and expert_bias_ops(mixtral, 2.0) == ([], [])


def test_refused_on_a_dense_model():
    with pytest.raises(Exception, match="expert_bias apply to MoE models"):
        load_job(
            {
                "model": {
                    "name": "d",
                    "layers": 2,
                    "hidden": 256,
                    "heads": 4,
                    "ffn_hidden": 1024,
                    "vocab": 1000,
                    "expert_bias": True,
                },
                "cluster": {**H100, "num_gpus": 8},
                "training": {"seq_len": 1024, "global_batch": 8},
            }
        )
