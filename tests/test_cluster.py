"""commtax cluster: namespaces + bridge + tc tbf; what it builds, that it cleans up, that ranks talk over it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from commtax.measure.testing import cli, require_netns

netns = pytest.mark.netns


@pytest.fixture
def cluster_file(tmp_path):
    """Yields a function that brings a cluster up (CLI) and registers its teardown."""
    made = []

    def up(*args: str):
        path = tmp_path / f"cluster{len(made)}.yaml"
        r = cli("cluster", "up", *args, "--out", str(path), timeout=120)
        assert r.returncode == 0, r.stderr
        made.append(path)
        return path, yaml.safe_load(path.read_text())

    yield up
    for path in made:
        cli("cluster", "down", "--cluster", str(path), timeout=60)


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@netns
def test_up_writes_the_cluster_it_built_and_down_removes_it(cluster_file):
    require_netns()
    path, spec = cluster_file("--nodes", "2", "--ranks-per-node", "2", "--link", "200mbit", "--uplink", "100mbit")
    emu = spec["emulated"]
    assert spec["num_gpus"] == 4 and spec["gpus_per_node"] == 2
    assert spec["inter_node"]["bw_Gbps"] == pytest.approx(0.2)
    assert spec["intra_node"]["bw_GBps"] > 0.2  # loopback, measured: faster than the 0.025 GB/s link
    assert spec["gpu"]["mem_bw_GBps"] == round(spec["emulated"]["measured"]["host_copy_bw_GBps"], 3)  # not 10
    mine = {emu["switch_namespace"], *emu["namespaces"]}
    assert mine <= namespaces() and all(n.startswith(emu["name"]) and n.startswith("ctx") for n in mine)
    # the shaping is really there, and the private addresses exist only inside our namespaces
    qdisc = subprocess.run(["ip", "netns", "exec", emu["namespaces"][0], "tc", "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True).stdout
    assert "tbf" in qdisc and "200Mbit" in qdisc
    assert "10.213." not in subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    # oversubscribed uplink: two leaf bridges joined by a veth shaped at 100 Mbit/s
    uplink = subprocess.run(["ip", "netns", "exec", emu["switch_namespace"], "tc", "qdisc", "show", "dev", "u0"],
                            capture_output=True, text=True).stdout
    assert "tbf" in uplink and "100Mbit" in uplink and emu["leaves"] == [0, 1]
    # the job-file side reads it: 0.2 Gbit/s over 2 ranks is 12.5 MB/s per GPU
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster
    from commtax.topology import inter_level

    cluster = build(Cluster, resolve_cluster(str(path), load_catalog()), "cluster")
    assert inter_level(cluster).bw_bytes_per_s == pytest.approx(0.2e9 / 8 / 2)
    r = cli("cluster", "down", "--cluster", str(path))
    assert r.returncode == 0 and not (mine & namespaces())


@netns
def test_measured_link_bandwidth_is_the_tc_rate(cluster_file):
    require_netns()
    _, spec = cluster_file("--nodes", "2", "--link", "200mbit")
    assert spec["emulated"]["measured"]["link_bw_GBps"] == pytest.approx(0.2 / 8, rel=0.1)  # one TCP stream


def test_without_root_says_so_and_exits_2(monkeypatch):
    from commtax.measure.cli import cluster_app

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = CliRunner().invoke(cluster_app, ["up", "--nodes", "2"])
    assert r.exit_code == 2 and "needs root" in r.output


def test_bad_link_rate_exits_2():
    from commtax.measure.cli import cluster_app

    r = CliRunner().invoke(cluster_app, ["up", "--link", "fast"])
    assert r.exit_code == 2 and "--link" in r.output and "300mbit" in r.output


@netns
def test_interrupted_up_removes_what_it_made(monkeypatch):
    require_netns()
    from commtax.measure import cluster as C

    def boom(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(C.EmulatedCluster, "_measure", boom)
    c = C.EmulatedCluster(2, 1, 100e6)
    with pytest.raises(KeyboardInterrupt):
        c.up()
    assert not set(c.namespaces) & namespaces()


@netns
def test_ctrl_c_on_run_kills_every_rank(cluster_file):
    require_netns()
    path, spec = cluster_file("--nodes", "2", "--link", "100mbit")
    p = subprocess.Popen([sys.executable, "-m", "commtax.measure.cli", "cluster", "run", "--cluster", str(path), "--",
                          "sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8)  # torchrun up, sleep running in both nodes
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) != 0
    left = [subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for ns in spec["emulated"]["namespaces"]]
    assert left == [[], []]


def test_host_copy_bandwidth_counts_read_and_write():
    from commtax.measure.cluster import host_copy_bw_GBps

    # 4 MiB copied once per try: 8 MiB moved; even a loaded core copies faster than 10 MB/s, no DRAM beyond 1 TB/s
    bw = host_copy_bw_GBps(nbytes=4 * 2**20, iters=3)
    assert 0.01 < bw < 1000
