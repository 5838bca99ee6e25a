"""gloo all_to_all's duplex κ (issue 20): measured by `cluster up`, written as inter_node.gloo_a2a_duplex, priced by
the one link formula (costs.collectives.link_time_s, shared with costs/alltoall.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from commtax.costs.collectives import Level, Placement, all_to_all_time, link_time_s
from commtax.costs.predict import predict_collective
from commtax.errors import SpecError
from commtax.measure.testing import cli, require_netns
from commtax.spec import Cluster, build, load_catalog, resolve_cluster

MiB = 2**20
B = 25e6  # 200 Mbit/s per direction, bytes/s
ALPHA = 50e-6


def emulated(kappa: float | None = None, library: str = "gloo", **inter) -> dict:
    """What `cluster up --nodes 4 --link 200mbit` writes, without the fabric: 4 nodes × 1 rank."""
    net = {"name": "veth", "bw_Gbps": 0.2, "latency_us": 50.0, "efficiency": 1.0, "source": "test", **inter}
    if kappa is not None:
        net["gloo_a2a_duplex"] = kappa
    return {
        "gpu": {"name": "cpu", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "test"},
        "num_gpus": 4,
        "gpus_per_node": 1,
        "intra_node": {"name": "lo", "bw_GBps": 2.0, "latency_us": 5.0, "efficiency": 1.0, "kind": "loopback"},
        "inter_node": net,
        "nics_per_node": 1,
        "collective_library": library,
    }


def cluster(raw: dict) -> Cluster:
    return build(Cluster, resolve_cluster(raw, load_catalog()), "--cluster")


def test_the_link_formula_by_hand():
    # 3 MB out, 3 MB in, κ = 0.5: the heavier direction plus half the lighter, at 25 MB/s = 0.18 s
    assert link_time_s(3e6, 3e6, B, 0.5) == pytest.approx(4.5e6 / B) == pytest.approx(0.18)
    assert link_time_s(3e6, 1e6, B, 0.0) == pytest.approx(3e6 / B)  # full duplex: the heavier alone


def test_uniform_all_to_all_with_kappa_by_hand():
    """4 nodes × 1 rank, S = 4 MB per rank: a node sends 3/4 · S = 3 MB and receives as much;
    κ = 0.5 → 3 α + (3 + 0.5 · 3) MB / 25 MB/s = 0.00015 + 0.18 s."""
    p = Placement(4, 1, Level("intra", 2e9, 5e-6), Level("inter", B, ALPHA), library="gloo", reverse_share=0.5)
    t, level = all_to_all_time(4e6, p)
    assert level == "inter" and t == pytest.approx(3 * ALPHA + 0.18)
    full = Placement(4, 1, Level("intra", 2e9, 5e-6), Level("inter", B, ALPHA), library="gloo")
    assert all_to_all_time(4e6, full)[0] == pytest.approx(3 * ALPHA + 0.12)


def test_a_cluster_file_with_the_field_changes_the_gloo_all_to_all_price():
    S = 8 * MiB
    vol = 3 / 4 * S  # a node's bytes out (and in)
    measured = predict_collective("all_to_all", S, cluster(emulated(0.6)))
    plain = predict_collective("all_to_all", S, cluster(emulated()))
    assert measured.rows[0]["time_s"] == pytest.approx(3 * ALPHA + 1.6 * vol / B)  # 0.40280 s
    assert plain.rows[0]["time_s"] == pytest.approx(3 * ALPHA + vol / B)  # 0.25181 s: today's price
    assert measured.rows[0]["gloo_a2a_duplex"] == 0.6 and plain.rows[0]["gloo_a2a_duplex"] is None
    assert "duplex κ = 0.6" in measured.note and "duplex not measured" in plain.note
    # the field prices gloo's all_to_all only: its all_reduce, and NCCL's all_to_all, stay as they were
    ar = [predict_collective("all_reduce", S, cluster(emulated(k))).rows[0]["time_s"] for k in (None, 0.6)]
    assert ar[0] == ar[1]
    nccl = [predict_collective("all_to_all", S, cluster(emulated(k, "nccl"))) for k in (None, 0.6)]
    assert nccl[0].rows[0]["time_s"] == nccl[1].rows[0]["time_s"] and nccl[1].note == ""


def test_on_a_fabric_the_pairs_turns_replace_kappa():
    """2 leaves of 2 nodes, a 2:1 spine: gloo's all-to-all is priced by its pairs' turns (costs/rendezvous.py:
    47/32 of the spine's S / B over the 24 entry orders), whatever κ the file holds; the leaf uplink still binds."""
    fab = {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": 2.0}}
    S = 8 * MiB
    for kappa in (0.4, None):
        p = predict_collective("all_to_all", S, cluster({**emulated(kappa), "fabric": fab}))
        t = p.rows[0]
        assert t["binding_link"] == "leaf 0 uplink" and "gloo_a2a_duplex" not in t
        assert t["time_s"] == pytest.approx(3 * ALPHA + 47 / 32 * S / B)
        assert t["rendezvous_range_s"] == pytest.approx([3 * ALPHA + 1.25 * S / B, 3 * ALPHA + 1.75 * S / B])
        assert "mean over 24 entry orders" in " ".join(p.note.split()) and "κ =" not in p.note


def test_a_bad_value_is_one_clear_error():
    with pytest.raises(SpecError, match="gloo_a2a_duplex"):
        cluster(emulated(1.5))


def test_collective_cli_says_when_the_duplex_was_not_measured(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(emulated()))
    cmd = [sys.executable, "-m", "commtax.cli", "collective", "all_to_all", "--bytes", "8MiB", "--cluster", str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "duplex not measured" in " ".join(r.stdout.split()), r.stderr
    j = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(j.stdout)["gloo_a2a_duplex"] is None


def test_bench_moe_falls_back_to_the_cluster_files_kappa():
    """A record without this run's probe is priced with the cluster file's κ."""
    from commtax.measure.moe_bench import predict

    rec = {
        "world_size": 4,
        "ranks_per_node": 1,
        "hidden": 8,
        "ffn": 16,
        "experts": 4,
        "tokens": 64,
        "top_k": 1,
        "bytes_per_row": 32,
        "split_rows": [[0 if i == j else 16 for j in range(4)] for i in range(4)],
        "tokens_per_expert": [64] * 4,
        "calibration": {
            "expert_up_flop_per_s": 1e10,
            "expert_down_flop_per_s": 1e10,
            "router_flop_per_s": 1e10,
            "gelu_elem_per_s": 1e9,
            "gather_bytes_per_s": 1e9,
        },
    }
    p = predict(rec, emulated(0.3))
    assert p["reverse_share"] == 0.3 and p["reverse_share_from"] == "cluster file (cluster up)"
    assert predict(rec, emulated())["reverse_share"] == 0.0


@pytest.mark.netns
def test_cluster_up_writes_a_measured_duplex(tmp_path):
    require_netns()
    pytest.importorskip("torch")
    path = tmp_path / "c.yaml"
    r = cli("cluster", "up", "--nodes", "2", "--link", "200mbit", "--out", str(path), timeout=180)
    assert r.returncode == 0, r.stderr
    try:
        spec = yaml.safe_load(path.read_text())
        k = spec["inter_node"]["gloo_a2a_duplex"]
        assert 0.0 <= k <= 1.0 and "gloo_a2a_duplex measured" in spec["inter_node"]["source"]
        probe = spec["emulated"]["measured"]["gloo_a2a"]
        assert probe["connections"] == 1 and probe["probe_s"] >= probe["wire_s"] * 0.9
        assert "duplex κ" in r.stdout
    finally:
        assert cli("cluster", "down", "--cluster", str(path), timeout=120).returncode == 0
