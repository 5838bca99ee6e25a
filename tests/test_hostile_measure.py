"""Hostile input to bench, calibrate and the emulated cluster: checked once, before any rank or namespace exists.

Classes (issue 12): calibrate's tracebacks (records, times, sizes, cluster files, --gemm, outputs), bench
arguments (--factor, --min/--max, --backend, --fault, --out/--append, gemm --hidden, p2p --bytes), crafted
cluster files (`emulated:` missing or wrong), `cluster run` of a program that is not there, the nodes' commtax.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import typer
import yaml
from test_calibrate import CLUSTER, synthetic
from typer.testing import CliRunner

from commtax.cli.measure import bench_app, calibrate_command, cluster_app
from commtax.measure.calibrate import calibrate
from commtax.measure.cluster import EmulatedCluster, load_cluster_file, resolve_command

runner = CliRunner()


def one_line(r, needle: str, code: int = 2) -> None:
    assert r.exit_code == code, r.output[-2000:]
    assert "Traceback" not in r.output and needle in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


# ----------------------------------------------------------------------------- calibrate
def _calibrate_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(calibrate_command)
    return app


GOOD = synthetic(100e-6, 30e6)


def _with(**changes) -> list:
    return [{**GOOD[0], **changes}, *GOOD[1:]]


@pytest.mark.parametrize(
    "records,needle",
    [
        ([1, 2, 3], "record 0: expected a mapping, got 1"),
        (["all_reduce"], "record 0: expected a mapping"),
        ([None], "record 0: expected a mapping, got None"),
        ({"op": "all_reduce"}, "expected a JSON list"),
        (_with(time_s=0), "time_s must be a positive finite number, got 0"),
        (_with(time_s=-0.5), "time_s must be a positive finite number"),
        (_with(time_s="fast"), "time_s must be a positive finite number, got 'fast'"),
        (_with(time_s=None), "time_s must be a positive finite number, got None"),
        (_with(message_bytes="4MiB"), "message_bytes must be a positive finite number"),
        (_with(message_bytes=-4), "message_bytes must be a positive finite number"),
        (_with(world_size=0), "world_size must be a positive integer"),
        (_with(world_size=2.5), "world_size must be a positive integer"),
        (_with(ranks_per_node=0), "ranks_per_node must be a positive integer"),
        (_with(nodes=True), "nodes must be a positive integer"),
        (_with(op=7), "op and impl are names"),
    ],
)
def test_calibrate_bad_records_are_one_line(tmp_path, records, needle):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "b.json").write_text(json.dumps(records))
    r = runner.invoke(
        _calibrate_app(),
        [
            str(tmp_path / "b.json"),
            "--cluster",
            str(tmp_path / "c.yaml"),
            "--impl",
            "ring",
            "--out",
            str(tmp_path / "p.yaml"),
        ],
    )
    one_line(r, needle)
    assert not (tmp_path / "p.yaml").exists()


def test_calibrate_nan_time_is_refused(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "b.json").write_text(json.dumps(_with(time_s=float("nan"))))  # Python writes NaN
    r = runner.invoke(
        _calibrate_app(), [str(tmp_path / "b.json"), "--cluster", str(tmp_path / "c.yaml"), "--impl", "ring"]
    )
    one_line(r, "time_s must be a positive finite number, got nan")


@pytest.mark.parametrize(
    "cluster,needle",
    [
        ([1, 2], "a cluster file is a mapping"),
        ({**CLUSTER, "gpus_per_node": 0}, "gpus_per_node"),
        ({**CLUSTER, "inter_node": {**CLUSTER["inter_node"], "bw_Gbps": 0}}, "inter_node.bw_Gbps"),
        ({**CLUSTER, "intra_node": "no-such-link"}, "unknown intra_node 'no-such-link'"),
    ],
)
def test_calibrate_bad_cluster_files_are_one_line(tmp_path, cluster, needle):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp_path / "b.json").write_text(json.dumps(GOOD))
    r = runner.invoke(
        _calibrate_app(), [str(tmp_path / "b.json"), "--cluster", str(tmp_path / "c.yaml"), "--impl", "ring"]
    )
    one_line(r, needle)


def test_calibrate_accepts_a_job_file_with_catalog_ids(tmp_path):
    job = {
        "model": "llama2-7b",
        "cluster": {
            "gpu": "h100-sxm5-80gb",
            "num_gpus": 4,
            "gpus_per_node": 1,
            "intra_node": "nvlink4",
            "inter_node": "ib-ndr",
            "nics_per_node": 1,
        },
        "training": {"seq_len": 128, "global_batch": 4},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "b.json").write_text(json.dumps(GOOD))
    r = runner.invoke(
        _calibrate_app(),
        [
            str(tmp_path / "b.json"),
            "--cluster",
            str(tmp_path / "job.yaml"),
            "--impl",
            "ring",
            "--out",
            str(tmp_path / "p.yaml"),
        ],
    )
    assert r.exit_code == 0, r.output
    inter = yaml.safe_load((tmp_path / "p.yaml").read_text())["levels"]["inter"]
    assert inter["bw_GBps"] == pytest.approx(30e6 / 1e9, rel=1e-3)  # the fit does not depend on the start point


@pytest.mark.parametrize(
    "gemm,needle",
    [
        ({"dtype": "fp32"}, "expected a JSON list of GEMM records"),
        ([{"dtype": "fp32"}], "tflops must be a positive finite number"),
        ([{"dtype": "fp32", "tflops": 0}], "tflops must be a positive finite number, got 0"),
        ([{"dtype": "fp32", "tflops": -1}], "tflops must be a positive finite number"),
        ([["fp32", 1.0]], "expected a mapping with dtype and tflops"),
        ([{"dtype": "fp32", "tflops": 5.0}], "an efficiency must be in (0, 1]"),  # 5 TFLOP/s on a 0.1 TFLOP/s peak
    ],
)
def test_calibrate_bad_gemm_records_are_one_line(tmp_path, gemm, needle):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "b.json").write_text(json.dumps(GOOD))
    (tmp_path / "g.json").write_text(json.dumps(gemm))
    r = runner.invoke(
        _calibrate_app(),
        [
            str(tmp_path / "b.json"),
            "--cluster",
            str(tmp_path / "c.yaml"),
            "--impl",
            "ring",
            "--gemm",
            str(tmp_path / "g.json"),
            "--out",
            str(tmp_path / "p.yaml"),
        ],
    )
    one_line(r, needle)
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("option", ["--out", "--cluster-out"])
def test_calibrate_outputs_are_checked_before_anything_is_written(tmp_path, option):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "b.json").write_text(json.dumps(GOOD))
    (tmp_path / "adir").mkdir()
    args = [
        str(tmp_path / "b.json"),
        "--cluster",
        str(tmp_path / "c.yaml"),
        "--impl",
        "ring",
        "--out",
        str(tmp_path / "p.yaml"),
        "--cluster-out",
        str(tmp_path / "cp.yaml"),
    ]
    args[args.index(option) + 1] = str(tmp_path / "adir")
    one_line(runner.invoke(_calibrate_app(), args), "is a directory")
    assert not (tmp_path / "p.yaml").exists() and not (tmp_path / "cp.yaml").exists()


def test_calibrated_profile_from_gemm_hidden_0_never_writes_a_zero_efficiency():
    prof = calibrate(GOOD, CLUSTER, [{"dtype": "fp32", "tflops": 1e-9}])
    assert prof["gemm_efficiency"]["fp32"] > 0  # at least 1e-4: `estimate` never divides by zero


# ----------------------------------------------------------------------------- bench, checked in the launcher
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--factor", "1.0000001"], "message sizes"),
        (["--factor", "nan"], "--factor"),
        (["--factor", "inf"], "--factor"),
        (["--min", "1e30", "--max", "1e30"], "--min"),
        (["--max", "100GiB"], "--max"),
        (["--timeout", "inf"], "--timeout"),
        (["--fault", "x"], "--fault: expected RANK:INDEX:kill|stop"),
        (["--fault", "1:2:explode"], "--fault"),
        (["--out", "/nonexistent/b.json"], "does not exist"),
    ],
)
def test_bench_arguments_are_checked_once_before_any_rank(tmp_path, args, needle):
    r = runner.invoke(bench_app, ["collective", *args], env={k: v for k, v in os.environ.items() if k != "RANK"})
    one_line(r, needle)


def test_bench_out_directory_and_corrupt_append_are_one_line(tmp_path):
    one_line(runner.invoke(bench_app, ["collective", "--out", str(tmp_path)]), "is a directory")
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    one_line(runner.invoke(bench_app, ["collective", "--out", str(bad), "--append"]), "--append")


@pytest.mark.skipif(any(Path(f"/dev/nvidia{i}").exists() for i in range(8)), reason="this machine has GPUs")
def test_bench_nccl_without_gpus_is_one_line():
    pytest.importorskip("torch")
    one_line(runner.invoke(bench_app, ["collective", "--backend", "nccl"]), "--backend nccl: no CUDA GPU")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["gemm", "--hidden", "0"], "--hidden: sizes from 1"),
        (["gemm", "--hidden", "-64"], "--hidden"),
        (["gemm", "--hidden", "1000000"], "--hidden"),
        (["gemm", "--hidden", "1e6"], "--hidden: expected comma-separated integers"),
        (["p2p", "--bytes", "1e30"], "at most 1 PiB"),
        (["p2p", "--bytes", "1PiB"], "--bytes"),
    ],
)
def test_gemm_and_p2p_sizes_are_checked(args, needle):
    one_line(runner.invoke(bench_app, args), needle)


# ----------------------------------------------------------------------------- crafted cluster files
EMU = {"name": "ctx0a1b2c", "nodes": 2, "ranks_per_node": 1, "link_Gbps": 0.3}


@pytest.mark.parametrize(
    "emulated,needle",
    [
        (None, "no `emulated:` section"),
        ({k: v for k, v in EMU.items() if k != "nodes"}, "emulated.nodes: expected an integer"),
        ({k: v for k, v in EMU.items() if k != "link_Gbps"}, "emulated.link_Gbps"),
        ({**EMU, "nodes": "two"}, "emulated.nodes: expected an integer in [1, 200], got 'two'"),
        ({**EMU, "nodes": 100_000_000}, "emulated.nodes: expected an integer in [1, 200]"),
        ({**EMU, "nodes": 1e8}, "emulated.nodes"),
        ({**EMU, "ranks_per_node": 0}, "emulated.ranks_per_node"),
        ({**EMU, "link_Gbps": float("nan")}, "emulated.link_Gbps"),
        ({**EMU, "name": "../../etc"}, "emulated.name"),
        ({**EMU, "name": "ctx0a1b2c; rm -rf /"}, "emulated.name"),
    ],
)
def test_crafted_emulated_sections_are_one_value_error(emulated, needle):
    with pytest.raises(ValueError, match=None) as e:
        EmulatedCluster.from_spec({"emulated": emulated} if emulated is not None else {})
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("- a\n- b\n", "a cluster file is a mapping"),
        ("emulated: {name: ctx0a1b2c, nodes: two, ranks_per_node: 1, link_Gbps: 1}\n", "emulated.nodes"),
        ("emulated: {name: ctx0a1b2c}\nemulated: {name: ctx999999}\n", "duplicate key"),
    ],
)
@pytest.mark.parametrize("command", [["down"], ["run", "--", "true"]])
def test_cluster_down_and_run_on_crafted_files_are_one_line(tmp_path, text, needle, command):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    r = runner.invoke(cluster_app, [command[0], "--cluster", str(p), *command[1:]])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert needle in r.output or "needs root" in r.output or "needs Linux" in r.output, r.output


def test_load_cluster_file_is_bounded():
    with pytest.raises(Exception, match="larger than 16 MiB"):
        load_cluster_file("/dev/zero")


# ----------------------------------------------------------------------------- what the nodes run
def test_a_missing_program_is_one_value_error():
    with pytest.raises(ValueError, match="/nonexistent/prog: command not found"):
        resolve_command(["/nonexistent/prog", "--flag"])
    with pytest.raises(ValueError, match="no-such-tool-xyz: command not found"):
        resolve_command(["no-such-tool-xyz"])


def test_nodes_run_the_commtax_and_python_that_launched_them(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # as under sudo: the venv is not on PATH
    assert resolve_command(["python", "-c", "1"]) == [sys.executable, "-c", "1"]
    cmd = resolve_command(["commtax", "bench", "collective"])
    script = Path(sys.executable).parent / "commtax"
    assert cmd == ([str(script)] if script.exists() else [sys.executable, "-m", "commtax.cli"]) + [
        "bench",
        "collective",
    ]
    assert resolve_command(["sh", "-c", "true"])[0].endswith("/sh")
