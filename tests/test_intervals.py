"""The 80% interval: percentiles of validation residuals by regime, widened to cover 80% leave-one-source-out."""

import json
import math
from pathlib import Path

import pytest
from conftest import LLAMA_256_A100
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.decide.intervals import (
    Residual,
    calibrate_width,
    coverage_of,
    fit,
    loso_coverage_of,
    quantile,
    regenerate,
)
from commtax.schedule.breakdown import fmt_step_interval, within_each_other
from commtax.schedule.interval import IntervalTable, Quantiles, load_table, regime_of, table_from_dict
from commtax.spec import load_job

register_commands()
runner = CliRunner()
REGIME = {"framework": "nemo", "gpu_arch": "hopper", "scale": "le1024", "precision": "fp8"}


def test_quantile_is_linear_interpolation():
    # NumPy's default: position q·(n−1) = 0.4 between the 1st and 2nd sorted values
    assert quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.10) == pytest.approx(1.0 + 0.4 * (2.0 - 1.0))
    assert quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.90) == pytest.approx(4.0 + 0.6 * (5.0 - 4.0))
    assert quantile([7.0], 0.9) == 7.0


def test_bounds_average_the_regime_values_shrunk_toward_the_pooled_ones():
    pooled = Quantiles(-0.2, 0.2, 100)
    nemo = Quantiles(-0.1, 0.3, 5)  # 5 rows against shrink_rows 5: half its own, half pooled
    table = IntervalTable(pooled, {"framework": {"nemo": nemo}}, width=1.0, shrink_rows=5.0)
    lo, hi = table.log_bounds(REGIME)
    # framework: 0.5·(−0.1) + 0.5·(−0.2) = −0.15; the other three keys have no entry: pooled −0.2
    assert lo == pytest.approx((-0.15 - 0.2 * 3) / 4)
    assert hi == pytest.approx((0.25 + 0.2 * 3) / 4)
    wide = IntervalTable(pooled, {"framework": {"nemo": nemo}}, width=2.0, shrink_rows=5.0)
    mid = (lo + hi) / 2
    assert wide.log_bounds(REGIME) == pytest.approx((mid - 2 * (mid - lo), mid + 2 * (hi - mid)))


def test_a_throughput_interval_becomes_a_step_interval(seed_job):
    from commtax.schedule.analytical import estimate

    b = estimate(seed_job)
    b.with_interval(b.tokens_per_s_per_gpu * 0.8, b.tokens_per_s_per_gpu * 1.25)
    # step ∝ 1 / throughput: the fast end (p90 of throughput) is the p10 of the step
    assert b.step_time_s_p10 == pytest.approx(b.step_time_s / 1.25)
    assert b.step_time_s_p90 == pytest.approx(b.step_time_s / 0.8)


def test_the_table_format_of_a_step_and_its_interval(seed_job):
    from commtax.schedule.analytical import estimate

    b = estimate(seed_job)
    b.step_time_s, b.tokens_per_s_per_gpu = 1.87, 100.0
    b.with_interval(100.0 * 1.87 / 2.05, 100.0 * 1.87 / 1.71)
    assert fmt_step_interval(b) == "1.87 s (1.71–2.05)"


def test_two_options_within_each_others_interval(seed_job):
    from commtax.schedule.analytical import estimate

    a, b = estimate(seed_job), estimate(seed_job)
    for x, step in ((a, 2.0), (b, 2.1)):
        x.step_time_s, x.step_time_s_p10, x.step_time_s_p90 = step, step * 0.9, step * 1.1
    assert within_each_other(a, b)
    b.step_time_s, b.step_time_s_p10, b.step_time_s_p90 = 3.0, 2.7, 3.3
    assert not within_each_other(a, b)


def test_every_estimate_carries_the_interval_in_json():
    r = runner.invoke(app, ["estimate", "examples/llama2-70b-h100.yaml", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert 0 < d["step_time_s_p10"] < d["step_time_s_p90"]
    assert d["tokens_per_s_per_gpu_p10"] < d["tokens_per_s_per_gpu_p90"]
    job = load_job("examples/llama2-70b-h100.yaml")
    lo, hi = load_table().log_bounds(
        regime_of(job.plan.framework, job.cluster.gpu.arch, job.cluster.num_gpus, job.training.precision)
    )
    assert d["step_time_s_p10"] == pytest.approx(d["step_time_s"] * math.exp(-hi))


def _residuals(draw_rs):
    srcs = ["a", "b", "c", "d"]
    fws = ["nemo", "fsdp"]
    return [Residual(str(i), srcs[i % 4], {**REGIME, "framework": fws[i % 2]}, r) for i, r in enumerate(draw_rs)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=8, max_size=40), st.floats(0.5, 2.0), st.floats(0.0, 1.5))
def test_coverage_grows_with_the_width(rs, w, extra):
    res = _residuals(rs)
    # the bounds widen about a fixed middle, so the intervals nest
    assert coverage_of(fit(res, w), res) <= coverage_of(fit(res, w + extra), res)
    assert loso_coverage_of(res, w) <= loso_coverage_of(res, w + extra)


def test_calibration_lands_near_80_percent_leave_one_source_out():
    rs = [math.sin(7.3 * i) * 0.3 for i in range(80)]  # a deterministic spread, four sources
    width, cov = calibrate_width(_residuals(rs))
    assert abs(cov - 0.80) <= 0.05
    assert loso_coverage_of(_residuals(rs), width) == cov


def test_the_shipped_table_reads_back():
    t = load_table()
    assert t is not None and t.width > 0 and t.pooled.q10 < t.pooled.q90
    assert set(t.held_out) and all(h.width == t.width for h in t.held_out.values())
    data = {"width": 1.0, "shrink_rows": 5, "pooled": {"q10": -0.1, "q90": 0.1, "rows": 3}, "regimes": {}}
    assert table_from_dict(data).log_bounds(REGIME) == pytest.approx((-0.1, 0.1))


def test_the_shipped_table_is_regenerated_from_the_validation_csvs(tmp_path, validation_dir):
    from commtax.schedule.interval import INTERVALS_FILE

    files = [validation_dir / "public_runs.csv", validation_dir / "public_runs_more.csv"]
    out = tmp_path / "intervals.json"
    data = regenerate(files, out)
    shipped = json.loads(INTERVALS_FILE.read_text())
    assert shipped.pop("_generated").startswith("Generated by commtax.decide.intervals")
    # `make intervals` after a model change: the shipped file must be what the model and the data give now
    assert data == shipped, "catalog/intervals.json is stale: run `make intervals`"
    assert 0.75 <= data["coverage_80_loso"] <= 0.85


def test_a_plan_above_every_published_run_of_its_gpu_is_flagged():
    from commtax.decide.search import above_published
    from commtax.schedule.interval import best_published_mfu

    job = load_job(LLAMA_256_A100)
    best, row = best_published_mfu("a100-sxm4-80gb", "bf16")
    assert 0.4 < best < 0.6 and row  # the best published A100-80GB 16-bit run in the validation data
    # the search's winner's curse: 66.1% MFU on A100 is above every published run
    assert "above every published a100-sxm4-80gb bf16 run" in above_published(job, 0.661)
    assert above_published(job, best - 0.01) is None


def _row(rid, gpu, precision, mfu, hfu, recompute, measured_over_predicted=1.0):
    from commtax.decide.validate import RowResult

    extra = {"mfu": mfu, "gpu": gpu, "precision": precision}
    return RowResult(rid, 100.0 * measured_over_predicted, 100.0, 0.0, extra=extra, hfu=hfu, recompute=recompute)


def test_published_bests_pool_the_precisions_of_one_peak_and_keep_the_hardware_rate():
    from commtax.decide.intervals import published_mfu

    rows = [
        # measured 10% below its prediction: MFU 0.55 × 0.9, HFU 0.70 × 0.9 (full recompute: 4/3 of the MFU's FLOPs)
        _row("fsdp_70b", "a100-sxm4-80gb", "bf16", 0.55, 0.55 * 4 / 3, "full", 0.9),
        _row("megatron_fp16", "a100-sxm4-80gb", "fp16", 0.56, 0.57, "selective"),
        _row("h100_fp8", "h100-sxm5-80gb", "fp8", 0.45, 0.45, "none"),
    ]
    best = published_mfu(rows)
    # A100 datasheet: FP16 and BF16 tensor cores both 312 TFLOP/s, so a bf16 plan is compared with the fp16 run
    assert best["a100-sxm4-80gb/bf16"] == best["a100-sxm4-80gb/fp16"]
    a100 = best["a100-sxm4-80gb/bf16"]
    assert (a100["mfu"], a100["row"], a100["precision"]) == (0.56, "megatron_fp16", "fp16")
    assert a100["hfu"] == pytest.approx(0.55 * 4 / 3 * 0.9, abs=1e-4) and a100["hfu_row"] == "fsdp_70b"
    assert a100["hfu_row_mfu"] == pytest.approx(0.55 * 0.9, abs=1e-4) and a100["hfu_row_recompute"] == "full"
    # H100's fp8 peak (1,979 TFLOP/s) is twice its bf16 one: no bf16 entry comes from an fp8 run
    assert "h100-sxm5-80gb/fp8" in best and "h100-sxm5-80gb/bf16" not in best


def test_the_flag_names_recompute_when_the_hardware_rate_is_within_the_published_one():
    from commtax.decide.search import above_published
    from commtax.schedule.interval import published_best

    job = load_job(LLAMA_256_A100)
    best = published_best("a100-sxm4-80gb", "bf16")
    assert best.hfu_row_recompute == "full" and best.hfu_row_mfu < best.hfu  # MosaicML's 70B: 71% HFU, 53% MFU
    within = above_published(job, best.mfu + 0.05, best.hfu - 0.01)
    assert f"its hardware rate is not: HFU {best.hfu - 0.01:.1%}" in within and best.hfu_row in within
    assert "recompute full" in within and "this plan does not recompute" in within
    above = above_published(job, best.hfu + 0.01, best.hfu + 0.01)
    assert "above every published run's too" in above and "treat this plan's figure as optimistic" in above


def test_the_two_winners_curse_jobs_search_best_plans_against_the_published_runs():
    """Issue 21: search's best plan for Llama-2 70B on 256 A100-80GB (tp2·pp8·vp10, no recompute) and GPT-3 175B
    on 4,096 A100 (tp4·pp8·cp2·vp12, mb3), estimated: GPT-3's MFU is at or below the best published A100 run's;
    Llama's is above it but its hardware rate (HFU) is within MosaicML's 70B run's, which recomputes."""
    from commtax.schedule.analytical import estimate
    from commtax.schedule.interval import published_best
    from commtax.spec import job_with

    best = published_best("a100-sxm4-80gb", "bf16")
    llama = estimate(load_job(LLAMA_256_A100))
    assert llama.mfu > best.mfu and llama.hfu <= best.hfu
    gpt3_file = Path(__file__).parents[1] / "examples/accuracy/gpt3-175b-4096-a100.yaml"
    gpt3 = job_with(load_job(gpt3_file), tp=4, pp=8, cp=2, dp=64, vp=12, micro_batch=3, recompute="none")
    assert estimate(gpt3).mfu <= best.mfu


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-1, 1), st.floats(0, 1), st.integers(1, 50)), min_size=4, max_size=4),
    st.floats(-1, 1),
    st.floats(0, 1),
    st.floats(0.5, 3.0),
)
def test_bounds_are_ordered_for_any_table(per_key, pooled_lo, pooled_span, width):
    from commtax.schedule.interval import REGIME_KEYS

    regimes = {k: {REGIME[k]: Quantiles(lo, lo + span, n)} for k, (lo, span, n) in zip(REGIME_KEYS, per_key)}
    table = IntervalTable(Quantiles(pooled_lo, pooled_lo + pooled_span, 100), regimes, width, 5.0)
    lo, hi = table.log_bounds(REGIME)
    assert lo <= hi
    # regime values the table has never seen fall back to the pooled percentiles, widened about their middle
    unseen = {k: "never-seen" for k in REGIME}
    mid = pooled_lo + pooled_span / 2
    assert table.log_bounds(unseen) == pytest.approx((mid - width * pooled_span / 2, mid + width * pooled_span / 2))


def test_plain_search_gives_the_reason_for_a_best_plan_above_the_published_runs():
    from commtax.decide.search import search
    from commtax.decide.space import Space

    job = load_job(LLAMA_256_A100)
    space = Space.parse({"tp": "2", "pp": "8", "cp": "1", "vp": "10", "micro_batch": "1", "recompute": "none"})
    res = search(job, space, top=1, workers=1)
    assert res.top[0][1].mfu > 0.6 and not res.verified
    (warning,) = [w for w in res.warnings if w.startswith("best plan:")]
    assert "mpt_a100_80gb_bf16_70b_2048_64" in warning and "The gap is activation recompute" in warning
