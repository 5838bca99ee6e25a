"""The library under ``commtax trace`` (trace.traced_job: the step range, the jobs among the files, the one chosen,
its comparison with a prediction) and what it prints (report.trace_tables), called without typer."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from test_trace import A100_PAIR  # the 2-GPU A100 job of the shared traces

from commtax.errors import SpecError
from commtax.report.trace_tables import print_trace
from commtax.trace.traced_job import ALL_STEPS, parse_steps, traced_job

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def shared(name: str) -> Path:
    p = TRACES / f"{name}.json.gz"
    if not p.exists():
        pytest.skip(f"shared traces not found at {TRACES} (shared/ sits beside the repo)")
    return p


def test_steps_are_inclusive_profiler_step_ranges():
    assert parse_steps(None) is None and parse_steps("") is None
    assert parse_steps("3:7") == (3, 7)
    assert parse_steps("5") == (5, 5)
    assert parse_steps(":4") == (0, 4)
    assert parse_steps("2:") == (2, ALL_STEPS)
    with pytest.raises(SpecError, match=r"--steps: expected a:b .* got '9:x'"):
        parse_steps("9:x")
    with pytest.raises(SpecError, match=r"the first step \(7\) is after the last \(3\)"):
        parse_steps("7:3")


def test_every_job_of_the_files_and_job_k_keeps_one():
    files = [shared("a100-2gpu-allreduce-rank0"), shared("a100-8gpu-rank3")]  # world sizes 2 and 8: two jobs
    every = traced_job(files)
    assert len(every.groups()) == len(every.every_job) == 2 and every.chosen is None
    data = every.to_dict()
    assert len(data["jobs"]) == 2 and "job" not in data
    second = traced_job(files, job_k=2)
    assert second.chosen == 2 and second.to_dict()["job"] == 2 and len(second.groups()) == 1
    assert {r.file for r in second.report.ranks} == set(data["jobs"][1]["files"])


def test_against_a_job_compares_and_warns_of_what_differs(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(A100_PAIR))
    heard: list[str] = []
    t = traced_job([shared("a100-2gpu-allreduce-rank0")], against=job, warn=heard.append)
    assert t.comparison is not None and "against" in t.to_dict()
    assert all(line.startswith("--against: ") for line in heard)
    buf = io.StringIO()
    print_trace(t, Console(file=buf, width=100, no_color=True), heard.append)
    text = buf.getvalue()
    assert "Measured per rank" in text and "Measured vs predicted" in text and "Largest differences" in text


def test_a_trace_against_another_jobs_yaml_is_said_on_warn():
    heard: list[str] = []
    repo = Path(__file__).resolve().parents[1]
    traced_job([shared("a100-2gpu-allreduce-rank0")], against=repo / "examples/llama2-70b-h100.yaml", warn=heard.append)
    assert any("world size (2) is not the job's num_gpus (256)" in line for line in heard)
