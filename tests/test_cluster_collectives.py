"""Real gloo collectives over tc-shaped links vs the cost model (needs root, netns and torch).

Small on purpose (a few MiB over 300 Mbit/s links): each sweep is seconds. What the default suite
asserts cannot move with host load: the bytes each node's NIC sent (its interface counters) against
the bytes the model says the algorithm puts on the wire. The timing checks (model within 10% of the
measured time, our ring at 90% of gloo's busbw) are marked ``timing``: they run with COMMTAX_TIMING=1
on a quiet host (docs/measure.md), since CPU ranks that other work preempts cannot keep a link busy.
"""

from __future__ import annotations

import pytest
import yaml

from commtax.measure.testing import cli, records, require_netns

pytest.importorskip("torch")
pytestmark = [pytest.mark.netns, pytest.mark.torch]

MiB = 2**20
PY_BENCH = ("bench", "collective")


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory):
    require_netns()
    path = tmp_path_factory.mktemp("c4") / "cluster.yaml"
    r = cli(
        "cluster",
        "up",
        "--no-duplex-probe",
        "--nodes",
        "4",
        "--ranks-per-node",
        "1",
        "--link",
        "300mbit",
        "--out",
        str(path),
    )
    assert r.returncode == 0, r.stderr
    yield path, yaml.safe_load(path.read_text())
    cli("cluster", "down", "--cluster", str(path))


def sweep(cluster, out, *args, timeout=240):
    import sys

    out.unlink(missing_ok=True)
    r = cli(
        "cluster",
        "run",
        "--cluster",
        str(cluster),
        "--grace",
        "15",
        "--",
        sys.executable,
        "-m",
        "commtax.cli.measure",
        *PY_BENCH,
        "--out",
        str(out),
        *args,
        timeout=timeout,
    )
    return r, records(out)


def checked(recs):
    """gloo's all_reduce (a ring), our ring all_gather and reduce_scatter: the algorithms collectives.py prices.

    gloo's own reduce_scatter all-reduces the whole buffer (2× the ring's time), and its
    all_gather runs ~10–13% below the ring model at 1 MiB on these links: see docs/measure.md.
    """
    keep = {("all_reduce", "torch"), ("all_gather", "ring"), ("reduce_scatter", "ring")}
    return [r for r in recs if (r["op"], r["impl"]) in keep and r["message_bytes"] >= MiB]


def worst(rows):
    return max(abs(r["error"]) for r in rows)


def over_tolerance(rows, tolerance=0.10):
    return [(r["op"], r["message_bytes"], round(r["error"], 3)) for r in rows if abs(r["error"]) > tolerance]


def host_busy() -> tuple[bool, str]:
    """Whether other work holds the CPUs (1-minute load average above the core count), and the numbers."""
    import os

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    return load > cores, f"load average {load:.1f} on {cores} cores"


def nic_tx_bytes(spec: dict) -> list[int]:
    """Bytes each node's eth0 has sent (its kernel counter, read inside the node's namespace)."""
    import subprocess

    out = []
    for ns in spec["emulated"]["namespaces"]:
        r = subprocess.run(
            ["ip", "netns", "exec", ns, "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
            capture_output=True,
            text=True,
            check=True,
        )
        out.append(int(r.stdout))
    return out


def wire_bytes(cluster, spec, out, *args) -> list[int]:
    """Bytes per node NIC that one sweep sent (rendezvous and barriers included: small next to MiB messages)."""
    before = nic_tx_bytes(spec)
    r, recs = sweep(cluster, out, *args)
    assert r.returncode == 0 and recs, r.stderr[-2000:]
    return [b - a for a, b in zip(before, nic_tx_bytes(spec))]


@pytest.mark.timing
def test_model_within_10pct_before_and_5pct_after_calibration(four_nodes, tmp_path):
    """Robust to a busy host without loosening the check: 9 back-to-back iterations per size (the slowest
    rank's median), up to 3 measurements, each re-measurement logged with its reason. One measurement must
    meet both tolerances on every row. CPU ranks that other work preempts cannot keep a link busy (on a
    2-core host at load 11 our Python rings ran 17-42% slower than the wire allows): a measurement taken
    while the host was oversubscribed is not evidence against the model, so if every attempt ran on such a
    host the test is skipped with the log, never passed."""
    import sys

    from commtax.measure.calibrate import calibrate, compare

    cluster, spec = four_nodes
    args = (
        "--ops",
        "all_reduce,all_gather,reduce_scatter",
        "--min",
        "1MiB",
        "--max",
        "4MiB",
        "--warmup",
        "2",
        "--iters",
        "9",
        "--impl",
        "torch,ring",
    )
    retries, quiet_failures = [], 0
    for attempt in range(3):  # a neighbour's CPU burst is not the model's fault: measure again, say why
        _, a = sweep(cluster, tmp_path / "a.json", *args)
        before = compare(checked(a), spec)
        profile = calibrate(checked(a), spec)
        _, b = sweep(cluster, tmp_path / "b.json", *args)
        after = compare(checked(b), spec, profile)
        if not over_tolerance(before) and worst(after) <= 0.05:
            break
        busy, load = host_busy()
        quiet_failures += not busy
        retries.append(
            f"attempt {attempt + 1}: before {over_tolerance(before)}, after worst {worst(after):.3f}, "
            f"{load}{' (host oversubscribed)' if busy else ''}"
        )
        print(f"re-measuring: {retries[-1]}", file=sys.stderr)
    else:
        if quiet_failures == 0:
            pytest.skip("every measurement ran on an oversubscribed host: " + "; ".join(retries))
    assert len(before) == 9 and len(after) == 9  # 3 ops × 1, 2, 4 MiB
    assert over_tolerance(before) == [], retries
    assert worst(after) <= 0.05, ([(r["op"], r["message_bytes"], round(r["error"], 3)) for r in after], retries)


def test_our_ring_puts_the_rings_bytes_on_the_wire(four_nodes, tmp_path):
    """Per node NIC, our ring all-reduce sends 2·(n−1)/n·S per call (Thakur et al. 2005), as gloo's ring does."""
    cluster, spec = four_nodes
    args = ("--ops", "all_reduce", "--min", "4MiB", "--max", "4MiB", "--warmup", "1", "--iters", "3")
    ours = wire_bytes(cluster, spec, tmp_path / "r.json", *args, "--impl", "ring")
    ring = 2 * 3 / 4 * 4 * MiB  # bytes per NIC per call, n = 4
    for o in ours:  # 1 warm-up + 3 timed calls, plus TCP headers, rendezvous and barriers (a few %)
        print(f"NIC bytes / ring bytes per call: {o / ring:.3f}")
        assert 4 * ring <= o <= 4.4 * ring, (o / ring, "calls' worth")


@pytest.mark.timing
def test_our_ring_reaches_90pct_of_gloo_busbw_at_16MiB(four_nodes, tmp_path):
    cluster, _ = four_nodes
    for _attempt in range(2):
        _, recs = sweep(
            cluster,
            tmp_path / "r.json",
            "--ops",
            "all_reduce",
            "--min",
            "16MiB",
            "--max",
            "16MiB",
            "--warmup",
            "1",
            "--iters",
            "3",
            "--impl",
            "torch,ring",
        )
        busbw = {r["impl"]: r["busbw_GBps"] for r in recs}
        if busbw["ring"] >= 0.9 * busbw["torch"]:
            break
    assert busbw["ring"] / busbw["torch"] >= 0.9, busbw
    assert busbw["torch"] == pytest.approx(0.3 / 8, rel=0.1)  # busbw of a ring all-reduce ≈ the link rate


def test_killed_rank_fails_the_others_fast_and_keeps_results(four_nodes, tmp_path):
    cluster, _ = four_nodes
    # never a hang: sweep() raises TimeoutExpired if the run outlives its generous guard (no timing asserted)
    r, recs = sweep(
        cluster,
        tmp_path / "k.json",
        "--ops",
        "all_reduce",
        "--min",
        "64KiB",
        "--max",
        "4MiB",
        "--timeout",
        "10",
        "--fault",
        "2:3:kill",
    )
    assert r.returncode != 0
    assert "rank 2 (node 2" in r.stderr and "died or stopped" in r.stderr  # the survivors name it
    assert [x["message_bytes"] for x in recs] == [65536, 131072, 262144]  # finished ones, intact on disk


@pytest.fixture(scope="module")
def two_by_four(tmp_path_factory):
    require_netns()
    path = tmp_path_factory.mktemp("c24") / "c24.yaml"
    r = cli(
        "cluster",
        "up",
        "--no-duplex-probe",
        "--nodes",
        "2",
        "--ranks-per-node",
        "4",
        "--link",
        "300mbit",
        "--out",
        str(path),
    )
    assert r.returncode == 0, r.stderr
    yield path, yaml.safe_load(path.read_text())
    cli("cluster", "down", "--cluster", str(path))


def test_hierarchical_sends_what_the_model_says_over_the_node_nic(two_by_four, tmp_path):
    """The node NIC carries 2·7/8·S per call for the flat ring over 8 ranks and 2·1/2·S for hierarchical
    (node-local reduce, a 2-node ring, node-local broadcast): ×1.75, the NIC's share the model prices."""
    path, spec = two_by_four
    assert spec["intra_node"]["bw_GBps"] > 10 * 0.3 / 8  # loopback inside a node ≫ 10× the link
    args = ("--ops", "all_reduce", "--min", "4MiB", "--max", "4MiB", "--warmup", "1", "--iters", "3")
    flat = wire_bytes(path, spec, tmp_path / "f.json", *args, "--impl", "ring")
    hier = wire_bytes(path, spec, tmp_path / "h.json", *args, "--impl", "hier")
    for f, h in zip(flat, hier):
        print(f"flat / hier NIC bytes: {f / h:.3f}; flat per call: {f / (2 * 7 / 8 * 4 * MiB):.3f}")
        assert f / h == pytest.approx(1.75, rel=0.05), (flat, hier)
        assert 4 * 2 * 7 / 8 * 4 * MiB <= f <= 4.4 * 2 * 7 / 8 * 4 * MiB  # 1 warm-up + 3 timed calls


@pytest.mark.timing
def test_hierarchical_beats_flat_ring_as_predicted(two_by_four, tmp_path):
    from commtax.measure.calibrate import compare

    path, spec = two_by_four
    _, recs = sweep(
        path,
        tmp_path / "h.json",
        "--ops",
        "all_reduce",
        "--min",
        "4MiB",
        "--max",
        "4MiB",
        "--iters",
        "3",
        "--impl",
        "ring,hier",
    )
    rows = {x["impl"]: x for x in compare(recs, spec)}
    measured = rows["ring"]["measured_s"] / rows["hier"]["measured_s"]
    predicted = rows["ring"]["predicted_s"] / rows["hier"]["predicted_s"]
    assert measured > 1.3 and measured == pytest.approx(predicted, rel=0.2)
