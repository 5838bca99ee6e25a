"""Per-GPU memory against Korthikanti et al. 2022 (activations) and ZeRO (model states)."""

import numpy as np
import pytest
from conftest import LLAMA_256_A100, job_dict

from commtax.spec import load_job
from commtax.workload.memory import (
    end_activation_bytes,
    in_flight_micro_batches,
    layer_activation_bytes,
    memory,
    stage_activation_bytes,
    stage_activations,
)
from commtax.workload.step import params_per_gpu


def gpt(**plan):
    d = job_dict(**plan)
    d["model"] = {"layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200}  # MHA, f = 4h
    d["training"] = {"seq_len": 2048, "global_batch": 256, "precision": "bf16", "dropout": True}
    d["plan"]["flash_attention"] = False
    return load_job(d)


def test_activations_per_layer_korthikanti_eq1_and_eq2():
    s, b, h, a, t = 2048, 1, 2048, 16, 8
    no_tp = gpt(tp=1, pp=1, dp=None, sequence_parallel=False, recompute="none")
    assert layer_activation_bytes(no_tp) == pytest.approx(s * b * h * (34 + 5 * a * s / h))  # eq. 1
    tp = gpt(tp=t, pp=4, dp=None, sequence_parallel=False, recompute="none")
    assert layer_activation_bytes(tp) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))  # eq. 2
    tp_sp = gpt(tp=t, pp=4, dp=None, sequence_parallel=True, recompute="selective")
    assert layer_activation_bytes(tp_sp) == pytest.approx(s * b * h * 34 / t)  # Table 2, SP + selective
    full = gpt(tp=t, pp=4, dp=None, sequence_parallel=True, recompute="full")
    assert layer_activation_bytes(full) == pytest.approx(2 * s * b * h / t)


def test_fp8_keeps_gemm_inputs_in_one_byte():
    d = job_dict(recompute="none")
    bf16 = layer_activation_bytes(load_job(d))
    d["training"]["precision"] = "fp8"
    assert layer_activation_bytes(load_job(d)) < bf16


def test_in_flight_micro_batches_by_schedule():
    assert in_flight_micro_batches(load_job(job_dict(pp=4, dp=8))) == 4  # 1F1B: p
    inter = load_job(job_dict(pp=4, dp=8, vp=2))
    assert in_flight_micro_batches(inter) == pytest.approx(4 * (1 + 3 / 8))  # Korthikanti §4.2.3
    assert in_flight_micro_batches(load_job(job_dict(pp=4, dp=8, schedule="gpipe"))) == 128  # all m


def test_zero_model_states_follow_the_zero_paper():
    # ZeRO §3.1 with Ψ params per GPU and N_d = 8: stage 0: 16Ψ; 1: 4Ψ + 12Ψ/N; 2: 2Ψ + 14Ψ/N; 3: 16Ψ/N
    def states(zero):
        job = load_job(job_dict(zero=zero))
        m = memory(job)
        p = params_per_gpu(job)
        psi = p["layers"] + max(p["embed"], p["head"])
        return (m.weights + m.grads + m.optimizer) / psi

    n = 8
    assert states(0) == pytest.approx(16)
    assert states(1) == pytest.approx(4 + 12 / n)
    assert states(2) == pytest.approx(2 + 14 / n)
    assert states(3) == pytest.approx(16 / n)


def test_memory_decreases_with_zero_stage():
    totals = [memory(load_job(job_dict(zero=z))).total for z in (0, 1, 2, 3)]
    assert totals == sorted(totals, reverse=True)


def test_per_op_selective_keeps_far_less_than_megatron_selective():
    # torchtitan per-op SAC, Llama-3-8B-shaped layer, tp = 1, b = 1, s = 8192, bf16:
    # 2 B × s × (h + h + gd + f + h + h) = 2 × 8192 × (4·4096 + 1024 + 14336) bytes (parallelize_llama.py policy)
    d = job_dict(tp=1, pp=1, dp=None, sequence_parallel=False, recompute="selective", framework="torchtitan", zero=3)
    d["model"] = "llama3-8b"
    d["training"] = {"seq_len": 8192, "global_batch": 256, "precision": "bf16"}
    tt = load_job(d)
    assert layer_activation_bytes(tt) == pytest.approx(2 * 8192 * (4 * 4096 + 1024 + 14336))
    d["plan"].update(framework="megatron-core", zero=1)  # Megatron-Core runs ZeRO-1 at most
    assert layer_activation_bytes(load_job(d)) > 2 * layer_activation_bytes(tt)


def test_reserve_is_context_nccl_groups_and_fragmentation():
    # tp 8, pp 4, dp 8 -> 3 groups: 0.6 + 3 × 0.25 GiB fixed, + 10% of the activations (catalog/assumptions.yaml)
    from commtax.units import GiB

    job = load_job(job_dict())
    m = memory(job)
    assert m.reserve == pytest.approx((0.6 + 3 * 0.25) * GiB + 0.10 * m.activations)
    single = load_job(
        {
            **job_dict(tp=1, pp=1, dp=None, sequence_parallel=False),
            "cluster": {
                "gpu": "rtx-4090-24gb",
                "num_gpus": 1,
                "gpus_per_node": 1,
                "intra_node": "pcie4-x16",
                "inter_node": "eth-25g",
                "nics_per_node": 1,
            },
        }
    )
    assert memory(single).reserve == pytest.approx(0.6 * GiB + 0.10 * memory(single).activations)


def test_the_interleaved_no_recompute_llama_plan_of_the_search_fits_as_derived_by_hand():
    """Issue 21's winner's-curse plan, Llama-2 70B tp2·pp8·vp10, mb1, s 4096, no recompute, on A100-80GB: per layer
    (GQA g·d = h/8, SwiGLU f = 3.5h, flash, no dropout, SP) norm inputs 4 + QKV and MLP inputs 4 + Q 2 + K, V 0.5 +
    attention output 2 + gate and up outputs 14 + down input 7 = 33.5·sbh/t bytes; rank 0 holds 2(p−1) + (v−1)p + 1
    = 87 one-layer chunks = L(1 + (p−1)/(pv)) layers (Megatron-Core schedules.py; Korthikanti 2022 §4.2.3; Megatron's
    theoretical_memory_usage.py applies the same penalty), plus the embedding output."""
    from commtax.units import GiB

    job = load_job(LLAMA_256_A100)
    s, b, h, t = 4096, 1, 8192, 2
    assert layer_activation_bytes(job) == pytest.approx(33.5 * s * b * h / t)
    assert in_flight_micro_batches(job) * 80 / 8 == pytest.approx(80 * (1 + 7 / 80)) == pytest.approx(87)
    mem = memory(job)
    assert mem.activations == pytest.approx(87 * 33.5 * s * b * h / t + 2 * s * b * h / t)
    assert mem.activations / GiB == pytest.approx(45.6, abs=0.05) and mem.total < job.cluster.gpu.mem_bytes


def test_stage_activations_first_middle_last_by_hand():
    # 1F1B on p = 4 (Narayanan 2021 §2.2.1: rank s holds p − s micro-batches), 6 layers of L bytes per rank
    # (Korthikanti §4: a layer's bytes × in-flight micro-batches), the embedding output E on the first rank and the
    # fp32 logits G of its in-flight micro-batches on the last; full recompute adds one materialised layer F
    L, F, E, G = 100.0, 7.0, 30.0, 50.0
    kw = dict(per_layer=L, full_layer=F, embedding=E, logits=G, moe_extra=0.0, mtp_layer=L, mtp_layers=0)
    first = stage_activations(layers=6, in_flight=4.0, first=True, last=False, held=4.0, **kw)
    middle = stage_activations(layers=6, in_flight=2.0, first=False, last=False, held=2.0, **kw)
    last = stage_activations(layers=6, in_flight=1.0, first=False, last=True, held=1.0, **kw)
    assert (first, middle, last) == (6 * L * 4 + F + E, 6 * L * 2 + F, 6 * L * 1 + F + G)
    assert stage_activations(layers=0, in_flight=4.0, first=True, last=False, held=4.0, **kw) == E  # embedding only
    # one MTP module (DeepSeek-V3 §2.2) on the last rank: its layer, the embedding and normed inputs, another logits
    mtp = stage_activations(layers=6, in_flight=1.0, first=False, last=True, held=1.0, **{**kw, "mtp_layers": 1})
    assert mtp == last + (L + 3 * E) * 1 + G


def test_stage_activations_on_arrays_are_the_floats():
    # a search evaluates the formula on its grid: each element as the scalar call computes it, to the bit
    layers = np.array([6.0, 0.0, 5.0, np.nan])
    first, last = np.array([True, True, False, False]), np.array([False, False, True, False])
    in_flight, held = np.array([4.0, 3.5, 1.0, 2.0]), np.array([4.0, 3.5, 1.0, 2.0])
    kw = dict(per_layer=123.456, full_layer=7.25, embedding=31.5, logits=49.75, moe_extra=0.0, mtp_layer=1.5)
    got = stage_activations(layers, in_flight, first=first, last=last, held=held, mtp_layers=1, **kw)
    for x in range(3):
        one = stage_activations(
            int(layers[x]),
            float(in_flight[x]),
            first=bool(first[x]),
            last=bool(last[x]),
            held=float(held[x]),
            mtp_layers=1,
            **kw,
        )
        assert got[x] == one
    assert np.isnan(got[3])  # past a split's stage kinds: NaN stays NaN


def test_stage_activation_bytes_of_a_job_sum_its_ranks():
    job = load_job(job_dict(pp=4, dp=8, recompute="selective"))
    per_layer = layer_activation_bytes(job)
    embedding, logits = end_activation_bytes(job)
    split = job.stage_layers
    want = [split[s] * per_layer * in_flight_micro_batches(job, s) for s in range(4)]
    want[0] += embedding
    want[3] += logits * in_flight_micro_batches(job, 3)
    assert stage_activation_bytes(job) == want
