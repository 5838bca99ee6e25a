"""MoE workload, prices and schedule: hand-worked bytes, rows, node deduplication, DeepEP rates, edp, memory."""

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.collectives import Level, Placement, deepep_table, deepep_time
from commtax.costs.compute import quantisation_efficiency
from commtax.schedule.analytical import estimate
from commtax.spec import load_job
from commtax.workload.memory import stage_states
from commtax.workload.moe import (
    FP8_DISPATCH_BYTES,
    distinct_nodes,
    ep_nodes,
    expert_rows,
    internode_dedup,
    router_tokens,
    token_exchange,
)
from commtax.workload.step import build_workload, grad_bytes_per_param, stage_param_split

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "moe" / "deepseek-v3-h800.yaml"
H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}


def mixtral(num_gpus=64, model=None, training=None, **plan):
    return load_job(
        {
            "model": model or "mixtral-8x7b",
            "cluster": {**H100, "num_gpus": num_gpus},
            "plan": {"ep": 8, **plan},
            "training": {"seq_len": 4096, "global_batch": 512, **(training or {})},
        }
    )


def test_distinct_nodes_uniform_and_node_limited():
    # expected distinct nodes of k = 8 experts uniform over N = 8 nodes: N(1 - (1 - 1/N)^k); DeepSeek-V3 caps it at 4
    assert distinct_nodes(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8))
    assert distinct_nodes(8, 8, 4) == 4.0
    assert distinct_nodes(1, 8) == pytest.approx(1.0)


def test_deepseek_v3_example_dispatch_bytes_and_dedup():
    job = load_job(EXAMPLE)
    t, k, h = 4096, 8, 7168  # one micro-batch of 4096 tokens, no TP/CP
    assert router_tokens(job) == t
    assert ep_nodes(job) == 8  # EP64 over nodes of 8
    assert internode_dedup(job) == pytest.approx(4 / 8)  # 4 distinct nodes (node-limited) of the 8 copies
    fwd = {c.name: c for c in token_exchange(job, 2.0, backward=False)}
    bwd = {c.name: c for c in token_exchange(job, 2.0, backward=True)}
    assert fwd["ep_dispatch"].bytes == pytest.approx(t * k * h * (1 + 4 / 128))  # fp8 + a scale per 128
    assert fwd["ep_combine"].bytes == pytest.approx(t * k * h * 2)  # bf16
    assert bwd["ep_dispatch_bwd"].bytes == bwd["ep_combine_bwd"].bytes == pytest.approx(t * k * h * 2)
    assert fwd["ep_dispatch"].op == "deepep_dispatch" and FP8_DISPATCH_BYTES == 1 + 4 / 128


def test_nccl_dispatcher_moves_bf16_without_dedup():
    job = mixtral()
    ops = token_exchange(job, 2.0, backward=False)
    assert [c.op for c in ops] == ["all_to_all", "all_to_all"]
    assert ops[0].bytes == 4096 * 2 * 4096 * 2 and ops[0].dedup == 1.0


def test_expert_rows_stretch_with_imbalance():
    # Mixtral on EP8: one expert per GPU, T·k = 4096·2 rows; λ = 2 doubles the busiest GPU's rows
    assert expert_rows(mixtral()) == 8192
    skewed = mixtral(model={**_mixtral_entry(), "routing_imbalance": 2.0})
    assert expert_rows(skewed) == 16384
    # a capacity factor caps the stretch (tokens beyond it are dropped)
    capped = mixtral(model={**_mixtral_entry(), "routing_imbalance": 2.0, "capacity_factor": 1.25})
    assert expert_rows(capped) == math.ceil(8192 * 1.25)


def _mixtral_entry():
    from commtax.spec import load_catalog

    return {"name": "mixtral-8x7b", **load_catalog()["model"]["mixtral-8x7b"]}


def test_grouped_gemm_waves_span_all_groups():
    # 4 experts of 100×128 rows·cols on 132 SMs, 128-tiles: each tile 100/128 useful, 4 tiles in one wave of 132
    assert quantisation_efficiency(100, 128, 132, 128, groups=4) == pytest.approx(100 / 128 * 4 / 132)


def test_deepep_intranode_rate_from_its_table():
    # DeepEP's tests count every token a rank receives (its own too), once per rank: on the H800 link it was
    # measured on (160 GB/s) the rank-deduplicated bytes move at its 153 GB/s
    lvl = Level("intra", 160e9, 1e-6)
    p = Placement(n=8, per_node=8, intra=lvl, inter=None)
    table = deepep_table()
    eff = table["intranode"]["dispatch"]["GBps"] / table["reference"]["nvlink_GBps"]  # 153 / 160
    s, dedup = 1e9, 0.65
    assert deepep_time("deepep_dispatch", s, p, dedup) == pytest.approx(1e-6 + dedup * s / 153e9)
    assert eff == pytest.approx(153 / 160)


def test_rank_dedup_inside_the_node():
    # DeepEP/HybridEP send a token once per rank holding one of its experts: Mixtral's top-2 over EP 8,
    # 8·(1 − (7/8)²) = 1.875 distinct ranks of 2 copies; NCCL's all-to-all sends both
    from commtax.workload.moe import rank_dedup

    assert rank_dedup(mixtral(moe_dispatcher="deepep")) == pytest.approx(8 * (1 - (7 / 8) ** 2) / 2)
    assert rank_dedup(mixtral()) == 1.0
    assert rank_dedup(mixtral(num_gpus=64, ep=16, moe_dispatcher="deepep", model=_mixtral_16())) == 1.0  # 2 nodes


def _mixtral_16():
    return {**_mixtral_entry(), "num_experts": 16}


def test_hybridep_rates_from_its_tables():
    # DeepEP docs/README_Hybrid-EP.md: GB200 NVL72 at 32 ranks, 32 SMs, torch API: 392.70 (fp8 dispatch),
    # 484.22 (bf16 dispatch), 464.54 (combine) GB/s, on the NVLink 5 level (720 GB/s effective) they ran on
    from commtax.costs.collectives import hybridep_efficiency

    nvl5 = Level("intra", 720e9, 1e-6)
    gb = Placement(n=32, per_node=72, intra=nvl5, inter=None, arch="blackwell")
    s = 1e9
    assert deepep_time("deepep_dispatch", s, gb, 1.0, "hybridep-fp8") == pytest.approx(1e-6 + s / 392.70e9)
    assert deepep_time("deepep_combine", s, gb, 1.0, "hybridep-bf16") == pytest.approx(1e-6 + s / 464.54e9)
    # B200, 8 ranks: 535.94 GB/s bf16 dispatch; beyond GB200's largest published size (36), its figure
    b200 = Placement(n=8, per_node=8, intra=nvl5, inter=None, arch="blackwell")
    assert hybridep_efficiency("deepep_dispatch", "hybridep-bf16", b200, "nvl") == pytest.approx(535.94 / 720)
    gb64 = Placement(n=64, per_node=72, intra=nvl5, inter=None, arch="blackwell")
    assert hybridep_efficiency("deepep_dispatch", "hybridep-fp8", gb64, "nvl") == pytest.approx(361.13 / 720)
    # DeepEP's own kernels, and HybridEP on Hopper inside a node, keep DeepEP's rates
    assert hybridep_efficiency("deepep_dispatch", "deepep-fp8", gb, "nvl") is None
    h100 = Placement(n=8, per_node=8, intra=Level("intra", 367e9, 1e-6), inter=None, arch="hopper")
    assert hybridep_efficiency("deepep_dispatch", "hybridep-fp8", h100, "nvl") is None


def test_deepep_internode_halves_with_dedup():
    intra, inter = Level("intra", 160e9, 1e-6), Level("inter", 50e9, 5e-6)
    p = Placement(n=64, per_node=8, intra=intra, inter=inter)
    full, half = deepep_time("deepep_combine", 1e9, p, 1.0), deepep_time("deepep_combine", 1e9, p, 0.5)
    rdma = deepep_table()["internode"]["combine"][64] / deepep_table()["reference"]["rdma_GBps"]
    # RDMA-bound: the tests' RDMA bytes (every distinct node, the local one too) at the published rate
    assert full - 8 * 5e-6 == pytest.approx(1e9 / (rdma * 50e9))
    assert half - 8 * 5e-6 == pytest.approx((full - 8 * 5e-6) / 2)


def test_internode_rate_read_on_the_bytes_it_was_measured_on():
    # HybridEP's H100 table (DeepEP docs/README_Hybrid-EP.md, EP 16 = 2 nodes of 8, 16 SMs, torch API): fp8 dispatch
    # 48.26 GB/s of RDMA bytes as tests/utils.py count_rdma_send_from_routing_map counts them, once per distinct node
    # a token goes to, its own node included ("we do not set the local node map to zeros"), on a 50 GB/s NIC.
    # Qwen3-30B-A3B, 4096 tokens, top-8, hidden 2048, fp8 tokens ((1 + 4/128)/2 of bf16's 2 B):
    # distinct nodes 2·(1 − (1/2)^8) = 1.9921875, counted 4096 · 1.9921875 · 2048 · 1.03125 B = 17.23 MB, 0.357 ms;
    # the wire carries half of that (the remote node's), which the model divided by the rate before moe15 (0.179 ms)
    from commtax.workload.moe import distinct_nodes

    intra, nic = Level("intra", 160e9, 0.0), Level("inter", 50e9, 0.0)
    p = Placement(n=16, per_node=8, intra=intra, inter=nic, arch="hopper")
    tokens, k, h, fp8 = 4096, 8, 2048, (1 + 4 / 128) / 2 * 2
    d = distinct_nodes(2, k)
    assert d == pytest.approx(1.9921875)
    s = tokens * k * h * fp8  # all top-k copies, the pairwise all-to-all's buffer
    t = deepep_time("deepep_dispatch", s, p, d / k, "hybridep-fp8")
    counted = tokens * d * h * fp8
    assert counted == pytest.approx(17.23e6, rel=1e-3)
    assert t == pytest.approx(counted / 48.26e9)
    assert t == pytest.approx(0.357e-3, rel=2e-3)


@settings(max_examples=40, deadline=None)
@given(nodes=st.sampled_from([2, 4, 8, 16]), k=st.integers(1, 8), s=st.floats(1e6, 1e10))
def test_internode_leg_is_the_tests_count_over_the_rate(nodes, k, s):
    # RDMA-bound (a fast NVLink): the time is the tests' RDMA bytes, dedup · S (a token once per distinct node, its
    # own included), over the published rate; N/(N − 1) × what the wire alone carries (the remote share)
    from commtax.workload.moe import distinct_nodes

    intra, nic = Level("intra", 1e15, 0.0), Level("inter", 50e9, 0.0)
    p = Placement(n=8 * nodes, per_node=8, intra=intra, inter=nic)
    dedup = distinct_nodes(nodes, k) / k
    rate = deepep_efficiency_rdma("deepep_dispatch", p) * 50e9
    t = deepep_time("deepep_dispatch", s, p, dedup)
    assert t == pytest.approx(dedup * s / rate, rel=1e-9)
    wire = dedup * s * (nodes - 1) / nodes
    assert t == pytest.approx(wire / rate * nodes / (nodes - 1), rel=1e-9)


def deepep_efficiency_rdma(op, p):
    from commtax.costs.collectives import deepep_efficiency

    return deepep_efficiency(op, p)[1]


def test_expert_grads_reduce_over_edp():
    job = mixtral(pp=2)  # 64 GPUs: dp 32, edp 64 / (1·8·2) = 4
    wl = build_workload(job)
    (dense, experts) = max(stage_param_split(job), key=sum)
    assert job.edp == 4
    rs = {c.name: c for c in wl.edp_step}
    assert rs["edp_grad_reduce_scatter"].group == "edp"
    g = grad_bytes_per_param(job)  # the plan's grad_comm_dtype (custom framework: bf16, 2 B)
    assert rs["edp_grad_reduce_scatter"].bytes == pytest.approx(experts * g)
    assert wl.dp_step[0].bytes == pytest.approx(dense * g) and wl.dp_step[0].group == "dp"


def test_expert_optimizer_states_shard_over_edp():
    job = mixtral(pp=2)
    (w, g, o), *_ = stage_states(job, [0])
    dense, experts = stage_param_split(job)[0]
    assert o == pytest.approx(12.0 * (dense / job.dp + experts / job.edp))  # ZeRO-1: Adam states, both shards


def test_moe_estimate_reports_ep_and_dense_does_not():
    b = estimate(mixtral())
    assert "ep_exposed" in b.breakdown_s and b.comm_time_s["ep"] > 0
    assert b.step_time_s == pytest.approx(sum(b.breakdown_s.values()))
    dense = estimate(
        load_job(
            {
                "model": "llama2-7b",
                "cluster": {**H100, "num_gpus": 8},
                "plan": {},
                "training": {"seq_len": 4096, "global_batch": 64},
            }
        )
    )
    assert "ep_exposed" not in dense.breakdown_s and "ep" not in dense.comm_time_s


def test_overlap_hides_the_all_to_all():
    plain = estimate(mixtral(pp=2, vp=2))
    overlapped = estimate(mixtral(pp=2, vp=2, moe_a2a_overlap=True))
    assert overlapped.breakdown_s["ep_exposed"] < plain.breakdown_s["ep_exposed"]
    assert overlapped.comm_time_s["ep"] == pytest.approx(plain.comm_time_s["ep"])  # same wire time


def test_imbalance_slows_the_step():
    assert (
        estimate(mixtral(model={**_mixtral_entry(), "routing_imbalance": 2.0})).step_time_s
        > estimate(mixtral()).step_time_s
    )


def test_ep_inside_the_node_is_cheaper_than_across():
    # EP8 within an 8-GPU node vs EP16 over two nodes: the all-to-all's link time per byte is lower inside
    inside = estimate(mixtral(num_gpus=16, ep=8))
    across = estimate(mixtral(num_gpus=16, ep=16, model={**_mixtral_entry(), "num_experts": 16}))
    assert (
        inside.comm_time_s["ep"] / inside.comm_bytes_per_gpu["ep"]
        < across.comm_time_s["ep"] / across.comm_bytes_per_gpu["ep"]
    )


def test_deepseek_example_fits_and_reports_its_tax():
    b = estimate(load_job(EXAMPLE))
    assert b.fits
    assert 0 < b.breakdown_s["ep_exposed"] < b.step_time_s


def test_deepseek_example_recomputes_what_the_report_does():
    # arXiv 2412.19437 §3.2.3: all RMSNorms and the MLA up-projections recomputed in backward. Per layer, micro-batch
    # 1 × 4096 tokens, fp8: the two norm outputs at 1 B (2·s·h) and the up-projected Q, K, V at 2 B (2·s·h +
    # 2·2·s·128·192); the fullest stage keeps 4 layers × (PP + 1 = 17) micro-batches (DualPipe, Table 2)
    from commtax.spec import job_with
    from commtax.workload.memory import memory

    job = load_job(EXAMPLE)
    assert job.plan.recompute == "selective" and set(job.plan.recompute_modules) == {"layernorm", "mla_up_proj"}
    s, h = 4096, 7168
    per_layer = 2 * 1 * s * h + 2 * s * h + 2 * 2 * s * 128 * 192
    assert per_layer == 520_093_696
    default = job_with(job, recompute_modules=("core_attn",))  # Megatron-Core's default modules
    assert memory(default).activations - memory(job).activations == pytest.approx(4 * 17 * per_layer)
    assert estimate(job).fits and not estimate(default).fits


@pytest.mark.parametrize("plan", [{"pp": 2, "vp": 2}, {"pp": 2, "vp": 2, "moe_a2a_overlap": True}, {"pp": 1}])
def test_estimate_and_simulate_agree_on_moe(plan):
    from commtax.schedule.sim import simulate

    job = mixtral(training={"global_batch": 256}, **plan)
    e, s = estimate(job), simulate(job).breakdown
    assert s.step_time_s == pytest.approx(e.step_time_s, rel=0.02)
    assert s.breakdown_s["ep_exposed"] == pytest.approx(e.breakdown_s["ep_exposed"], rel=1e-6)
    assert s.comm_time_s["ep"] == pytest.approx(e.comm_time_s["ep"], rel=1e-6)  # the wire time, hidden or not


def test_docs_worked_example():
    # docs/moe.md's table, recomputed: the report's plan, EP inside the node, NCCL instead of DeepEP, 1F1B, full
    # recompute (the example before it recomputed only what arXiv 2412.19437 §3.2.3 says)
    from commtax.spec import job_with

    doc = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    j = load_job(EXAMPLE)
    rows = [
        ("EP64 over 8 nodes, DeepEP (the report's)", j),
        ("EP8 inside the node, DeepEP", job_with(j, ep=8)),
        ("EP64 over 8 nodes, NCCL all-to-all", job_with(j, moe_dispatcher="alltoall")),
        ("EP64, DeepEP, 1F1B instead of DualPipe", job_with(j, schedule="1f1b")),
        ("EP64, DeepEP, full recompute", job_with(j, recompute="full")),
    ]
    for name, job in rows:
        b = estimate(job)
        line = (
            f"| {name} | {b.step_time_s:.2f} | {b.tokens_per_s_per_gpu:,.0f} | {b.comm_time_s['ep']:.2f} | "
            f"{b.breakdown_s['ep_exposed']:.2f} | {b.comm_tax:.1%} | {b.memory_gib_per_gpu['total']:.1f} | {b.fits} |"
        )
        assert line in doc, line


@settings(max_examples=25, deadline=None)
@given(
    nodes=st.integers(1, 64),
    k=st.integers(1, 16),
    limit=st.one_of(st.none(), st.integers(1, 8)),
)
def test_distinct_nodes_bounds(nodes, k, limit):
    # at least one node, at most min(N, k, M): a token's k copies land on no more nodes than there are, or copies
    d = distinct_nodes(nodes, k, limit)
    assert 1.0 - 1e-9 <= d <= min(nodes, k, limit or nodes) + 1e-9


@settings(max_examples=10, deadline=None)
@given(lam=st.floats(1.0, 4.0), ep=st.sampled_from([1, 2, 4, 8]), overlap=st.booleans())
def test_moe_step_is_the_sum_of_its_parts(lam, ep, overlap):
    job = mixtral(
        num_gpus=16,
        model={**_mixtral_entry(), "routing_imbalance": lam},
        ep=ep,
        pp=2,
        vp=2,
        moe_a2a_overlap=overlap and ep > 1,
        training={"global_batch": 64},
    )
    b = estimate(job)
    assert b.step_time_s == pytest.approx(sum(b.breakdown_s.values()))
    exposed, link = b.breakdown_s["ep_exposed"], b.comm_time_s["ep"]
    if job.plan.moe_a2a_overlap:  # hidden under the paired pass: never more than the wire time
        assert 0.0 <= exposed <= link + 1e-12
    else:  # on the critical path: all of it
        assert exposed == pytest.approx(link)


def test_moe_blocks_follow_the_nvlink_domain():
    # the same model, training and plan on 8-GPU nodes and in one 16-GPU NVLink domain: DeepEP deduplicates only
    # across nodes (the blocks are shared between jobs, so their key must see the domain's size)
    def job(gpus_per_node):
        return load_job(
            {
                "model": {**_mixtral_entry(), "num_experts": 16},
                "cluster": {**H100, "num_gpus": 16, "gpus_per_node": gpus_per_node, "nics_per_node": gpus_per_node},
                "plan": {"ep": 16, "moe_dispatcher": "deepep"},
                "training": {"seq_len": 4096, "global_batch": 64},
            }
        )

    def dedup(j):
        return [c.dedup for c in build_workload(j).moe_layer.fwd.collectives if c.group == "ep"]

    from commtax.spec import Job, build

    nodes = job(8)
    # the same model and training objects on the wider domain
    cluster = nodes.cluster.model_copy(update={"gpus_per_node": 16, "nics_per_node": 16})
    domain = build(Job, {"model": nodes.model, "cluster": cluster, "plan": nodes.plan, "training": nodes.training}, "")
    assert dedup(nodes) == [pytest.approx(distinct_nodes(2, 2) / 2)] * 2  # 2 nodes, top-2
    # one domain: no node to deduplicate, each token once per rank holding its experts (16 ranks, top-2)
    assert dedup(domain) == [pytest.approx(distinct_nodes(16, 2) / 2)] * 2
    assert dedup(job(16)) == [pytest.approx(distinct_nodes(16, 2) / 2)] * 2


def _dense_first_stage_job():
    # 8 layers, the first 4 dense (stage 0 of PP2: embedding + 4 dense layers, no experts), 64 experts of
    # moe_ffn 2048 top-2 on the other 4; EP8 in a node, dp = 16, edp = 16 / 8 = 2 (one GPU per node)
    model = {
        "layers": 8,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "ffn_hidden": 28672,
        "vocab": 128000,
        "gated_mlp": True,
        "num_experts": 64,
        "top_k": 2,
        "moe_ffn_hidden": 2048,
        "first_k_dense": 4,
    }
    return load_job(
        {
            "model": model,
            "cluster": {**H100, "num_gpus": 32},
            "plan": {"pp": 2, "ep": 8, "zero": 1},
            "training": {"seq_len": 4096, "global_batch": 64},
        }
    )


def test_dp_is_priced_on_the_rank_with_the_slowest_dp_not_the_most_parameters():
    # issue 18: the rank with the most parameters (stage 0: embedding + dense layers) holds no experts; sizing the
    # DP ops for it dropped the other rank's expert gradients (edp = 0). The step waits for the slowest DP rank.
    from commtax.costs.pricing import Costs
    from commtax.schedule.analytical import dp_exposed, slowest_and_rest, slowest_dp_workload, stage_times
    from commtax.schedule.sim.simulate import simulate
    from commtax.workload.step import with_dp_stage

    job = _dense_first_stage_job()
    (d0, e0), (d1, e1) = stage_param_split(job)
    assert e0 == 0 and d0 > d1 + e1  # stage 0 has the most parameters and no experts
    # stage 1's experts by hand: 4 MoE layers x 64/8 experts x 3 matrices of 4096 x 2048
    assert e1 == 4 * 8 * 3 * 4096 * 2048
    wl, costs = build_workload(job), Costs(job)
    assert wl.dp_split == (d0, e0) and not wl.edp_step  # the parameter-sized default: no expert gradients
    slow, _ = slowest_and_rest(stage_times(job, wl, costs))
    links = [dp_exposed(job, with_dp_stage(job, wl, s), costs, slow)[0] for s in [(d0, e0), (d1, e1)]]
    assert links[1] > links[0]  # dense over dp=16 plus experts over edp=2 (across nodes) take longer
    assert slowest_dp_workload(job, wl, costs, slow).dp_split == (d1, e1)
    b = estimate(job)
    assert b.comm_time_s["dp"] + b.comm_time_s["edp"] == pytest.approx(links[1])
    # ZeRO-1 over edp = 2: reduce-scatter of the gradients and all-gather of the weights, each sending half
    g = grad_bytes_per_param(job)
    assert b.comm_bytes_per_gpu["edp"] == pytest.approx(e1 * (g + 2) / 2)
    # the simulator prices each rank's own: the expert rank reduces its experts, the dense rank none
    res = simulate(job)
    assert res.builder.splits == [(d0, e0), (d1, e1)]
    assert res.builder._expert_share(d0, 0) == 0.0 and res.builder._expert_share(d1, 1) == pytest.approx(1.0)


def test_dense_workloads_have_one_dp_rank_kind():
    # dense jobs keep the parameter-sized DP ops untouched (their byte-identical figures depend on it)
    from commtax.costs.pricing import Costs
    from commtax.schedule.analytical import slowest_and_rest, slowest_dp_workload, stage_times

    job = load_job(Path(__file__).resolve().parents[1] / "examples" / "llama2-70b-h100.yaml")
    wl, costs = build_workload(job), Costs(job)
    assert wl.dp_stage_splits == ()
    assert slowest_dp_workload(job, wl, costs, slowest_and_rest(stage_times(job, wl, costs))[0]) is wl


def test_search_prices_moe_dp_on_the_slowest_rank_as_estimate_does():
    # search's assembled step (grid DP exposure and optimizer) agrees with estimate on the job whose fullest rank
    # holds no experts (with the DP sized by parameters it differed by 1.5e-2: it dropped the edp gradients)
    from commtax.decide.search import Space, search

    fixed = {"tp": "1", "pp": "2", "cp": "1", "vp": "1", "zero": "1", "recompute": "full"}
    space = Space.parse({**fixed, "micro_batch": "1,2"})
    res = search(_dense_first_stage_job(), space, top=3)
    assert res.max_rel_diff < 1e-9
    assert all(b.comm_time_s["edp"] > 0 for _, b in res.top)
