"""``commtax bench moe`` and the routed all-to-all it is predicted with (costs/alltoall.py)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.alltoall import link_time_s, routed_all_to_all
from commtax.costs.collectives import Level, Placement
from commtax.measure.testing import cli, records, require_netns

MB = 1e6


def two_by_two(inter_Bps: float = 12.5e6, intra_Bps: float = 2e9, alpha: float = 0.0) -> Placement:
    """2 nodes × 2 ranks, one NIC per node: each rank's share is B/2, the node's 2 rails together B."""
    return Placement(
        n=4,
        per_node=2,
        intra=Level("intra", intra_Bps, alpha),
        inter=Level("inter", inter_Bps / 2, alpha),
        library="gloo",
    )


# ----------------------------------------------------------------------------- the cost model, hand-worked
def test_balanced_all_to_all_is_the_node_link_one_way():
    # 4 ranks, 1 MB between every two: node 0 sends ranks 0,1 → 2,3: 4 MB one way; 12.5 MB/s → 0.32 s (full duplex)
    m = [[0 if i == j else MB for j in range(4)] for i in range(4)]
    r = routed_all_to_all(m, two_by_two())
    assert r.inter_out_bytes == (4 * MB, 4 * MB) and r.inter_in_bytes == (4 * MB, 4 * MB)
    assert r.time_s == pytest.approx(4 * MB / 12.5e6)
    assert r.bottleneck == "inter"
    assert r.send_bytes == (3 * MB,) * 4 and r.recv_bytes == (3 * MB,) * 4


def test_the_lighter_direction_costs_its_non_overlapping_share():
    # κ = 0.25: (max + κ·min) / B = (4 + 0.25·4) MB / 12.5 MB/s = 0.4 s
    m = [[0 if i == j else MB for j in range(4)] for i in range(4)]
    assert routed_all_to_all(m, two_by_two(), 0.25).time_s == pytest.approx(5 * MB / 12.5e6)
    # a one-way exchange pays nothing for κ
    one_way = [[MB if i < 2 <= j else 0 for j in range(4)] for i in range(4)]
    assert routed_all_to_all(one_way, two_by_two(), 1.0).time_s == pytest.approx(4 * MB / 12.5e6)
    assert link_time_s(3.0, 1.0, 1.0, 1.0) == 4.0  # κ = 1: one direction at a time (gloo, 2 ranks: docs/remedies.md)


def test_a_hot_rank_bounds_the_time_by_its_receive_side():
    # every rank sends rank 3 (node 1) 2 MB, and 0.5 MB to the others: node 1's ingress 2·(2 + 0.5) = 5 MB,
    # its egress 2 · 2 · 0.5 = 2 MB. Full duplex: 5 MB / 12.5 MB/s = 0.4 s
    m = [[0 if i == j else (2 * MB if j == 3 else 0.5 * MB) for j in range(4)] for i in range(4)]
    r = routed_all_to_all(m, two_by_two())
    assert r.inter_in_bytes[1] == 5 * MB and r.inter_out_bytes[1] == 2 * MB
    assert r.time_s == pytest.approx(5 * MB / 12.5e6)
    assert r.recv_bytes[3] == 6 * MB  # 3 senders × 2 MB: the busiest receiver


def test_inside_a_node_the_intra_level_prices_it_and_alpha_counts_each_peer():
    p = Placement(n=2, per_node=2, intra=Level("intra", 1e9, 10e-6), inter=None)
    r = routed_all_to_all([[0, 3e6], [1e6, 0]], p)
    assert r.time_s == pytest.approx(10e-6 + 3e6 / 1e9)  # (n − 1) α + the heavier direction of rank 0
    assert r.bottleneck == "intra"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1e7), min_size=16, max_size=16),
    st.floats(0, 1),
)
def test_routed_all_to_all_invariants(flat, kappa):
    """Full duplex ≤ time ≤ half duplex on the busiest node link; combine (the transpose) costs what dispatch does;
    doubling every byte doubles the (α-free) time."""
    m = [flat[4 * i : 4 * i + 4] for i in range(4)]
    for i in range(4):
        m[i][i] = 0.0
    p = two_by_two()
    r = routed_all_to_all(m, p, kappa)
    B = p.node_inter_bw
    links = list(zip(r.inter_out_bytes, r.inter_in_bytes))
    assert r.time_s >= max(max(o, i) for o, i in links) / B * (1 - 1e-12)
    intra = max(max(m[0][1], m[1][0]), max(m[2][3], m[3][2])) / p.intra.bw_bytes_per_s
    assert r.time_s <= max(max(o + i for o, i in links) / B, intra) * (1 + 1e-12)
    t = routed_all_to_all([list(c) for c in zip(*m)], p, kappa).time_s
    assert t == pytest.approx(r.time_s)
    assert routed_all_to_all([[2 * x for x in row] for row in m], p, kappa).time_s == pytest.approx(2 * r.time_s)
    assert sum(r.send_bytes) == pytest.approx(sum(r.recv_bytes))


def test_bad_matrix_and_share_are_refused():
    with pytest.raises(ValueError, match="4×4"):
        routed_all_to_all([[0.0]], two_by_two())
    with pytest.raises(ValueError, match="reverse_share"):
        routed_all_to_all([[0.0] * 4 for _ in range(4)], two_by_two(), 1.5)


def test_prediction_from_a_record_uses_the_cluster_links():
    """predict() on a hand-made record: dispatch = the metadata exchange + the routed matrix on the cluster file."""
    from commtax.measure.moe_bench import predict

    rec = {
        "world_size": 4,
        "ranks_per_node": 2,
        "hidden": 256,
        "ffn": 512,
        "experts": 8,
        "tokens": 1024,
        "top_k": 2,
        "bytes_per_row": 1024,
        "split_rows": [[0 if i == j else 512 for j in range(4)] for i in range(4)],
        "tokens_per_expert": [768] * 8,
        "calibration": {
            "expert_up_flop_per_s": 1e10,
            "expert_down_flop_per_s": 1e10,
            "router_flop_per_s": 1e10,
            "gelu_elem_per_s": 1e9,
            "gather_bytes_per_s": 1e9,
            "probe_bytes_per_pair": 2**20,
            "probe_s": 1.2 * 4 * 2**20 / 12.5e6,  # κ = 0.2 (α = 0 below)
            "ranks_per_node": 2,
        },
    }
    cluster = {
        "gpu": {"name": "cpu", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "test"},
        "intra_node": {
            "name": "lo",
            "bw_GBps": 2.0,
            "latency_us": 0.0,
            "efficiency": 1.0,
            "kind": "loopback",
            "source": "test",
        },  # fmt: skip
        "inter_node": {"name": "veth", "bw_Gbps": 0.1, "latency_us": 0.0, "efficiency": 1.0, "source": "test"},
        "nics_per_node": 1,
        "collective_library": "gloo",
    }
    p = predict(rec, cluster)
    assert p["reverse_share"] == pytest.approx(0.2)
    node_bytes = 2 * 2 * 512 * 1024  # 2 ranks × 2 remote peers × 512 rows × 1 KiB
    assert p["predicted_inter_node_bytes"]["out"] == [node_bytes, node_bytes]
    meta = (1 + 0.2) * 2 * 2 * 8 * 8 / 4 / 12.5e6  # E/n int64 counts per pair
    assert p["predicted_dispatch_s"] == pytest.approx(meta + 1.2 * node_bytes / 12.5e6)
    # experts: 2 local experts × 768 rows × (2 GEMMs of 2·h·ffn + GELU) + 4 row copies
    experts = 2 * (2 * 2 * 768 * 256 * 512 / 1e10 + 768 * 512 / 1e9) + 4 * 2 * 768 * 256 * 4 / 1e9
    assert p["predicted_experts_s"] == pytest.approx(experts)
    assert p["predicted_layer_s"] == pytest.approx(sum(p[f"predicted_{x}_s"] for x in PHASES))


PHASES = ("router", "permute", "dispatch", "experts", "combine", "unpermute")


# ----------------------------------------------------------------------------- the layer on gloo
@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("moe") / "moe.json"
    r = cli(
        "bench", "moe", "--nproc", "2", "--experts", "4", "--tokens", "96", "--hidden", "32", "--ffn", "64",
        "--imbalance", "1.6", "--steps", "2", "--warmup", "1", "--out", str(out), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return records(out)[0]


def test_tokens_come_back_to_their_origin_and_counts_match_the_splits(local_run):
    assert local_run["check_identity_max_abs_error"] < 1e-6  # identity experts: out = x · Σ weights = x
    assert local_run["check_reference_max_abs_error"] < 1e-5  # real experts: the one-rank reference
    assert local_run["check_counts_match"]
    assert sum(sum(row) for row in local_run["split_rows"]) == 2 * 96 * 2  # n · T · k rows routed
    assert sum(local_run["tokens_per_expert"]) == 2 * 96 * 2


def test_skewed_routing_reaches_the_target_imbalance(local_run):
    assert local_run["measured_imbalance"] == pytest.approx(1.6, abs=0.1)


def test_the_predictions_bytes_equal_the_counted_bytes(local_run):
    from commtax.measure.moe_bench import traffic_bytes

    p = Placement(n=2, per_node=2, intra=Level("intra", 1e9, 0.0), inter=None)
    r = routed_all_to_all(traffic_bytes(local_run), p)
    assert list(r.send_bytes) == local_run["dispatch_sent_bytes"]  # counted at the all_to_all_single call
    assert list(r.recv_bytes) == local_run["dispatch_received_bytes"]
    assert local_run["combine_sent_bytes"] == local_run["dispatch_received_bytes"]  # the reverse exchange
    assert local_run["combine_received_bytes"] == local_run["dispatch_sent_bytes"]
    assert local_run["layer_s"] > 0 and all(local_run[f"{x}_s"] > 0 for x in PHASES)
    assert 0 < local_run["a2a_share"] < 1


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--experts", "7"], "--experts: 7 experts do not divide over 2 ranks"),
        (["--top-k", "9"], "--top-k"),
        (["--imbalance", "5"], "--imbalance: λ from 1 to E/top-k = 4"),
        (["--imbalance", "nan"], "--imbalance"),
        (["--tokens", "0"], "--tokens"),
        (["--hidden", "100000"], "--hidden"),
        (["--nproc", "100000"], "--nproc"),
        (["--steps", "0"], "--steps"),
        (["--cluster", "/nonexistent/c.yaml"], "--cluster"),
        (["--out", "/nonexistent/dir/x.json"], "--out"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, monkeypatch):
    from typer.testing import CliRunner

    from commtax.cli.measure import bench_app

    for var in ("RANK", "WORLD_SIZE"):  # as the launcher sees it: no rank started
        monkeypatch.delenv(var, raising=False)
    r = CliRunner().invoke(bench_app, ["moe", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_bad_input_through_the_command_line():
    r = cli("bench", "moe", "--experts", "7", timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --experts: 7 experts do not divide over 2 ranks; use a multiple of 2"
    ), r.stderr


# ----------------------------------------------------------------------------- the emulated cluster
@pytest.mark.netns
def test_bench_moe_under_the_emulated_cluster(tmp_path):
    require_netns()
    pytest.importorskip("torch")
    cluster = tmp_path / "c.yaml"
    up = cli(
        "cluster", "up", "--no-duplex-probe", "--nodes", "2", "--ranks-per-node", "2", "--link", "1gbit",
        "--out", str(cluster),
        timeout=120,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        out = tmp_path / "m.json"
        r = cli(
            "cluster", "run", "--cluster", str(cluster), "--", sys.executable, "-m", "commtax.cli.measure",
            "bench", "moe", "--tokens", "128", "--hidden", "64", "--ffn", "128", "--steps", "2", "--warmup", "1",
            "--cluster", str(cluster), "--out", str(out),
            timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        rec = records(out)[0]
        assert rec["world_size"] == 4 and rec["ranks_per_node"] == 2 and rec["backend"] == "gloo"
        assert rec["check_counts_match"] and rec["check_identity_max_abs_error"] < 1e-6
        assert rec["predicted_layer_s"] > 0 and 0.0 <= rec["reverse_share"] <= 1.0
        assert rec["predicted_dispatch_sent_bytes"] == rec["dispatch_sent_bytes"]
    finally:
        cli("cluster", "down", "--cluster", str(cluster), timeout=60)
