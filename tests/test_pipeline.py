"""Pipeline stages: how layers split over stages (Megatron-Core's fields), the bubble for every m, the
schedules a framework refuses, the fullest stage's memory, and estimate vs simulate on random valid plans."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_sim_step import FakeCosts, tiny_job, uniform

from commtax.costs.pricing import Costs
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate, slowest_and_rest, stage_times
from commtax.schedule.sim import SimOptions, simulate
from commtax.spec import load_job
from commtax.workload.memory import layer_activation_bytes, stage_memory
from commtax.workload.step import build_workload


def job(layers=8, pp=4, vp=1, global_batch=16, num_gpus=None, tp=1, model=None, cluster=None, training=None, **plan):
    """A small dense model (fast to simulate); plan fields as given."""
    mdl = {
        "layers": layers,
        "hidden": 1024,
        "heads": 16,
        "kv_heads": 4,
        "vocab": 32000,
        "gated_mlp": True,
        "ffn_hidden": 2816,
        "source": "test: small llama shape",
    }
    mdl.update(model or {})
    cl = {
        "gpu": "h100-sxm5-80gb",
        "num_gpus": num_gpus or pp * tp,
        "gpus_per_node": 8,
        "intra_node": "nvlink4",
        "inter_node": "ib-ndr",
        "nics_per_node": 8,
    }
    cl.update(cluster or {})
    tr = {"seq_len": 1024, "global_batch": global_batch}
    tr.update(training or {})
    return load_job({"model": mdl, "cluster": cl, "plan": {"pp": pp, "vp": vp, "tp": tp, **plan}, "training": tr})


# ----------------------------------------------------------------------------- the split
def test_llama3_405b_split_accounts_for_embedding_and_loss():
    # Llama 3 405B (Dubey et al. 2024 §3.3.2): 126 layers on 16 stages, the first and the last one layer less;
    # Megatron-Core: (126 + 2) / 16 = 8 per stage, the embedding and the loss each take one layer's place
    j = job(
        layers=126,
        pp=16,
        global_batch=16,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    assert j.stage_layers == (7,) + (8,) * 14 + (7,)


def test_bloom_70_layers_on_12_stages_default_to_the_most_balanced_split():
    # BLOOM 176B: 70 layers on pp 12 (Le Scao et al. 2022); 70 = 12·5 + 10: ten stages take a sixth layer, the
    # middle ones first (the ends carry the embedding and the head)
    j = job(layers=70, pp=12, num_gpus=24, global_batch=24)
    assert j.stage_layers == (5,) + (6,) * 10 + (5,)
    assert sum(j.stage_layers) == 70


def test_explicit_first_and_last_and_per_stage_layers():
    assert job(layers=30, pp=4, first_stage_layers=6, last_stage_layers=4).stage_layers == (6, 10, 10, 4)
    assert job(layers=30, pp=4, first_stage_layers=3).stage_layers == (3, 9, 9, 9)
    assert job(layers=10, pp=4, stage_layers=[1, 4, 4, 1]).stage_layers == (1, 4, 4, 1)
    # interleaved: each stage's layers split over its chunks; virtual stage k = chunk·pp + stage
    j = job(layers=12, pp=2, vp=2, global_batch=16, stage_layers=[4, 8])
    assert j.chunk_layers == (2, 4, 2, 4)


@pytest.mark.parametrize(
    "plan,message",
    [
        ({"stage_layers": [4, 4]}, "stage_layers has 2 entries; give one per pipeline stage, pp(4)"),
        ({"stage_layers": [1, 2, 2, 2]}, "stage_layers [1, 2, 2, 2] must be ≥ 0 each and sum to layers(8), got 7"),
        ({"first_stage_layers": 3}, "first_stage_layers/last_stage_layers (3, None) leave 5 layers for the 3 other"),
        ({"first_stage_layers": 1, "account_for_embedding_in_pipeline_split": True}, "drop one of them"),
        ({"account_for_loss_in_pipeline_split": True}, "layers(8) + 1 = 9 must divide by pp(4) * vp(1) = 4"),
        ({"stage_layers": [1, 3, 3, 1], "vp": 2}, "with vp(2) each stage's layers must divide evenly"),
    ],
)
def test_bad_splits_name_the_field_and_the_fix(plan, message):
    with pytest.raises(SpecError, match="^plan: ") as e:
        job(**plan)
    assert message in str(e.value)


def test_more_virtual_stages_than_layers_is_refused():
    with pytest.raises(SpecError, match=r"pp\(4\) \* vp\(3\) = 12 virtual stages exceed layers\(8\)"):
        job(layers=8, pp=4, vp=3, global_batch=16)


# ----------------------------------------------------------------------------- schedules a framework refuses
def test_interleaving_needs_micro_batches_a_multiple_of_pp():
    # Megatron-Core schedules.py forward_backward_pipelining_with_interleaving raises "number of microbatches
    # is not divisible by pipeline-model-parallel-size when using interleaved schedule"
    with pytest.raises(SpecError, match=r"= 6, to be a multiple of pp\(4\)"):
        job(pp=4, vp=2, global_batch=6)
    with pytest.raises(SpecError, match=r"= 1, to be a multiple of pp\(2\)"):
        job(pp=2, vp=2, global_batch=1)  # m < p: the gpt3-175b search's old top plan
    assert job(pp=4, vp=2, global_batch=8).micro_batches == 8


def test_interleaving_is_1f1b_only():
    with pytest.raises(SpecError, match="needs schedule 1f1b"):
        job(pp=4, vp=2, schedule="gpipe")


# ----------------------------------------------------------------------------- the bubble
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_bubble_for_every_m_is_p_minus_1_stage_times(m, schedule):
    """(m + p − 1)·t per stage (Huang et al. 2019; Narayanan et al. 2021 §2.2), m < p included: t_f = 1, t_b = 2."""
    j = tiny_job(pp=4, schedule=schedule, global_batch=m)
    wl = uniform(j)
    r = simulate(
        j, workload=wl, costs=FakeCosts(wl, send=0.0, dp=0.0), compare=False, options=SimOptions(nic_contention=False)
    )
    assert r.breakdown.step_time_s == (m + 4 - 1) * 3.0
    assert r.breakdown.breakdown_s["pp_bubble"] == (4 - 1) * 3.0


@pytest.mark.parametrize(
    "p,m,schedule,sends",
    [
        (4, 8, "1f1b", 2 * 3 / 4 * 8 + 2 * 2),  # round trips: 2(p−1)/p per micro-batch, + 2(p−2) of the fill
        (2, 16, "1f1b", 2 * 1 / 2 * 16 + 0),
        (8, 32, "1f1b", 2 * 7 / 8 * 32 + 2 * 6),
        (4, 8, "gpipe", 2 * 3),  # the fill only: GPipe's passes never wait on a round trip
        (4, 1, "1f1b", 2 * 3),  # one micro-batch: down and back once
    ],
)
def test_exposed_pipeline_sends_hand_worked(p, m, schedule, sends):
    """t_f = 1, t_b = 2, t_send = 0.5 s on uniform stages: estimate and simulator expose the same sends."""
    j = tiny_job(pp=p, global_batch=m, schedule=schedule)
    wl = uniform(j)
    fake = FakeCosts(wl, send=0.5, dp=0.0)
    sim = simulate(j, workload=wl, costs=fake, compare=False, options=SimOptions(nic_contention=False)).breakdown
    est = estimate(j, workload=wl, costs=fake)
    assert est.breakdown_s["pp_exposed"] == pytest.approx(sends * 0.5)
    assert sim.breakdown_s["pp_exposed"] == pytest.approx(sends * 0.5)
    assert sim.step_time_s == pytest.approx(est.step_time_s)


def test_interleaved_sends_cross_every_virtual_boundary():
    """Interleaved 1F1B with overlapped p2p: the fill crosses all p·v − 1 virtual-stage boundaries, 2(p·v − 1) sends."""
    j = tiny_job(pp=4, vp=2, global_batch=8)
    wl = uniform(j)
    fake = FakeCosts(wl, send=0.5, dp=0.0)
    sim = simulate(j, workload=wl, costs=fake, compare=False, options=SimOptions(nic_contention=False)).breakdown
    assert estimate(j, workload=wl, costs=fake).breakdown_s["pp_exposed"] == 2 * (4 * 2 - 1) * 0.5
    assert sim.breakdown_s["pp_exposed"] == 2 * (4 * 2 - 1) * 0.5


def test_uneven_stages_slowest_last_hand_worked():
    """Stages of 1, 1, 1, 3 layers (t_f = 1, t_b = 2 per layer), m = 4: the last stage runs its 4 micro-batches
    back to back (4 × 9 s) after the fill through the other three (3 × 1 s) and before the drain (3 × 2 s):
    step = m·T_max + Σ_{s≠max} T_s = 36 + 9 = 45 s; the estimate's formula gives the same."""
    j = tiny_job(pp=4, global_batch=4, layers=6, stage_layers=[1, 1, 1, 3])
    wl = uniform(j)
    r = simulate(
        j, workload=wl, costs=FakeCosts(wl, send=0.0, dp=0.0), compare=False, options=SimOptions(nic_contention=False)
    )
    assert r.breakdown.step_time_s == 4 * 9.0 + 3 * 3.0
    assert r.busiest_stage == 3
    assert [len([t for t in r.sim.tasks if t.meta[:1] == (s,) and t.kind == "compute"]) for s in range(4)] == [8] * 4


def test_simulator_builds_each_stage_as_it_is():
    j = job(
        layers=126,
        pp=16,
        global_batch=16,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
        model={"vocab": 512},
    )
    r = simulate(j, compare=False)
    units = [[name for name, _, _ in c.units] for c in r.builder.chunks]
    assert [u.count("layer") for u in units] == [7] + [8] * 14 + [7]
    assert units[0][0] == "embed" and units[-1][-1] == "head"
    assert r.builder.stage_params[0] < r.builder.stage_params[1]  # 7 layers + a 512-row embedding < 8 layers


def test_search_offers_vp_for_uneven_layers():
    from commtax.decide.plans import candidates

    raw = {"model": {"layers": 126}, "cluster": {"num_gpus": 128}, "training": {"global_batch": 64}}
    assert candidates("vp", {"pp": 16}, raw) == [1, 2, 3, 6, 7]  # divisors of 126 with 16·vp ≤ 126
    assert candidates("vp", {"pp": 4}, {**raw, "model": {"layers": 32}}) == [1, 2, 4, 8]


def test_estimate_follows_the_slowest_stage_and_the_rest():
    j = job(layers=10, pp=4, global_batch=8)
    assert j.stage_layers == (2, 3, 3, 2)
    wl, costs = build_workload(j), Costs(j)
    stages = stage_times(j, wl, costs)
    slow, others = slowest_and_rest(stages)
    assert slow.total == max(s.total for s in stages)
    assert others == pytest.approx(sum(s.total for s in stages) - slow.total)
    b = estimate(j)
    assert b.breakdown_s["compute"] == pytest.approx(8 * slow.compute)
    assert b.breakdown_s["pp_bubble"] == pytest.approx(others)  # v = 1


def test_gpt3_175b_one_micro_batch_per_replica_is_refused_for_interleaving():
    from commtax.spec import job_with
    from commtax.spec import load_job as load

    base = load("examples/compare/gpt3-175b-4096-h100.yaml")
    with pytest.raises(SpecError, match=r"= 1, to be a multiple of pp\(2\)"):
        job_with(base, tp=8, pp=2, vp=48, micro_batch=6, dp=None)
    b = estimate(job_with(base, tp=8, pp=2, vp=1, micro_batch=6, dp=None))  # m = 1 < p = 2, plain 1F1B
    busy = sum(b.breakdown_s[k] for k in ("compute", "recompute", "tp_exposed", "cp_exposed"))
    assert b.breakdown_s["pp_bubble"] / busy == pytest.approx((2 - 1) / 1, rel=0.05)  # (p−1)/m: as large as the work


# ----------------------------------------------------------------------------- memory of the fullest stage
def test_memory_is_the_fullest_stage():
    j = job(layers=10, pp=4, global_batch=8, first_stage_layers=1, last_stage_layers=3, model={"vocab": 512})
    stages = stage_memory(j)
    per_layer = layer_activation_bytes(j)
    assert stages[1].activations == pytest.approx(3 * per_layer * (4 - 1))  # 3 layers × p − s micro-batches
    assert stages[2].activations == pytest.approx(3 * per_layer * (4 - 2))
    assert len(stages) == 4
    b = estimate(j)
    assert b.memory_gib_per_gpu["total"] * 2**30 == pytest.approx(max(s.total for s in stages))
    # 1F1B: stage s holds p − s micro-batches (Narayanan 2021 §2.2.1): with 3 layers each, stage 1 (4 in flight
    # minus one) outweighs stage 0 (1 layer) and stage 3 (1 in flight)
    assert max(range(4), key=lambda s: stages[s].total) == 1


# ----------------------------------------------------------------------------- estimate vs simulate
PIPELINE_KEYS = ("compute", "recompute", "tp_exposed", "cp_exposed", "pp_bubble")

plans = st.fixed_dictionaries(
    {
        "layers": st.sampled_from([5, 6, 7, 8, 10]),
        "pp": st.sampled_from([1, 2, 3, 4]),
        "vp": st.sampled_from([1, 1, 2]),
        "tp": st.sampled_from([1, 2, 4]),
        "cp": st.sampled_from([1, 1, 2]),
        "micro_batch": st.sampled_from([1, 2]),
        "global_batch": st.sampled_from([2, 4, 8, 16]),
        "zero": st.sampled_from([0, 1, 2, 3]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "schedule": st.sampled_from(["1f1b", "1f1b", "gpipe"]),
        "sequence_parallel": st.booleans(),
        "accounted": st.booleans(),
        "precision": st.sampled_from(["bf16", "fp8"]),
        "pcie": st.booleans(),
        "overlap": st.fixed_dictionaries({"tp": st.booleans(), "dp": st.booleans(), "cp": st.booleans()}),
    }
)


def _random_job(d):
    d = dict(d)
    pcie = d.pop("pcie")
    accounted = d.pop("accounted")
    layers, gb, precision = d.pop("layers"), d.pop("global_batch"), d.pop("precision")
    if accounted:
        d["account_for_embedding_in_pipeline_split"] = d["account_for_loss_in_pipeline_split"] = True
    if d["tp"] == 1:
        d["sequence_parallel"] = False
    cluster = (
        {"gpu": "l40s-48gb", "intra_node": "pcie4-x16", "inter_node": "eth-100g", "nics_per_node": 1} if pcie else {}
    )
    n = d["pp"] * d["tp"] * d["cp"] * 2  # two data-parallel replicas
    try:
        return job(
            layers=layers,
            num_gpus=n,
            global_batch=gb * 2 * d["micro_batch"],
            cluster=cluster,
            training={"precision": precision},
            **d,
        )
    except SpecError:
        return None  # a plan the spec (and so search) refuses


def agreement_rule(j, sim, est, busiest, contention=False):
    """The explicit rule estimate and simulate must meet, and the documented effects (``commtax.schedule.sim.explain``)
    that separate them:

    1. compute and recompute are schedule-independent: the pacing stage's, equal (1e-6);
    2. the pipeline time P (work + exposed TP/CP + bubble of the pacing stage): uniform stages (within 1%)
       within 2%. Uneven stages ("uneven stages", explain.py): the estimate's bubble is the flow-shop
       fill and drain Σ_{s≠max} T_s / v; the schedule runs part of it under the slow stage's warm-up
       forwards, and with interleaving where the heavy chunk sits moves it: P lies between no bubble,
       m·T_max, and the non-interleaved fill and drain, m·T_max + Σ_{s≠max} T_s (2% slack each side).
       P includes the optimizer: each stage runs its own (the estimate charges the fullest stage's), and the
       stage that ends last sets the step; the pacing stage's view counts the difference as waiting;
    3. the rest — pipeline sends and DP traffic — differs by what the schedule makes concrete, each named:
       "shared NIC" (DP and PP queue on one NIC), "ZeRO-3 per-block gathers" (one gather per block, the
       embedding and head included, prefetched one block ahead), "DP overlap" (bucket tails, reductions per
       stage), "pipeline sends" (stalls the closed form averages): the step differs by at most the
       difference of P and of those parts, plus 2%.
    Returns the named effects whose difference exceeds 1% of the step (empty: nothing to name).
    """
    s, e = sim.breakdown_s, est.breakdown_s
    stages = stage_times(j, build_workload(j), Costs(j))
    m = j.micro_batches
    # the simulator's pacing stage does the estimate's work for that stage (it may pick another stage than the
    # estimate's slowest where two are within a few percent: overlapped TP/CP waits are counted per pass there)
    assert s["compute"] == pytest.approx(m * stages[busiest].compute, rel=1e-6, abs=1e-12)
    assert s["recompute"] == pytest.approx(m * stages[busiest].recompute, rel=1e-6, abs=1e-12)
    # each stage runs its own optimizer (the estimate: the fullest stage's); in the simulator the stage that ends
    # last sets the step and the pacing stage's view counts the difference as waiting: judged together
    keys = PIPELINE_KEYS + ("optimizer",)
    pipe_s, pipe_e = sum(s[k] for k in keys), sum(e[k] for k in keys)
    totals = [x.total for x in stages]
    effects = []
    if max(totals) <= min(totals) * 1.01:
        assert pipe_s == pytest.approx(pipe_e, rel=0.02)
    else:
        no_bubble = pipe_e - e["pp_bubble"]
        _, others = slowest_and_rest(stages)
        assert no_bubble * 0.98 <= pipe_s <= (no_bubble + max(e["pp_bubble"], others)) * 1.02
        if abs(pipe_s - pipe_e) > 0.01 * est.step_time_s:
            effects.append("uneven stages")
    rest = sum(abs(s[k] - e[k]) for k in ("pp_exposed", "dp_exposed", "optimizer") if k not in keys)
    assert abs(sim.step_time_s - est.step_time_s) <= 0.02 * est.step_time_s + abs(pipe_s - pipe_e) + rest + 1e-12
    for k, name in (("pp_exposed", "pipeline sends"), ("dp_exposed", "DP overlap")):
        if abs(s[k] - e[k]) > 0.01 * est.step_time_s:
            if contention:
                name = "shared NIC"  # DP and PP of a GPU queue on its NIC: the estimate assumes they never collide
            elif k == "dp_exposed" and j.plan.zero == 3:
                name = "ZeRO-3 per-block gathers"  # one gather per block, embedding and head included, prefetched
            effects.append(name)
    return effects


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(plans)
def test_estimate_and_simulate_agree_or_name_the_effect(d):
    j = _random_job(d)
    assume(j is not None)
    r = simulate(j)
    effects = agreement_rule(j, r.breakdown, r.estimate, r.busiest_stage, any(r.contention_wait_s.values()))
    if abs(r.breakdown.step_time_s / r.estimate.step_time_s - 1) > 0.02:
        assert effects, "more than 2% apart with no documented effect to name"
        for name in effects:
            event(f"apart by more than 2%: {name}")  # --hypothesis-show-statistics
    else:
        event("within 2%")
