"""DualPipe in ``estimate``, priced per pipeline rank as the simulator runs it (issue 18).

Rank r of p holds model stages r and p − 1 − r (deepseek-ai/DualPipe examples/example_dualpipe.py) and runs m/2
micro-batches through each (``dualpipe.py`` ``step``), so its work per step is (m/2)(T_r + T_{p−1−r}); the bubble is
DeepSeek-V3 Table 2's (PP/2 − 1)(F&B + B − 3W) per kind of rank (``analytical.dualpipe_bubble``)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_dualpipe_ep import tiny_moe_job
from test_sim_step import FakeCosts, tiny_job, uniform

from commtax.costs.pricing import Costs, PhaseCost
from commtax.schedule.analytical import (
    StageTime,
    dp_splits,
    dp_step_parts,
    dualpipe_bubble,
    ep_link,
    estimate,
    pipeline_bubble,
    pipeline_ranks,
    stage_times,
)
from commtax.schedule.sim import SimOptions, simulate
from commtax.schedule.sim.explain import explain
from commtax.spec import job_with
from commtax.workload.step import build_workload, stage_param_split, with_dp_stage


def stage(fwd: float, bwd: float, recompute: float = 0.0) -> StageTime:
    """A stage's micro-batch with stated forward and backward seconds (backward includes its recompute)."""
    return StageTime(compute=fwd + bwd - recompute, recompute=recompute, tp_exposed=0.0, cp_exposed=0.0, fwd=fwd,
                     bwd=bwd, link=PhaseCost())  # fmt: skip


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
def test_equal_stages_give_the_papers_bubble(p):
    # DeepSeek-V3 Table 2 / DualPipe README: (PP/2 − 1)(F&B + B − 3W); F = 1, B = 2 (a full backward), W = 1 (half of
    # it, zero-bubble's split), F&B = F + B = 3: (PP/2 − 1)(3 + 2 − 3) = 2·(PP/2 − 1) s, whatever m ≥ 2·PP
    stages = [stage(1.0, 2.0)] * p
    for m in (2 * p, 4 * p + 2):
        assert dualpipe_bubble(stages, m) == pytest.approx(2.0 * (p / 2 - 1))
        assert pipeline_bubble("dualpipe", m, 1, stages) == dualpipe_bubble(stages, m)
    # recompute is in B, not in W: W = (2.5 − 0.5)/2 = 1, F&B + B − 3W = 3.5 + 2.5 − 3 = 3 per kind
    assert dualpipe_bubble([stage(1.0, 2.5, 0.5)] * 4, 8) == pytest.approx(3.0)


def test_ranks_hold_two_stages_and_the_bubble_is_the_fill_through_the_ranks_nearer_the_ends():
    # PP 4, per-micro-batch stage times T = 6, 3, 3, 6 (F 2, 1, 1, 2; B 4, 2, 2, 4): ranks 0 and 3 hold stages 0 and 3
    # ((6 + 6)/2 = 6 per micro-batch), ranks 1 and 2 stages 1 and 2 (3). Kind h = 0 waits for nobody, kind 1 for the
    # fill through kind 0, U_0 = F + 2B − 3W = 2 + 8 − 6 = 4: pipeline = max(8·6, 8·3 + 4) = 48, no bubble
    ends, mid = stage(2.0, 4.0), stage(1.0, 2.0)
    stages = [ends, mid, mid, ends]
    assert [r.total for r in pipeline_ranks("dualpipe", stages)] == [6.0, 3.0, 3.0, 6.0]
    assert pipeline_ranks("1f1b", stages) is stages
    assert dualpipe_bubble(stages, 8) == 0.0
    # heavy middle (T = 3, 6, 6, 3): kind 1 waits for U_0 = 1 + 4 − 3 = 2: max(8·3, 8·6 + 2) − 48 = 2
    assert dualpipe_bubble([mid, ends, ends, mid], 8) == pytest.approx(2.0)
    # uneven pair: stages 0 and 3 (T 6 and 3) average 4.5 on ranks 0 and 3
    assert pipeline_ranks("dualpipe", [ends, mid, mid, mid])[0].total == pytest.approx(4.5)


def run_both(layout, m=8):
    """estimate and simulate of a PP4 DualPipe job with ``layout`` layers per stage, F = 1 s and B = 2 s per layer
    (the simulator splits B into input and weight gradients, 1 s each), sends and DP free."""
    job = tiny_job(pp=4, schedule="dualpipe", global_batch=m, layers=sum(layout), pipeline_layout=list(layout))
    wl = uniform(job)
    costs = FakeCosts(wl, send=0.0, dp=0.0)
    est = estimate(job, workload=wl, costs=costs)
    sim = simulate(job, workload=wl, costs=FakeCosts(wl, send=0.0, dp=0.0), options=SimOptions(nic_contention=False))
    return est, sim


def test_heavy_ends_by_hand_pp4_8_micro_batches():
    # layers 2, 1, 1, 2: T_s = 3 s per layer = 6, 3, 3, 6. Rank 0 runs 4 micro-batches through stage 0 and 4 through
    # stage 3: 4·6 + 4·6 = 48 s of work, and it starts and ends the step (bubble 0, above). Before issue 18 the
    # estimate charged m × the slowest stage plus (Σ others)(PP/2 − 1)/(PP − 1)(F + B/2)/(F + B):
    # 8·6 + 12·(1/3)·(2/3) = 50.67 s (+5.6%)
    est, sim = run_both((2, 1, 1, 2))
    assert est.breakdown_s["compute"] == 48.0
    assert est.breakdown_s["pp_bubble"] == 0.0
    assert est.step_time_s == 48.0
    assert sim.breakdown.step_time_s == pytest.approx(48.0)
    assert sim.breakdown.breakdown_s["compute"] == pytest.approx(est.breakdown_s["compute"])


def test_heavy_middle_by_hand_and_the_residual_named():
    # layers 1, 2, 2, 1: ranks 1 and 2 hold the two middle stages (6 s per micro-batch: 48 s of work) and wait for
    # the fill and drain through ranks 0 and 3: the paper's U_0 = F&B + B − 3W = 3 + 2 − 3 = 2 s: step 50 s. The
    # simulator plays the reference's order with a pair's forward and backward as two passes and waits 1 s: 49 s
    # (−2.0%; at m = 16, 98 against 97 s). simulate --explain names the two bubbles and how each is counted
    est, sim = run_both((1, 2, 2, 1))
    assert est.step_time_s == 50.0 and est.breakdown_s["pp_bubble"] == 2.0
    assert sim.breakdown.step_time_s == pytest.approx(49.0)
    est16, sim16 = run_both((1, 2, 2, 1), m=16)
    assert (est16.step_time_s, sim16.breakdown.step_time_s) == pytest.approx((98.0, 97.0))
    line = [x for x in explain(dataclasses.replace(sim, estimate=est)) if x.startswith("DualPipe")]
    assert len(line) == 1 and "bubble 1.00 s vs 2.00 s" in line[0] and "(PP/2 − 1)(F&B + B − 3W)" in line[0]


def test_moe_rank_reduces_both_stages_gradients():
    # 8 layers, the first dense, PP 4 (2 layers a stage): MoE layers per stage (1, 2, 2, 2). Under DualPipe rank 0
    # holds stages 0 and 3 (3 MoE layers' experts), ranks 1 and 2 stages 1 and 2 (4): the pairs' sums
    job = tiny_moe_job()
    wl = build_workload(job)
    s = stage_param_split(job)
    per_layer = s[1][1] / 2  # a MoE layer's experts on one GPU
    assert dp_splits(job, wl) == ((s[0][0] + s[3][0], s[0][1] + s[3][1]), (s[1][0] + s[2][0], 4 * per_layer))
    assert dp_splits(job, wl)[0][1] == pytest.approx(3 * per_layer)
    # ZeRO-2 reduces after every backward, each through one of the rank's stages (m/2 each): m reductions of the
    # pair's mean, not of both stages
    z2 = job_with(job, zero=2)
    assert dp_splits(z2, build_workload(z2)) == tuple((d / 2, e / 2) for d, e in dp_splits(job, wl))
    one = tiny_moe_job(schedule="1f1b")
    assert dp_splits(one, build_workload(one)) == build_workload(one).dp_stage_splits  # one stage per rank
    # the estimate's DP traffic (dense over dp; edp = 1 here) is that of a rank's two stages, more than any one's
    costs = Costs(job)
    pairs = [dp_step_parts(with_dp_stage(job, wl, x), costs).nbytes for x in dp_splits(job, wl)]
    single = [dp_step_parts(with_dp_stage(job, wl, x), costs).nbytes for x in wl.dp_stage_splits]
    sent = estimate(job).comm_bytes_per_gpu
    assert any(sent["dp"] + sent["edp"] == pytest.approx(x, rel=1e-12) for x in pairs)
    assert sent["dp"] + sent["edp"] > max(single) > 0


def test_estimate_breakdown_is_the_busiest_ranks_on_the_moe_example():
    # DeepSeek-V3 (examples/moe/deepseek-v3-h800.yaml, 120 micro-batches): rank 1 holds stages 1 and 14, 60
    # micro-batches each; its EP wire time is that of 120 micro-batches of a middle stage's 4 MoE layers
    from commtax.spec import load_job

    job = load_job("examples/moe/deepseek-v3-h800.yaml")
    wl, costs = build_workload(job), Costs(job)
    st = stage_times(job, wl, costs)
    e = estimate(job)
    rank1 = 60 * (ep_link(st[1].link) + ep_link(st[14].link))
    assert e.comm_time_s["ep"] == pytest.approx(rank1, rel=1e-12)
    assert e.breakdown_s["compute"] == pytest.approx(60 * (st[1].compute + st[14].compute), rel=1e-12)


def test_dense_rank_reduces_both_stages_gradients_and_agrees():
    # Llama-2 70B on 64 H100 (examples/llama2-70b-h100.yaml: TP8 PP4, 128 micro-batches) under DualPipe: rank 0 holds
    # stages 0 and 3 (the embedding and the head), the most parameters of any pair; its per-step DP traffic is both
    # stages' gradients, the 1F1B job's fullest stage's × max_r(P_r + P_{3−r}) / max_s P_s (ZeRO-1: once per step)
    from commtax.spec import load_job
    from commtax.workload.step import stage_params

    job = load_job("examples/llama2-70b-h100.yaml")
    dual = job_with(job, schedule="dualpipe")
    params = stage_params(job)
    ratio = max(params[r] + params[3 - r] for r in range(4)) / max(params)
    assert 1.9 < ratio < 2.1
    e, e1 = estimate(dual), estimate(job)
    assert e.comm_bytes_per_gpu["dp"] == pytest.approx(ratio * e1.comm_bytes_per_gpu["dp"], rel=1e-9)
    s = simulate(dual, compare=False).breakdown
    assert s.comm_bytes_per_gpu["dp"] == pytest.approx(e.comm_bytes_per_gpu["dp"], rel=1e-6)
    assert s.step_time_s == pytest.approx(e.step_time_s, rel=0.02)


def test_dense_dualpipe_search_agrees_with_estimate():
    from commtax.decide.search import Space, agreement, search
    from commtax.spec import load_job

    job = job_with(load_job("examples/llama2-70b-h100.yaml"), schedule="dualpipe")
    space = Space.parse({"tp": "8", "pp": "2,4", "cp": "1", "micro_batch": "1,2", "zero": "0,1,2", "vp": "1"})
    res = search(job, space, top=3, workers=1)
    assert {res.row(int(i)).pp for i in res.valid.nonzero()[0]} == {2, 4}
    a = agreement(job, res, sample=12, seed=1)
    assert a["step_rel"] <= 1e-9 and a["mem_rel"] <= 1e-9 and a["fits_mismatch"] == 0
    assert res.max_rel_diff <= 1e-9


@settings(max_examples=15, deadline=None)
@given(half=st.integers(1, 3), layers=st.lists(st.integers(1, 3), min_size=6, max_size=6))
def test_the_residual_is_a_fill_and_drain_constant(half, layers):
    # any layout of PP 2, 4 or 6 under DualPipe, F = 1 s and B = 2 s per layer, sends free. Both are paced by the
    # busiest rank's own work (m × the mean of its two stages), a floor of each; what separates them is the fill and
    # drain (the paper's per kind of rank, against the order played out, where a rank's two stages also differ from
    # each other): the same for m = 2·PP and 2·PP + 4 micro-batches (it does not grow with m), at most half a
    # micro-batch through every stage. The stages reversed hold the same rank pairs and price the same, bit for bit
    p = 2 * half
    layout = tuple(layers[:p])
    gaps = []
    for m in (2 * p, 2 * p + 4):
        est, sim = run_both_p(layout, m)
        floor = est.breakdown_s["compute"]
        assert floor - 1e-9 <= sim.breakdown.step_time_s and floor <= est.step_time_s
        gaps.append(sim.breakdown.step_time_s - est.step_time_s)
        assert run_both_p(layout[::-1], m, simulate_it=False).step_time_s == est.step_time_s
    assert gaps[0] == pytest.approx(gaps[1], abs=1e-9)
    assert abs(gaps[0]) <= 3.0 * sum(layout) / 2


def run_both_p(layout, m, simulate_it=True):
    """``run_both`` for any even PP."""
    p = len(layout)
    job = tiny_job(pp=p, schedule="dualpipe", global_batch=m, layers=sum(layout), pipeline_layout=list(layout))
    wl = uniform(job)
    est = estimate(job, workload=wl, costs=FakeCosts(wl, send=0.0, dp=0.0))
    if not simulate_it:
        return est
    sim = simulate(job, workload=wl, costs=FakeCosts(wl, send=0.0, dp=0.0), options=SimOptions(nic_contention=False))
    return est, sim
