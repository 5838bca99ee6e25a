"""DDP communication hooks (``DistributedDataParallel.register_comm_hook``) that move fewer bytes.

``make_hook(name)`` returns ``(hook, state)`` for one of ``HOOKS``:

* ``none``: torch's ``default_hooks.allreduce_hook`` (the same as DDP without a hook, but through
  the Python ``dist.all_reduce`` so ``WireCounter`` sees it): fp32, 4 B/element.
* ``fp16`` / ``bf16``: torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` (cast, all-reduce,
  cast back): 2 B/element.
* ``powersgd``: torch's ``powerSGD_hook`` with ``PowerSGDState(matrix_approximation_rank=r)``:
  per m×n matrix P (m×r) and Q (n×r) all-reduced in fp32, vectors uncompressed.
* ``fp8`` (e4m3), ``fp8_e5m2``, ``int8``, ``int4``: ours, below.

Our quantized hooks: a sum of quantized values cannot be all-reduced in the quantized type
(int8 overflows; scales differ per rank), so each bucket goes

    quantize (per-chunk scales) → all_to_all: rank i receives every rank's chunk-aligned shard i
    → dequantize, sum, average (fp32) → requantize → all_gather of the packed shards → dequantize

On gloo the two exchanges are point-to-point sends and receives over ``DuplexPairs``: two gloo
groups over the same ranks, so that each TCP connection carries one direction of a pair. Over one
connection gloo does not give both directions the link (2-node emulated cluster, 2 MiB each way:
at 100 Mbit/s 335 ms through ``all_to_all_single`` or isend/irecv on one group, 173 ms with one
group per direction, 168 ms on the wire, 169 ms for a plain TCP socket pair; at 300 Mbit/s
``all_to_all_single`` 113 ms, one group 65 ms, two groups 57 ms, wire 56 ms; docs/remedies.md).
NCCL is full duplex: there the hook calls ``all_to_all_single`` and the flat all-gather.

Each rank sends (n−1)/n of its packed bucket in the all_to_all and (n−1)/n in the all_gather:
2(n−1)/n · numel · b bytes, exactly a ring all-reduce's traffic at b = bytes per element of the
format (``commtax.spec.wire_dtypes``: int8 1 + 4/256, int4 0.5 + 4/256, fp8 1 + 4/256). That is why
the estimator prices them as an all-reduce of ``params · b`` bytes. The alternative, an
all_gather of everyone's whole packed bucket, sends (n−1) · numel · b: equal at n = 2, n/2×
more beyond. Packed buffers are uint8 (gloo has no float8 or 4-bit types). Error feedback keeps
two residuals per bucket: the worker's (its gradient's quantization error) and the shard owner's
(the requantization error of the averaged shard), both added back at the next step.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations are dist.GradBucket objects, not strings

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from commtax.costs.collectives import bus_factor
from commtax.measure.compression import QUANTIZED, ErrorFeedback, dequantize, padded_numel, quantize, row_bytes

# torch ≥ 2.13 names the flat all-gather all_gather_single (all_gather_into_tensor is deprecated there)
ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
HOOKS = ("none", "fp16", "bf16", "fp8", "fp8_e5m2", "int8", "int4", "powersgd")
# the commtax.spec.wire_dtypes format each hook sends (powersgd: powersgd_r{rank})
HOOK_FORMAT = {
    "none": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8": "int8",
    "int4": "int4",
}
EF_HOOKS = ("fp8", "fp8_e5m2", "int8", "int4", "powersgd")


def hook_format(hook: str, powersgd_rank: int = 4) -> str:
    """The ``grad_comm_dtype`` (a key of commtax.spec.wire_dtypes) that the estimator uses for ``hook``."""
    return f"powersgd_r{powersgd_rank}" if hook == "powersgd" else HOOK_FORMAT[hook]


# ----------------------------------------------------------------------------- counting the wire
@dataclass
class WireCounter:
    """Message bytes handed to torch.distributed collectives, per op (nccl-tests sizes).

    ``wire_bytes(n)`` turns them into the bytes one rank sends: message × bus factor
    (all_reduce 2(n−1)/n, all_gather / all_to_all / reduce_scatter (n−1)/n, a point-to-point
    send 1; nccl-tests doc/PERFORMANCE.md) — what a ring or pairwise implementation puts on each
    rank's link.
    """

    calls: list[tuple[str, int]] = field(default_factory=list)

    def add(self, op: str, nbytes: int) -> None:
        self.calls.append((op, int(nbytes)))

    def message_bytes(self) -> int:
        return sum(b for _, b in self.calls)

    def wire_bytes(self, n: int) -> float:
        return sum(b * bus_factor(op, n) for op, b in self.calls)

    def reset(self) -> None:
        self.calls.clear()

    @contextlib.contextmanager
    def patch(self):
        """Count every ``dist.all_reduce`` / ``all_gather_single`` / ``all_to_all_single`` / ``isend`` meanwhile."""

        def nbytes(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()

        wrappers = {
            "all_reduce": lambda f: lambda t, *a, **k: (self.add("all_reduce", nbytes(t)), f(t, *a, **k))[1],
            ALL_GATHER: lambda f: (
                lambda out, inp, *a, **k: (self.add("all_gather", nbytes(out)), f(out, inp, *a, **k))[1]
            ),
            "all_to_all_single": lambda f: (
                lambda out, inp, *a, **k: (self.add("all_to_all", nbytes(inp)), f(out, inp, *a, **k))[1]
            ),
            "isend": lambda f: lambda t, *a, **k: (self.add("send_recv", nbytes(t)), f(t, *a, **k))[1],
        }
        saved = {name: getattr(dist, name) for name in wrappers}
        try:
            for name, wrap in wrappers.items():
                setattr(dist, name, wrap(saved[name]))
            yield self
        finally:
            for name, f in saved.items():
                setattr(dist, name, f)


# ----------------------------------------------------------------------------- our quantized hook
@dataclass
class QuantState:
    fmt: str  # int8 | int4 | fp8 | fp8_e4m3 | fp8_e5m2
    group: dist.ProcessGroup | None = None
    stochastic: bool = False  # stochastic rounding (int8 / int4)
    error_feedback: bool = False
    seed: int = 0
    worker_ef: ErrorFeedback = field(default_factory=ErrorFeedback)
    owner_ef: ErrorFeedback = field(default_factory=ErrorFeedback)
    generator: torch.Generator | None = None
    worker: "BucketWorker | None" = None  # started at the first bucket
    pairs: "DuplexPairs | None" = None  # gloo: point-to-point exchanges, one connection per direction

    def __post_init__(self) -> None:
        if self.fmt not in QUANTIZED:
            raise ValueError(f"QuantState.fmt: {self.fmt!r} is not one of {', '.join(QUANTIZED)}")
        if self.stochastic:
            self.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + dist.get_rank())


class DuplexPairs:
    """Point-to-point exchanges among a group's ranks, each direction of a pair on its own gloo connection.

    gloo keeps one TCP connection per pair of ranks in a group; when two ranks send to each other at once
    over it, the directions do not both get the link (half of it each at 100 Mbit/s: module doc). Two
    groups over the same ranks give every pair two connections: the lower rank sends on ``up``, the
    higher on ``down``.
    Must be built on every rank of the default group, in the same order (``dist.new_group``).
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        group = group or dist.group.WORLD
        self.ranks = dist.get_process_group_ranks(group)
        self.me = dist.get_rank()
        self.up = dist.new_group(self.ranks)
        self.down = dist.new_group(self.ranks)

    def exchange(self, sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor]) -> None:
        """Send ``sends[i]`` to the group's i-th rank and receive ``recvs[i]`` from it, all at once."""
        works = []
        for i, t in sends.items():
            peer = self.ranks[i]
            works.append(dist.isend(t, peer, group=self.up if self.me < peer else self.down))
        for i, t in recvs.items():
            peer = self.ranks[i]
            works.append(dist.irecv(t, peer, group=self.up if peer < self.me else self.down))
        for w in works:
            w.wait()

    def all_to_all(self, packed: torch.Tensor) -> torch.Tensor:
        """Row block i of ``packed`` to the group's rank i; row block i of the result from it."""
        n, me = len(self.ranks), self.ranks.index(self.me)
        blocks, recv = packed.chunk(n), torch.empty_like(packed)
        into = recv.chunk(n)
        into[me].copy_(blocks[me])
        self.exchange({i: blocks[i] for i in range(n) if i != me}, {i: into[i] for i in range(n) if i != me})
        return recv

    def all_gather(self, mine: torch.Tensor) -> torch.Tensor:
        """Every rank's ``mine``, stacked in group order."""
        n, me = len(self.ranks), self.ranks.index(self.me)
        out = torch.empty(n * mine.shape[0], *mine.shape[1:], dtype=mine.dtype)
        into = out.chunk(n)
        into[me].copy_(mine)
        self.exchange({i: mine for i in range(n) if i != me}, {i: into[i] for i in range(n) if i != me})
        return out


def _quantize_ef(state: QuantState, ef: ErrorFeedback, key: int, x: torch.Tensor) -> torch.Tensor:
    if state.error_feedback:
        x = ef.compensate(key, x)
    packed = quantize(x, state.fmt, state.stochastic, state.generator)
    if state.error_feedback:
        ef.update(key, x, dequantize(packed, state.fmt))
    return packed


class BucketWorker:
    """One thread that runs the quantized buckets of a DDP model in the order DDP hands them over.

    DDP calls the hook bucket by bucket in the same order on every rank; a hook that issued its
    second collective from a completion callback would issue it on whichever gloo thread finished
    first, and two ranks could pair bucket 1's all_to_all with bucket 0's all_gather (a hang, seen
    with 0.1 MiB buckets). Here each bucket's whole pipeline runs on this FIFO thread: the
    collectives leave in bucket order on every rank, and backward goes on meanwhile.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="commtax-quantized-hook").start()

    def submit(self, work: Callable[[], torch.Tensor]) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self.jobs.put((work, fut))
        return fut

    def _run(self) -> None:
        while True:
            work, fut = self.jobs.get()
            try:
                fut.set_result(work())
            except Exception as e:  # DDP re-raises it in backward on the main thread
                fut.set_exception(e)


def quantized_hook(state: QuantState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """all_to_all of packed shards → dequantize-average → requantize → all_gather (see module doc)."""
    group = state.group or dist.group.WORLD
    buf, key = bucket.buffer(), bucket.index()
    if state.worker is None:
        state.worker = BucketWorker()

    def all_to_all(packed: torch.Tensor) -> torch.Tensor:
        recv = torch.empty_like(packed)
        dist.all_to_all_single(recv, packed, group=group)
        return recv

    def all_gather(mine: torch.Tensor) -> torch.Tensor:
        out = torch.empty(group.size() * mine.shape[0], row_bytes(state.fmt), dtype=torch.uint8)
        getattr(dist, ALL_GATHER)(out, mine, group=group)
        return out

    if state.pairs is not None:
        all_to_all, all_gather = state.pairs.all_to_all, state.pairs.all_gather
    return state.worker.submit(lambda: bucket_pipeline(state, key, buf, group.size(), all_to_all, all_gather))


def bucket_pipeline(
    state: QuantState,
    key: int,
    buf: torch.Tensor,
    n: int,
    all_to_all: Callable[[torch.Tensor], torch.Tensor],
    all_gather: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One bucket through our quantized hook, the collectives passed in: what ``comm_dtypes.codec_bytes_per_element``
    counts op by op (tests/test_codec.py replays it under a byte-counting dispatch mode)."""
    numel = buf.numel()
    x = torch.zeros(padded_numel(numel, n), dtype=torch.float32)
    x[:numel] = buf
    packed = _quantize_ef(state, state.worker_ef, key, x)
    recv = all_to_all(packed)
    shard = dequantize(recv, state.fmt).view(n, -1).sum(0).div_(n)
    mine = _quantize_ef(state, state.owner_ef, key, shard)
    out = all_gather(mine)
    return buf.copy_(dequantize(out, state.fmt)[:numel])


@dataclass
class OrderedState:
    """torch's PowerSGD state, and the thread that runs its buckets one at a time."""

    inner: powerSGD_hook.PowerSGDState
    worker: BucketWorker | None = None


def powersgd_ordered_hook(state: OrderedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook``, unchanged, run one bucket at a time on a BucketWorker.

    torch's hook issues its P and Q all-reduces from completion callbacks; with more than one
    bucket in flight on gloo two ranks can issue them in different orders and hang (seen with
    0.1 MiB buckets). Serialising the buckets keeps every rank's collectives in the same order.
    """
    if state.worker is None:
        state.worker = BucketWorker()
    return state.worker.submit(lambda: powerSGD_hook.powerSGD_hook(state.inner, bucket).wait())


def bf16_hook(process_group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``bf16_compress_hook``, unchanged; a wrapper only because DDP refuses that function by identity
    unless CUDA and NCCL ≥ 2.10 are present, while gloo on CPU all-reduces bf16 fine."""
    return default_hooks.bf16_compress_hook(process_group, bucket)


def codec_seconds(hook: str, numel: int, n: int, error_feedback: bool = False, iters: int = 3) -> float | None:
    """This rank's median time for the hook's own compute on a ``numel`` gradient, without communication:
    what the hook adds besides the wire (quantize, dequantize-average n shards, requantize, dequantize;
    the casts of fp16/bf16; the division of none). None for PowerSGD (torch's matmuls: not replayed here)."""
    if hook == "powersgd":
        return None
    g = torch.randn(numel)
    fmt = HOOK_FORMAT[hook]

    def once() -> None:
        if fmt in QUANTIZED:
            state = QuantState(fmt, error_feedback=error_feedback)
            x = torch.zeros(padded_numel(numel, n))
            x[:numel] = g
            packed = _quantize_ef(state, state.worker_ef, 0, x)  # the all_to_all receives as many bytes
            shard = dequantize(packed, fmt).view(n, -1).sum(0).div_(n)
            mine = _quantize_ef(state, state.owner_ef, 0, shard)
            g.copy_(dequantize(mine.repeat(n, 1), fmt)[:numel])  # the all_gather's output
        else:
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(fmt, torch.float32)
            g.copy_(g.to(dtype).div_(n))

    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


# ----------------------------------------------------------------------------- choosing a hook
def make_hook(
    name: str,
    group: dist.ProcessGroup | None = None,
    error_feedback: bool = False,
    stochastic: bool = False,
    powersgd_rank: int = 4,
    start_powersgd_iter: int = 2,
    seed: int = 0,
) -> tuple[Callable, object]:
    """``(hook, state)`` for ``ddp.register_comm_hook(state, hook)``; torch's own hooks where they exist.

    Call it on every rank, in the same order, as DDP's constructor is: on gloo our quantized hooks build
    their ``DuplexPairs`` groups here (``dist.new_group`` is collective)."""
    if name not in HOOKS:
        raise ValueError(f"hook {name!r}: choose from {', '.join(HOOKS)}")
    if error_feedback and name not in EF_HOOKS:
        raise ValueError(f"error feedback applies to {', '.join(EF_HOOKS)}, not {name!r}")
    if name == "none":
        return default_hooks.allreduce_hook, group
    if name == "fp16":
        return default_hooks.fp16_compress_hook, group
    if name == "bf16":
        return bf16_hook, group
    if name == "powersgd":
        # torch needs start_powerSGD_iter ≥ 2 with error feedback or warm start: vanilla all-reduce before
        state = powerSGD_hook.PowerSGDState(
            group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=max(2, start_powersgd_iter),
            use_error_feedback=error_feedback,
            warm_start=True,
            random_seed=seed,
        )
        return powersgd_ordered_hook, OrderedState(state)
    state = QuantState(HOOK_FORMAT[name], group, stochastic, error_feedback, seed)
    if dist.get_backend(group) == "gloo":
        state.pairs = DuplexPairs(group)
    return quantized_hook, state
