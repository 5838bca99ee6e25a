"""The gradient codec's memory traffic (comm_dtypes.codec_bytes_per_element) against the ops our hook runs, and the
codec inside the workload, estimate and simulator (workload.grad_codec_ops)."""

import dataclasses

import pytest
from conftest import job_dict

from commtax.costs.pricing import Costs
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import load_job
from commtax.spec.wire_dtypes import codec_bytes_per_element, codec_conversions
from commtax.workload.step import build_workload, powersgd_codec_ops, stage_params


def test_cast_hooks_move_16_bytes_per_fp32_element():
    # torch default_hooks._compress_hook: buffer.to(fp16) reads 4 writes 2, .div_(n) 2+2, buffer.copy_(value) 2+4
    assert codec_bytes_per_element("fp16", 2) == 4 + 2 + 2 + 2 + 2 + 4 == 16
    assert codec_bytes_per_element("bf16", 8) == 16
    assert codec_bytes_per_element("fp32", 2) == 0


def test_int8_hook_bytes_hand_worked_from_hooks_py():
    # commtax.measure.hooks.bucket_pipeline at n = 2, per element of the bucket, b = 1 + 4/256:
    b = 1 + 4 / 256
    # abs, amax, ·1/s, round_, clamp_, .to(int8), cat(payload, scales)
    quantize = (4 + 4) + 4 + (4 + 4) + (4 + 4) + (4 + 4) + (4 + 1) + 2 * b
    dequantize = (1 + 1) + (1 + 4) + (4 + 4)  # payload.contiguous(), .float(), mul_(scales)
    total = (
        4  # torch.zeros
        + (4 + 4)  # x[:numel] = buf
        + quantize  # the whole bucket
        + dequantize  # the received shards (n shards of N/n: N elements)
        + (4 + 4 / 2)
        + (4 / 2 + 4 / 2)  # .sum(0) of n shards, .div_(n) of the result
        + quantize / 2  # requantize the own shard
        + dequantize  # the gathered shards
        + (4 + 4)
    )  # buf.copy_
    assert codec_bytes_per_element("int8", 2) == pytest.approx(total, rel=1e-12)
    assert total == pytest.approx(124.546875)


@pytest.mark.parametrize("error_feedback", [False, True])
@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_codec_bytes_match_the_ops_our_hook_runs(fmt, error_feedback):
    """Replay one bucket of hooks.bucket_pipeline (collectives stood in, not counted) under a torch dispatch mode
    that adds up the bytes every non-view aten op reads and writes; per-chunk scale vectors (1/256 of the
    elements) are counted there but not in the table, so the two agree to within 2%."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from commtax.measure.hooks import QuantState, bucket_pipeline

    aten = torch.ops.aten
    no_traffic = {
        aten.view.default,
        aten.view.dtype,
        aten._unsafe_view.default,
        aten.slice.Tensor,
        aten.t.default,
        aten.transpose.int,
        aten.unsqueeze.default,
        aten.alias.default,
        aten.detach.default,
        aten.empty.memory_format,
        aten.empty_like.default,
        aten.as_strided.default,
        aten.expand.default,
        aten.select.int,
        aten.reshape.default,
        aten.lift_fresh.default,
        aten.split.Tensor,
        aten.split_with_sizes.default,
    }

    def nbytes(t):
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    class Count(TorchDispatchMode):
        total, fp8_casts, paused = 0, 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.paused or func in no_traffic:
                return out
            flat = [a for a in args if isinstance(a, torch.Tensor)]
            flat += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
            outs = out if isinstance(out, (list, tuple)) else [out]
            if func == aten._to_copy.default and "float8" in f"{args[0].dtype}{kwargs.get('dtype')}":
                self.fp8_casts += args[0].numel()
            if func in (aten.zero_.default, aten.fill_.Scalar):
                self.total += nbytes(args[0])  # written, not read
            elif func == aten.copy_.default:
                self.total += nbytes(args[1]) + nbytes(args[0])  # read the source, write self
            else:
                self.total += sum(nbytes(t) for t in flat) + sum(nbytes(t) for t in outs)
            return out

    n, numel = 2, 256 * 2 * 64
    buf = torch.randn(numel)
    state = QuantState(fmt, error_feedback=error_feedback)  # no process group needed: the collectives are stood in
    counter = Count()

    def all_to_all(p):
        return p  # the packed buffer as if received: same bytes

    def all_gather(mine):
        counter.paused = True
        out = mine.repeat(n, 1)
        counter.paused = False
        return out

    bucket_pipeline(state, 0, buf.clone(), n, all_to_all, all_gather)  # a first step: residuals exist from now on
    with counter:
        bucket_pipeline(state, 0, buf, n, all_to_all, all_gather)
    per_elem = counter.total / numel
    assert per_elem == pytest.approx(codec_bytes_per_element(fmt, n, error_feedback=error_feedback), rel=0.02)
    # fp8 conversions, counted by the elements each cast reads: e4m3 → fp32 2 + (1 + 1/n with feedback) per element
    assert counter.fp8_casts / numel == pytest.approx(sum(codec_conversions(fmt, n, error_feedback).values()))


def test_error_feedback_adds_two_passes_and_a_dequantize_per_owner():
    # worker: compensate 12 B + update 12 B + dequantize 15 B; the owner does the same on its 1/n shard
    assert codec_bytes_per_element("int8", 2, error_feedback=True) - codec_bytes_per_element("int8", 2) == 58.5
    assert codec_conversions("fp8", 4, error_feedback=True) == {"fp32->fp8_e4m3": 1.25, "fp8_e4m3->fp32": 3.25}


def test_fp8_conversions_run_at_the_device_s_rate_where_it_lists_one():
    job = _bench_job("fp8_e4m3")
    wl = build_workload(job)
    params = max(stage_params(job))
    names = [op.name for op in wl.dp_codec]
    assert names == ["grad_codec_fp8_e4m3", "grad_codec_fp32->fp8_e4m3", "grad_codec_fp8_e4m3->fp32"]
    assert sum(op.bytes for op in wl.dp_codec) == pytest.approx(codec_bytes_per_element("fp8_e4m3", 2) * params)
    back = wl.dp_codec[2]
    cm = Costs(job).cm  # a GPU converts in hardware: the pass is memory-bound (plus one kernel's launch gap)
    assert Costs(job).compute(back) == pytest.approx(back.bytes / cm.mem_bw_bytes_per_s + cm.kernel_gap_s)
    d = job.model_dump()
    d["cluster"]["gpu"]["convert_Gelem_s"] = {"fp8_e4m3->fp32": 0.25}  # torch on this CPU: 0.23-0.25 Gelem/s
    slow_job = load_job(d)
    assert Costs(slow_job).compute(back) == pytest.approx(2 * params / 0.25e9, rel=1e-3)  # 2 elems per param


def test_error_feedback_is_a_plan_field_and_refused_without_compression():
    d = _bench_job("int8").model_dump()
    d["plan"]["grad_error_feedback"] = True
    ef = build_workload(load_job(d))
    assert sum(op.bytes for op in ef.dp_codec) > sum(op.bytes for op in build_workload(_bench_job("int8")).dp_codec)
    d["plan"]["grad_comm_dtype"] = "bf16"
    with pytest.raises(SpecError, match="grad_error_feedback"):
        load_job(d)


def _bench_job(fmt, precision="fp32"):
    d = job_dict()
    d["model"] = {
        "name": "tiny",
        "layers": 2,
        "hidden": 256,
        "heads": 4,
        "vocab": 512,
        "gated_mlp": False,
        "tied_embeddings": False,
    }
    d["cluster"]["num_gpus"] = 2
    d["plan"] = {
        "tp": 1,
        "pp": 1,
        "dp": 2,
        "zero": 0,
        "micro_batch": 8,
        "recompute": "none",
        "grad_comm_dtype": fmt,
        "overlap": {"dp": True},
    }
    d["training"] = {"seq_len": 64, "global_batch": 16, "precision": precision}
    return load_job(d)


def test_workload_carries_the_codec_of_a_compressed_format():
    job = _bench_job("int8")
    wl = build_workload(job)
    params = max(stage_params(job))  # the gradients the reduction carries
    assert [op.name for op in wl.dp_codec] == ["grad_codec_int8"]
    assert wl.dp_codec[0].bytes == pytest.approx(codec_bytes_per_element("int8", 2) * params)
    assert build_workload(_bench_job("fp32")).dp_codec == ()
    assert build_workload(_bench_job("bf16", "bf16")).dp_codec == ()  # bf16 gradients reduced as they are
    assert build_workload(_bench_job("bf16", "fp32")).dp_codec[0].bytes == pytest.approx(16 * params)


def test_codec_lengthens_the_exposed_reduction_by_its_memory_time():
    # one 25 MiB bucket holds the whole 1.9 MB int8 gradient: nothing overlaps, the codec is all exposed
    job = _bench_job("int8")
    wl = build_workload(job)
    costs = Costs(job)
    codec_s = costs.compute(wl.dp_codec[0])
    with_codec = estimate(job, workload=wl).breakdown_s["dp_exposed"]
    without = estimate(job, workload=dataclasses.replace(wl, dp_codec=())).breakdown_s["dp_exposed"]
    assert with_codec - without == pytest.approx(codec_s, rel=1e-6)
    assert codec_s == pytest.approx(wl.dp_codec[0].bytes / costs.cm.mem_bw_bytes_per_s, rel=0.05)


def test_simulator_sees_the_codec_too():
    from commtax.schedule.sim import simulate

    job = _bench_job("int4")
    wl = build_workload(job)
    a = simulate(job, workload=wl, compare=False).breakdown.step_time_s
    b = simulate(job, workload=dataclasses.replace(wl, dp_codec=()), compare=False).breakdown.step_time_s
    assert a - b == pytest.approx(Costs(job).compute(wl.dp_codec[0]), rel=0.02)


def test_powersgd_codec_is_three_gemms_per_compressed_matrix():
    # one 256×1024 matrix at rank 4 (compressed: (256 + 1024)·4·2 < 256·1024) and one 256-vector
    ops = powersgd_codec_ops([(256, 1024), (256,)], rank=4, n=2, params=256 * 1024 + 256)
    gemms = [o for o in ops if o.kind == "gemm"]
    assert [(o.m, o.n, o.k) for o in gemms] == [(256, 4, 1024), (1024, 4, 256), (256, 1024, 4)]
    assert sum(o.flop for o in gemms) == 3 * 2 * 256 * 1024 * 4  # P = MQ, Q = MᵀP, M = PQᵀ
    # Gram-Schmidt on P (256×4) and the warm-started Q (1024×4): per column 12m, plus 8m + 28m·c before the last
    ortho = next(o for o in ops if o.name == "powersgd_orthogonalise")
    per_m = 4 * 12 + 3 * 8 + 28 * (3 + 2 + 1)
    assert ortho.bytes == per_m * (256 + 1024)
    flat = next(o for o in ops if o.name == "powersgd_uncompressed")
    assert flat.bytes == 24 * 256  # torch.cat 4+4, .div_ 4+4, copied back 4+4


def test_pytorch_ddp_copies_gradients_into_buckets_and_back():
    # gradient_as_bucket_view=False (DDP's default): copy in (4 + 4 B) and out (4 + 4 B) per fp32 gradient
    d = _bench_job("fp32").model_dump()
    d["plan"]["framework"] = "pytorch-ddp"
    job = load_job(d)
    params = max(stage_params(job))
    (copies,) = build_workload(job).dp_codec
    assert copies.name == "ddp_bucket_copies" and copies.bytes == pytest.approx(16 * params)
    d["plan"]["grad_comm_dtype"] = "int8"  # on top of the format's codec
    names = [op.name for op in build_workload(load_job(d)).dp_codec]
    assert names == ["grad_codec_int8", "ddp_bucket_copies"]
    assert build_workload(_bench_job("fp32")).dp_codec == ()  # Megatron-style grad buffers: no copies


def test_codec_of_buckets_hidden_under_backward_is_still_charged():
    # 70B, 256 GPUs, ZeRO-0, int8 gradients in 25 MiB buckets: the wire hides under backward, the codec cannot —
    # it is the GPU's own memory-bound work (estimate.codec_hidden), so it all lands on the step
    job = load_job(job_dict(zero=0, grad_comm_dtype="int8"))
    wl = build_workload(job)
    costs = Costs(job)
    codec = sum(costs.compute(op) for op in wl.dp_codec)
    with_codec = estimate(job, workload=wl).breakdown_s["dp_exposed"]
    without = estimate(job, workload=dataclasses.replace(wl, dp_codec=())).breakdown_s["dp_exposed"]
    assert codec > 0.05  # ~2.2 G parameters per GPU × 124.5 B at 2.7 TB/s
    assert with_codec - without == pytest.approx(codec, rel=0.02)
