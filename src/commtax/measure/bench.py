"""nccl-tests-style sweeps on torch.distributed: one code path for gloo (CPU) and NCCL (GPU).

Run under torchrun (one node or many) or ``commtax cluster run``; every rank runs the same
sweep, rank 0 reports. Per size: ``warmup`` untimed iterations, a barrier, ``iters`` timed
ones back to back; time is the slowest rank's median iteration (the collective is done when
the last rank is); the slowest rank's mean is kept as ``time_mean_s``. With ``rounds`` > 1 each
size is measured ``rounds`` times, each round a barrier, ``warmup`` calls and ``iters`` timed ones
straight after them, and time is the mean of the rounds' times (kept as ``round_times_s``): calls
back to back can settle into one of several steady states (gloo's all_to_all: its pairs' turns,
docs/fabric.md), each round after its barrier is a fresh draw of it, and its warm-up lets it
settle before the timing starts.
algbw = message_bytes / time_s and busbw = algbw × bus factor (nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from commtax.costs.collectives import bus_factor
from commtax.measure import algorithms
from commtax.measure.results import ResultFile
from commtax.measure.schedules import IMPL_ALGORITHM, impl_supports
from commtax.measure.watchdog import Watchdog
from commtax.units import GB

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
IMPLS = ("torch", "ring", "rhd", "tree", "hier")
OUR_ALGORITHM = IMPL_ALGORITHM
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int64": torch.int64}


@dataclass(frozen=True)
class SweepConfig:
    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    factor: float
    warmup: int
    iters: int
    impls: tuple[str, ...]  # measured interleaved per size, so they share the same conditions
    dtype: str
    timeout_s: float
    backend: str = "auto"
    rounds: int = 1  # times each size is measured (warm-up, barrier, iters); time: their mean


def message_sizes(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """min, min·f, min·f², … ≤ max (nccl-tests -b/-e/-f)."""
    assert factor > 1 and 0 < min_bytes <= max_bytes
    sizes, s = [], float(min_bytes)
    while s <= max_bytes * (1 + 1e-9):
        sizes.append(int(s))
        s *= factor
    return sizes


def supported(op: str, impl: str) -> bool:
    """Our own algorithms implement all_reduce (all four) and ring all_gather / reduce_scatter."""
    return impl_supports(impl, op)


def cuda_available() -> bool:
    """Whether the NCCL backend has a GPU to run on."""
    return torch.cuda.is_available()


def init_distributed(backend: str, timeout_s: float) -> tuple[str, torch.device]:
    """Join the torchrun job: NCCL on GPUs, gloo on CPU, chosen by the backend alone."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return backend, device


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# torch ≥ 2.13 names the flat-tensor collectives *_single; older releases *_into_tensor / *_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def make_op(op: str, impl: str, numel: int, dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    """A closure running one ``op`` on preallocated zero buffers (zeros: repeated sums never overflow)."""
    n, r = dist.get_world_size(), dist.get_rank()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    full = torch.zeros(numel, dtype=dtype, device=device)
    part = torch.zeros(numel // n, dtype=dtype, device=device)
    if impl != "torch":
        alg = OUR_ALGORITHM[impl]
        return {
            "all_reduce": lambda: algorithms.all_reduce(full, alg, per_node),
            "all_gather": lambda: algorithms.all_gather(full),
            "reduce_scatter": lambda: algorithms.reduce_scatter(full),
        }[op]
    out = torch.zeros(numel, dtype=dtype, device=device)

    def send_recv() -> None:  # nccl-tests sendrecv: everyone sends to r+1 and receives from r-1 at once
        works = [dist.irecv(out, src=(r - 1) % n), dist.isend(full, dst=(r + 1) % n)]
        for w in works:
            w.wait()

    return {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: _all_gather_single(full, part),
        "reduce_scatter": lambda: _reduce_scatter_single(part, full),
        "broadcast": lambda: dist.broadcast(full, src=0),
        "all_to_all": lambda: dist.all_to_all_single(out, full),
        "send_recv": send_recv,
    }[op]


def time_op(
    run: Callable[[], None], warmup: int, iters: int, device: torch.device, settle: bool = False
) -> tuple[float, float]:
    """(median, mean) seconds per iteration, iterations back to back after one barrier (as nccl-tests).

    Every rank stamps the end of each iteration; each rank's median iteration (robust to the
    first iteration's barrier skew and to an iteration a busy CPU preempted) and mean are
    reduced with MAX over ranks: the slowest rank sets the pace of the collective. ``settle``: the
    barrier comes first and the warm-up runs straight into the timed iterations, so that they
    time the calls' steady state back to back rather than the barrier's aligned start (a rank's
    first period runs from its own last warm-up call).
    """
    if settle:
        dist.barrier()
    for _ in range(warmup):
        run()
    synchronize(device)
    if not settle:
        dist.barrier()
    stamps = torch.zeros(iters + 1, dtype=torch.float64)
    stamps[0] = time.perf_counter()
    for i in range(iters):
        run()
        synchronize(device)
        stamps[i + 1] = time.perf_counter()
    dts = stamps[1:] - stamps[:-1]
    stats = torch.stack([dts.median(), dts.mean()]).to(device)  # NCCL reduces device tensors only
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    stats = stats.cpu()
    return float(stats[0].item()), float(stats[1].item())


def record(
    op: str, impl: str, backend: str, message_bytes: int, time_s: float, dtype: str, iters: int, time_mean_s: float
) -> dict:
    n = dist.get_world_size()
    algbw = message_bytes / time_s
    return {
        "op": op,
        "impl": impl,
        "backend": backend,
        "world_size": n,
        "message_bytes": message_bytes,
        "time_s": time_s,
        "algbw_GBps": algbw / GB,
        "busbw_GBps": algbw * bus_factor(op, n) / GB,
        "nodes": n // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "ranks_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "dtype": dtype,
        "iters": iters,
        "time_mean_s": time_mean_s,
        "unix_time": time.time(),
    }


def _where() -> str:
    node, local = os.environ.get("GROUP_RANK", "?"), os.environ.get("LOCAL_RANK", "?")
    return f"node {node}, local rank {local}, {socket.gethostname()} pid {os.getpid()}"


def _numel(op: str, nbytes: int, elem_bytes: int, n: int) -> int:
    """Elements for a buffer of about ``nbytes``; a multiple of n where the op splits it (as nccl-tests)."""
    numel = max(1, nbytes // elem_bytes)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        numel = max(n, numel // n * n)
    return numel


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True, width=120),
        disable=not enabled,
    )


def collective_sweep(cfg: SweepConfig, out: ResultFile, fault: tuple[int, str] | None = None) -> list[dict]:
    """Run the sweep; rank 0 appends each finished record to ``out``. A dead or hung peer exits the process non-zero."""
    backend, device = init_distributed(cfg.backend, cfg.timeout_s)
    rank, n = dist.get_rank(), dist.get_world_size()
    dog = Watchdog(dist.distributed_c10d._get_default_store(), rank, n, cfg.timeout_s, _where())
    dtype = DTYPES[cfg.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    sizes = message_sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)
    plan = [(op, s, impl) for op in cfg.ops for s in sizes for impl in cfg.impls if supported(op, impl)]
    done = []
    with _progress(rank == 0) as bar:
        task = bar.add_task(f"{','.join(cfg.impls)} {backend} n={n}", total=len(plan))
        for i, (op, nbytes, impl) in enumerate(plan):
            if fault is not None and i == fault[0]:  # test hook: this rank is killed / hangs mid-sweep
                os.kill(os.getpid(), signal.SIGKILL if fault[1] == "kill" else signal.SIGSTOP)
            numel = _numel(op, nbytes, elem, n)
            dog.step(i, f"{op} {numel * elem} B ({impl})")
            try:
                run = make_op(op, impl, numel, dtype, device)
                settle = cfg.rounds > 1  # each round: barrier, warm-up, timed calls straight after
                each = [time_op(run, cfg.warmup, cfg.iters, device, settle) for _ in range(cfg.rounds)]
            except RuntimeError as e:
                dog.fail(f"{op} {numel * elem} B failed ({str(e).splitlines()[0][:120]})")
            t, t_mean = (sum(x[k] for x in each) / len(each) for k in (0, 1))
            rec = record(op, impl, backend, numel * elem, t, cfg.dtype, cfg.iters, t_mean)
            if cfg.rounds > 1:
                rec["round_times_s"] = [x[0] for x in each]
            done.append(rec)
            if rank == 0:
                out.append(rec)
                bar.console.print(
                    f"{op:>14} {impl:>5} {numel * elem:>12d} B {t * 1e3:10.3f} ms "
                    f"algbw {rec['algbw_GBps']:8.4f} busbw {rec['busbw_GBps']:8.4f} GB/s"
                )
            bar.advance(task)
    dog.disarm()
    dist.barrier()
    dog.stop()
    dist.destroy_process_group()
    return done


def torchrun_argv(nproc: int, module_argv: list[str]) -> list[str]:
    """This same command, relaunched as ``nproc`` local ranks under torchrun."""
    return [
        sys.executable,
        "-m",
        "commtax.measure.launch",  # torch.distributed.run, without its traceback when commtax stops it
        "--standalone",
        "--local-addr=127.0.0.1",  # every rank is on this host: no lookup of its name (a fresh host may not resolve it)
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--shutdown-timeout=2",
        "-m",
        "--",
        "commtax.cli.measure",
        *module_argv,
    ]  # "--": torchrun would read --max as its own --max-restarts


def run_local(nproc: int, module_argv: list[str]) -> int:
    """Run the sweep under a local torchrun; its exit code. Ctrl-C, SIGTERM or SIGHUP stop torchrun and every rank
    (their own process group) before returning 130; torchrun's log folders (/tmp/torchelastic_*) are removed."""
    import shutil
    import subprocess
    import tempfile

    from commtax.errors import EXIT_INTERRUPTED, LAUNCHED_ENV
    from commtax.signals import terminate_as_interrupt

    tmp = tempfile.mkdtemp(prefix="commtax-bench-")
    # the ranks talk over loopback: gloo would otherwise bind the address the host name resolves to; they leave the
    # interrupt's one line to this process
    env = {
        **os.environ,
        "TMPDIR": tmp,
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        LAUNCHED_ENV: "1",
    }
    proc = None
    try:
        with terminate_as_interrupt():
            try:
                proc = subprocess.Popen(torchrun_argv(nproc, module_argv), env=env, start_new_session=True)
                return proc.wait()
            except KeyboardInterrupt:
                print("commtax bench: interrupted; stopping every rank", file=sys.stderr, flush=True)
                return EXIT_INTERRUPTED
            finally:
                if proc is not None:
                    _stop_group(proc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_group(proc) -> None:
    """Stop torchrun and every rank: SIGTERM torchrun (it SIGTERMs its ranks, SIGKILLs them 2 s later), then
    SIGKILL whatever of its process tree is left after 5 s — ranks run in sessions of their own, so the tree is
    read from /proc before torchrun goes, not from its process group."""
    import subprocess

    tree = _descendants(proc.pid)
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    for pid in [proc.pid, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.poll()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out
