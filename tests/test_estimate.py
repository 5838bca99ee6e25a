"""The analytical schedule: hand-worked pipeline cases and invariants (hypothesis)."""

import pytest
from conftest import job_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import BREAKDOWN_KEYS
from commtax.spec import load_job

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def uniform_job(pp=4, vp=1, global_batch=256, schedule="1f1b"):
    """Uniform stages: no embedding/logits imbalance to speak of (tiny vocab), no DP, no TP."""
    d = job_dict(tp=1, pp=pp, dp=1, vp=vp, sequence_parallel=False, zero=0, schedule=schedule)
    d["model"] = {"layers": 48, "hidden": 4096, "heads": 32, "vocab": 8, "gated_mlp": False}
    d["cluster"]["num_gpus"] = pp
    d["training"]["global_batch"] = global_batch
    return load_job(d)


@pytest.mark.parametrize("pp,vp,m", [(4, 1, 64), (4, 2, 64), (8, 3, 32), (2, 1, 8)])
def test_bubble_fraction_is_p_minus_1_over_v_m(pp, vp, m):
    b = estimate(uniform_job(pp=pp, vp=vp, global_batch=m))
    busy = sum(b.breakdown_s[k] for k in ("compute", "recompute", "tp_exposed", "cp_exposed"))
    # Narayanan et al. 2021 §2.2: bubble / ideal = (p-1)/(v·m) for uniform stages
    assert b.breakdown_s["pp_bubble"] / busy == pytest.approx((pp - 1) / (vp * m), rel=0.02)


def test_breakdown_fields_and_definitions(seed_job):
    b = estimate(seed_job)
    assert set(b.breakdown_s) == set(BREAKDOWN_KEYS)
    assert b.step_time_s == pytest.approx(sum(b.breakdown_s.values()))
    exposed = sum(b.breakdown_s[k] for k in ("tp_exposed", "cp_exposed", "pp_exposed", "dp_exposed"))
    assert b.comm_tax == pytest.approx(exposed / b.step_time_s)
    comm = sum(b.comm_time_s.values())
    busy = b.breakdown_s["compute"] + b.breakdown_s["recompute"]
    assert b.comm_share == pytest.approx(comm / (comm + busy))
    assert b.tokens_per_s == pytest.approx(1024 * 4096 / b.step_time_s)
    assert b.mfu == pytest.approx(b.tflops_per_gpu * 1e12 / 989.4e12)
    assert b.hfu >= b.mfu


def test_tp_overlap_and_flash_attention_are_explicit_plan_fields():
    base = estimate(load_job(job_dict()))
    overlapped = estimate(load_job(job_dict(overlap={"tp": True})))
    assert overlapped.breakdown_s["tp_exposed"] < base.breakdown_s["tp_exposed"]
    legacy = estimate(load_job(job_dict(generation="legacy")))
    assert legacy.step_time_s > base.step_time_s  # scores materialised, DP reduction after backward


def test_days_to_train():
    d = job_dict()
    d["training"]["tokens"] = 2e12
    b = estimate(load_job(d))
    assert b.days_to_train == pytest.approx(2e12 / b.tokens_per_s / 86400)


@FAST
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    zero=st.sampled_from([0, 1, 2, 3]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    mb=st.sampled_from([1, 2, 4]),
    sp=st.booleans(),
)
def test_step_time_is_the_sum_of_its_parts(tp, pp, zero, recompute, mb, sp):
    job = load_job(
        job_dict(tp=tp, pp=pp, dp=None, zero=zero, recompute=recompute, micro_batch=mb, sequence_parallel=sp and tp > 1)
    )
    b = estimate(job)
    assert b.step_time_s == pytest.approx(sum(b.breakdown_s.values()), rel=1e-12)
    assert all(v >= 0 for v in b.breakdown_s.values())
    assert 0 <= b.comm_tax <= 1 and 0 <= b.comm_share <= 1


def _with_bandwidth(intra_factor, inter_factor, **plan):
    d = job_dict(**plan)
    d["cluster"]["intra_node"] = {"name": "nv", "bw_GBps": 450 * intra_factor, "latency_us": 14, "efficiency": 0.8}
    d["cluster"]["inter_node"] = {"name": "ib", "bw_Gbps": 400 * inter_factor, "latency_us": 20, "efficiency": 0.9}
    return load_job(d)


@FAST
@given(
    intra=st.floats(0.05, 4),
    inter=st.floats(0.05, 4),
    more=st.floats(1.0, 8.0),
    tp=st.sampled_from([2, 8]),
    zero=st.sampled_from([0, 1, 3]),
)
def test_more_link_bandwidth_is_never_slower(intra, inter, more, tp, zero):
    base = estimate(_with_bandwidth(intra, inter, tp=tp, dp=None, zero=zero))
    faster_intra = estimate(_with_bandwidth(intra * more, inter, tp=tp, dp=None, zero=zero))
    faster_inter = estimate(_with_bandwidth(intra, inter * more, tp=tp, dp=None, zero=zero))
    assert faster_intra.step_time_s <= base.step_time_s * (1 + 1e-12)
    assert faster_inter.step_time_s <= base.step_time_s * (1 + 1e-12)


@FAST
@given(gb=st.sampled_from([64, 128, 256, 512]), pp=st.sampled_from([2, 4, 8]), vp=st.sampled_from([1, 2]))
def test_doubling_global_batch_never_raises_the_bubble_fraction(gb, pp, vp):
    def fraction(global_batch):
        d = job_dict(tp=8, pp=pp, dp=None, vp=vp)
        d["training"]["global_batch"] = global_batch
        b = estimate(load_job(d))
        return b.breakdown_s["pp_bubble"] / b.step_time_s

    assert fraction(2 * gb) <= fraction(gb) + 1e-12


@FAST
@given(tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 4]), recompute=st.sampled_from(["none", "full"]))
def test_memory_decreases_with_zero_stage(tp, pp, recompute):
    totals = [
        estimate(load_job(job_dict(tp=tp, pp=pp, dp=None, zero=z, recompute=recompute))).memory_gib_per_gpu["total"]
        for z in (0, 1, 2, 3)
    ]
    assert all(a >= b for a, b in zip(totals, totals[1:]))


def test_interleaved_dp_reduces_and_gathers_each_model_chunk_on_its_own():
    # Megatron-Core schedules.py: grad_sync_func[chunk] after a chunk's last backward, param_sync_func before its
    # first forward. Worked by hand: 4 chunks, 8 s of reduction (2 s each), 1 s of own backward per chunk.
    from commtax.schedule.analytical import chunked_gather_exposed, chunked_reduce_exposed

    # chunks 3..0 ready at -10, -7, -4, -1 s (3 s apart): they end at -8, -5, -2, +1 -> 1 s exposed
    assert chunked_reduce_exposed(8.0, 4, 1.0, 3.0, 0.1) == pytest.approx(1.0)
    # 1 s apart: ready -4, -3, -2, -1, the link is the bottleneck: end -2, 0, 2, 4 -> 4 s exposed
    assert chunked_reduce_exposed(8.0, 4, 1.0, 1.0, 0.1) == pytest.approx(4.0)
    assert chunked_reduce_exposed(8.0, 1, 1.0, 0.0, 0.1) == pytest.approx(7.0)  # one chunk: total - own backward
    assert chunked_reduce_exposed(0.5, 1, 1.0, 0.0, 0.1) == pytest.approx(0.1)  # at least the last bucket
    # gathers 2 s each, launched together; chunk k needed at 3k s, consumed over 1 s: lateness 1, 0, -1, -2
    assert chunked_gather_exposed(8.0, 4, 1.0, 3.0, 0.1) == pytest.approx(1.0)


def test_interleaving_hides_more_dp_reduction_under_the_cool_down():
    from commtax.costs.pricing import Costs
    from commtax.schedule.analytical import dp_step_exposed, dp_step_parts, dp_timeline, stage_times
    from commtax.workload.step import build_workload

    d = job_dict(framework="megatron-core", tp=8, pp=8, dp=None, zero=1, sequence_parallel=True, micro_batch=1)
    d["model"], d["cluster"]["num_gpus"] = "gpt3-175b", 1024
    d["training"] = {"seq_len": 2048, "global_batch": 256, "precision": "bf16"}
    exposed = {}
    for vp in (1, 6):
        d["plan"]["vp"] = vp
        job = load_job(d)
        wl, costs = build_workload(job), Costs(job)
        st = max(stage_times(job, wl, costs), key=lambda s: s.total)
        _, exp, _ = dp_timeline(job, wl, costs, st)  # what the schedule leaves exposed (no contention)
        assert exp == pytest.approx(dp_step_exposed(dp_step_parts(wl, costs), st, 8, vp, wl.micro_batches))
        exposed[vp] = exp
    # without interleaving the whole reduction waits for the first rank's last backward
    assert exposed[6] < 0.5 * exposed[1]


def test_zero2_reduces_the_gradient_shard_every_micro_batch():
    # DeepSpeed stage_1_and_2.py reduce_ready_partitions_and_remove_grads: "if self.partition_gradients or
    # self.is_gradient_accumulation_boundary" -> ZeRO-2 (partitioned grads) reduces after every micro-batch's backward,
    # ZeRO-1 only after the last one. Llama-2 70B, tp 8, pp 4, dp 8, global batch 1024 -> 128 micro-batches.
    from commtax.costs.pricing import Costs, PhaseCost
    from commtax.schedule.analytical import DPStepParts, StageTime, dp_step_exposed, dp_step_parts, reduce_passes
    from commtax.workload.step import build_workload

    z1, z2 = (load_job(job_dict(zero=z)) for z in (1, 2))
    w1, w2 = build_workload(z1), build_workload(z2)
    costs = Costs(z2)
    assert (reduce_passes(w1), reduce_passes(w2)) == (1, 128)
    p1, p2 = dp_step_parts(w1, costs), dp_step_parts(w2, costs)
    times1, times2 = p1.times, p2.times
    assert times2[0] == pytest.approx(128 * times1[0]) and times2[1] == pytest.approx(times1[1])  # gather: once
    assert p2.nbytes - p1.nbytes == pytest.approx(127 * costs.sent_bytes(w2.dp_step[0]))
    # hand-worked exposure: one pass r = 10 ms; a micro-batch's compute (fwd 3 + bwd 4 ms) hides 7 ms of each of the
    # 127 earlier passes; the last pass hides under the last backward only (4 ms), floor = last bucket 1 ms
    st = StageTime(compute=0.007, recompute=0.0, tp_exposed=0.0, cp_exposed=0.0, fwd=0.003, bwd=0.004, link=PhaseCost())
    r, m = 0.010, 128

    def parts(reduce_s: float, codec: float = 0.0) -> DPStepParts:
        return DPStepParts(reduce_s, 0.0, [reduce_s, 0.0], 0.001, 0.0, codec)

    exposed = dp_step_exposed(parts(m * r), st, 1, 1, m, passes=m)
    assert exposed == pytest.approx((r - 0.004) + (m - 1) * (r - 0.007))
    assert dp_step_exposed(parts(r), st, 1, 1, m) == pytest.approx(r - 0.004)  # ZeRO-1: once
    # a 2 ms codec per pass is device work: it never hides, whatever the wire does (128 passes: 256 ms more)
    assert dp_step_exposed(parts(m * r, 0.002), st, 1, 1, m, passes=m) == pytest.approx(exposed + m * 0.002)


def test_an_estimate_does_not_depend_on_what_was_estimated_before():
    """Phase prices, placements and stage times are shared between jobs on one cluster and layout
    (``estimate.Costs``): estimating other plans in between changes no number."""
    from commtax.spec import job_with

    job = load_job(job_dict(tp=8, pp=4, zero=1, micro_batch=1))
    first = estimate(job).to_dict()
    for changes in ({"zero": 2}, {"micro_batch": 2}, {"recompute": "full"}, {"pp": 2, "dp": 16}, {"schedule": "gpipe"}):
        estimate(job_with(job, **changes))
    assert estimate(job).to_dict() == first
    assert estimate(load_job(job_dict(tp=8, pp=4, zero=1, micro_batch=1))).to_dict() == first  # fresh specs alike


def test_a_costs_subclass_that_prices_otherwise_is_not_served_shared_prices():
    from commtax.costs.pricing import Costs

    class SlowLinks(Costs):
        def collective_time(self, group, op, nbytes):
            return 2 * super().collective_time(group, op, nbytes)

    job = load_job(job_dict(tp=8, pp=4, zero=1, micro_batch=1))
    plain, slow = estimate(job), estimate(job, costs=SlowLinks(job))
    assert slow.comm_time_s["tp"] == pytest.approx(2 * plain.comm_time_s["tp"], rel=1e-12)
    assert estimate(job).to_dict() == plain.to_dict()
