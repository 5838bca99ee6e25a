"""The host sync of an eager MoE layer (workload.moe.MOE_HOST_SYNC): hand-counted host ops from the sync to the next
kernel, each ``cpu_op_s``, and what a full-iteration CUDA graph removes."""

import pytest

from commtax.costs.compute import compute_model, op_time
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job
from commtax.spec.assumptions import default_assumptions
from commtax.workload.moe import MOE_HOST_SYNC, host_sync_restart_ops
from commtax.workload.step import build_workload

H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}
CPU_OP_S = 5e-6  # catalog/assumptions.yaml cpu_op_s: host time to issue one eager PyTorch op


def mixtral(precision="bf16", **plan):
    return load_job(
        {
            "model": "mixtral-8x7b",  # 32 MoE layers, 8 experts
            "cluster": {**H100, "num_gpus": 8},
            "plan": {"tp": 1, "pp": 1, "ep": 8, "recompute": "none", **plan},
            "training": {"seq_len": 4096, "global_batch": 64, "precision": precision},
        }
    )


def sync_ops(job, phase="fwd"):
    return [o for o in getattr(build_workload(job).moe_layer, phase).ops if o.name.startswith(MOE_HOST_SYNC)]


def test_assumption_is_the_sourced_host_cost():
    assert default_assumptions().v("cpu_op_s") == CPU_OP_S


@pytest.mark.parametrize(
    ("plan", "precision", "ops"),
    [
        # alltoall: after d2h_event.synchronize(), _AllToAll.forward's output new_empty + NCCL's launch
        ({}, "bf16", 2),
        ({}, "fp8", 2),
        # DeepEP intranode_dispatch after its busy-wait: 6 torch::empty (+ recv_x_scales for fp8 tokens) + launch
        ({"moe_dispatcher": "deepep"}, "bf16", 7),
        ({"moe_dispatcher": "deepep"}, "fp8", 8),
        ({"moe_dispatcher": "hybridep"}, "fp8", 8),
        # allgather: the sync is the experts' tokens_per_expert.tolist(): it, torch.split, then bf16 the first GEMM;
        # fp8 2 x num_gemms torch.empty (TE #1499) and the multi-cast-transpose's launch, E_loc = 8 / ep(2) = 4
        ({"moe_dispatcher": "allgather"}, "bf16", 3),
        ({"moe_dispatcher": "allgather", "ep": 2}, "fp8", 2 + 2 * 4 + 1),
        ({"cuda_graphs": "full_iteration"}, "bf16", 0),
    ],
)
def test_restart_ops_hand_counted(plan, precision, ops):
    job = mixtral(precision, **plan)
    assert host_sync_restart_ops(job, precision == "fp8") == ops
    found = sync_ops(job)
    assert len(found) == (1 if ops else 0)
    if ops:  # no GPU work: the launch floor prices the host's ops, ops x cpu_op_s
        cm = compute_model(job.cluster, precision)
        assert found[0].flop == found[0].bytes == 0.0
        assert op_time(cm, found[0]) == pytest.approx(ops * CPU_OP_S, rel=1e-12)


def test_step_time_gains_exactly_the_gap_per_moe_layer_forward():
    # pp 1, no recompute: the step runs m micro-batches of 32 MoE layers; each layer's forward waits 2 x 5 us once
    eager = mixtral()
    graphed = job_with(eager, cuda_graphs="full_iteration")
    m, layers = eager.micro_batches, 32
    assert m == 8
    e, g = estimate(eager), estimate(graphed)
    gap = m * layers * 2 * CPU_OP_S  # 2.56 ms
    assert e.breakdown_s["compute"] - g.breakdown_s["compute"] == pytest.approx(gap, rel=1e-9)
    # the step by the same (the DP reduction's exposed tail moves by ~1 us with the longer forward)
    assert e.step_time_s - g.step_time_s == pytest.approx(gap, rel=1e-3)


def test_no_gap_in_backward_and_again_when_the_moe_layer_is_recomputed():
    # backward reuses the splits already on the host (no sync); recomputing the whole MoE layer re-runs the dispatcher
    job = mixtral()
    assert not sync_ops(job, "bwd") and not sync_ops(job, "recompute")
    again = job_with(job, recompute="selective", recompute_modules=["moe"])
    assert [o.name for o in sync_ops(again, "recompute")] == [f"{MOE_HOST_SYNC}_recompute"]


def test_cuda_graphs_refused_on_a_dense_model():
    with pytest.raises((SpecError, ValueError), match="plan.cuda_graphs applies to MoE models"):
        load_job(
            {
                "model": "llama2-7b",
                "cluster": {**H100, "num_gpus": 8},
                "plan": {"cuda_graphs": "full_iteration"},
                "training": {"seq_len": 4096, "global_batch": 64},
            }
        )


def test_simulate_prices_the_same_gap():
    from commtax.schedule.sim import simulate

    eager = mixtral()
    graphed = job_with(eager, cuda_graphs="full_iteration")
    d = simulate(eager).breakdown.step_time_s - simulate(graphed).breakdown.step_time_s
    assert d == pytest.approx(eager.micro_batches * 32 * 2 * CPU_OP_S, rel=0.02)
