"""Frameworks as facts: presets from catalog/frameworks.yaml set the plan's software defaults; fields win."""

from typing import get_args

import pytest
from conftest import job_dict

from commtax.errors import SpecError
from commtax.spec import FrameworkName, frameworks, load_job

NAMES = set(get_args(FrameworkName))  # the plan field's choices: the catalog must hold exactly these


def test_every_framework_has_a_sourced_preset():
    assert set(frameworks()) == NAMES
    assert all(len(f.source) > 40 for f in frameworks().values())


def test_torchtitan_preset_and_overrides():
    plan = load_job(job_dict(framework="torchtitan", zero=3)).plan
    # torchtitan: SDPA flash (FA2), eager RMSNorm/SwiGLU, per-op SAC, torchao dynamic float8, no async TP, no PP overlap
    assert (plan.attention, plan.elementwise, plan.selective_policy, plan.fp8_recipe) == (
        "fa2",
        "eager",
        "per_op",
        "dynamic",
    )
    assert (plan.overlap.tp, plan.overlap.pp, plan.overlap.dp) == (False, False, True)
    plan = load_job(job_dict(framework="torchtitan", zero=3, elementwise="compiled", overlap={"tp": True})).plan
    assert plan.elementwise == "compiled" and plan.overlap.tp and not plan.overlap.pp


def test_generation_is_a_deprecated_alias():
    legacy = load_job(job_dict(generation="legacy"))
    assert legacy.plan.framework == "megatron-lm" and not legacy.plan.flash_attention and not legacy.plan.overlap.dp
    assert legacy.dropout  # 2021 Megatron-LM trained GPT with dropout 0.1
    assert load_job(job_dict(generation="current")).plan.framework == "megatron-core"
    assert load_job(job_dict(generation="legacy", flash_attention=True)).plan.attention == "fa2"


def test_zero3_overlap_follows_the_framework():
    # DeepSpeed's stage-3 prefetch overlaps; its stage 1-2 overlap_comm is off by default
    assert load_job(
        job_dict(framework="deepspeed", zero=3, tp=1, pp=1, dp=None, sequence_parallel=False)
    ).plan.overlap.dp
    assert not load_job(job_dict(framework="deepspeed", zero=1)).plan.overlap.dp


def test_unknown_framework_names_the_choices():
    with pytest.raises(SpecError, match="framework must be one of megatron-core, nemo"):
        load_job(job_dict(framework="megatron"))
    with pytest.raises(SpecError, match="contradicts"):
        load_job(job_dict(attention="cudnn", flash_attention=False))


def test_eager_elementwise_moves_more_bytes_than_fused():
    from commtax.schedule.analytical import estimate

    fused = estimate(load_job(job_dict(framework="megatron-core")))
    eager = estimate(load_job(job_dict(framework="megatron-core", elementwise="eager")))
    assert eager.step_time_s > fused.step_time_s


def test_deepspeed_before_v0_6_gathers_each_parameter_after_a_synchronize():
    # frameworks.yaml: DeepSpeed v0.3.13-v0.5.10 (PR #1453 batched and prefetched stage-3 gathers, first in v0.6.0)
    for name in ("deepspeed", "megatron-deepspeed"):
        fw = frameworks()[name]
        assert fw.zero3_gather == "bucketed_prefetch"
        assert fw.legacy.before_year == 2022 and fw.legacy.plan == {"zero3_gather": "per_parameter_sync"}
        assert "#1453" in fw.legacy.source and "synchronize" in fw.legacy.source
    assert all(frameworks()[n].legacy is None for n in ("fsdp", "torchtitan", "megatron-core", "nemo"))
    assert load_job(job_dict(framework="megatron-deepspeed", zero=3)).plan.zero3_gather == "bucketed_prefetch"


def test_per_parameter_sync_zero3_hand_worked():
    # 2 nodes x 8 A100 (8 HDR NICs each), GPT 24 x 2048, TP = PP = 1, ZeRO-3, full recompute, one micro-batch.
    # DeepSpeed v0.3.13: every tensor gathered 3x (fwd, recomputed fwd, bwd) and reduce-scattered once, each call
    # NCCL(op, bytes, 16 ranks) + 16 per-rank host ops (narrow views + ProcessGroupNCCL copies) at cpu_op_s.
    from commtax.costs.collectives import collective_cost
    from commtax.costs.pricing import Costs
    from commtax.costs.topology import group_placement
    from commtax.schedule.analytical import dp_exposed, estimate, per_parameter_sync_time, stage_times
    from commtax.workload.step import build_workload, layer_param_tensors

    d = job_dict(
        framework="megatron-deepspeed",
        tp=1,
        pp=1,
        dp=16,
        zero=3,
        recompute="full",
        micro_batch=1,
        sequence_parallel=False,
        zero3_gather="per_parameter_sync",
    )
    d["model"] = {"layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200, "gated_mlp": False}
    d["cluster"] = {
        "gpu": "a100-sxm4-80gb",
        "num_gpus": 16,
        "gpus_per_node": 8,
        "intra_node": "nvlink3",
        "inter_node": "ib-hdr",
        "nics_per_node": 8,
    }
    d["training"] = {"seq_len": 2048, "global_batch": 16, "precision": "fp16"}
    job = load_job(d)
    wl, costs = build_workload(job), Costs(job)
    pl_g, pl_r = group_placement(job, "dp", "all_gather"), group_placement(job, "dp", "reduce_scatter")
    assert pl_g.n == 16
    host = 16 * 5e-6  # cpu_op_s (assumptions.yaml) per rank
    tensors = list(layer_param_tensors(job)) * 24 + [51200 * 2048, 51200 * 2048, 2048]
    gather = sum(collective_cost("all_gather", 2.0 * e, pl_g).time_s + host for e in tensors)  # fp16 weights
    reduce = sum(collective_cost("reduce_scatter", 2.0 * e, pl_r).time_s + host for e in tensors)  # bf16 grads
    t, nbytes = per_parameter_sync_time(job, wl, costs)
    assert t == pytest.approx(3 * gather + reduce, rel=1e-9)
    assert nbytes == pytest.approx(15 / 16 * 4 * 2.0 * sum(tensors))
    # 24 x 12 + 3 = 291 tensors x 4 calls x 16 ranks x 5 us = 93 ms of host copies alone
    assert 4 * len(tensors) * host == pytest.approx(0.0931, abs=1e-4)
    # nothing overlaps: exposed = link, and the legacy step is slower than the bucketed, prefetched one
    link, exposed, _ = dp_exposed(job, wl, costs, stage_times(job, wl, costs)[0])
    assert link == exposed == pytest.approx(t)
    current = load_job({**d, "plan": {**d["plan"], "zero3_gather": "bucketed_prefetch"}})
    assert (
        estimate(job).step_time_s
        > estimate(current).step_time_s + 0.9 * t - estimate(current).breakdown_s["dp_exposed"]
    )


def test_fsdp_frameworks_reduce_gradients_in_fp32_by_default():
    # torchtitan JobConfig.training.mixed_precision_reduce = "float32"; Composer mixed_precision DEFAULT: reduce fp32
    for name in ("torchtitan", "fsdp"):
        assert frameworks()[name].reduce_dtype == "fp32" and "reduce" in frameworks()[name].reduce_source
        assert load_job(job_dict(framework=name, zero=3)).plan.grad_comm_dtype == "fp32"
    assert load_job(job_dict(framework="fsdp", zero=3, grad_comm_dtype="bf16")).plan.grad_comm_dtype == "bf16"
    assert load_job(job_dict(framework="custom")).plan.grad_comm_dtype == "bf16"


def test_megatron_reduces_bf16_gradients_in_fp32():
    # megatron/training/arguments.py: --bf16 sets accumulate_allreduce_grads_in_fp32 (DDP grad_reduce_in_fp32):
    # the reduce-scatter moves 4-byte main grads, twice the bytes of a bf16 reduction
    from commtax.workload.step import build_workload

    for name in ("megatron-core", "nemo"):
        assert frameworks()[name].reduce_dtype == "fp32" and "fp32" in frameworks()[name].reduce_source
    fp32 = build_workload(load_job(job_dict(framework="megatron-core")))
    bf16 = build_workload(load_job(job_dict(framework="megatron-core", grad_comm_dtype="bf16")))
    assert fp32.dp_step[0].bytes == pytest.approx(2 * bf16.dp_step[0].bytes)


@pytest.mark.parametrize(
    "name, stages",
    [
        ("megatron-core", (0, 1)),  # DistributedOptimizer = ZeRO-1; no ZeRO-2/3 (core_r0.8-0.10)
        ("megatron-lm", (0, 1)),  # DDP all-reduce; v3.0 distributed optimizer = ZeRO-1
        ("nemo", (0, 1, 2)),  # + apex DistributedFusedAdam (grads sharded: ZeRO-2)
        ("fsdp", (0, 2, 3)),  # ShardingStrategy NO_SHARD / SHARD_GRAD_OP / FULL_SHARD: no ZeRO-1
        ("torchtitan", (0, 2, 3)),  # replicate / fully_shard(reshard_after_forward=False) / fully_shard
        ("deepspeed", (0, 1, 2, 3)),
    ],
)
def test_frameworks_name_the_zero_stages_they_run(name, stages):
    from commtax.schedule.analytical import estimate

    assert frameworks()[name].zero_stages == stages
    for zero in (0, 1, 2, 3):
        job = load_job(job_dict(framework=name, zero=zero))
        assert job.plan.zero == zero  # a stated stage is priced as stated (a published run is what it was) ...
        notes = " ".join(estimate(job).notes)
        # ... with a note when the framework does not run it out of the box (search and advise never propose it)
        assert (f"zero({zero}) is not a stage {name} runs" in notes) == (zero not in stages)


def test_fsdp_frameworks_without_zero_default_to_their_own_stage():
    # a job that leaves zero out gets the framework's plan_defaults zero (FSDP FULL_SHARD), not ZeRO-1
    d = job_dict(framework="fsdp")
    del d["plan"]["zero"]
    assert load_job(d).plan.zero == 3


def test_fsdp_exposes_the_first_gather_and_the_last_reduce_scatter():
    # PyTorch FSDP notes: the 1st all-gather overlaps nothing; the last unit's reduce-scatter ends the backward.
    # Llama-2 70B, TP 8, ZeRO-3 over 32 GPUs, micro-batch 8: compute hides the rest of the per-unit traffic.
    from commtax.costs.pricing import Costs
    from commtax.schedule.analytical import dp_timeline, stage_times
    from commtax.workload.step import build_workload

    job = load_job(job_dict(framework="fsdp", tp=8, pp=1, dp=None, zero=3, sequence_parallel=True, micro_batch=8))
    wl, costs = build_workload(job), Costs(job)
    st = stage_times(job, wl, costs)[0]
    units = wl.layers_per_stage
    gf, gb, rs = (units * costs.collective_time(c.group, c.op, c.bytes / units) for c in wl.dp_microbatch)
    assert wl.dp_microbatch[2].bytes == pytest.approx(2 * wl.dp_microbatch[0].bytes)  # fp32 grads, bf16 weights
    assert gf < st.fwd and gb + rs < st.bwd
    link, exposed, _ = dp_timeline(job, wl, costs, st)  # the schedule's exposure (contention: test_overlap.py)
    m = wl.micro_batches
    assert link == pytest.approx((gf + gb + rs) * m)
    assert exposed == pytest.approx(m * gf / units + rs / units)
