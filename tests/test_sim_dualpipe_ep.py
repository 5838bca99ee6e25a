"""The EP all-to-all's wire time under DualPipe, counted per pipeline rank (issue 18): rank r runs model stage r for
the m/2 micro-batches fed at rank 0 and model stage p − 1 − r for the m/2 fed at rank p − 1 (DeepSeek-V3 report
§3.2.1, Fig. 5; ``pipeline.dualpipe``), so its all-to-alls are m/2 micro-batches' worth of each of its two stages'
MoE layers, not m of both."""

from __future__ import annotations

import dataclasses

import pytest
from test_sim_step import EMPTY, FakeCosts

from commtax.costs.pricing import PhaseCost
from commtax.schedule.sim import SimOptions, simulate
from commtax.schedule.sim.explain import explain
from commtax.spec import job_with, load_job
from commtax.workload.step import build_workload

# per MoE layer and micro-batch: dispatch + combine forward 0.25 s and 1 MB, backward 0.5 s and 2 MB (stated)
EP_F, EP_B, MB_F, MB_B = 0.25, 0.5, 1e6, 2e6


def tiny_moe_job(schedule="dualpipe", pp=4):
    # 8 layers, the first dense (first_k_dense 1): PP4 puts 2 layers on each stage, so stage 0 holds one MoE layer
    # and stages 1-3 two each; 32 GPUs, dp 8
    return load_job(
        {
            "model": {
                "layers": 8,
                "hidden": 256,
                "heads": 4,
                "vocab": 512,
                "ffn_hidden": 512,
                "num_experts": 8,
                "top_k": 2,
                "moe_ffn_hidden": 128,
                "first_k_dense": 1,
                "source": "test",
            },
            "cluster": {
                "gpu": "h100-sxm5-80gb",
                "num_gpus": pp * 8,
                "gpus_per_node": 8,
                "intra_node": "nvlink4",
                "inter_node": "ib-ndr",
            },
            "plan": {"pp": pp, "ep": 8, "schedule": schedule, "recompute": "none"},
            "training": {"seq_len": 128, "global_batch": 64},  # dp 8 (EP8 folded into it): m = 8
        }
    )


class MoEFakeCosts(FakeCosts):
    """``FakeCosts`` (forward 1 s, backward 2 s per layer, sends and DP free) with the MoE layer's all-to-all on the
    EP group at the stated times and bytes."""

    def phase(self, ph):
        moe = self.wl.moe_layer
        if ph is moe.fwd:
            return PhaseCost(self.fwd, self.fwd, 0.0, {"ep": EP_F}, {"ep": MB_F})
        if ph is moe.bwd:
            return PhaseCost(self.bwd, self.bwd, 0.0, {"ep": EP_B}, {"ep": MB_B})
        return super().phase(ph)

    def collective_time(self, group, op, nbytes):  # the DP traffic the MoE ranks compare (free here)
        return self.dp


def run_moe(job):
    wl = build_workload(job)
    params = {**wl.params_per_gpu, "embed": 0.0, "head": 0.0}
    wl = dataclasses.replace(wl, embed=EMPTY, head=EMPTY, params_per_gpu=params)
    costs = MoEFakeCosts(wl, send=0.0, dp=0.0)
    return simulate(job, workload=wl, costs=costs, compare=False, options=SimOptions(nic_contention=False))


def test_dualpipe_ep_wire_time_per_rank_by_hand_pp4_8_micro_batches():
    # MoE layers per model stage: (1, 2, 2, 2). Rank r: 4 micro-batches through stage r, 4 through stage 3 − r:
    #   rank 0 (stages 0, 3): 4·1 + 4·2 = 12 MoE layer passes, rank 1 (stages 1, 2) and rank 2: 16, rank 3: 12
    #   wire time = passes × (0.25 + 0.5) s: 9, 12, 12, 9 s; bytes = passes × 3 MB: 36, 48, 48, 36 MB
    # (counting all 8 micro-batches through both of a rank's stages gave twice that: 18, 24, 24, 18 s)
    r = run_moe(tiny_moe_job())
    assert r.builder.dual == "dualpipe"
    assert [d.ep_s for d in r.builder.devices] == pytest.approx([9.0, 12.0, 12.0, 9.0])
    assert [d.bytes["ep"] for d in r.builder.devices] == pytest.approx([36e6, 48e6, 48e6, 36e6])
    b = r.breakdown
    assert b.comm_time_s["ep"] == pytest.approx([9.0, 12.0, 12.0, 9.0][r.busiest_stage])
    assert b.comm_bytes_per_gpu["ep"] == pytest.approx(b.comm_time_s["ep"] * 4e6)  # 3 MB per 0.75 s


def test_1f1b_ep_wire_time_per_rank_by_hand_pp4_8_micro_batches():
    # the same job in 1F1B: stage s runs all 8 micro-batches through its own layers: 8, 16, 16, 16 MoE layer passes
    r = run_moe(tiny_moe_job(schedule="1f1b"))
    assert [d.ep_s for d in r.builder.devices] == pytest.approx([6.0, 12.0, 12.0, 12.0])
    assert [d.bytes["ep"] for d in r.builder.devices] == pytest.approx([24e6, 48e6, 48e6, 48e6])


def test_dualpipe_explain_names_the_rank_on_both_sides():
    # DeepSeek-V3 as its report runs it (PP16 DualPipe, EP64): the busiest rank on either side holds two middle stages
    # of 4 MoE layers each for 60 micro-batches apiece (73.0 ms of all-to-all wire time per micro-batch and stage:
    # 8.76 s; 64.1 ms and 7.69 s before moe15 read DeepEP's RDMA rate on the bytes its test counts). Before issue 18
    # the estimate reported its slowest stage, the last (2 MoE layers, 120 micro-batches: 3.85 s then), and before
    # that the simulator counted 120 micro-batches through both stages (15.38 s)
    r = simulate(load_job("examples/moe/deepseek-v3-h800.yaml"), compare=True)
    s, e = r.breakdown, r.estimate
    assert s.comm_time_s["ep"] == pytest.approx(e.comm_time_s["ep"], rel=1e-9)
    assert s.comm_bytes_per_gpu["ep"] == pytest.approx(e.comm_bytes_per_gpu["ep"], rel=1e-9)
    assert e.comm_time_s["ep"] == pytest.approx(120 / 2 * 2 * 0.0730, rel=0.01)
    line = [x for x in explain(r) if x.startswith("EP traffic")]
    assert len(line) == 1
    rk = r.busiest_stage
    assert f"rank {rk} runs model stage {rk}" in line[0] and f"stage {15 - rk}" in line[0]
    assert "busiest rank, 1 (model stages 1 and 14)" in line[0] and line[0].count("8.76 s") == 2
    assert f"busiest rank, {rk} (model stages {rk} and {15 - rk})" in s.notes[0]


def test_dualpipe_ep_wire_time_agrees_with_estimate_where_a_middle_stage_paces_both():
    # under full recompute a middle stage (4 MoE layers) is the estimate's slowest and a middle rank the simulator's
    # busiest: 120 micro-batches' worth of 4 MoE layers either way (11.03 s; before issue 18's fix 22.05 s simulated)
    job = job_with(load_job("examples/moe/deepseek-v3-h800.yaml"), recompute="full")
    r = simulate(job, compare=True)
    s, e = r.breakdown, r.estimate
    assert s.comm_time_s["ep"] == pytest.approx(e.comm_time_s["ep"], rel=1e-9)
    assert s.comm_bytes_per_gpu["ep"] == pytest.approx(e.comm_bytes_per_gpu["ep"], rel=1e-9)
