"""Ring attention (context parallelism) in the workload: per-step merges of partial results, kernel chunk length."""

import pytest

from commtax.spec import load_job
from commtax.workload.step import build_workload


def ring_job(elementwise: str, cp: int = 4):
    return load_job(
        {
            "model": "llama3-8b",  # 32 heads, 8 KV heads, head dim 128
            "cluster": {
                "gpu": "h100-sxm5-80gb",
                "num_gpus": 8,
                "gpus_per_node": 8,
                "intra_node": "nvlink4",
                "inter_node": "ib-ndr",
                "nics_per_node": 8,
            },
            "plan": {
                "framework": "megatron-core",
                "tp": 1,
                "pp": 1,
                "cp": cp,
                "zero": 1,
                "micro_batch": 1,
                "recompute": "full",
                "elementwise": elementwise,
            },
            "training": {"seq_len": 32768, "global_batch": 8 // cp, "precision": "bf16"},
        }
    )


def _op(phase, name):
    return next(o for o in phase.ops if o.name == name)


def test_fused_merge_bytes_hand_worked():
    # cp 4: 8,192 local tokens; q = 8192·32·128 elements, K and V = 2·8192·8·128
    # forward: 4 steps × 10 B (read bf16 step output, read+write fp32 output: TE context_parallel.cu)
    wl = build_workload(ring_job("fused"))
    q, kv = 8192 * 32 * 128, 2 * 8192 * 8 * 128
    fwd = _op(wl.layer.fwd, "cp_merge")
    assert fwd.bytes == 4 * 10 * q and fwd.kernels == 4 * 2
    # backward: dQ into fp32 dQ, dK and dV into the travelling dK/dV, 10 B per element each step
    bwd = _op(wl.layer.bwd, "cp_merge_bwd")
    assert bwd.bytes == 4 * 10 * (q + kv) and bwd.kernels == 4 * 1 * 3
    # full recompute runs the forward (and its merges) again
    assert _op(wl.layer.recompute, "cp_merge").bytes == fwd.bytes


def test_eager_merge_costs_more_than_fused():
    # torch's _SDPAMerger: fp32 cast, three ops, torch.cat of the partial update: 44 B per element per step
    wl = build_workload(ring_job("eager"))
    assert _op(wl.layer.fwd, "cp_merge").bytes == 4 * 44 * 8192 * 32 * 128


def test_no_merges_without_cp():
    wl = build_workload(ring_job("fused", cp=1))
    assert not [o for o in wl.layer.fwd.ops if o.name.startswith("cp_merge")]
    assert _op(wl.layer.fwd, "attention").n == 32768  # the kernel sees the whole sequence


def test_ring_kernel_runs_on_the_local_chunk():
    wl = build_workload(ring_job("fused", cp=4))
    attn = _op(wl.layer.fwd, "attention")
    assert attn.n == 8192  # one K/V chunk per ring step
    # FLOPs stay the causal share of the whole sequence: 4·b·a·s_local·S·d / 2
    assert attn.flop == pytest.approx(4 * 32 * 8192 * 32768 * 128 / 2)


def test_selective_recompute_reruns_the_ring():
    # Megatron's selective recompute re-runs the core attention; under CP that is ring attention: its K/V exchange
    # and merges run again with it
    job = ring_job("fused")
    job = load_job(
        {**job.model_dump(mode="json"), "plan": {**job.plan.model_dump(mode="json"), "recompute": "selective"}}
    )
    rc = build_workload(job).layer.recompute
    assert {o.name for o in rc.ops} >= {"attention_recompute", "cp_merge", "cp_kv"}
