"""commtax cluster: namespaces + bridge + tc tbf; what it builds, that it cleans up, that ranks talk over it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

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
        r = cli("cluster", "up", "--no-duplex-probe", *args, "--out", str(path), timeout=120)
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
    qdisc = subprocess.run(
        ["ip", "netns", "exec", emu["namespaces"][0], "tc", "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
    ).stdout
    assert "tbf" in qdisc and "200Mbit" in qdisc
    assert "10.213." not in subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    # oversubscribed uplink: two leaf bridges joined by a veth shaped at 100 Mbit/s
    uplink = subprocess.run(
        ["ip", "netns", "exec", emu["switch_namespace"], "tc", "qdisc", "show", "dev", "u0"],
        capture_output=True,
        text=True,
    ).stdout
    assert "tbf" in uplink and "100Mbit" in uplink and emu["leaves"] == [0, 1]
    # the job-file side reads it: 0.2 Gbit/s over 2 ranks is 12.5 MB/s per GPU
    from commtax.costs.topology import inter_level
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster

    cluster = build(Cluster, resolve_cluster(str(path), load_catalog()), "cluster")
    assert inter_level(cluster).bw_bytes_per_s == pytest.approx(0.2e9 / 8 / 2)
    r = cli("cluster", "down", "--cluster", str(path))
    assert r.returncode == 0 and not (mine & namespaces())


@netns
@pytest.mark.timing
def test_measured_link_bandwidth_is_the_tc_rate(cluster_file):
    require_netns()
    _, spec = cluster_file("--nodes", "2", "--link", "200mbit")
    assert spec["emulated"]["measured"]["link_bw_GBps"] == pytest.approx(0.2 / 8, rel=0.1)  # one TCP stream


def test_without_root_says_so_and_exits_2(monkeypatch):
    from commtax.cli.measure import cluster_app

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = CliRunner().invoke(cluster_app, ["up", "--nodes", "2"])
    assert r.exit_code == 2 and "needs root" in r.output


def test_bad_link_rate_exits_2():
    from commtax.cli.measure import cluster_app

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


def _running_in(ns: str, program: str) -> bool:
    """A process of ``ns`` runs ``program`` (its argv[0] from /proc)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
    for pid in pids:
        try:
            if Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()).name == program:
                return True
        except OSError:
            continue
    return False


@netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_on_run_kills_every_rank_and_says_one_line(cluster_file, sig):
    """Issue 22: the signal was followed by torchrun's SignalException traceback and its warnings (36-63 lines). Now
    `cluster run` says it once, exits 130, and no rank is left in any node."""
    require_netns()
    path, spec = cluster_file("--nodes", "2", "--link", "100mbit")
    p = subprocess.Popen(
        [sys.executable, "-m", "commtax.cli.measure", "cluster", "run", "--cluster", str(path), "--", "sleep", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 120  # a hang guard only: torchrun starts `sleep` in both nodes
        while not all(_running_in(ns, "sleep") for ns in spec["emulated"]["namespaces"]):
            assert p.poll() is None and time.monotonic() < end, "the ranks did not start"
            time.sleep(0.2)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:  # a failed check: stop it as a user would (its ranks hold the pipe: no wait without a limit)
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)
    assert p.returncode == 130 and err.splitlines() == ["commtax cluster: interrupted; stopping every rank"], err
    left = [
        subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
        for ns in spec["emulated"]["namespaces"]
    ]
    assert left == [[], []]


# ----------------------------------------------------------------------------- issue 10/12: reliability
UPLINK_CLUSTER = {  # what `cluster up --nodes 4 --ranks-per-node 2 --link 1gbit --uplink 200mbit` writes
    "gpu": {"name": "cpu-gloo", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "test"},
    "num_gpus": 8,
    "gpus_per_node": 2,
    "intra_node": {"name": "loopback", "bw_GBps": 2.0, "latency_us": 20.0, "efficiency": 1.0, "kind": "loopback"},
    "inter_node": {"name": "veth", "bw_Gbps": 1.0, "latency_us": 50.0, "efficiency": 1.0},
    "nics_per_node": 1,
    "uplink_Gbps": 0.2,
    "collective_library": "gloo",
}


def test_uplink_caps_a_ring_that_spans_both_halves():
    from commtax.costs.collectives import collective_cost
    from commtax.costs.topology import placement
    from commtax.spec import Cluster

    c = Cluster.model_validate(UPLINK_CLUSTER)
    S = 2 * 2**20
    t = collective_cost("all_reduce", S, placement(c, 8, 1, "all_reduce")).time_s
    # ring over 8 ranks crosses the 0.2 Gbit/s uplink once per direction: 2(n-1)α + 2(n-1)/n · S / B_uplink
    assert t == pytest.approx(2 * 7 * 50e-6 + 2 * 7 / 8 * S / (0.2e9 / 8), rel=1e-6)
    # a group inside one half (2 nodes of 4) does not cross it: the 1 Gbit/s node link bounds it
    t2 = collective_cost("all_reduce", S, placement(c, 4, 1, "all_reduce")).time_s
    assert t2 == pytest.approx(2 * 3 * 50e-6 + 2 * 3 / 4 * S / (1e9 / 8), rel=1e-6)
    no_uplink = Cluster.model_validate({**UPLINK_CLUSTER, "uplink_Gbps": None})
    assert collective_cost("all_reduce", S, placement(no_uplink, 8, 1, "all_reduce")).time_s < t / 4


@netns
def test_uplink_is_written_and_priced_and_commtax_runs_on_the_nodes(cluster_file, tmp_path):
    """Issue 10: 4×2 with a 200 Mbit uplink was predicted 30 ms where 159 ms was measured (2 MiB all_reduce)."""
    require_netns()
    path, spec = cluster_file("--nodes", "4", "--ranks-per-node", "2", "--link", "1gbit", "--uplink", "200mbit")
    assert spec["uplink_Gbps"] == pytest.approx(0.2)
    out = tmp_path / "u.json"
    env = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # as under sudo: the venv is not on PATH
    errors = []
    for _ in range(2):  # one re-measurement: a neighbour's CPU burst is not the model's fault
        out.unlink(missing_ok=True)
        r = cli(
            "cluster",
            "run",
            "--cluster",
            str(path),
            "--",
            "commtax",
            "bench",
            "collective",
            "--ops",
            "all_reduce",
            "--min",
            "2MiB",
            "--max",
            "2MiB",
            "--iters",
            "5",
            "--out",
            str(out),
            timeout=300,
            env=env,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        measured = json.loads(out.read_text())[0]["time_s"]
        pred = cli_json("collective", "all_reduce", "--bytes", "2MiB", "--cluster", str(path))["time_s"]
        errors.append(pred / measured - 1)
        if abs(errors[-1]) <= 0.15:
            break
    assert abs(errors[-1]) <= 0.15, errors


def cli_json(*args: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "commtax.cli", *args, "--json"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@netns
def test_run_of_a_missing_program_is_one_line(cluster_file):
    require_netns()
    path, _ = cluster_file("--nodes", "2", "--link", "100mbit")
    r = cli("cluster", "run", "--cluster", str(path), "--", "/nonexistent/prog", timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "error: cluster run: /nonexistent/prog: command not found"


def _interrupt_up(out, sig, nodes: int = 20) -> tuple[str, int, str]:
    """Start `cluster up --nodes N --out OUT`, send ``sig`` once its record is in OUT (before the first
    namespace: 20 nodes take seconds to build), and return (cluster id, exit status, stderr)."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "commtax.cli.measure",
            "cluster",
            "up",
            "--no-duplex-probe",
            "--nodes",
            str(nodes),
            "--out",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    end = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < end and "emulated" not in (out.read_text() if out.exists() else ""):
        time.sleep(0.05)  # the record is written before the first namespace
    name = yaml.safe_load(out.read_text())["emulated"]["name"]
    p.send_signal(sig)
    _, err = p.communicate(timeout=180)
    return name, p.returncode, err


@netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_up_interrupted_while_building_leaves_no_namespace_and_no_record(tmp_path, sig):
    require_netns()
    out = tmp_path / "big.yaml"
    name, code, err = _interrupt_up(out, sig)
    assert code == 130 and "Traceback" not in err, err[-2000:]
    assert not [ns for ns in namespaces() if ns.startswith(name)] and not out.exists()


@netns
def test_up_interrupted_puts_back_the_users_own_out_file(tmp_path):
    require_netns()
    out = tmp_path / "notes.yaml"
    out.write_text("my notes: keep me\n")
    out.chmod(0o600)
    name, code, err = _interrupt_up(out, signal.SIGTERM)
    assert code == 130 and "Traceback" not in err, err[-2000:]
    assert not [ns for ns in namespaces() if ns.startswith(name)]
    assert out.read_text() == "my notes: keep me\n" and stat.S_IMODE(out.stat().st_mode) == 0o600


@netns
def test_down_of_a_cluster_with_no_ownership_record_is_refused(tmp_path):
    """`down --cluster F` where F names a cluster this user's `cluster up` has no record of (another user's
    or tool's, with a process running in it): one line, exit 2, the namespaces and the process untouched."""
    require_netns()
    theirs = tmp_path / "reg-theirs"
    env = {**os.environ, "COMMTAX_CLUSTER_REGISTRY": str(theirs)}
    out = tmp_path / "theirs.yaml"
    r = cli("cluster", "up", "--nodes", "1", "--out", str(out), timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    emu = yaml.safe_load(out.read_text())["emulated"]
    sleeper = subprocess.Popen(["ip", "netns", "exec", emu["namespaces"][0], "sleep", "120"])
    try:
        mine = {**os.environ, "COMMTAX_CLUSTER_REGISTRY": str(tmp_path / "reg-mine")}
        r = cli("cluster", "down", "--cluster", str(out), timeout=60, env=mine)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"error: --cluster: cluster {emu['name']}") and "no record" in r.stderr
        assert set(emu["namespaces"]) <= namespaces() and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        cli("cluster", "down", "--cluster", str(out), timeout=60, env=env)
    assert not set(emu["namespaces"]) & namespaces()


@netns
def test_up_refuses_to_overwrite_a_live_clusters_record(cluster_file):
    require_netns()
    path, spec = cluster_file("--nodes", "2", "--link", "100mbit")
    before = namespaces()
    r = cli("cluster", "up", "--nodes", "2", "--out", str(path), timeout=120)
    assert r.returncode == 2 and f"records cluster {spec['emulated']['name']}, which still exists" in r.stderr
    assert yaml.safe_load(path.read_text()) == spec and namespaces() == before


@netns
@pytest.mark.parametrize("bad_out", ["dir", "long"])
def test_up_with_an_unwritable_out_builds_nothing(tmp_path, bad_out):
    require_netns()
    out = tmp_path if bad_out == "dir" else tmp_path / ("x" * 300 + ".yaml")
    before = namespaces()
    r = cli("cluster", "up", "--nodes", "2", "--out", str(out), timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and namespaces() == before


@netns
def test_down_all_removes_only_this_users_idle_clusters(tmp_path, monkeypatch):
    """Another tool's (or user's) cluster and a cluster something runs in are kept; ours is removed."""
    require_netns()
    mine, theirs = tmp_path / "reg-mine", tmp_path / "reg-theirs"
    made = []
    try:
        for reg, name in ((mine, "idle"), (theirs, "other"), (mine, "busy")):
            out = tmp_path / f"{name}.yaml"
            r = cli(
                "cluster",
                "up",
                "--nodes",
                "1",
                "--out",
                str(out),
                timeout=120,
                env={**os.environ, "COMMTAX_CLUSTER_REGISTRY": str(reg)},
            )
            assert r.returncode == 0, r.stderr
            made.append((reg, out, yaml.safe_load(out.read_text())["emulated"]))
        busy_ns = made[2][2]["namespaces"][0]
        sleeper = subprocess.Popen(["ip", "netns", "exec", busy_ns, "sleep", "120"])
        try:
            r = cli(
                "cluster",
                "down",
                "--all",
                timeout=120,
                env={**os.environ, "COMMTAX_CLUSTER_REGISTRY": str(mine)},
                stdin=subprocess.DEVNULL,
            )
            left = namespaces()
        finally:
            sleeper.kill()
            sleeper.wait()
        assert r.returncode == 0, r.stderr
        idle, other, busy = (m[2] for m in made)
        assert not any(ns.startswith(idle["name"]) for ns in left)
        assert (
            any(ns.startswith(other["name"]) for ns in left) and f"kept cluster {other['name']}: no record" in r.stderr
        )
        assert any(ns.startswith(busy["name"]) for ns in left) and "processes are running" in r.stderr
    finally:
        for reg, out, _ in made:
            cli(
                "cluster",
                "down",
                "--cluster",
                str(out),
                timeout=60,
                env={**os.environ, "COMMTAX_CLUSTER_REGISTRY": str(reg)},
            )


def test_host_copy_bandwidth_counts_read_and_write():
    from commtax.measure.cluster import host_copy_bw_GBps

    # 4 MiB copied once per try: 8 MiB moved; even a loaded core copies faster than 10 MB/s, no DRAM beyond 1 TB/s
    bw = host_copy_bw_GBps(nbytes=4 * 2**20, iters=3)
    assert 0.01 < bw < 1000
