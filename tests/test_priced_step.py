"""The priced step on arrays: the search evaluates estimate's own formulas on the plan grid (issue 17).

Each formula exists once and takes plain floats (``estimate``, one plan) or NumPy arrays (``search``, the grid);
the array results must be the scalar ones to the last bit, since the search's numbers are compared with
estimate's exactly (``max_rel_diff_vs_estimate`` 0)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.elementwise import any_true, largest, maximum, minimum, where
from commtax.costs.pricing import Costs
from commtax.errors import SpecError
from commtax.schedule import analytical as est
from commtax.spec import job_with, load_job
from commtax.workload.memory import (
    layer_bytes_by_recompute,
    stage_activation_bytes,
    stage_activation_bytes_by_recompute,
)
from commtax.workload.step import build_workload, with_fields

finite = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


def small_job(**plan) -> dict:
    return {
        "model": "llama2-7b",
        "cluster": {
            "gpu": "h100-sxm5-80gb",
            "num_gpus": 32,
            "gpus_per_node": 8,
            "intra_node": "nvlink4",
            "inter_node": "ib-ndr",
            "nics_per_node": 8,
        },
        "plan": {"tp": 2, "pp": 2, "micro_batch": 1, **plan},
        "training": {"seq_len": 2048, "global_batch": 64, "precision": "bf16"},
    }


def test_elementwise_helpers_are_the_builtins_on_floats_and_ufuncs_on_arrays():
    assert maximum(1.0, 2.0) == 2.0 and type(maximum(1.0, 2.0)) is float
    assert minimum(3, 2.5) == 2.5
    assert where(True, 1.0, 2.0) == 1.0 and where(False, 1.0, 2.0) == 2.0
    assert any_true(False) is False
    a = np.array([0.0, 2.0, 5.0])
    assert maximum(a, 1.0).tolist() == [1.0, 2.0, 5.0]
    assert minimum(a, 1.0).tolist() == [0.0, 1.0, 1.0]
    assert where(a > 1.0, a, -1.0).tolist() == [-1.0, 2.0, 5.0]
    assert any_true(a > 4.0) is True
    # on floats a tie keeps the first argument, as the builtins do (only the sign of a zero can show it)
    assert str(maximum(-0.0, 0.0)) == str(max(-0.0, 0.0)) == "-0.0"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(finite | st.just(float("nan")), min_size=3, max_size=3), min_size=1, max_size=8))
def test_largest_is_maximum_left_to_right(rows):
    """``largest``: ``max`` on floats; on arrays of one shape one reduction, the pairwise maxima's values to the bit."""
    arrays = [np.array(r) for r in rows]
    pairwise = arrays[0]
    for a in arrays[1:]:
        pairwise = np.maximum(pairwise, a)
    assert largest(arrays).tobytes() == pairwise.tobytes()
    for col in zip(*rows):
        floats = list(col)
        expect = floats[0]
        for x in floats[1:]:
            expect = maximum(expect, x)
        assert str(largest(floats)) == str(expect)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(finite, finite, finite, finite, finite, finite, finite), min_size=1, max_size=6),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 3]),
    st.integers(min_value=1, max_value=64),
    st.booleans(),
    st.booleans(),
)
def test_dp_step_exposed_on_arrays_is_the_scalar_formula_elementwise(rows, pp, vp, m, gathers, sharded):
    """``dp_step_exposed_s`` on arrays (search's grid) equals it on each element's floats (estimate), bit for bit."""
    passes = m if sharded else 1
    cols = [np.array(c) for c in zip(*rows)]
    reduce_s, gather_s, tail, first, codec, fwd, bwd = cols
    grid = est.dp_step_exposed_s(reduce_s, gather_s, gathers, tail, first, codec, fwd, bwd, pp, vp, m, passes)
    for i, (r, g, t, f, c, fw, bw) in enumerate(rows):
        one = est.dp_step_exposed_s(r, g, gathers, t, f, c, fw, bw, pp, vp, m, passes)
        assert grid[i] == one


def test_dp_step_exposed_by_hand():
    """Interleaving (v = 2, pp 4, m 8): spacing min(m, pp) = 4 backward chunks; r = 8 s reduce over 2 chunks,
    own = bwd/v = 1, spacing = 4·bwd/v = 4: exposed reduce = max(tail, 4 − 1 + (2−1)·max(0, 4 − 4)) = 3; gather g = 2:
    max(first, 1 − 0.5 + max(0, 1 − 2)) = 0.5 (fwd 1 s); codec 0.1 × 1 pass. Total 3.6 (estimate.dp_step_exposed)."""
    parts = est.DPStepParts(10.0, 0.0, [8.0, 2.0], 0.01, 0.02, 0.1)
    stage = est.StageTime(3.0, 0.0, 0.0, 0.0, 1.0, 2.0, est.PhaseCost())
    assert est.dp_step_exposed(parts, stage, 4, 2, 8) == pytest.approx(3.0 + 0.5 + 0.1)
    grid = est.dp_step_exposed_s(8.0, 2.0, True, 0.01, 0.02, 0.1, 1.0, np.array([2.0, 4.0]), 4, 2, 8, 1)
    assert grid[0] == est.dp_step_exposed(parts, stage, 4, 2, 8)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(finite, finite, finite, finite, finite), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=96),
    st.integers(min_value=1, max_value=64),
)
def test_zero3_exposed_on_arrays_is_the_scalar_formula_elementwise(rows, units, m):
    """``zero3_exposed_s`` on arrays (search's ZeRO-3 grid) equals it on each element's floats (estimate), to the
    bit."""
    gf, gb, rs, fwd, bwd = (np.array(c) for c in zip(*rows))
    grid = est.zero3_exposed_s(gf, gb, rs, units, fwd, bwd, m)
    for i, row in enumerate(rows):
        assert grid[i] == est.zero3_exposed_s(*row[:3], units, *row[3:], m)


def test_zero3_exposed_by_hand():
    """FSDP over 4 units, m = 2: gathers 2 s (fwd) and 3 s (bwd), reduce-scatter 1 s, passes fwd 1.5 s, bwd 5 s: per
    micro-batch max(0, 2 − 1.5) + max(0, 3 + 1 − 5) + 2/4 = 1.0; the step 2 × 1.0 + the last unit's reduce 1/4."""
    assert est.zero3_exposed_s(2.0, 3.0, 1.0, 4, 1.5, 5.0, 2) == 2.25
    wl = build_workload(load_job(small_job(zero=3)))
    gf, gb, rs, units, nbytes = est.zero3_traffic(wl, Costs(load_job(small_job(zero=3))))
    assert units == wl.layers_per_stage and gf > 0 and gb > 0 and rs > 0 and nbytes > 0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=0.01, max_value=5.0), min_size=2, max_size=8),
    st.floats(min_value=0.0, max_value=0.5),
    st.integers(min_value=1, max_value=32),
    st.booleans(),
    st.sampled_from(["1f1b", "gpipe", "interleaved"]),
)
def test_sends_exposed_with_an_array_of_vp_is_the_scalar_formula(totals, t_send, m, overlap_pp, schedule):
    vps = np.array([1, 2, 4])
    grid = np.broadcast_to(est.sends_exposed(schedule, len(totals), vps, m, t_send, totals, overlap_pp), vps.shape)
    for i, v in enumerate(vps.tolist()):
        assert grid[i] == est.sends_exposed(schedule, len(totals), v, m, t_send, totals, overlap_pp)


# a few stage totals, drawn from a small set so that runs of equal stages (steady_cycle's ends) come up often
_stage_total = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.25])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(_stage_total, min_size=6, max_size=6), min_size=1, max_size=5),
    st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=5, max_size=5),
    st.integers(min_value=1, max_value=6),
    st.lists(st.integers(min_value=1, max_value=32), min_size=5, max_size=5),
    st.booleans(),
)
def test_pipeline_on_a_plan_axis_is_the_scalar_formula(plans, t_sends, p, ms, overlap_pp):
    """The search prices one split's 1F1B plans together (each stage's totals an array over the plans, a vp axis
    beside): the bubble and exposed sends of each plan and vp are those of its own stage list, to the last bit."""
    rows = [row[:p] for row in plans]
    n = len(rows)
    totals = list(np.array(rows).T)
    t_send, m, vps = np.array(t_sends[:n]), np.array(ms[:n]), np.array([1, 2, 4])[:, None]
    cycle = est.steady_cycle(totals, t_send)
    bubble = est.one_f_one_b_bubble(totals, vps)
    sends = np.broadcast_to(est.sends_exposed("1f1b", p, vps, m, t_send, totals, overlap_pp), (3, n))
    for x, row in enumerate(rows):
        assert cycle[x] == est.steady_cycle(row, t_sends[x])
        for y, v in enumerate((1, 2, 4)):
            assert bubble[y, x] == est.one_f_one_b_bubble(row, v)
            assert sends[y, x] == est.sends_exposed("1f1b", p, v, ms[x], t_sends[x], row, overlap_pp)


def test_steady_cycle_by_hand():
    """Four equal stages of 2 s, 1 s a send: a round trip over all 3 boundaries holds 4 passes and 6 sends per 4
    micro-batches, (8 + 6)/4 = 3.5 = T + 2(p − 1)/p·t_send (pp_exposed's uniform case); a slow middle stage paces
    [1, 3, 1] with 0.5 s sends itself (3 > (4 + 1)/2, (5 + 2)/3). As arrays (the plans side by side) the same."""
    assert est.steady_cycle([2.0] * 4, 1.0) == 3.5
    assert est.steady_cycle([1.0, 3.0, 1.0], 0.5) == 3.0
    both = est.steady_cycle([np.array([2.0, 1.0]), np.array([2.0, 3.0]), np.array([2.0, 1.0])], np.array([1.0, 0.5]))
    assert both.tolist() == [(6 + 4) / 3, 3.0]
    assert est.one_f_one_b_bubble([np.array([2.0, 1.0]), np.array([2.0, 3.0])], 2).tolist() == [1.0, 0.5]


PLANS = [
    {},
    {"pp": 4, "vp": 2, "micro_batch": 2},
    {"pp": 4, "recompute": "full", "overlap": {"tp": True}},
    {"pp": 2, "tp": 4, "sequence_parallel": True, "overlap": {"tp": True, "cp": True}, "cp": 2},
    {"pp": 1, "recompute": "selective"},
]


def _built_one_by_one(job):
    """The job under each recompute setting with its workload, their StageTimes built one by one by
    ``stage_times``, and empty-cached Costs for the batched path to fill."""
    variants = [job] + [job_with(job, recompute=r) for r in ("none", "selective", "full") if r != job.plan.recompute]
    pairs = [(j, build_workload(j)) for j in variants]
    one_by_one = Costs(job)
    one_by_one.stage_cache = {}
    expected = [est.stage_times(j, wl, one_by_one) for j, wl in pairs]
    batched = Costs(job)
    batched.stage_cache = {}
    return pairs, expected, batched


@pytest.mark.parametrize("plan", PLANS)
def test_prefilled_stages_are_the_stages_built_one_by_one(plan):
    """``prefill_stage_times`` (one array pass) leaves in the cache exactly the StageTimes ``stage_times`` builds one
    by one: every field, the link's groups in the same order, equal to the bit."""
    try:
        job = load_job(small_job(**plan))
    except SpecError as e:  # the plan list is hand-made: say which entry is wrong
        pytest.fail(f"{plan}: {e}")
    pairs, expected, batched = _built_one_by_one(job)
    returned = est.prefill_stage_times(pairs, batched, {})
    n_prefilled = len(batched.stage_cache)
    got = [est.stage_times(j, wl, batched) for j, wl in pairs]
    assert [[dataclasses.astuple(x) for x in stages] for stages in returned] == [
        [dataclasses.astuple(x) for x in stages] for stages in expected
    ]
    assert n_prefilled >= len({id(s) for stages in expected for s in stages})  # nothing left to build one by one
    for want, have in zip(expected, got):
        assert len(want) == len(have)
        for a, b in zip(want, have):
            assert dataclasses.astuple(a) == dataclasses.astuple(b)
            assert list(a.link.comm) == list(b.link.comm) and list(a.link.comm_bytes) == list(b.link.comm_bytes)


def test_prefilled_uneven_split_prices_each_kind_of_stage():
    """An uneven split (first and last stages lighter) has several kinds of middle stage: all priced at once."""
    job = load_job(small_job(pp=4, stage_layers=[7, 9, 9, 7]))
    wl = build_workload(job)
    one = Costs(job)
    one.stage_cache = {}
    batched = Costs(job)
    batched.stage_cache = {}
    est.prefill_stage_times([(job, wl)], batched, {})
    assert [dataclasses.astuple(s) for s in est.stage_times(job, wl, batched)] == [
        dataclasses.astuple(s) for s in est.stage_times(job, wl, one)
    ]


@pytest.mark.parametrize("plan", PLANS)
def test_activations_for_every_recompute_at_once_are_each_ones(plan):
    job = load_job(small_job(**plan))
    recomputes = ("none", "selective", "full")
    stages = list(range(job.plan.pp))
    rows = stage_activation_bytes_by_recompute(job, stages, recomputes)
    assert rows == [stage_activation_bytes(job, stages, r) for r in recomputes]
    # a layer's bytes do not read the pipeline: the search takes them from the plan's other vp / pp (same layer)
    for other in ({"vp": 1, "pp": 1}, {"pp": 4, "vp": 2, "schedule": "1f1b"}):
        try:
            variant = job_with(job, dp=None, stage_layers=None, **other)
        except SpecError:
            continue
        given = stage_activation_bytes_by_recompute(
            job, stages, recomputes, layer_bytes_by_recompute(variant, recomputes)
        )
        assert given == rows


def test_with_fields_is_dataclasses_replace():
    job = load_job(small_job())
    wl = build_workload(job)
    assert with_fields(wl, micro_batches=7, layers_per_stage=3) == dataclasses.replace(
        wl, micro_batches=7, layers_per_stage=3
    )
    assert wl.micro_batches != 7  # the original is untouched
    with pytest.raises(TypeError, match="no field 'micro_batch'"):
        with_fields(wl, micro_batch=2)


def test_the_workload_holds_the_ops_and_the_schedule_reads_the_plans_knobs():
    """A Workload describes the step's ops (which, how many, on which stage, cut how); the schedule's knobs come
    from ``job.plan`` (issue 17): no Workload field repeats a Plan field. ZeRO-3's gather policy is one: the same
    ops, gathered per FSDP unit with prefetch or per parameter tensor after a synchronize (DeepSpeed < v0.6), are
    priced by the plan the schedule is given."""
    from commtax.spec import Plan
    from commtax.workload.step import Workload

    assert {f.name for f in dataclasses.fields(Workload)} & set(Plan.model_fields) == set()
    job = load_job(small_job(pp=1, zero=3, recompute="selective"))
    legacy = job_with(job, zero3_gather="per_parameter_sync")
    wl = build_workload(job)
    assert build_workload(legacy) == wl  # the same ops: two gathers per micro-batch either way (no full recompute)
    costs = Costs(job)
    st = est.slowest_stage(est.stage_times(job, wl, costs))
    per_mb, nbytes = est.per_parameter_sync_time(legacy, wl, costs)
    m = wl.micro_batches
    assert est.dp_timeline(legacy, wl, costs, st) == (per_mb * m, per_mb * m, nbytes * m)  # nothing overlaps
    link, exposed, _ = est.dp_timeline(job, wl, costs, st)
    assert exposed < link  # prefetched: the gathers hide under the layers' compute


@pytest.mark.parametrize("plan", PLANS)
def test_a_splits_rows_read_at_once_are_each_pipelines_own(plan):
    """``PrefilledStages.split_rows`` (a search's 1F1B plans of one split at once): each plan's rank totals and slowest
    rank's fields (``SlowRow``) equal to the bit those read one by one (``pipeline_totals``, ``slowest_row``) and those
    of the StageTimes ``stage_times`` builds, the slowest the first of equals; no StageTime built."""
    job = load_job(small_job(**plan))
    pairs, expected, batched = _built_one_by_one(job)
    priced, wanted = est.prefill_stages(pairs, batched, {})
    counts = wanted[0][1]
    assert all(c == counts for _, c in wanted)  # the recompute variants of one job: one split
    totals, rows = priced.split_rows([base_key for base_key, _ in wanted], counts)
    assert len(batched.stage_cache) == 0
    for stages, (base_key, _), plan_totals, row in zip(expected, wanted, totals, rows):
        assert plan_totals.tolist() == [s.total for s in stages] == priced.pipeline_totals(base_key, counts)
        one = priced.slowest_row(base_key, counts, priced.pipeline_totals(base_key, counts))
        assert tuple(row) == tuple(one)
        assert row[:7] == est.slow_row(est.slowest_stage(stages))[:7]
        assert dataclasses.astuple(row.stage()) == dataclasses.astuple(est.slowest_stage(stages))


@pytest.mark.parametrize("plan", PLANS)
def test_prefilled_totals_and_slowest_stage_are_those_of_the_stages_built_one_by_one(plan):
    """``prefill_stages`` (what a search reads): every rank's total and the slowest rank's StageTime equal to the bit
    those of ``stage_times``, the slowest the first of equals (``slowest_stage``); only what was asked is built."""
    job = load_job(small_job(**plan))
    pairs, expected, batched = _built_one_by_one(job)
    priced, wanted = est.prefill_stages(pairs, batched, {})
    assert len(batched.stage_cache) == 0  # nothing built yet
    for stages, (base_key, counts) in zip(expected, wanted):
        totals = priced.pipeline_totals(base_key, counts)
        assert totals == [s.total for s in stages]
        slow = priced.slowest(base_key, counts, totals)
        assert dataclasses.astuple(slow) == dataclasses.astuple(est.slowest_stage(stages))
        assert list(slow.link.comm) == list(est.slowest_stage(stages).link.comm)
        assert [dataclasses.astuple(s) for s in priced.pipeline(base_key, counts)] == [
            dataclasses.astuple(s) for s in stages
        ]
    assert len({k for k in batched.stage_cache if len(k) == 4}) == len(priced.at)  # each kind built once, on demand


def test_new_workload_is_the_dataclass_construction():
    """``step.new_workload`` (what build_workload and pass_workload construct with): the record ``Workload(...)``
    builds, its fields in the same order, each default a new object where the dataclass makes one."""
    from commtax.workload.step import Workload, new_workload, pass_workload

    for path in ("examples/llama2-70b-h100.yaml", "examples/moe/deepseek-v3-h800.yaml"):
        job = load_job(path)
        for wl in (build_workload(job), pass_workload(job)):
            again = Workload(**{f.name: getattr(wl, f.name) for f in dataclasses.fields(Workload)})
            assert wl == again and list(vars(wl).items()) == list(vars(again).items())
    required = [f for f in dataclasses.fields(Workload) if f.default is f.default_factory is dataclasses.MISSING]
    given_only = {f.name: getattr(wl, f.name) for f in required}
    a, b = new_workload(**given_only), Workload(**given_only)
    assert list(vars(a).items()) == list(vars(b).items()) and a.params_per_gpu == {}
    assert a.params_per_gpu is not new_workload(**given_only).params_per_gpu  # default_factory: a dict each
    with pytest.raises(TypeError):
        new_workload(layer=wl.layer)  # a missing field: the dataclass's own refusal
