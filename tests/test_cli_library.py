"""What ``simulate``, ``report`` and ``validate`` run beneath typer, called as plain functions:
schedule.sim.run.simulate_file, report.page.build_page, decide.validate's --max-mape verdict and report.text."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from commtax.errors import SpecError

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "llama2-70b-h100.yaml"


# ----------------------------------------------------------------------------- simulate
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bucket_mb": 0.0}, "--bucket-mb must be > 0 MiB, got 0.0"),
        ({"gantt": Path("g.txt")}, "the suffix names the format; use .png, .svg or .pdf"),
        ({"trace": Path("/nonexistent-dir/t.json")}, "directory /nonexistent-dir does not exist"),
        ({"out": Path("/nonexistent-dir/o.json")}, "directory /nonexistent-dir does not exist"),
    ],
)
def test_simulate_refuses_bad_outputs_before_simulating(kwargs, message):
    from commtax.schedule.sim.run import simulate_file

    with pytest.raises(SpecError, match=message):
        simulate_file(Path("/nonexistent.yaml"), **kwargs)  # the job is never read: the options fail first


def test_simulate_file_writes_the_trace_and_says_where(tmp_path):
    from commtax.schedule.sim.run import simulate_file

    trace = tmp_path / "t.json"
    s = simulate_file(JOB, trace=trace, explain=True)
    events = json.loads(trace.read_text())["traceEvents"]
    assert s.breakdown.source == "simulate" and s.job.cluster.num_gpus == 256
    assert any(n.startswith(f"trace: {trace} ({len(events):,} events") for n in s.breakdown.notes)
    assert len(s.breakdown.notes) > 1  # --explain adds why simulate differs from estimate


# ----------------------------------------------------------------------------- report
def test_scale_counts_are_sorted_and_positive():
    from commtax.report.page import scale_counts

    assert scale_counts(None) is None
    assert scale_counts("256,64,64, 128") == [64, 128, 256]
    with pytest.raises(SpecError, match="--scale: expected GPU counts like 64,128,256, got 'x'"):
        scale_counts("x")
    with pytest.raises(SpecError, match="--scale: expected positive GPU counts"):
        scale_counts("0,64")


def test_build_page_refuses_job_without_trace_and_missing_files(tmp_path):
    from commtax.report.page import build_page

    with pytest.raises(SpecError, match="^--job: picks one job of the --trace files"):
        build_page(JOB, trace_job=2)
    with pytest.raises(SpecError, match=r"^--trace: .*missing.json does not exist"):
        build_page(JOB, trace=[tmp_path / "missing.json"])
    with pytest.raises(SpecError, match="^--bench: "):
        build_page(JOB, bench=[tmp_path / "missing.json"])


def test_build_page_is_one_html_page_with_its_figures(tmp_path):
    from commtax.report.page import build_page

    page = build_page(JOB, scale="128,256")
    assert page.html.startswith("<!DOCTYPE html>") and page.html.count("<svg") >= len(page.figs) > 0
    assert page.data.breakdown.fits and page.fit_note() is None


# ----------------------------------------------------------------------------- validate
COLLECTIVES = REPO / "validation" / "public_collectives.csv"  # the repo's copy of ../shared/validation


@pytest.fixture(scope="module")
def collectives():
    from commtax.decide.validate import validate_files

    return validate_files([COLLECTIVES])


def test_max_mape_verdict(collectives):
    from commtax.decide.validate import max_mape_failure, validation_record

    mape = collectives.files[str(COLLECTIVES)].mape_pct
    assert max_mape_failure(collectives, None) is None
    assert max_mape_failure(collectives, mape + 0.1) is None
    assert max_mape_failure(collectives, mape - 0.1) == f"MAPE {mape:.1f}% is above --max-mape {mape - 0.1:g}%"
    assert validation_record(collectives) == collectives.files[str(COLLECTIVES)].to_dict()  # one file: its report


def test_print_validation_ends_with_the_mape(collectives):
    from commtax.report.text import print_validation

    buf = io.StringIO()
    print_validation(collectives, Console(file=buf, width=100, no_color=True), loso=False, wide=False)
    report = collectives.files[str(COLLECTIVES)]
    n = sum(r.error_pct is not None for r in report.rows)
    assert buf.getvalue().rstrip().endswith(f"MAPE (collectives, {n} rows): {report.mape_pct:.1f}%")
