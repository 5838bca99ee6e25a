"""Why a simulated step differs from the analytical estimate, in sentences with numbers.

The two agree where both apply (uniform stages, no contention). They legitimately differ where
the closed form averages something the schedule makes concrete:

* uneven stages — the estimate charges m × the slowest stage + the fill and drain through the
  other stages, Σ_{s≠max} T_s / v; the simulator runs the schedule: 1F1B hides part of the fill
  under the slow stage's warm-up forwards, and where the heavy chunk sits in the schedule moves
  the bubble;
* pipeline sends — the estimate exposes the fill (GPipe: 2(p − 1) sends; interleaved: 2(p·v − 1))
  and, in 1F1B, the round trips of the steady state (``estimate.steady_cycle``); the simulator
  stalls a stage whenever an activation or gradient is still on the wire;
* the gradient bucket tail — buckets of ``--bucket-mb`` (PyTorch DDP: 25 MiB) each pay the
  collective's latency, and the last one's reduction is exposed after the last backward;
* a shared NIC — DP buckets and PP sends of one GPU leave the node over the same NIC share
  and queue behind each other, which the estimate never assumes;
* DualPipe — rank r runs model stage r for the half of the micro-batches fed at rank 0 and stage p − 1 − r for
  the half fed at rank p − 1 (``pipeline.dualpipe``); both price each rank's mean of its two stages
  (``analytical.pipeline_ranks``) and reduce both stages' gradients, but the estimate's fill and drain is the
  paper's (PP/2 − 1)(F&B + B − 3W) per kind of rank, the simulator the reference's order played out;
* MoE gradients — the estimate prices the DP of the rank with the slowest one (dense over dp, experts over
  edp) as if it started with the step's last backward; when that rank is a later pipeline stage, its reduction
  also hides under the earlier stages' last backwards (the 1F1B cool-down).
"""

from __future__ import annotations

from commtax.schedule.analytical import ep_link, hides_ep, pipeline_ranks, stage_times, unpaired_share
from commtax.schedule.sim.simulate import SimResult, _dp_rank
from commtax.schedule.sim.step import COMPUTE_KINDS
from commtax.units import MiB


def _ms(x: float) -> str:
    return f"{x * 1e3:,.1f} ms" if abs(x) < 1 else f"{x:,.2f} s"


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b:+.1%}" if b else "n/a"


def _tail_s(r: SimResult) -> float:
    """Time the busiest stage's optimizer waited after its last backward (gradient reduction tail)."""
    sim = r.sim
    dev = r.builder.devices[r.busiest_stage]
    stream = sim.streams[dev.streams["compute"]].tasks
    opt = sim.tasks[dev.optimizer]
    before = [sim.tasks[i] for i in stream if sim.tasks[i].id != opt.id and sim.tasks[i].kind in COMPUTE_KINDS]
    return max(0.0, opt.start_s - before[-1].end_s) if before else 0.0


def _dp_bound_line(r: SimResult) -> str:
    """A rank whose DP wire time per step (its gradient buckets, each paying the collective's latency) exceeds its own
    work: the step waits for its reductions, which the estimate (one collective, the framework's buckets) hides."""
    sim, bld = r.sim, r.builder
    wire = [0.0] * bld.p
    for t in sim.tasks:
        if t.kind == "dp" and t.name != "dp contention":
            wire[sim.streams[t.stream].device] += t.work_s if t.links else t.duration_s
    k = max(range(bld.p), key=lambda d: wire[d] - r.stage_busy_s[d])
    if wire[k] <= r.stage_busy_s[k]:
        return ""
    size, fw = bld.options.bucket_bytes, bld.wl.bucket_bytes
    return (
        f"DP-bound rank: rank {k} sends {_ms(wire[k])} of DP traffic per step on the wire (in buckets of "
        f"{size / MiB:g} MiB, each paying the collective's latency) against {_ms(r.stage_busy_s[k])} of its own "
        f"work: its reductions cannot all hide and the step ends when they do ({_ms(r.stage_end_s[k])}); the "
        f"estimate prices one collective per reduction with the framework's {fw / MiB:.0f} MiB buckets"
        + (" (--bucket-mb differs from them)" if abs(size - fw) > 1 else "")
    )


def _moe_slow_dp_stage(r: SimResult) -> int:
    """Pipeline rank whose DP the estimate prices (MoE: ``slowest_dp_workload``), or -1 (dense, one kind of rank)."""
    bld = r.builder
    if not bld.splits or bld.wl.dp_split not in bld.splits:
        return -1
    return bld.splits.index(bld.wl.dp_split)


def _estimate_rank(r: SimResult) -> int:
    """The pipeline rank the estimate reads a DualPipe breakdown off (``analytical.pipeline_ranks``): its busiest."""
    bld = r.builder
    ranks = pipeline_ranks("dualpipe", stage_times(bld.job, bld.wl, bld.costs))
    return max(range(len(ranks)), key=lambda i: ranks[i].total)  # the first of equals, as analytical.slowest_stage


def _dualpipe_ep_line(r: SimResult) -> str:
    """The EP traffic of the busiest DualPipe rank (m/2 micro-batches through each of its two model stages) against
    the estimate's, which counts its busiest rank the same way."""
    bld, e, b = r.builder, r.estimate, r.breakdown
    p, m, rk = bld.p, bld.m, r.busiest_stage
    per_mb = [ep_link(c.fwd) + ep_link(c.bwd) + ep_link(c.recompute) for c in bld.chunks[:p]]
    er = _estimate_rank(r)
    same = abs(b.comm_time_s["ep"] - e.comm_time_s["ep"]) <= 1e-6 * max(e.comm_time_s["ep"], 1e-12)
    return (
        f"EP traffic: rank {rk} runs model stage {rk}'s all-to-alls for {m // 2} micro-batches ({_ms(per_mb[rk])} of "
        f"wire time each) and stage {p - 1 - rk}'s for {m // 2} ({_ms(per_mb[p - 1 - rk])} each): "
        f"{_ms(b.comm_time_s['ep'])}, {b.comm_bytes_per_gpu['ep'] / 1e9:,.1f} GB per GPU, hidden or not; the "
        f"estimate counts its busiest rank, {er} (model stages {er} and {p - 1 - er}), the same way: "
        f"{_ms(e.comm_time_s['ep'])}, {e.comm_bytes_per_gpu['ep'] / 1e9:,.1f} GB"
        + ("" if same else " (another rank's passes)")
        + f" (ep_exposed {_ms(b.breakdown_s['ep_exposed'])} simulated vs {_ms(e.breakdown_s['ep_exposed'])} "
        "estimated)"
    )


def _dualpipe(r: SimResult) -> bool:
    """Whether the schedule is DualPipe: a device is a pipeline rank holding two model stages (r and p − 1 − r)."""
    return getattr(r.builder, "dual", "") == "dualpipe"


def _small(r: SimResult) -> float:
    """The least difference worth a sentence: 0.2% of the simulated step."""
    return 0.002 * r.breakdown.step_time_s


def _step_line(r: SimResult) -> str:
    """The opening line: simulated against estimated step, whose breakdown each reads, and the event count."""
    step, est, p, k = r.breakdown.step_time_s, r.estimate.step_time_s, r.builder.p, r.busiest_stage
    return (
        f"step: simulated {_ms(step)} vs estimated {_ms(est)} ({_pct(step, est)}); "
        + (
            f"breakdown of the busiest rank, {k} of {p} (model stages {k} and "
            f"{p - 1 - k}), the estimate's of its busiest rank, {_estimate_rank(r)}"
            if _dualpipe(r)
            else f"breakdown of the busiest stage, {k} of {p}"
        )
        + f"; {r.events:,} events"
    )


def _stage_pace_line(r: SimResult) -> str:
    """Uneven stages (the slowest sets the pace while the lightest idles), else a bubble unlike the estimate's."""
    sb, eb, bld = r.breakdown.breakdown_s, r.estimate.breakdown_s, r.builder
    p, v, m = bld.p, bld.v, bld.m
    busy = r.stage_busy_s
    hi, lo = max(range(p), key=busy.__getitem__), min(range(p), key=busy.__getitem__)
    if busy[r.busiest_stage] >= busy[hi] * (1 - 1e-9):  # equals (float noise): name the one the breakdown is read from
        hi = r.busiest_stage
    if p > 1 and busy[hi] - busy[lo] > 0.01 * busy[hi]:
        return _uneven_stages_line(r, hi, lo)
    if p > 1 and abs(sb["pp_bubble"] - eb["pp_bubble"]) > _small(r):
        return (
            f"bubble: simulated {_ms(sb['pp_bubble'])} vs estimated {_ms(eb['pp_bubble'])} "
            f"((p−1)/(v·m) = {(p - 1) / (v * m):.2%} of the ideal time; simulated {r.bubble_fraction:.2%})"
        )
    return ""


def _heavy_end_chunks(r: SimResult) -> list[str]:
    """The end chunks (embedding, logits and loss) that take longer than a plain chunk (the median of the middle)."""
    work = [c.fwd.compute + c.bwd.compute + c.recompute.compute for c in r.builder.chunks]
    plain = [w for k, w in enumerate(work) if 0 < k < len(work) - 1] or work
    ref = sorted(plain)[len(plain) // 2]
    ends = []
    if work[0] > 1.005 * ref:
        ends.append(f"the first chunk (with the embedding) takes {work[0] / ref:.2f}× a plain chunk")
    if work[-1] > 1.005 * ref:
        ends.append(f"the last chunk (with the logits and loss) takes {work[-1] / ref:.2f}× a plain chunk")
    return ends


def _uneven_stages_line(r: SimResult, hi: int, lo: int) -> str:
    """Stage ``hi`` works longest and sets the pace, stage ``lo`` idles: against the estimate's compute and bubble."""
    sb, eb, bld = r.breakdown.breakdown_s, r.estimate.breakdown_s, r.builder
    p, v, m = bld.p, bld.v, bld.m
    busy = r.stage_busy_s
    ends = _heavy_end_chunks(r)
    idle = r.breakdown.step_time_s - busy[lo]
    unit = "rank" if _dualpipe(r) else "stage"
    return (
        f"uneven stages: {unit} {hi} works {_ms(busy[hi])} per step, {unit} {lo} {_ms(busy[lo])} "
        f"({_pct(busy[hi], busy[lo])})" + (f"; {' and '.join(ends)}" if ends else "") + ". "
        f"{unit.capitalize()} {hi} sets the pace: the breakdown is its view (compute {_ms(sb['compute'])} vs "
        f"{_ms(eb['compute'])} estimated as m × the slowest {unit}; bubble {_ms(sb['pp_bubble'])} vs "
        f"{_ms(eb['pp_bubble'])} estimated as the other {unit}s' fill and drain"
        + ("" if unit == "rank" else " / v")
        + f"), while {unit} {lo} idles "
        f"{_ms(idle)} ({idle / busy[lo]:.1%} of its work, against (p−1)/(v·m) = {(p - 1) / (v * m):.1%} "
        f"for even stages)"
    )


def _pipeline_sends_line(r: SimResult) -> str:
    """Exposed pipeline sends unlike the estimate's, and which sends the estimate exposes for this schedule."""
    sb, eb, bld = r.breakdown.breakdown_s, r.estimate.breakdown_s, r.builder
    p, v = bld.p, bld.v
    if not (p > 1 and abs(sb["pp_exposed"] - eb["pp_exposed"]) > _small(r)):
        return ""
    line = (
        f"pipeline sends: exposed {_ms(sb['pp_exposed'])} simulated vs {_ms(eb['pp_exposed'])} estimated "
        f"(one send {_ms(bld.t_send)}). The estimate exposes "
    )
    if v == 1 and bld.job.plan.schedule == "1f1b":
        line += (
            "the fill and the steady state's round trips (a backward waits for the gradient of the "
            "forward it sent on, up to 2(p−1)/p sends per micro-batch)"
        )
    elif v > 1:
        line += f"the fill over every virtual-stage boundary, 2(p·v−1) = {2 * (p * v - 1)} sends"
    else:
        line += f"the fill, 2(p−1) = {2 * (p - 1)} sends"
    return line + (
        f"; in the schedule stage {r.busiest_stage} stalls whenever the next micro-batch's activation or "
        f"gradient is still on the wire"
    )


def _dp_lines(r: SimResult) -> list[str]:
    """The data-parallel reductions where they differ: gradient buckets (and a DP-bound rank), or ZeRO-3's."""
    b, e, bld = r.breakdown, r.estimate, r.builder
    sb, eb, small = b.breakdown_s, e.breakdown_s, _small(r)
    if bld.wl.dp_step and (
        abs(sb["dp_exposed"] - eb["dp_exposed"]) > small or abs(b.comm_time_s["dp"] - e.comm_time_s["dp"]) > small
    ):
        return [_gradient_buckets_line(r), _dp_bound_line(r)]
    if bld.wl.dp_microbatch and abs(sb["dp_exposed"] - eb["dp_exposed"]) > small:
        return [
            f"ZeRO-3: each block's parameters are gathered one block ahead (prefetch) and its gradients "
            f"reduce-scattered after its backward; exposed {_ms(sb['dp_exposed'])} simulated vs "
            f"{_ms(eb['dp_exposed'])} estimated (the estimate hides a micro-batch's gathers under its whole pass)"
        ]
    return []


def _gradient_buckets_line(r: SimResult) -> str:
    """The simulator's gradient buckets against the estimate's one collective: link time, exposed, the tail."""
    b, e, bld = r.breakdown, r.estimate, r.builder
    sb, eb = b.breakdown_s, e.breakdown_s
    k = _dp_rank(bld, r.busiest_stage)  # the rank whose DP both report (comm_time_s dp)
    size = bld.options.bucket_bytes
    line = (
        f"gradient buckets: stage {k} reduces its gradients in {bld.devices[k].buckets} buckets of "
        f"{size / MiB:g} MiB (--bucket-mb; default: the framework's, PyTorch DDP 25 MiB), the estimate in one "
        f"collective "
        f"with a last-bucket tail of {bld.wl.bucket_bytes / MiB:.0f} MiB. DP link time {_ms(b.comm_time_s['dp'])} vs "
        f"{_ms(e.comm_time_s['dp'])} (each bucket pays the collective's latency); exposed "
        f"{_ms(sb['dp_exposed'])} vs {_ms(eb['dp_exposed'])}"
    )
    if bld.ov.dp:
        line += f"; the optimizer waited {_ms(_tail_s(r))} after the last backward for the last buckets"
    if bld.wl.grads_sharded and bld.wl.micro_batches > 1:
        line += (
            f"; ZeRO-2 reduces the gradient shard after each of the {bld.wl.micro_batches} micro-batches "
            f"(DeepSpeed partition_gradients): the simulator bucket by bucket under each backward, the "
            f"estimate what one micro-batch's compute cannot hide"
        )
    return line


def _dualpipe_line(r: SimResult) -> str:
    """DualPipe's busiest rank: two model stages, half the micro-batches each, against the estimate's pricing."""
    b, e, bld = r.breakdown, r.estimate, r.builder
    sb, eb = b.breakdown_s, e.breakdown_s
    p, m, rk = bld.p, bld.m, r.busiest_stage
    per = [c.fwd.compute + c.bwd.compute + c.recompute.compute for c in bld.chunks[:p]]
    mean = (per[rk] + per[p - 1 - rk]) / 2
    return (
        f"DualPipe: rank {rk} runs model stage {rk} for the {m // 2} micro-batches fed at rank 0 and stage "
        f"{p - 1 - rk} for the {m // 2} fed at rank {p - 1}: {_ms(mean)} of compute per micro-batch, as the "
        f"estimate prices its busiest rank, {_estimate_rank(r)} (compute {_ms(sb['compute'])} simulated vs "
        f"{_ms(eb['compute'])}); bubble {_ms(sb['pp_bubble'])} vs {_ms(eb['pp_bubble'])}: the estimate charges "
        f"the fill and drain through the ranks nearer the ends with the paper's (PP/2 − 1)(F&B + B − 3W) per "
        f"kind of rank (DeepSeek-V3 Table 2), the simulator plays the reference's order with each forward-"
        f"backward pair as two passes, each after its own input; each rank holds and reduces both stages' "
        f"gradients (2× parameters: DP link time {_ms(b.comm_time_s['dp'])} vs {_ms(e.comm_time_s['dp'])})"
    )


def _ep_overlap_line(r: SimResult) -> str:
    """MoE with the EP overlap: its pairing of passes is priced, not played out on the timeline."""
    sb, eb, bld = r.breakdown.breakdown_s, r.estimate.breakdown_s, r.builder
    share = unpaired_share(bld.job, bld.m)
    return (
        f"EP overlap: each pass waits for its share of the priced exposed all-to-all (ep_exposed "
        f"{_ms(sb['ep_exposed'])} simulated vs {_ms(eb['ep_exposed'])} estimated); the timeline does not pair "
        f"passes itself: the exchanges hide per layer piece as analytical.paired_exposed prices the code's "
        f"pairing, and {share:.1%} of the passes (the warm-up forwards and cool-down backwards, the pipeline's "
        f"mean) run alone, spread over every pass rather than at the fill and drain"
    )


def _moe_gradients_line(r: SimResult) -> str:
    """MoE: the slowest DP rank's reduction also hides under the earlier stages' last backwards (the cool-down)."""
    sb, eb = r.breakdown.breakdown_s, r.estimate.breakdown_s
    slow_dp = _moe_slow_dp_stage(r)
    if not (slow_dp > 0 and sb["dp_exposed"] < eb["dp_exposed"] - _small(r)):
        return ""
    dense, experts = r.builder.wl.dp_split
    return (
        f"MoE gradients: the rank with the slowest DP is stage {slow_dp} ({dense / 1e6:,.0f} M dense parameters "
        f"over dp, {experts / 1e6:,.0f} M expert ones over edp); the estimate exposes its reduction as if it "
        f"began with the step's last backward, but in the schedule the {slow_dp} stage(s) before it still run "
        f"their last backwards (the cool-down) after its own: its buckets hide under them too (DP exposed "
        f"{_ms(sb['dp_exposed'])} simulated vs {_ms(eb['dp_exposed'])} estimated)"
    )


def _shared_nic_line(r: SimResult) -> str:
    """DP and PP traffic of a GPU that waited for (or shared) its NIC, which the estimate never assumes."""
    waited = {k: w for k, w in r.contention_wait_s.items() if w > 0}
    if not waited:
        return ""
    parts = ", ".join(f"{'DP collectives' if k == 'dp' else 'PP sends'} {_ms(w)}" for k, w in sorted(waited.items()))
    fair = r.builder.options.network == "flows"
    net = r.sim.network
    tcp = fair and net is not None and net.sharing == "tcp"
    how = "queue behind each other" if not fair else "share it TCP-fairly" if tcp else "share it at max-min fair rates"
    return (
        f"shared NIC: DP and PP traffic of a GPU both leave the node over its NIC share and {how} "
        f"({parts} {'lost to sharing' if fair else 'of waiting'}, all stages); the estimate assumes they never "
        "collide"
    )


def explain(r: SimResult) -> list[str]:
    """Why the simulated step differs from the estimate: a sentence with numbers for each part that differs."""
    if r.estimate is None:
        raise ValueError("explain needs the estimate: simulate(job, compare=True)")
    bld = r.builder
    moe = bld.wl.moe_layer is not None
    lines = [_step_line(r), _stage_pace_line(r), _pipeline_sends_line(r), *_dp_lines(r)]
    if _dualpipe(r):
        lines.append(_dualpipe_line(r))
        if moe:  # both count a rank's two stages, m/2 micro-batches each
            lines.append(_dualpipe_ep_line(r))
    if moe and hides_ep(bld.job):
        lines.append(_ep_overlap_line(r))
    lines += [_moe_gradients_line(r), _shared_nic_line(r)]
    out = [x for x in lines if x]
    if len(out) == 1:
        out.append("no part differs by more than 0.2% of the step: uniform stages, no contention")
    return out
