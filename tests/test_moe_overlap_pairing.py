"""The EP all-to-all overlap priced per layer piece as Megatron-Core's combined 1F1B pairs them
(``schedule.analytical.paired_exposed``, ``unpaired_share``; ``workload.moe.overlap_phases``)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.pricing import Costs, OverlapPieces
from commtax.schedule.analytical import (
    ep_exposed,
    ep_link,
    estimate,
    moe_pieces,
    paired_exposed,
    rank_unpaired_share,
    unpaired_share,
)
from commtax.spec import job_with, load_job
from commtax.workload.moe import OVERLAP_PIECES, overlap_phases, overlap_piece
from commtax.workload.step import build_workload

# a toy MoE layer (ms): attention side, routed experts (backward: input gradient, delayed weight gradient), exchanges
TOY = OverlapPieces(
    attn_f=2.0,
    mlp_f=3.0,
    dispatch_f=1.0,
    combine_f=4.0,
    attn_b=3.0,
    attn_w=1.0,
    mlp_b=2.0,
    mlp_w=2.0,
    dispatch_b=6.0,
    combine_b=1.0,
)


def two_streams(p: OverlapPieces, layers: int) -> float:
    """One chunk pair of ``layers`` equal MoE layers, issued in TransformerLayerSchedulePlan.run's order
    (model_chunk_schedule_plan.py @d98e8a6) on a compute and a comm stream; each pass's nodes wait for the event its
    previous node recorded (ScheduleNode.stream_acquire_context), backward_dw records none. Returns the makespan."""
    comp = comm = f_ev = b_ev = 0.0
    for _ in range(layers):
        comm = b_ev = max(comm, b_ev) + p.combine_b  # b_layer.moe_combine.backward
        comp = f_ev = max(comp, f_ev) + p.attn_f  # f_layer.pre_dispatch_computation.forward
        comp = b_ev = max(comp, b_ev) + p.mlp_b  # b_layer.mlp.backward
        comm = f_ev = max(comm, f_ev) + p.dispatch_f  # f_layer.moe_dispatch.forward
        comp += p.mlp_w  # b_layer.mlp.backward_dw (no event)
        comm = b_ev = max(comm, b_ev) + p.dispatch_b  # b_layer.moe_dispatch.backward
        comp = f_ev = max(comp, f_ev) + p.mlp_f  # f_layer.mlp.forward
        comm = f_ev = max(comm, f_ev) + p.combine_f  # f_layer.moe_combine.forward
        comp = b_ev = max(comp, b_ev) + p.attn_b  # b_layer.pre_dispatch_computation.backward
        comp += p.attn_w  # backward_dw (the last layer's after the sends, still on the compute stream)
    return max(comp, comm)


def test_toy_layer_by_hand():
    # s1 = max(C_b 1, A_f 2) = 2; M_b 2-4, M_w 4-6 beside D_f 2-3; D_b waits for M_b: 4-10, M_f waits for D_f and
    # M_w: 6-9; s3 = 10; C_f 10-14 beside A_b 10-13, A_w 13-14: 14 ms against 13 ms of compute, 1 ms exposed
    # (the dispatch backward beyond the experts' weight gradient and forward)
    assert TOY.compute == 13.0
    assert two_streams(TOY, 1) == 14.0
    assert paired_exposed(TOY, 1, 1) == 1.0
    # two layers: + attn half-cycle max(max(C_f, A_b) + C_b, max(A_b + A_w, C_f) + A_f) = max(5, 6) = 6 and one
    # more mlp half-cycle max(2 + 6, 4 + 3) = 8: 2 + 8 + 6 + 8 + 4 = 28 against 26
    assert two_streams(TOY, 2) == 28.0
    assert paired_exposed(TOY.scaled(2), 2, 1) == 2.0
    # two chunk pairs of one layer each: the chunk ends twice
    assert paired_exposed(TOY.scaled(2), 2, 2) == 2 * paired_exposed(TOY, 1, 1)


def test_nothing_to_hide_under_exposes_every_exchange():
    comm_only = OverlapPieces(dispatch_f=1.0, combine_f=2.0, dispatch_b=3.0, combine_b=4.0)
    assert paired_exposed(comm_only, 1, 1) == 10.0
    short = OverlapPieces(attn_f=5, mlp_f=5, attn_b=5, attn_w=1, mlp_b=5, mlp_w=1, dispatch_f=1, combine_f=1)
    assert paired_exposed(short, 1, 1) == 0.0  # each exchange shorter than the compute it runs beside


piece = st.floats(0.0, 10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.tuples(*[piece] * 10), st.integers(1, 6))
def test_pairing_formula_is_the_two_stream_timeline(values, layers):
    # the closed form against the issue order played out on two streams, for any pieces and layers per chunk
    p = OverlapPieces(*values)
    link = p.dispatch_f + p.combine_f + p.dispatch_b + p.combine_b
    exposed = paired_exposed(p.scaled(layers), layers, 1)
    assert exposed == pytest.approx(two_streams(p, layers) - layers * p.compute, abs=1e-9)
    assert -1e-9 <= exposed <= layers * link + 1e-9


def qwen3(num_gpus=64, global_batch=64, **plan):
    return load_job(
        {
            "model": "qwen3-30b-a3b",
            "cluster": {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr", "num_gpus": num_gpus},
            "plan": {"ep": 8, **plan},
            "training": {"seq_len": 4096, "global_batch": global_batch},
        }
    )


def test_unpaired_passes_follow_the_schedules_counts():
    j = qwen3(pp=4, vp=2, moe_a2a_overlap=True)
    # interleaved: W = 2(p − r − 1) + (v − 1)·p + 1 of m·v = 16 forwards: 11, 9, 7, 5; over the ranks p/m
    assert [rank_unpaired_share(j, r, 8) for r in range(4)] == [11 / 16, 9 / 16, 7 / 16, 5 / 16]
    assert unpaired_share(j, 8) == 4 / 8
    assert rank_unpaired_share(j, 0, 2) == 1.0  # fewer passes than warm-up forwards: none paired
    # no pipelining: the first forward and the last backward of m
    assert unpaired_share(qwen3(moe_a2a_overlap=True), 8) == 1 / 8
    # DualPipe, p = 4, m = 8 (dualpipe.py step): rank 0 pairs 2 in step 4 and 1 in step 5, the middle rank 1 pairs
    # 2 × 2 − 1 in step 4: 3 of 8 each
    d = qwen3(global_batch=128, pp=4, schedule="dualpipe")
    assert [rank_unpaired_share(d, r, 8) for r in range(4)] == [5 / 8] * 4


def test_pieces_are_the_layer_split_as_megatron_runs_it():
    job = load_job("examples/moe/deepseek-v3-h800.yaml")
    wl = build_workload(job)
    phases = dict(zip(OVERLAP_PIECES, overlap_phases(wl.moe_layer)))
    names = {k: {o.name for o in ph.ops} for k, ph in phases.items()}
    assert {"ep_dispatch"} == names["dispatch_f"] and {"ep_combine_bwd"} == names["combine_b"]
    assert {"router", "permute", "shared_up", "attention"} <= names["attn_f"]  # pre_dispatch_computation
    assert {"expert_up", "expert_down", "unpermute"} <= names["mlp_f"]
    assert "expert_up_wgrad" in names["mlp_w"] and "shared_up_wgrad" in names["attn_w"]
    assert "router_wgrad" in names["attn_b"]  # the router's weight gradient is not delayed
    assert overlap_piece("expert_activation_clamp_bwd", True) == "mlp_b"
    # every op of the layer's passes in one piece (the recompute's exchanges apart): the pieces sum to the passes
    c = Costs(job)
    p = moe_pieces(wl, c)
    f, b, r = (c.phase(getattr(wl.moe_layer, w)) for w in ("fwd", "bwd", "recompute"))
    assert p.compute == pytest.approx(f.compute + b.compute + r.compute, rel=1e-12)
    assert p.dispatch_f + p.combine_f + p.dispatch_b + p.combine_b == pytest.approx(ep_link(f) + ep_link(b))


def test_overlap_exposes_the_unpaired_share_at_least():
    j = qwen3(num_gpus=32, pp=2, vp=2, moe_a2a_overlap=True)
    b, plain = estimate(j), estimate(job_with(j, moe_a2a_overlap=False))
    link = plain.breakdown_s["ep_exposed"]
    assert unpaired_share(j, build_workload(j).micro_batches) * link <= b.breakdown_s["ep_exposed"] < link
    assert b.comm_time_s["ep"] == pytest.approx(plain.comm_time_s["ep"])  # the same wire time, less of it waited for


def test_no_overlap_exposes_all():
    job = load_job("examples/moe/deepseek-v3-h800.yaml")
    j = job_with(job, schedule="1f1b")
    c, wl = Costs(j), build_workload(j)
    f, b, r = (c.phase(getattr(wl.moe_layer, w)) for w in ("fwd", "bwd", "recompute"))
    assert ep_exposed(j, f, b, r, c.cm) == (ep_link(f), ep_link(b) + ep_link(r))


def test_simulate_explain_names_the_priced_pairing():
    from commtax.schedule.sim import simulate
    from commtax.schedule.sim.explain import explain

    j = qwen3(num_gpus=32, pp=2, vp=2, moe_a2a_overlap=True)
    r = simulate(j, compare=True)
    lines = [x for x in explain(r) if x.startswith("EP overlap")]
    assert len(lines) == 1 and "does not pair passes itself" in lines[0]
    assert f"{unpaired_share(j, build_workload(j).micro_batches):.1%} of the passes" in lines[0]
    assert r.breakdown.step_time_s == pytest.approx(estimate(j).step_time_s, rel=0.02)


def test_search_prices_the_pairing_as_estimate():
    # the search's MoE stages read the same pieces and shares: vp 2 and 4 pair different chunks and warm-ups
    from commtax.decide.search import job_for, search
    from commtax.decide.space import Space

    job = qwen3(global_batch=256, pp=4, vp=2, moe_a2a_overlap=True)
    space = Space.parse({"vp": "2,4", "micro_batch": "1", "zero": "1", "recompute": "none", "tp": "1", "cp": "1"})
    res = search(job, space, workers=1)
    rows = [res.row(int(i)) for i in res.order]
    assert {r.vp for r in rows} == {2, 4}
    for i in res.order:
        assert res.step_s[i] == pytest.approx(estimate(job_for(job, res.row(int(i)))).step_time_s, rel=1e-9)
