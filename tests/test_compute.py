"""Compute op times: roofline with shape-dependent efficiency (NVIDIA Matrix Multiplication Background guide)."""

import pytest

from commtax.compute import (
    KERNEL_OVERHEAD_S,
    MEMORY_EFFICIENCY,
    ComputeModel,
    gemm_efficiency,
    op_time,
    quantisation_efficiency,
)
from commtax.workload import Compute

CM = ComputeModel(peak_flops=1000e12, attention_peak_flops=1000e12, matmul_eff=0.8, attention_eff=0.5,
                  mem_bw_bytes_per_s=3000e9, sms=100)


def test_wave_quantisation_hand_worked():
    # 128×128 tiles: 1280×1280 -> 100 tiles = exactly one wave on 100 SMs
    assert quantisation_efficiency(1280, 1280, 100) == 1.0
    # 101 tiles need 2 waves: 101 / 200 of the SM-slots do work
    assert quantisation_efficiency(128 * 101, 128, 100) == pytest.approx(101 / 200)
    # a 64-wide edge fills half a tile
    assert quantisation_efficiency(64, 128, 1) == pytest.approx(0.5)


def test_big_gemm_runs_at_catalog_efficiency():
    eff = gemm_efficiency(CM, 12800, 12800, 8192)
    assert eff == pytest.approx(0.8)
    # short k: k/(k+96) normalised at k = 4096 -> 128/224 / (4096/4192) of the catalog efficiency
    assert gemm_efficiency(CM, 12800, 12800, 128) == pytest.approx(0.8 * (128 / 224) / (4096 / 4192))


def test_memory_bound_op_runs_at_hbm_bandwidth():
    op = Compute("norm", 0.0, 3e9, "memory")
    assert op_time(CM, op) == pytest.approx(3e9 / 3000e9 + KERNEL_OVERHEAD_S)
    assert MEMORY_EFFICIENCY <= 1


def test_gemm_time_is_max_of_flops_and_bytes():
    flops = 2 * 12800 * 12800 * 8192
    op = Compute("gemm", flops, 1.0, "gemm", 12800, 12800, 8192)
    expected = flops / (1000e12 * gemm_efficiency(CM, 12800, 12800, 8192)) + KERNEL_OVERHEAD_S
    assert op_time(CM, op) == pytest.approx(expected)
    skinny = Compute("gemv", 2 * 1 * 8192 * 8192, 2 * 8192 * 8192, "gemm", 1, 8192, 8192)
    assert op_time(CM, skinny) == pytest.approx(2 * 8192 * 8192 / 3000e9 + KERNEL_OVERHEAD_S)
