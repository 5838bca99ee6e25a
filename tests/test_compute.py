"""Compute op times: roofline with component-level efficiencies (GEMM shape, attention tables, HBM, launches)."""

import pytest
from conftest import job_dict

from commtax.costs.compute import (
    ComputeModel,
    attention_efficiency,
    compute_model,
    gemm_efficiency,
    op_time,
    quantisation_efficiency,
    short_k_efficiency,
)
from commtax.spec import load_job
from commtax.spec.assumptions import default_assumptions
from commtax.workload.step import Compute

# gap 3 µs per kernel on the GPU, 5 µs per kernel on the host (catalog/assumptions.yaml)
CM = ComputeModel(
    peak_flops=1000e12,
    attention_peak_flops=1000e12,
    matmul_eff=0.8,
    mem_bw_bytes_per_s=3000e9,
    sms=100,
    kernel_gap_s=3e-6,
    cpu_op_s=5e-6,
)


def test_wave_quantisation_hand_worked():
    # 128×128 tiles: 1280×1280 -> 100 tiles = exactly one wave on 100 SMs
    assert quantisation_efficiency(1280, 1280, 100) == 1.0
    # 101 tiles need 2 waves: 101 / 200 of the SM-slots do work
    assert quantisation_efficiency(128 * 101, 128, 100) == pytest.approx(101 / 200)
    # a 64-wide edge fills half a tile
    assert quantisation_efficiency(64, 128, 1) == pytest.approx(0.5)


def test_short_k_hand_worked():
    # k = k_half = 96: the main loop is half of the tile's time; at k_ref = 4096 it is 4096/4192 -> normalised 1
    assert short_k_efficiency(96, 96, 4096) == pytest.approx(0.5 / (4096 / 4192))
    assert short_k_efficiency(8192, 96, 4096) == 1.0
    # fp8 doubles k_half: k = 192 reaches the share bf16 reaches at k = 96
    assert short_k_efficiency(192, 192, 4096) == pytest.approx(0.5 / (4096 / 4288))


def test_big_gemm_runs_at_catalog_efficiency_and_small_k_loses():
    assert gemm_efficiency(CM, 12800, 12800, 8192) == pytest.approx(0.8)
    assert gemm_efficiency(CM, 12800, 12800, 96) == pytest.approx(0.8 * 0.5 * 4192 / 4096)


def test_memory_bound_op_hand_worked():
    # 3 GB at 3000 GB/s = 1 ms, plus one 3 µs kernel gap
    assert op_time(CM, Compute("norm", 0.0, 3e9, "memory")) == pytest.approx(1e-3 + 3e-6)


def test_launch_bound_op_takes_the_host_time():
    # an eager RMSNorm of 6 kernels over 3 kB: the GPU needs ~1 ns + 6·3 µs, the host 6·5 µs = 30 µs
    op = Compute("norm", 0.0, 3e3, "memory", kernels=6)
    assert op_time(CM, op) == pytest.approx(30e-6)


def test_gemm_time_is_max_of_flops_and_bytes():
    flops = 2 * 12800 * 12800 * 8192
    op = Compute("gemm", flops, 1.0, "gemm", 12800, 12800, 8192)
    assert op_time(CM, op) == pytest.approx(flops / (1000e12 * 0.8) + 3e-6)
    skinny = Compute("gemv", 2 * 1 * 8192 * 8192, 2 * 8192 * 8192, "gemm", 1, 8192, 8192)
    assert op_time(CM, skinny) == pytest.approx(2 * 8192 * 8192 / 3000e9 + 3e-6)


def test_attention_tables_hand_worked():
    # cuDNN causal forward at 4k on H100: 518 TFLOP/s of 989.4 (FlashAttention-3 paper, Fig. 5)
    assert attention_efficiency("cudnn", "hopper", 4096, 128, False) == pytest.approx(518 / 989.4)
    # 3k lies between 2k (484) and 4k (518): log-linear, log2(3072) is 0.585 of the way
    assert attention_efficiency("cudnn", "hopper", 3072, 128, False) == pytest.approx(
        (484 + 0.5849625 * (518 - 484)) / 989.4, rel=1e-6
    )
    # FA3 is Hopper-only: on Ampere it falls back to the FA2 A100 table (157.8 TFLOP/s at 4k of 312)
    assert attention_efficiency("fa3", "ampere", 4096, 128, False) == pytest.approx(157.8 / 312)
    # head dim 64 with FA2: x 0.876; causal backward = non-causal 322 x (335/370), the forward's causal share
    assert attention_efficiency("fa2", "hopper", 16384, 64, True) == pytest.approx(291 / 989.4 * 0.876)
    assert 291 == pytest.approx(322 * 335 / 370, abs=1)
    # a Blackwell GPU uses the Hopper fractions
    assert attention_efficiency("fa2", "blackwell", 8192, 128, False) == pytest.approx(333 / 989.4)
    # head dim 80 runs the 96 kernel: factor at 96 = 0.876 + 0.5·(1 − 0.876), and only 80/96 of it is useful
    assert attention_efficiency("fa2", "hopper", 16384, 80, True) == pytest.approx(
        291 / 989.4 * (0.876 + 0.5 * 0.124) * 80 / 96
    )


def test_fused_attention_beats_eager_at_long_sequence():
    job = load_job(job_dict())
    cm = compute_model(job.cluster, "bf16")
    s, d, heads = 8192, 128, 32
    causal = 4.0 * heads * s * s * d / 2
    fused = op_time(cm, Compute("a", causal, 0.0, "attention", heads * s, s, d, kernel="fa3"))
    eager = op_time(cm, Compute("a", 2 * causal, 4.0 * heads * s * s, "attention", heads * s, s, d, kernel="eager"))
    assert eager > 2 * fused


def test_power_capped_gpu_is_a_custom_peak():
    d = job_dict()
    full = compute_model(load_job(d).cluster, "bf16")
    gpu = load_job(d).cluster.gpu.model_dump()
    gpu["clock_fraction"] = 0.848 * 0.8  # e.g. a 500 W cap on a 700 W card (0.848: hopper_clock_fraction)
    d["cluster"]["gpu"] = gpu
    capped = compute_model(load_job(d).cluster, "bf16")
    assert capped.peak_flops == pytest.approx(0.8 * full.peak_flops)
    assert capped.mem_bw_bytes_per_s == full.mem_bw_bytes_per_s  # HBM is not clocked with the SMs


def test_calibration_profile_overrides_an_assumption():
    d = job_dict()
    d["cluster"]["profile"] = {
        "source": "test",
        "levels": {"intra": {"bw_GBps": 100, "latency_us": 5}, "inter": {"bw_GBps": 10, "latency_us": 10}},
        "assumptions": {"memory_efficiency": 0.5},
    }
    cm = compute_model(load_job(d).cluster, "bf16")
    gpu = load_job(d).cluster.gpu
    assert cm.mem_bw_bytes_per_s == pytest.approx(0.5 * gpu.mem_bw_bytes_per_s)
    assert default_assumptions().v("memory_efficiency") == 0.8  # the catalog itself is untouched


# an fp8 run's model: fp8 GEMMs at 2000 TFLOP/s × 0.6 with k_half 192; bf16 ones at 1000 × 0.8 with k_half 96
CM_FP8 = ComputeModel(
    peak_flops=2000e12,
    attention_peak_flops=1000e12,
    matmul_eff=0.6,
    mem_bw_bytes_per_s=3000e9,
    sms=100,
    k_half=192.0,
    kernel_gap_s=3e-6,
    cpu_op_s=5e-6,
    bf16_matmul_eff=0.8,
    bf16_peak_flops=1000e12,
    bf16_k_half=96.0,
)


def test_fp8_run_prices_its_bf16_gemms_at_the_bf16_rate():
    # Transformer Engine casts only the linear layers inside fp8_autocast; the LM head and the router keep bf16
    # inputs (Megatron-Core's output_layer is a plain ColumnParallelLinear, not a TE module): the bf16 rate.
    # 1280×1280 tiles = one wave on 100 SMs; k = 8192 ≥ k_ref: no short-k loss
    flop = 2.0 * 1280 * 1280 * 8192
    fp8 = Compute("qkv", flop, 0.0, "gemm", 1280, 1280, 8192, fp8=True)
    bf16 = Compute("logits", flop, 0.0, "gemm", 1280, 1280, 8192)
    assert op_time(CM_FP8, fp8) == pytest.approx(flop / (2000e12 * 0.6) + 3e-6)
    assert op_time(CM_FP8, bf16) == pytest.approx(flop / (1000e12 * 0.8) + 3e-6)
    # k = 96: the bf16 main loop loses k/(k + 96) (normalised at 4096), not the fp8 loop's k/(k + 192)
    short = Compute("router", 2.0 * 12800 * 12800 * 96, 0.0, "gemm", 12800, 12800, 96)  # 100 full waves
    assert op_time(CM_FP8, short) == pytest.approx(short.flop / (1000e12 * 0.8 * 0.5 * 4192 / 4096) + 3e-6)


def test_fp8_job_carries_the_bf16_rate_and_a_bf16_job_does_not():
    # H100 SXM: bf16 989.4 TFLOP/s × the sustained clock 0.848 (hopper_clock_fraction), MAMF 0.801 of it
    a = default_assumptions()
    d = job_dict()
    d["training"]["precision"] = "fp8"
    fp8 = compute_model(load_job(d).cluster, "fp8", a)
    assert fp8.bf16_peak_flops == pytest.approx(989.4e12 * 0.848)
    assert fp8.bf16_matmul_eff == pytest.approx(0.801) and fp8.bf16_k_half == pytest.approx(a.v("gemm_k_half"))
    # a bf16 run prices every GEMM at its own rate, as before
    assert compute_model(load_job(job_dict()).cluster, "bf16", a).bf16_peak_flops == 0.0


def test_fp8_run_takes_a_calibrated_bf16_rate_for_its_bf16_gemms():
    # a profile measured both precisions (commtax calibrate): the fp8 GEMMs at its fp8 rate, the LM head at its bf16
    d = job_dict()
    d["training"]["precision"] = "fp8"
    d["cluster"]["profile"] = {
        "source": "test",
        "levels": {"intra": {"bw_GBps": 100, "latency_us": 5}, "inter": {"bw_GBps": 10, "latency_us": 10}},
        "gemm_efficiency": {"fp8": 0.5, "bf16": 0.7},
    }
    cm = compute_model(load_job(d).cluster, "fp8")
    assert (cm.matmul_eff, cm.bf16_matmul_eff) == (0.5, 0.7)
    # one without a bf16 entry keeps the catalog's (H100 SXM MAMF 0.801)
    d["cluster"]["profile"]["gemm_efficiency"] = {"fp8": 0.5}
    assert compute_model(load_job(d).cluster, "fp8").bf16_matmul_eff == pytest.approx(0.801)
