"""The fabric: leaf/spine links, placement, background traffic, max-min fair shares (issue 20)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.collectives import collective_cost
from commtax.costs.fabric import Coflow, fabric_nodes, max_min, path
from commtax.costs.topology import placement
from commtax.errors import SpecError
from commtax.spec import Cluster, Fabric, load_job

B = 0.2e9 / 8  # a 200 Mbit/s node link, bytes/s
EMULATED = {  # what `cluster up --nodes 4 --ranks-per-node 1 --link 200mbit --leaves 2 --spine 200mbit` writes
    "gpu": {"name": "cpu-gloo", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "test"},
    "num_gpus": 4,
    "gpus_per_node": 1,
    "intra_node": {"name": "loopback", "bw_GBps": 2.0, "latency_us": 20.0, "efficiency": 1.0, "kind": "loopback"},
    "inter_node": {"name": "veth", "bw_Gbps": 0.2, "latency_us": 50.0, "efficiency": 1.0},
    "nics_per_node": 1,
    "collective_library": "gloo",
}
SPINE_2_1 = {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": 2}}


def cluster(fabric=None, **kw) -> Cluster:
    return Cluster.model_validate({**EMULATED, **kw, "fabric": fabric})


# ----------------------------------------------------------------------------- max-min, by hand
def test_two_flows_on_one_link_get_half_each():
    link = ("leaf", 0, "up")
    rates = max_min([Coflow(10.0, ((link, 1.0),)), Coflow(10.0, ((link, 1.0),))], lambda _: 8.0)
    assert rates == [(4.0, link), (4.0, link)]  # C/2 each: neither reaches its own cap of 10


def test_a_flow_limited_elsewhere_leaves_the_rest_to_the_other():
    # A crosses l1 (cap 10) and l2 (cap 2); B only l1: A is held to 2 by l2, B takes what A leaves of l1
    l1, l2 = ("leaf", 0, "up"), ("pod", 0, "up")
    a, b = Coflow(100.0, ((l1, 1.0), (l2, 1.0))), Coflow(100.0, ((l1, 1.0),))
    assert max_min([a, b], {l1: 10.0, l2: 2.0}.get) == [(2.0, l2), (8.0, l1)]


def test_a_capped_flow_frees_its_share():
    link = ("node", 0, "up")
    assert max_min([Coflow(1.0, ((link, 1.0),)), Coflow(10.0, ((link, 1.0),))], lambda _: 8.0) == [
        (1.0, None),  # its own cap binds
        (7.0, link),
    ]


def test_tcp_shares_a_link_per_connection_not_per_job():
    # an all-to-all over 4 nodes (3 connections per node, w = 1/3 each: pace 3) loads leaf 0's uplink with 4/3 of
    # its rate x (0→2, 0→3, 1→2, 1→3); a background flow of cap 50 shares it. Per connection the 5 flows on the
    # uplink of 200 get 40 each (Jain, Chiu & Hawe 1984): the flow is held to 40 < 50, the all-to-all x = 3·40 = 120
    # (per job, equal x for both, it would be 4/3 x + x = 200: x = 85.7)
    link = ("leaf", 0, "up")
    a2a, bg = Coflow(1e9, ((link, 4 / 3),), pace=3.0), Coflow(50.0, ((link, 1.0),))
    (x, why_x), (y, why_y) = max_min([a2a, bg], lambda _: 200.0)
    assert (x, y) == (pytest.approx(120.0), pytest.approx(40.0)) and why_x == why_y == link


def test_identical_coflows_count_as_many():
    link = ("leaf", 0, "up")
    assert max_min([Coflow(10.0, ((link, 1.0),), count=4)], lambda _: 8.0) == [(2.0, link)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.5, 20),
            st.lists(st.tuples(st.integers(0, 3), st.floats(0.1, 2)), min_size=1, max_size=3, unique_by=lambda x: x[0]),
            st.integers(1, 3),
            st.sampled_from([1.0, 2.0, 3.0, 7.0]),
        ),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.floats(0.5, 20), min_size=4, max_size=4),
)
def test_max_min_is_feasible_and_every_flow_is_blocked(flows, caps):
    """No link over capacity; every coflow sits at its cap or on a full link it loads (max-min optimality), whatever
    the number of connections (pace) each coflow spreads its rate over."""
    links = [("leaf", i, "up") for i in range(4)]
    cf = [Coflow(c, tuple((links[i], u) for i, u in use), n, pace) for c, use, n, pace in flows]
    rates = max_min(cf, lambda lk: caps[lk[1]])
    load = {lk: sum(c.count * u * r for c, (r, _) in zip(cf, rates) for l2, u in c.usage if l2 == lk) for lk in links}
    assert all(load[lk] <= caps[lk[1]] * (1 + 1e-6) for lk in links)
    for c, (r, _) in zip(cf, rates):
        at_cap = r >= c.cap * (1 - 1e-6)
        blocked = any(load[lk] >= caps[lk[1]] * (1 - 1e-6) for lk, _ in c.usage)
        assert at_cap or blocked


# ----------------------------------------------------------------------------- placement and paths
def test_scattered_deals_nodes_over_leaves_and_pods():
    assert fabric_nodes(Fabric(nodes_per_leaf=2, placement="scattered"), 4) == (0, 2, 1, 3)
    # 4 leaves of 1 node, 2 per pod: leaf 0 of pod 0, leaf 0 of pod 1, leaf 1 of pod 0, leaf 1 of pod 1
    f = Fabric(nodes_per_leaf=1, leaves_per_pod=2, placement="scattered")
    assert fabric_nodes(f, 4) == (0, 2, 1, 3)
    assert fabric_nodes(Fabric(placement=[7, 3]), 2) == (7, 3)


def test_a_hop_crosses_leaf_and_pod_uplinks_only_when_it_leaves_them():
    f = Fabric(nodes_per_leaf=2, leaves_per_pod=2)
    assert path(f, 0, 1) == (("node", 0, "up"), ("node", 1, "down"))
    assert ("leaf", 0, "up") in path(f, 1, 2) and ("pod", 0, "up") not in path(f, 1, 2)
    assert ("pod", 0, "up") in path(f, 0, 4) and ("pod", 1, "down") in path(f, 0, 4)
    assert path(Fabric(topology="single-switch"), 0, 9) == (("node", 0, "up"), ("node", 9, "down"))


# ----------------------------------------------------------------------------- collectives on the fabric
S = 8 * 2**20


def test_no_fabric_prices_as_before():
    assert placement(cluster(), 4, 1, "all_reduce").binding == ""
    assert placement(cluster(), 4, 1, "all_reduce").inter.bw_bytes_per_s == B


def test_a_contiguous_ring_crosses_a_2_to_1_spine_once_each_way_and_is_not_slowed():
    p = placement(cluster(SPINE_2_1), 4, 1, "all_reduce")
    assert p.inter.bw_bytes_per_s == pytest.approx(B) and p.binding == ""


def test_a_scattered_ring_crosses_it_at_every_hop():
    # nodes 0,2 | 1,3 on the leaves: all 4 hops cross, 2 per direction on a spine of B: x = B/2
    p = placement(cluster({**SPINE_2_1, "placement": "scattered"}), 4, 1, "all_reduce")
    assert p.inter.bw_bytes_per_s == pytest.approx(B / 2) and p.binding == "leaf 0 uplink"
    t = collective_cost("all_reduce", S, p).time_s
    assert t == pytest.approx(2 * 3 * 50e-6 + 2 * 3 / 4 * S / (B / 2))  # gloo ring, Thakur 2005


def test_all_to_all_on_an_oversubscribed_spine():
    # each node sends 1/3 of its traffic to each other node; leaf 0's uplink carries 0→2, 0→3, 1→2, 1→3:
    # 4/3·x ≤ B (spine = 2 nodes · B / 2), so x = 3B/4
    p = placement(cluster(SPINE_2_1), 4, 1, "all_to_all")
    assert p.inter.bw_bytes_per_s == pytest.approx(0.75 * B) and p.binding == "leaf 0 uplink"
    nccl = placement(cluster(SPINE_2_1, collective_library="nccl"), 4, 1, "all_to_all")
    t = collective_cost("all_to_all", S, nccl).time_s
    # k(n-k)/n·S / node rate; NCCL's point-to-point path posts the 3 peers as one batch: one latency
    # (costs/collectives.py nccl_all_to_all_time, tests/test_nccl_p2p.py), the proxy's per-peer cost under the wire
    assert t == pytest.approx(1 * 50e-6 + 1 * 3 / 4 * S / (0.75 * B))
    # gloo's pairs take turns (costs/rendezvous.py, tests/test_rendezvous.py): 47/32 of the spine's S / B on average
    assert collective_cost("all_to_all", S, p).time_s == pytest.approx(3 * 50e-6 + 47 / 32 * S / B)


def test_a_background_flow_across_the_spine_halves_the_ring():
    # 0→2 at the link rate shares node 0's NIC and leaf 0's uplink with the ring: max-min gives each B/2
    fab = {**SPINE_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.2}]}
    p = placement(cluster(fab), 4, 1, "all_reduce")
    assert p.inter.bw_bytes_per_s == pytest.approx(B / 2) and "0" in p.binding
    # a flow capped at 50 Mbit/s freezes first; the ring takes the other 150
    slow = {**SPINE_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.05}]}
    assert placement(cluster(slow), 4, 1, "all_reduce").inter.bw_bytes_per_s == pytest.approx(0.75 * B)


def test_all_to_all_against_a_background_flow_gets_its_connections_share():
    # the case above on the 4×1, 2:1 cluster with `cluster load --from 0 --to 2 --rate 50mbit`: x = 120 Mbit/s of
    # the node's 200, whether the flow is capped at 50 or at the link rate (40 < 50 either way)
    for rate in (0.05, 0.2):
        fab = {**SPINE_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": rate}]}
        p = placement(cluster(fab), 4, 1, "all_to_all")
        assert p.inter.bw_bytes_per_s == pytest.approx(0.6 * B) and p.binding == "leaf 0 uplink"


def test_a_flow_that_has_stopped_is_not_priced():
    from commtax.costs.predict import predict_collective

    fab = {**SPINE_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.2, "until_unix": 1000.0}]}
    c = cluster(fab)
    alive = predict_collective("all_reduce", S, c, now=999.0)
    gone = predict_collective("all_reduce", S, c, now=1000.5)
    assert alive.rows[0]["binding_link"] == "node 0 NIC out" and "ignored_flows" not in alive.rows[0]
    assert alive.rows[0]["time_s"] == pytest.approx(2 * gone.rows[0]["time_s"], rel=0.01)  # B/2 while it runs
    assert "binding_link" not in gone.rows[0]  # nothing in the fabric binds a contiguous ring once it stopped
    assert gone.rows[0]["ignored_flows"] == [{"src": 0, "dst": 2, "rate_Gbps": 0.2, "until_unix": 1000.0}]
    assert "node 0 → node 2 at 200 Mbit/s, ended 1970-01-01 00:16:40 UTC" in gone.note
    # a flow without an end (written by hand, or before `cluster load` recorded one) is always on
    always = cluster({**SPINE_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.2}]})
    assert predict_collective("all_reduce", S, always, now=1e10).rows[0]["binding_link"] == "node 0 NIC out"


def test_background_share_of_a_level_removes_that_much_of_its_uplinks():
    fab = {**SPINE_2_1, "placement": "scattered", "background": {"leaf": 0.5}}
    assert placement(cluster(fab), 4, 1, "all_reduce").inter.bw_bytes_per_s == pytest.approx(B / 4)


def test_uplink_and_two_leaf_fabric_price_a_ring_alike():
    legacy = Cluster.model_validate({**EMULATED, "num_gpus": 8, "gpus_per_node": 2, "uplink_Gbps": 0.1})
    # 2 nodes per leaf at 0.2 Gbit/s over a 0.1 Gbit/s spine: 4:1
    fab = cluster(
        {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": 4}}, num_gpus=8, gpus_per_node=2
    )
    a = collective_cost("all_reduce", S, placement(legacy, 8, 1, "all_reduce")).time_s
    b = collective_cost("all_reduce", S, placement(fab, 8, 1, "all_reduce")).time_s
    assert a == pytest.approx(b)


# ----------------------------------------------------------------------------- jobs
JOB = "examples/fabric/llama3-70b-1024-h100.yaml"


def job_with_fabric(**fabric):
    import yaml

    data = yaml.safe_load(open(JOB))
    data["cluster"]["fabric"] = {**data["cluster"]["fabric"], **fabric}
    return load_job(data)


def test_a_4_to_1_spine_and_scattered_placement_slow_the_dp_reduction():
    from commtax.costs.topology import group_placement

    base = group_placement(job_with_fabric(), "dp", "all_reduce").inter.bw_bytes_per_s
    over = group_placement(job_with_fabric(oversubscription={"leaf": 4}), "dp", "all_reduce")
    scat = group_placement(job_with_fabric(oversubscription={"leaf": 4}, placement="scattered"), "dp", "all_reduce")
    assert over.inter.bw_bytes_per_s <= base and scat.inter.bw_bytes_per_s < over.inter.bw_bytes_per_s
    assert scat.binding.startswith("leaf")


def test_bad_fabric_input_is_one_line_naming_the_field():
    with pytest.raises(SpecError, match=r"fabric.placement lists 2 nodes but the job has 128"):
        job_with_fabric(placement=[0, 1])
    with pytest.raises(SpecError, match=r"cluster.fabric.oversubscription: leaf must be in \[1, 1000\]"):
        job_with_fabric(oversubscription={"leaf": 0.5})
    with pytest.raises(SpecError, match=r"cluster.fabric.spine_Gbps: Extra inputs"):
        job_with_fabric(spine_Gbps=100)
    with pytest.raises(SpecError, match=r"cluster.fabric.preset: unknown fabric 'dgx-superpod'; did you mean"):
        job_with_fabric(preset="dgx-superpod")
    import yaml

    data = yaml.safe_load(open(JOB))
    data["cluster"]["uplink_Gbps"] = 100
    with pytest.raises(SpecError, match="uplink_Gbps and fabric both describe the links above the nodes"):
        load_job(data)


# ----------------------------------------------------------------------------- the worked example (docs/fabric.md)
def test_worked_example_orders_the_fabrics_and_simulate_agrees():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "fabric" / "worked_example.py"
    spec = importlib.util.spec_from_file_location("worked_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.rows()
    steps = [r["step_s"] for r in rows]
    assert steps == sorted(steps) and steps[-1] > 1.2 * steps[0]  # each case costs more than the one before
    # contiguous nodes keep the DP ring inside a scalable unit: a 4:1 spine costs the DP reduction nothing
    assert rows[1]["dp_exposed_s"] == pytest.approx(rows[0]["dp_exposed_s"], rel=1e-6)
    for r in rows:  # the flow-level simulator agrees with the estimate where both apply
        assert r["simulated_step_s"] == pytest.approx(r["step_s"], rel=0.02)
    assert "| 4:1 spine, scattered |" in mod.table(rows)
    # the 4:1 spine's 24 fewer switches and 768 fewer uplinks (tests/test_fabric_cost.py) against +0.3 days
    assert rows[0]["fabric_capex_usd"] - rows[1]["fabric_capex_usd"] == pytest.approx(24 * 36000 + 768 * 1350)


def test_advise_prices_fabric_what_ifs_and_says_where_groups_sit():
    from commtax.decide.advise import advise

    a = advise(load_job("examples/fabric/llama3-70b-1024-h100-4to1-scattered.yaml"), search_best=False)
    labels = {c.label: c for c in a.changes if c.kind == "fabric"}
    assert labels["contiguous placement"].step_after_s < a.breakdown.step_time_s
    assert labels["spine 1:1 (now 4:1)"].step_after_s < labels["spine 2:1 (now 4:1)"].step_after_s
    assert labels["a co-located job using half of every uplink"].step_after_s > a.breakdown.step_time_s
    assert any(line.startswith("DP (gradients): across leaves") and "leaf 0 uplink" in line for line in a.placement)
    assert any("contiguous nodes" in line for line in a.placement)
    assert a.to_dict()["fabric_groups"][0]["group"] == "tp"
    # a job without a fabric gets no fabric advice (and its JSON no new keys)
    plain = advise(load_job("examples/llama2-70b-h100.yaml"), search_best=False)
    assert not [c for c in plain.changes if c.kind == "fabric"] and "placement" not in plain.to_dict()


def test_compare_puts_each_fabric_under_the_job():
    from commtax.decide.compare import jobs_for_fabrics, label

    job = load_job("examples/fabric/llama3-70b-1024-h100-4to1-scattered.yaml")
    jobs = jobs_for_fabrics(job, ["dgx-h100-superpod@1", "tor-4node@4"])
    assert [j.cluster.fabric.oversubscription["leaf"] for j in jobs] == [1.0, 4.0]
    assert [j.cluster.fabric.nodes_per_leaf for j in jobs] == [32, 4]
    assert all(j.cluster.fabric.placement == "scattered" for j in jobs)  # the job's placement is kept
    assert label(jobs[1]).endswith("tor-4node@4 4:1 scattered")
    assert label(load_job("examples/llama2-70b-h100.yaml")) == "256×h100-sxm5-80gb 8×ib-ndr"
    with pytest.raises(SpecError, match="--fabric: 'tor-4node@x': after @ comes"):
        jobs_for_fabrics(job, ["tor-4node@x"])
    with pytest.raises(SpecError, match="--fabric.preset: unknown fabric"):
        jobs_for_fabrics(job, ["tor4"])


def test_a_colocated_job_file_shares_the_spine(tmp_path):
    # ours on fabric nodes 0,1 | 4,5 and theirs on 2,3 | 6,7 (4 nodes per leaf, 4:1: a leaf uplink = one node's
    # link): each ring crosses leaf 0's uplink once, 1→4 and 3→6, so max-min gives each half of it
    import yaml

    other = {
        "model": "llama2-7b",
        "cluster": {**EMULATED, "gpu": {**EMULATED["gpu"], "mem_GiB": 80}},
        "plan": {"tp": 1, "pp": 1},
        "training": {"seq_len": 1024, "global_batch": 8, "precision": "fp32"},
    }
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    fabric = {
        "topology": "tor",
        "nodes_per_leaf": 4,
        "oversubscription": {"leaf": 4},
        "placement": [0, 1, 4, 5],
        "colocated": [{"job": "other.yaml", "nodes": [2, 3, 6, 7]}],
    }
    from commtax.spec import build, load_catalog, resolve_cluster

    raw = resolve_cluster({**other["cluster"], "fabric": fabric}, load_catalog(), tmp_path)
    c = build(Cluster, raw, "cluster")
    assert c.fabric.colocated[0].rings == [[2, 3, 6, 7]] and c.fabric.colocated[0].rate_Gbps == pytest.approx(0.2)
    p = placement(c, 4, 1, "all_reduce")
    assert p.inter.bw_bytes_per_s == pytest.approx(B / 2) and p.binding.startswith("leaf")
    alone = build(Cluster, {**raw, "fabric": {**raw["fabric"], "colocated": []}}, "cluster")
    assert placement(alone, 4, 1, "all_reduce").inter.bw_bytes_per_s == pytest.approx(B)
    with pytest.raises(SpecError, match=r"colocated.0.nodes: .* runs on 4 nodes; list 4 fabric node ids"):
        resolve_cluster(
            {**other["cluster"], "fabric": {**fabric, "colocated": [{"job": "other.yaml", "nodes": [2]}]}},
            load_catalog(),
            tmp_path,
        )


def test_a_non_blocking_contiguous_fabric_prices_as_no_fabric():
    import yaml

    from commtax.schedule.analytical import estimate

    data = yaml.safe_load(open(JOB))
    with_fabric = estimate(load_job(data)).step_time_s
    del data["cluster"]["fabric"]
    assert with_fabric == estimate(load_job(data)).step_time_s
