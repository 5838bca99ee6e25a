"""report, advise and compare price the plan the job file gives; ``--search`` (the same flag on the three) searches.

The search is replaced by a recorder that refuses with a sentinel message: the default path must finish without
calling it (so without starting any search worker), and ``--search`` must call it and show its refusal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commtax.errors import SpecError

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "llama2-70b-h100.yaml"  # the README's worked example: tp8 pp4 dp8
SENTINEL = "sentinel: a stand-in for the search"


@pytest.fixture
def searches(monkeypatch) -> list[str]:
    """The jobs' GPUs each search was asked about; every search refuses with SENTINEL."""
    import commtax.decide.compare
    import commtax.decide.search

    calls: list[str] = []

    def fake(job, *args, **kwargs):
        calls.append(job.cluster.gpu.name)
        raise SpecError(SENTINEL)

    for module in (commtax.decide.search, commtax.decide.compare):
        monkeypatch.setattr(module, "search", fake)
    return calls


def invoke(*args) -> object:
    from commtax.cli.main import app, register_commands

    register_commands()
    return CliRunner().invoke(app, [str(a) for a in args])


def test_advise_gives_changes_around_the_plan_without_searching(searches):
    r = invoke("advise", JOB, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert searches == [] and data["searched"] is False
    assert any(c["label"].startswith("tp 8→4") for c in data["changes"])  # the changes around the given plan
    assert not any(c["kind"] == "search" for c in data["changes"])


def test_advise_search_runs_the_search(searches):
    r = invoke("advise", JOB, "--json", "--search")
    assert r.exit_code == 0, r.output
    assert searches == ["h100-sxm5-80gb"] and json.loads(r.stdout)["searched"] is True
    r = invoke("advise", JOB, "--json", "--no-search")  # the old spelling of the default still works
    assert r.exit_code == 0 and searches == ["h100-sxm5-80gb"]


def test_report_is_about_the_plan_without_searching(searches, tmp_path):
    r = invoke("report", JOB, "-o", tmp_path / "r.html", "--scale", "256")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert searches == []
    assert "not searched" in page and "commtax report --search" in page and 'id="chart-plans"' not in page
    assert 'id="chart-advice"' in page  # the changes around the job's plan are on the page without the search


def test_report_search_runs_the_search(searches, tmp_path):
    r = invoke("report", JOB, "-o", tmp_path / "r.html", "--scale", "256", "--search")
    assert r.exit_code == 0, r.output
    # the plans table, the best plan at 256 GPUs and the advice's best plan: three searches, each refused
    assert searches == ["h100-sxm5-80gb"] * 3
    assert SENTINEL in (tmp_path / "r.html").read_text()


def test_compare_prices_each_clusters_plan_without_searching(searches):
    r = invoke("compare", JOB, "--gpu", "h100-sxm5-80gb", "a100-sxm4-80gb", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert searches == [] and data["searched"] is False
    from commtax.schedule.analytical import estimate
    from commtax.spec import load_job

    h100 = data["rows"][0]
    assert h100["plan"]["tp"] == 8 and h100["plan"]["pp"] == 4 and h100["plan"]["dp"] == 8
    assert h100["step_time_s"] == estimate(load_job(JOB)).step_time_s  # the job's own estimate, unchanged
    r = invoke("compare", JOB, "--gpu", "h100-sxm5-80gb", "rtx-4090-24gb")
    assert r.exit_code == 0, r.output
    assert "with the job's plan" in r.stdout and "does not fit memory" in r.stdout and "--search" in r.stdout


def test_compare_search_and_plan_options_search(searches):
    r = invoke("compare", JOB, "--gpu", "h100-sxm5-80gb", "a100-sxm4-80gb", "--json", "--search")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert searches == ["h100-sxm5-80gb", "a100-sxm4-80gb"] and data["searched"] is True
    assert all(row["reason"] == SENTINEL for row in data["rows"])
    r = invoke("compare", JOB, "--json", "--tp", "8")  # a plan option restricts a search, so it is one
    assert r.exit_code == 0 and json.loads(r.stdout)["searched"] is True and len(searches) == 3


def test_the_three_commands_say_what_search_adds():
    for command in ("report", "advise", "compare"):
        r = invoke(command, "--help")
        text = " ".join(r.stdout.split())
        assert "--search / --no-search" in text and "also search every valid plan" in text, command
        assert " s" in text.split("also search every valid plan", 1)[1][:160], command  # roughly how long


def test_unsearched_scaling_and_pareto_are_the_plans_own(searches):
    from commtax.decide.compare import compare, pareto_points, scaling, with_gpu_counts
    from commtax.schedule.analytical import estimate
    from commtax.spec import load_job

    job = load_job(JOB)
    points = scaling(job, [128, 512], search_plans=False)
    assert searches == [] and [p.plan.dp for p in points] == [4, 16]  # tp8·pp4 kept, DP takes up the GPUs
    assert [p.plan.tp for p in points] == [8, 8]
    assert points[1].breakdown.step_time_s == estimate(with_gpu_counts([job], [512])[0]).step_time_s
    (row,) = compare([job], search_plans=False)
    (pt,) = pareto_points([row])
    assert pt.days.tolist() == [row.cost.days] and pt.usd_per_B.tolist() == [row.cost.owned_usd_per_B_tokens]
