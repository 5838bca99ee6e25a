"""Run a step's task graph and read a ``Breakdown`` off its timeline.

Step time T is the makespan. It is split from the point of view of the *busiest stage* (the
most work; it sets the pipeline's pace, as the estimate's slowest stage does): its own work
(compute, recompute, optimizer, and TP/CP collectives its compute stream waits for) is counted
as it ran, and so is the time its compute stream waits for its own overlapped TP/CP. Pipeline
and DP communication are exposed by how much shorter the step would be if they took no time,
taken away in turn —

  pp_exposed = T − T(pipeline sends free, and no NIC shared with them)
  dp_exposed = T(pp free) − T(pp and DP free)

and what remains is the busiest stage waiting for the others: pp_bubble. The parts add up to the step time
exactly, and for uniform stages the bubble is the textbook (p − 1)/(v·m) of the ideal time,
sends or not. (With in-order streams, and channels held in the order the run found, the step is
a max-plus system, so "free" is one pass of longest paths over the task graph.)
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from commtax.costs.pricing import Costs
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import BREAKDOWN_KEYS, Breakdown, make_breakdown
from commtax.schedule.sim.events import Sim
from commtax.schedule.sim.step import COMPUTE_KINDS, SimOptions, StepBuilder
from commtax.spec import Job
from commtax.workload.memory import memory
from commtax.workload.step import Workload


@dataclass
class SimResult:
    breakdown: Breakdown
    builder: StepBuilder
    busiest_stage: int  # the stage the breakdown is read from: the most work (the pipeline's pace)
    stage_end_s: list[float]  # when each stage's last task ends
    stage_busy_s: list[float]  # each stage's own work: compute, recompute, optimizer, non-overlapped TP/CP
    contention_wait_s: dict[str, float]  # time DP / PP tasks waited for (or, sharing it, lost on) a NIC
    estimate: Breakdown | None = None

    @property
    def sim(self) -> Sim:
        return self.builder.sim

    @property
    def events(self) -> int:
        return self.sim.events

    @property
    def bubble_fraction(self) -> float:
        """pp_bubble / ideal time (compute + recompute + exposed TP/CP of the busiest stage)."""
        b = self.breakdown.breakdown_s
        ideal = b["compute"] + b["recompute"] + b["tp_exposed"] + b["cp_exposed"]
        return b["pp_bubble"] / ideal if ideal else 0.0


@contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _makespan_without(sim: Sim, free: list[set[str]]) -> list[float]:
    """The step time if the task kinds of each ``free`` set took no time, and they shared no wire.

    Every constraint of the run — dependencies, stream order, and the order in which tasks held a
    channel — is kept as it was, except a channel shared with a freed task, so the step is a
    max-plus system: one pass of longest paths, in the order tasks started, per set.
    """
    tasks = sim.tasks
    n = len(tasks)
    ends = [array("d", bytes(8 * n)) for _ in free]  # 8 bytes a task, not a float object each
    durations = [[0.0 if t.kind in f else t.duration_s for t in tasks] for f in free]
    last_on_stream = [-1] * len(sim.streams)
    for i in sim.start_order:
        t = tasks[i]
        prev = last_on_stream[t.stream]
        last_on_stream[t.stream] = i
        if t.train is not None:  # its transfers after its anchor's start and its stream predecessor (Train.end_after)
            a = t.train.anchor
            for e, dur, f in zip(ends, durations, free):
                e[i] = t.train.end_after(e[a] - dur[a], e[prev] if prev >= 0 else 0.0, t.kind in f)
            continue
        preds = t.deps if prev < 0 else t.deps + (prev,)
        c = t.channel_prev
        for e, dur, f in zip(ends, durations, free):
            start = 0.0
            for j in preds:
                if e[j] > start:
                    start = e[j]
            if c is not None and t.kind not in f and tasks[c].kind not in f and e[c] > start:
                start = e[c]
            e[i] = start + dur[i]
    return [max(e, default=0.0) for e in ends]


def _attribute(sim: Sim, device: int, step: float, hidden: tuple[str, ...]) -> dict[str, float]:
    """Split the step from ``device``'s point of view (see the module docstring)."""
    parts = _own_parts(sim, device, hidden)
    own_time = sum(parts.values())
    t_pp, t_dp = _makespan_without(sim, [{"pp"}, {"pp", "dp"}])
    parts["pp_exposed"] = step - t_pp
    parts["dp_exposed"] = t_pp - t_dp
    bubble = t_dp - own_time
    parts["pp_bubble"] = 0.0 if abs(bubble) < 1e-12 * step else bubble  # no bubble: float noise only
    return parts


def _own_parts(sim: Sim, device: int, hidden: tuple[str, ...]) -> dict[str, float]:
    """``device``'s own time: its work, the TP/CP its compute stream waits for, overlapped or not."""
    parts = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    tasks, streams = sim.tasks, sim.streams
    if any(s.name == "ep" for s in streams):  # an MoE job: its all-to-all time apart, after exposed CP
        parts = {**dict(list(parts.items())[:4]), "ep_exposed": 0.0, **dict(list(parts.items())[4:])}
    compute = next(s for s in streams if s.device == device and s.name == "compute")
    prev_end = 0.0
    for i in compute.tasks:
        t = tasks[i]
        waited = 0.0
        for _, kind, secs in t.tail:  # TP/CP the compute stream waits for (not overlapped)
            parts[f"{kind}_exposed"] += secs
            waited += secs
        if t.kind not in parts:  # "dp contention" (kind dp): DP's share, counted when DP is made free below
            continue
        parts[t.kind] += t.duration_s - waited
        c = t.cause
        if c is not None and tasks[c].kind in hidden and streams[tasks[c].stream].device == device:
            # overlapped TP/CP it waited for: it could have started when its other inputs, its
            # stream and the collective's own inputs allowed
            other = max([tasks[j].end_s for j in t.deps if j != c] + [prev_end, tasks[c].start_s])
            parts[f"{tasks[c].kind}_exposed"] += max(0.0, t.start_s - other)
        prev_end = t.end_s
    return parts


# micro-batch passes through pipeline chunks (m · pp · vp) one simulation builds: the 16K-GPU Llama 3 plan of
# examples/sim has 15,876 (98,508 events, ~1 s of CPU); 200,000 is ~12 s and ~1 GB. Beyond it, refused.
MAX_SIM_PASSES = 200_000


def check_size(job: Job) -> None:
    """Refuse (one SpecError line naming the limit) a step whose event graph would not fit a laptop."""
    m, pp, vp = job.micro_batches, job.plan.pp, job.plan.vp
    if m * pp * vp > MAX_SIM_PASSES:
        raise SpecError(
            f"simulate: {m:,} micro-batches x pp {pp} x vp {vp} = {m * pp * vp:,} stage passes per step, over the "
            f"simulator's limit of {MAX_SIM_PASSES:,}; raise plan.micro_batch or lower training.global_batch "
            "(`commtax estimate` has no such limit)"
        )


def simulate(
    job: Job,
    options: SimOptions = SimOptions(),
    workload: Workload | None = None,
    compare: bool = True,
    costs: Costs | None = None,
) -> SimResult:
    """Simulate one training step of ``job``; the Breakdown has the same fields as ``estimate``'s.

    ``workload`` and ``costs`` default to ``build_workload(job)`` and ``Costs(job)`` (tests pass
    their own); ``compare`` also runs ``estimate(job)`` (for --explain, and for memory).
    """
    check_size(job)
    with _no_gc():  # ~10^5 acyclic task objects: the cyclic collector would rescan them again and again
        if job.cluster.pools and job.plan.stage_pools is not None and workload is None:
            from commtax.schedule.sim.pools import PoolStepBuilder  # stages on GPU pools: each priced on its own

            builder = PoolStepBuilder(job, options, costs)
        else:
            builder = StepBuilder(job, workload, options, costs)
        sim = builder.build()
        step = sim.run()
        return _result(job, builder, sim, step, compare)


def _device_totals(
    sim: Sim, builder: StepBuilder
) -> tuple[list[float], list[float], list[dict[str, float]], dict[str, float]]:
    """One pass over the timeline: each device's last end, its own work and its wire time per group, and the time
    DP / PP traffic waited for (or lost sharing) a NIC."""
    tasks, streams = sim.tasks, sim.streams
    p = builder.p
    stage_end = [0.0] * p
    work = [0.0] * p
    link = [{"tp": 0.0, "cp": 0.0, "pp": 0.0, "dp": 0.0} for _ in range(p)]
    if builder.wl.moe_layer is not None:
        for d in link:
            d["ep"] = 0.0
    waited: dict[str, float] = {}
    for t in tasks:
        d = streams[t.stream].device
        if t.end_s > stage_end[d]:
            stage_end[d] = t.end_s
        if t.kind in COMPUTE_KINDS:
            work[d] += t.duration_s  # with the TP/CP it waits for
            if t.name.endswith(" contention"):  # compute slowed by hidden TP/CP: no link time
                continue
            for _, kind, secs in t.tail:
                link[d][kind] += secs
        elif t.name == "dp contention":  # compute slowed by hidden DP traffic (StepBuilder): no link time
            continue
        elif t.links:  # a flow-network transfer: its wire time alone, and what sharing its links added
            link[d][t.kind] += t.work_s
            if t.duration_s > t.work_s:
                waited[t.kind] = waited.get(t.kind, 0.0) + t.duration_s - t.work_s
        else:
            link[d][t.kind] += t.duration_s
            if t.start_s > t.ready_s and t.cause is not None and tasks[t.cause].kind != t.kind:
                # it waited for the NIC, and the one that let it go was the other kind of traffic
                waited[t.kind] = waited.get(t.kind, 0.0) + t.start_s - t.ready_s
    if builder.wl.moe_layer is not None:
        # the all-to-all's wire time, hidden or not (the timeline draws only the part the passes wait for): what the
        # rank's passes carried, as its EP bytes (DualPipe: m/2 micro-batches through each of its two model stages)
        for d in range(p):
            link[d]["ep"] = builder.devices[d].ep_s
    return stage_end, work, link, waited


def _busiest_stage(sim: Sim, p: int, hidden: tuple[str, ...], step: float, stage_end: list[float]) -> int:
    """The stage that sets the pace, whose view the breakdown is: the most time per step in its own passes (work and
    the TP/CP it waits for, as the estimate's slowest stage; not the once-a-step optimizer); among equals, the one
    that finishes last."""
    pace = []
    for d in range(p):
        own = _own_parts(sim, d, hidden)
        pace.append(sum(own.values()) - own["optimizer"])
    return max(range(p), key=lambda d: (round(pace[d] / step, 12) if step else 0.0, stage_end[d]))


def _schedule_note(job: Job, builder: StepBuilder) -> list[str]:
    """A DualPipe schedule the builder played in 1F1B order, and why (none when it played DualPipe or the plan is
    another schedule)."""
    if job.plan.schedule not in ("dualpipe", "dualpipev") or builder.dual:
        return []
    return [
        f"{job.plan.schedule} simulated in 1F1B order: the bubble is 1F1B's, estimate prices DualPipe's"
        + (
            f" ({builder.m} micro-batches: DualPipe feeds an even number, half from each end)"
            if job.plan.schedule == "dualpipe" and builder.m % 2
            else (
                " (ZeRO-3: the per-layer gathers around split backwards are not simulated)"
                if job.plan.schedule == "dualpipe" and builder.wl.dp_microbatch
                else ""
            )
        )
    ]


def _replica_note(builder: StepBuilder, sim: Sim, busiest: int) -> str:
    """What was simulated (events, one replica's stages or DualPipe ranks) and whose breakdown this is."""
    p = builder.p
    if builder.dual == "dualpipe":  # a rank holds two model stages: name the rank and its stages, as explain does
        return (
            f"simulated {sim.events:,} events on the {p} pipeline ranks of one data-parallel replica (DualPipe: rank r "
            f"holds model stages r and {p - 1}−r); breakdown of the busiest rank, {busiest} (model stages {busiest} "
            f"and {p - 1 - busiest}), where estimate reports its slowest stage"
        )
    return (
        f"simulated {sim.events:,} events on the {p} stage(s) of one data-parallel replica; "
        f"breakdown of the busiest stage, {busiest}"
    )


def _dp_rank_note(
    job: Job, builder: StepBuilder, busiest: int, dp_rank: int, busiest_link: dict[str, float], comm_time: dict
) -> list[str]:
    """Both ranks' DP traffic when the DP reported (the slowest DP rank's) is not the busiest rank's, as the
    estimate's notes name them."""
    if dp_rank == busiest:
        return []
    own_t = busiest_link
    if builder.wl.moe_layer is not None:
        own_t, _ = _with_edp(job, builder, busiest, own_t, builder.devices[busiest].bytes)
    edp = lambda t: f", edp {t['edp']:.3g} s" if "edp" in t else ""  # noqa: E731
    return [
        f"comm_time_s dp{', edp' if 'edp' in comm_time else ''} of rank {dp_rank}, the slowest DP rank (the one "
        f"estimate prices: dp {comm_time['dp']:.3g} s{edp(comm_time)}); the busiest rank {busiest}'s: dp "
        f"{own_t['dp']:.3g} s{edp(own_t)}"
    ]


def _pools_as_simulated(est: Breakdown, builder: StepBuilder, work: list[float], busiest: int) -> list[dict]:
    """The estimate's GPU pools with their stages' busy seconds per micro-batch as simulated, and the straggler."""
    return [
        {
            **x,
            "stage_s": [work[s] / builder.m for s in x["stages"]],  # busy seconds per micro-batch, simulated
            "straggler": busiest in x["stages"],
        }
        for x in est.pools
    ]


def _result(job: Job, builder: StepBuilder, sim: Sim, step: float, compare: bool) -> SimResult:
    """The Breakdown of the run, read from the busiest stage's view, with its notes and what explain needs."""
    ov = job.plan.overlap
    hidden = tuple(g for g, overlapped in (("tp", ov.tp), ("cp", ov.cp)) if overlapped)
    stage_end, work, link, waited = _device_totals(sim, builder)
    busiest = _busiest_stage(sim, builder.p, hidden, step, stage_end)
    parts = _attribute(sim, busiest, step, hidden)
    est = estimate(job) if compare else None
    # DP traffic (dp, edp) of the rank whose DP the estimate prices (``analytical.slowest_dp_rank``: the step waits
    # for it; DualPipe's rank 0 holds the embedding and the head), the other groups of the busiest
    dp_rank = _dp_rank(builder, busiest)
    comm_time = {**link[busiest], "dp": link[dp_rank]["dp"]}
    comm_bytes = {**builder.devices[busiest].bytes, "dp": builder.devices[dp_rank].bytes["dp"]}
    if builder.wl.moe_layer is not None:  # expert gradients as their own edp group, as estimate reports them
        comm_time, comm_bytes = _with_edp(job, builder, dp_rank, comm_time, comm_bytes)
    bd = _breakdown(job, builder.wl, step, parts, comm_time, comm_bytes, est)
    bd.notes.extend(_schedule_note(job, builder))
    bd.notes.append(_replica_note(builder, sim, busiest))
    bd.notes.extend(_dp_rank_note(job, builder, busiest, dp_rank, link[busiest], comm_time))
    if est is not None and est.pools and getattr(builder, "where", None):  # stages on pools: as simulated
        bd.pools = _pools_as_simulated(est, builder, work, busiest)
    return SimResult(bd, builder, busiest, stage_end, work, waited, est)


def _with_edp(
    job: Job, builder: StepBuilder, rank: int, comm_time: dict[str, float], comm_bytes: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """MoE: ``rank``'s expert gradients as their own edp group (a rank without experts reduces none over edp), the
    dense part of its DP tasks' link time as dp (what the expert collectives riding in them took, apart)."""
    from commtax.schedule.analytical import edp_traffic
    from commtax.workload.step import with_dp_stage

    own = with_dp_stage(job, builder.wl, _rank_split(builder, rank)) if builder.splits else builder.wl
    edp_s, edp_b = edp_traffic(job, own, builder.costs)
    dense = max(0.0, comm_time["dp"] - builder.devices[rank].edp_s)
    # the rank's dp bytes count the dense gradients only
    return {**comm_time, "dp": dense, "edp": edp_s}, {**comm_bytes, "edp": edp_b}


def _dp_rank(builder: StepBuilder, busiest: int) -> int:
    """The pipeline rank whose DP traffic the estimate prices: MoE, the rank holding the split the workload's DP ops
    were sized for (``analytical.slowest_dp_workload``, by ``_rank_split``); dense DualPipe, the rank whose two
    stages hold the most parameters (``analytical.dualpipe_dp_workload``); else the busiest stage."""
    p = builder.p
    if builder.splits:
        ranks = [r for r in range(p) if _rank_split(builder, r) == builder.wl.dp_split]
        return busiest if not ranks or busiest in ranks else ranks[0]
    if builder.dual == "dualpipe":
        pair = [builder.stage_params[r] for r in range(p)]
        best = max(pair)
        return busiest if pair[busiest] >= best * (1 - 1e-12) else pair.index(best)
    return busiest


def _rank_split(builder: StepBuilder, rank: int) -> tuple[float, float]:
    """(dense, expert) parameters pipeline rank ``rank`` reduces per reduction: its stage's; under DualPipe both of
    its stages', their mean under ZeRO-2 (a reduction after every backward, each through one of them), as
    ``analytical.dp_splits``."""
    split = builder.splits[rank]
    if builder.dual != "dualpipe":
        return split
    other, share = builder.splits[builder.p - 1 - rank], 0.5 if builder.job.plan.zero == 2 else 1.0
    return share * (split[0] + other[0]), share * (split[1] + other[1])


def _breakdown(
    job: Job,
    wl: Workload,
    step: float,
    parts: dict[str, float],
    comm_time: dict[str, float],
    comm_bytes: dict[str, float],
    est: Breakdown | None,
) -> Breakdown:
    """The simulated parts as a Breakdown: every derived field is defined once, in ``make_breakdown``."""
    mem = memory(job)  # schedule-independent: the estimate's memory model
    b = make_breakdown(
        job, wl, parts, comm_time, comm_bytes, mem.gib(), mem.total <= job.cluster.gpu.mem_bytes, source="simulate"
    )
    assert abs(b.step_time_s - step) <= 1e-9 * max(1.0, step), (b.step_time_s, step)
    return b
