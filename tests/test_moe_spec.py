"""MoE spec: catalog models against their model cards, and the refusals of Megatron-Core's EP rules."""

import pytest

from commtax.errors import SpecError
from commtax.spec import Model, load_catalog, load_job

# (total B, active B, tolerance) from each model card (catalog/models.yaml source); GPT-OSS counts its active
# parameters without the input embedding table (arXiv 2508.10925 Table 1: 5.13B = ours 5.71B - 0.58B embedding)
CARDS = {
    "deepseek-v3": (671, 37, 0.02),
    "deepseek-v2": (236, 21, 0.02),
    "kimi-k2": (1040, 32, 0.03),
    "qwen3-235b-a22b": (235, 22, 0.02),
    "qwen3-30b-a3b": (30.5, 3.3, 0.02),
    "gpt-oss-120b": (116.83, 5.13, 0.01),
    "gpt-oss-20b": (20.91, 3.61, 0.01),
    "llama4-maverick": (400, 17, 0.02),
    "llama4-scout": (109, 17, 0.02),
    "mixtral-8x7b": (46.7, 12.9, 0.01),
    "mixtral-8x22b": (141, 39, 0.01),
    "grok-1": (314, 314 * 0.25, 0.07),  # "25% of the weights active": a rounded share, hence 7%
}


def model(name: str) -> Model:
    return Model(**{"name": name, **load_catalog()["model"][name]})


@pytest.mark.parametrize("name", sorted(CARDS))
def test_catalog_params_match_model_cards(name):
    total, active, tol = CARDS[name]
    m = model(name)
    act = m.active_params()
    if name.startswith("gpt-oss"):
        act -= m.vocab * m.hidden  # the card leaves the embedding lookup out of "active"
    assert m.params() / 1e9 == pytest.approx(total, rel=tol)
    assert act / 1e9 == pytest.approx(active, rel=tol)


def test_deepseek_v3_mla_layer_by_hand():
    # DeepSeek-V2 §2.1.2 MLA: W_DQ h·1536 + q norm 1536 + W_UQ 1536·128·192 + W_DKV/W_KR h·(512+64) + kv norm 512
    # + W_UK,W_UV 512·128·(128+128) + W_O 128·128·h
    h = 7168
    expected = h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256 + 128 * 128 * h
    assert model("deepseek-v3").attention_params() == expected


def test_moe_layer_pattern():
    m = model("deepseek-v3")
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert m.moe_layer_count == 58
    mav = model("llama4-maverick")  # interleave_moe_layer_step 2: layers 1, 3, 5, ... have experts
    assert mav.moe_layer_count == 24 and not mav.is_moe_layer(0) and mav.is_moe_layer(1)


def test_head_dim_not_hidden_over_heads():
    m = model("gpt-oss-120b")  # 2880 / 64 = 45, the config says 64
    assert m.head_dim == 64


def test_issue_example_is_accepted(tmp_path):
    # issue 18: this job was refused with "model.num_experts: Extra inputs are not permitted"
    p = tmp_path / "mixtral.yaml"
    p.write_text(
        "model: {layers: 32, hidden: 4096, heads: 32, kv_heads: 8, ffn_hidden: 14336, vocab: 32000,\n"
        "        gated_mlp: true, num_experts: 8, top_k: 2, moe_ffn_hidden: 14336}\n"
        "cluster: {gpu: h100-sxm5-80gb, num_gpus: 32, intra_node: nvlink4, inter_node: ib-ndr}\n"
        "plan: {tp: 1, pp: 4, ep: 8}\n"
        "training: {seq_len: 4096, global_batch: 256}\n"
    )
    job = load_job(p)
    assert job.model.is_moe and job.plan.ep == 8 and job.edp == 1


H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}


def _job(model_name="mixtral-8x7b", **plan):
    return load_job(
        {
            "model": model_name,
            "cluster": {**H100, "num_gpus": 64},
            "plan": plan,
            "training": {"seq_len": 4096, "global_batch": 512},
        }
    )


@pytest.mark.parametrize(
    ("plan", "rule"),
    [
        ({"ep": 3}, "num_experts % expert_model_parallel_size"),
        ({"ep": 8, "etp": 8, "pp": 2}, "parallel folding"),
        ({"tp": 2, "ep": 8}, "sequence parallelism must be used"),
        ({"ep": 8, "pp": 2, "moe_a2a_overlap": True}, "virtual pipeline parallelism"),
        ({"ep": 8, "moe_a2a_overlap": True, "moe_dispatcher": "allgather"}, "alltoall or flex"),
        ({"ep": 8, "pp": 2, "schedule": "dualpipe"}, r"num_chunks >= num_ranks \* 2"),
        ({"ep": 8, "pp": 3, "schedule": "dualpipe"}, "even pp"),
    ],
)
def test_megatron_ep_rules_name_the_rule(plan, rule):
    with pytest.raises(SpecError, match=rule):
        _job(**plan) if "dualpipe" not in str(plan) else _dualpipe(plan)


def _dualpipe(plan):
    # 64 GPUs, pp 2: dp 32, global_batch 32 -> one micro-batch each, fewer than DualPipe's 2·pp
    return load_job(
        {
            "model": "mixtral-8x7b",
            "cluster": {**H100, "num_gpus": 48 if plan["pp"] == 3 else 64},
            "plan": plan,
            "training": {"seq_len": 4096, "global_batch": 32 if plan["pp"] == 2 else 48},
        }
    )


def test_dense_model_refuses_ep():
    with pytest.raises(SpecError, match="plan.ep applies to MoE models"):
        load_job(
            {
                "model": "llama2-7b",
                "cluster": {**H100, "num_gpus": 8},
                "plan": {"ep": 8},
                "training": {"seq_len": 4096, "global_batch": 64},
            }
        )


def test_moe_fields_need_each_other():
    with pytest.raises(ValueError, match="moe_ffn_hidden missing"):
        Model(layers=2, hidden=64, heads=4, vocab=100, num_experts=8, top_k=2)
    with pytest.raises(ValueError, match="apply to MoE models"):
        Model(layers=2, hidden=64, heads=4, vocab=100, shared_experts=1)


def test_expert_grid_folds_onto_the_same_gpus():
    job = _job(ep=8, pp=2)  # 64 GPUs: attention tp1·cp1·dp32·pp2, experts etp1·ep8·edp4·pp2
    assert job.dp == 32 and job.edp == 4
