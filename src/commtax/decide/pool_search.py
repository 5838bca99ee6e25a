"""Plans for a cluster of GPU pools: pool-to-stage assignments, layer splits and per-pool batch shares.

The homogeneous grid (``decide.search``) prices one GPU; here each candidate is priced by ``estimate`` on its pools
(schedule/pools.py). Candidates, a product filtered by the spec's own rules (refusals counted by the rule):

* stages on pools: tp (inside a node), dp; pool i then holds k_i = n_i / (tp·dp) stages, pp = Σ k_i; the pools in
  either order (which one holds the embedding, which the head); layers per stage on pool i ∝ r_i^a (r_i: the
  pool's sustained GEMM rate, a ∈ ``SPLIT_EXPONENTS``: a = 0 is the even split, a = 1 layers in proportion to speed);
* data parallelism across pools: tp, pp, each pool whole replicas, and the batch per replica or ∝ r_i;
* micro-batch and recompute as ``MICRO_BATCHES`` and ``RECOMPUTE``, and the job's own.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from commtax.decide.plans import POOL_COLUMNS, PlanRow
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.schedule.breakdown import Breakdown
from commtax.spec import Job, Plan, job_with

SPLIT_EXPONENTS = (0.0, 0.5, 0.75, 1.0, 1.25)
MICRO_BATCHES = (1, 2)
RECOMPUTE = ("selective", "full")


@dataclass
class PoolSearchResult:
    job: Job
    top: list[tuple[PlanRow, Breakdown]]
    evaluated: int
    fit: int
    refusals: Counter = field(default_factory=Counter)
    interrupted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "evaluated": self.evaluated,
            "fit": self.fit,
            "refusals": dict(self.refusals.most_common()),
            "top": [{"plan": p.to_dict(), **b.to_dict()} for p, b in self.top],
        }


def gemm_rate(gpu, precision: str) -> float:
    """Sustained GEMM rate of a pool's GPU, FLOP/s: peak × matmul efficiency (what sets a stage's pace)."""
    return gpu.peak_flops(precision) * gpu.matmul_eff(precision)


def proportional_split(total: int, counts: list[int], weights: list[float]) -> list[int] | None:
    """Layers per stage: pool i's k_i stages each ∝ weight_i, summing to ``total`` (largest remainder), ≥ 1 each."""
    stages = [w for k, w in zip(counts, weights) for _ in range(k)]
    raw = [total * w / sum(stages) for w in stages]
    out = [max(1, math.floor(x)) for x in raw]
    order = sorted(range(len(raw)), key=lambda s: raw[s] - math.floor(raw[s]), reverse=True)
    k = 0
    while sum(out) < total:
        out[order[k % len(order)]] += 1
        k += 1
    while sum(out) > total:
        s = max(range(len(out)), key=lambda x: out[x])
        out[s] -= 1
    return out if min(out) >= 1 else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(job: Job) -> list[dict[str, Any]]:
    """Plan changes to try on the job's pools (both placements)."""
    c, m, prec = job.cluster, job.model, job.training.precision
    rates = [gemm_rate(p.gpu, prec) for p in c.pools]
    names = [p.label for p in c.pools]
    node = min(p.gpus_per_node for p in c.pools)
    tps = [t for t in _divisors(m.kv_heads_) if m.heads % t == 0 and t <= node]
    out = []
    for tp in tps:
        for dp in _divisors(
            math.gcd(*[p.num_gpus for p in c.pools]) // tp if all(p.num_gpus % tp == 0 for p in c.pools) else 1
        ):
            ks = [p.num_gpus // (tp * dp) for p in c.pools]
            if any(p.num_gpus % (tp * dp) for p in c.pools) or sum(ks) > m.layers:
                continue
            for order in {tuple(range(len(ks))), tuple(reversed(range(len(ks))))}:
                counts, weights = [ks[i] for i in order], [rates[i] for i in order]
                where = [names[i] for i in order for _ in range(ks[i])]
                splits = {
                    tuple(s)
                    for a in SPLIT_EXPONENTS
                    if (s := proportional_split(m.layers, counts, [w**a for w in weights])) is not None
                }
                for split in sorted(splits):
                    out.append(
                        {
                            "tp": tp,
                            "dp": dp,
                            "pp": sum(ks),
                            "stage_pools": where,
                            "stage_layers": list(split),
                            "pool_batch_share": None,
                            "sequence_parallel": tp > 1,
                        }
                    )
        for pp in _divisors(m.layers):
            if any(p.num_gpus % (tp * pp) for p in c.pools):
                continue
            replicas = [p.num_gpus // (tp * pp) for p in c.pools]
            for share in {None, _rate_shares(job, replicas, rates)}:
                out.append(
                    {
                        "tp": tp,
                        "pp": pp,
                        "dp": None,
                        "stage_pools": None,
                        "stage_layers": None,
                        "pool_batch_share": share,
                        "sequence_parallel": tp > 1,
                    }
                )
    mbs = sorted({*MICRO_BATCHES, job.plan.micro_batch})  # the job's own choices are candidates too
    rcs = sorted({*RECOMPUTE, job.plan.recompute})
    return [dict(x, micro_batch=mb, recompute=rc) for x, mb, rc in product(out, mbs, rcs)]


def _rate_shares(job: Job, replicas: list[int], rates: list[float]) -> tuple[float, ...] | None:
    """Batch shares ∝ each pool's replicas × GEMM rate, rounded to whole sequences per replica (None: not possible)."""
    gb = job.training.global_batch
    w = [r * x for r, x in zip(replicas, rates)]
    seqs = [max(r, round(gb * x / sum(w) / r) * r) for r, x in zip(replicas, w)]
    seqs[-1] = gb - sum(seqs[:-1])
    if seqs[-1] <= 0 or seqs[-1] % replicas[-1]:
        return None
    return tuple(s / gb for s in seqs)


def refusal_rule(message: str) -> str:
    """A refusal's rule: the field it names (the text before the first ':')."""
    text = message.removeprefix("plan: ")
    head = text.split(":", 1)[0].split(" (")[0].strip()
    return head if head and len(head) < 60 else text[:60]


def pool_search(job: Job, top: int = 5, progress: Callable[[int, int], None] | None = None) -> PoolSearchResult:
    """Every candidate of ``candidates`` priced on the pools; the fastest that fit memory first."""
    cands = candidates(job)
    scored: list[tuple[float, PlanRow, Breakdown]] = []
    refusals: Counter = Counter()
    for k, change in enumerate(cands):
        if progress:
            progress(k, len(cands))
        try:
            j = job_with(job, **change)
        except SpecError as e:
            refusals[refusal_rule(str(e))] += 1
            continue
        b = estimate(j)
        if not b.fits:
            binding = next((x["pool"] for x in b.pools or [] if not x["fits"]), "?")
            refusals[f"memory: pool {binding}"] += 1
            continue
        scored.append((b.step_time_s, PlanRow.of(j, POOL_COLUMNS), b))
    if not scored:
        why = "; ".join(f"{n} × {r}" for r, n in refusals.most_common(3))
        raise SpecError(f"plan: no plan of the pool search is valid and fits memory ({why}); add GPUs or memory")
    scored.sort(key=lambda x: x[0])
    return PoolSearchResult(job, [(p, b) for _, p, b in scored[:top]], len(cands), len(scored), refusals)


@dataclass(frozen=True)
class PoolAdvice:
    """Which pool straggles, and what rebalancing (layers per stage, or batch shares) buys on the same plan."""

    straggler: str
    step_s: float
    overflow: str | None  # the pool that does not fit memory, as "pool: need of capacity GiB"; None: it fits
    rebalanced: PlanRow | None  # the best plan that only moves layers or batch between the pools
    rebalanced_step_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """The advice as ``advise`` writes it in its JSON: the fields, the gain and the line."""
        return {
            "straggler": self.straggler,
            "step_s": self.step_s,
            "overflow": self.overflow,
            "rebalanced": None if self.rebalanced is None else self.rebalanced.to_dict(),
            "rebalanced_step_s": self.rebalanced_step_s,
            "gain": self.gain,
            "line": self.line(),
        }

    @property
    def gain(self) -> float:
        return 0.0 if self.rebalanced_step_s is None else 1 - self.rebalanced_step_s / self.step_s

    def line(self) -> str:
        head = f"straggler: pool {self.straggler} (step {self.step_s:.3f} s)"
        if self.overflow:
            head += f"; it does not fit memory ({self.overflow})"
        if self.rebalanced is None or self.gain <= 0:
            return head + "; no rebalancing of layers or batch shares is faster"
        what = (
            f"stage_layers {list(self.rebalanced.stage_layers or ())} on {list(self.rebalanced.stage_pools)}"
            if self.rebalanced.stage_pools
            else f"pool_batch_share {[round(x, 4) for x in self.rebalanced.pool_batch_share or ()]}"
        )
        return head + f"; rebalancing to {what} gives {self.rebalanced_step_s:.3f} s ({self.gain:.1%} faster)"


def _rebalances(p: Plan, q: Plan) -> bool:
    """Whether plan ``q`` only moves layers or batch between the pools of plan ``p``: the same tp, pp, micro-batch
    and recompute, and stages placed on pools in both or in neither."""
    same = (q.tp, q.pp, q.micro_batch, q.recompute) == (p.tp, p.pp, p.micro_batch, p.recompute)
    return same and (q.stage_pools is None) == (p.stage_pools is None)


def pool_advice(job: Job) -> PoolAdvice:
    """The job's straggler pool and the best rebalancing that keeps its tp, pp, dp, micro-batch and recompute."""
    base = estimate(job)
    slow = next(x["pool"] for x in base.pools if x["straggler"])
    best: tuple[float, PlanRow] | None = None
    for change in candidates(job):
        try:
            j = job_with(job, **change)
        except SpecError:
            continue
        if not _rebalances(job.plan, j.plan):
            continue
        b = estimate(j)
        if b.fits and (best is None or b.step_time_s < best[0]):
            best = (b.step_time_s, PlanRow.of(j, POOL_COLUMNS))
    over = [x for x in base.pools if not x["fits"]]
    overflow = ", ".join(f"pool {x['pool']} needs {x['memory_gib']:.1f} of {x['mem_GiB']:g} GiB" for x in over) or None
    return PoolAdvice(slow, base.step_time_s, overflow, best[1] if best else None, best[0] if best else None)
