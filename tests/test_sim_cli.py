"""`commtax simulate` end to end: table, JSON, trace, Gantt chart, --explain, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from commtax.cli.simulate import register
from commtax.schedule.analytical import estimate
from commtax.spec import load_job

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "llama2-70b-h100.yaml"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        """commtax"""

    return app


def invoke(app, *args):
    return CliRunner().invoke(app, ["simulate", *map(str, args)])


def test_json_has_the_same_fields_as_estimate(app):
    r = invoke(app, JOB, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc) == set(estimate(load_job(JOB)).to_dict())
    assert doc["source"] == "simulate"
    assert sum(doc["breakdown_s"].values()) == pytest.approx(doc["step_time_s"], rel=1e-9)


def test_table_and_explain(app):
    r = invoke(app, JOB, "--explain")
    assert r.exit_code == 0, r.output
    assert "pp_bubble" in r.output
    assert "step: simulated" in r.output  # --explain's first line compares with the estimate


def test_trace_opens_as_chrome_trace_with_a_process_per_stage(app, tmp_path):
    out = tmp_path / "step.json"
    r = invoke(app, JOB, "--trace", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    procs = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {"stage 0", "stage 1", "stage 2", "stage 3"}  # pp = 4
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "tp", "pp_fwd", "pp_bwd", "dp"} <= threads
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    step_us = json.loads(invoke(app, JOB, "--json").output)["step_time_s"] * 1e6
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(step_us, rel=1e-9)
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert flows and len(flows) % 2 == 0  # send -> receiving pass arrows, in pairs
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_gantt_writes_a_png(app, tmp_path):
    out = tmp_path / "step.png"
    r = invoke(app, JOB, "--gantt", out)
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bucket_size_changes_the_number_of_dp_collectives(app, tmp_path):
    small, large = tmp_path / "s.json", tmp_path / "l.json"
    assert invoke(app, JOB, "--bucket-mb", 25, "--trace", small).exit_code == 0
    assert invoke(app, JOB, "--bucket-mb", 400, "--trace", large).exit_code == 0

    def buckets(path):
        return sum(1 for e in json.loads(path.read_text())["traceEvents"] if e["name"].startswith("grad bucket"))

    assert buckets(small) > 10 * buckets(large) > 0


@pytest.mark.parametrize(
    "args,message",
    [
        (["missing.yaml"], "error: missing.yaml: file not found"),
        ([JOB, "--bucket-mb", "0"], "error: --bucket-mb must be > 0 MiB"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(app, args, message):
    r = invoke(app, *args)
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [r.output.strip()]
    assert r.output.strip().startswith(message)


def test_bad_job_field_is_one_line(app, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(JOB.read_text().replace("pp: 4", "pp: 3"))
    r = invoke(app, bad)
    assert r.exit_code == 2
    assert r.output.startswith("error: ") and "pp" in r.output and "Traceback" not in r.output


def test_importing_the_simulator_loads_neither_matplotlib_nor_torch():
    code = (
        "import sys, commtax.schedule.sim, commtax.cli.simulate, commtax.schedule.sim.explain, "
        "commtax.schedule.sim.chrome_trace, commtax.schedule.sim.gantt;"
        "print('matplotlib' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_commtax_command_runs_simulate():
    code = "import sys; from commtax.cli.main import main; sys.argv = ['commtax', *sys.argv[1:]]; main()"
    out = subprocess.run([sys.executable, "-c", code, "simulate", str(JOB), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["source"] == "simulate"


def test_an_output_in_a_missing_directory_fails_before_simulating(app, tmp_path):
    r = invoke(app, JOB, "--trace", tmp_path / "no" / "such" / "dir.json")
    assert r.exit_code == 2
    assert r.output.startswith("error: ") and "does not exist" in r.output
