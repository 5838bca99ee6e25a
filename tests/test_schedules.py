"""Pipeline schedules real runs use: zero-bubble ZB-H1 / ZB-V (Qi et al. 2023) and Llama 3's flexible interleaved
1F1B (any number of micro-batches), hand-worked."""

import pytest
from tests.conftest import job_dict

from commtax.errors import SpecError
from commtax.schedule.analytical import StageTime, estimate, pipeline_bubble
from commtax.schedule.sim.pipeline import by_stage, dependency_order, schedule
from commtax.spec import load_job
from commtax.workload.memory import in_flight_micro_batches


def stage(f=1.0, b=2.0):
    # one micro-batch: forward f, backward b (B + W, W = b/2), no recompute, no exposed TP/CP
    return StageTime(compute=f + b, recompute=0.0, tp_exposed=0.0, cp_exposed=0.0, fwd=f, bwd=b, link=None)


def test_zero_bubble_formulas_with_equal_f_b_w():
    stages = [stage() for _ in range(4)]  # T_F = T_B = T_W = 1, p = 4
    # Qi et al. 2023 Table 1: 1F1B (p-1)(T_F+T_B+T_W) = 9; ZB-H1 (p-1)(T_F+T_B-T_W) = 3, a third
    assert pipeline_bubble("1f1b", 8, 1, stages) == pytest.approx(3 * 3.0)
    assert pipeline_bubble("zb-h1", 8, 1, stages) == pytest.approx(3 * (1 + 1 - 1))
    # ZB-V: (p-1)(T_F+T_B-2T_W) with a chunk's times (half a stage's): zero
    assert pipeline_bubble("zb-v", 8, 2, stages) == pytest.approx(0.0)


def test_zero_bubble_with_a_slower_weight_gradient_share():
    stages = [stage(f=2.0, b=2.0) for _ in range(3)]  # T_F 2, T_B = T_W = 1
    assert pipeline_bubble("zb-h1", 6, 1, stages) == pytest.approx(2 * (2 + 1 - 1))
    assert pipeline_bubble("zb-v", 6, 2, stages) == pytest.approx(2 * (2 + 1 - 2 * 1) / 2)


def test_zero_bubble_needs_as_many_micro_batches_as_stages():
    stages = [stage() for _ in range(4)]
    assert pipeline_bubble("zb-h1", 3, 1, stages) == pipeline_bubble("1f1b", 3, 1, stages)


def test_zero_bubble_in_an_estimate():
    base = job_dict(recompute="none")
    one_f = estimate(load_job(base)).breakdown_s["pp_bubble"]
    zb_h1 = estimate(load_job({**base, "plan": {**base["plan"], "schedule": "zb-h1"}})).breakdown_s["pp_bubble"]
    zb_v = estimate(load_job({**base, "plan": {**base["plan"], "schedule": "zb-v", "vp": 2}})).breakdown_s["pp_bubble"]
    assert 0 < zb_h1 < one_f / 2 and zb_v < zb_h1


def test_schedule_fields_are_checked():
    base = job_dict()
    with pytest.raises(SpecError, match="zb-v runs two model chunks"):
        load_job({**base, "plan": {**base["plan"], "schedule": "zb-v"}})
    with pytest.raises(SpecError, match="set framework: custom"):
        load_job({**base, "plan": {**base["plan"], "schedule": "1f1b-flexible", "vp": 2, "framework": "megatron-core"}})
    # 1024 / (8 · 1) = 128 micro-batches on pp 4: with micro_batch 8 it is 16; with global_batch 1000 and
    # micro_batch 5, 25 is not a multiple of pp 4: Megatron refuses it, Llama 3's schedule runs it
    odd = {**base, "training": {**base["training"], "global_batch": 1000}}
    plan = {**base["plan"], "vp": 2, "micro_batch": 5}
    with pytest.raises(SpecError, match="1f1b-flexible"):
        load_job({**odd, "plan": plan})
    job = load_job({**odd, "plan": {**plan, "framework": "custom", "schedule": "1f1b-flexible"}})
    assert job.micro_batches == 25


def test_in_flight_micro_batches_of_the_new_schedules():
    base = job_dict()
    zbv = load_job({**base, "plan": {**base["plan"], "schedule": "zb-v", "vp": 2}})
    # ZB-V: p·M_B on every stage (Qi et al. 2023 §6)
    assert [in_flight_micro_batches(zbv, s) for s in range(4)] == [4.0] * 4
    zbh1 = load_job({**base, "plan": {**base["plan"], "schedule": "zb-h1"}})
    # ZB-H1: stage s defers its W's by s micro-batches: p − s − 1 warm-up + 1 + s = p on every stage
    assert [in_flight_micro_batches(zbh1, s) for s in range(4)] == [4.0] * 4
    odd = {**base, "training": {**base["training"], "global_batch": 1000}}
    flex = load_job(
        {**odd, "plan": {**base["plan"], "vp": 2, "micro_batch": 5, "framework": "custom", "schedule": "1f1b-flexible"}}
    )
    # m = 25 on p = 4: the first group takes the remainder, 4 + 1 = 5; stage 0's warm-up 2·3 + 1·5 = 11 chunk
    # forwards, plus one, each half the stage's layers
    assert in_flight_micro_batches(flex, 0) == pytest.approx((2 * 3 + 5 + 1) / 2)


def test_flexible_interleaved_runs_any_number_of_micro_batches():
    p, v = 4, 2
    for m in (5, 6, 7, 9):
        passes = list(dependency_order(by_stage(schedule("1f1b-flexible", p, m, v), p), p, v))
        assert len(passes) == 2 * p * v * m  # every forward and backward of every chunk, no deadlock


def test_the_simulator_refuses_zb_v_in_one_line():
    with pytest.raises(SpecError, match="plan.schedule: zb-v"):
        schedule("zb-v", 4, 8, 2)


def test_zb_h1_order_defers_each_stages_weight_gradients_by_its_index():
    order = by_stage(schedule("zb-h1", 3, 4), 3)
    assert [" ".join(f"{x.phase}{x.mb}" for x in st) for st in order] == [
        "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3",  # stage 0: 1F1B's 2 warm-up forwards, W right after its B
        "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3",  # stage 1: W one micro-batch late
        "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3",  # stage 2: two late, the drain runs them
    ]


def _unit_makespan(name: str, p: int, m: int, dur: dict[str, float]) -> float:
    """Finish time of a schedule with fixed pass times and free communication (max-plus over the pass order)."""
    done, free = {}, [0.0] * p
    for x in dependency_order(by_stage(schedule(name, p, m), p), p, 1):
        k = x.stage
        if x.phase == "F":
            dep = done.get((k - 1, x.mb, "F"), 0.0)
        elif x.phase == "B":
            dep = done.get((k + 1, x.mb, "B"), done[(k, x.mb, "F")])
        else:
            dep = done[(k, x.mb, "B")]
        free[k] = done[(k, x.mb, x.phase)] = max(free[k], dep) + dur[x.phase]
    return max(free)


@pytest.mark.parametrize("p,m", [(4, 8), (3, 6), (8, 16), (4, 4)])
def test_zb_h1_order_has_the_papers_bubble(p, m):
    # T_F = T_B = T_W = 1: 1F1B takes 3m + (p-1)·3, ZB-H1 3m + (p-1)(T_F + T_B - T_W) = 3m + (p-1)
    assert _unit_makespan("1f1b", p, m, {"F": 1, "B": 2}) == 3 * m + 3 * (p - 1)
    assert _unit_makespan("zb-h1", p, m, {"F": 1, "B": 1, "W": 1}) == 3 * m + (p - 1)


def test_simulated_zb_h1_agrees_with_the_estimate():
    from commtax.schedule.sim import simulate

    d = job_dict(recompute="none")
    d["training"]["global_batch"] = 64
    d["plan"]["schedule"] = "zb-h1"
    job = load_job(d)
    est, sim = estimate(job), simulate(job).breakdown
    assert sim.step_time_s == pytest.approx(est.step_time_s, rel=0.03)
    one_f = load_job({**d, "plan": {**d["plan"], "schedule": "1f1b"}})
    assert sim.step_time_s < simulate(one_f).breakdown.step_time_s
