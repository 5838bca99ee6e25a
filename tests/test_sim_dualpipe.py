"""DualPipe in the simulator (DeepSeek-V3 report §3.2.1, Fig. 5; deepseek-ai/DualPipe ``dualpipe.py``): the order
of chunks per rank, the step of a tiny pipeline by hand, and the agreement with estimate or the effect named."""

from __future__ import annotations

import pytest
from test_moe_sim_agreement import moe_job
from test_sim_step import run, tiny_job

from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.schedule.sim import DDP_BUCKET_BYTES, SimOptions, simulate
from commtax.schedule.sim.explain import explain
from commtax.schedule.sim.pipeline import by_stage, dependency_order, dualpipe, dualpipev
from commtax.spec import job_with, load_job

# PP 4, 8 micro-batches: chunk 0 (the pipeline fed at rank 0) takes micro-batches 0-3, chunk 1 (fed at rank 3)
# 4-7. Written out from the reference's eight steps with h = min(r, 3 - r):
# nF0 (2(1-h)), nF0F1 (h+1), nB1W1F1 (1-h, zero bubble: W at once), nF0B1F1B0 (h+1: the overlapped pairs),
# nB1F1B0 (1-h), nB1B0 (h+1; its second half defers W), nWB0 (1-h), nW (h+1). Ranks 2, 3 swap the chunks.
ORDER = [
    "F0.0 F0.1 F0.2 F1.4 B1.4 W1.4 F1.5 F0.3 B1.5 W1.5 F1.6 B0.0 W0.0 B1.6 W1.6 F1.7 B0.1 W0.1 B1.7 W1.7 B0.2 W0.2 "
    "B0.3 W0.3",
    "F0.0 F1.4 F0.1 F1.5 F0.2 B1.4 W1.4 F1.6 B0.0 W0.0 F0.3 B1.5 W1.5 F1.7 B0.1 W0.1 B1.6 W1.6 B0.2 W0.2 B1.7 B0.3 "
    "W1.7 W0.3",
    "F1.4 F0.0 F1.5 F0.1 F1.6 B0.0 W0.0 F0.2 B1.4 W1.4 F1.7 B0.1 W0.1 F0.3 B1.5 W1.5 B0.2 W0.2 B1.6 W1.6 B0.3 B1.7 "
    "W0.3 W1.7",
    "F1.4 F1.5 F1.6 F0.0 B0.0 W0.0 F0.1 F1.7 B0.1 W0.1 F0.2 B1.4 W1.4 B0.2 W0.2 F0.3 B1.5 W1.5 B0.3 W0.3 B1.6 W1.6 "
    "B1.7 W1.7",
]


def test_dualpipe_order_of_chunks_per_rank_pp4_8_micro_batches():
    order = by_stage(dualpipe(4, 8), 4)
    assert [" ".join(f"{x.phase}{x.chunk}.{x.mb}" for x in passes) for passes in order] == ORDER
    # every rank: each micro-batch of its direction forward, backward and weight gradient once
    for passes in order:
        assert sorted((x.chunk, x.mb, x.phase) for x in passes) == sorted(
            (c, i, ph) for c in (0, 1) for i in range(4 * c, 4 * c + 4) for ph in "FBW"
        )
    assert len(list(dependency_order(order, 4, 2, dual="dualpipe"))) == 96  # runs without deadlock


def test_dualpipe_refuses_what_the_reference_refuses():
    with pytest.raises(SpecError, match="even"):
        list(dualpipe(4, 7))
    with pytest.raises(SpecError, match="2·pp"):
        list(dualpipe(4, 6))


def test_dualpipe_step_by_hand_pp4_8_micro_batches():
    # one layer per stage, F = 1 s, B = 2 s split into B = W = 1 s (zero-bubble), sends free: each rank works
    # 8 × 3 = 24 s; the bubble is (PP/2 − 1)(F&B + B − 3W) = 1 · (3 + 1 − 3) = 1 s (DeepSeek-V3 Table 2): rank 0
    # idles 22-23 s waiting for micro-batch 3's gradient from rank 1. 1F1B on the same job: (p − 1)(F + B) = 9 s.
    r = run(tiny_job(pp=4, schedule="dualpipe", global_batch=8), send=0.0, dp=0.0)
    assert r.breakdown.step_time_s == pytest.approx(25.0)
    assert r.breakdown.breakdown_s["compute"] == pytest.approx(24.0)
    assert r.breakdown.breakdown_s["pp_bubble"] == pytest.approx(1.0)
    starts = [t.start_s for t in r.sim.tasks if r.sim.streams[t.stream].device == 0 and t.meta[3] in "FBW"]
    assert sorted(starts)[-2:] == [23.0, 24.0]  # B3, W3 after the 1 s wait
    assert run(tiny_job(pp=4, schedule="1f1b", global_batch=8), send=0.0, dp=0.0).breakdown.step_time_s == 33.0
    assert not any("1F1B order" in n for n in r.breakdown.notes)


def test_dualpipe_odd_micro_batches_refused_as_the_reference_does():
    # deepseek-ai/DualPipe dualpipe.py DualPipe.step: assert num_chunks % 2 == 0; dualpipev.py has no such rule
    with pytest.raises(SpecError, match=r"even number of micro-batches per replica, got 9.*global_batch"):
        tiny_job(pp=4, schedule="dualpipe", global_batch=9)
    assert tiny_job(pp=4, schedule="dualpipev", global_batch=9).plan.schedule == "dualpipev"


def test_deepseek_v3_dualpipe_agrees_with_estimate_within_2_percent():
    # the report's configuration: PP16 DualPipe, EP64 over 8 nodes, 120 micro-batches (before moe7, in 1F1B order,
    # simulate was 9.3% slower), under full recompute: a middle stage (4 MoE layers) paces both
    job = job_with(load_job("examples/moe/deepseek-v3-h800.yaml"), recompute="full")
    e, s = estimate(job), simulate(job).breakdown
    assert s.step_time_s == pytest.approx(e.step_time_s, rel=0.02)
    assert s.breakdown_s["ep_exposed"] == pytest.approx(e.breakdown_s["ep_exposed"], rel=1e-6)


def test_deepseek_v3_example_priced_per_rank_agrees_within_2_percent():
    # the example recomputes only the norms and MLA up-projections (arXiv 2412.19437 §3.2.3): its last stage (one
    # decoder layer, the MTP module, two output heads) is the slowest stage, but DualPipe runs it on rank 0 beside the
    # lighter first stage; both price the ranks, m/2 micro-batches through each of their two stages (before issue 18
    # the estimate charged m × the last stage: 18.22 s against 16.38 s simulated, -10.1%)
    job = load_job("examples/moe/deepseek-v3-h800.yaml")
    r = simulate(job, compare=True)  # the framework's gradient buckets (Megatron-Core's), as `commtax simulate`
    s, e = r.breakdown, r.estimate
    assert s.breakdown_s["compute"] == pytest.approx(e.breakdown_s["compute"], rel=1e-9)
    assert s.breakdown_s["ep_exposed"] == pytest.approx(e.breakdown_s["ep_exposed"], rel=1e-6)
    # the step is ~2% below the estimate: all but 0.2% of it is the bubble --explain names (the simulator plays each
    # forward-backward pair as two passes; the paper's formula prices the pair as one)
    assert -0.03 < s.step_time_s / e.step_time_s - 1 < 0
    named = e.breakdown_s["pp_bubble"] - s.breakdown_s["pp_bubble"]
    assert abs(e.step_time_s - s.step_time_s - named) < 0.002 * e.step_time_s
    line = [x for x in explain(r) if x.startswith("DualPipe")]
    assert len(line) == 1 and "60 micro-batches fed at rank 0" in line[0] and "(PP/2 − 1)(F&B + B − 3W)" in line[0]
    assert any(
        n.startswith("DualPipe priced per pipeline rank") and "rank 1 (model stages 1 and 14)" in n for n in e.notes
    )
    # PyTorch DDP's 25 MiB buckets (`--bucket-mb 25`): more, smaller reductions, and the step still within 2%
    ddp = simulate(job, SimOptions(bucket_bytes=DDP_BUCKET_BYTES)).breakdown
    assert ddp.step_time_s == pytest.approx(e.step_time_s, rel=0.02)


def test_dualpipe_pairing_of_uneven_stages_agrees():
    # Qwen3-30B-A3B PP4: the last stage carries the 151k-vocab head. DualPipe runs it on ranks 0 and 3, each with the
    # other end's stage, half the micro-batches each; rank 0 is the busiest and its own work spans the step (no
    # bubble simulated; the estimate's fill through rank 0 outlasts rank 1's lighter work by 0.9 ms). Before issue
    # 18 the estimate charged m × the last stage: simulate was 14% faster
    job = moe_job("qwen3-30b-a3b", 32, 8, 64, pp=4, ep=8, schedule="dualpipe")
    r = simulate(job, compare=True)
    e, s = r.estimate, r.breakdown
    assert s.breakdown_s["compute"] == pytest.approx(e.breakdown_s["compute"], rel=1e-9)
    assert s.breakdown_s["pp_bubble"] == 0.0 and e.breakdown_s["pp_bubble"] < 0.002 * e.step_time_s
    assert s.step_time_s == pytest.approx(e.step_time_s, rel=0.02)
    line = [x for x in explain(r) if x.startswith("DualPipe")]
    assert len(line) == 1 and "4 micro-batches fed at rank 0" in line[0] and "2× parameters" in line[0]


def test_dualpipev_order_of_chunks_per_rank_pp4_8_micro_batches():
    # DualPipeV (dualpipev.py): one V of 8 virtual stages, every micro-batch through chunk 0 then chunk 1; the same
    # eight steps with h = r and all 8 micro-batches per chunk. Rank 0: nF0 = 6, nF0F1 = 1, nB1W1F1 = 3,
    # nF0B1F1B0 = 1, nB1F1B0 = 3, nB1B0 = 1 (B0 deferred), nWB0 = 3, nW = 1
    order = by_stage(dualpipev(4, 8), 4)
    assert " ".join(f"{x.phase}{x.chunk}.{x.mb}" for x in order[0]) == (
        "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2 F1.3 F0.7 B1.3 W1.3 F1.4 "
        "B0.0 W0.0 B1.4 W1.4 F1.5 B0.1 W0.1 B1.5 W1.5 F1.6 B0.2 W0.2 B1.6 W1.6 F1.7 B0.3 W0.3 B1.7 W1.7 B0.4 W0.4 "
        "B0.5 W0.5 B0.6 W0.6 B0.7 W0.7"
    )
    assert [x.phase + str(x.chunk) for x in order[3][:9]] == ["F0", "F1"] * 4 + ["F0"]  # nF0F1 = 4, then nF0B1F1B0
    assert len(list(dependency_order(order, 4, 2, dual="dualpipev"))) == 192


def test_dualpipev_still_runs_in_1f1b_order_and_says_so():
    r = run(tiny_job(pp=4, schedule="dualpipev", global_batch=8), send=0.0, dp=0.0)
    assert r.breakdown.step_time_s == pytest.approx(8 * 3 + 9)
    assert any("dualpipev simulated in 1F1B order" in n for n in r.breakdown.notes)


def test_dualpipe_with_zero3_runs_in_1f1b_order_and_says_so():
    r = run(tiny_job(pp=4, schedule="dualpipe", global_batch=16, dp=2, zero=3), send=0.0, dp=0.0)
    assert r.breakdown.step_time_s == pytest.approx(8 * 3 + 9)
    assert any("1F1B order" in n and "ZeRO-3" in n for n in r.breakdown.notes)
