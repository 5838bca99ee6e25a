"""The alltoall dispatcher's own work besides the token exchange (workload.moe.alltoall_dispatcher_ops): hand-worked
bytes from Megatron-Core's MoEAlltoAllTokenDispatcher, and where the 1F1B overlap puts each op."""

import pytest

from commtax.spec import job_with, load_job
from commtax.workload.moe import alltoall_dispatcher_ops, overlap_piece
from commtax.workload.step import build_workload

H100 = {"gpu": "h100-sxm5-80gb", "intra_node": "nvlink4", "inter_node": "ib-ndr"}


def mixtral(**plan):
    return load_job(
        {
            "model": "mixtral-8x7b",  # hidden 4096, 8 experts, top-2
            "cluster": {**H100, "num_gpus": 16},
            "plan": {"tp": 1, "pp": 1, "recompute": "none", **plan},
            "training": {"seq_len": 4096, "global_batch": 64},
        }
    )


def test_bytes_hand_worked():
    # T = 4096 tokens, k = 2: T·k = 8192 rows received; ep 4 holds E_loc = 2 experts
    job = mixtral(ep=4)
    fwd = {o.name: o for o in alltoall_dispatcher_ops(job, 2.0, backward=False)}
    bwd = {o.name: o for o in alltoall_dispatcher_ops(job, 2.0, backward=True)}
    rows, h = 4096 * 2, 4096
    assert fwd["ep_counts"].op == "all_gather" and fwd["ep_counts"].bytes == 8 * 8 * 4  # E int64 from each of 4
    assert fwd["ep_dispatch_probs"].op == "all_to_all" and fwd["ep_dispatch_probs"].bytes == 4 * rows  # fp32 probs
    # sort_chunks_by_idxs ("Permutation 2") and its restore: read + write every received row, bf16
    assert fwd["sort_chunks"].bytes == fwd["unsort_chunks"].bytes == 2 * rows * h * 2
    # backward: the probs' gradients travel back; each pass runs as the other's inverse, the same bytes; no counts
    assert set(bwd) == {"ep_dispatch_probs_bwd", "sort_chunks_bwd", "unsort_chunks_bwd"}
    assert bwd["sort_chunks_bwd"].bytes == fwd["sort_chunks"].bytes


def test_only_the_alltoall_dispatcher_with_ep():
    assert alltoall_dispatcher_ops(mixtral(ep=1), 2.0, False) == []
    for d in ("deepep", "hybridep", "allgather"):
        assert alltoall_dispatcher_ops(mixtral(ep=4, moe_dispatcher=d), 2.0, False) == []
    # one local expert: nothing to sort (token_dispatcher.py: num_local_experts > 1), the collectives stay
    names = {o.name for o in alltoall_dispatcher_ops(mixtral(ep=8), 2.0, False)}
    assert names == {"ep_counts", "ep_dispatch_probs"}


def test_in_the_layer_and_its_overlap_pieces():
    job = mixtral(ep=4)
    wl = build_workload(job)
    names = {o.name for o in wl.moe_layer.fwd.ops} | {o.name for o in wl.moe_layer.bwd.ops}
    assert {"ep_counts", "ep_dispatch_probs", "sort_chunks", "unsort_chunks", "sort_chunks_bwd"} <= names
    # moe_layer.py routed_experts_compute runs the sort and restore with the experts; the collectives dispatch
    assert overlap_piece("sort_chunks", False) == overlap_piece("unsort_chunks", False) == "mlp_f"
    assert overlap_piece("sort_chunks_bwd", True) == "mlp_b"
    assert overlap_piece("ep_counts", False) == overlap_piece("ep_dispatch_probs", False) == "dispatch_f"
    assert overlap_piece("ep_dispatch_probs_bwd", True) == "dispatch_b"


def test_estimate_charges_the_sort_passes_against_deepep():
    # same layout under DeepEP: the compute differs by the four sort/restore passes of every MoE layer-pass and by
    # the host sync's gap (alltoall 2 host ops, DeepEP 7 in bf16: workload.moe)
    from commtax.costs.compute import compute_model, op_time
    from commtax.schedule.analytical import estimate

    a2a = mixtral(ep=4)
    deepep = job_with(a2a, moe_dispatcher="deepep")
    cm = compute_model(a2a.cluster, "bf16")
    passes = [o for b in (False, True) for o in alltoall_dispatcher_ops(a2a, 2.0, b) if "sort" in o.name]
    per_layer = sum(op_time(cm, o) for o in passes) + (2 - 7) * cm.cpu_op_s
    expected = a2a.micro_batches * 32 * per_layer
    d = estimate(a2a).breakdown_s["compute"] - estimate(deepep).breakdown_s["compute"]
    assert len(passes) == 4 and d == pytest.approx(expected, rel=1e-9)


def test_token_drop_padded_to_capacity_gathers_no_counts_and_does_not_sync():
    # token_dispatcher.py preprocess: drop_and_pad returns before the counts' all-gather, and
    # _maybe_dtoh_and_synchronize does nothing; the probs still travel, the padded buffer is still reordered
    from commtax.workload.moe import MOE_HOST_SYNC

    base = mixtral(ep=4)
    job = base.model_copy(update={"model": base.model.model_copy(update={"capacity_factor": 1.0})})
    names = {o.name for o in alltoall_dispatcher_ops(job, 2.0, backward=False)}
    assert names == {"ep_dispatch_probs", "sort_chunks", "unsort_chunks"}
    assert MOE_HOST_SYNC not in {o.name for o in build_workload(job).moe_layer.fwd.ops}
