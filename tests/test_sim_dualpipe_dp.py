"""DualPipe's DP traffic in estimate and simulate (issue 18): the same rank's figures, the ZeRO-2 tail after the
last W passes named with its figure, a DP-bound rank named by ``simulate --explain``."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commtax.schedule.analytical import dualpipe_zero2_tail_s, estimate
from commtax.schedule.sim import SimOptions, simulate
from commtax.schedule.sim.explain import explain
from commtax.spec import job_with, load_job
from commtax.units import MiB
from commtax.workload.step import build_workload

EXAMPLE = "examples/moe/deepseek-v3-h800.yaml"


def test_zero2_tail_by_hand():
    # deepseek-ai/DualPipe dualpipe.py step 8 (nW): a rank with h = 2 ends with 3 W passes of 1 s back to back, each
    # followed by a 3 s reduction on one link: they start at 0, 1, 2 s and end at 3, 6, 9 s (the link is busy from
    # the first on), the compute at 3 s: 6 s past it = (h + 1)(r − W) = 3·2
    assert dualpipe_zero2_tail_s(3.0, 1.0, 2) == 6.0
    assert dualpipe_zero2_tail_s(0.5, 1.0, 7) == 0.0  # each reduction hides under the next W


@given(st.floats(0, 10), st.floats(0, 10), st.integers(0, 8))
def test_zero2_tail_grows_with_the_ws_bunched(r, w, h):
    # more W passes back to back never shorten the tail, and the last one alone leaves max(0, r − W)
    assert dualpipe_zero2_tail_s(r, w, h + 1) >= dualpipe_zero2_tail_s(r, w, h) >= max(0.0, r - w)


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
    # ring's latency over 128 ranks, its DP wire time outgrows its work and the step waits for it (+13.6%):
    # explain names the rank, the bucket size and the figures; the estimate names the W-pass tail (33 ms)
    job = job_with(load_job(EXAMPLE), zero=2)
    wl = build_workload(job)
    e = estimate(job)
    tail = [n for n in e.notes if n.startswith("DualPipe with ZeRO-2")]
    assert len(tail) == 1 and "rank 0's last 1 W pass(es)" in tail[0] and "= 33.4 ms past its compute" in tail[0]
    r = simulate(job, options=SimOptions(bucket_bytes=wl.bucket_bytes))
    assert r.breakdown.step_time_s == pytest.approx(e.step_time_s, rel=0.02)
    assert not [x for x in explain(dataclasses.replace(r, estimate=e)) if x.startswith("DP-bound")]
    r25 = simulate(job, options=SimOptions(bucket_bytes=25 * MiB))
    assert r25.breakdown.step_time_s / e.step_time_s - 1 > 0.1
    bound = [x for x in explain(dataclasses.replace(r25, estimate=e)) if x.startswith("DP-bound")]
    assert len(bound) == 1 and "rank 0 " in bound[0] and "buckets of 25 MiB" in bound[0]
    assert "framework's 488 MiB buckets (--bucket-mb differs from them)" in bound[0]
