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
    ],
)
def test_bad_fabric_options_are_one_line(args, msg, tmp_path):
    r = cli("cluster", "up", *args, "--out", str(tmp_path / "c.yaml"), timeout=60)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


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
        "--out",
        str(path),
    )
    assert r.returncode == 0, r.stderr
    try:
        spec = yaml.safe_load(path.read_text())
        sw = spec["emulated"]["switch_namespace"]
        qdisc = subprocess.run(
            ["ip", "netns", "exec", sw, "tc", "qdisc", "show", "dev", "u0"], capture_output=True, text=True
        )
        assert "tbf" in qdisc.stdout and "200Mbit" in qdisc.stdout
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
        assert spec["fabric"]["flows"] == [{"src": 0, "dst": 2, "rate_Gbps": 0.2}]
        n0 = spec["emulated"]["namespaces"][0]
        assert subprocess.run(["ip", "netns", "pids", n0], capture_output=True, text=True).stdout.split()  # it runs
        pred = subprocess.run(
            [
                sys.executable,
                "-m",
                "commtax.cli",
                "collective",
                "all_reduce",
                "--bytes",
                "8MiB",
                "--cluster",
                str(path),
                "--json",
            ],
            capture_output=True,
            text=True,
        )
        p = json.loads(pred.stdout)
        # the flow shares node 0's NIC and the spine with the ring: half the link each (max-min)
        assert p["binding_link"] and p["busbw_GBps"] == pytest.approx(0.2 / 8 / 2, rel=0.05)
    finally:
        down = cli("cluster", "down", "--cluster", str(path), timeout=60)
    assert down.returncode == 0
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert spec["emulated"]["name"] not in ns
