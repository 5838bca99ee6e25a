"""advise: each change is the model's own re-estimate; the interleaving change halves the bubble;
memory-driven changes; sensitivities as finite differences; CLI JSON."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO, job_dict
from typer.testing import CliRunner

from commtax.decide.advise import FD_REL, advise, sensitivities, with_intra, with_network
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job

# the seed article's LLaMA-2 70B, 256 H100, DP=8 PP=4 TP=8 (examples/llama2-70b-h100.yaml)
seed_job = job_dict


@pytest.fixture(scope="module")
def advice():
    return advise(load_job(seed_job()), search_best=False)


def test_dominant_component_is_the_largest_part(advice):
    parts = advice.breakdown.breakdown_s
    assert advice.dominant == max(parts, key=parts.get)
    assert advice.dominant_share == pytest.approx(parts[advice.dominant] / advice.breakdown.step_time_s)


def test_changes_are_re_estimates(advice):
    job = advice.job
    by = {c.label: c for c in advice.changes}
    assert by["2× inter-node bandwidth"].step_after_s == estimate(with_network(job, bw=2.0)).step_time_s
    assert by["2× intra-node bandwidth"].step_after_s == estimate(with_intra(job, bw=2.0)).step_time_s
    assert by["micro_batch 1→2"].step_after_s == estimate(job_with(job, micro_batch=2)).step_time_s
    assert by["grad bf16→fp8"].step_after_s == estimate(job_with(job, grad_comm_dtype="fp8")).step_time_s
    for c in advice.changes:
        assert c.step_before_s == advice.breakdown.step_time_s
        assert c.step_change == pytest.approx(c.step_after_s / c.step_before_s - 1)


def test_interleaving_halves_the_bubble(advice):
    """Bubble = (p − 1)/v × t_avg (Narayanan et al. 2021, §2.2.2): v 1→2 halves it, the stage time unchanged."""
    c = {c.label: c for c in advice.changes}["vp 1→2"]
    assert c.component == "pp_bubble"
    assert c.component_after_s == pytest.approx(c.component_before_s / 2, rel=1e-12)
    assert c.step_after_s < c.step_before_s
    assert "pp bubble" in c.text() and "(-50%)" in c.text()


def test_changes_sorted_fitting_first_then_fastest(advice):
    keys = [(not c.fits_after, c.step_after_s) for c in advice.changes]
    assert keys == sorted(keys)


def test_zero3_is_offered_when_the_plan_does_not_fit():
    job = load_job(seed_job(tp=2, pp=1, dp=128, zero=0, sequence_parallel=False, recompute="full"))
    a = advise(job, search_best=False)
    assert not a.breakdown.fits
    z3 = {c.label: c for c in a.changes}["ZeRO-0→ZeRO-3"]
    assert z3.fits_after and not z3.fits_before
    assert z3.mem_after_GiB < z3.mem_before_GiB
    assert "memory fits" in z3.text()
    assert a.changes[0].fits_after  # a change that fits comes first


def test_sensitivities_are_central_differences(advice):
    job = advice.job
    s = sensitivities(job, advice.breakdown)
    bw = job.cluster.intra_node.bw_GBps
    up = estimate(with_intra(job, bw=1 + FD_REL)).step_time_s
    dn = estimate(with_intra(job, bw=1 - FD_REL)).step_time_s
    assert s["intra"]["dstep_dbw_s_per_GBps"] == pytest.approx((up - dn) / (2 * FD_REL * bw))
    assert s["intra"]["dstep_dbw_s_per_GBps"] < 0  # more TP bandwidth, shorter step (TP is exposed here)
    assert s["intra"]["bw_elasticity"] == pytest.approx(
        s["intra"]["dstep_dbw_s_per_GBps"] * bw / advice.breakdown.step_time_s
    )
    assert s["inter"]["bw_GBps"] == job.cluster.inter_node.bw_Gbps / 8
    assert s["intra"]["dstep_dlatency_s_per_us"] >= 0


def test_cli_advise_json(tmp_path):
    from commtax.cli.main import app, register_commands

    register_commands()
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(seed_job()))
    r = CliRunner().invoke(app, ["advise", str(f), "--json", "--no-search"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    job = load_job(seed_job())
    assert data["step_time_s"] == estimate(job).step_time_s
    assert set(data["sensitivities"]) == {"intra", "inter"}
    first = data["changes"][0]
    assert first["step_change"] == pytest.approx(first["step_after_s"] / first["step_before_s"] - 1)
    r = CliRunner().invoke(app, ["advise", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and r.output.startswith("error:")


def test_remedies_are_re_estimates_with_exposed_dp_time_and_caveat():
    # legacy software (no DP overlap) at ZeRO-0: the gradient all-reduce is exposed, compression shows
    job = with_network(load_job(seed_job(zero=0, generation="legacy")), bw=0.1)  # 1/10 of the fabric's bandwidth
    base = estimate(job)
    rs = {r.grad_comm_dtype: r for r in advise(job, search_best=False).remedies}
    assert "bf16" not in rs  # the plan already sends bf16: not a saving
    int8 = rs["int8"]
    after = estimate(job_with(job, grad_comm_dtype="int8", grad_error_feedback=True))  # its passes are priced
    assert int8.dp_exposed_before_s == base.breakdown_s["dp_exposed"] > 0
    assert int8.dp_exposed_after_s == after.breakdown_s["dp_exposed"] < int8.dp_exposed_before_s
    assert int8.change.step_after_s == after.step_time_s
    assert rs["int4"].dp_exposed_after_s < int8.dp_exposed_after_s
    text = int8.text()
    assert text.startswith("int8 gradients with error feedback cut the exposed DP time from ")
    assert "step); quality:" in text
    # on the full fabric the int8 codec (124.5 B per element, + 58.5 B for error feedback) costs more than it saves
    fast = {r.grad_comm_dtype: r for r in advise(load_job(seed_job(zero=0, generation="legacy")), False).remedies}
    assert fast["int8"].dp_exposed_after_s > fast["int8"].dp_exposed_before_s
    assert "int8 gradients with error feedback would raise the exposed DP time" in fast["int8"].text()


def test_powersgd_remedy_only_for_ddp_all_reduce():
    zero0 = {r.grad_comm_dtype for r in advise(load_job(seed_job(zero=0)), search_best=False).remedies}
    zero1 = {r.grad_comm_dtype for r in advise(load_job(seed_job(zero=1)), search_best=False).remedies}
    assert "powersgd_r4" in zero0 and "powersgd_r4" not in zero1  # P and Q are all-reduced: no reduce-scatter form
    assert {"int8", "int4"} <= zero1


def test_a_suggestion_that_still_does_not_fit_says_so_and_the_order_is_named(tmp_path):
    """The article's plan on 256 x 4090 with selective recompute needs 0.8 MiB more than the card: changes that
    fit come first (the title says so), and a faster one that still needs more memory says it does not fit."""
    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    job = tmp_path / "sel.yaml"
    src = (REPO / "examples" / "compare" / "llama2-70b-256-4090.yaml").read_text()
    job.write_text(src.replace("recompute: full", "recompute: selective"))
    r = CliRunner().invoke(app, ["advise", str(job), "--no-search"], terminal_width=200)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "(those that fit memory first, then fastest)" in text
    assert "tp 8→4, dp ×2" in text and "still does not fit memory" in text
