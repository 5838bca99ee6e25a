"""Our own real traces: a tiny GPT trained with torch DistributedDataParallel on CPU (gloo, 2 ranks),
profiled with torch.profiler, then measured by `commtax trace` — on loopback, and on the emulated
cluster's tc-shaped links, where the measured comm tax is checked against the prediction for the
same job (compute calibrated from the trace, links as `commtax cluster up` set and measured them).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "trace" / "tiny_ddp.py"
JOB = REPO / "examples" / "trace" / "tiny_ddp.yaml"
STEPS = 2


def example_module():
    spec = importlib.util.spec_from_file_location("tiny_ddp", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def param_bytes() -> int:
    """fp32 gradient bytes of the model the job file describes (torch's own count, biases included)."""
    m = yaml.safe_load(JOB.read_text())["model"]
    model = example_module().TinyGPT(m["layers"], m["hidden"], m["heads"], m["vocab"])
    return 4 * sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def loopback(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--job", str(JOB), "--out", str(out), "--steps", str(STEPS)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_ddp_trace_on_cpu_is_measured(loopback):
    from commtax.trace import analyze

    rep = analyze(loopback)
    assert [r.rank for r in rep.ranks] == [0, 1] and all(r.device == "cpu" for r in rep.ranks)
    for r in rep.ranks:
        assert [s.step for s in r.steps] == [1, 2]
        reduce = [c for c in r.collectives if c.kind == "all_reduce"]
        assert all(c.group_size == 2 and c.size_source == "cpu op shapes" for c in reduce)
        # DDP all-reduces every gradient once per step, in buckets: the bytes add up to the model's
        assert sum(c.message_bytes * c.count for c in reduce) == STEPS * param_bytes()
        assert len({c.message_bytes for c in reduce}) >= 2  # DDP's small first bucket, then the rest
        assert 0 < r.exposed_comm_s <= r.comm_s and r.overlapped_comm_s > 0  # the first bucket hides under backward
        assert 0 < r.comm_tax < 1 and r.compute_s > r.exposed_comm_s
    assert [s.step for s in rep.stragglers] == [1, 2]


def test_ddp_trace_against_its_job(loopback):
    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    res = CliRunner().invoke(app, ["trace", str(loopback), "--against", str(JOB)], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "Measured vs predicted" in res.output and "dp_exposed" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 100


def test_calibrate_from_trace_writes_a_profile_estimate_accepts(loopback, tmp_path):
    from commtax.measure.testing import cli
    from commtax.schedule.analytical import estimate
    from commtax.spec import load_job
    from commtax.trace import analyze
    from commtax.trace.against import per_step, predicted_compute_s

    out = tmp_path / "profile.yaml"
    r = cli("calibrate", "--trace", str(loopback), "--job", str(JOB), "--out", str(out))
    assert r.returncode == 0, r.stderr
    profile = yaml.safe_load(out.read_text())
    assert {m["op"] for m in profile["measured_busbw"]} >= {"all_reduce"}
    job = yaml.safe_load(JOB.read_text())
    job["cluster"]["profile"] = str(out)
    b = estimate(load_job(job))
    measured = statistics.fmean(per_step(x, "compute_s") for x in analyze(loopback).ranks)
    if profile["gemm_efficiency"]["fp32"] < 1.0:  # the fit reached the measurement (not capped at the peak)
        assert predicted_compute_s(b) == pytest.approx(measured, rel=0.02)


# ----------------------------------------------------------------------------- emulated cluster
LINK = "200mbit"  # 14.7 MB of gradients: ~0.6 s per all-reduce, the same order as a step's compute


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from commtax.measure.testing import cli, require_netns

    require_netns()
    path = tmp_path_factory.mktemp("c2") / "cluster.yaml"
    r = cli(
        "cluster",
        "up",
        "--no-duplex-probe",
        "--nodes",
        "2",
        "--ranks-per-node",
        "1",
        "--link",
        LINK,
        "--out",
        str(path),
    )
    assert r.returncode == 0, r.stderr
    yield path
    cli("cluster", "down", "--cluster", str(path))


def measured_and_predicted(cluster: Path, out: Path) -> tuple[float, float, object]:
    from commtax.measure.testing import cli
    from commtax.spec import Profile, load_job
    from commtax.trace import analyze
    from commtax.trace.against import compare, compute_efficiency

    r = cli(
        "cluster",
        "run",
        "--cluster",
        str(cluster),
        "--grace",
        "15",
        "--",
        sys.executable,
        str(EXAMPLE),
        "--job",
        str(JOB),
        "--out",
        str(out),
        "--steps",
        "3",
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rep = analyze(out)
    spec = yaml.safe_load(JOB.read_text())
    # the links `cluster up` shaped and measured; the GPU entry of the job (one CPU core: sms 1)
    spec["cluster"] = {**yaml.safe_load(cluster.read_text()), "gpu": spec["cluster"]["gpu"]}
    job = load_job(spec)
    eff, measured_compute, predicted_compute = compute_efficiency(rep, job)  # calibrated compute: the trace's own
    assert predicted_compute == pytest.approx(measured_compute, rel=0.02)
    prof = Profile(source="compute from the trace", levels={}, gemm_efficiency={"fp32": eff})
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"profile": prof})})
    cmp = compare(rep, job)
    row = next(x for x in cmp.rows if x.metric == "comm_tax")
    return row.measured, row.predicted, cmp


@pytest.mark.netns
@pytest.mark.timing
def test_measured_comm_tax_within_15pct_of_prediction_on_shaped_links(cluster, tmp_path):
    for attempt in range(2):  # one re-measurement: a neighbour's CPU burst is not the model's fault
        measured, predicted, cmp = measured_and_predicted(cluster, tmp_path / f"run{attempt}")
        if abs(measured / predicted - 1) <= 0.15:
            break
    dp = next(x for x in cmp.rows if x.metric == "dp_exposed_s")
    print(
        f"comm tax measured {measured:.3f}, predicted {predicted:.3f}; exposed DP comm per step measured "
        f"{dp.measured * 1e3:.0f} ms, predicted {dp.predicted * 1e3:.0f} ms; " + "; ".join(cmp.explanations)
    )
    assert measured > 0.05  # the links make communication matter
    assert measured == pytest.approx(predicted, rel=0.15), cmp.explanations
