"""One pass over a trace's events: keep only the numbers the analysis needs, in compact arrays.

What is kept per event kind (everything else is dropped as it streams by):
* GPU activity (``kernel``, ``gpu_memcpy``, ``gpu_memset``): device, start, end, class
  (compute / communication / memcpy / memset), correlation id; for communication kernels the
  collective's kind, and its message size and group where the kernel's args carry them.
* Launches (``cuda_runtime`` / ``cuda_driver``): correlation id, CPU thread, time — to place a kernel
  in the ``ProfilerStep#N`` that launched it and to link it to its ``record_param_comms`` op.
* ``ProfilerStep#N`` annotations (CPU, and GPU where Kineto wrote ``gpu_user_annotation`` ones).
* ``record_param_comms`` CPU ops (collective name, sizes, dtype, group) per thread.
* CPU ops (start, end, thread, compute or collective): the timeline of CPU-only (gloo) jobs, whose
  collectives are CPU ops such as ``gloo:all_reduce`` on gloo's own threads.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commtax.trace.reader import TraceFormatError, TraceMeta, iter_events

COMPUTE, COMM, MEMCPY, MEMSET = 0, 1, 2, 3
CLASS_NAMES = ("compute", "comm", "memcpy", "memset")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all", "other")

# NCCL kernels: ncclKernel_<Op>_<ALGO>_<PROTO>_<RedOp>_<type> (NCCL ≤ 2.18), ncclDevKernel_<Op>_… (2.19+),
# ncclDevKernel_Generic (op only in the args); RCCL keeps the nccl names and adds rccl-prefixed ones.
COMM_KERNEL = re.compile(r"^(?:nccl|rccl)\w*?kernel", re.IGNORECASE)
_KERNEL_OP = re.compile(r"^(?:nccl|rccl)\w*?Kernel_([A-Za-z]+)", re.IGNORECASE)
# DeepEP's expert-parallel kernels (deepseek-ai/DeepEP csrc/kernels/intranode.cu, internode.cu, internode_ll.cu):
# dispatch, combine and their notify/cleanup kernels, as Kineto writes them demangled:
# "void deep_ep::internode_ll::dispatch<true, 3, 10, 7168>(void*, …)"
DEEPEP_KERNEL = re.compile(r"\bdeep_ep::(intranode|internode|internode_ll)::(\w+)")
# CPU-side collectives of CPU-only jobs: gloo:all_reduce, gloo:broadcast, mpi:…, ucc:… (torch c10d record them)
CPU_COMM_OP = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):([A-Za-z_]+)$")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
# element sizes of the dtype names that appear in kernel args and record_param_comms (c10 ScalarType names
# and the C type names of "Input type")
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "c10::half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::bfloat16": 2,
    "int": 4,
    "int32": 4,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "short": 2,
    "int16": 2,
    "char": 1,
    "byte": 1,
    "unsigned char": 1,
    "signed char": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}


def op_kind(name: str) -> str:
    """A collective's kind from a kernel token (AllReduce) or a c10d name (allreduce, _allgather_base, …)."""
    n = name.lower().replace("_", "")
    for key, kind in (
        ("allreduce", "all_reduce"),
        ("allgather", "all_gather"),
        ("reducescatter", "reduce_scatter"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("sendrecv", "send_recv"),
        ("send", "send_recv"),
        ("recv", "send_recv"),
    ):
        if key in n:
            return kind
    return "other"


def kernel_op(name: str) -> str | None:
    """The kind a communication kernel's name says (None for a name that carries no op, e.g. _Generic)."""
    m = _KERNEL_OP.match(name)
    if not m:
        return None
    kind = op_kind(m.group(1))
    return None if kind == "other" and m.group(1).lower() in ("generic", "") else kind


def ep_kernel(name: str) -> str | None:
    """``deepep <mode> <kernel>`` for a DeepEP kernel (mode: intranode, internode, internode_ll), else None."""
    m = DEEPEP_KERNEL.search(name)
    return f"deepep {m.group(1)} {m.group(2)}" if m else None


def parallel_group(kind: str) -> str:
    """The plan group a collective kind names by itself: an all-to-all is expert-parallel (dispatch/combine)."""
    return "ep" if kind == "all_to_all" else ""


def _number(x: Any) -> float | None:
    """A count or size from a trace's args: a finite number ≥ 0, else unknown (a negative size is not one)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) and x >= 0 else None


def comm_args(args: dict) -> dict:
    """Size, dtype, group and kind of a collective from kernel args or a record_param_comms op's args."""
    out: dict[str, Any] = {}
    name = args.get("Collective name")
    if isinstance(name, str) and name:
        out["kind"] = op_kind(name)
    size = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    n_in, n_out = _number(args.get("In msg nelems")), _number(args.get("Out msg nelems"))
    if size is not None and (n_in is not None or n_out is not None):
        out["in_bytes"] = (n_in or 0.0) * size
        out["out_bytes"] = (n_out or 0.0) * size
    elif "Input Dims" in args:  # older record_param_comms: shapes and C type names of the inputs
        nbytes = _input_bytes(args.get("Input Dims"), args.get("Input type"))
        if nbytes:
            out["in_bytes"] = out["out_bytes"] = nbytes
    group = _number(args.get("Group size"))
    if group is not None and group >= 1:
        out["group"] = int(group)
    return out


def _input_bytes(dims: Any, types: Any) -> float | None:
    """Bytes of the tensor inputs of an op recorded with shapes (``record_shapes=True``)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0.0
    for d, t in zip(dims, types):
        size = DTYPE_BYTES.get(str(t).lower())
        if size is None or not isinstance(d, list) or not d or not all(isinstance(x, int) for x in d):
            continue
        total += math.prod(d) * size
    return total or None


@dataclass
class Lane:
    """Intervals of one timeline (a GPU, or the CPU of a CPU-only job), in trace µs."""

    start: array = field(default_factory=lambda: array("d"))
    end: array = field(default_factory=lambda: array("d"))
    cls: array = field(default_factory=lambda: array("b"))
    corr: array = field(default_factory=lambda: array("q"))  # correlation id (-1: none)
    tid: array = field(default_factory=lambda: array("q"))  # CPU lanes: thread index
    comm: array = field(default_factory=lambda: array("q"))  # index into Collected.comm_info (-1: not comm)

    def add(self, ts: float, dur: float, cls: int, corr: int = -1, tid: int = -1, comm: int = -1) -> None:
        self.start.append(ts)
        self.end.append(ts + max(dur, 0.0))
        self.cls.append(cls)
        self.corr.append(corr)
        self.tid.append(tid)
        self.comm.append(comm)

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class Collected:
    """What one trace file holds that the analysis needs."""

    path: Path
    meta: TraceMeta
    gpus: dict[int, Lane] = field(default_factory=dict)
    cpu: Lane = field(default_factory=Lane)  # CPU ops: cls COMPUTE (candidate) or COMM (gloo:…)
    comm_info: list[dict] = field(default_factory=list)
    launch_corr: array = field(default_factory=lambda: array("q"))
    launch_ts: array = field(default_factory=lambda: array("d"))
    launch_tid: array = field(default_factory=lambda: array("q"))
    cpu_steps: list[tuple[int, float, float, int]] = field(default_factory=list)  # (N, start, end, thread)
    gpu_steps: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)
    param_comms: dict[int, list[tuple[float, dict]]] = field(default_factory=dict)  # thread -> [(ts, args)]
    threads: dict[Any, int] = field(default_factory=dict)
    # trace µs of the first event: times are kept relative to it, so an end (ts + dur) keeps its fraction
    # (absolute Kineto timestamps near 1.7e15 µs have a float64 spacing of 0.25 µs)
    base_us: float | None = None

    def thread(self, tid: Any) -> int:
        return self.threads.setdefault(tid if isinstance(tid, (int, str)) else str(tid), len(self.threads))

    @property
    def distributed(self) -> dict:
        d = self.meta.fields.get("distributedInfo")
        return d if isinstance(d, dict) else {}

    @property
    def device_names(self) -> dict[int, str]:
        props = self.meta.fields.get("deviceProperties")
        out = {}
        if isinstance(props, list):
            for p in props:
                if isinstance(p, dict) and isinstance(p.get("id"), int):
                    out[p["id"]] = str(p.get("name", ""))
        return out


def _bad(path: Path, i: int, ev: dict, key: str, expected: str) -> TraceFormatError:
    name = ev.get("name")
    what = f"traceEvents[{i}]" + (f" ({name[:60]!r})" if isinstance(name, str) else "")
    return TraceFormatError(f"{path}: {what}: {key!r} is a {type(ev.get(key)).__name__}, expected {expected}")


def collect(path: Path | str) -> Collected:
    """Stream one trace file into a ``Collected`` (raises TraceFormatError on malformed input)."""
    path = Path(path)
    meta = TraceMeta(path)
    c = Collected(path, meta)
    for i, ev in enumerate(iter_events(path, meta)):
        if not isinstance(ev, dict):
            raise TraceFormatError(f"{path}: traceEvents[{i}] is a {type(ev).__name__}, expected an event object")
        if ev.get("ph") != "X":
            continue
        name, ts, dur, args = ev.get("name"), ev.get("ts"), ev.get("dur", 0.0), ev.get("args")
        if not isinstance(name, str):
            raise _bad(path, i, ev, "name", "a string")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise _bad(path, i, ev, "ts", "a number (µs)")
        if isinstance(dur, bool) or not isinstance(dur, (int, float)):
            raise _bad(path, i, ev, "dur", "a number (µs)")
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            raise _bad(path, i, ev, "args", "an object")
        cat = ev.get("cat")
        cat = cat.lower() if isinstance(cat, str) else ""
        if c.base_us is None:
            c.base_us = float(ts)
        _one(c, name, float(ts) - c.base_us, float(dur), cat, args, ev)
    return c


def _int(x: Any, default: int = -1) -> int:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else default


def _one(c: Collected, name: str, ts: float, dur: float, cat: str, args: dict, ev: dict) -> None:
    if cat in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"):
        device = _int(args.get("device"), _int(ev.get("pid"), 0))
        lane = c.gpus.get(device)
        if lane is None:
            from commtax.trace.analyze import MAX_DEVICES_PER_TRACE  # the bound is the analysis's
            from commtax.trace.reader import TraceFormatError

            if len(c.gpus) >= MAX_DEVICES_PER_TRACE:
                raise TraceFormatError(
                    f"{c.path}: over {MAX_DEVICES_PER_TRACE:,} devices in one trace, the limit (a profiler traces "
                    "one process's GPUs; give one trace file per rank)"
                )
            lane = c.gpus[device] = Lane()
        corr = _int(args.get("correlation"))
        if cat != "kernel":
            lane.add(ts, dur, MEMSET if "memset" in cat else MEMCPY, corr)
        elif COMM_KERNEL.match(name):
            info = comm_args(args)
            info.setdefault("kind", kernel_op(name) or "other")
            info["name_kind"] = kernel_op(name)
            c.comm_info.append(info)
            lane.add(ts, dur, COMM, corr, comm=len(c.comm_info) - 1)
        elif ep_kernel(name):  # DeepEP moves tokens itself (NVLink stores, NVSHMEM/IBGDA puts): an all-to-all
            c.comm_info.append({"kind": "all_to_all", "name_kind": "all_to_all", "kernel": ep_kernel(name)})
            lane.add(ts, dur, COMM, corr, comm=len(c.comm_info) - 1)
        else:
            lane.add(ts, dur, COMPUTE, corr)
        return
    if cat in ("cuda_runtime", "cuda_driver", "hip_runtime", "runtime"):
        corr = _int(args.get("correlation"))
        if corr >= 0:
            c.launch_corr.append(corr)
            c.launch_ts.append(ts)
            c.launch_tid.append(c.thread(ev.get("tid")))
        return
    m = STEP.match(name)
    if m:
        if cat == "gpu_user_annotation":
            device = _int(args.get("device"), _int(ev.get("pid"), 0))
            c.gpu_steps.setdefault(device, []).append((int(m.group(1)), ts, ts + dur))
        elif cat in ("user_annotation", "cpu_op", "cpu_instant_event"):
            c.cpu_steps.append((int(m.group(1)), ts, ts + dur, c.thread(ev.get("tid"))))
        return
    if cat not in ("cpu_op", "user_annotation"):
        return
    tid = c.thread(ev.get("tid"))
    if name == "record_param_comms":
        c.param_comms.setdefault(tid, []).append((ts, comm_args(args)))
        return
    m = CPU_COMM_OP.match(name)
    if m:
        info = comm_args(args)
        info.setdefault("kind", op_kind(m.group(2)))
        if "in_bytes" in info and "Input Dims" in args:
            info["size_source"] = "cpu op shapes"
        c.comm_info.append(info)
        c.cpu.add(ts, dur, COMM, tid=tid, comm=len(c.comm_info) - 1)
    elif not name.startswith("c10d::"):  # c10d::allreduce_ etc. only enqueue the collective
        c.cpu.add(ts, dur, COMPUTE, tid=tid)
