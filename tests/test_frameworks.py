"""Frameworks as facts: presets from catalog/frameworks.yaml set the plan's software defaults; fields win."""

import pytest
from conftest import job_dict

from commtax.errors import SpecError
from commtax.spec import frameworks, load_job

NAMES = {"megatron-core", "nemo", "megatron-lm", "megatron-deepspeed", "deepspeed", "torchtitan", "fsdp", "custom"}


def test_every_framework_has_a_sourced_preset():
    assert set(frameworks()) == NAMES
    assert all(len(f.source) > 40 for f in frameworks().values())


def test_torchtitan_preset_and_overrides():
    plan = load_job(job_dict(framework="torchtitan")).plan
    # torchtitan: SDPA flash (FA2), eager RMSNorm/SwiGLU, per-op SAC, torchao dynamic float8, no async TP, no PP overlap
    assert (plan.attention, plan.elementwise, plan.selective_policy, plan.fp8_recipe) == ("fa2", "eager", "per_op",
                                                                                          "dynamic")
    assert (plan.overlap.tp, plan.overlap.pp, plan.overlap.dp) == (False, False, True)
    plan = load_job(job_dict(framework="torchtitan", elementwise="compiled", overlap={"tp": True})).plan
    assert plan.elementwise == "compiled" and plan.overlap.tp and not plan.overlap.pp


def test_generation_is_a_deprecated_alias():
    legacy = load_job(job_dict(generation="legacy"))
    assert legacy.plan.framework == "megatron-lm" and not legacy.plan.flash_attention and not legacy.plan.overlap.dp
    assert legacy.dropout  # 2021 Megatron-LM trained GPT with dropout 0.1
    assert load_job(job_dict(generation="current")).plan.framework == "megatron-core"
    assert load_job(job_dict(generation="legacy", flash_attention=True)).plan.attention == "fa2"


def test_zero3_overlap_follows_the_framework():
    # DeepSpeed's stage-3 prefetch overlaps; its stage 1-2 overlap_comm is off by default
    assert load_job(job_dict(framework="deepspeed", zero=3, tp=1, pp=1, dp=None, sequence_parallel=False)).plan.overlap.dp
    assert not load_job(job_dict(framework="deepspeed", zero=1)).plan.overlap.dp


def test_unknown_framework_names_the_choices():
    with pytest.raises(SpecError, match="framework must be one of megatron-core, nemo"):
        load_job(job_dict(framework="megatron"))
    with pytest.raises(SpecError, match="contradicts"):
        load_job(job_dict(attention="cudnn", flash_attention=False))


def test_eager_elementwise_moves_more_bytes_than_fused():
    from commtax.estimate import estimate

    fused = estimate(load_job(job_dict(framework="megatron-core")))
    eager = estimate(load_job(job_dict(framework="megatron-core", elementwise="eager")))
    assert eager.step_time_s > fused.step_time_s
