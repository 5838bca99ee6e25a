"""Other published MoE runs (validation/other_moe_runs.csv: NeMo AutoModel, the Megatron-MoE-ModelZoo, Megatron-LM's
DeepSeek-V3 GB200 guide, the DeepSeek-V3 report, NeMo 25.02 and 25.04, the DGX Cloud Benchmarking recipes' Grok-1,
Llama-4 Maverick and DeepSeek-V3 tables): read with public_moe_runs.csv's columns, none refused,
each row priced with its own framework's facts and none of Megatron-Bridge's recipe facts, MAPE gated where it stands
(docs/moe.md)."""

import csv

import pytest

from commtax.decide.validate import recipe_layout, run_job_raw, source_plan, validate
from commtax.spec import load_catalog
from commtax.spec.pipeline_split import balanced_layout

# issue 18: 20% first, 10% the goal. 18.8% source-averaged, 20.4% over rows since branch moe17 read the NeMo 2.0
# Llama-4, Grok-1 and Mixtral performance recipes' recompute (none), bf16 gradient reduction and the Mixtral-8x22B
# recipes' TP overlap (off) (16.4% and 18.2% before,
# gated at 17.0; recipe facts, kept though they move the figure up). 39 rows of 10 sources (branch moe14 added 22
# rows of 5: NeMo 25.02, a second NeMo
# 25.04 row, the DGX Cloud Benchmarking recipes' Grok-1, Llama-4 Maverick and DeepSeek-V3 tables of 2025-09-04 and their
# 25.08 release's DeepSeek-V3 H100 run), no constant fitted on them: 16.3% source-averaged, 18.3% over rows since
# issue 18 priced DualPipe per pipeline rank (the DeepSeek-V3 report row -29.5% -> +2.8%; 19.0% and 19.0% before,
# gated at 19.5, since branch moe13: the MoE host sync and the alltoall dispatcher's own passes; 19.6% and 19.7%
# before that, gated at 20.1) (the 17 rows of 5 sources before: 22.6% and 23.4%, gated at 23.0); the large misses are
# named in docs/moe.md "Other published MoE runs"
OTHER_MOE_MAPE_GATE = 18.9
OTHER_MOE_MAPE_GOAL = 20.0
BRIDGE_SOURCE = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, '26.08 NeMo Container' pre-training tables"


def _rows(validation_dir, name):
    with open(validation_dir / name, newline="") as f:
        return list(csv.DictReader(f))


def test_other_moe_runs_all_predicted_and_gated(validation_dir):
    path = validation_dir / "other_moe_runs.csv"
    with open(path) as f, open(validation_dir / "public_moe_runs.csv") as g:
        assert f.readline() == g.readline()  # exactly the public MoE file's columns
    report = validate(path)
    assert len(report.rows) == 39
    assert report.refused == [], [r.reason for r in report.rows if r.reason]
    assert report.unknown_columns == []
    assert len(report.by_source) == 10  # reported by publication, as the other files are
    assert report.source_avg_mape_pct <= OTHER_MOE_MAPE_GATE
    other_ids = {r.id for r in report.rows}
    assert all(not other_ids & set(ids) for ids in report.fitted.values())  # no constant fitted on these rows


def test_other_rows_take_no_megatron_bridge_recipe_fact(validation_dir):
    # catalog/moe_recipes.yaml is Megatron-Bridge's: its dispatcher rules, layouts and software settings apply to a
    # row whose source names a NeMo container release, never to another source's row of the same model and plan
    catalog = load_catalog()
    bridge = next(r for r in _rows(validation_dir, "public_moe_runs.csv") if r["id"] == "mb2608_deepseekv3_gb200")
    assert bridge["dispatcher"] == ""
    _, fixed, _ = run_job_raw(bridge, catalog)
    assert fixed["moe_dispatcher"] == "hybridep" and fixed["moe_a2a_overlap"] is True  # the 26.06+ recipe
    assert fixed["grad_comm_dtype"] == "bf16"  # its software rule
    assert fixed["pipeline_layout"] == recipe_layout(bridge, 16) == (4,) * 15 + (1,)  # its hand layout (pp 4 x vp 4)
    other = {**bridge, "source": "a paper's table of the same DeepSeek-V3 run; Table 3", "framework": "megatron-core"}
    raw, fixed, _ = run_job_raw(other, catalog)
    for key in ("moe_dispatcher", "moe_a2a_overlap", "grad_comm_dtype", "recompute", "recompute_modules"):
        assert key not in fixed, key
    assert fixed["pipeline_layout"] == balanced_layout(61, 4, 4)  # the most even split, not the recipe's
    assert raw["model"]["mtp_layers"] == 1  # the catalog's model, not a recipe's arch restatement


def test_framework_facts_of_each_source(validation_dir):
    catalog = load_catalog()
    rows = {r["id"]: r for r in _rows(validation_dir, "other_moe_runs.csv")}
    # NeMo AutoModel: FSDP2 (ZeRO-2 beside pipeline parallelism, ZeRO-3 without), whole-block checkpointing, no MTP
    raw, fixed, _ = run_job_raw(rows["am_deepseekv3_256_h100"], catalog)
    assert fixed["framework"] == "nemo-automodel" and fixed["zero"] == 2 and fixed["recompute"] == "full"
    assert raw["model"]["mtp_layers"] == 0
    _, fixed, _ = run_job_raw(rows["am_qwen3_30b_h100"], catalog)
    assert fixed["zero"] == 3
    _, fixed, _ = run_job_raw(rows["am_gptoss_120b_h100"], catalog)
    assert fixed["recompute"] == "none" and fixed["attention"] == "triton"  # FlexAttention, no checkpointing
    # Megatron-MoE-ModelZoo: the table's recompute cell; a row restating recompute none drops the modules
    _, fixed, _ = run_job_raw(rows["mz_qwen3_235b_h100_deepep_ep32"], catalog)
    assert fixed["recompute_modules"] == ("layernorm", "moe_act") and "moe_a2a_overlap" not in fixed
    _, fixed, _ = run_job_raw(rows["mz_qwen3_235b_h100_deepep_ep32_a2a"], catalog)
    assert fixed["moe_a2a_overlap"] is True
    _, fixed, _ = run_job_raw(rows["mz_qwen3_235b_h100_deepep_tp4"], catalog)
    assert fixed["recompute"] == "none" and "recompute_modules" not in fixed
    # the DeepSeek-V3 report: DualPipe, ZeRO-1, recompute of RMSNorm and the MLA up-projections (§3.2), MTP on
    raw, fixed, _ = run_job_raw(rows["dsv3_report_h800"], catalog)
    assert fixed["schedule"] == "dualpipe" and fixed["zero"] == 1 and fixed["framework"] == "custom"
    assert fixed["recompute_modules"] == ("layernorm", "mla_up_proj") and raw["model"]["mtp_layers"] == 1


def test_source_plan_later_recompute_drops_modules():
    row = {"source": "yanring/Megatron-MoE-ModelZoo; GB300", "id": "mz_qwen3_235b_gb300_mxfp8"}
    assert source_plan(row) == {"recompute": "none", "moe_a2a_overlap": True, "overlap": {"dp": False}}
    row = {**row, "id": "mz_qwen3_235b_h100_deepep_ep32"}
    assert source_plan(row) == {"recompute": "selective", "recompute_modules": ("layernorm", "moe_act")}


@pytest.mark.parametrize(
    "rid",
    [
        "am_deepseekv3_1024_h100",
        "mz_qwen3_235b_gb200_bf16",
        "mc_dsv3_gb200_hybridep",
        "dsv3_report_h800",
        "dgxc_grok1_gb200_bf16_512",
        "dgxc_llama4mav_h100_fp8_512",
        "dgxc_dsv3_h100_bf16_1024",
        "dgxc2508_dsv3_h100_bf16_1024",
    ],
)
def test_targets_follow_their_notes(validation_dir, rid):
    # the conversions the target_note states, recomputed from the published figures
    row = next(r for r in _rows(validation_dir, "other_moe_runs.csv") if r["id"] == rid)
    published = {
        "am_deepseekv3_1024_h100": 8192 * 4096 / (37.87 * 1024),  # GBS x seq / (step s x GPUs), the row's 865
        "mz_qwen3_235b_gb200_bf16": 750e12 / 1.4803e11,  # TFLOPS / Megatron-LM's FLOPs per token
        "mc_dsv3_gb200_hybridep": 970.01e12 / 2.4981e11,  # the same for DeepSeek-V3 without MTP
        "dsv3_report_h800": 1e12 / (180e3 * 3600),  # 180K H800 GPU-hours per trillion tokens
        # DGX Cloud Benchmarking tables: seq x GBS / (step s x GPUs), GBS as the recipe's config table weak-scales it
        "dgxc_grok1_gb200_bf16_512": 8192 * 1024 / (7.324 * 512),  # not the table's 572679 tokens/s (GBS 512's)
        "dgxc_llama4mav_h100_fp8_512": 8192 * 1024 / (3.855 * 512),  # the table's 2176574 tokens/s over 512 GPUs
        "dgxc_dsv3_h100_bf16_1024": 4096 * 8192 / (52.04 * 1024),  # the table's 644781.55 tokens/s over 1,024 GPUs
        "dgxc2508_dsv3_h100_bf16_1024": 927200 / 1024,  # the README's 4096 * 8192 / 36.189 = 927200 tokens/s
    }[rid]
    assert float(row["measured_tokens_per_s_per_gpu"]) == pytest.approx(published, rel=2e-3)


def test_docs_table_is_the_validators(validation_dir):
    # docs/moe.md "Other published MoE runs" prints each row as `commtax validate` predicts it
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    section = text.split("### Other published MoE runs", 1)[1]
    report = validate(validation_dir / "other_moe_runs.csv")
    by_id = {r.id: r for r in report.rows}
    seen = 0
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] not in by_id:
            continue
        r = by_id[cells[0]]
        assert float(cells[1].replace(",", "")) == pytest.approx(r.measured, abs=0.5)
        assert float(cells[2].replace(",", "")) == pytest.approx(r.predicted, abs=0.5)
        assert float(cells[3].rstrip("%")) == pytest.approx(r.error_pct, abs=0.05)
        seen += 1
    assert seen == len(report.rows) == 39
    assert f"{report.source_avg_mape_pct:.1f}% averaged over the ten sources" in section
    assert f"{report.mape_pct:.1f}% over rows" in section


def test_megatron_flops_per_token():
    # Megatron-LM megatron/training/training.py num_floating_point_operations (@3c1b98efdc), per token at seq 4096,
    # the convention the TFLOP/s targets are converted with: Qwen3-235B-A22B (GQA 64/4 heads of 128, 94 MoE layers,
    # top-8 of 1536, vocab 151936) and DeepSeek-V3 without MTP (MLA, 3 dense + 58 MoE layers, top-8 + 1 shared)
    s, h = 4096, 4096
    q, kv = 128 * 64, 128 * 4
    attn = 6 * (h * (q + 2 * kv) + q * s + q * h)
    qwen = 12 * 94 * h * 1536 * 8 * 1.5 + 94 * attn + 6 * h * 151936
    assert qwen == pytest.approx(1.4803e11, rel=1e-4)
    h, n = 7168, 128
    mla = 6 * (
        1536 * (h + n * 192 + 1) + 512 * (h + n * 256 + 1) + h * 64 + n * 128 * h + s * n * 192 / 2 + s * n * 128 / 2
    )
    mlp = 12 * h * (18432 * 1.5 * 3 + (2048 * 8 + 2048) * 1.5 * 58)
    assert mlp + 61 * mla + 6 * h * 129280 == pytest.approx(2.4981e11, rel=1e-4)


def test_refused_row_names_the_rule(validation_dir):
    # a row whose plan breaks a Megatron rule is refused with that rule, not with a bare "no plan"
    from commtax.decide.validate import predict_run

    row = {**{r["id"]: r for r in _rows(validation_dir, "other_moe_runs.csv")}["am_qwen3_30b_h100"], "ep": "3"}
    result = predict_run(row, load_catalog())
    assert result.predicted is None and "num_experts(128) must be divisible by ep(3)" in result.reason


def test_dispatcher_default_is_the_frameworks():
    # catalog/frameworks.yaml moe_dispatcher: NeMo AutoModel runs DeepEP whenever it is installed (BackendConfig
    # enable_deepep = HAVE_DEEP_EP); Megatron-Core's usual setting, NeMo's and torchtitan's are the NCCL all-to-all
    from commtax.spec import Plan, frameworks

    assert frameworks()["nemo-automodel"].moe_dispatcher == "deepep"
    assert all(frameworks()[f].moe_dispatcher == "alltoall" for f in ("megatron-core", "nemo", "torchtitan"))
    assert all(len(frameworks()[f].moe_source) > 40 for f in ("megatron-core", "nemo", "torchtitan", "nemo-automodel"))
    assert Plan(framework="nemo-automodel").moe_dispatcher == "deepep"
    assert Plan(framework="nemo-automodel", moe_dispatcher="alltoall").moe_dispatcher == "alltoall"  # the plan's wins
    assert Plan(framework="megatron-core").moe_dispatcher == "alltoall"


def test_dgxc_recipe_facts(validation_dir):
    # the DGX Cloud Benchmarking rows run NeMo 2.0's performance scripts: fp8 reduces gradients in bf16, bf16 keeps
    # NeMo's fp32; DeepSeek-V3 with its uneven first/last stage, token drop at capacity 1.0, no MTP, selective recompute
    # of the launcher's modules; Grok-1 as NeMo builds it (Mixtral's untied output layer, the Llama-3 tokenizer)
    catalog = load_catalog()
    rows = {r["id"]: r for r in _rows(validation_dir, "other_moe_runs.csv")}
    raw, fixed, free = run_job_raw(rows["dgxc_dsv3_h100_bf16_512"], catalog)
    assert fixed["pipeline_layout"] == [7, 8, 8, 8, 8, 8, 8, 6] and sum(fixed["pipeline_layout"]) == 61
    assert fixed["recompute_modules"] == ("mla_up_proj",) and fixed["overlap"] == {"tp": False}
    assert raw["model"]["mtp_layers"] == 0 and raw["model"]["capacity_factor"] == 1.0
    assert "grad_comm_dtype" not in fixed and free == []
    _, fixed, _ = run_job_raw(rows["dgxc_dsv3_h100_bf16_1024"], catalog)
    assert sum(fixed["pipeline_layout"]) == 61 and len(fixed["pipeline_layout"]) == 16
    raw, fixed, _ = run_job_raw(rows["dgxc_grok1_gb200_fp8_128"], catalog)
    assert fixed["grad_comm_dtype"] == "bf16" and fixed["etp"] == 4
    assert raw["model"]["vocab"] == 128256 and raw["model"]["tied_embeddings"] is False
    # the 25.08 release's DeepSeek-V3 H100 run: DeepEP, NeMo's (pp 8, vp 2) layout, recompute of mla_up_proj, mlp, moe
    raw, fixed, _ = run_job_raw(rows["dgxc2508_dsv3_h100_bf16_1024"], catalog)
    assert fixed["moe_dispatcher"] == "deepep" and fixed["pipeline_layout"] == [4] * 15 + [1]
    assert fixed["recompute_modules"] == ("mla_up_proj", "mlp", "moe") and raw["model"]["mtp_layers"] == 0
    assert raw["model"].get("capacity_factor") is None  # no token drop on H100 in that script
    raw, fixed, _ = run_job_raw(rows["dgxc_llama4mav_gb200_bf16_128"], catalog)
    assert raw["model"]["capacity_factor"] == 1.0 and fixed["vp"] == 12


def test_nemo2_performance_recipes_recompute_nothing_and_reduce_in_bf16(validation_dir):
    # branch moe17, read from the recipes the rows ran: NeMo 2.0's Llama-4 (NeMo @7a8f1cc7b llama4_e128.py), Grok-1
    # (@6f2c6fdaf pretrain_grok1_314b.py) and Mixtral (v2.2.0 mixtral_8x22b.py, v2.3.0 mixtral_8x7b.py and
    # mixtral_8x22b_64k.py) performance recipes set no recompute_granularity (Megatron-Core's default None: nothing
    # recomputed; the launchers pass no recompute layers or modules), and their pretrain_performance_optimizations set
    # recipe.trainer.plugins.grad_reduce_in_fp32 = False for bf16 runs too; DeepSeek-V3's does neither
    catalog = load_catalog()
    rows = {r["id"]: r for r in _rows(validation_dir, "other_moe_runs.csv")}
    for rid in ("dgxc_llama4mav_gb200_bf16_128", "dgxc_llama4mav_h100_fp8_512", "dgxc_grok1_gb200_bf16_128"):
        _, fixed, _ = run_job_raw(rows[rid], catalog)
        assert fixed["recompute"] == "none" and fixed["grad_comm_dtype"] == "bf16", rid
        assert "recompute_modules" not in fixed
    for rid in ("nemo2502_mixtral8x7b_b200", "nemo2502_mixtral8x22b_b200", "nemo2504_mixtral8x22b_gb200"):
        raw, fixed, _ = run_job_raw(rows[rid], catalog)
        assert fixed["recompute"] == "none" and raw["model"]["capacity_factor"] == 1.0, rid
        # the 8x22B recipes' MegatronCommOverlapCallback leaves tp_comm_overlap False (TP 2 with sequence parallelism)
        assert fixed.get("overlap") == ({"tp": False} if "8x22b" in rid else None), rid
    _, fixed, _ = run_job_raw(rows["dgxc_dsv3_h100_bf16_512"], catalog)
    assert fixed["recompute"] == "selective" and "grad_comm_dtype" not in fixed  # fp32 reduction, as its recipe keeps
    results = {r.id: r for r in validate(validation_dir / "other_moe_runs.csv").rows}
    assert all(results[rid].extra["fits"] and results[rid].recompute == "none" for rid in rows if "llama4mav" in rid)


def test_nemo_long_context_rows_read_gbs_from_ga(validation_dir):
    # the NeMo 25.02/25.04 Mixtral-8x22B rows print GBS 1 and MBS 64, swapped: GA 16 = GBS / (MBS x DP) with
    # DP = 256 / (TP 2 x PP 4 x CP 8) = 4 gives GBS 64 at MBS 1
    for rid in ("nemo2502_mixtral8x22b_b200", "nemo2504_mixtral8x22b_gb200"):
        row = next(r for r in _rows(validation_dir, "other_moe_runs.csv") if r["id"] == rid)
        dp = int(row["num_gpus"]) // (int(row["tp"]) * int(row["pp"]) * int(row["cp"]))
        assert int(row["global_batch"]) == 16 * int(row["micro_batch"]) * dp == 64
