"""The emulated two-level fabric: `cluster up --leaves/--spine` and `cluster load` (issue 20); root tests skip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from commtax.measure.cluster import EmulatedCluster
from commtax.measure.testing import cli, require_netns


def test_the_cluster_file_describes_the_fabric_it_built():
    c = EmulatedCluster(4, 1, 200e6, 100e6, leaves=2)
    assert [c.leaf(i) for i in range(4)] == [0, 0, 1, 1]
    # two 200 Mbit/s nodes per leaf over a 100 Mbit/s spine: 4:1
    assert c.fabric()["nodes_per_leaf"] == 2 and c.fabric()["oversubscription"] == {"leaf": 4.0}
    assert "uplink_Gbps" not in c.spec() and c.spec()["fabric"]["topology"] == "tor"
    legacy = EmulatedCluster(4, 1, 200e6, 100e6)  # --uplink: as before
    assert legacy.spec()["uplink_Gbps"] == 0.1 and "fabric" not in legacy.spec()
    assert [EmulatedCluster(6, 1, 1e9, 1e8, leaves=3).leaf(i) for i in range(6)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    "args, msg",
    [
        (("--nodes", "4", "--leaves", "3", "--spine", "100mbit"), "--leaves: 3 leaves do not split 4 nodes"),
        (("--nodes", "4", "--leaves", "2"), "--spine: 2 leaves need the rate"),
        (("--nodes", "4", "--uplink", "100mbit", "--spine", "100mbit"), "--uplink: it is the two-leaf form"),
        (("--queue-ms", "0.1"), "--queue-ms: 0.1 is outside [0.5, 1000] ms"),
        (("--tcp", "vegas"), "--tcp: 'vegas' is not one of reno, cubic, bbr"),
    ],
)
def test_bad_fabric_options_are_one_line(args, msg, tmp_path):
    r = cli("cluster", "up", *args, "--out", str(tmp_path / "c.yaml"), timeout=60)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_up_options_are_a_library_call():
    from commtax.errors import SpecError
    from commtax.measure.cluster import cluster_from_options, up_summary

    c = cluster_from_options(4, 1, "200mbit", spine="100mbit", duplex_probe=False)  # --spine alone: two leaves
    assert (c.leaves, c.link_bit_s, c.uplink_bit_s, c.probe_duplex) == (2, 200e6, 100e6, False)
    per_node = cluster_from_options(2, 1, "200mbit,100mbit", node_speed="1,0.5")
    assert per_node.node_link_bit_s == (200e6, 100e6) and per_node.link_bit_s == 100e6
    assert per_node.node_speed == (1.0, 0.5)
    with pytest.raises(SpecError, match="--link: 3 rates for 2 nodes"):
        cluster_from_options(2, 1, "1gbit,1gbit,1gbit")
    with pytest.raises(SpecError, match="--node-speed: give 2 numbers"):
        cluster_from_options(2, 1, "1gbit", node_speed="1")
    with pytest.raises(SpecError, match=r"--queue-ms: 0.1 is outside \[0.5, 1000\] ms"):
        cluster_from_options(2, 1, "1gbit", queue_ms=0.1)
    with pytest.raises(SpecError, match="--tcp: 'vegas' is not one of reno, cubic, bbr"):
        cluster_from_options(2, 1, "1gbit", tcp="vegas")
    shallow = cluster_from_options(4, 1, "200mbit", spine="200mbit", queue_ms=5, tcp="reno")
    assert (shallow.buffer_ms, shallow.fabric()["queue_ms"], shallow.fabric()["sharing"]) == (5, 5, "tcp")
    assert c.buffer_ms == 100 and "queue_ms" not in c.fabric()  # the deep default: no standing queue priced
    c.measured = {"loopback_bw_GBps": 3.5, "gloo_a2a": {"gloo_a2a_duplex": 0.4}}
    assert up_summary(c, "c.yaml") == (
        f"cluster {c.name}: 4 nodes × 1 ranks, links 200 Mbit/s, 2 leaves, uplink 100 Mbit/s; loopback 3.50 GB/s; "
        "gloo all_to_all duplex κ = 0.4; wrote c.yaml"
    )


@pytest.mark.netns
def test_up_with_leaves_load_and_down(tmp_path):
    require_netns()
    path = tmp_path / "c.yaml"
    r = cli(
        "cluster",
        "up",
        "--no-duplex-probe",
        "--nodes",
        "4",
        "--leaves",
        "2",
        "--link",
        "200mbit",
        "--spine",
        "200mbit",
        "--queue-ms",
        "5",
        "--tcp",
        "reno",  # the kernel's own: every host allows it in a namespace
        "--out",
        str(path),
    )
    assert r.returncode == 0, r.stderr
    try:
        spec = yaml.safe_load(path.read_text())
        sw = spec["emulated"]["switch_namespace"]
        qdisc = subprocess.run(
            ["ip", "netns", "exec", sw, "tc", "qdisc", "show", "dev", "u0"], capture_output=True, text=True, timeout=10
        )
        assert "tbf" in qdisc.stdout and "200Mbit" in qdisc.stdout and "lat 5ms" in qdisc.stdout
        assert spec["emulated"]["measured"]["tcp_congestion_control"] == "reno"
        assert (spec["fabric"]["sharing"], spec["fabric"]["queue_ms"]) == ("tcp", 5.0)
        bad = cli("cluster", "load", "--cluster", str(path), "--from", "0", "--to", "7", "--rate", "50mbit")
        assert bad.returncode == 2 and "--to: node 7 does not exist" in bad.stderr
        r = cli(
            "cluster",
            "load",
            "--cluster",
            str(path),
            "--from",
            "0",
            "--to",
            "2",
            "--rate",
            "200mbit",
            "--seconds",
            "30",
        )
        assert r.returncode == 0, r.stderr
        spec = yaml.safe_load(path.read_text())
        (flow,) = spec["fabric"]["flows"]
        assert {k: flow[k] for k in ("src", "dst", "rate_Gbps")} == {"src": 0, "dst": 2, "rate_Gbps": 0.2}
        (load,) = spec["emulated"]["loads"]
        assert flow["until_unix"] == pytest.approx(load["started_unix"] + 30, abs=0.2)  # its end, recorded
        n0 = spec["emulated"]["namespaces"][0]
        assert subprocess.run(["ip", "netns", "pids", n0], capture_output=True, text=True).stdout.split()  # it runs

        def predict(*extra: str) -> dict:
            argv = [sys.executable, "-m", "commtax.cli", "collective", "all_reduce", "--bytes", "8MiB"]
            argv += ["--cluster", str(path), "--json", *extra]
            return json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout)

        p = predict()
        # the flow shares node 0's NIC and the spine with the ring: TCP-fair with its RTT over two 5 ms queues
        # against the ring hops' one, the ring gets 0.737 of the link (tests/test_fabric_tcp.py), and each of its
        # 6 steps waits out one queue (+30 ms of 0.7 s)
        assert p["binding_link"] and p["busbw_GBps"] == pytest.approx(0.737 * 0.2 / 8, rel=0.06)
        assert p["standing_queue_ms"] == 5.0
        # once its --seconds have run out it is not priced, and the prediction says so
        after = predict("--at", str(flow["until_unix"] + 1))
        assert "binding_link" not in after and after["busbw_GBps"] == pytest.approx(0.2 / 8, rel=0.05)
        assert "standing_queue_ms" not in after
        assert after["ignored_flows"][0]["src"] == 0 and after["ignored_flows"][0]["dst"] == 2
    finally:
        down = cli("cluster", "down", "--cluster", str(path), timeout=60)
    assert down.returncode == 0
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert spec["emulated"]["name"] not in ns
