"""DDP comm hooks on CPU gloo with 2 ranks: averages like all-reduce, bytes on the wire match the table,
no_sync and bucket_cap_mb do what users expect. Ranks are forked by a fresh forkserver (no wall-clock asserts)."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from datetime import timedelta

import pytest

from commtax.spec.wire_dtypes import bytes_per_element, packed_bytes, powersgd_bytes

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from commtax.measure.compression import padded_numel  # noqa: E402
from commtax.measure.hooks import HOOKS, WireCounter, hook_format, make_hook  # noqa: E402

N = 2
SHAPES = [(256, 256), (256, 256), (256,)]  # Linear(256→256, no bias), Linear(256→256): 525 KB of fp32 grads,
NUMEL = 256 * 256 * 2 + 256  # one bucket (under DDP's 1 MiB first-bucket cap)


def _entry(rank: int, path: str, fn, args, q) -> None:
    """One rank: its result is in the queue's pipe before any teardown, and the rank leaves by ``os._exit``.

    A CI rehearsal saw a rank abort ("Fatal Python error: Aborted", in a C++ thread) while the interpreter exited
    with its result still being pickled by the queue's feeder thread: the result was lost and the parent waited
    out its timeout. Flushing first, then a barrier, then ``os._exit`` leaves nothing to exit-time teardown."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"file://{path}", rank=rank, world_size=N, timeout=timedelta(seconds=120)
        )
        out = fn(*args)  # tensors travel as numpy arrays: torch would share them through this process's fds
        result = (rank, {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in out.items()})
    except Exception:
        result = (rank, traceback.format_exc())
    q.put(result)
    q.close()
    q.join_thread()
    try:
        if dist.is_initialized():
            dist.barrier()  # neither rank drops its connections while the other still uses them
            dist.destroy_process_group()
    finally:
        os._exit(0)


def run_ranks(tmp_path, fn, *args) -> list:
    """fn(*args) on N ranks in one gloo group; their results by rank."""
    # forked from a fresh server with torch imported, not from pytest: a rank forked from this process inherits
    # whatever threads and locks earlier tests left (a rehearsal's rank died in "terminate called ... Resource
    # deadlock avoided")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "commtax.measure.hooks"])
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(r, str(tmp_path / "store"), fn, args, q)) for r in range(N)]
    for p in procs:
        p.start()
    try:
        out = dict(q.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for r, v in out.items():
        if isinstance(v, str):
            pytest.fail(f"rank {r} failed:\n{v}")
    return [{k: torch.as_tensor(v) if hasattr(v, "dtype") else v for k, v in out[r].items()} for r in range(N)]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 256))


def _grads(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in m.parameters()])


def _one_hook(hook: str, error_feedback: bool = False, steps: int = 3, bucket_mb: float = 25.0) -> dict:
    """Train-free: `steps` backward passes through DDP with `hook`; the last one counted, its grads kept."""
    rank = dist.get_rank()
    local = _model()
    ddp = DDP(_model(), bucket_cap_mb=bucket_mb)
    fn, state = make_hook(hook, error_feedback=error_feedback)
    ddp.register_comm_hook(state, fn)
    counter = WireCounter()
    for step in range(steps):
        torch.manual_seed(100 + step * N + rank)  # each rank its own data, as in data parallelism
        x = torch.randn(16, 256)
        ddp.zero_grad()
        local.zero_grad()
        local(x).pow(2).mean().backward()
        with counter.patch() if step == steps - 1 else _null():
            ddp(x).pow(2).mean().backward()
    return {"local": _grads(local), "ddp": _grads(ddp.module), "calls": list(counter.calls)}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _wire_bytes_table(fmt: str) -> float:
    """Per rank, what the estimator charges: a ring all-reduce of numel · b bytes, 2(n−1)/n of it on the wire."""
    return 2 * (N - 1) / N * NUMEL * bytes_per_element(fmt, SHAPES)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every hook once (ranks forked once per hook): {hook: [rank0, rank1]}."""
    return {h: run_ranks(tmp_path_factory.mktemp(h), _one_hook, h) for h in HOOKS}


@pytest.mark.parametrize(
    "hook, rel_tol",
    [("none", 1e-6), ("fp16", 2e-3), ("bf16", 1e-2), ("int8", 2e-2), ("fp8", 0.1), ("fp8_e5m2", 0.2), ("int4", 0.3)],
)
def test_hook_averages_the_gradients_like_an_all_reduce(results, hook, rel_tol):
    r0, r1 = results[hook]
    exact = (r0["local"] + r1["local"]) / N
    assert torch.equal(r0["ddp"], r1["ddp"])  # every rank applies the same update
    err = (r0["ddp"] - exact).norm() / exact.norm()
    assert err < rel_tol


def test_powersgd_is_torch_s_and_agrees_across_ranks(results):
    r0, r1 = results["powersgd"]
    assert torch.equal(r0["ddp"], r1["ddp"])
    assert torch.isfinite(r0["ddp"]).all()
    ops = [op for op, _ in r0["calls"]]
    assert ops == ["all_reduce"] * 3  # torch's hook: uncompressed tensors, then P, then Q


@pytest.mark.parametrize("hook", HOOKS)
def test_bytes_on_the_wire_match_the_table(results, hook):
    calls = results[hook][0]["calls"]
    counter = WireCounter(calls)
    fmt = hook_format(hook)
    if hook in ("none", "fp16", "bf16"):
        assert calls == [("all_reduce", NUMEL * bytes_per_element(fmt))]
    elif hook == "powersgd":
        assert counter.message_bytes() == powersgd_bytes(SHAPES, 4)  # P (m×r) + Q (n×r) per matrix, bias whole
    else:  # all_to_all + all_gather of the packed bucket (padded to whole chunks per rank), on gloo as sends
        packed = packed_bytes(fmt, padded_numel(NUMEL, N))  # to each peer: its shard, then this rank's shard
        assert calls == [("send_recv", packed // N)] * (N - 1) + [("send_recv", packed // N)] * (N - 1)
    # and per rank on the wire, what the estimator charges (padding to whole chunks per rank: 0.2% here)
    assert counter.wire_bytes(N) == pytest.approx(_wire_bytes_table(fmt), rel=3e-3)


def test_compressed_hooks_send_less_in_table_order(results):
    wire = {h: WireCounter(results[h][0]["calls"]).wire_bytes(N) for h in HOOKS}
    assert wire["int4"] < wire["int8"] == wire["fp8"] < wire["bf16"] == wire["fp16"] < wire["none"]
    assert wire["none"] / wire["int8"] == pytest.approx(4 / (1 + 4 / 256), rel=3e-3)


def _accumulate_and_buckets() -> dict:
    rank = dist.get_rank()
    out = {}
    for bucket_mb in (25.0, 0.25):
        ddp = DDP(_model(), bucket_cap_mb=bucket_mb)
        ddp.register_comm_hook(*reversed(make_hook("none")))
        ddp(torch.randn(8, 256)).sum().backward()  # one synced step: DDP rebuilds its buckets at bucket_cap_mb
        counter = WireCounter()
        with counter.patch():
            for k in range(4):  # accumulate 4 micro-batches: the first 3 under no_sync
                torch.manual_seed(10 * k + rank)
                ctx = ddp.no_sync() if k < 3 else _null()
                with ctx:
                    ddp(torch.randn(8, 256)).pow(2).mean().backward()
                if k == 2:
                    out[f"after_no_sync_{bucket_mb}"] = list(counter.calls)
        out[bucket_mb] = list(counter.calls)
    return out


def test_no_sync_defers_communication_and_buckets_split_it(tmp_path):
    r = run_ranks(tmp_path, _accumulate_and_buckets)[0]
    assert r["after_no_sync_25.0"] == []  # accumulation: nothing on the wire until the last micro-batch
    big, small = r[25.0], r[0.25]
    assert len(big) == 1 and big[0][1] == NUMEL * 4  # one bucket holds all 525 KB of fp32 gradients
    assert len(small) >= 2  # 0.25 MiB buckets: one per 256 KiB weight
    assert sum(b for _, b in small) == NUMEL * 4  # same bytes, more (smaller) messages: more latency terms


def test_error_feedback_is_refused_where_it_means_nothing():
    with pytest.raises(ValueError, match="error feedback"):
        make_hook("bf16", error_feedback=True)
    with pytest.raises(ValueError, match="choose from"):
        make_hook("int2")


@pytest.mark.parametrize("hook", ["int8", "powersgd"])
def test_many_small_buckets_keep_every_rank_in_step(tmp_path, hook):
    """Several buckets in flight: collectives issued from callbacks could pair different buckets across
    ranks on gloo (a hang, or 'Received data size doesn't match'); the hooks run buckets in DDP's order."""
    r0, r1 = run_ranks(tmp_path, _one_hook, hook, False, 3, 0.1)
    assert torch.equal(r0["ddp"], r1["ddp"])
    assert len(r0["calls"]) >= 4  # 0.1 MiB buckets: at least two, two or three collectives each
    if hook == "int8":
        exact = (r0["local"] + r1["local"]) / N
        assert (r0["ddp"] - exact).norm() / exact.norm() < 2e-2
