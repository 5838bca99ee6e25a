"""Workload arithmetic against hand-worked cases from the papers it cites."""

import pytest
from conftest import job_dict

from commtax.spec import load_job
from commtax.workload import (
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
