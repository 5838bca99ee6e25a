"""Compare clusters for one training job: each with the job's own plan (or, searching, its own best plan), and
what it costs.

``compare(jobs)`` takes jobs that differ in cluster (or anything else); ``jobs_for_gpus(job, gpus)``
makes them from one job by swapping the GPU and the node it is sold in (links, NICs: ``prices.yaml``
``nodes``). ``scaling(job, counts)`` prices (or re-searches) the job at several GPU counts.
``run_compare(...)`` is ``commtax compare``: the options as the command takes them, the result as it shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commtax.decide.cost import (
    ClusterCost,
    PowerBasis,
    Prices,
    TrainingCost,
    job_cluster_cost,
    job_training_cost,
    load_prices,
    usd_per_B_tokens,
)
from commtax.decide.plans import PlanRow
from commtax.decide.pool_search import pool_search
from commtax.decide.search import SearchResult, Space, search
from commtax.decide.space import COLUMNS as SEARCH_COLUMNS
from commtax.errors import Interrupted, SpecError
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import Breakdown
from commtax.spec import Job, Plan, build, load_catalog, resolve_entry
from commtax.units import SECONDS_PER_DAY, memory_need

MAX_COMPARE_GPUS = 32  # compare --gpu: clusters, each priced (or searched in full)

# The seed article's 256-GPU LLaMA-2 70B comparison (§4.2 table and §5.2 table). Its 通信税 is the comm share
# (T_comm / (T_comm + T_comp), nothing overlapped), not the comm tax; tokens/day from §4.2, days and $/B from §5.2.
ARTICLE_256 = {
    "h100-sxm5-80gb": {"comm_share": 0.67, "tokens_per_day": 42e9, "days": 14, "usd_per_B": 58, "price_usd": 35000},
    "a100-sxm4-80gb": {"comm_share": 0.50, "tokens_per_day": 33e9, "days": 21, "usd_per_B": 42, "price_usd": 15000},
    "rtx-4090-24gb": {"comm_share": 0.96, "tokens_per_day": 2.5e9, "days": 280, "usd_per_B": 105, "price_usd": 1600},
}


@dataclass
class Row:
    """One cluster: its best plan and breakdown (None when nothing fits), and the cost of the run."""

    name: str
    job: Job
    plan: PlanRow | None
    breakdown: Breakdown | None
    cost: TrainingCost | None
    cluster_cost: ClusterCost
    search: SearchResult | None
    reason: str | None = None

    def to_dict(self, mode: str = "owned") -> dict[str, Any]:
        c = self.job.cluster
        out: dict[str, Any] = {
            "name": self.name,
            "gpu": "+".join(f"{p.num_gpus}×{p.gpu.name}" for p in c.pools) if c.pools else c.gpu.name,
            "num_gpus": c.num_gpus,
            "intra_node": c.intra_node.name,
            "inter_node": c.inter_node.name,
            "nics_per_node": c.nics_per_node,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "reason": self.reason,
        }
        if self.breakdown is not None and self.cost is not None:
            b = self.breakdown
            out.update(
                step_time_s=b.step_time_s,
                mfu=b.mfu,
                comm_tax=b.comm_tax,
                comm_share=b.comm_share,
                tokens_per_day=self.cost.tokens_per_day,
                days=self.cost.days,
                usd_per_B_tokens=self.cost.usd_per_B_tokens(mode),
                owned_usd_per_B_tokens=self.cost.owned_usd_per_B_tokens,
                rented_usd_per_B_tokens=self.cost.rented_usd_per_B_tokens,
                energy_MWh=self.cost.energy_MWh,
                gpu_hours=self.cost.gpu_hours,
                capex_usd=self.cost.capex_usd,
                racks=self.cost.racks,
                breakdown=b.to_dict(),
            )
        fab = self.fabric_capex
        if fab is not None:  # only with a priced cluster.fabric: rows without one keep their keys
            out["fabric_capex_usd"] = fab.usd
            out["fabric_parts"] = fab.to_dict()
        return out

    @property
    def fabric_capex(self):
        """Switches, optics and fibre of the cluster's fabric, priced (decide.fabric_cost); None without one."""
        from commtax.decide.fabric_cost import fabric_capex

        return fabric_capex(self.job.cluster) if not self.job.cluster.pools else None


def label(job: Job) -> str:
    """``256×h100-sxm5-80gb 8×ib-ndr``: GPUs and network (the scale-up link follows from the GPU's node); with a
    fabric, its name and spine oversubscription too."""
    c = job.cluster
    if c.pools:
        return " + ".join(f"{p.num_gpus}×{p.gpu.name} {p.nics_per_node}×{p.inter_node.name}" for p in c.pools)
    out = f"{c.num_gpus}×{c.gpu.name} {c.nics_per_node}×{c.inter_node.name}"
    if c.fabric is not None:
        f = c.fabric
        out += f" {f.name} {f.oversubscription.get('leaf', 1):g}:1"
        if f.placement != "contiguous":
            out += f" {f.placement if isinstance(f.placement, str) else 'listed nodes'}"
    return out


def jobs_for_fabrics(job: Job, fabrics: list[str], catalog_file: str | None = None) -> list[Job]:
    """The job on each fabric preset (``ID`` or ``ID@R`` for an R:1 spine above the leaves); its placement and
    background traffic kept."""
    from commtax.spec.catalog import resolve_fabric

    catalog = load_catalog(catalog_file)
    keep = (
        {k: v for k, v in job.cluster.fabric.model_dump().items() if k in ("placement", "background", "flows")}
        if job.cluster.fabric is not None
        else {}
    )
    out = []
    for item in fabrics:
        name, _, ratio = item.partition("@")
        fab = resolve_fabric({"preset": name, **keep}, catalog, "--fabric")
        if ratio:
            try:
                r = float(ratio)
            except ValueError:
                raise SpecError(
                    f"--fabric: {item!r}: after @ comes the spine's oversubscription, e.g. {name}@4"
                ) from None
            fab["oversubscription"] = {**fab.get("oversubscription", {}), "leaf": r}
            fab["name"] = f"{name}@{ratio}"
        cluster = {**job.cluster.model_dump(exclude={"fabric"}), "fabric": fab}
        if cluster.get("uplink_Gbps") is not None:
            cluster["uplink_Gbps"] = None  # the fabric describes the links above the nodes now
        out.append(_with_cluster(job, cluster))
    return out


def jobs_for_gpus(
    job: Job, gpus: list[str], prices: Prices | None = None, catalog_file: str | None = None
) -> list[Job]:
    """The job on the same number of GPUs of each kind, in the node each is sold in (prices.yaml ``nodes``)."""
    prices = prices or load_prices()
    catalog = load_catalog(catalog_file)
    out = []
    for g in gpus:
        node = prices.node(resolve_entry("gpu", g, catalog, "--gpu")["name"])
        cluster = {
            **job.cluster.model_dump(exclude={"gpu", "intra_node", "inter_node", "profile"}),
            "gpu": resolve_entry("gpu", g, catalog, "--gpu"),
            "intra_node": resolve_entry("intra_node", node.intra_node, catalog, f"prices.nodes.{g}.intra_node"),
            "inter_node": resolve_entry("inter_node", node.inter_node, catalog, f"prices.nodes.{g}.inter_node"),
            "gpus_per_node": node.gpus_per_node,
            "nics_per_node": node.nics_per_node,
            "gpus_per_pcie_switch": node.gpus_per_pcie_switch,
        }
        out.append(_with_cluster(job, cluster))
    return out


def _with_cluster(job: Job, cluster: dict[str, Any]) -> Job:
    """The job on another cluster; its plan kept if still valid there, else the simplest valid plan."""
    base = {"model": job.model, "cluster": cluster, "training": job.training}
    try:
        return build(Job, {**base, "plan": job.plan.replace(dp=None)}, "")
    except SpecError:
        pass
    keep = {
        k: v
        for k, v in job.plan.model_dump().items()
        if k
        in (
            "framework",
            "overlap",
            "attention",
            "elementwise",
            "selective_policy",
            "fp8_recipe",
            "grad_comm_dtype",
            "schedule",
        )
    }
    try:
        return build(Job, {**base, "plan": keep}, "")
    except SpecError as e:
        raise SpecError(f"{cluster['gpu'].get('name', 'gpu')}: no valid starting plan on this cluster ({e})") from None


def compare(
    jobs: list[Job],
    names: list[str] | None = None,
    prices: Prices | None = None,
    space: Space | None = None,
    tokens: float | None = None,
    mode: str = "owned",
    power: PowerBasis = "typical",
    workers: int | None = None,
    progress: Callable[[float, int], None] | None = None,
    search_plans: bool = True,
) -> list[Row]:
    """Each job's best plan (search, ranked by step time) and the cost of its training run; with ``search_plans``
    false, each job's own plan instead (one estimate per job, no search).

    ``progress(done, total)`` is told how many of the jobs are done (fractions within a job's search)."""
    prices = prices or load_prices()
    rows = []
    for k, job in enumerate(jobs):
        name = names[k] if names else label(job)
        cc = job_cluster_cost(job, prices, power)
        if not search_plans:
            rows.append(own_plan_row(name, job, cc, prices, tokens, power))
            if progress:
                progress(k + 1, len(jobs))
            continue
        within = (lambda d, t, k=k: progress(k + d / max(t, 1), len(jobs))) if progress else None
        try:
            res = (
                pool_search(job, top=1, progress=within)  # pools: assignments, layer splits, batch shares
                if job.cluster.pools
                else search(job, space, top=1, workers=workers, progress=within)
            )
        except SpecError as e:
            rows.append(Row(name, job, None, None, None, cc, None, reason=str(e)))
            continue
        if res.interrupted:  # a partial search's best is not this cluster's best: stop, exit 130
            raise Interrupted("compare")
        plan, b = res.top[0]
        cost = job_training_cost(job, b.tokens_per_s, prices, tokens, power)
        rows.append(Row(name, job, plan, b, cost, cc, res))
    return rows


def plan_of(job: Job) -> PlanRow:
    """The job's plan with the columns of a dense search, in the spec's field order (as compare writes them)."""
    return PlanRow.of(job, [k for k in Plan.model_fields if k in SEARCH_COLUMNS])


def own_plan_row(name: str, job: Job, cc: ClusterCost, prices: Prices, tokens: float | None, power: PowerBasis) -> Row:
    """The job's own plan priced: one estimate; a plan that does not fit memory is a row with its reason."""
    from commtax.decide.plans import plan_label

    plan = plan_of(job)
    b = estimate(job)
    if not b.fits:
        need = memory_need(b.memory_gib_per_gpu["total"], job.cluster.gpu.mem_GiB)
        why = f"the job's plan {plan_label(plan)} does not fit memory ({need}); --search finds one that fits"
        return Row(name, job, plan, None, None, cc, None, reason=why)
    return Row(name, job, plan, b, job_training_cost(job, b.tokens_per_s, prices, tokens, power), cc, None)


def jobs_to_compare(
    inputs: list[str],
    gpu_names: list[str],
    counts: list[int] | None,
    prices: Any,
    catalog: Any = None,
    fabrics: list[str] | None = None,
) -> list[Job]:
    """The jobs ``compare`` ranks: one per job file, or (``--gpu``) the one job on each GPU; at the GPU ``counts``
    instead when given (None: as the files say). With GPU names, arguments after the first job that name a catalog
    GPU and are not files are more GPUs (``compare job.yaml --gpu a100 h100 mi300x``)."""
    from pathlib import Path

    from commtax.spec import load_job

    files = list(inputs)
    gpu_names = list(gpu_names)
    if gpu_names:
        known = load_catalog(catalog)["gpu"]
        extra = [x for x in files[1:] if not Path(x).exists() and x in known]
        files = [x for x in files if x not in extra]
        gpu_names += extra
    if not files:
        raise SpecError("compare: give at least one job file")
    jobs = [load_job(f, catalog) for f in files]
    if gpu_names:
        if len(jobs) != 1:
            raise SpecError("compare --gpu: give exactly one job file (its cluster gets each GPU in turn)")
        jobs = jobs_for_gpus(jobs[0], gpu_names, prices, catalog)
    if fabrics:  # `--fabric a,b`: the one job (or its one GPU) on each fabric preset
        if len(jobs) != 1:
            raise SpecError("compare --fabric: give exactly one job file (or one --gpu): its cluster gets each fabric")
        jobs = jobs_for_fabrics(jobs[0], fabrics, catalog)
    return with_gpu_counts(jobs, counts) if counts is not None else jobs


def with_gpu_counts(jobs: list[Job], counts: list[int]) -> list[Job]:
    """Each job at each GPU count (same model, batch and cluster kind); counts that make no valid job are skipped
    with their reason."""
    out = []
    errors = []
    for job in jobs:
        for n in counts:
            try:
                out.append(_with_cluster(job, {**job.cluster.model_dump(), "num_gpus": n}))
            except SpecError as e:
                errors.append(f"{n} x {job.cluster.gpu.name}: {e}")
    if not out:
        raise SpecError("no valid cluster size: " + "; ".join(errors[:3]))
    return out


def cheapest_within(rows: list[Row], deadline_days: float, mode: str = "owned") -> Row | None:
    """The cluster with the lowest $/B tokens among those that finish within ``deadline_days``.

    Within one cluster the best plan is also the cheapest (cost per token = $/s × s per token), so the
    cheapest way to meet a deadline is always some cluster's best plan."""
    ok = [r for r in rows if r.cost is not None and r.cost.days <= deadline_days]
    return min(ok, key=lambda r: r.cost.usd_per_B_tokens(mode)) if ok else None


@dataclass
class Point:
    """One plan of one cluster on the (days, $/B tokens) plane."""

    cluster: str
    days: np.ndarray
    usd_per_B: np.ndarray
    pareto: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


def pareto_points(
    rows: list[Row], tokens: float | None = None, mode: str = "owned", max_per_cluster: int = 2000
) -> list[Point]:
    """Days-to-train and $/B tokens of every plan that fits (up to ``max_per_cluster`` best per cluster),
    with the Pareto front (no other plan is both faster and cheaper) marked across all clusters."""
    pts = []
    for r in rows:
        if r.search is None:  # the job's own plan, not searched: its one point
            if r.cost is not None:
                pts.append(Point(r.name, np.array([r.cost.days]), np.array([r.cost.usd_per_B_tokens(mode)])))
            continue
        res = r.search
        job = r.job
        idx = res.order[:max_per_cluster]
        tok_step = job.training.global_batch * job.training.seq_len
        tps = tok_step / res.step_s[idx]
        n = tokens or job.training.tokens or 1e9
        pts.append(Point(r.name, n / tps / SECONDS_PER_DAY, usd_per_B_tokens(r.cluster_cost.usd_per_s(mode), tps)))
    if not pts:
        return pts
    days = np.concatenate([p.days for p in pts])
    usd = np.concatenate([p.usd_per_B for p in pts])
    front = pareto_mask(days, usd)
    start = 0
    for p in pts:
        p.pareto = front[start : start + len(p.days)]
        start += len(p.days)
    return pts


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point has x' ≤ x and y' ≤ y with one strictly smaller (minimise both)."""
    order = np.lexsort((y, x))
    mask = np.zeros(len(x), bool)
    best_y = np.inf
    for i in order:
        if y[i] < best_y:
            mask[i] = True
            best_y = y[i]
    return mask


@dataclass
class ScalePoint:
    num_gpus: int
    plan: PlanRow | None
    breakdown: Breakdown | None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The point as ``compare --scaling`` writes it in its JSON."""
        b = self.breakdown
        shown = (
            {"comm_tax": b.comm_tax, "comm_share": b.comm_share, "mfu": b.mfu, "step_time_s": b.step_time_s}
            if b
            else {}
        )
        plan = None if self.plan is None else self.plan.to_dict()
        return {"num_gpus": self.num_gpus, "plan": plan, "reason": self.reason, **shown}


def default_scaling_counts(num_gpus: int) -> list[int]:
    """GPU counts of ``compare --scaling`` when none are given: a quarter to four times the job's."""
    return [num_gpus // 4, num_gpus // 2, num_gpus, num_gpus * 2, num_gpus * 4]


def scaling(
    job: Job, counts: list[int], space: Space | None = None, workers: int | None = None, search_plans: bool = True
) -> list[ScalePoint]:
    """The job's best plan at each GPU count (same model, batch and cluster kind): comm tax and MFU vs scale; with
    ``search_plans`` false, the job's own plan at each count (``own_plan_scaling``)."""
    if not search_plans:
        return own_plan_scaling(job, counts)
    out = []
    for n in counts:
        cluster = {**job.cluster.model_dump(), "num_gpus": n}
        try:
            j = _with_cluster(job, cluster)
            res = search(j, space, top=1, workers=workers)
            if res.interrupted:
                raise Interrupted("compare --scaling")
            plan, b = res.top[0]
            out.append(ScalePoint(n, plan, b))
        except SpecError as e:
            out.append(ScalePoint(n, None, None, str(e)))
    return out


def fabric_tradeoff_lines(rows: list[Row], mode: str) -> list[str]:
    """Each priced fabric against the dearest one: what its switches and optics save, and the days and dollars of
    training it adds (or saves) for the same tokens."""
    priced = [(r, r.fabric_capex) for r in rows if r.cost is not None and r.fabric_capex is not None]
    if len(priced) < 2:
        return []
    base, base_fab = max(priced, key=lambda x: x[1].usd)
    out = []
    for r, fab in priced:
        if r is base:
            continue
        d_days, d_usd = r.cost.days - base.cost.days, r.cost.usd(mode) - base.cost.usd(mode)
        out.append(
            f"fabric: {r.name} against {base.name}: ${(base_fab.usd - fab.usd) / 1e6:.2f}M less in switches, optics "
            f"and fibre; training {d_days:+.1f} days, {'+' if d_usd >= 0 else '−'}${abs(d_usd) / 1e6:.2f}M ({mode})"
        )
    return out


def own_plan_scaling(job: Job, counts: list[int], fitting_only: bool = True) -> list[ScalePoint]:
    """The job's own plan (tp, pp, cp, …) at each GPU count, DP taking up the difference; a count where that plan is
    not valid (or, with ``fitting_only``, does not fit memory) is a point with its reason."""
    layout = ("tp", "pp", "cp", "vp", "micro_batch", "zero", "recompute", "sequence_parallel", "grad_comm_dtype")
    out = []
    for n in counts:
        try:
            (j,) = with_gpu_counts([job], [n])
        except SpecError as e:
            out.append(ScalePoint(n, None, None, str(e)))
            continue
        if any(getattr(j.plan, k) != getattr(job.plan, k) for k in layout):
            out.append(ScalePoint(n, None, None, "the plan is not valid at this size"))
            continue
        b = estimate(j)
        fits = b.fits or not fitting_only
        out.append(ScalePoint(n, plan_of(j), b if fits else None, None if fits else "does not fit memory"))
    return out


# ----------------------------------------------------------------------------- `commtax compare`
@dataclass
class Comparison:
    """What ``commtax compare`` shows: one row per cluster, and what the options asked for besides."""

    rows: list[Row]
    mode: str
    tokens: float | None
    searched: bool
    deadline_days: float | None = None
    choice: Row | None = None  # the cheapest cluster within the deadline (None: none makes it, or no deadline)
    pareto: list[Point] | None = None
    scaling: list[ScalePoint] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "mode": self.mode,
            "tokens": self.tokens,
            "searched": self.searched,
            "rows": [r.to_dict(self.mode) for r in self.rows],
        }
        if self.deadline_days is not None:
            data["deadline_days"] = self.deadline_days
            data["deadline_choice"] = self.choice.name if self.choice else None
        if self.scaling is not None:
            data["scaling"] = [p.to_dict() for p in self.scaling]
        return data


def counts_option(text: str | None, option: str) -> list[int]:
    """``--num-gpus 128,256`` / ``--gpus 64,128``: positive integers, or one line naming the option."""
    out = []
    for x in (text or "").split(","):
        if not x.strip():
            continue
        try:
            n = int(x)
        except ValueError:
            raise SpecError(f"{option}: expected integers, got {x[:40]!r}") from None
        if n <= 0:
            raise SpecError(f"{option}: expected positive integers, got {n}")
        out.append(n)
    return out


def names_option(values: list[str] | None) -> list[str]:
    """``--gpu a,b --gpu c``: the names in order, each once."""
    return [x.strip() for item in (values or []) for x in item.split(",") if x.strip()]


def run_compare(
    inputs: list[str],
    plan: dict[str, str | None],
    *,
    search_plans: bool = False,
    gpus: list[str] | None = None,
    fabrics: list[str] | None = None,
    num_gpus: str | None = None,
    tokens: float | None = None,
    mode: str = "owned",
    power: PowerBasis = "typical",
    deadline: float | None = None,
    pareto: bool = False,
    scaling_counts: str | None = None,
    want_scaling: bool = False,
    workers: int | None = None,
    catalog: Any = None,
    prices: Any = None,
    progress: Callable[[float, int], None] | None = None,
) -> Comparison:
    """``commtax compare``: the jobs (files, or one job on each ``--gpu``/``--fabric``, at each ``--num-gpus``), each
    priced with its own plan, or with its best plan when ``search_plans`` (plan options restrict that search, so
    giving any searches); the deadline's cheapest cluster, the Pareto points and the scaling points when asked."""
    search_plans = search_plans or any(v is not None for v in plan.values())
    space = Space.parse(plan)
    price_book = load_prices(prices)
    gpu_names = names_option(gpus)
    repeated = sorted({g for g in gpu_names if gpu_names.count(g) > 1})
    if repeated:
        raise SpecError(f"--gpu: {repeated[0]} given {gpu_names.count(repeated[0])} times; give each GPU once")
    if len(gpu_names) > MAX_COMPARE_GPUS:
        raise SpecError(f"--gpu: {len(gpu_names)} GPUs; the limit is {MAX_COMPARE_GPUS} clusters per comparison")
    counts = counts_option(num_gpus, "--num-gpus") if num_gpus else None
    scale = counts_option(scaling_counts, "--gpus")  # checked before the work, used after it
    jobs = jobs_to_compare(list(inputs), gpu_names, counts, price_book, catalog, names_option(fabrics))
    rows = compare(jobs, None, price_book, space, tokens, mode, power, workers, progress, search_plans)
    out = Comparison(rows, mode, tokens or jobs[0].training.tokens, search_plans)
    if deadline is not None:
        out.deadline_days, out.choice = deadline, cheapest_within(rows, deadline, mode)
    if pareto:
        out.pareto = pareto_points(rows, tokens, mode)
    if want_scaling:
        scale = scale or default_scaling_counts(jobs[0].cluster.num_gpus)
        out.scaling = scaling(jobs[0], [c for c in scale if c > 0], space, workers, search_plans)
    return out
