"""Advice for one job: what dominates the step, and which changes cut the communication tax, each
quantified by re-estimating the job with the change (``estimate``: no rule of thumb is quoted).

Changes tried: the cluster (2× inter-/intra-node bandwidth, ½ latency, 2× NICs) and the plan, one
field at a time (vp, micro_batch, grad dtype, ZeRO stage, recompute, sequence parallelism, TP
overlap, TP↔PP moves), plus the best plan that ``search`` finds. Sensitivities are finite
differences of the step time with respect to each level's bandwidth and latency.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from commtax.errors import Interrupted, SpecError
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import Breakdown, part_keys, within_each_other
from commtax.spec import Job, job_with
from commtax.spec.wire_dtypes import bytes_per_element, powersgd_rank
from commtax.workload.step import grad_bytes_per_param

COMM_PARTS = ("tp_exposed", "cp_exposed", "pp_bubble", "pp_exposed", "dp_exposed")
# relative step of the finite differences (central): small enough to stay on one branch of a max()
FD_REL = 1e-3


@dataclass
class Change:
    """One change to the job and what the model predicts it does."""

    label: str  # e.g. "vp 1→2"
    kind: str  # "plan" | "cluster" | "search"
    step_before_s: float
    step_after_s: float
    comm_tax_before: float
    comm_tax_after: float
    fits_before: bool
    fits_after: bool
    mem_before_GiB: float
    mem_after_GiB: float
    component: str  # the breakdown part that moves most
    component_before_s: float
    component_after_s: float
    plan: dict[str, Any] = field(default_factory=dict)
    # both steps inside each other's 80% interval: the model cannot say the change helps (its ratio is firmer,
    # since the two share most of their errors)
    within_interval: bool = False

    @property
    def step_change(self) -> float:
        """Relative change of the step time (−0.09 = 9% faster)."""
        return self.step_after_s / self.step_before_s - 1

    def text(self) -> str:
        comp = self.component.replace("_", " ")
        share_b = self.component_before_s / self.step_before_s
        share_a = self.component_after_s / self.step_after_s
        parts = [f"{self.label}: step {self.step_change:+.1%}"]
        if self.component_before_s > 0 and abs(self.component_after_s / self.component_before_s - 1) >= 0.005:
            ratio = self.component_after_s / self.component_before_s
            rel = f"×{ratio:.0f}" if ratio >= 10 else f"{ratio - 1:+.0%}"
            parts.append(f"{comp} {share_b:.1%} → {share_a:.1%} of step ({rel})")
        elif self.component_before_s == 0 and self.component_after_s > 0:
            parts.append(f"{comp} 0 → {share_a:.1%} of step")
        if abs(self.comm_tax_after - self.comm_tax_before) >= 0.001:
            parts.append(f"comm tax {self.comm_tax_before:.1%} → {self.comm_tax_after:.1%}")
        if self.fits_after != self.fits_before:
            parts.append("memory fits" if self.fits_after else "no longer fits memory")
        elif not self.fits_after:  # a suggestion that still needs more memory than the GPU has says so
            parts.append("still does not fit memory")
        if abs(self.mem_after_GiB - self.mem_before_GiB) >= 0.5:
            parts.append(f"memory {self.mem_before_GiB:.0f} → {self.mem_after_GiB:.0f} GiB")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "step_change": self.step_change, "text": self.text()}


# Gradient-communication remedies, each a DDP comm hook in commtax.measure.hooks (``commtax bench ddp --hook``):
# (grad_comm_dtype, error feedback, label, quality caveat). Caveats: measured by `commtax bench ddp`
# (tests/test_bench_ddp.py, docs/remedies.md) on a small GPT; on your model, check the loss curve.
REMEDIES = (
    ("bf16", False, "bf16 gradients", "bf16_compress_hook; loss equal to fp32 within 1e-4 nats on bench ddp"),
    ("fp8_e4m3", False, "fp8 (e4m3) gradients with per-chunk scales", "loss within 0.001 nats of fp32 on bench ddp"),
    ("int8", True, "int8 gradients with error feedback", "loss within 0.001 nats of fp32 on bench ddp"),
    (
        "int4",
        True,
        "int4 gradients with error feedback",
        "without error feedback int4 lost 0.003 nats on bench ddp, with it none; check your loss curve",
    ),
    (
        "powersgd_r4",
        True,
        "PowerSGD rank 4 (torch powerSGD_hook) with error feedback",
        "lossy: +0.3 nats after 40 steps on bench ddp's 64-wide model; torch advises vanilla all-reduce for "
        "the first ~10% of steps (start_powerSGD_iter)",
    ),
)


@dataclass
class Remedy:
    """A gradient-compression remedy, re-estimated: what it does to the exposed DP time and the step."""

    grad_comm_dtype: str
    label: str
    caveat: str
    change: Change
    dp_exposed_before_s: float
    dp_exposed_after_s: float

    def text(self) -> str:
        # on a fast network the codec can cost more than the bytes it saves: say so rather than "cut"
        verb = "cut" if self.dp_exposed_after_s <= self.dp_exposed_before_s else "would raise"
        return (
            f"{self.label} {verb} the exposed DP time from {self.dp_exposed_before_s:.3g} s to "
            f"{self.dp_exposed_after_s:.3g} s ({self.change.step_change:+.1%} step); quality: {self.caveat}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "grad_comm_dtype": self.grad_comm_dtype,
            "label": self.label,
            "caveat": self.caveat,
            "dp_exposed_before_s": self.dp_exposed_before_s,
            "dp_exposed_after_s": self.dp_exposed_after_s,
            "step_before_s": self.change.step_before_s,
            "step_after_s": self.change.step_after_s,
            "step_change": self.change.step_change,
            "text": self.text(),
        }


def remedies(job: Job, base: Breakdown | None = None) -> list[Remedy]:
    """Each gradient format of REMEDIES that sends fewer bytes than the plan's, re-estimated; best first."""
    base = base or estimate(job)
    now = grad_bytes_per_param(job)
    out = []
    for fmt, error_feedback, label, caveat in REMEDIES:
        if powersgd_rank(fmt) and job.plan.zero != 0:
            continue  # PowerSGD's low-rank P and Q are all-reduced: a DDP (ZeRO-0) hook, no reduce-scatter form
        try:
            j = job_with(job, grad_comm_dtype=fmt, grad_error_feedback=error_feedback)
        except SpecError:
            continue
        if (bytes_per_element(fmt) if not powersgd_rank(fmt) else grad_bytes_per_param(j)) >= now:
            continue  # not a saving over the plan's own format
        after = estimate(j)
        change = _change(label, "remedy", base, after, {"grad_comm_dtype": fmt, "grad_error_feedback": error_feedback})
        out.append(Remedy(fmt, label, caveat, change, base.breakdown_s["dp_exposed"], after.breakdown_s["dp_exposed"]))
    return sorted(out, key=lambda r: r.change.step_after_s)


@dataclass
class Advice:
    job: Job
    breakdown: Breakdown
    dominant: str
    dominant_share: float
    dominant_comm: str | None
    changes: list[Change]  # best first (fits before not fits, then step)
    sensitivities: dict[str, dict[str, float]]
    remedies: list[Remedy] = field(default_factory=list)  # gradient compression, re-estimated, with caveats
    interrupted: bool = False  # Ctrl-C/SIGTERM cut the plan search short: its best is of a partial search
    placement: list[str] = field(default_factory=list)  # where the groups sit on cluster.fabric (decide/fabric.py)
    groups: list[dict[str, Any]] = field(default_factory=list)  # the same, as numbers
    searched: bool = False  # a full plan search ran (its best plan is one of the changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "searched": self.searched,
            "interrupted": self.interrupted,
            "step_time_s": self.breakdown.step_time_s,
            "comm_tax": self.breakdown.comm_tax,
            "fits": self.breakdown.fits,
            "dominant": self.dominant,
            "dominant_share": self.dominant_share,
            "dominant_comm": self.dominant_comm,
            "breakdown": self.breakdown.to_dict(),
            "changes": [c.to_dict() for c in self.changes],
            "sensitivities": self.sensitivities,
            "remedies": [r.to_dict() for r in self.remedies],
            **({"placement": self.placement, "fabric_groups": self.groups} if self.placement else {}),
        }


# ----------------------------------------------------------------------------- cluster variants
def with_network(job: Job, bw: float = 1.0, latency: float = 1.0, nics: float = 1.0) -> Job:
    """The job with the inter-node network's bandwidth / latency scaled (and NICs per node multiplied)."""
    c = job.cluster
    net = c.inter_node.model_copy(
        update={"bw_Gbps": c.inter_node.bw_Gbps * bw, "latency_us": c.inter_node.latency_us * latency}
    )
    upd: dict[str, Any] = {"inter_node": net, "nics_per_node": max(1, round(c.nics_per_node * nics))}
    if c.profile is not None:
        upd["profile"] = _scale_profile(c.profile, "inter", bw, latency)
    return job.model_copy(update={"cluster": c.model_copy(update=upd)})


def with_intra(job: Job, bw: float = 1.0, latency: float = 1.0) -> Job:
    """The job with the intra-node (scale-up) link's bandwidth / latency scaled."""
    c = job.cluster
    link = c.intra_node.model_copy(
        update={"bw_GBps": c.intra_node.bw_GBps * bw, "latency_us": c.intra_node.latency_us * latency}
    )
    upd: dict[str, Any] = {"intra_node": link}
    if c.profile is not None:
        upd["profile"] = _scale_profile(c.profile, "intra", bw, latency)
    return job.model_copy(update={"cluster": c.model_copy(update=upd)})


def _scale_profile(prof, level: str, bw: float, latency: float):
    def scale(nums):
        return nums.model_copy(update={"bw_GBps": nums.bw_GBps * bw, "latency_us": nums.latency_us * latency})

    levels = {k: (scale(v) if k == level else v) for k, v in prof.levels.items()}
    ops = {op: {k: (scale(v) if k == level else v) for k, v in d.items()} for op, d in prof.ops.items()}
    return prof.model_copy(update={"levels": levels, "ops": ops})


# ----------------------------------------------------------------------------- plan variants
def _plan_variants(job: Job) -> list[tuple[str, dict[str, Any]]]:
    p = job.plan
    out: list[tuple[str, dict[str, Any]]] = []
    if p.pp > 1:
        out.append((f"vp {p.vp}→{p.vp * 2}", {"vp": p.vp * 2}))
        if p.vp > 1:
            out.append((f"vp {p.vp}→{p.vp // 2}", {"vp": max(1, p.vp // 2)}))
    out.append((f"micro_batch {p.micro_batch}→{p.micro_batch * 2}", {"micro_batch": p.micro_batch * 2}))
    if p.micro_batch > 1:
        out.append((f"micro_batch {p.micro_batch}→{p.micro_batch // 2}", {"micro_batch": p.micro_batch // 2}))
    smaller = {"fp32": "bf16", "bf16": "fp8", "fp16": "fp8", "fp8": "int4", "int8": "int4"}
    if p.grad_comm_dtype in smaller:
        g = smaller[p.grad_comm_dtype]
        out.append((f"grad {p.grad_comm_dtype}→{g}", {"grad_comm_dtype": g}))
    for z in p.preset.zero_stages:  # only the stages the framework runs (catalog/frameworks.yaml zero_stages)
        if z != p.zero:
            out.append((f"ZeRO-{p.zero}→ZeRO-{z}", {"zero": z}))
    for rc in ("none", "selective", "full"):
        if rc != p.recompute:
            out.append((f"recompute {p.recompute}→{rc}", {"recompute": rc}))
    if p.tp > 1:
        out.append(
            (
                f"sequence parallel {'on→off' if p.sequence_parallel else 'off→on'}",
                {"sequence_parallel": not p.sequence_parallel},
            )
        )
        if not p.overlap.tp:
            out.append(("TP comm-GEMM overlap on", {"overlap": {**p.overlap.model_dump(), "tp": True}}))
    if not p.overlap.dp:
        out.append(("DP overlap on", {"overlap": {**p.overlap.model_dump(), "dp": True}}))
    if p.tp > 1:
        out.append((f"tp {p.tp}→{p.tp // 2}, pp {p.pp}→{p.pp * 2}", {"tp": p.tp // 2, "pp": p.pp * 2, "dp": None}))
        out.append((f"tp {p.tp}→{p.tp // 2}, dp ×2", {"tp": p.tp // 2, "dp": None}))
    if p.pp > 1:
        out.append((f"pp {p.pp}→{p.pp // 2}, tp {p.tp}→{p.tp * 2}", {"pp": p.pp // 2, "tp": p.tp * 2, "dp": None}))
        out.append((f"pp {p.pp}→{p.pp // 2}, dp ×2", {"pp": p.pp // 2, "dp": None, "vp": 1 if p.pp == 2 else p.vp}))
    if p.cp > 1:
        out.append((f"cp {p.cp}→{p.cp // 2}, dp ×2", {"cp": p.cp // 2, "dp": None}))
    return out


def _moe_variants(job: Job) -> list[tuple[str, Job, dict[str, Any]]]:
    """What cuts an MoE job's all-to-all, each as a valid job: EP inside the NVLink domain, DeepEP (node
    deduplication), the 1F1B all-to-all overlap (with interleaving where the pipeline needs it), node-limited
    routing (DeepSeek-V3's M = 4, a model change), and fewer experts per GPU (ep × 2)."""
    from commtax.workload.moe import ep_nodes

    m, p, c = job.model, job.plan, job.cluster
    if not m.is_moe or p.ep * p.etp == 1:
        return []
    tries: list[tuple[str, dict[str, Any]]] = []
    if ep_nodes(job) > 1:
        inside = max((d for d in range(1, c.gpus_per_node // p.etp + 1) if m.num_experts % d == 0), default=1)
        tries.append((f"EP inside the NVLink domain: ep {p.ep}→{inside}", {"ep": inside}))
    if p.moe_dispatcher in ("alltoall", "allgather"):
        tries.append((f"dispatcher {p.moe_dispatcher}→deepep", {"moe_dispatcher": "deepep"}))
    if not p.moe_a2a_overlap and p.moe_dispatcher != "allgather" and p.recompute != "full":
        upd: dict[str, Any] = {"moe_a2a_overlap": True}
        if p.pp > 1 and p.vp == 1 and p.schedule == "1f1b":
            upd["vp"] = 2
        tries.append(("all-to-all overlap on" + (" (vp 1→2)" if "vp" in upd else ""), upd))
    if p.ep * 2 <= m.num_experts:
        tries.append((f"fewer experts per GPU: ep {p.ep}→{p.ep * 2}", {"ep": p.ep * 2}))
    out = []
    for label, upd in tries:
        try:
            out.append((label, job_with(job, **upd), upd))
        except SpecError:
            continue
    if ep_nodes(job) > 2 and (m.route_max_nodes is None or m.route_max_nodes > 4):
        from commtax.spec import build

        limited = m.model_copy(update={"route_max_nodes": 4})
        try:
            j = build(Job, {"model": limited, "cluster": c, "plan": p, "training": job.training}, "")
            out.append(("node-limited routing: each token to ≤ 4 nodes (model change)", j, {}))
        except SpecError:
            pass
    return out


def _change(label: str, kind: str, before: Breakdown, after: Breakdown, plan: dict[str, Any]) -> Change:
    deltas = {k: after.breakdown_s.get(k, 0.0) - before.breakdown_s[k] for k in part_keys(before)}
    comp = max(deltas, key=lambda k: abs(deltas[k]))
    return Change(
        label=label,
        kind=kind,
        step_before_s=before.step_time_s,
        step_after_s=after.step_time_s,
        comm_tax_before=before.comm_tax,
        comm_tax_after=after.comm_tax,
        fits_before=before.fits,
        fits_after=after.fits,
        mem_before_GiB=before.memory_gib_per_gpu["total"],
        mem_after_GiB=after.memory_gib_per_gpu["total"],
        component=comp,
        component_before_s=before.breakdown_s[comp],
        component_after_s=after.breakdown_s.get(comp, 0.0),
        plan=plan,
        within_interval=within_each_other(before, after),
    )


def sensitivities(job: Job, base: Breakdown | None = None) -> dict[str, dict[str, float]]:
    """d step / d bandwidth and d step / d latency per level (central differences, ±FD_REL).

    Per level: ``dstep_dbw_s_per_GBps`` (s of step per GB/s of per-GPU link bandwidth; for the
    network, per GB/s of one NIC's line rate), ``dstep_dlatency_s_per_us``, and the elasticities
    ``bw_elasticity`` = d ln step / d ln bw and ``latency_elasticity`` (−0.3: +10% bandwidth → −3% step).
    """
    base = base or estimate(job)
    c = job.cluster
    out: dict[str, dict[str, float]] = {}
    for level, vary, bw0, lat0 in (
        ("intra", with_intra, c.intra_node.bw_GBps, c.intra_node.latency_us),
        (
            "inter",
            lambda j, bw=1.0, latency=1.0: with_network(j, bw=bw, latency=latency),
            c.inter_node.bw_Gbps / 8,
            c.inter_node.latency_us,
        ),
    ):
        up = estimate(vary(job, bw=1 + FD_REL)).step_time_s
        dn = estimate(vary(job, bw=1 - FD_REL)).step_time_s
        lup = estimate(vary(job, latency=1 + FD_REL)).step_time_s
        ldn = estimate(vary(job, latency=1 - FD_REL)).step_time_s
        d_bw = (up - dn) / (2 * FD_REL * bw0)
        d_lat = (lup - ldn) / (2 * FD_REL * lat0) if lat0 > 0 else 0.0
        out[level] = {
            "bw_GBps": bw0,
            "latency_us": lat0,
            "dstep_dbw_s_per_GBps": d_bw,
            "dstep_dlatency_s_per_us": d_lat,
            "bw_elasticity": d_bw * bw0 / base.step_time_s,
            "latency_elasticity": d_lat * lat0 / base.step_time_s if lat0 > 0 else 0.0,
        }
    return out


def advise(
    job: Job, search_best: bool = True, workers: int | None = None, progress: Callable[[int, int], None] | None = None
) -> Advice:
    """Dominant component, changes ranked by what they buy, and bandwidth/latency sensitivities.

    ``progress(done, total)`` follows the search for the best plan (most of the time)."""
    base = estimate(job)
    parts = base.breakdown_s
    dominant = max(parts, key=parts.get)
    comm = {k: parts[k] for k in COMM_PARTS + (("ep_exposed",) if "ep_exposed" in parts else ())}
    dominant_comm = max(comm, key=comm.get) if any(v > 0 for v in comm.values()) else None
    changes: list[Change] = []
    for label, vary in (
        ("2× inter-node bandwidth", lambda j: with_network(j, bw=2.0)),
        ("½ inter-node latency", lambda j: with_network(j, latency=0.5)),
        ("2× NICs per node", lambda j: with_network(j, nics=2.0)),
        ("2× intra-node bandwidth", lambda j: with_intra(j, bw=2.0)),
        ("½ intra-node latency", lambda j: with_intra(j, latency=0.5)),
    ):
        changes.append(_change(label, "cluster", base, estimate(vary(job)), {}))
    placement: list[str] = []
    groups: list[dict[str, Any]] = []
    if job.cluster.fabric is not None:  # what-ifs on the fabric, and where each group sits on it
        from commtax.decide.fabric import group_places, placement_advice, what_ifs

        for label, j in what_ifs(job):
            changes.append(_change(label, "fabric", base, estimate(j), {}))
        places = group_places(job, base.comm_bytes_per_gpu)
        placement, groups = placement_advice(job, places), [p.to_dict() for p in places]
    for label, upd in _plan_variants(job):
        try:
            j = job_with(job, **upd)
        except SpecError:
            continue  # not a valid plan for this model and cluster
        changes.append(_change(label, "plan", base, estimate(j), {k: v for k, v in upd.items() if v is not None}))
    for label, j, upd in _moe_variants(job):
        changes.append(_change(label, "plan", base, estimate(j), upd))
    interrupted = False
    if search_best:
        from commtax.decide.search import search

        try:
            res = search(job, top=1, workers=workers, progress=progress)
            interrupted = res.interrupted
            best, b = res.top[0]
            if any(getattr(best, k) != getattr(job.plan, k) for k in best.columns if k != "dp"):
                what = "best of an interrupted (partial) search" if interrupted else "best plan"
                changes.append(_change(f"{what}: {best.label}", "search", base, b, best.to_dict()))
        except SpecError:  # no valid plan in the space
            pass
        except Interrupted:  # Ctrl-C/SIGTERM before the search found any plan: the rest of the advice stands
            interrupted = True
    changes.sort(key=lambda c: (not c.fits_after, c.step_after_s))
    return Advice(
        job,
        base,
        dominant,
        parts[dominant] / base.step_time_s,
        dominant_comm,
        changes,
        sensitivities(job, base),
        remedies(job, base),
        interrupted,
        placement,
        groups,
        search_best,
    )
