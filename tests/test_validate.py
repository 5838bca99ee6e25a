"""Prediction error on the published runs and collectives (shared/validation), one model for all rows."""

import json

import pytest
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.decide.validate import generation_of, validate

register_commands()  # every command on `app` (main() registers only the one it runs)
runner = CliRunner()

RUNS_MAPE_TARGET = 10.0  # issue 2: public run set MAPE ≤ 10%
COLLECTIVES_MAPE_TARGET = 15.0  # issue 2: public collectives MAPE ≤ 15% for messages ≥ 64 MiB


# A documented miss, reported and kept in every figure (README "Known misses", docs/collectives.md): MPT-70B on 64
# A100-40GB (llm-foundry FSDP, micro-batch 2) runs 27% slower per GPU than its own 128-GPU row (micro-batch 4); at
# the node's 8 x 200 Gb/s the model hides its FSDP traffic under compute, and no sourced mechanism explains it yet.
DOCUMENTED_MISSES = {"mpt_a100_40gb_bf16_70b_2048_64"}
# The 2021 DeepSpeed ZeRO-3 rows of Narayanan Table 2 (DeepSpeed before v0.6.0: one synchronised list-form
# collective per parameter tensor, catalog/frameworks.yaml `legacy`)
ZERO3_2021 = {f"meg21_t2_{i}" for i in range(1, 7)}


def test_public_runs_mape(validation_dir):
    # issue 8: the gate applies to every row no constant was fitted on; since the Hopper sustained clock is
    # component data (MSMF/MAMF), no constant is fitted on any row, so that is every row
    report = validate(validation_dir / "public_runs.csv")
    assert all(r.predicted is not None for r in report.rows), [r.reason for r in report.rows if r.reason]
    fitted_rows = {row for rows in report.fitted.values() for row in rows}
    unfitted = [r for r in report.rows if r.id not in fitted_rows]
    assert len(unfitted) == len(report.rows) == 54
    assert report.unfitted_mape_pct == pytest.approx(sum(abs(r.error_pct) for r in unfitted) / len(unfitted))
    assert report.unfitted_mape_pct <= RUNS_MAPE_TARGET
    # the documented miss stays visible: predicted, too fast
    assert all(r.error_pct > 20 for r in report.rows if r.id in DOCUMENTED_MISSES)


def test_zero3_2021_rows_are_priced_per_parameter(validation_dir):
    report = validate(validation_dir / "public_runs.csv")
    rows = {r.id: r for r in report.rows if r.id in ZERO3_2021}
    assert len(rows) == 6
    assert all("zero3_gather=per_parameter_sync" in r.extra["framework"] for r in rows.values())
    # was +25..+199% with the synchronised per-tensor gathers left out (every one too fast)
    assert all(abs(r.error_pct) < 35 for r in rows.values())
    # Narayanan Table 2: GPT-3 175B steps of ~67 s at both 768 and 1,536 GPUs (per-GPU work halves, the
    # per-rank host copies double): the predicted steps stay within 15% of each other, as measured
    t768, t1536 = rows["meg21_t2_2"].extra["step_time_s"], rows["meg21_t2_3"].extra["step_time_s"]
    assert 0.85 < t1536 / t768 < 1.3


def test_report_by_source_and_loso(validation_dir):
    report = validate(validation_dir / "public_runs.csv", loso=True)
    assert set(report.by_source) == {
        "Narayanan et al. 2021",
        "MosaicML llm-foundry MPT training benchmarks",
        "NVIDIA NeMo Framework performance summary",
    }
    assert report.source_avg_mape_pct == pytest.approx(sum(report.by_source.values()) / 3)
    assert report.refused == []
    # no assumption is fitted on validation rows (the Hopper sustained clock is MSMF/MAMF component data):
    # leaving a source out changes nothing, and every row counts as one no constant was fitted on
    assert report.fitted == {}
    assert "no assumption is fitted" in report.loso_note
    assert report.loso_mape_pct == pytest.approx(report.source_avg_mape_pct)
    assert report.unfitted_mape_pct == pytest.approx(report.mape_pct)


def test_software_generation_from_the_source_year():
    assert generation_of({"source": "Narayanan et al. 2021; Table 1 (also ... 2021-04..2023-08)"})[0] == "legacy"
    assert generation_of({"source": "NVIDIA NeMo 24.07 (2024-09-09)"})[0] == "current"
    assert generation_of({"source": "llm-foundry README"})[0] == "current"
    assert generation_of({"source": "x 2021", "generation": "current"})[0] == "current"


def test_validate_json_shape_and_unpredictable_rows(tmp_path, validation_dir):
    lines = (validation_dir / "public_runs.csv").read_text().splitlines()
    bad = lines[1].replace(",a100-sxm4-80gb,", ",a100-sxm9,")
    bad = "bad_" + bad  # ids are unique (a repeated id is refused)
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([lines[0], lines[1], bad]) + "\n")
    r = runner.invoke(app, ["validate", str(csv), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "runs" and len(d["rows"]) == 2
    ok, failed = d["rows"]
    assert {"id", "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "error_pct", "chosen"} <= set(ok)
    assert failed["predicted_tokens_per_s_per_gpu"] is None and "unknown gpu 'a100-sxm9'" in failed["reason"]


def test_max_mape_makes_validate_fail(validation_dir):
    r = runner.invoke(app, ["validate", str(validation_dir / "public_runs.csv"), "--max-mape", "0.1"])
    assert r.exit_code == 1 and "above --max-mape" in r.stderr


def test_not_a_validation_csv(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    r = runner.invoke(app, ["validate", str(p)])
    assert r.exit_code == 2 and "not a runs CSV" in r.stderr


def test_optional_software_columns_override_the_generation_rule(tmp_path, validation_dir):
    lines = (validation_dir / "public_runs.csv").read_text().splitlines()
    header, row = lines[0], next(line for line in lines if line.startswith("meg21_t1_1,"))
    csv = tmp_path / "runs.csv"
    csv.write_text(
        "\n".join([header + ",flash_attention,overlap_tp", row + ",true,", row.replace("meg21_t1_1", "x2") + ",,"])
    )
    stated, rule = validate(csv).rows
    assert stated.predicted > 1.1 * rule.predicted  # 2021 Megatron materialised the scores (attention: eager)


def test_a_run_the_memory_model_cannot_fit_is_still_predicted(tmp_path, validation_dir):
    # MPT-70B on 8 × A100-40GB cannot hold its model states (70e9 × 16 B / 8 = 140 GB per GPU): the run is
    # hypothetical, but a published row must never be refused for memory - it did run
    lines = (validation_dir / "public_runs.csv").read_text().splitlines()
    row = next(line for line in lines if line.startswith("mpt_a100_40gb_bf16_70b_2048_64,"))
    row = (
        row.replace(",64,8,", ",8,8,", 1)
        .replace(",1,1,64,1,", ",1,1,8,1,", 1)
        .replace(",128,2048,bf16,", ",16,2048,bf16,", 1)
    )
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([lines[0], row]) + "\n")
    r = validate(csv).rows[0]
    assert r.predicted is not None and r.extra["fits"] is False and "predicted anyway" in r.extra["note"]


def test_software_text_columns_state_the_kernel(tmp_path, validation_dir):
    lines = (validation_dir / "public_runs.csv").read_text().splitlines()
    row = next(line for line in lines if line.startswith("meg21_t1_1,"))
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([lines[0] + ",attention", row + ",fa2", row.replace("meg21_t1_1", "x2") + ","]) + "\n")
    fused, eager = validate(csv).rows
    assert fused.predicted > eager.predicted


def test_a_published_table_states_plan_facts(validation_dir):
    from commtax.decide.validate import run_job_raw, source_plan
    from commtax.spec import load_catalog

    # llm-foundry's A100-40GB table runs MP Mode PURE: gradients reduced in bf16, not the fsdp preset's fp32
    row = {
        "source": "MosaicML llm-foundry MPT training benchmarks; ... 'A100 40GB with 1600 Gbps node-node "
        "interconnect (RoCE)'"
    }
    assert source_plan(row) == {"grad_comm_dtype": "bf16"}
    assert source_plan({"source": "MosaicML llm-foundry; H100 80GB"}) == {}
    rows = [r for r in csv_rows(validation_dir) if r["id"].startswith("mpt_")]
    assert all(run_job_raw(r, load_catalog())[1]["grad_comm_dtype"] == "bf16" for r in rows)


def test_legacy_release_of_the_framework_from_generation_or_source_year():
    from commtax.decide.validate import legacy_software

    ds = "megatron-deepspeed"
    legacy = {"zero3_gather": "per_parameter_sync"}
    assert legacy_software({"source": "Narayanan et al. 2021; Table 2"}, ds)[0] == legacy
    assert legacy_software({"source": "BigScience 2022; BLOOM"}, ds)[0] == {}
    assert legacy_software({"source": "a 2023 blog", "generation": "legacy"}, "deepspeed")[0] != {}
    assert legacy_software({"source": "Narayanan 2021", "generation": "current"}, ds)[0] == {}
    assert legacy_software({"source": "Narayanan et al. 2021"}, "megatron-lm")[0] == {}  # no legacy entry


def csv_rows(validation_dir):
    import csv

    with open(validation_dir / "public_runs.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# issue 21: both dense files together (162 rows, 10 sources), averaged by source, nothing fitted
UNION_SOURCE_AVG_CEILING = 10.0


def dense_files(validation_dir):
    return [validation_dir / "public_runs.csv", validation_dir / "public_runs_more.csv"]


def test_both_dense_files_each_and_together(validation_dir):
    from commtax.decide.validate import validate_files

    multi = validate_files(dense_files(validation_dir))
    assert [len(r.rows) for r in multi.files.values()] == [54, 108]
    union = multi.union
    assert len(union.rows) == 162 and len(union.by_source) == 10
    assert union.refused == []  # every row predicted (the 22 Llama 3.1 405B Megatron-Bridge rows included)
    assert union.source_avg_mape_pct == pytest.approx(sum(union.by_source.values()) / 10)
    assert union.source_avg_mape_pct <= UNION_SOURCE_AVG_CEILING
    # the 80% interval, fitted without each row's source, covers 75-85% of the rows
    assert 0.75 <= union.coverage_80 <= 0.85
    row = union.rows[0]
    assert row.extra["predicted_tokens_per_s_per_gpu_p10"] < row.extra["predicted_tokens_per_s_per_gpu_p90"]
    assert row.extra["interval"] == "fitted without this source"


def test_llama31_405b_rows_use_megatron_bridges_pipeline_split(validation_dir):
    from commtax.decide.validate import nvlink_segment, run_job_raw
    from commtax.spec import Job, build, load_catalog, pipeline_split

    rows = [r for r in csv_rows_of(validation_dir / "public_runs_more.csv") if "LLAMA3.1_405B" in r["id"]]
    assert len(rows) == 22
    raw, fixed, _ = run_job_raw(rows[0], load_catalog())
    assert fixed["account_for_embedding_in_pipeline_split"] and fixed["account_for_loss_in_pipeline_split"]
    # 126 layers + embedding + loss = 128 over pp16 · vp4 = 64 chunks of 2; the first and the last hold 1
    job = build(Job, {**raw, "plan": {**fixed, "sequence_parallel": True}}, "")
    split = pipeline_split(126, job.plan)
    assert split[0] == 1 and split[-1] == 1 and set(split[1:-1]) == {2} and sum(split) == 126
    # 256 GPUs on NVL72 racks: four Slurm segments of 64 GPUs (NVIDIA's GB200 NVL72 guidance)
    assert nvlink_segment(256, 72) == 64 and nvlink_segment(128, 72) == 64 and nvlink_segment(64, 72) == 72
    assert nvlink_segment(1024, 8) == 8 and raw["cluster"]["gpus_per_node"] == 64


def test_validate_cli_several_files_json_and_text(validation_dir):
    files = [str(p) for p in dense_files(validation_dir)]
    r = runner.invoke(app, ["validate", *files, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert list(d["files"]) == files and len(d["union"]["rows"]) == 162
    assert 0.75 <= d["union"]["coverage_80"] <= 0.85
    assert {"predicted_tokens_per_s_per_gpu_p10", "predicted_tokens_per_s_per_gpu_p90"} <= set(d["union"]["rows"][0])
    r = runner.invoke(app, ["validate", *files])
    assert r.exit_code == 0
    assert "All runs files together (162 rows)" in r.stdout and "MAPE averaged by source (10 sources)" in r.stdout


def test_an_id_in_two_files_is_refused(tmp_path, validation_dir):
    lines = (validation_dir / "public_runs.csv").read_text().splitlines()
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("\n".join(lines[:2]) + "\n")
    b.write_text("\n".join(lines[:2]) + "\n")
    r = runner.invoke(app, ["validate", str(a), str(b)])
    assert r.exit_code == 2 and "is also in" in r.stderr and "ids are unique across files" in r.stderr


def csv_rows_of(path):
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_published_software_facts_of_the_new_sources():
    from commtax.decide.validate import source_plan

    # torchtitan's Trainy benchmark runs with --training.compile
    assert source_plan({"source": "Trainy team on WhiteFiber; pytorch/torchtitan benchmarks/..."}) == {
        "elementwise": "compiled"
    }
    # Megatron-DeepSpeed bf16 (BF16_Optimizer): the fp32 gradients are all-reduced
    assert source_plan({"source": "BigScience BLOOM-176B training (tr11-176B-ml); ..."})["grad_comm_dtype"] == "fp32"
    assert source_plan({"source": "Smith et al. 2022; Sec 2.4"})["grad_comm_dtype"] == "fp32"


def test_bf16_optimizer_all_reduces_fp32_gradients_then_gathers_bf16_weights():
    from tests.conftest import job_dict

    from commtax.spec import load_job
    from commtax.workload.step import build_workload, stage_params

    d = job_dict(
        tp=8, pp=4, dp=8, zero=1, framework="megatron-deepspeed", sequence_parallel=False, grad_comm_dtype="fp32"
    )
    job = load_job(d)
    ar, ag = build_workload(job).dp_step
    fullest = max(stage_params(job))
    assert (ar.op, ar.bytes) == ("all_reduce", 4 * fullest) and (ag.op, ag.bytes) == ("all_gather", 2 * fullest)
    megatron = load_job({**d, "plan": {**d["plan"], "framework": "megatron-core"}})
    assert build_workload(megatron).dp_step[0].op == "reduce_scatter"


def test_row_plan_is_the_plan_a_row_is_predicted_with():
    # benchmarks/moe_host_sync.py and moe_miss_by_class.py explain a row's error on row_plan's job: it must be the
    # one predict_run priced, fallbacks included
    from commtax.decide.validate import predict_run, read_rows, row_plan
    from commtax.spec.catalog import load_catalog

    catalog = load_catalog()
    for row in read_rows("validation/other_moe_runs.csv")[:3]:
        planned, result = row_plan(row, catalog), predict_run(row, catalog)
        assert planned.choice.breakdown.tokens_per_s_per_gpu == result.predicted
