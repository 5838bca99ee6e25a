"""Clusters of GPU pools (spec/pools.py, costs/pools.py, schedule/pools.py): spec rules and hand-worked prices."""

from __future__ import annotations

import copy

import pytest

from commtax.costs.pools import cross_pool_level
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import load_job
from commtax.units import GBIT

FAST = {"name": "fast", "peak_tflops": {"bf16": 200.0}, "mem_GiB": 80, "mem_bw_GBps": 2000, "sms": 108}
SLOW = {"name": "slow", "peak_tflops": {"bf16": 100.0}, "mem_GiB": 80, "mem_bw_GBps": 1000, "sms": 108}
NET = {"bw_Gbps": 200, "latency_us": 10, "efficiency": 1.0}
LINK = {"kind": "nvlink", "bw_GBps": 200, "latency_us": 5, "efficiency": 1.0}


def pool(name, gpu, n=8, **kw):
    return {
        "name": name,
        "gpu": gpu,
        "num_gpus": n,
        "gpus_per_node": 8,
        "intra_node": LINK,
        "inter_node": NET,
        "nics_per_node": 8,
        **kw,
    }


def job(pools, inter_pool=None, **plan):
    cluster = {"pools": pools} | ({"inter_pool": inter_pool} if inter_pool else {})
    return {
        "model": "llama2-7b",
        "cluster": cluster,
        "plan": {"tp": 8, "pp": 2, "micro_batch": 1, "recompute": "none", **plan},
        "training": {"seq_len": 2048, "global_batch": 16, "precision": "bf16"},
    }


def homogeneous(gpu, n=16, **plan):
    return {
        "model": "llama2-7b",
        "cluster": {
            "gpu": gpu,
            "num_gpus": n,
            "gpus_per_node": 8,
            "intra_node": LINK,
            "inter_node": NET,
            "nics_per_node": 8,
        },
        "plan": {"tp": 8, "pp": 2, "micro_batch": 1, "recompute": "none", **plan},
        "training": {"seq_len": 2048, "global_batch": 16, "precision": "bf16"},
    }


def test_top_level_is_the_first_pool_and_num_gpus_the_sum():
    j = load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"]))
    assert j.cluster.gpu.name == "fast" and j.cluster.num_gpus == 16 and j.dp == 1


def test_cross_pool_level_is_the_slowest_link_crossed():
    j = load_job(
        job(
            [pool("a", FAST), pool("b", SLOW, nics_per_node=2)],
            {"bw_Gbps": 100, "efficiency": 1.0},
            stage_pools=["a", "b"],
        )
    )
    # pool b's share of its NICs: 2 NICs · 200 Gb/s / 8 GPUs = 50 Gb/s; the link: 100 Gb/s over 8 streams = 12.5
    lv = cross_pool_level(j, [0, 1], flows=8)
    assert lv.bw_bytes_per_s == pytest.approx(100 * GBIT / 8)
    assert lv.latency_s == pytest.approx(10e-6 + 20e-6)  # the slower NIC's α, then the link's (default 20 µs)
    # over the shared network: the slower pool's NIC share
    j2 = load_job(job([pool("a", FAST), pool("b", SLOW, nics_per_node=2)], stage_pools=["a", "b"]))
    assert cross_pool_level(j2, [0, 1], flows=8).bw_bytes_per_s == pytest.approx(2 * 200 * GBIT / 8)


def test_pipeline_follows_the_slowest_stage_hand_worked():
    b = estimate(load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"])))
    fast, slow = b.pools
    assert slow["straggler"] and not fast["straggler"]
    t_fast, t_slow = fast["stage_s"][0], slow["stage_s"][0]
    assert t_slow > 1.5 * t_fast  # half the peak and half the memory bandwidth
    m = 16
    # 1F1B, v = 1 (Narayanan et al. 2021 §2.2): m · T_max on the slowest stage, bubble = Σ_{s≠max} T_s
    assert b.breakdown_s["pp_bubble"] == pytest.approx(t_fast)
    assert b.breakdown_s["compute"] + b.breakdown_s["tp_exposed"] == pytest.approx(m * t_slow)
    whole_fast = estimate(load_job(homogeneous(FAST))).step_time_s
    whole_slow = estimate(load_job(homogeneous(SLOW))).step_time_s
    assert whole_fast < b.step_time_s < whole_slow


def test_more_layers_on_the_fast_pool_is_faster():
    even = estimate(load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"])))
    shifted = estimate(load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"], stage_layers=[21, 11])))
    assert shifted.step_time_s < even.step_time_s
    assert shifted.pools[0]["layers"] == [21] and shifted.pools[1]["layers"] == [11]


def test_identical_pools_price_as_one_cluster():
    one = estimate(load_job(homogeneous(FAST, n=32)))
    dp = estimate(load_job(job([pool("a", FAST, 16), pool("b", FAST, 16)])))
    assert dp.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)
    assert dp.mfu == pytest.approx(one.mfu, rel=1e-9)
    stages = estimate(load_job(homogeneous(FAST, n=16)))
    on_pools = estimate(load_job(job([pool("a", FAST), pool("b", FAST)], stage_pools=["a", "b"])))
    assert on_pools.step_time_s == pytest.approx(stages.step_time_s, rel=1e-3)


def test_batch_share_moves_work_to_the_fast_pool():
    pools = [pool("a", FAST, 16), pool("b", SLOW, 16)]
    even = estimate(load_job(job(pools)))
    assert even.pools[1]["straggler"]
    shifted = estimate(load_job(job(pools, pool_batch_share=[0.625, 0.375])))  # 10 and 6 of 16 sequences
    assert shifted.step_time_s < even.step_time_s
    assert shifted.pools[0]["micro_batches"] == 10 and shifted.pools[1]["micro_batches"] == 6


def test_mfu_is_against_the_mean_peak():
    b = estimate(load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"])))
    # model FLOP/s per GPU over (8·200 + 8·100)/16 = 150 TFLOP/s
    assert b.mfu == pytest.approx(b.tflops_per_gpu / 150.0)


def test_memory_is_checked_per_pool():
    small = dict(SLOW, mem_GiB=4)
    b = estimate(load_job(job([pool("a", FAST), pool("b", small)], stage_pools=["a", "b"])))
    assert not b.fits and b.pools[0]["fits"] and not b.pools[1]["fits"]
    assert any("pool b" in n and "GiB" in n for n in b.notes)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            lambda d: (d["cluster"]["pools"][1].update(num_gpus=24), d["plan"].update(tp=16, pp=1, stage_pools=None)),
            "TP \\(and CP, EP\\) group stays inside one pool",
        ),
        (lambda d: d["plan"].update(stage_pools=["a"]), "one pool per stage"),
        (lambda d: d["plan"].update(stage_pools=["a", "a"]), "pool a has 8 GPUs"),
        (lambda d: d["plan"].update(stage_pools=["a", "c"]), "no pool named 'c'"),
        (lambda d: d["cluster"].update(gpu="h100-sxm5-80gb"), "gives gpu per pool"),
        (lambda d: d["plan"].update(pool_batch_share=[0.5, 0.5]), "only for data parallelism across pools"),
    ],
)
def test_refusals_name_the_rule(change, needle):
    d = job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"])
    d = copy.deepcopy(d)
    change(d)
    with pytest.raises(SpecError, match=needle):
        load_job(d)


def test_shares_must_fit_the_replicas():
    d = job([pool("a", FAST, 16), pool("b", SLOW, 16)], pool_batch_share=[0.7, 0.3])
    with pytest.raises(SpecError, match="pool_batch_share"):
        load_job(d)


def test_a_list_of_gpus_points_to_pools():
    d = homogeneous(["a100-sxm4-80gb", "rtx-4090-24gb"])
    with pytest.raises(SpecError, match="cluster.pools"):
        load_job(d)


def test_stage_pools_need_pools():
    with pytest.raises(SpecError, match="needs a cluster with pools"):
        load_job(homogeneous(FAST, stage_pools=[0, 0]))


def test_worked_example_loads_and_names_the_straggler():
    b = estimate(load_job("examples/pools/llama2-70b-a100-4090.yaml"))
    assert b.pools is not None and len(b.pools) == 2
    assert sum(x["straggler"] for x in b.pools) == 1
    assert "pools" in b.to_dict()
    assert "pools" not in estimate(load_job("examples/llama2-70b-h100.yaml")).to_dict()


def test_anchors_metis_and_sailor_hand_worked():
    """Two stages on two pools, T = 1 s and 2 s per micro-batch, m = 4, one send t = 0.1 s, a DP all-reduce of
    0.5 s on the link (0.05 s of it exposed after overlap), as docs/pools.md works it by hand."""
    from commtax.costs.pricing import PhaseCost
    from commtax.schedule.analytical import StageTime, pipeline_bubble, sends_exposed

    T, m, t, ar, ar_exposed = [1.0, 2.0], 4, 0.1, 0.5, 0.05
    stages = [StageTime(x, 0.0, 0.0, 0.0, x / 3, 2 * x / 3, PhaseCost()) for x in T]
    ours = m * max(T) + pipeline_bubble("1f1b", m, 1, stages) + sends_exposed("1f1b", 2, 1, m, t, T) + ar_exposed
    # Metis (ATC'24, HeteroCostEstimator.get_cost): (m−1)·max T + Σ T + Σ_boundaries act/B + max_s 2(d−1)/d·P_s/B
    metis = (m - 1) * max(T) + sum(T) + t + ar
    # Sailor (SOSP'25, Simulator.get_time_per_pipeline): (m−1)·max_s(T_s + c_s) + Σ c_s + Σ T_s + t_sync, with
    # c_0 = t (first of ≤ 3 stages: its activation), c_1 = 2t (the last: twice its gradient)
    c = [t, 2 * t]
    sailor = (m - 1) * max(x + y for x, y in zip(T, c)) + sum(c) + sum(T) + ar
    assert m * max(T) + pipeline_bubble("1f1b", m, 1, stages) == pytest.approx((m - 1) * max(T) + sum(T))  # = 9
    assert ours == pytest.approx(9.0 + 2 * t + ar_exposed)  # fill and drain cross the boundary twice: 9.25
    assert metis == pytest.approx(9.6) and sailor == pytest.approx(10.4)


def test_simulate_prices_each_pool_stage_on_its_pool():
    from commtax.schedule.sim.simulate import simulate

    j = load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"]))
    e, s = estimate(j), simulate(j)
    # the slow pool's stage paces both: the same m · T_max of compute as the estimate, the bubble the fast stage
    assert s.breakdown.breakdown_s["compute"] == pytest.approx(e.breakdown_s["compute"], rel=1e-9)
    assert s.breakdown.breakdown_s["pp_bubble"] == pytest.approx(e.breakdown_s["pp_bubble"], rel=1e-6)
    assert s.breakdown.step_time_s == pytest.approx(e.step_time_s, rel=0.02)


def test_a_dumped_single_pool_job_loads_again_with_the_same_estimate():
    # model_dump writes `pools: None` for a single-pool cluster: loading it back is the same job
    job = load_job("examples/llama2-70b-h100.yaml")
    again = load_job(job.model_dump())
    assert again.cluster.pools is None
    assert estimate(again).step_time_s == estimate(job).step_time_s
