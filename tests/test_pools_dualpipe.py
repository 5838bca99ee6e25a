"""DualPipe on GPU pools (``plan.stage_pools``): priced per pipeline rank as ``estimate`` prices it (issue 18), rank
r's GPUs running model stages r and p − 1 − r on their own pool, in ``schedule.pools`` and the simulator alike."""

from __future__ import annotations

import pytest
from test_estimate_dualpipe import stage
from test_pools import FAST, SLOW, homogeneous, job, pool

from commtax.schedule.analytical import dualpipe_bubble, dualpipe_ranks_bubble, estimate, pipeline_ranks
from commtax.schedule.sim.simulate import simulate
from commtax.spec import load_job


def dual(stage_pools):
    spec = job([pool("a", FAST, 16), pool("b", SLOW, 16)], pp=4, schedule="dualpipe", stage_pools=stage_pools)
    return load_job(spec)


def test_ranks_on_the_slow_pool_pace_as_on_a_slow_cluster():
    # PP4 DualPipe, ranks 0-1 on the fast pool, ranks 2-3 on the slow one (half the FLOP/s and bandwidth): rank 3
    # runs model stages 3 (the head) and 0 (the embedding) on the slow pool, rank 2 stages 2 and 1: the same pairs,
    # on the same GPU, as the busiest rank of the job all on the slow pool, so the same m × (T_r + T_{3−r})/2 of
    # compute. Before issue 18 the pools charged the slowest stage, stage 3 alone on the slow pool (the head's
    # 32k-vocabulary logits without the embedding's lookup beside it): more
    e = estimate(dual(["a", "a", "b", "b"]))
    slow = estimate(load_job(homogeneous(SLOW, n=32, pp=4, schedule="dualpipe")))
    assert e.breakdown_s["compute"] == pytest.approx(slow.breakdown_s["compute"], rel=1e-12)
    assert e.breakdown_s["recompute"] == pytest.approx(slow.breakdown_s["recompute"], rel=1e-12)
    assert [x["straggler"] for x in e.pools] == [False, True]


def test_simulate_runs_each_ranks_two_stages_on_its_pool_and_agrees():
    # the simulator prices the reverse pipeline's chunks on the pool of the rank that runs them: the busiest rank's
    # compute is the estimate's, and the step within 2% (0.945 s simulated vs 0.960 s). Before issue 18 the estimate
    # charged stage 3 alone (0.977 s) and the simulator ran rank 3's stage 0 at the fast pool's prices (0.753 s)
    j = dual(["a", "a", "b", "b"])
    e, s = estimate(j), simulate(j).breakdown
    assert s.breakdown_s["compute"] == pytest.approx(e.breakdown_s["compute"], rel=1e-9)
    assert s.step_time_s == pytest.approx(e.step_time_s, rel=0.02)


def test_ranks_bubble_by_hand_and_symmetric_ranks_give_dualpipe_bubble():
    # kind h is paced by the slower of ranks h and p − 1 − h: ranks T = 6 (F 2, B 4) and 3 (F 1, B 2) at the ends,
    # 3 and 6 in the middle. Kinds: h = 0 → the 6 s rank, h = 1 → the 6 s rank; U_0 = F + 2B − 3W = 2 + 8 − 6 = 4:
    # pipeline = max(8·6, 8·6 + 4) = 52, bubble 4
    big, small = stage(2.0, 4.0), stage(1.0, 2.0)
    assert dualpipe_ranks_bubble([big, small, big, small], 8) == pytest.approx(4.0)
    stages = [small, big, big, small]
    assert dualpipe_ranks_bubble(pipeline_ranks("dualpipe", stages), 8) == dualpipe_bubble(stages, 8)
