"""The step builder on tiny pipelines with hand-set costs: exact event traces written out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from commtax.costs.pricing import PhaseCost
from commtax.schedule.sim import SimOptions, simulate
from commtax.schedule.sim.step import StepBuilder
from commtax.spec import load_job
from commtax.workload.step import Block, Phase, build_workload, grad_bucket_bytes

EMPTY = Block("empty", Phase(()), Phase(()), Phase(()))


def tiny_job(pp=2, vp=1, schedule="1f1b", global_batch=2, dp=1, layers=None, zero=1, tp=1, **plan):
    layers = layers or pp * vp
    return load_job(
        {
            "model": {"layers": layers, "hidden": 256, "heads": 4, "vocab": 512, "source": "test"},
            "cluster": {
                "gpu": "h100-sxm5-80gb",
                "num_gpus": pp * dp * tp,
                "gpus_per_node": 1,
                "intra_node": "nvlink4",
                "inter_node": "ib-ndr",
                "nics_per_node": 1,
            },
            "plan": {
                "pp": pp,
                "vp": vp,
                "dp": dp,
                "tp": tp,
                "schedule": schedule,
                "recompute": "none",
                "zero": zero,
                **plan,
            },
            "training": {"seq_len": 128, "global_batch": global_batch},
        }
    )


class FakeCosts:
    """Forward 1 s and backward 2 s per layer, sends 0.5 s, DP collectives 0.25 s, optimizer 0 s."""

    cm = None  # no compute model: hidden traffic costs the compute nothing (no overlap contention)

    def __init__(self, wl, fwd=1.0, bwd=2.0, send=0.5, dp=0.25, tp=0.0):
        self.wl, self.fwd, self.bwd, self.send, self.dp, self.tp = wl, fwd, bwd, send, dp, tp
        self.stage_cache: dict = {}  # stage_times keeps its stages here, as Costs does

    def phase(self, ph):
        if ph is self.wl.layer.fwd:
            return PhaseCost(self.fwd, self.fwd, 0.0, {"tp": self.tp} if self.tp else {})
        if ph is self.wl.layer.bwd:
            return PhaseCost(self.bwd, self.bwd, 0.0, {"tp": self.tp} if self.tp else {})
        return PhaseCost()

    def collective(self, c):
        return self.send if c.group == "pp" else self.dp

    def sent_bytes(self, c):
        return c.bytes

    def compute(self, op):
        return 0.0


def uniform(job):
    """The job's workload with nothing on the embedding and the head: every stage the same."""
    wl = build_workload(job)
    params = {**wl.params_per_gpu, "embed": 0.0, "head": 0.0}
    return dataclasses.replace(wl, embed=EMPTY, head=EMPTY, params_per_gpu=params)


def run(job, **kw):
    wl = uniform(job)
    return simulate(
        job, workload=wl, costs=FakeCosts(wl, **kw), compare=False, options=SimOptions(nic_contention=False)
    )


def passes(r):
    """(stream, pass, stage, start) of every task but zero-length ones, by start time then creation."""
    sim = r.sim
    return [
        (f"{sim.streams[t.stream].name} {t.meta[3]}{t.meta[1]}", sim.streams[t.stream].device, t.start_s)
        for t in sorted(sim.tasks, key=lambda t: (t.start_s, t.id))
        if t.duration_s > 0
    ]


def test_1f1b_two_stages_two_microbatches_exact_trace():
    r = run(tiny_job(pp=2, schedule="1f1b"))
    # stage 0: F0, F1 (warm-up 1 + steady), waits for B0's gradient, then B0, waits, B1.
    # stage 1: F0 when F0's activation lands (1 + 0.5), B0, then F1 (arrived at 2.5, stream free at 4.5), B1.
    assert passes(r) == [
        ("compute F0", 0, 0.0),
        ("pp_fwd F0", 0, 1.0),
        ("compute F1", 0, 1.0),
        ("compute F0", 1, 1.5),
        ("pp_fwd F1", 0, 2.0),
        ("compute B0", 1, 2.5),
        ("pp_bwd B0", 1, 4.5),
        ("compute F1", 1, 4.5),
        ("compute B0", 0, 5.0),
        ("compute B1", 1, 5.5),
        ("pp_bwd B1", 1, 7.5),
        ("compute B1", 0, 8.0),
    ]
    b = r.breakdown
    assert b.step_time_s == 10.0  # m·(t_f + t_b) + (p−1)·(t_f + t_b) + 2(p−1)·t_send = 6 + 3 + 1
    assert b.breakdown_s["compute"] == 6.0
    assert b.breakdown_s["pp_bubble"] == 3.0  # (p−1)·(t_f + t_b)
    assert b.breakdown_s["pp_exposed"] == 1.0  # the fill: one send down, one back
    assert r.bubble_fraction == 0.5  # (p−1)/(v·m) = 1/2


def test_gpipe_two_stages_two_microbatches_exact_trace():
    r = run(tiny_job(pp=2, schedule="gpipe"))
    # GPipe: all forwards, then backwards last micro-batch first
    assert passes(r) == [
        ("compute F0", 0, 0.0),
        ("pp_fwd F0", 0, 1.0),
        ("compute F1", 0, 1.0),
        ("compute F0", 1, 1.5),
        ("pp_fwd F1", 0, 2.0),
        ("compute F1", 1, 2.5),
        ("compute B1", 1, 3.5),
        ("pp_bwd B1", 1, 5.5),
        ("compute B0", 1, 5.5),
        ("compute B1", 0, 6.0),
        ("pp_bwd B0", 1, 7.5),
        ("compute B0", 0, 8.0),
    ]
    assert r.breakdown.step_time_s == 10.0
    assert r.bubble_fraction == 0.5


def test_exposed_tp_sits_on_the_critical_path_and_overlapped_tp_hides():
    job = tiny_job(pp=1, layers=1, global_batch=2, tp=2)
    wl = uniform(job)
    serial = simulate(job, workload=wl, costs=FakeCosts(wl, tp=0.5, send=0.0), compare=False)
    # two micro-batches, each 1 s forward + 0.5 s TP + 2 s backward + 0.5 s TP
    assert serial.breakdown.step_time_s == 2 * (1 + 0.5 + 2 + 0.5)
    assert serial.breakdown.breakdown_s["tp_exposed"] == 2.0
    # comm-GEMM overlap cuts a pass into t = 2 chunks: the first chunk's 0.25 s has nothing to hide under
    job_ov = tiny_job(pp=1, layers=1, global_batch=2, tp=2, overlap={"tp": True})
    hidden = simulate(job_ov, workload=wl, costs=FakeCosts(wl, tp=0.5, send=0.0), compare=False)
    assert hidden.breakdown.step_time_s == 2 * (0.25 + 1 + 0.25 + 2)
    assert hidden.breakdown.breakdown_s["tp_exposed"] == 4 * 0.25
    long_tp = simulate(job_ov, workload=wl, costs=FakeCosts(wl, tp=1.5, send=0.0), compare=False)
    # forward: 0.75 s first chunk + max(0, 0.75 − 1) ; backward: 0.75 + max(0, 0.75 − 2)
    assert long_tp.breakdown.breakdown_s["tp_exposed"] == pytest.approx(2 * (0.75 + 0.75))


def test_gradient_buckets_overlap_backward_and_leave_a_tail():
    job = tiny_job(pp=1, layers=1, global_batch=4, dp=2, zero=0)
    wl = uniform(job)
    grads = wl.params_per_gpu["layers"] * 2  # bf16 gradients
    r = simulate(
        job,
        workload=wl,
        costs=FakeCosts(wl, send=0.0, dp=0.25),
        compare=False,
        options=SimOptions(bucket_bytes=grads / 4),
    )
    dp = [t for t in r.sim.tasks if t.kind == "dp"]
    # 4 buckets launched at 1/4, 2/4, 3/4 and the end of the last backward (2 s, from t = 4)
    assert [t.start_s for t in dp] == [4.5, 5.0, 5.5, 6.0]
    b = r.breakdown
    assert b.step_time_s == 2 * 3 + 0.25  # the last bucket is the exposed tail
    assert b.breakdown_s["dp_exposed"] == 0.25


def test_breakdown_parts_sum_to_step_time():
    r = run(tiny_job(pp=4, vp=2, global_batch=8))
    assert sum(r.breakdown.breakdown_s.values()) == pytest.approx(r.breakdown.step_time_s, rel=1e-12)


@pytest.mark.parametrize(
    "pp,vp,m,schedule",
    [
        (2, 1, 2, "1f1b"),
        (4, 1, 8, "1f1b"),
        (4, 1, 8, "gpipe"),
        (8, 1, 32, "1f1b"),
        (4, 2, 8, "1f1b"),
        (4, 3, 12, "1f1b"),
        (2, 4, 6, "1f1b"),
        (3, 2, 9, "1f1b"),
        # fewer micro-batches than stages: (m + p − 1)·t, so the bubble is still (p − 1)/m of the ideal time
        (4, 1, 2, "1f1b"),
        (4, 1, 3, "gpipe"),
        (8, 1, 1, "1f1b"),
    ],
)
def test_uniform_bubble_fraction_is_textbook(pp, vp, m, schedule):
    r = run(tiny_job(pp=pp, vp=vp, schedule=schedule, global_batch=m))
    assert r.bubble_fraction == pytest.approx((pp - 1) / (vp * m), rel=1e-9)  # Narayanan et al. 2021 §2.2


def test_1f1b_pays_two_sends_per_micro_batch_gpipe_only_the_fill():
    # 4 stages, 8 micro-batches, t_f = 1, t_b = 2, t_send = 0.5 (fake costs)
    one_f = run(tiny_job(pp=4, global_batch=8, schedule="1f1b")).breakdown
    gpipe = run(tiny_job(pp=4, global_batch=8, schedule="gpipe")).breakdown
    assert one_f.breakdown_s["pp_exposed"] == 2 * 8 * 0.5  # 2·m sends: the round trip of every micro-batch
    assert gpipe.breakdown_s["pp_exposed"] == 2 * (4 - 1) * 0.5  # 2(p−1): the fill down and back
    assert one_f.breakdown_s["pp_bubble"] == gpipe.breakdown_s["pp_bubble"] == (4 - 1) * 3.0


def test_interleaved_two_stages_two_chunks_two_microbatches_exact_trace():
    r = run(tiny_job(pp=2, vp=2, schedule="1f1b"))  # 4 layers: virtual stages (s0,c0) (s1,c0) (s0,c1) (s1,c1)
    sim = r.sim

    def compute(stage):
        s = next(s for s in sim.streams if s.device == stage and s.name == "compute")
        return [
            (f"{t.meta[3]}{t.meta[1]}c{t.meta[2]}", t.start_s)
            for t in (sim.tasks[i] for i in s.tasks)
            if t.duration_s > 0
        ]

    # stage 0 warms up with all 4 forwards (2(p−1) + (v−1)·p = 4); stage 1 with 2, then 1F1B
    assert compute(0) == [
        ("F0c0", 0.0),
        ("F1c0", 1.0),
        ("F0c1", 3.0),
        ("F1c1", 4.0),
        ("B0c1", 8.0),
        ("B1c1", 11.0),
        ("B0c0", 13.0),
        ("B1c0", 16.0),
    ]
    assert compute(1) == [
        ("F0c0", 1.5),
        ("F1c0", 2.5),
        ("F0c1", 4.5),
        ("B0c1", 5.5),
        ("F1c1", 7.5),
        ("B1c1", 8.5),
        ("B0c0", 10.5),
        ("B1c0", 13.5),
    ]
    b = r.breakdown
    assert b.step_time_s == 18.0
    assert b.breakdown_s["compute"] == 12.0  # 2 micro-batches × 2 chunks × (1 + 2)
    assert b.breakdown_s["pp_bubble"] == 3.0  # (p−1)/v × 6 s of work per micro-batch: (p−1)/(v·m) = 1/4
    assert b.breakdown_s["pp_exposed"] == 3.0  # what the 0.5 s sends add to the step


def test_a_replica_is_simulated_once_whatever_the_data_parallel_size():
    small = simulate(tiny_job(pp=2, dp=2, global_batch=8), compare=False)
    large = simulate(tiny_job(pp=2, dp=1024, global_batch=4096), compare=False)
    assert small.builder.m == large.builder.m == 4
    assert small.events == large.events  # DP only changes collective costs, not the graph


def test_default_buckets_are_the_frameworks_as_the_cli_and_the_estimate_take_them():
    # Megatron-Core buckets max(40e6, 1e6·dp) parameters (catalog/frameworks.yaml), here 40e6 × 4 B = 160 MB; a Python
    # caller of simulate(job) gets what `commtax simulate` and the estimate use, not PyTorch DDP's 25 MiB
    job = tiny_job(pp=2, dp=2, global_batch=4, framework="megatron-core")
    assert grad_bucket_bytes(job) == 160e6
    assert StepBuilder(job).options.bucket_bytes == 160e6
    assert StepBuilder(job, options=SimOptions(bucket_bytes=2**20)).options.bucket_bytes == 2**20
    assert StepBuilder(tiny_job(pp=2, dp=2, global_batch=4)).options.bucket_bytes == 25 * 2**20  # custom: DDP's
