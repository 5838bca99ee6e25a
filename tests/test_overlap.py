"""Overlapped communication is not free: the SMs and HBM bandwidth a hidden collective takes from the compute it
runs under (commtax.costs.compute.overlap_slowdown_s; estimate's overlap_contention and dp_contention)."""

import pytest
from conftest import job_dict

from commtax.costs.compute import ComputeModel, compute_model, overlap_slowdown_s
from commtax.costs.pricing import PhaseCost
from commtax.schedule.analytical import _exposed, dp_contention, estimate, memory_share
from commtax.spec import load_job
from commtax.spec.assumptions import default_assumptions, using_assumptions

# 100 SMs, 3,000 GB/s achieved HBM; NCCL holds 24 SMs, userbuffers 8; 3 HBM bytes per wire byte
CM = ComputeModel(
    peak_flops=1000e12,
    attention_peak_flops=1000e12,
    matmul_eff=0.8,
    mem_bw_bytes_per_s=3000e9,
    sms=100,
    nccl_sms=24,
    userbuffers_sms=8,
    comm_hbm_bytes_per_wire_byte=3.0,
)


def test_sm_share_hand_worked():
    # 1 s of NCCL under pure GEMM compute: the GEMMs run on 76 of 100 SMs for that second -> +0.24 s
    # (one CTA per channel holds one SM: NCCL src/enqueue.cc; Agrawal et al. 2025 measure 18.9% mean slowdown)
    assert overlap_slowdown_s(CM, 1.0, 0.0, 0.0, 24) == pytest.approx(0.24)


def test_hbm_share_hand_worked():
    # 1 s hidden, 100 GB sent -> 300 GB through HBM = 0.1 s of HBM at 3,000 GB/s; 30% of the compute is memory-bound:
    # 0.7 · 1 · 24/100 (SMs) + 0.3 · 0.1 (HBM) = 0.168 + 0.03
    assert overlap_slowdown_s(CM, 1.0, 100e9, 0.3, 24) == pytest.approx(0.168 + 0.03)
    # HBM time never counts for more than the hidden window itself
    assert overlap_slowdown_s(CM, 0.01, 100e9, 1.0, 0) == pytest.approx(0.01)


def test_nothing_hidden_costs_nothing():
    assert overlap_slowdown_s(CM, 0.0, 1e9, 0.5, 24) == 0.0
    assert dp_contention(CM, 1.0, 1.0, 1e9, PhaseCost(1.0, 0.8, 0.0)) == 0.0  # all exposed: nothing overlapped


def test_tp_overlap_contention_in_exposed_time():
    # NeMo-style comm-GEMM overlap, tp 8: 0.8 s of TP under 2 s of GEMMs -> first chunk 0.1 s exposed, 0.7 s hidden,
    # which costs the GEMMs 0.7 · 8/100 SMs (userbuffers_sms)
    job = load_job(job_dict(overlap={"tp": True}))
    pc = PhaseCost(compute=2.5, gemm=2.0, attention=0.5, comm={"tp": 0.8}, comm_bytes={"tp": 10e9})
    tp_plain, _ = _exposed(job, pc)
    tp_charged, _ = _exposed(job, pc, CM)
    assert tp_plain == pytest.approx(0.1)
    assert tp_charged == pytest.approx(0.1 + 0.7 * 8 / 100)


def test_dp_contention_uses_the_memory_bound_share():
    pc = PhaseCost(compute=10.0, gemm=7.0, attention=1.0)
    assert memory_share(pc) == pytest.approx(0.2)
    # 2 s of DP link, 0.5 s exposed -> 1.5 s hidden, 30 GB sent -> 22.5 GB hidden -> 67.5 GB of HBM = 0.0225 s
    expected = 0.8 * 1.5 * 0.24 + 0.2 * 67.5e9 / 3000e9
    assert dp_contention(CM, 2.0, 0.5, 30e9, pc) == pytest.approx(expected)


def test_catalog_channel_counts_by_node_kind():
    nv = load_job(job_dict())
    assert compute_model(nv.cluster, "bf16").nccl_sms == 24  # NVSwitch node: 24 NCCL channels
    pcie = dict(job_dict(tp=1, pp=1, dp=8, zero=3))
    pcie["cluster"] = {
        "gpu": "rtx-4090-24gb",
        "num_gpus": 8,
        "gpus_per_node": 8,
        "intra_node": "pcie4-x16",
        "inter_node": "roce-200g",
        "nics_per_node": 1,
    }
    pcie["model"] = "llama2-7b"
    assert compute_model(load_job(pcie).cluster, "bf16").nccl_sms == 4  # PCIe node: 4


def test_overlapped_dp_is_charged_in_the_step():
    # ZeRO-3 on 256 H100: gathers and reduce-scatters hidden under compute still cost it SMs and HBM; without
    # those (0 CTAs, 0 HBM bytes) the step is faster by exactly the charge, which is at most 24/132 of the hidden time
    job = load_job(job_dict(tp=8, pp=1, dp=32, zero=3, micro_batch=4))
    b = estimate(job)
    free = default_assumptions().with_values({"nccl_ctas_nvlink": 0, "comm_hbm_bytes_per_wire_byte": 0})
    with using_assumptions(free):
        b0 = estimate(job)
    charge = b.breakdown_s["dp_exposed"] - b0.breakdown_s["dp_exposed"]
    hidden = b0.comm_time_s["dp"] - b0.breakdown_s["dp_exposed"]
    assert hidden > 0
    assert 0 < charge <= 24 / 132 * hidden + 1e-12
    assert b.step_time_s - b0.step_time_s == pytest.approx(charge, rel=1e-6)


def test_simulate_charges_what_estimate_charges():
    # the simulator pays the DP contention as one task per stage at the end of the passes (kind dp), so its timeline
    # still ends at the step time and it agrees with the estimate's charge
    from commtax.schedule.sim import simulate

    job = load_job(job_dict(tp=8, pp=1, dp=32, zero=3, micro_batch=4))
    r = simulate(job)
    free = default_assumptions().with_values({"nccl_ctas_nvlink": 0, "comm_hbm_bytes_per_wire_byte": 0})
    with using_assumptions(free):
        b0 = estimate(job)
    charge = r.estimate.breakdown_s["dp_exposed"] - b0.breakdown_s["dp_exposed"]
    tasks = [t for t in r.sim.tasks if t.name == "dp contention"]
    assert len(tasks) == 1 and tasks[0].duration_s == pytest.approx(charge, rel=1e-9)
    assert max(t.end_s for t in r.sim.tasks) == pytest.approx(r.breakdown.step_time_s, rel=1e-9)
    assert r.breakdown.step_time_s == pytest.approx(r.estimate.step_time_s, rel=0.02)
    assert r.breakdown.comm_time_s["dp"] == pytest.approx(b0.comm_time_s["dp"], rel=0.02)  # no link time added
