"""Megatron-Core's selective recompute modules (plan.recompute_modules): what each re-runs in backward and what it
stops keeping, hand-worked; the refusals; and the Megatron-Bridge recipes' settings the MoE validation applies."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.decide.validate import recipe_rule, run_job_raw
from commtax.errors import SpecError
from commtax.spec import job_with, load_catalog, load_job
from commtax.workload.memory import layer_activation_bytes, moe_layer_activation_bytes
from commtax.workload.step import _layer_block

H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}


def job(model="mixtral-8x7b", precision="bf16", **plan):
    return load_job(
        {
            "model": model,
            "cluster": {**H100, "num_gpus": 64},
            "plan": {"framework": "megatron-core", "ep": 8 if model != "llama2-7b" else 1, **plan},
            "training": {"seq_len": 4096, "global_batch": 512, "precision": precision},
        }
    )


def names(phase):
    return sorted(o.name for o in phase.ops)


def test_unset_modules_are_megatrons_core_attn():
    # transformer_config.py: recompute_modules "default: ["core_attn"]": the selective recompute commtax had
    default = job(recompute="selective")
    explicit = job(recompute="selective", recompute_modules=["core_attn"])
    assert default.plan.recomputed == {"core_attn"}
    assert _layer_block(default, moe=True).recompute == _layer_block(explicit, moe=True).recompute
    assert layer_activation_bytes(default) == layer_activation_bytes(explicit)


def test_each_module_reruns_its_forward_ops():
    j = job(recompute="selective", recompute_modules=["layernorm", "moe_act"])
    block = _layer_block(j, moe=True)
    fwd = {o.name: o for o in block.fwd.ops}
    assert names(block.recompute) == ["expert_activation_recompute", "norms_recompute"]
    rec = {o.name: o for o in block.recompute.ops}
    assert rec["norms_recompute"].bytes == fwd["norms"].bytes  # the same kernel, run again
    assert rec["expert_activation_recompute"].bytes == fwd["expert_activation"].bytes
    # moe: the whole MoE MLP forward again, its dispatch and combine all-to-alls too (moe_layer.py checkpoint)
    whole = _layer_block(job(recompute="selective", recompute_modules=["moe"]), moe=True)
    assert {"ep_dispatch_recompute", "ep_combine_recompute", "expert_up_recompute"} <= set(names(whole.recompute))
    # mlp is the dense MLP: nothing on an MoE layer, its GEMMs on a dense one
    dense = _layer_block(job(model="llama2-7b", recompute="selective", recompute_modules=["mlp"]))
    assert names(dense.recompute) == ["activation_recompute", "mlp_down_recompute", "mlp_up_recompute"]
    assert names(_layer_block(job(recompute="selective", recompute_modules=[]), moe=True).recompute) == []


def test_modules_drop_what_they_recompute():
    # Mixtral-8x7B, b = 1, s = 4096, h = 4096, tp = 1, bf16 (a = 2 B): layernorm discards the two norm outputs, the
    # QKV and MLP GEMM inputs, 2·a·s·b·h = 2 · 2 · 4096 · 4096 B = 64 MiB
    base = job(recompute="selective", recompute_modules=[])
    ln = job(recompute="selective", recompute_modules=["layernorm"])
    assert layer_activation_bytes(base) - layer_activation_bytes(ln) == 2 * 2 * 4096 * 4096
    # moe_act discards the experts' activation output, rows·f_e at the GEMM input width: T·k = 4096·2 rows of the
    # 8 experts on 8 GPUs (one each) of f_e = 14336 at 2 B
    act = job(recompute="selective", recompute_modules=["moe_act"])
    assert moe_layer_activation_bytes(base) - moe_layer_activation_bytes(act) == 4096 * 2 * 14336 * 2
    # moe keeps nothing of the MoE MLP but its input (the pre-MLP norm's, kept with the attention half)
    moe = job(recompute="selective", recompute_modules=["moe"])
    assert moe_layer_activation_bytes(moe) < moe_layer_activation_bytes(act) < moe_layer_activation_bytes(base)


def test_mla_up_proj_reruns_the_up_projections():
    j = job(model="deepseek-v2", precision="fp8", recompute="selective", recompute_modules=["mla_up_proj"], ep=8)
    rec = names(_layer_block(j, moe=True).recompute)
    assert {"q_up_recompute", "kv_up_recompute", "rope_recompute", "kv_up_cast_recompute"} <= set(rec)
    base = job(model="deepseek-v2", precision="fp8", recompute="selective", recompute_modules=[], ep=8)
    assert layer_activation_bytes(j) < layer_activation_bytes(base)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"recompute": "none", "recompute_modules": ["layernorm"]}, "applies to recompute: selective, not none"),
        ({"recompute": "selective", "recompute_modules": ["moe_act", "moe_act"]}, "names moe_act twice"),
        ({"recompute": "selective", "recompute_modules": ["attention"]}, "recompute_modules"),
        ({"recompute": "selective", "recompute_modules": ["mla_up_proj"]}, "mla_up_proj needs an MLA model"),
        ({"recompute": "selective", "recompute_modules": ["mlp"]}, "mlp needs a dense MLP layer"),
        ({"recompute": "selective", "recompute_modules": ["shared_experts"]}, "shared_experts needs shared experts"),
        (
            {"recompute": "selective", "recompute_modules": ["moe"], "moe_a2a_overlap": True},
            "moe_a2a_overlap does not run with recompute_modules moe",
        ),
    ],
)
def test_refusals_name_the_field(plan, message):
    with pytest.raises(SpecError, match=message):
        job(**plan)


def test_changing_recompute_drops_the_modules():
    # the search varies recompute: none or full recompute leave no selective modules behind
    j = job(recompute="selective", recompute_modules=["layernorm"])
    assert job_with(j, recompute="full").plan.recompute_modules is None
    assert j.plan.replace(recompute="none").recomputed == set()


def _row(model, gpu, precision, release, **cells):
    return {
        "id": "t",
        "source": f"NVIDIA-NeMo/Megatron-Bridge docs, '{release} NeMo Container' pre-training tables",
        "model": model,
        "gpu": gpu,
        "precision": precision,
        **cells,
    }


def test_recipe_software_rules():
    # Qwen3: set_qwen3_common_configs recompute_granularity None; every family grad_reduce_in_fp32 False
    rule = recipe_rule(_row("qwen3-30b-a3b", "h100-sxm5-80gb", "fp8", "26.04.01"), {"pp": 1, "ep": 16}, "software")
    assert rule["plan"] == {"recompute": "none", "grad_comm_dtype": "bf16"}
    # GPT-OSS-120B on H100: recompute_modules [layernorm, moe_act], no virtual pipeline
    rule = recipe_rule(_row("gpt-oss-120b", "h100-sxm5-80gb", "bf16", "26.02"), {"pp": 4, "ep": 8}, "software")
    assert rule["plan"]["recompute_modules"] == ["layernorm", "moe_act"] and rule["plan"]["vp"] == 1
    # DeepSeek-V3 GB200 FP8: mla_up_proj in 25.09 (run_script.py @v0.1.0rc4 with token drop), at v0.3.0 (26.02),
    # mlp at v0.4.0 (26.04), mla_up_proj again from v0.5.0
    ds = {"pp": 4, "ep": 64}
    mods = {
        rel: recipe_rule(_row("deepseek-v3", "gb200", "fp8", rel), ds, "software")["plan"].get("recompute_modules")
        for rel in ("25.09", "26.02", "26.04.01", "26.08")
    }
    assert mods == {"25.09": ["mla_up_proj"], "26.02": ["mla_up_proj"], "26.04.01": ["mlp"], "26.08": ["mla_up_proj"]}
    # the 25.09 H100 run: [mla_up_proj, mlp] and no overlapped DP reduction (run_script.py @v0.1.0rc4)
    h100 = recipe_rule(_row("deepseek-v3", "h100-sxm5-80gb", "fp8", "25.09"), {"pp": 8, "ep": 64}, "software")
    assert h100["plan"]["recompute_modules"] == ["mla_up_proj", "mlp"] and h100["plan"]["overlap"] == {"dp": False}
    # the 25.11 GB300 runs are published "w/o MTP"; the B200 one "w/ MTP"
    gb300 = recipe_rule(_row("deepseek-v3", "gb300", "fp8", "25.11"), {"pp": 2, "ep": 32}, "software")
    assert gb300["arch"] == {"mtp_layers": 0}
    b200 = _row("deepseek-v3", "b200-sxm-192gb", "fp8", "25.11")
    assert "arch" not in recipe_rule(b200, {"pp": 16, "ep": 8}, "software")


def test_row_takes_the_recipes_settings_and_keeps_its_own():
    cells = {"num_gpus": "16", "gpus_per_node": "8", "intra_node": "nvlink4", "inter_node": "ib-ndr"}
    cells |= {"seq_len": "4096", "global_batch": "1024", "tp": "1", "pp": "1", "ep": "16", "vp": "", "cp": "1"}
    row = _row("qwen3-30b-a3b", "h100-sxm5-80gb", "fp8", "26.04.01", **cells)
    raw, fixed, free = run_job_raw(row, load_catalog())
    assert fixed["recompute"] == "none" and fixed["grad_comm_dtype"] == "bf16"
    raw, fixed, _ = run_job_raw({**row, "recompute": "full"}, load_catalog())
    assert fixed["recompute"] == "full"  # the row's own cell wins
    raw, fixed, _ = run_job_raw({**row, "source": "a torchtitan run"}, load_catalog())
    assert "grad_comm_dtype" not in fixed and "recompute" not in fixed  # not a Megatron-Bridge benchmark row
    row = _row("deepseek-v3", "gb300", "bf16", "25.11", **{**cells, "num_gpus": "256", "pp": "2", "ep": "32"})
    raw, fixed, _ = run_job_raw({**row, "gpus_per_node": "72", "vp": "4"}, load_catalog())
    assert raw["model"]["mtp_layers"] == 0


ALL_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


@settings(max_examples=25, deadline=None)
@given(st.sets(st.sampled_from(ALL_MODULES)), st.sampled_from(ALL_MODULES))
def test_one_more_module_never_keeps_more_nor_reruns_less(mods, extra):
    # DeepSeek-V2 has every module's part: MLA, a dense first layer, routed and shared experts
    def of(ms):
        j = job(model="deepseek-v2", recompute="selective", recompute_modules=sorted(ms), ep=8)
        moe, dense = _layer_block(j, moe=True), _layer_block(j)
        work = sum(o.bytes + getattr(o, "flop", 0.0) for b in (moe, dense) for o in b.recompute.ops)
        return moe_layer_activation_bytes(j) + layer_activation_bytes(j), work

    kept, work = of(mods)
    kept_more, work_more = of(mods | {extra})
    assert kept_more <= kept and work_more >= work
