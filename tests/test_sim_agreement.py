"""Simulator vs analytical estimate where both apply, and properties of the simulated step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import BREAKDOWN_KEYS
from commtax.schedule.sim import SimOptions, simulate
from commtax.spec import load_job
from commtax.workload.step import build_workload

NO_CONTENTION = SimOptions(nic_contention=False)


def job(vocab=64, layers=32, num_gpus=64, global_batch=256, **plan):
    """A 7B-shaped model; a tiny vocabulary makes the embedding and logits stages (almost) uniform."""
    base = {"tp": 2, "pp": 4, "dp": None, "sequence_parallel": True, "recompute": "selective", "zero": 1}
    base.update(plan)
    if base["dp"] is None:
        base.pop("dp")
    return load_job(
        {
            "model": {
                "layers": layers,
                "hidden": 4096,
                "heads": 32,
                "vocab": vocab,
                "gated_mlp": True,
                "ffn_hidden": 11008,
                "source": "test: llama2-7b shape",
            },
            "cluster": {
                "gpu": "h100-sxm5-80gb",
                "num_gpus": num_gpus,
                "gpus_per_node": 8,
                "intra_node": "nvlink4",
                "inter_node": "ib-ndr",
                "nics_per_node": 8,
            },
            "plan": base,
            "training": {"seq_len": 4096, "global_batch": global_batch},
        }
    )


AGREE = {
    "1f1b pp4": {},
    "1f1b pp4 tp-overlap": {"overlap": {"tp": True}},
    "gpipe pp4": {"schedule": "gpipe"},
    "interleaved pp4 vp2": {"vp": 2},
    "interleaved pp4 vp4": {"vp": 4},
    "pp1 dp": {"pp": 1, "tp": 8},
    "zero0 pp2": {"pp": 2, "zero": 0},
    "full recompute": {"recompute": "full"},
    "zero3 pp2": {"zero": 3, "pp": 2},
    # ZeRO-2 reduces its gradient shard after every micro-batch (DeepSpeed stage_1_and_2.py partition_gradients):
    # the simulator bucket by bucket under each backward, the estimate per micro-batch (estimate.dp_step_exposed)
    "zero2 pp2, 16 micro-batches": {"zero": 2, "pp": 2},
    "zero3 fsdp": {"zero": 3, "pp": 1, "tp": 8},
    "cp2 overlapped": {"cp": 2, "pp": 2},
    "cp4 exposed": {"cp": 4, "pp": 1, "overlap": {"cp": False}},
}


def same_assumptions(j):
    """No NIC sharing, and the estimate's gradient bucket (the workload's) instead of DDP's 25 MiB."""
    return SimOptions(nic_contention=False, bucket_bytes=build_workload(j).bucket_bytes)


@pytest.mark.parametrize("plan", AGREE.values(), ids=AGREE.keys())
def test_step_time_within_2_percent_of_estimate_on_uniform_stages(plan):
    j = job(**plan)
    r = simulate(j, same_assumptions(j))
    est = r.estimate.step_time_s
    assert abs(r.breakdown.step_time_s - est) / est < 0.02
    assert r.breakdown.breakdown_s["pp_bubble"] == pytest.approx(r.estimate.breakdown_s["pp_bubble"], rel=0.05)
    # what does not depend on the schedule is the estimate's, to the bit
    assert r.breakdown.breakdown_s["compute"] == pytest.approx(r.estimate.breakdown_s["compute"], rel=1e-3)
    assert r.breakdown.breakdown_s["tp_exposed"] == pytest.approx(r.estimate.breakdown_s["tp_exposed"], rel=0.01)


def test_1f1b_send_stalls_agree_with_the_estimate():
    """1F1B: a backward waits for the gradient of the forward the stage sent on; the round trip over all
    p − 1 boundaries holds p stages' passes and 2(p − 1) sends per p micro-batches, so on (near-)uniform
    stages 2(p−1)/p sends per micro-batch are exposed, plus 2(p − 2) of the fill (``estimate.pp_exposed``);
    the simulator finds them."""
    j = job(pp=8, tp=1)
    r = simulate(j, same_assumptions(j))
    t_send, m, p = r.builder.t_send, r.builder.m, 8
    fill, uniform = 2 * (p - 1) * t_send, (2 * (p - 1) / p * m + 2 * (p - 2)) * t_send
    assert fill < r.estimate.breakdown_s["pp_exposed"] <= uniform  # the last stage (logits) paces a little
    assert r.breakdown.breakdown_s["pp_exposed"] == pytest.approx(r.estimate.breakdown_s["pp_exposed"], rel=0.05)
    assert abs(r.breakdown.step_time_s / r.estimate.step_time_s - 1) < 0.02


def test_seed_article_70b_agrees_with_estimate():
    r = simulate(load_job("examples/llama2-70b-h100.yaml"))
    assert abs(r.breakdown.step_time_s / r.estimate.step_time_s - 1) < 0.02


def test_same_fields_as_estimate():
    j = job()
    sim, est = simulate(j).breakdown, estimate(j)
    assert set(sim.to_dict()) == set(est.to_dict())
    assert tuple(sim.breakdown_s) == BREAKDOWN_KEYS
    assert sim.source == "simulate"
    assert sim.memory_gib_per_gpu == est.memory_gib_per_gpu  # schedule-independent: the estimate's model


def test_runs_are_reproducible():
    j = job(vp=2)
    a, b = simulate(j), simulate(j)
    assert a.sim.trace() == b.sim.trace()
    assert a.breakdown.to_dict() == b.breakdown.to_dict()


def test_logits_stage_shows_up_as_unbalanced():
    big_vocab = job(vocab=256_000, pp=4, tp=2)
    r = simulate(big_vocab)
    busy = r.stage_busy_s
    assert busy[-1] > 1.05 * busy[1]  # the last stage computes the logits and the loss
    assert r.busiest_stage == 3  # and sets the pace: the breakdown is its view
    textbook = (4 - 1) / r.builder.m
    assert (r.breakdown.step_time_s - busy[1]) / busy[1] > 1.2 * textbook  # a middle stage idles beyond the bubble
    from commtax.schedule.sim.explain import explain

    assert any(line.startswith("uneven stages") and "logits" in line for line in explain(r))


def test_explain_on_uniform_stages_finds_nothing_to_explain():
    from commtax.schedule.sim.explain import explain

    lines = explain(simulate(job(pp=1, tp=8, num_gpus=8), NO_CONTENTION))
    assert lines[-1].startswith("no part differs")


def test_zero3_prefetch_hides_gathers_behind_compute():
    j = job(pp=1, tp=8, num_gpus=64, zero=3, micro_batch=8)  # 8 sequences per micro-batch: compute-bound blocks
    r = simulate(j, NO_CONTENTION)
    gathers = [t for t in r.sim.tasks if t.name == "gather"]
    assert len(gathers) == r.builder.m * 2 * (32 + 2)  # every block, forward and backward, every micro-batch
    link = r.breakdown.comm_time_s["dp"]
    exposed = r.breakdown.breakdown_s["dp_exposed"]
    # what the hidden traffic costs the compute it runs under (SMs, HBM: estimate.dp_contention) is charged on top:
    # at most its SM share of the link time
    contention_max = r.builder.costs.cm.nccl_sms / r.builder.costs.cm.sms * link
    assert (
        exposed < 0.1 * link + contention_max
    )  # prefetched one block ahead: the first gather, the last reduce-scatter
    serial = simulate(job(pp=1, tp=8, num_gpus=64, zero=3, micro_batch=8, overlap={"dp": False}), NO_CONTENTION)
    assert serial.breakdown.breakdown_s["dp_exposed"] == pytest.approx(link, rel=0.01)  # nothing hidden


def test_dp_and_pp_sharing_a_nic_is_reported():
    j = job(pp=4, tp=8, num_gpus=256, vocab=32000)
    shared, alone = simulate(j), simulate(j, NO_CONTENTION)
    assert shared.breakdown.step_time_s >= alone.breakdown.step_time_s
    assert sum(shared.contention_wait_s.values()) > 0
    from commtax.schedule.sim.explain import explain

    assert any(line.startswith("shared NIC") for line in explain(shared))


plans = st.fixed_dictionaries(
    {
        "pp": st.sampled_from([1, 2, 4]),
        "vp": st.sampled_from([1, 2]),
        "tp": st.sampled_from([1, 2, 8]),
        "zero": st.sampled_from([0, 1, 2, 3]),
        "schedule": st.sampled_from(["1f1b", "gpipe"]),
        "overlap": st.fixed_dictionaries({"tp": st.booleans(), "dp": st.booleans()}),
    }
)


def _job(plan):
    plan = dict(plan)
    if plan["pp"] == 1 or plan["schedule"] == "gpipe":  # interleaving is 1F1B's (the spec refuses the rest)
        plan["vp"] = 1
    return job(layers=8, num_gpus=64, global_batch=64, **plan)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans)
def test_breakdown_sums_to_step_time(plan):
    b = simulate(_job(plan), compare=False).breakdown
    assert sum(b.breakdown_s.values()) == pytest.approx(b.step_time_s, rel=1e-9)
    assert all(x >= -1e-12 for x in b.breakdown_s.values())


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans, st.sampled_from([1.5, 2.0, 4.0]))
def test_more_network_bandwidth_is_never_slower(plan, factor):
    j = _job(plan)
    net = j.cluster.inter_node
    faster = j.model_copy(
        update={
            "cluster": j.cluster.model_copy(
                update={"inter_node": net.model_copy(update={"bw_Gbps": net.bw_Gbps * factor})}
            )
        }
    )
    slow = simulate(j, NO_CONTENTION, compare=False).breakdown.step_time_s
    fast = simulate(faster, NO_CONTENTION, compare=False).breakdown.step_time_s
    assert fast <= slow * (1 + 1e-12)
