"""The measured communication tax of a real job: ``analyze(paths) -> TraceReport``.

Definitions (DESIGN.md; unions of intervals on one device, seconds):
* ``window_s``          first to last GPU event (kernel, memcpy, memset);
* ``compute_s``         time at least one compute kernel runs;
* ``comm_s``            time at least one communication (NCCL/RCCL) kernel runs;
* ``overlapped_comm_s`` time both run; ``exposed_comm_s`` = comm − overlapped;
* ``idle_s``            time no GPU event runs;
* ``comm_tax``          = exposed_comm / window;  ``comm_share`` = comm / (comm + compute).
The same per ``ProfilerStep#N``. A CPU-only job (gloo) has no GPU events: its timeline is the CPU,
compute is the ops of the thread(s) that run the training steps, and communication is the
collectives torch records as CPU ops (``gloo:all_reduce`` …) on gloo's threads.

Per collective: count, message size (nccl-tests convention: the whole buffer, all_gather's output,
reduce_scatter's input), time, algbw = bytes / time and busbw = algbw × the bus factor of
``commtax.costs.collectives.bus_factor``. A kernel's time includes any wait for late peers, so the achieved
busbw is a lower bound on what the links deliver.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commtax.costs.collectives import bus_factor
from commtax.errors import SpecError
from commtax.trace import intervals as iv
from commtax.trace.collect import COMM, COMPUTE, KINDS, Collected, Lane, collect, parallel_group
from commtax.trace.reader import trace_files
from commtax.units import GB

US_TO_S = 1e-6


@dataclass
class Figures:
    """The interval figures of one window (a whole rank or one step), seconds."""

    window_s: float
    compute_s: float
    comm_s: float
    overlapped_comm_s: float
    exposed_comm_s: float
    idle_s: float
    memcpy_s: float
    comm_tax: float
    comm_share: float


@dataclass
class StepFigures(Figures):
    """The figures of one ``ProfilerStep#N`` (its own events; window = first to last of them)."""

    step: int


@dataclass
class CollectiveStat:
    """Calls of one collective kind with one message size and group (or unknown size) on one rank."""

    kind: str
    group_size: int | None
    message_bytes: float | None
    count: int
    time_s: float  # summed duration of the calls
    mean_time_s: float
    algbw_GBps: float | None
    busbw_GBps: float | None
    size_source: str  # "kernel args", "record_param_comms", "cpu op shapes" or "unknown"
    exposed_s: float = 0.0  # the part of these calls no compute runs under
    parallel_group: str = ""  # "ep" for all-to-alls (MoE dispatch/combine); "" where the kind alone does not say
    kernel: str = ""  # the kernel family when it is not NCCL's: "deepep internode_ll dispatch", …
    min_time_s: float = 0.0  # the fastest call: the one that waited least for its peers


@dataclass
class RankReport:
    file: str
    rank: int | None
    world_size: int | None
    device: str
    device_name: str
    window_s: float
    compute_s: float
    comm_s: float
    overlapped_comm_s: float
    exposed_comm_s: float
    idle_s: float
    memcpy_s: float
    comm_tax: float
    comm_share: float
    step_time_s: float  # mean step window (the whole window when the trace has no ProfilerStep)
    comm_by_kind_s: dict[str, float]  # link time per collective kind (union of its calls); Breakdown's
    exposed_by_kind_s: dict[str, float]  # comm_time_s is per process group: see against.measured_breakdown
    steps: list[StepFigures]
    collectives: list[CollectiveStat]
    missing: list[str] = field(default_factory=list)
    start_s: float | None = None  # the file's first event, trace clock (s): which job a rank belongs to

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Straggler:
    """One step across ranks: whose compute was slowest and how long the others waited in collectives."""

    step: int
    ranks: int
    slowest_rank: int | str
    slowest_compute_s: float
    median_compute_s: float
    others_wait_s: float  # mean over the other ranks of (their exposed comm − the slowest rank's)
    max_wait_s: float


@dataclass
class TraceReport:
    ranks: list[RankReport]
    stragglers: list[Straggler] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "stragglers": [asdict(s) for s in self.stragglers],
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------- figures
def figures(
    lane_start: np.ndarray,
    lane_end: np.ndarray,
    cls: np.ndarray,
    compute_mask: np.ndarray | None = None,
    comm_mask: np.ndarray | None = None,
) -> dict[str, float]:
    """Interval figures (µs in, seconds out) of a set of events; masks pick compute and comm events."""
    compute_mask = cls == COMPUTE if compute_mask is None else compute_mask
    comm_mask = cls == COMM if comm_mask is None else comm_mask
    if lane_start.size == 0:
        return asdict(Figures(0, 0, 0, 0, 0, 0, 0, 0, 0))
    everything = iv.union(lane_start, lane_end)
    compute = iv.union(lane_start[compute_mask], lane_end[compute_mask])
    comm = iv.union(lane_start[comm_mask], lane_end[comm_mask])
    other = ~(compute_mask | comm_mask)
    memcpy = iv.union(lane_start[other], lane_end[other])
    window = float(everything[1][-1] - everything[0][0])
    t_compute, t_comm = iv.length(compute), iv.length(comm)
    overlapped = iv.intersection_length(comm, compute)
    exposed = t_comm - overlapped
    return asdict(
        Figures(
            window_s=window * US_TO_S,
            compute_s=t_compute * US_TO_S,
            comm_s=t_comm * US_TO_S,
            overlapped_comm_s=overlapped * US_TO_S,
            exposed_comm_s=exposed * US_TO_S,
            idle_s=(window - iv.length(everything)) * US_TO_S,
            memcpy_s=iv.length(memcpy) * US_TO_S,
            comm_tax=exposed / window if window > 0 else 0.0,
            comm_share=t_comm / (t_comm + t_compute) if t_comm + t_compute > 0 else 0.0,
        )
    )


def _arrays(lane: Lane) -> dict[str, np.ndarray]:
    return {
        k: np.frombuffer(getattr(lane, k), dtype=getattr(lane, k).typecode).astype(
            float if k in ("start", "end") else np.int64
        )
        for k in ("start", "end", "cls", "corr", "tid", "comm")
    }


def _step_of(times: np.ndarray, windows: list[tuple[int, float, float]]) -> np.ndarray:
    """Index into ``windows`` (sorted by start) of the window holding each time; -1 outside all."""
    if not windows or times.size == 0:
        return np.full(times.size, -1)
    starts = np.array([w[1] for w in windows])
    ends = np.array([w[2] for w in windows])
    k = np.searchsorted(starts, times, side="right") - 1
    ok = (k >= 0) & (times < ends[np.maximum(k, 0)])
    return np.where(ok, k, -1)


def _launch_times(c: Collected, corr: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CPU launch time and thread of each kernel (by correlation id); own start and -1 where unlinked."""
    if len(c.launch_corr) == 0:
        return own.copy(), np.full(own.size, -1)
    lc = np.frombuffer(c.launch_corr, dtype=np.int64)
    order = np.argsort(lc, kind="stable")
    lc = lc[order]
    lts = np.frombuffer(c.launch_ts, dtype=float)[order]
    ltid = np.frombuffer(c.launch_tid, dtype=np.int64)[order]
    k = np.clip(np.searchsorted(lc, corr), 0, lc.size - 1)
    hit = (lc[k] == corr) & (corr >= 0)
    return np.where(hit, lts[k], own), np.where(hit, ltid[k], -1)


# ----------------------------------------------------------------------------- collectives
def _link_param_comms(c: Collected, comm_idx: np.ndarray, launch_ts: np.ndarray, launch_tid: np.ndarray) -> None:
    """Give communication kernels without size args the args of their ``record_param_comms`` op.

    c10d records ``record_param_comms`` on the launching thread just before it enqueues the kernel,
    so a kernel takes the last such op on its launch thread at or before its launch, each op once.
    """
    by_tid: dict[int, list[int]] = {}
    for j in np.argsort(launch_ts, kind="stable"):
        if launch_tid[j] >= 0:
            by_tid.setdefault(int(launch_tid[j]), []).append(int(j))
    for tid, kernels in by_tid.items():
        records = sorted(c.param_comms.get(tid, []), key=lambda r: r[0])
        r = -1
        for j in kernels:
            while r + 1 < len(records) and records[r + 1][0] <= launch_ts[j]:
                r += 1
            if r < 0 or records[r] is None:
                continue
            info = c.comm_info[int(comm_idx[j])]
            rec = records[r][1]
            if "in_bytes" not in info and "in_bytes" in rec:
                info.update(in_bytes=rec["in_bytes"], out_bytes=rec["out_bytes"], size_source="record_param_comms")
            if "group" not in info and "group" in rec:
                info["group"] = rec["group"]
            if "kind" in rec and info.get("name_kind") in (None, "send_recv") and rec["kind"] != "other":
                info["kind"] = rec["kind"]  # all_to_all runs as SendRecv kernels: the c10d name says which
            records[r] = None  # each op sizes one kernel


def message_bytes(kind: str, info: dict) -> float | None:
    """nccl-tests message size: the whole buffer (all_gather: output, reduce_scatter: input)."""
    if "in_bytes" not in info:
        return None
    if kind in ("all_gather", "reduce_scatter"):
        return max(info["in_bytes"], info["out_bytes"])
    return info["in_bytes"] or info["out_bytes"]


def collective_stats(
    c: Collected,
    start: np.ndarray,
    end: np.ndarray,
    comm_idx: np.ndarray,
    compute: iv.Intervals,
    default_group: int | None,
) -> list[CollectiveStat]:
    rows: dict[tuple, list] = {}
    for s, e, j in zip(start, end, comm_idx):
        info = c.comm_info[int(j)]
        kind = info.get("kind", "other")
        nbytes = message_bytes(kind, info)
        group = info.get("group", default_group)
        source = info.get("size_source", "kernel args" if nbytes is not None else "unknown")
        key = (KINDS.index(kind) if kind in KINDS else len(KINDS), kind, group, nbytes, source, info.get("kernel", ""))
        rows.setdefault(key, []).append((s, e))
    out = []
    for (_, kind, group, nbytes, source, kernel), spans in sorted(
        rows.items(), key=lambda kv: (kv[0][0], kv[0][3] or -1, kv[0][5])
    ):
        a = np.array(spans)
        t = float(np.sum(a[:, 1] - a[:, 0])) * US_TO_S
        n = len(spans)
        algbw = nbytes * n / t / GB if nbytes and t > 0 else None
        # send/recv moves its message once whatever the group (bus factor 1, nccl-tests)
        ranks = group if group else (2 if kind == "send_recv" else None)
        busbw = algbw * bus_factor(kind, ranks) if algbw is not None and ranks and kind != "other" else None
        own = iv.union(a[:, 0], a[:, 1])
        exposed = (iv.length(own) - iv.intersection_length(own, compute)) * US_TO_S
        fastest = float(np.min(a[:, 1] - a[:, 0])) * US_TO_S
        out.append(
            CollectiveStat(
                kind, group, nbytes, n, t, t / n, algbw, busbw, source, exposed, parallel_group(kind), kernel, fastest
            )
        )
    return out


# ----------------------------------------------------------------------------- one rank
def _default_group(c: Collected) -> tuple[int | None, str | None]:
    """The group of collectives whose args name none: the only process group, when the trace has one."""
    d = c.distributed
    pgs = d.get("pg_config")
    if isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0], dict) and isinstance(pgs[0].get("pg_size"), int):
        return pgs[0]["pg_size"], None
    return None, "collectives whose args name no group have no group size (the trace lists no single process group)"


def _rank_report(
    c: Collected,
    device: str,
    a: dict[str, np.ndarray],
    compute_mask: np.ndarray,
    comm_mask: np.ndarray,
    step_of: np.ndarray,
    steps: list[tuple[int, float, float]],
    device_name: str,
    missing: list[str],
    step_range: tuple[int, int] | None = None,
) -> RankReport:
    d = c.distributed
    if step_range is not None:  # only the events of steps a..b
        numbers = np.array([n for n, _, _ in steps] + [-1])
        n_of = numbers[step_of]  # step_of == -1 picks the sentinel
        keep = (step_of >= 0) & (n_of >= step_range[0]) & (n_of <= step_range[1])
        if not np.any(keep):
            from commtax.trace.reader import TraceFormatError

            have = ", ".join(str(n) for n, _, _ in steps) or "none"
            raise TraceFormatError(
                f"--steps {step_range[0]}:{step_range[1]}: {c.path} has no events in those "
                f"steps (its ProfilerStep numbers: {have})"
            )
        a = {k: v[keep] for k, v in a.items()}
        compute_mask, comm_mask, step_of = compute_mask[keep], comm_mask[keep], step_of[keep]
    whole = figures(a["start"], a["end"], a["cls"], compute_mask, comm_mask)
    step_rows = []
    order = np.argsort(step_of, kind="stable")  # events grouped by step: one slice each, not one scan each
    bounds = np.searchsorted(step_of[order], np.arange(len(steps) + 1))
    for k, (n, _, _) in enumerate(steps):
        sel = order[bounds[k] : bounds[k + 1]]
        if sel.size == 0:
            continue
        f = figures(a["start"][sel], a["end"][sel], a["cls"][sel], compute_mask[sel], comm_mask[sel])
        step_rows.append(StepFigures(step=n, **f))
    compute = iv.union(a["start"][compute_mask], a["end"][compute_mask])
    default_group, group_note = _default_group(c)
    cs, ce, cj = a["start"][comm_mask], a["end"][comm_mask], a["comm"][comm_mask]
    stats = collective_stats(c, cs, ce, cj, compute, default_group)
    comm_time, exposed_time = {}, {}
    kinds = np.array([c.comm_info[int(j)].get("kind", "other") for j in cj]) if cj.size else np.array([])
    for kind in dict.fromkeys(kinds.tolist()):
        sel = kinds == kind
        u = iv.union(cs[sel], ce[sel])
        comm_time[kind] = iv.length(u) * US_TO_S
        exposed_time[kind] = (iv.length(u) - iv.intersection_length(u, compute)) * US_TO_S
    unknown = sum(s.count for s in stats if s.message_bytes is None)
    if unknown:
        missing.append(
            f"{unknown} of {sum(s.count for s in stats)} collectives carry no message size (neither in "
            "their kernel args nor in a linked record_param_comms op): no algbw/busbw for them"
        )
    if group_note and any(s.group_size is None for s in stats):
        missing.append(group_note)
    if not steps:
        missing.append("no ProfilerStep#N annotations: no per-step figures")
    step_time = statistics.fmean(s.window_s for s in step_rows) if step_rows else whole["window_s"]
    rank, world = d.get("rank"), d.get("world_size")
    return RankReport(
        file=str(c.path),
        rank=rank if isinstance(rank, int) else None,
        world_size=world if isinstance(world, int) else None,
        device=device,
        device_name=device_name,
        **whole,
        step_time_s=step_time,
        comm_by_kind_s=comm_time,
        exposed_by_kind_s=exposed_time,
        steps=step_rows,
        collectives=stats,
        missing=missing,
    )


# devices one trace file may hold: a profiler traces one process (1-8 GPUs; 72 on an NVL72 tray at most);
# each device is analysed on its own, so 200,000 of them took minutes and GBs: refused beyond the limit
MAX_DEVICES_PER_TRACE = 1024


def _gpu_reports(c: Collected, step_range: tuple[int, int] | None = None) -> list[RankReport]:
    if len(c.gpus) > MAX_DEVICES_PER_TRACE:
        from commtax.trace.reader import TraceFormatError

        raise TraceFormatError(
            f"{c.path}: {len(c.gpus):,} devices in one trace, over the limit of {MAX_DEVICES_PER_TRACE:,} "
            "(a profiler traces one process's GPUs; give one trace file per rank)"
        )
    out = []
    cpu_step_windows = sorted({(n, s, e) for n, s, e, _ in c.cpu_steps}, key=lambda w: w[1])
    names = c.device_names
    for device, lane in sorted(c.gpus.items()):
        a = _arrays(lane)
        launch_ts, launch_tid = _launch_times(c, a["corr"], a["start"])
        comm_mask = a["cls"] == COMM
        if np.any(comm_mask):
            _link_param_comms(c, a["comm"][comm_mask], launch_ts[comm_mask], launch_tid[comm_mask])
        missing = []
        if device in c.gpu_steps:  # Kineto's own GPU-side step annotations
            steps = sorted(c.gpu_steps[device], key=lambda w: w[1])
            step_of = _step_of(a["start"], steps)
        else:  # the step whose CPU annotation holds the kernel's launch
            steps = cpu_step_windows
            step_of = _step_of(launch_ts, steps)
        out.append(
            _rank_report(
                c,
                f"gpu:{device}",
                a,
                a["cls"] == COMPUTE,
                comm_mask,
                step_of,
                steps,
                names.get(device, ""),
                missing,
                step_range,
            )
        )
    return out


def _cpu_report(c: Collected, step_range: tuple[int, int] | None = None) -> RankReport | None:
    if len(c.cpu) == 0:
        return None
    a = _arrays(c.cpu)
    step_threads = {t for *_, t in c.cpu_steps}
    if not step_threads:  # no step annotations: the thread that ran the most ops
        tids, counts = np.unique(a["tid"][a["cls"] == COMPUTE], return_counts=True)
        step_threads = {int(tids[np.argmax(counts)])} if tids.size else set()
    compute_mask = (a["cls"] == COMPUTE) & np.isin(a["tid"], list(step_threads))
    comm_mask = a["cls"] == COMM
    keep = compute_mask | comm_mask
    a = {k: v[keep] for k, v in a.items()}
    steps = sorted({(n, s, e) for n, s, e, _ in c.cpu_steps}, key=lambda w: w[1])
    missing = [
        (
            "no GPU kernels: the CPU timeline of a CPU-only job (compute = ops of the step thread, "
            "comm = gloo/mpi collectives on their threads)"
        )
    ]
    return _rank_report(
        c, "cpu", a, compute_mask[keep], comm_mask[keep], _step_of(a["start"], steps), steps, "", missing, step_range
    )


def analyze_file(path: Path | str, step_range: tuple[int, int] | None = None) -> list[RankReport]:
    """The reports of one trace file: one per GPU it holds, or one CPU report for a CPU-only job.

    ``step_range=(a, b)`` keeps only the events of ``ProfilerStep#a`` … ``#b``.
    """
    c = collect(path)
    if not c.distributed:
        note = "no distributedInfo: rank and world size unknown"
    else:
        note = None
    reports = _gpu_reports(c, step_range) if c.gpus else [r for r in [_cpu_report(c, step_range)] if r is not None]
    if not reports:
        from commtax.trace.reader import TraceFormatError

        raise TraceFormatError(f"{path}: no GPU kernels and no CPU ops: nothing to measure")
    for r in reports:
        if note:
            r.missing.insert(0, note)
        r.start_s = None if c.base_us is None else c.base_us * US_TO_S
    return reports


# Ranks of one job start their profilers within a few steps of each other; traces started further apart
# (or of another world size, or repeating a rank) are another job's.
SAME_JOB_S = 600.0


def jobs_of(ranks: list[RankReport]) -> list[list[RankReport]]:
    """The ranks grouped by job: same world size, first events within SAME_JOB_S, no rank twice."""
    groups: list[list[RankReport]] = []
    order = sorted(ranks, key=lambda r: (r.world_size or 0, r.start_s or 0.0))
    for r in order:
        for g in groups:
            head = g[0]
            near = head.start_s is None or r.start_s is None or abs(r.start_s - head.start_s) <= SAME_JOB_S
            taken = r.rank is not None and any(x.rank == r.rank and x.device == r.device for x in g)
            if head.world_size == r.world_size and near and not taken:
                g.append(r)
                break
        else:
            groups.append([r])
    return sorted(groups, key=lambda g: g[0].start_s or 0.0)  # in the order the jobs started


def one_job(
    report: TraceReport, k: int | None, world_size: int | None, option: str
) -> tuple[TraceReport, int | None, str]:
    """The ranks of one job of ``report``, (sub-report, its number, how it was chosen): job ``k`` (1-based, in the
    order the jobs started: ``commtax trace`` prints "job K of N"), else the one job of ``world_size`` (the job YAML's
    num_gpus); a report of one job is itself. Several jobs and no way to choose is a ``SpecError`` naming them."""
    groups = jobs_of(report.ranks)

    def sub(i: int) -> TraceReport:
        return TraceReport(ranks=groups[i], stragglers=stragglers(groups[i]), notes=report.notes)

    listing = "; ".join(
        f"job {i}: world size {g[0].world_size or '?'}, {len(g)} rank(s)" for i, g in enumerate(groups, 1)
    )
    if k is not None:
        if not 1 <= k <= len(groups):
            raise SpecError(f"--job: {k} is not one of the {len(groups)} job(s) in these traces ({listing})")
        return (sub(k - 1), k, f"job {k} of {len(groups)}") if len(groups) > 1 else (report, 1, "")
    if len(groups) == 1:
        return report, None, ""
    match = [i for i, g in enumerate(groups) if world_size is not None and g[0].world_size == world_size]
    if len(match) == 1:
        i = match[0]
        return sub(i), i + 1, f"job {i + 1} of {len(groups)}, the one of the job's world size {world_size}"
    why = f"{len(match)} have the job's world size {world_size}" if match else f"none has world size {world_size}"
    raise SpecError(
        f"{option}: these {len(report.ranks)} traces are {len(groups)} jobs ({listing})"
        + (f" and {why}" if world_size is not None else "")
        + "; pick one with --job K"
    )


def analyze(paths: list[Path | str] | Path | str, step_range: tuple[int, int] | None = None) -> TraceReport:
    """Measured communication tax of every rank in ``paths`` (files, or directories of *.json[.gz])."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    ranks = [r for f in trace_files(list(paths)) for r in analyze_file(f, step_range)]
    return TraceReport(ranks=ranks, stragglers=stragglers(ranks))


def stragglers(ranks: list[RankReport]) -> list[Straggler]:
    """Per step seen on two or more ranks: the slowest-compute rank, and the others' extra exposed comm.

    The rank that computes longest reaches each collective last and waits least; the others' exposed
    communication beyond its own is time spent waiting for it.
    """
    if len(ranks) < 2:
        return []
    by_step: dict[int, list[tuple[Any, StepFigures]]] = {}
    for r in ranks:
        who = r.rank if r.rank is not None else Path(r.file).name
        for s in r.steps:
            by_step.setdefault(s.step, []).append((who, s))
    out = []
    for n, rows in sorted(by_step.items()):
        if len(rows) < 2:
            continue
        slow_who, slow = max(rows, key=lambda x: x[1].compute_s)
        waits = [max(0.0, s.exposed_comm_s - slow.exposed_comm_s) for who, s in rows if s is not slow]
        out.append(
            Straggler(
                n,
                len(rows),
                slow_who,
                slow.compute_s,
                statistics.median(s.compute_s for _, s in rows),
                statistics.fmean(waits),
                max(waits),
            )
        )
    return out
