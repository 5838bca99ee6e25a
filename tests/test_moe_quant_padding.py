"""Transformer Engine's Fp8Padding / Fp8Unpadding around Megatron-Core's TEGroupedMLP under fp8
(workload.moe.expert_quant_padding_ops): hand-worked bytes, where the counts are already aligned (HybridEP's
in-kernel pad_multiple, token drop padded to capacity, the full-iteration fused grouped MLP, bf16), and the 25.09
rows that ran token drop."""

import pytest

from commtax.decide.validate import read_rows, row_plan
from commtax.spec import job_with, load_job
from commtax.spec.catalog import load_catalog
from commtax.workload.moe import expert_quant_padding_ops, overlap_piece
from commtax.workload.step import build_workload

B200 = {"gpu": "b200-sxm-192gb", "intra_node": "nvlink5", "inter_node": "ib-ndr"}


def qwen3_235b(precision="fp8", **plan):
    return load_job(
        {
            "model": "qwen3-235b-a22b",  # hidden 4096, 128 experts, top-8
            "cluster": {**B200, "num_gpus": 64},
            "plan": {"framework": "megatron-core", "tp": 1, "pp": 8, "ep": 8, "moe_dispatcher": "alltoall", **plan},
            "training": {"seq_len": 4096, "global_batch": 256, "precision": precision},
        }
    )


def test_bytes_hand_worked():
    # 4,096 tokens × top-8 = 32,768 rows on the GPU (16 local experts of 2,048), 4,096 wide, bf16 before the cast:
    # Fp8Padding reads and writes the input (2 + 2 B per element), Fp8Unpadding the down projection's output
    # (2 + 2 B), and the fp32 probs are padded alike (4 + 4 B per row); backward the same passes inverted
    (fwd,), (bwd,) = expert_quant_padding_ops(qwen3_235b(), 2.0, True)
    assert fwd.bytes == bwd.bytes == 2 * 2 * 2.0 * 32_768 * 4096 + 8 * 32_768 == 1_074_003_968
    assert fwd.kernels == bwd.kernels == 3
    assert overlap_piece("expert_quant_padding", False) == "mlp_f"
    assert overlap_piece("expert_quant_padding_bwd", True) == "mlp_b"
    assert "expert_quant_padding" in {o.name for o in build_workload(qwen3_235b()).moe_layer.fwd.ops}


@pytest.mark.parametrize(
    "change",
    [
        {"moe_dispatcher": "hybridep"},  # HybridEP pads each expert's rows in its own kernel (pad_multiple)
        {"cuda_graphs": "full_iteration"},  # the fused grouped MLP
        {"framework": "torchtitan"},  # not Megatron-Core's TEGroupedMLP
    ],
)
def test_no_copy_where_the_counts_are_aligned_or_the_path_differs(change):
    assert expert_quant_padding_ops(job_with(qwen3_235b(), **change), 2.0, True) == ([], [])


def test_no_copy_in_bf16_or_with_token_drop():
    assert expert_quant_padding_ops(qwen3_235b("bf16"), 2.0, False) == ([], [])
    job = qwen3_235b()
    model = {**job.model.model_dump(mode="json"), "capacity_factor": 1.0}  # token drop padded to capacity
    dropped = load_job({**job.model_dump(mode="json"), "model": model})
    assert dropped.model.capacity_factor == 1.0
    assert expert_quant_padding_ops(dropped, 2.0, True) == ([], [])


def test_the_25_09_token_drop_rows(validation_dir):
    # run_script.py @v0.1.0rc4: apply_moe_token_drop for Qwen3 and for DeepSeek-V3 on B200/GB200; the 25.09 table
    # marks them "(tokendrop)", DeepSeek-V3 on H100 "(dropless)"
    catalog = load_catalog()
    rows = {r["id"]: r for r in read_rows(validation_dir / "public_moe_runs.csv")}

    def cf(i):
        return row_plan(rows[i], catalog).choice.job.model.capacity_factor

    assert cf("mb2509_qwen330ba3b_h100_fp8") == cf("mb2509_qwen3235ba22b_h100_fp8") == 1.0
    assert cf("mb2509_deepseekv3_gb200_fp8") == 1.0
    assert cf("mb2509_deepseekv3_h100_fp8") is None and cf("mb2511_qwen330ba3b_h100_fp8") is None
