"""``commtax report``: one self-contained HTML page per job.

``collect(job, ...)`` runs the library (estimate, simulate, search, advise, scaling, the
communication wall, cost; optionally bench records, per-rank trace figures and other jobs) into a
``ReportData``; ``figures(data)`` turns it into chart descriptions (``report.svg``) and
``render_page(data)`` into one HTML string that needs nothing else: the styles and the few lines
of script (timeline zoom) are inline, figures are inline SVG, and a Content-Security-Policy of
``default-src 'none'`` forbids the page to load anything, so it reads the same offline.

Every number of the job's own estimate is on the page with its exact value in ``data-value``
(``data-key`` names the field of ``commtax estimate --json``), so tests check the page against
the command. Every chart has its table under it and a pattern or marker per series (readable
without colour), and the page has a print stylesheet and a narrow-window layout.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any

from commtax import __version__
from commtax.decide.plans import PlanRow
from commtax.errors import SpecError
from commtax.report import svg
from commtax.report.svg import BREAKDOWN_STYLES, Segment, Series, Style
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import BREAKDOWN_KEYS, Breakdown, part_keys
from commtax.spec import Job
from commtax.units import GB, memory_excess

PART_LABELS = {
    "compute": "compute",
    "recompute": "recompute",
    "tp_exposed": "TP exposed",
    "cp_exposed": "CP exposed",
    "pp_bubble": "pipeline bubble",
    "pp_exposed": "PP exposed",
    "dp_exposed": "DP exposed",
    "ep_exposed": "EP all-to-all exposed",
    "optimizer": "optimizer",
}
GROUP_LABELS = {
    "tp": "tensor parallel (TP)",
    "cp": "context parallel (CP)",
    "pp": "pipeline (PP)",
    "dp": "data parallel (DP)",
    "ep": "expert parallel (EP all-to-all)",
    "edp": "expert data parallel (EDP)",
}
EXPOSED_KEY = {"tp": "tp_exposed", "cp": "cp_exposed", "pp": "pp_exposed", "dp": "dp_exposed", "ep": "ep_exposed"}
TRACE_FIELDS = (
    "window_s",
    "compute_s",
    "comm_s",
    "overlapped_comm_s",
    "exposed_comm_s",
    "idle_s",
    "comm_tax",
    "comm_share",
)
DEFINITION_NAMES = {"comm_tax": "comm tax", "comm_share": "comm share", "mfu": "MFU, HFU", "step": "step time"}
DEFINITIONS = {
    "comm_tax": "comm tax = exposed communication time / step time: the share of the step the GPUs wait for data. "
    "This is what the job pays.",
    "comm_share": "comm share = total communication time / (total communication time + compute time), as if nothing "
    "overlapped: what the seed articles call the “communication tax”. It is an upper bound on what "
    "communication could cost, not what the job pays.",
    "mfu": "MFU = model FLOPs per second per GPU / dense peak FLOP/s of the training precision; model FLOPs exclude "
    "recompute. HFU counts the recompute pass too.",
    "step": "step time = compute + recompute + exposed TP + exposed CP + pipeline bubble + exposed PP + exposed DP + "
    "optimizer.",
}
# MoE jobs' exposed all-to-all: Paul Tol's "vibrant" orange, a pattern of its own colour (svg's eight are taken)
PART_STYLES = {**BREAKDOWN_STYLES, "ep_exposed": Style("#ee7733", "diag")}
SEGMENTS = tuple(Segment(k, PART_LABELS[k], PART_STYLES[k]) for k in BREAKDOWN_KEYS)


def chart_keys(breakdowns: Sequence[Breakdown]) -> tuple[str, ...]:
    """The parts a stacked bar of these breakdowns shows: the MoE parts when any of them has experts."""
    return max((part_keys(b) for b in breakdowns), key=len, default=BREAKDOWN_KEYS)


def comm_groups(b: Breakdown) -> tuple[str, ...]:
    """Communication groups of a breakdown in display order (MoE jobs add ep, and edp where it is its own group)."""
    return ("tp", "cp", "pp", "dp") + tuple(g for g in ("ep", "edp") if g in b.comm_time_s)


def exposed_sum(parts: dict[str, float]) -> float:
    """Exposed communication of a breakdown, every group (MoE: the all-to-all too)."""
    return sum(parts.get(k, 0.0) for k in ("tp_exposed", "cp_exposed", "pp_exposed", "dp_exposed", "ep_exposed"))


GANTT_KINDS = (
    Segment("compute", "compute", BREAKDOWN_STYLES["compute"]),
    Segment("recompute", "recompute (short bars)", BREAKDOWN_STYLES["recompute"]),
    Segment("optimizer", "optimizer", BREAKDOWN_STYLES["optimizer"]),
    Segment("tp", "TP collective", BREAKDOWN_STYLES["tp_exposed"]),
    Segment("cp", "CP exchange", BREAKDOWN_STYLES["cp_exposed"]),
    Segment("pp", "pipeline send", BREAKDOWN_STYLES["pp_exposed"]),
    Segment("dp", "DP gradient traffic", BREAKDOWN_STYLES["dp_exposed"]),
)


class TraceUnavailable(RuntimeError):
    """``commtax.trace`` is not installed in this build."""


# ----------------------------------------------------------------------------- what the page shows
@dataclass
class OtherJob:
    name: str
    job: Job
    breakdown: Breakdown
    cost: Any | None  # cost.TrainingCost
    cost_note: str = ""


@dataclass
class BenchSet:
    """Collective records of one bench file, and the cluster whose model curve they are drawn against."""

    path: str
    records: list[dict]
    cluster: dict
    cluster_label: str


@dataclass
class ReportData:
    name: str
    job: Job
    breakdown: Breakdown
    cost: Any | None = None  # cost.TrainingCost
    cost_note: str = ""
    sim: Any | None = None  # sim.SimResult
    sim_note: str = ""
    scaling: list[Any] = field(default_factory=list)  # compare.ScalePoint (best plan per scale)
    own_scaling: list[tuple[int, Breakdown | None, str]] = field(default_factory=list)
    wall: list[Any] = field(default_factory=list)  # demo.WallRow
    wall_breakdowns: list[tuple[float, Breakdown]] = field(default_factory=list)
    search: Any | None = None  # search.SearchResult
    search_note: str = ""
    searched: bool = False  # a plan search ran (plans chart, best-plan scaling)
    advice: Any | None = None  # advise.Advice
    advice_note: str = ""
    bench: list[BenchSet] = field(default_factory=list)
    trace: dict[str, dict[str, float]] | None = None
    others: list[OtherJob] = field(default_factory=list)


def default_scale(job: Job) -> list[int]:
    """¼×, ½×, 1×, 2×, 4× the job's GPUs, whole nodes only."""
    n, g = job.cluster.num_gpus, job.cluster.gpus_per_node
    counts = sorted({int(n * f) for f in (0.25, 0.5, 1, 2, 4) if n * f >= 1 and float(n * f).is_integer()})
    return [c for c in counts if c % g == 0 or c < g] or [n]


def _cost(job: Job, b: Breakdown, prices: Any | None, tokens: float | None = None) -> tuple[Any | None, str]:
    from commtax.decide.cost import job_training_cost, load_prices

    try:
        return job_training_cost(job, b.tokens_per_s, prices or load_prices(), tokens), ""
    except SpecError as e:
        return None, str(e)


def own_plan_scaling(job: Job, counts: Sequence[int]) -> list[tuple[int, Breakdown | None, str]]:
    """The job's own plan (tp, pp, cp, …) at each GPU count, DP taking up the difference (fitting memory or not)."""
    from commtax.decide.compare import own_plan_scaling as points

    return [(p.num_gpus, p.breakdown, p.reason or "") for p in points(job, list(counts), fitting_only=False)]


def collect(
    job: Job,
    name: str,
    top: int = 5,
    scale: Sequence[int] | None = None,
    bench: Sequence[BenchSet] = (),
    trace: dict[str, dict[str, float]] | None = None,
    others: Sequence[tuple[str, Job]] = (),
    workers: int | None = 1,
    prices: Any | None = None,
    plan_search: bool = True,
    advice: bool = True,
) -> ReportData:
    """Run everything the page shows. Parts that cannot be computed for this job say why instead. ``plan_search``
    adds the plan search, the best plan at each scale and the search's best plan among the advice (the slow part);
    ``advice`` the changes around the job's plan."""
    from commtax.decide.demo import communication_wall, scaled_gpu

    b = estimate(job)
    data = ReportData(name, job, b, bench=list(bench), trace=trace)
    data.cost, data.cost_note = _cost(job, b, prices)
    try:
        from commtax.schedule.sim import simulate

        data.sim = simulate(job, compare=False)
    except (SpecError, ValueError) as e:  # SimError: a plan the simulator cannot run; the page says so
        data.sim_note = f"not simulated: {e}"
    data.wall = communication_wall(job)
    for row in data.wall:
        cluster = job.cluster.model_copy(update={"gpu": scaled_gpu(job.cluster.gpu, row.compute_speedup)})
        data.wall_breakdowns.append((row.compute_speedup, estimate(job.model_copy(update={"cluster": cluster}))))
    counts = list(scale or default_scale(job))
    data.own_scaling = own_plan_scaling(job, counts)
    data.searched = plan_search
    if plan_search:
        from commtax.decide.compare import scaling
        from commtax.decide.search import search

        data.scaling = scaling(job, counts, workers=workers)
        try:
            data.search = search(job, top=top, workers=workers)
        except SpecError as e:
            data.search_note = str(e)
    else:
        data.search_note = "not searched (the page is about the job's plan); `commtax report --search` adds the search"
    if advice:  # the changes around the job's plan; with the search, its best plan is one of them
        from commtax.decide.advise import advise

        try:
            data.advice = advise(job, search_best=plan_search, workers=workers)
        except SpecError as e:
            data.advice_note = str(e)
    for label, other in others:
        ob = estimate(other)
        oc, note = _cost(other, ob, prices, tokens=data.cost.tokens if data.cost else job.training.tokens)
        data.others.append(OtherJob(label, other, ob, oc, note))
    return data


# ----------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Fig:
    id: str  # also the file name under --plots
    chart: svg.Chart
    caption: str = ""


def step_chart(rows: Sequence[tuple[str, Breakdown]], title: str) -> svg.StackedBars:
    keys = chart_keys([b for _, b in rows])
    return svg.StackedBars(
        title,
        tuple(r for r, _ in rows),
        tuple(Segment(k, PART_LABELS[k], PART_STYLES[k]) for k in keys),
        tuple(tuple(b.breakdown_s.get(k, 0.0) for k in keys) for _, b in rows),
        "s",
    )


def comm_chart(b: Breakdown) -> svg.Bars:
    groups = [g for g in comm_groups(b) if b.comm_time_s[g] > 0 or b.comm_bytes_per_gpu[g] > 0] or ["tp"]
    return svg.Bars(
        "Communication per GPU per step: link time vs exposed time",
        tuple(GROUP_LABELS[g] for g in groups),
        ("link time (wire busy)", "exposed (step waits)"),
        tuple((b.comm_time_s[g], b.breakdown_s.get(EXPOSED_KEY.get(g, ""), 0.0)) for g in groups),
        "s",
        styles=(Style("#4477aa", "solid"), Style("#ee6677", "diag")),
    )


def bytes_chart(b: Breakdown) -> svg.Bars:
    groups = [g for g in comm_groups(b) if b.comm_bytes_per_gpu[g] > 0] or ["tp"]
    return svg.Bars(
        "Bytes sent per GPU per step, by group",
        tuple(GROUP_LABELS[g] for g in groups),
        ("GB sent",),
        tuple((b.comm_bytes_per_gpu[g] / GB,) for g in groups),
        "GB",
        styles=(Style("#228833", "vlines"),),
    )


def memory_chart(b: Breakdown, capacity_gib: float) -> svg.StackedBars:
    keys = [k for k in b.memory_gib_per_gpu if k != "total"]
    styles = svg.SERIES_STYLES
    segs = tuple(Segment(f"m{i}", k, styles[i % len(styles)]) for i, k in enumerate(keys))
    return svg.StackedBars(
        "Memory per GPU (busiest pipeline stage)",
        ("needed",),
        segs,
        (tuple(b.memory_gib_per_gpu[k] for k in keys),),
        "GiB",
        digits=3,
        limit=capacity_gib,
        limit_label="GPU memory",
    )


def gantt_chart(sim_result: Any) -> svg.Gantt:
    """The simulated replica: one row per stage and stream that has work (the bubble is the compute rows' idle)."""
    from commtax.schedule.sim.chrome_trace import spans

    sim = sim_result.sim
    drawn = [(sid, start, dur, kind) for _, sid, start, dur, kind in spans(sim) if dur > 0]
    used = sorted({sid for sid, *_ in drawn}, key=lambda s: (sim.streams[s].device, s))
    row_of = {sid: i for i, sid in enumerate(used)}
    rows = tuple(f"stage {sim.streams[s].device} {sim.streams[s].name.replace('_', ' ')}" for s in used)
    total = max((start + dur for _, start, dur, _ in drawn), default=0.0)
    raw = [svg.Span(row_of[sid], start, dur, kind) for sid, start, dur, kind in drawn]
    merged = svg.merge_spans(raw, total * 1e-6)
    idle = tuple(row_of[s] for s in used if sim.streams[s].name == "compute")
    p = sim_result.builder.p
    return svg.Gantt(
        f"Simulated step of one pipeline replica ({p} stage{'s' if p > 1 else ''})",
        rows,
        tuple(merged),
        GANTT_KINDS,
        total,
        idle,
        row_groups=tuple(sim.streams[s].device for s in used),
    )


def gantt_windows(g: svg.Gantt, stages: int) -> list[tuple[str, svg.Gantt, str]]:
    """Close-ups of the start (pipeline fill) and the end (drain, gradient reduction, optimizer) of the step,
    so the bubble reads on paper too: four times as long as the last stage waits for its first input."""
    last_compute = max(g.idle_rows, default=0)
    first = min((s.start_s for s in g.spans if s.row == last_compute), default=0.0)
    width = min(0.5 * g.total_s, max(0.02 * g.total_s, 4 * first))
    out = []
    if stages > 1:
        out.append(
            (
                "timeline-start",
                replace(
                    g,
                    title=f"Start of the step: pipeline fill (first {width:.3g} s)",
                    window=(0.0, width),
                    zoomable=False,
                ),
                "Close-up: later stages wait (hatched) for the first micro-batch to reach them.",
            )
        )
    out.append(
        (
            "timeline-end",
            replace(
                g,
                title=f"End of the step: drain, DP gradient reduction, optimizer (last {width:.3g} s)",
                window=(g.total_s - width, g.total_s),
                zoomable=False,
            ),
            (
                "Close-up: earlier stages finish first and wait; the last gradient buckets and the optimizer "
                "close the step."
            ),
        )
    )
    return out


def scaling_chart(data: ReportData) -> svg.Lines | None:
    best = [(p.num_gpus, p.breakdown) for p in data.scaling if p.breakdown is not None]
    own = [(n, b) for n, b, _ in data.own_scaling if b is not None]
    series = []
    st = svg.SERIES_STYLES
    if best:
        xs = tuple(float(n) for n, _ in best)
        series += [
            Series("comm tax, best plan", xs, tuple(b.comm_tax for _, b in best), st[1]),
            Series("MFU, best plan", xs, tuple(b.mfu for _, b in best), st[0]),
        ]
    if own:
        xs = tuple(float(n) for n, _ in own)
        series += [
            Series("comm tax, this plan", xs, tuple(b.comm_tax for _, b in own), st[3]),
            Series("comm share, this plan", xs, tuple(b.comm_share for _, b in own), st[5]),
            Series("MFU, this plan", xs, tuple(b.mfu for _, b in own), st[2]),
        ]
    if not series:
        return None
    return svg.Lines(
        "Comm tax and MFU against the number of GPUs",
        tuple(series),
        "GPUs",
        "% of step / of peak",
        x_log=2,
        y_min=0.0,
        y_percent=True,
    )


def wall_chart(data: ReportData) -> svg.StackedBars:
    rows = [(f"compute ×{k:g}", b) for k, b in data.wall_breakdowns]
    return step_chart(rows, "The communication wall: faster compute, same network")


def plans_chart(data: ReportData) -> svg.StackedBars | None:
    if data.search is None or not data.search.top:
        return None
    rows = [("this plan", data.breakdown)]
    labels = distinct_labels([p for p, _ in data.search.top])
    rows += [(f"#{i + 1} {label}", b) for i, (label, (_, b)) in enumerate(zip(labels, data.search.top))]
    return step_chart(rows, "This plan and the best plans from search")


LABEL_FIELDS = ("recompute", "sequence_parallel", "grad_comm_dtype", "schedule", "framework")


def distinct_labels(plans: list[PlanRow]) -> list[str]:
    """``plan_label`` of each plan, with the fields that tell apart plans whose labels collide appended
    ("tp2 pp8 dp16 vp10 mb1 z1 recompute=full" next to "… recompute=selective")."""
    labels = [plan_label(p) for p in plans]
    for label in {x for x in labels if labels.count(x) > 1}:
        group = [i for i, x in enumerate(labels) if x == label]
        differ = [k for k in LABEL_FIELDS if len({str(plans[i].get(k)) for i in group}) > 1]
        for i in group:
            labels[i] = " ".join([label, *(f"{k}={plans[i].get(k)}" for k in differ)])
    return labels


def advice_chart(data: ReportData, limit: int = 12) -> svg.Bars | None:
    if data.advice is None or not data.advice.changes:
        return None
    changes = [c for c in data.advice.changes if c.fits_after][:limit] or data.advice.changes[:limit]
    return svg.Bars(
        "Each change re-estimated: step time change",
        tuple(c.label for c in changes),
        ("step time",),
        tuple((c.step_change,) for c in changes),
        percent=True,
        styles=(Style("#4477aa", "diag"),),
    )


def plan_label(p: PlanRow) -> str:
    """A plan as the page's tables name it: ``tp2 pp8 dp16 vp10 mb1 z1`` (cp and vp where above 1)."""
    parts = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"]
    if p.cp > 1:
        parts.append(f"cp{p.cp}")
    if p.vp > 1:
        parts.append(f"vp{p.vp}")
    parts.append(f"mb{p.micro_batch}")
    parts.append(f"z{p.zero}")
    return " ".join(parts)


def bench_groups(bs: BenchSet) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in bs.records:
        if r.get("op") == "gemm" or "message_bytes" not in r or r.get("world_size", 1) < 2:
            continue
        key = (r["op"], r["world_size"], r.get("nodes", 1), r.get("ranks_per_node", r["world_size"]))
        groups.setdefault(key, []).append(r)
    return groups


def bench_chart(bs: BenchSet, key: tuple, records: list[dict]) -> tuple[svg.Lines, str]:
    """Measured busbw (markers) and the model's (line, same colour) per implementation, against message size."""
    from commtax.costs.collectives import bus_factor
    from commtax.measure.calibrate import IMPL_ALGORITHM, levels_from_cluster, predicted_s

    op, n, nodes, _ = key
    intra, inter = levels_from_cluster(bs.cluster)
    series: list[Series] = []
    errors = []
    for i, impl in enumerate(sorted({r["impl"] for r in records})):
        rs = sorted((r for r in records if r["impl"] == impl), key=lambda r: r["message_bytes"])
        st = svg.series_style(i)
        xs = tuple(float(r["message_bytes"]) for r in rs)
        series.append(
            Series(
                f"{impl} measured",
                xs,
                tuple(float(r["busbw_GBps"]) for r in rs),
                Style(st.color, st.pattern, "", st.marker),
                points_only=True,
            )
        )
        if impl in IMPL_ALGORITHM or op in ("all_to_all", "send_recv"):
            pred = [predicted_s(r, intra, inter) for r in rs]
            bf = bus_factor(op, n)
            series.append(
                Series(
                    f"{impl} model",
                    xs,
                    tuple(r["message_bytes"] / t * bf / GB for r, t in zip(rs, pred)),
                    Style(st.color, st.pattern, "6 3", "none"),
                )
            )
            errors += [f"{impl} {100 * (t / r['time_s'] - 1):+.1f}%" for r, t in zip(rs, pred)][-1:]
    title = f"{op} on {n} ranks ({nodes} node{'s' if nodes > 1 else ''}): measured vs model"
    note = f"Model: commtax.costs.collectives on {bs.cluster_label}; error of the model at the largest size: " + (
        ", ".join(errors) or "—"
    )
    return svg.Lines(title, tuple(series), "message size", "busbw (GB/s)", x_log=2, x_fmt="bytes", digits=3), note


def trace_chart(per_rank: dict[str, dict[str, float]], predicted: Breakdown | None) -> svg.StackedBars:
    segs = (
        Segment("compute", "compute", BREAKDOWN_STYLES["compute"]),
        Segment("exposed", "exposed communication", BREAKDOWN_STYLES["tp_exposed"]),
        Segment("idle", "idle / bubble", BREAKDOWN_STYLES["pp_bubble"]),
    )
    rows, vals = [], []
    if predicted is not None:
        b = predicted.breakdown_s
        exposed = exposed_sum(b)
        rows.append("predicted")
        vals.append((b["compute"] + b["recompute"] + b["optimizer"], exposed, b["pp_bubble"]))
    for rank, f in per_rank.items():
        rows.append(f"rank {rank}")
        vals.append((f.get("compute_s", 0.0), f.get("exposed_comm_s", 0.0), f.get("idle_s", 0.0)))
    return svg.StackedBars("Measured step per rank (trace) vs predicted", tuple(rows), segs, tuple(vals), "s")


def figures(data: ReportData) -> list[Fig]:
    """Every chart of the page, in page order (``--plots`` writes the same list)."""
    b, job = data.breakdown, data.job
    figs = [
        Fig("step", step_chart([(data.name, b)], "Where the step goes"), DEFINITIONS["step"]),
        Fig(
            "comm-time",
            comm_chart(b),
            "Link time: how long each group's traffic keeps the wire busy per step "
            "(before overlap). Exposed: how much of it the step waits for.",
        ),
        Fig("comm-bytes", bytes_chart(b), "Bytes one GPU sends per step (message × bus factor, nccl-tests)."),
        Fig(
            "memory",
            memory_chart(b, job.cluster.gpu.mem_GiB),
            f"Dashed line: {job.cluster.gpu.name} memory as the driver reports it.",
        ),
    ]
    if data.sim is not None:
        gantt = gantt_chart(data.sim)
        figs.append(
            Fig(
                "timeline",
                gantt,
                "One data-parallel replica as the event simulator runs it (other replicas are identical). "
                "Hatched: the compute stream is idle — the pipeline bubble at the ends, waits for "
                "communication in between.",
            )
        )
        figs += [Fig(fid, chart, caption) for fid, chart, caption in gantt_windows(gantt, data.sim.builder.p)]
        figs.append(
            Fig(
                "sim-vs-estimate",
                step_chart(
                    [("estimate", b), ("simulate", data.sim.breakdown)], "Analytical estimate vs event simulation"
                ),
                "The same Breakdown fields from both schedules.",
            )
        )
    sc = scaling_chart(data)
    if sc is not None:
        figs.append(
            Fig(
                "scaling",
                sc,
                "Best plan: commtax search at each size (same model, batch and cluster kind). "
                "This plan: the job's tp, pp, cp, vp, micro-batch and ZeRO stage, DP growing.",
            )
        )
    figs.append(
        Fig(
            "wall",
            wall_chart(data),
            "Every GPU peak FLOP/s ×2 and ×4, links unchanged (the second seed article's communication wall).",
        )
    )
    pc = plans_chart(data)
    if pc is not None:
        figs.append(Fig("plans", pc, "Top plans that fit memory, ranked by step time."))
    ac = advice_chart(data)
    if ac is not None:
        figs.append(Fig("advice", ac, "Negative is faster. Each change is re-estimated with the full model."))
    k = 0
    for bs in data.bench:
        for key, recs in bench_groups(bs).items():
            chart, note = bench_chart(bs, key, recs)
            k += 1
            figs.append(Fig(f"bench-{k}", chart, note))
    if data.trace:
        figs.append(Fig("trace", trace_chart(data.trace, b), "Per rank, from the profiler traces."))
    if data.others:
        rows = [(data.name, b)] + [(o.name, o.breakdown) for o in data.others]
        figs.append(
            Fig("compare", step_chart(rows, "This job and the others, side by side"), "Each job with its own plan.")
        )
    return figs


# ----------------------------------------------------------------------------- HTML pieces
def num(key: str, value: float | bool | None, shown: str) -> str:
    """A number of the job's estimate: ``shown`` to the reader, the exact value for machines."""
    v = json.dumps(value)
    return f'<span class="num" data-key="{escape(key)}" data-value="{escape(v, quote=True)}">{escape(shown)}</span>'


def tokens_text(n: float) -> str:
    for unit, size in (("trillion", 1e12), ("billion", 1e9), ("million", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,.0f}"


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def step_band(b: Breakdown) -> str:
    """The 80% interval of the step under its central value: the numbers, and the band drawn to scale (0 to the
    p90 end), the central step a tick in it."""
    if b.step_time_s_p10 is None:
        return ""
    lo, hi, mid = b.step_time_s_p10, b.step_time_s_p90, b.step_time_s
    left, width, tick = 100 * lo / hi, 100 * (hi - lo) / hi, 100 * mid / hi
    return (
        f" · 80% interval {num('step_time_s_p10', lo, secs(lo))}–{num('step_time_s_p90', hi, secs(hi))}"
        f'<span class="band" role="img" aria-label="80% interval of the step time" '
        f'style="display:block;position:relative;height:8px;margin-top:4px;background:#eee">'
        f'<span style="position:absolute;left:{left:.1f}%;width:{width:.1f}%;height:100%;background:#9cc3e6"></span>'
        f'<span style="position:absolute;left:{tick:.1f}%;width:2px;height:100%;background:#1f4e79"></span></span>'
    )


def secs(x: float) -> str:
    return f"{x:.4f} s" if x < 10 else f"{x:.3f} s"


NUMERIC = re.compile(r"^\s*(?:[-+−×$#~]|—\s*$)?\s*[\d.,]*\d?")


def table(
    head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "", raw: bool = False, cls: str = ""
) -> str:
    """A table; ``raw`` cells are HTML already (e.g. ``num`` spans), others are escaped."""
    cell = (lambda s: s) if raw else escape
    h = "".join(f'<th scope="col">{escape(x)}</th>' for x in head)
    body = "".join(
        "<tr>"
        + "".join(
            (
                f'<th scope="row">{cell(r[0])}</th>'
                if i == 0
                else f"<td>{cell(c)}</td>"
                if raw or NUMERIC.match(c)
                else f'<td class="t">{cell(c)}</td>'
            )
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    c = f' class="{cls}"' if cls else ""
    return f'<div class="tablewrap"><table{c}>{cap}<thead><tr>{h}</tr></thead><tbody>{body}</tbody></table></div>'


def figure(fig: Fig, extra: str = "", table_html: str | None = None) -> str:
    """The chart, its caption and its table view (``table_html`` replaces the chart's own table)."""
    head, rows = fig.chart.table()
    controls = ""
    if isinstance(fig.chart, svg.Gantt) and fig.chart.zoomable:
        controls = (
            f'<div class="controls" data-for="chart-{fig.id}" role="group" aria-label="timeline zoom">'
            '<button type="button" data-zoom="in">zoom in</button>'
            '<button type="button" data-zoom="out">zoom out</button>'
            '<button type="button" data-zoom="reset">whole step</button>'
            '<label>pan <input type="range" min="0" max="1000" value="0" data-pan="1"></label>'
            '<span class="zoomlevel" aria-live="polite">×1</span></div>'
        )
    drawing = svg.render(fig.chart, f"chart-{fig.id}")
    return (
        f'<figure id="fig-{fig.id}">{controls}<div class="chartwrap">{drawing}</div>'
        f"<figcaption>{escape(fig.caption)}</figcaption>{extra}"
        f'<details class="tableview" open><summary>Table: {escape(fig.chart.title)}</summary>'
        f"{table_html if table_html is not None else table(head, rows)}</details></figure>"
    )


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}" aria-labelledby="{sid}-h"><h2 id="{sid}-h">{escape(title)}</h2>{body}</section>'


def job_description(job: Job) -> str:
    m, c, p, t = job.model, job.cluster, job.plan, job.training
    return (
        f"{m.name} ({m.layers} layers, hidden {m.hidden}) · {c.num_gpus}× {c.gpu.name}, "
        f"{c.gpus_per_node} per node, {c.intra_node.name} + {c.nics_per_node}× {c.inter_node.name} · "
        f"TP={p.tp} PP={p.pp} DP={job.dp} CP={p.cp} "
        f"VP={p.vp}, ZeRO-{p.zero}, recompute {p.recompute}, micro-batch {p.micro_batch}, {p.schedule} · "
        f"{t.global_batch} × {t.seq_len} tokens per step, {t.precision}"
    )


def summary_section(data: ReportData) -> str:
    b, cap = data.breakdown, data.job.cluster.gpu.mem_GiB
    html = [
        _cards_html(_summary_cards(data)),
        _fit_line(data),
        _definitions_html(),
        '<div class="tables">',
        _parts_table(b),
        _comm_table(b),
        _memory_table(b, cap),
        "</div>",
    ]
    if data.cost is not None:
        html.append(_cost_table(data.cost))
    elif data.cost_note:
        html.append(f'<p class="note">Cost not computed: {escape(data.cost_note)}</p>')
    if b.notes:
        html.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in b.notes) + "</ul>")
    return section("summary", "Summary", "".join(html))


def _fit_line(data: ReportData) -> str:
    """Whether the plan fits memory, and what to try when it does not: the first thing a reader must not miss."""
    b, job = data.breakdown, data.job
    cap = job.cluster.gpu.mem_GiB
    mem = b.memory_gib_per_gpu["total"]
    if b.fits:
        return (
            f'<p class="fit ok">✓ {num("fits", b.fits, "Fits in memory")}: '
            f"{num('memory_gib_per_gpu.total', mem, f'{mem:.1f} GiB')} of {cap:.1f} GiB per GPU.</p>"
        )
    return (
        f'<p class="fit bad" role="alert">✗ {num("fits", b.fits, "Does NOT fit in memory")}: '
        f"{num('memory_gib_per_gpu.total', mem, f'{mem:.1f} GiB')} needed per GPU ({memory_excess(mem, cap)} on "
        f"{escape(job.cluster.gpu.name)}). Try a higher plan.zero, recompute: full, a smaller micro-batch or larger "
        "tp/pp — the plans below fit.</p>"
    )


def _tokens_per_gpu_text(b) -> str:
    """Tokens/s per GPU, with its 80% interval where the breakdown carries one."""
    text = num("tokens_per_s_per_gpu", b.tokens_per_s_per_gpu, f"{b.tokens_per_s_per_gpu:,.1f}") + " per GPU"
    if b.tokens_per_s_per_gpu_p10 is None:
        return text
    return (
        text
        + " (80%: "
        + num("tokens_per_s_per_gpu_p10", b.tokens_per_s_per_gpu_p10, f"{b.tokens_per_s_per_gpu_p10:,.1f}")
        + "–"
        + num("tokens_per_s_per_gpu_p90", b.tokens_per_s_per_gpu_p90, f"{b.tokens_per_s_per_gpu_p90:,.1f}")
        + ")"
    )


def _summary_cards(data: ReportData) -> list[tuple[str, str, str]]:
    """The headline figures as (title, value, subtitle) cards; days and $ only where the job gives them."""
    b, job = data.breakdown, data.job
    cap = job.cluster.gpu.mem_GiB
    mem = b.memory_gib_per_gpu["total"]
    cards = [
        ("step time", num("step_time_s", b.step_time_s, secs(b.step_time_s)), "one optimizer step" + step_band(b)),
        ("tokens/s", num("tokens_per_s", b.tokens_per_s, f"{b.tokens_per_s:,.0f}"), _tokens_per_gpu_text(b)),
        (
            "MFU",
            num("mfu", b.mfu, pct(b.mfu)),
            "HFU "
            + num("hfu", b.hfu, pct(b.hfu))
            + " · "
            + num("tflops_per_gpu", b.tflops_per_gpu, f"{b.tflops_per_gpu:.1f}")
            + " model TFLOP/s per GPU",
        ),
        ("comm tax", num("comm_tax", b.comm_tax, pct(b.comm_tax)), "exposed communication / step — what the job pays"),
        (
            "comm share",
            num("comm_share", b.comm_share, pct(b.comm_share)),
            "communication / (communication + compute), no overlap — the seed articles' “tax”",
        ),
        (
            "memory per GPU",
            num("memory_gib_per_gpu.total", mem, f"{mem:.1f} GiB"),
            f"of {cap:.1f} GiB — " + ("fits" if b.fits else "<strong>does not fit</strong>"),
        ),
    ]
    if b.days_to_train is not None:
        cards.append(
            (
                "days to train",
                num("days_to_train", b.days_to_train, f"{b.days_to_train:,.1f}"),
                f"{tokens_text(job.training.tokens)} tokens at this rate" + ("" if b.fits else ", if it fit"),
            )
        )
    if data.cost is not None:
        c = data.cost
        cards.append(
            (
                "$ per billion tokens",
                f'<span class="num-cost">${c.owned_usd_per_B_tokens:,.2f}</span>',
                f"owned (depreciation + power); ${c.rented_usd_per_B_tokens:,.2f} rented"
                + ("" if b.fits else "; if it fit"),
            )
        )
    return cards


def _cards_html(cards: list[tuple[str, str, str]]) -> str:
    """The cards as one row of boxes (values are HTML already: they carry their JSON key for the page's tests)."""
    boxes = "".join(
        f'<div class="card"><div class="label">{escape(title)}</div><div class="value">{value}</div>'
        f'<div class="sub">{sub}</div></div>'
        for title, value, sub in cards
    )
    return f'<div class="cards">{boxes}</div>'


def _definitions_html() -> str:
    """comm tax, comm share, MFU and busbw as DESIGN.md defines them, beside the figures that use them."""
    return (
        '<dl class="defs">'
        + "".join(f"<dt>{escape(DEFINITION_NAMES[k])}</dt><dd>{escape(v)}</dd>" for k, v in DEFINITIONS.items())
        + "</dl>"
    )


def _parts_table(b) -> str:
    """The step part by part, each with its share of the step."""
    rows = [
        [
            PART_LABELS[k],
            num(f"breakdown_s.{k}", b.breakdown_s[k], f"{b.breakdown_s[k]:.4f}"),
            pct(b.breakdown_s[k] / b.step_time_s if b.step_time_s else 0.0),
        ]
        for k in part_keys(b)
    ]
    rows.append(["step time", num("step_time_s", b.step_time_s, f"{b.step_time_s:.4f}"), "100.0%"])
    return table(["component", "seconds", "share of step"], rows, "The step, part by part", raw=True)


def _comm_table(b) -> str:
    """Bytes, link time and exposed time per communication group (DP's exposed time is one figure for its ops)."""
    rows = [
        [
            GROUP_LABELS[g],
            num(f"comm_bytes_per_gpu.{g}", b.comm_bytes_per_gpu[g], f"{b.comm_bytes_per_gpu[g] / GB:,.2f} GB"),
            num(f"comm_time_s.{g}", b.comm_time_s[g], f"{b.comm_time_s[g]:.4f}"),
            f"{b.breakdown_s[EXPOSED_KEY[g]]:.4f}" if g in EXPOSED_KEY else "in DP exposed",
        ]
        for g in comm_groups(b)
    ]
    return table(
        ["group", "bytes sent per GPU", "link time (s)", "exposed (s)"],
        rows,
        "Communication per GPU per step",
        raw=True,
    )


def _memory_table(b, cap_GiB: float) -> str:
    """Memory per GPU part by part, against the GPU's capacity."""
    rows = [[k, num(f"memory_gib_per_gpu.{k}", v, f"{v:.2f}")] for k, v in b.memory_gib_per_gpu.items()]
    rows.append(["GPU memory", f"{cap_GiB:.2f}"])
    return table(["part", "GiB"], rows, "Memory per GPU", raw=True)


def _cost_table(c) -> str:
    """The run's days, energy and dollars (commtax.decide.cost)."""
    rows = [
        ["tokens", tokens_text(c.tokens)],
        ["days", f"{c.days:,.1f}"],
        ["GPU-hours", f"{c.gpu_hours:,.0f}"],
        ["energy (MWh, facility)", f"{c.energy_MWh:,.1f}"],
        ["$ owned", f"{c.owned_usd:,.0f}"],
        ["$ rented", f"{c.rented_usd:,.0f}"],
        ["$ per B tokens, owned", f"{c.owned_usd_per_B_tokens:,.2f}"],
        ["$ per B tokens, rented", f"{c.rented_usd_per_B_tokens:,.2f}"],
        ["cluster capex ($)", f"{c.capex_usd:,.0f}"],
        ["racks", f"{c.racks}"],
    ]
    return table(
        ["cost of the run", "value"],
        rows,
        "Cost (commtax.decide.cost, prices from catalog/prices.yaml with sources)",
    )


def wall_table(data: ReportData) -> str:
    rows = [[f"×{w.compute_speedup:g}", f"{w.step_s:.3f}", f"×{w.speedup:.2f}", pct(w.comm_tax)] for w in data.wall]
    return table(
        ["compute speed-up", "step (s)", "step speed-up", "comm tax"],
        rows,
        "Speed-up of the step when only compute gets faster",
    )


def plans_table(data: ReportData) -> str:
    res = data.search
    head = [
        "rank",
        "tp",
        "pp",
        "dp",
        "cp",
        "vp",
        "micro-batch",
        "ZeRO",
        "recompute",
        "seq. par.",
        "grad dtype",
        "step (s)",
        "vs this plan",
        "MFU",
        "comm tax",
        "memory GiB",
    ]
    rows = []
    for i, (p, b) in enumerate(res.top):
        rows.append(
            [
                f"#{i + 1}",
                *(
                    str(getattr(p, k))
                    for k in (
                        "tp",
                        "pp",
                        "dp",
                        "cp",
                        "vp",
                        "micro_batch",
                        "zero",
                        "recompute",
                        "sequence_parallel",
                        "grad_comm_dtype",
                    )
                ),
                f"{b.step_time_s:.3f}",
                f"{b.step_time_s / data.breakdown.step_time_s - 1:+.1%}",
                pct(b.mfu),
                pct(b.comm_tax),
                f"{b.memory_gib_per_gpu['total']:.1f}",
            ]
        )
    s = res.summary()
    cap = (
        f"Top {len(res.top)} of {s['fit']:,} plans that fit ({s['evaluated']:,} evaluated, {s['invalid']:,} "
        f"invalid, {s['do_not_fit']:,} do not fit memory)"
    )
    return table(head, rows, cap)


def advice_table(data: ReportData) -> str:
    a = data.advice
    rows = [
        [
            c.label,
            c.kind,
            f"{c.step_after_s:.3f}",
            f"{c.step_change:+.1%}",
            f"{pct(c.comm_tax_before)} → {pct(c.comm_tax_after)}",
            "yes" if c.fits_after else "no",
            c.text().split("; ", 1)[1] if "; " in c.text() else "—",
        ]
        for c in a.changes
    ]
    intro = (
        f"<p>Largest part of the step: <strong>{escape(PART_LABELS.get(a.dominant, a.dominant))}</strong> "
        f"({pct(a.dominant_share)}). "
        + (
            f"Largest communication part: <strong>{escape(PART_LABELS.get(a.dominant_comm, a.dominant_comm))}</strong>."
            if a.dominant_comm
            else ""
        )
        + "</p>"
    )
    sens = [
        [lvl, f"{d['bw_elasticity']:+.3f}", f"{d['latency_elasticity']:+.4f}"] for lvl, d in a.sensitivities.items()
    ]
    return (
        intro
        + table(
            ["change", "kind", "step after (s)", "step change", "comm tax", "fits", "what moves"],
            rows,
            "Every change tried, best first (re-estimated, not a rule of thumb)",
        )
        + table(
            ["level", "bandwidth elasticity", "latency elasticity"],
            sens,
            "d ln(step) / d ln(bandwidth or latency): −0.3 means +10% bandwidth → −3% step",
        )
    )


def scaling_table(data: ReportData) -> str:
    rows = []
    best = {p.num_gpus: p for p in data.scaling}
    if not best:  # no search: the job's own plan only
        rows = [
            [
                str(n),
                pct(b.comm_tax) if b else f"— ({why})",
                pct(b.comm_share) if b else "—",
                pct(b.mfu) if b else "—",
                f"{b.step_time_s:.3f}" if b else "—",
            ]
            for n, b, why in data.own_scaling
        ]
        return table(["GPUs", "comm tax", "comm share", "MFU", "step (s)"], rows, "Scaling of this plan")
    for n, b, why in data.own_scaling:
        p = best.get(n)
        bb = p.breakdown if p is not None else None
        rows.append(
            [
                str(n),
                pct(b.comm_tax) if b else f"— ({why})" if why else "—",
                pct(b.mfu) if b else "—",
                pct(bb.comm_tax) if bb else ("—" if p is None else f"— ({p.reason})"),
                pct(bb.mfu) if bb else "—",
                plan_label(p.plan) if p is not None and p.plan else "—",
            ]
        )
    return table(
        ["GPUs", "comm tax, this plan", "MFU, this plan", "comm tax, best plan", "MFU, best plan", "best plan"],
        rows,
        "Scaling",
    )


def bench_section(data: ReportData, figs: dict[str, Fig]) -> str:
    body = []
    for bs in data.bench:
        body.append(
            f"<p>Records: <code>{escape(bs.path)}</code> ({len(bs.records)}); model curve on "
            f"{escape(bs.cluster_label)}.</p>"
        )
    body += [figure(f) for k, f in figs.items() if k.startswith("bench-")]
    if not any(k.startswith("bench-") for k in figs):
        body.append("<p>No multi-rank collective records in these files.</p>")
    return section("bench", "Measured collectives vs the model", "".join(body))


def trace_section(per_rank: dict[str, dict[str, float]], predicted: Breakdown | None, fig: Fig | None = None) -> str:
    """Measured figures per rank (from profiler traces) next to the prediction.

    ``per_rank`` maps a rank name to {window_s, compute_s, comm_s, overlapped_comm_s, exposed_comm_s, idle_s,
    comm_tax, comm_share}: plain numbers, so any trace reader can feed it.
    """
    fig = fig or Fig("trace", trace_chart(per_rank, predicted), "Per rank, from the profiler traces.")
    head = ["rank"] + [f.replace("_", " ") for f in TRACE_FIELDS]
    rows = []
    for rank, f in per_rank.items():
        rows.append(
            [str(rank)]
            + [
                pct(f[k]) if k in ("comm_tax", "comm_share") and k in f else (f"{f[k]:.4f}" if k in f else "—")
                for k in TRACE_FIELDS
            ]
        )
    if predicted is not None:
        b = predicted.breakdown_s
        exposed = exposed_sum(b)
        comm = sum(predicted.comm_time_s.values())
        rows.append(
            [
                "predicted",
                f"{predicted.step_time_s:.4f}",
                f"{b['compute'] + b['recompute']:.4f}",
                f"{comm:.4f}",
                f"{max(0.0, comm - exposed):.4f}",
                f"{exposed:.4f}",
                f"{b['pp_bubble']:.4f}",
                pct(predicted.comm_tax),
                pct(predicted.comm_share),
            ]
        )
    return section(
        "trace",
        "Measured (profiler traces) vs predicted",
        figure(fig) + table(head, rows, "Per-rank measured figures and the prediction"),
    )


def compare_section(data: ReportData, fig: Fig | None) -> str:
    jobs = [(data.name, data.job, data.breakdown, data.cost)] + [
        (o.name, o.job, o.breakdown, o.cost) for o in data.others
    ]
    metrics = [
        ("cluster", lambda j, b, c: f"{j.cluster.num_gpus}× {j.cluster.gpu.name}"),
        (
            "network",
            lambda j, b, c: f"{j.cluster.intra_node.name} + {j.cluster.nics_per_node}× {j.cluster.inter_node.name}",
        ),
        ("plan", lambda j, b, c: f"TP={j.plan.tp} PP={j.plan.pp} DP={j.dp} CP={j.plan.cp} VP={j.plan.vp}"),
        ("step (s)", lambda j, b, c: f"{b.step_time_s:.3f}"),
        ("tokens/s per GPU", lambda j, b, c: f"{b.tokens_per_s_per_gpu:,.1f}"),
        ("MFU", lambda j, b, c: pct(b.mfu)),
        ("comm tax", lambda j, b, c: pct(b.comm_tax)),
        ("comm share", lambda j, b, c: pct(b.comm_share)),
        (
            "memory GiB / GPU",
            lambda j, b, c: (
                f"{b.memory_gib_per_gpu['total']:.1f} of {j.cluster.gpu.mem_GiB:.1f}"
                + ("" if b.fits else " (does not fit)")
            ),
        ),
        ("tokens trained", lambda j, b, c: tokens_text(c.tokens) if c else "—"),
        ("days", lambda j, b, c: f"{c.days:,.1f}" if c else "—"),
        ("$ / B tokens owned", lambda j, b, c: f"{c.owned_usd_per_B_tokens:,.2f}" if c else "—"),
        ("$ / B tokens rented", lambda j, b, c: f"{c.rented_usd_per_B_tokens:,.2f}" if c else "—"),
    ]
    rows = [[label] + [f(j, b, c) for _, j, b, c in jobs] for label, f in metrics]
    body = table(
        ["metric"] + [n for n, *_ in jobs],
        rows,
        "Side by side (each job with its own plan; days and $ for this job's token count)",
    )
    return section("compare", "Other clusters side by side", (figure(fig) if fig else "") + body)


# ----------------------------------------------------------------------------- the page
CSS = """
:root{--ink:#222;--muted:#555;--line:#ccc;--bg:#fff;--card:#f6f7f9;--accent:#1d4f91;--bad:#a11;--ok:#175c2a}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0 auto;max-width:1100px;padding:1rem 1.25rem 3rem;color:var(--ink);background:var(--bg);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
h1{font-size:1.6rem;margin:.5rem 0 .25rem}h2{font-size:1.25rem;margin:2.2rem 0 .6rem;border-bottom:2px solid var(--ink)}
.job{color:var(--muted);margin:.2rem 0 1rem}
nav ol{display:flex;flex-wrap:wrap;gap:.25rem 1rem;list-style:none;padding:0;margin:0 0 1rem}
nav a{color:var(--accent)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(13rem,1fr));gap:.75rem;margin:.5rem 0 1rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.6rem .8rem}
.card .label{font-size:.8rem;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.card .value{font-size:1.55rem;font-weight:600;font-variant-numeric:tabular-nums}
.card .sub{font-size:.85rem;color:var(--muted)}
.fit{padding:.5rem .8rem;border-radius:6px;border:2px solid;font-weight:600}
.fit.ok{color:var(--ok);border-color:var(--ok)}.fit.bad{color:var(--bad);border-color:var(--bad);border-style:dashed}
dl.defs{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;font-size:.9rem}
dl.defs dt{font-weight:600}dl.defs dd{margin:0}
.tablewrap{overflow-x:auto;margin:.5rem 0 1rem;max-width:100%}
.tables{display:flex;flex-wrap:wrap;gap:0 2rem;align-items:flex-start}
td.t{text-align:left}
table{border-collapse:collapse;font-size:.85rem;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:.25rem 0}
th,td{border:1px solid var(--line);padding:.2rem .5rem;text-align:right;vertical-align:top}
th[scope=row],thead th{text-align:left;background:var(--card)}
figure{margin:1.2rem 0 2rem;padding:0;break-inside:avoid}
.chartwrap{width:100%;overflow:hidden}
svg.chart{display:block;width:100%;height:auto;max-width:100%}
figcaption{font-size:.9rem;color:var(--muted);margin:.3rem 0}
details.tableview summary{cursor:pointer;font-size:.85rem;color:var(--accent)}
.controls{display:flex;flex-wrap:wrap;gap:.5rem;align-items:center;margin:.25rem 0;font-size:.85rem}
.controls button{font:inherit;padding:.15rem .6rem;border:1px solid var(--ink);background:#fff;border-radius:4px;
cursor:pointer}
.controls input{vertical-align:middle;width:10rem}
.note{color:var(--muted);font-style:italic}
code{font-size:.9em}
footer{margin-top:3rem;font-size:.8rem;color:var(--muted)}
@media (max-width:640px){body{padding:.5rem .6rem 2rem;font-size:14px}.card .value{font-size:1.3rem}
.chartwrap{overflow-x:auto}svg.chart{min-width:540px}
dl.defs{grid-template-columns:1fr}th,td{padding:.15rem .3rem}}
@media print{@page{margin:1.4cm}body{max-width:none;padding:0;font-size:10pt}nav,.controls{display:none}
a{color:inherit;text-decoration:none}h2{break-after:avoid}figure,table,.card{break-inside:avoid}
details.tableview summary{display:none}.card{background:none}th[scope=row],thead th{background:none}}
"""

# Timeline zoom: rescale the bars' group and redraw the time ticks for the visible window.
JS = """
(function(){'use strict';
var NS='http://www.w3.org/2000/svg';
function nice(span){var raw=span/6,k=Math.pow(10,Math.floor(Math.log10(raw)));
 var ms=[1,2,5,10];for(var i=0;i<ms.length;i++){if(raw<=ms[i]*k*1.0000001)return ms[i]*k;}return 10*k;}
function label(t,step){var d=Math.max(0,-Math.floor(Math.log10(step)));return t.toFixed(Math.min(d,9));}
document.querySelectorAll('.controls[data-for]').forEach(function(ctl){
 var svgEl=document.getElementById(ctl.getAttribute('data-for'));if(!svgEl)return;
 var bars=svgEl.querySelector('.gantt-bars'),axis=svgEl.querySelector('.gantt-axis');
 var L=+svgEl.dataset.left,W=+svgEl.dataset.plotw,T=+svgEl.dataset.total,U=+svgEl.dataset.units,
     B=+svgEl.dataset.bottom,z=1,x0=0;
 var pan=ctl.querySelector('[data-pan]'),lvl=ctl.querySelector('.zoomlevel');
 function draw(){var span=U/z;x0=Math.max(0,Math.min(U-span,x0));
  bars.setAttribute('transform','translate('+L+',0) scale('+(W/span)+',1) translate('+(-x0)+',0)');
  while(axis.firstChild)axis.removeChild(axis.firstChild);
  var t0=x0/U*T,t1=(x0+span)/U*T,step=nice(t1-t0);
  for(var t=Math.ceil(t0/step)*step;t<=t1+step*1e-9;t+=step){var x=L+(t-t0)/(t1-t0)*W;
   var ln=document.createElementNS(NS,'line');ln.setAttribute('x1',x);ln.setAttribute('x2',x);
   ln.setAttribute('y1',B);ln.setAttribute('y2',B+4);ln.setAttribute('stroke','#222');axis.appendChild(ln);
   var tx=document.createElementNS(NS,'text');tx.setAttribute('x',x);tx.setAttribute('y',B+16);
   tx.setAttribute('text-anchor','middle');tx.setAttribute('font-size','11');tx.setAttribute('fill','#222');
   tx.textContent=label(t,step);axis.appendChild(tx);}
  lvl.textContent='\\u00d7'+z;pan.value=z>1?Math.round(x0/(U-span)*1000):0;pan.disabled=z===1;}
 ctl.addEventListener('click',function(e){var a=e.target.getAttribute&&e.target.getAttribute('data-zoom');if(!a)return;
  var c=x0+U/z/2;if(a==='in')z=Math.min(z*2,256);else if(a==='out')z=Math.max(z/2,1);else z=1;
  x0=c-U/z/2;draw();});
 pan.addEventListener('input',function(){x0=(+pan.value/1000)*(U-U/z);draw();});
 draw();});
})();
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def render_page(data: ReportData, figs: list[Fig] | None = None) -> str:
    figs = figs if figs is not None else figures(data)
    by_id = {f.id: f for f in figs}
    b = data.breakdown
    sections = [summary_section(data)]
    step_body = "".join(figure(by_id[k]) for k in ("step", "comm-time", "comm-bytes", "memory"))
    sections.append(section("step", "The step: compute, communication, bubble, memory", step_body))
    if "timeline" in by_id:
        # the close-ups draw windows of the same spans: their table is the window, not the whole step's rows again
        def window_table(fig: Fig) -> str:
            w0, w1 = fig.chart.window
            note = '<p class="note">The spans of this close-up are in the whole-step timeline\'s table above.</p>'
            return table(["window", "from s", "to s"], [[fig.chart.title, f"{w0:.4g}", f"{w1:.4g}"]]) + note

        tl = "".join(
            figure(by_id[k], table_html=window_table(by_id[k]) if k in ("timeline-start", "timeline-end") else None)
            for k in ("timeline", "timeline-start", "timeline-end", "sim-vs-estimate")
            if k in by_id
        )
        sim = data.sim
        tl += (
            f"<p>Simulated step {sim.breakdown.step_time_s:.4f} s vs estimate {b.step_time_s:.4f} s "
            f"({sim.breakdown.step_time_s / b.step_time_s - 1:+.2%}); {sim.events:,} events; pipeline bubble "
            f"{pct(sim.bubble_fraction)} of the ideal time on the busiest stage ({sim.busiest_stage}).</p>"
        )
    else:
        tl = f'<p class="note">{escape(data.sim_note or "not simulated")}</p>'
    sections.append(section("timeline", "Timeline of one pipeline replica (simulated)", tl))
    sc = (
        figure(by_id["scaling"], table_html=scaling_table(data))
        if "scaling" in by_id
        else '<p class="note">No size could be evaluated.</p>'
    )
    sc += figure(by_id["wall"], wall_table(data))
    sections.append(section("scaling", "Scaling and the communication wall", sc))
    plans = []
    if "plans" in by_id:
        plans.append(figure(by_id["plans"]) + plans_table(data))
    elif data.search_note:
        plans.append(f'<p class="note">Search: {escape(data.search_note)}</p>')
    if "advice" in by_id:
        plans.append(figure(by_id["advice"], table_html=advice_table(data)))
    elif data.advice_note:
        plans.append(f'<p class="note">Advice: {escape(data.advice_note)}</p>')
    if plans:
        sections.append(section("plans", "Better plans and what each change buys", "".join(plans)))
    if data.bench:
        sections.append(bench_section(data, by_id))
    if data.trace:
        sections.append(trace_section(data.trace, b, by_id.get("trace")))
    if data.others:
        sections.append(compare_section(data, by_id.get("compare")))
    nav = "".join(
        f'<li><a href="#{sid}">{escape(t)}</a></li>'
        for sid, t in (
            ("summary", "Summary"),
            ("step", "Step"),
            ("timeline", "Timeline"),
            ("scaling", "Scaling"),
            ("plans", "Plans"),
            ("bench", "Collectives"),
            ("trace", "Traces"),
            ("compare", "Side by side"),
        )
        if f'id="{sid}"' in "".join(sections)
    )
    estimate_json = json.dumps(b.to_dict(), default=float).replace("</", "<\\/")
    title = f"commtax report: {data.name}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>{escape(title)}</h1><p class="job">{escape(job_description(data.job))}</p>'
        f'<nav aria-label="sections"><ol>{nav}</ol></nav></header><main>{"".join(sections)}</main>'
        f"<footer>commtax {__version__} · analytical estimate ({escape(b.source)}); every number above comes from "
        "the commtax library (estimate, sim, search, advise, cost). This page loads nothing from the network."
        "</footer>"
        f'<script type="application/json" id="estimate-json">{estimate_json}</script>'
        f"<script>{JS}</script></body></html>\n"
    )


def trace_figures(result: Any) -> dict[str, dict[str, float]]:
    """Per-rank figures from what ``commtax.trace.analyze`` returns: a mapping rank -> figures, an object with
    ``per_rank`` / ``ranks``, or one with ``to_dict()`` holding either."""
    if hasattr(result, "to_dict") and not isinstance(result, dict):
        result = result.to_dict()
    for attr in ("per_rank", "ranks"):
        if isinstance(result, dict) and attr in result:
            result = result[attr]
            break
        if hasattr(result, attr):
            result = getattr(result, attr)
            break
    if isinstance(result, list):
        result = {str(r.get("rank", i)) if isinstance(r, dict) else str(i): r for i, r in enumerate(result)}
    out: dict[str, dict[str, float]] = {}
    for rank, f in dict(result).items():
        if hasattr(f, "to_dict"):
            f = f.to_dict()
        elif not isinstance(f, dict):
            f = vars(f)
        out[str(rank)] = {
            k: float(f[k])
            for k in TRACE_FIELDS
            if k in f and isinstance(f[k], (int, float)) and math.isfinite(float(f[k]))
        }
    return out


def load_trace(
    paths: Sequence[str], job: Any = None, warn: Any = None, k: int | None = None
) -> dict[str, dict[str, float]]:
    """Per-rank measured figures from profiler traces, through ``commtax.trace`` when it is installed; of traces
    from several jobs, job ``k`` or the one of the job's world size (``trace.analyze.one_job``); with ``job`` and
    ``warn``, ``warn(line)`` for each reason the traces may be of another job (world size, GPU)."""
    try:
        from commtax import trace as trace_mod  # type: ignore[attr-defined]
        from commtax.trace.analyze import one_job
    except ImportError:
        raise TraceUnavailable("--trace: trace support (commtax.trace) is not installed in this build yet") from None
    try:
        result = trace_mod.analyze([str(p) for p in paths])
    except (ValueError, OSError) as e:  # an unreadable or foreign trace file: one line, exit 2
        raise SpecError(f"--trace: {e}") from None
    result, _, how = one_job(result, k, job.cluster.num_gpus if job is not None else None, "--trace")
    if how and k is None and warn is not None:
        warn(f"--trace: the page shows {how}; --job K picks another")
    if job is not None and warn is not None:
        from commtax.trace.against import job_mismatch

        for line in job_mismatch(result, job):
            warn(f"--trace: {line}")
    return trace_figures(result)
