"""The public MoE runs (shared/validation/public_moe_runs.csv): every row predicted, MAPE gated like the dense set."""

import pytest

from commtax.decide.validate import moe_layers_cell, validate
from commtax.errors import SpecError

# issue 18 asks for ≤ 15% source-averaged; the model reaches 20.1% today (docs/moe.md "Validation"; 20.0% before the
# MXFP8 LM head of the 26.06+ DeepSeek-V3 and GPT-OSS GB recipes, a fact that moves it up, and 20.5% before
# Transformer Engine's FP8 attention in the 26.06+ NVL72 MXFP8 recipes, both branch moe18; 23.2% before the
# recipes' fp8 scaling, GPT-OSS's unfused RoPE, TE's fp8 padding copies, the 25.09 DeepSeek-V3 recompute, branch
# moe16; 27.9% before branches
# moe13 and moe15; 28.9% before the all-to-all overlap was priced per layer piece as Megatron-Core pairs them,
# branch moe10). It was 27.4%
# before the recipes' own recompute, gradient dtype, interleaving and MTP facts (branch moe8), which recompute less
# than the Plan's default and so make the too-fast rows faster, then DeepEP/HybridEP's rates as their tests define
# them; 23.6% before NCCL's all_to_all moved onto its p2p path (checked against measured alltoall_perf in
# tests/test_nccl_alltoall_measured.py, not against these rows). This gate holds the figure where it is so that a
# change that makes it worse fails
MOE_MAPE_GATE = 20.1
MOE_MAPE_GOAL = 15.0


def test_public_moe_runs_all_predicted_and_gated(validation_dir):
    report = validate(validation_dir / "public_moe_runs.csv")
    assert len(report.rows) == 38
    assert report.refused == [], [r.reason for r in report.rows if r.reason]
    assert report.source_avg_mape_pct == pytest.approx(sum(report.by_source.values()) / len(report.by_source))
    assert report.source_avg_mape_pct <= MOE_MAPE_GATE
    assert report.fitted == {} or all(not any(i.startswith("mb2") for i in ids) for ids in report.fitted.values())


def test_moe_layers_column():
    assert moe_layers_cell("first_k_dense=3") == {"moe_layers": "all", "first_k_dense": 3}
    assert moe_layers_cell("alternate") == {"moe_layers": "alternate"}
    with pytest.raises(SpecError, match="column moe_layers"):
        moe_layers_cell("every-third")


def test_recipe_rules_dated_by_release():
    # the H100 Qwen3-235B recipe overlaps the all-to-all from Megatron-Bridge v0.2.0 (25.11 container) on
    from commtax.decide.validate import recipe_plan, release_at_least, row_release

    def row(release):
        return {
            "model": "qwen3-235b-a22b",
            "gpu": "h100-sxm5-80gb",
            "precision": "fp8",
            "source": f"NVIDIA-NeMo/Megatron-Bridge docs, '{release} NeMo Container' pre-training tables",
        }

    fixed = {"tp": 2, "pp": 8, "ep": 32}
    assert row_release(row("26.04.01")) == (26, 4, 1)
    assert release_at_least(row("25.11"), "25.11") and not release_at_least(row("25.09"), "25.11")
    assert not release_at_least({"source": "a paper"}, "25.11")  # a row naming no release takes no dated rule
    assert recipe_plan(row("26.02"), fixed) == {"moe_dispatcher": "alltoall", "moe_a2a_overlap": True}
    assert recipe_plan(row("25.09"), fixed) == {"moe_dispatcher": "alltoall"}
    assert recipe_plan(row("26.02"), {**fixed, "ep": 16}) == {}  # another parallelism: not the recipe's


def test_deepseek_gb_mxfp8_overlap_from_26_06():
    from commtax.decide.validate import recipe_plan

    row = {"model": "deepseek-v3", "gpu": "gb300", "precision": "fp8"}
    fixed = {"pp": 2, "ep": 32}
    new = {**row, "source": "Megatron-Bridge docs, '26.06 NeMo Container' pre-training tables"}
    old = {**row, "source": "Megatron-Bridge docs, '26.04.01 NeMo Container' pre-training tables"}
    # v0.5.0's DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1 also runs full-iteration CUDA graphs (no host sync) and
    # FP8 dot-product attention (fp8_dot_product_attention=True; branch moe18)
    graphed = {"moe_dispatcher": "hybridep", "moe_a2a_overlap": True, "cuda_graphs": "full_iteration"}
    # and the MXFP8 LM head (v0.5.0 deepseek_llm_pretrain.py fp8_output_proj for every GB300/GB200 MXFP8 config)
    assert recipe_plan(new, fixed) == {**graphed, "fp8_attention": True, "fp8_output_proj": True}
    # DeepSeek-V3's GB200 MXFP8 recipe sets no FP8 attention (v0.5.0 GB200_FP8_MX_V1; v0.6.0 gb200 fp8mx)
    assert recipe_plan({**new, "gpu": "gb200"}, {"pp": 4, "ep": 64}) == {**graphed, "fp8_output_proj": True}
    assert recipe_plan(old, fixed) == {"moe_dispatcher": "hybridep"}


def test_qwen3_and_gpt_oss_gb_mxfp8_overlap_from_26_06():
    # Megatron-Bridge v0.5.0 (the 26.06 container) added moe_a2a_overlap to the GB300/GB200 MXFP8 recipes of
    # Qwen3-30B (ep8), Qwen3-235B (pp4/pp8, ep32) and GPT-OSS-120B (ep16/ep64); v0.4.2 had none of them
    from commtax.decide.validate import recipe_plan

    def row(model, gpu, release):
        return {"model": model, "gpu": gpu, "precision": "fp8", "source": f"'{release} NeMo Container' tables"}

    # and graphed, with FP8 dot-product attention (v0.5.0 *_FP8_MX_V1/V2, v0.6.0 perf_recipes; branch moe18)
    on = {"moe_dispatcher": "hybridep", "moe_a2a_overlap": True, "cuda_graphs": "full_iteration", "fp8_attention": True}
    assert recipe_plan(row("qwen3-30b-a3b", "gb300", "26.08"), {"pp": 1, "ep": 8}) == on
    assert recipe_plan(row("qwen3-235b-a22b", "gb200", "26.08"), {"pp": 8, "ep": 32}) == on
    assert recipe_plan(row("gpt-oss-120b", "gb300", "26.06"), {"ep": 16}) == {**on, "fp8_output_proj": True}
    off = {"moe_dispatcher": "hybridep"}
    assert recipe_plan(row("qwen3-235b-a22b", "gb300", "26.04.01"), {"pp": 4, "ep": 32}) == off
    assert recipe_plan(row("gpt-oss-120b", "gb200", "26.04"), {"ep": 64}) == off


def test_recipes_before_hybridep_run_alltoall_or_deepep():
    # r0.1.0 (the 25.09 container): DeepSeek-V3 with DeepEP and the 1F1B overlap on H100, NCCL all-to-all with token
    # drop on GB200/B200; HybridEP only on GB200/GB300 from v0.2.0 and on NVL8 systems from v0.3.0 (26.02)
    from commtax.decide.validate import recipe_plan, release_before

    def row(model, gpu, release):
        return {"model": model, "gpu": gpu, "precision": "fp8", "source": f"'{release} NeMo Container' tables"}

    assert release_before(row("x", "h100", "25.09"), "25.11") and not release_before(row("x", "h100", "25.11"), "25.11")
    assert not release_before({"source": "a paper"}, "25.11")  # no release named: no dated rule
    ds = {"tp": 2, "pp": 8, "ep": 64}
    assert recipe_plan(row("deepseek-v3", "h100", "25.09"), ds) == {"moe_dispatcher": "deepep", "moe_a2a_overlap": True}
    assert recipe_plan(row("deepseek-v3", "gb200", "25.09"), {"pp": 4, "ep": 64}) == {"moe_dispatcher": "alltoall"}
    assert recipe_plan(row("deepseek-v3", "gb200", "25.11"), {"pp": 4, "ep": 64}) == {"moe_dispatcher": "hybridep"}
    assert recipe_plan(row("deepseek-v3", "b200", "25.11"), {"pp": 16, "ep": 8}) == {"moe_dispatcher": "alltoall"}
    q = {"pp": 2, "ep": 8}
    assert recipe_plan(row("qwen3-30b-a3b", "h100", "25.11"), q) == {
        "moe_dispatcher": "alltoall",
        "moe_a2a_overlap": True,
    }
    assert recipe_plan(row("qwen3-30b-a3b", "h100", "26.02"), q) == {
        "moe_dispatcher": "hybridep",
        "moe_a2a_overlap": True,
    }
