"""DualPipe's DP traffic in estimate and simulate (issue 18): the same rank's figures, the ZeRO-2 tail after the
last W passes named with its figure, a DP-bound rank named by ``simulate --explain``."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sim_step import FakeCosts, tiny_job, uniform

from commtax.schedule.analytical import dualpipe_zero2_tail_s, estimate
from commtax.schedule.sim import SimOptions, simulate
from commtax.schedule.sim.explain import explain
from commtax.schedule.sim.step import COMPUTE_KINDS
from commtax.spec import job_with, load_job
from commtax.units import MiB
from commtax.workload.step import build_workload

EXAMPLE = "examples/moe/deepseek-v3-h800.yaml"


def test_zero2_tail_by_hand():
    # deepseek-ai/DualPipe dualpipe.py step 8 (nW): a rank with h = 2 ends with 3 W passes of 1 s back to back, each
    # followed by a 3 s reduction on one link, streamed under its W, the last bucket 0.5 s: they run from −3, −2, −1 s
    # (the compute ends at 0), the link busy from the first on: the last ends at −3 + 9 = 6 s = max(0.5, 3 − 1) +
    # 2·(3 − 1); one bucket (last = r = 3): each starts after its W, at −2, then 1 and 4: 7 s = 3 + 2·2
    assert dualpipe_zero2_tail_s(3.0, 1.0, 2, 0.5) == 6.0
    assert dualpipe_zero2_tail_s(3.0, 1.0, 2, 3.0) == 7.0
    assert dualpipe_zero2_tail_s(0.5, 1.0, 7, 0.1) == 0.1  # each reduction hides under the next W but its last bucket


@given(st.floats(0, 10), st.floats(0, 10), st.integers(0, 8), st.floats(0, 10))
def test_zero2_tail_grows_with_the_ws_bunched(r, w, h, last):
    # more W passes back to back never shorten the tail, and it is never shorter than the last bucket
    assert dualpipe_zero2_tail_s(r, w, h + 1, last) >= dualpipe_zero2_tail_s(r, w, h, last) >= last


@pytest.mark.parametrize("r,tails", [(2.0, [2.0, 3.0]), (1.5, [1.5, 2.0]), (0.5, [0.5, 0.5])])
def test_simulated_tail_after_the_last_w_passes_is_the_formulas(r, tails):
    # PP 4, 8 micro-batches, ZeRO-2 over dp 2, one layer a stage: F = 1 s, B = 2 s (the simulator splits it into an
    # input-gradient B and a W of 1 s each), sends free, each reduction one bucket of r seconds (last = r). Ranks 0
    # and 3 (h = 0) end on one W: r past their compute; ranks 1 and 2 (h = 1) on two: r + max(0, r − 1)
    job = tiny_job(pp=4, schedule="dualpipe", global_batch=16, dp=2, zero=2)
    wl = uniform(job)
    opts = SimOptions(nic_contention=False, bucket_bytes=1e15)
    res = simulate(job, workload=wl, costs=FakeCosts(wl, send=0.0, dp=r), compare=False, options=opts)
    sim = res.sim
    got = []
    for d in range(4):
        mine = [t for t in sim.tasks if sim.streams[t.stream].device == d]
        compute = max(t.end_s for t in mine if t.kind in COMPUTE_KINDS and t.id != res.builder.devices[d].optimizer)
        got.append(max(t.end_s for t in mine if t.kind == "dp") - compute)
    want = [dualpipe_zero2_tail_s(r, 1.0, min(d, 3 - d), r) for d in range(4)]
    assert want == [tails[0], tails[1], tails[1], tails[0]]
    assert got == pytest.approx(want, abs=1e-9)


def test_example_reports_the_same_ranks_dp_both_ways():
    # DeepSeek-V3 (PP16, ZeRO-1): rank 0 holds model stages 0 and 15 (the embedding, 3 dense layers and 1 MoE layer;
    # 1 MoE layer, the MTP module and the head): the most dense gradients, the slowest DP, which the estimate prices;
    # the busiest rank (1 or 14) holds 8 MoE layers' experts. Before issue 18 simulate reported the busiest rank's edp
    # (92.3 ms) against the estimate's rank 0 (34.6 ms); both now report rank 0's and name the other
    job = load_job(EXAMPLE)
    wl = build_workload(job)
    e = estimate(job)
    s = simulate(job, options=SimOptions(bucket_bytes=wl.bucket_bytes)).breakdown
    assert s.comm_time_s["edp"] == pytest.approx(e.comm_time_s["edp"], rel=1e-9)
    assert e.comm_time_s["edp"] == pytest.approx(0.0346, abs=5e-4)
    assert s.comm_time_s["dp"] == pytest.approx(e.comm_time_s["dp"], rel=0.1)
    assert any("dp/edp of rank 0 (model stages 0 and 15)" in n for n in e.notes)
    named = [n for n in s.notes if "slowest DP rank" in n]
    assert len(named) == 1 and "of rank 0" in named[0] and "edp 0.0923 s" in named[0]


def test_zero2_agrees_at_the_frameworks_buckets_and_names_a_dp_bound_rank_at_25_mib():
    # ZeRO-2 on the example: every backward reduces the rank's gradient shard (120 reductions a step). At
    # Megatron-Core's buckets (max(40e6, 1e6·dp) = 128e6 parameters, 488 MiB of fp32; what `commtax simulate` uses)
    # the two agree within 2%; at PyTorch DDP's 25 MiB (SimOptions' default) each of rank 0's ~37k buckets pays the
    # ring's latency over 128 ranks, its DP wire time outgrows its work and the step waits for it (+7.7%; +11.4%
    # before branch moe16 priced TE's fp8 padding copies, which lengthen every rank's work): explain names the rank,
    # the bucket size and the figures; the estimate names the W-pass tail (32.5 ms; 33.1 before)
    job = job_with(load_job(EXAMPLE), zero=2)
    wl = build_workload(job)
    e = estimate(job)
    tail = [n for n in e.notes if n.startswith("DualPipe with ZeRO-2")]
    assert (
        len(tail) == 1
        and "rank 0's last 1 W pass(es)" in tail[0]
        and "= 32.5 ms past its compute" in tail[0]
        and "max(last, r − B) = 3.7 ms" in tail[0]
    )
    r = simulate(job, options=SimOptions(bucket_bytes=wl.bucket_bytes))
    assert r.breakdown.step_time_s == pytest.approx(e.step_time_s, rel=0.02)
    assert not [x for x in explain(dataclasses.replace(r, estimate=e)) if x.startswith("DP-bound")]
    r25 = simulate(job, options=SimOptions(bucket_bytes=25 * MiB))
    assert r25.breakdown.step_time_s / e.step_time_s - 1 > 0.05
    bound = [x for x in explain(dataclasses.replace(r25, estimate=e)) if x.startswith("DP-bound")]
    assert len(bound) == 1 and "rank 0 " in bound[0] and "buckets of 25 MiB" in bound[0]
    assert "framework's 488 MiB buckets (--bucket-mb differs from them)" in bound[0]
