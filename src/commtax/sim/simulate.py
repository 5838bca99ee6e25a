"""Run a step's task graph and read a ``Breakdown`` off its timeline.

Step time is the makespan. It is split from the point of view of the GPU that finishes last
(the *critical stage*): its compute stream is either busy (compute, recompute, optimizer) or
idle. An idle gap is explained by walking back the chain of tasks that held it up (each task's
``cause``, see ``events.py``) until the chain reaches this GPU's own compute: the time of each
task on the chain, clipped to the gap, is charged to what that task is —

  this GPU's TP / CP collective      -> tp_exposed / cp_exposed
  a pipeline send (any stage)        -> pp_exposed
  a DP collective (any stage)        -> dp_exposed
  another stage's compute or TP/CP   -> pp_bubble

so the parts add up to the step time exactly, and for uniform stages the bubble is the
textbook (p − 1)/(v·m) of the ideal time.
"""

from __future__ import annotations

from dataclasses import dataclass

from commtax.estimate import BREAKDOWN_KEYS, Breakdown, Costs, estimate, model_flops_per_gpu_step, recompute_model_flops
from commtax.sim.events import Sim
from commtax.sim.step import COMPUTE_KINDS, SimOptions, StepBuilder
from commtax.spec import Job
from commtax.units import SECONDS_PER_DAY, TFLOPS
from commtax.workload import Workload

GROUP_OF_KIND = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp"}


@dataclass
class SimResult:
    breakdown: Breakdown
    builder: StepBuilder
    critical_stage: int
    stage_end_s: list[float]  # when each stage's last task ends
    stage_busy_s: list[float]  # compute-stream busy time per stage
    contention_wait_s: dict[str, float]  # time tasks of each kind waited for a NIC held by another stream
    estimate: Breakdown | None = None

    @property
    def sim(self) -> Sim:
        return self.builder.sim

    @property
    def events(self) -> int:
        return self.sim.events

    @property
    def bubble_fraction(self) -> float:
        """pp_bubble / ideal time (compute + recompute + exposed TP/CP of the critical stage)."""
        b = self.breakdown.breakdown_s
        ideal = b["compute"] + b["recompute"] + b["tp_exposed"] + b["cp_exposed"]
        return b["pp_bubble"] / ideal if ideal else 0.0


def _attribute(sim: Sim, device: int, step_end: float, last_task: int, serial: tuple[str, ...]) -> dict[str, float]:
    """Split [0, step_end] of ``device``: its own work (compute stream, and TP/CP that the compute
    stream waits for when they are not overlapped) by kind, its idle gaps by the chain that caused them."""
    parts = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    tasks, streams = sim.tasks, sim.streams
    lanes = {s.id for s in streams if s.device == device and (s.name == "compute" or s.name in serial)}
    own_key = {"compute": "compute", "recompute": "recompute", "optimizer": "optimizer",
               "tp": "tp_exposed", "cp": "cp_exposed"}

    def charge_gap(g0: float, g1: float, tid: int | None) -> None:
        while tid is not None and g1 > g0:
            t = tasks[tid]
            if t.stream in lanes:
                break
            lo = max(t.start_s, g0)
            own = streams[t.stream].device == device
            if t.kind == "pp":
                key = "pp_exposed"
            elif t.kind == "dp":
                key = "dp_exposed"
            elif own and t.kind in ("tp", "cp"):  # overlapped TP/CP that outlasted the compute hiding it
                key = f"{t.kind}_exposed"
            else:  # another stage's work
                key = "pp_bubble"
            parts[key] += g1 - lo
            g1 = lo
            tid = t.cause
        if g1 > g0:  # a chain that began at time 0 on another stage
            parts["pp_bubble"] += g1 - g0

    timeline = sorted((tasks[i] for sid in lanes for i in streams[sid].tasks), key=lambda t: (t.start_s, t.id))
    now = 0.0
    for t in timeline:
        if t.start_s > now:
            charge_gap(now, t.start_s, t.cause)
        parts[own_key[t.kind]] += t.end_s - t.start_s
        now = max(now, t.end_s)
    if step_end > now:
        charge_gap(now, step_end, last_task)
    return parts


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
    builder = StepBuilder(job, workload, options, costs)
    sim = builder.build()
    step = sim.run()
    tasks, streams = sim.tasks, sim.streams
    p = builder.p
    stage_end = [0.0] * p
    busy = [0.0] * p
    link = [{"tp": 0.0, "cp": 0.0, "pp": 0.0, "dp": 0.0} for _ in range(p)]
    waited: dict[str, float] = {}
    last = 0
    for t in tasks:
        d = streams[t.stream].device
        if t.end_s > stage_end[d]:
            stage_end[d] = t.end_s
        if t.end_s >= tasks[last].end_s:
            last = t.id
        if t.kind in COMPUTE_KINDS:
            busy[d] += t.duration_s
        else:
            link[d][t.kind] += t.duration_s
            if t.start_s > t.ready_s:
                waited[t.kind] = waited.get(t.kind, 0.0) + t.start_s - t.ready_s
    crit = streams[tasks[last].stream].device
    ov = job.plan.overlap
    serial = tuple(g for g, hidden in (("tp", ov.tp), ("cp", ov.cp)) if not hidden)
    parts = _attribute(sim, crit, step, last, serial)
    dev = builder.devices[crit]
    est = estimate(job) if compare else None
    bd = _breakdown(job, builder.wl, step, parts, link[crit], dev.bytes, est)
    bd.notes.append(
        f"simulated {sim.events} events on {p} stage(s) of one data-parallel replica; "
        f"critical stage {crit}"
    )
    return SimResult(bd, builder, crit, stage_end, busy, waited, est)


def _breakdown(job: Job, wl: Workload, step: float, parts: dict[str, float], comm_time: dict[str, float],
               comm_bytes: dict[str, float], est: Breakdown | None) -> Breakdown:
    tr, c = job.training, job.cluster
    exposed = parts["tp_exposed"] + parts["cp_exposed"] + parts["pp_exposed"] + parts["dp_exposed"]
    total_comm = sum(comm_time.values())
    busy = parts["compute"] + parts["recompute"]
    tokens_per_s = tr.global_batch * tr.seq_len / step
    peak = c.gpu.peak_flops(tr.precision)
    model_flops = model_flops_per_gpu_step(job, wl) / step
    hw_flops = model_flops + recompute_model_flops(job, wl) / c.num_gpus / step
    if est is None:
        est = estimate(job)
    return Breakdown(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / c.num_gpus,
        tflops_per_gpu=model_flops / TFLOPS,
        mfu=model_flops / peak,
        hfu=hw_flops / peak,
        comm_tax=exposed / step,
        comm_share=total_comm / (total_comm + busy) if total_comm + busy > 0 else 0.0,
        breakdown_s=parts,
        comm_bytes_per_gpu=dict(comm_bytes),
        comm_time_s=dict(comm_time),
        memory_gib_per_gpu=dict(est.memory_gib_per_gpu),  # schedule-independent: the estimate's memory model
        fits=est.fits,
        days_to_train=(tr.tokens / tokens_per_s / SECONDS_PER_DAY) if tr.tokens else None,
        source="simulate",
    )
