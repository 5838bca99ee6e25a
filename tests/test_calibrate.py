"""calibrate: recovers known α/β, writes the profile the spec reads, and reports residuals (no torch)."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from commtax.cli.measure import calibrate_command
from commtax.costs import collectives as C
from commtax.measure.calibrate import calibrate, compare, levels_from_cluster, model_time_s
from commtax.units import GB, US, MiB

CLUSTER = {
    "gpu": {
        "name": "cpu-gloo",
        "peak_tflops": {"fp32": 0.1, "bf16": 0.1},
        "mem_GiB": 8,
        "mem_bw_GBps": 10,
        "tdp_W": 100,
        "source": "emulated: CPU rank",
    },
    "num_gpus": 4,
    "gpus_per_node": 1,
    "intra_node": {"name": "loopback", "bw_GBps": 5.0, "latency_us": 10.0, "efficiency": 1.0, "kind": "loopback"},
    "inter_node": {"name": "veth-tbf-300mbit", "bw_Gbps": 0.3, "latency_us": 5.0, "efficiency": 1.0},
    "nics_per_node": 1,
}


def synthetic(alpha_s, bw_bytes_per_s, ops=("all_reduce", "all_gather", "reduce_scatter")):
    intra, _ = levels_from_cluster(CLUSTER)
    inter = C.Level("inter", bw_bytes_per_s, alpha_s)
    recs = []
    for op in ops:
        for size in (256 * 1024, MiB, 4 * MiB):
            t = model_time_s(op, "ring", size, 4, 1, intra, inter)
            recs.append(
                {
                    "op": op,
                    "impl": "ring",
                    "backend": "gloo",
                    "world_size": 4,
                    "message_bytes": size,
                    "time_s": t,
                    "algbw_GBps": size / t / GB,
                    "busbw_GBps": 0.0,
                    "nodes": 4,
                    "ranks_per_node": 1,
                }
            )
    return recs


def test_fit_recovers_alpha_and_beta_exactly():
    recs = synthetic(200 * US, 35e6)
    prof = calibrate(recs, CLUSTER)
    assert prof["levels"]["inter"]["bw_GBps"] == pytest.approx(0.035, rel=1e-4)
    assert prof["levels"]["inter"]["latency_us"] == pytest.approx(200.0, rel=1e-3)
    assert prof["residuals"]["levels"]["inter"]["max_rel"] < 1e-6
    assert all(abs(r["error"]) < 1e-4 for r in compare(recs, CLUSTER, prof))


def test_before_calibration_error_is_the_bandwidth_gap():
    recs = synthetic(5 * US, 35e6)  # the links deliver 35 MB/s of the 37.5 MB/s tc rate
    errs = [r["error"] for r in compare(recs, CLUSTER) if r["message_bytes"] >= MiB]
    assert max(abs(e) for e in errs) == pytest.approx(1 - 35e6 / 37.5e6, rel=0.02)


def test_profile_is_what_the_spec_and_topology_read(tmp_path):
    from commtax.costs.topology import inter_level
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster

    prof = calibrate(synthetic(150 * US, 30e6), CLUSTER, source="test")
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(prof))
    raw = resolve_cluster({**CLUSTER, "profile": str(tmp_path / "profile.yaml")}, load_catalog())
    cluster = build(Cluster, raw, "cluster")
    lvl = inter_level(cluster, "all_reduce")
    assert lvl.bw_bytes_per_s == pytest.approx(30e6, rel=1e-4)
    assert lvl.latency_s == pytest.approx(150 * US, rel=1e-3)


def test_gemm_efficiency_is_median_over_peak():
    gemm = [{"op": "gemm", "dtype": "fp32", "tflops": x} for x in (0.02, 0.05, 0.04)]
    prof = calibrate(synthetic(100 * US, 30e6), CLUSTER, gemm)
    assert prof["gemm_efficiency"] == {"fp32": pytest.approx(0.04 / 0.1)}


def test_calibrate_cli_prints_residuals_and_writes_profile(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps(synthetic(100 * US, 30e6)))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    import typer

    app = typer.Typer()
    app.command()(calibrate_command)
    r = CliRunner().invoke(
        app,
        [
            str(tmp_path / "bench.json"),
            "--cluster",
            str(tmp_path / "c.yaml"),
            "--out",
            str(tmp_path / "p.yaml"),
            "--impl",
            "ring",
            "--cluster-out",
            str(tmp_path / "cp.yaml"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "+0.0%" in r.output and yaml.safe_load((tmp_path / "p.yaml").read_text())["levels"]["inter"]
    # the calibrated cluster file drives the predictor: collective_cost now sees the fitted 30 MB/s, 100 µs
    from commtax.costs.collectives import collective_cost
    from commtax.costs.topology import placement
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster

    cluster = build(Cluster, resolve_cluster(str(tmp_path / "cp.yaml"), load_catalog()), "cluster")
    t = collective_cost("all_reduce", 4 * MiB, placement(cluster, 4, 1, "all_reduce"), "ring").time_s
    assert t == pytest.approx(2 * 3 * 100 * US + 2 * 3 / 4 * 4 * MiB / 30e6, rel=1e-3)  # ring, Thakur et al. 2005


def test_calibrate_cli_bad_input_exits_2(tmp_path):
    import typer

    app = typer.Typer()
    app.command()(calibrate_command)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "empty.json").write_text("[]")
    r = CliRunner().invoke(app, [str(tmp_path / "empty.json"), "--cluster", str(tmp_path / "c.yaml")])
    assert r.exit_code == 2 and "no multi-rank collective records" in r.output
    r = CliRunner().invoke(app, [str(tmp_path / "missing.json"), "--cluster", str(tmp_path / "c.yaml")])
    assert r.exit_code == 2 and "calibrate:" in r.output


def test_a_latency_bound_intra_fit_keeps_the_clusters_link_and_estimate_accepts_the_profile(tmp_path):
    """Intra records whose time is all latency leave β at its floor (1e6 GB/s once, which estimate refuses
    over its 100,000 bound): the cluster's link stays, the profile says why, and the spec reads it."""
    from commtax.spec import Profile

    intra = C.Level("intra", 1e20, 30 * US)  # no bandwidth term at all: every size takes the same time
    recs = []
    for size in (256 * 1024, MiB, 4 * MiB):
        t = model_time_s("all_reduce", "ring", size, 2, 2, intra, intra)
        recs.append(
            {"op": "all_reduce", "impl": "ring", "world_size": 2, "ranks_per_node": 2, "nodes": 1}
            | {"message_bytes": size, "time_s": t}
        )
    prof = calibrate(recs, {**CLUSTER, "gpus_per_node": 2})
    assert prof["levels"]["intra"]["bw_GBps"] == 5.0  # the cluster file's loopback, not the fit
    assert "intra: the fitted bandwidth" in prof["notes"][0] and "the cluster's number is kept" in prof["notes"][0]
    Profile(**prof)


def test_records_from_a_bigger_cluster_are_refused(tmp_path):
    import typer

    app = typer.Typer()
    app.command()(calibrate_command)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    recs = synthetic(100 * US, 30e6)
    recs[0]["world_size"] = 10**9
    (tmp_path / "b.json").write_text(json.dumps(recs))
    out = tmp_path / "p.yaml"
    r = CliRunner().invoke(app, [str(tmp_path / "b.json"), "--cluster", str(tmp_path / "c.yaml"), "--out", str(out)])
    assert r.exit_code == 2 and "world_size 1000000000 is more than the cluster's 4 GPUs" in r.output
    assert not out.exists()


# ----------------------------------------------------------------------------- the library under `commtax calibrate`
def test_calibrate_files_fits_the_records_of_one_impl_and_writes_both_files(tmp_path):
    from commtax.measure.calibrate import calibrate_files, write_calibration
    from commtax.report.text import calibration_lines

    records = synthetic(100 * US, 30e6)
    (tmp_path / "bench.json").write_text(json.dumps(records + [{**records[0], "impl": "torch"}]))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    c = calibrate_files(tmp_path / "bench.json", tmp_path / "c.yaml", impl="ring")
    assert len(c.records) == len(records)  # the torch record is not ring's
    residuals = c.residuals()
    assert all(after["error"] == pytest.approx(0, abs=1e-6) for _, after in residuals)  # α, β recovered exactly
    assert all(abs(before["error"]) > 0.01 for before, _ in residuals)  # the catalog's 0.3 Gb/s link is not 30 MB/s
    out, cluster_out = tmp_path / "p.yaml", tmp_path / "cp.yaml"
    write_calibration(c, out, cluster_out)
    assert yaml.safe_load(out.read_text())["levels"]["inter"]
    assert yaml.safe_load(cluster_out.read_text())["profile"] == str(out.resolve())
    lines = calibration_lines(c, out, cluster_out)
    assert len(lines) == 1 + len(records) + 1  # header, one per record, where it went
    assert all(len(line) <= 80 for line in lines[:-1])
    assert lines[-1].startswith(f"wrote {out} and {cluster_out}; in a job file")


def test_calibrate_files_names_what_is_wrong(tmp_path):
    from commtax.errors import SpecError
    from commtax.measure.calibrate import calibrate_files

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SpecError, match="^calibrate: "):
        calibrate_files(tmp_path / "bad.json", tmp_path / "c.yaml")
    (tmp_path / "bench.json").write_text(json.dumps(synthetic(100 * US, 30e6)))
    with pytest.raises(SpecError, match=r"^--cluster: .*missing.yaml does not exist; create it with `commtax cluster"):
        calibrate_files(tmp_path / "bench.json", tmp_path / "missing.yaml", impl="ring")
    with pytest.raises(SpecError, match=r"^calibrate: .*bench.json has no multi-rank collective records ≥ 64 KiB"):
        calibrate_files(tmp_path / "bench.json", tmp_path / "c.yaml", impl="tree")  # no tree records: nothing to fit
