"""Prices on a cluster of several GPU pools: each pool's groups on its own links, a group crossing pools at the
slowest link it crosses (spec/pools.py describes the pools)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from commtax.costs.collectives import Level, Placement
from commtax.costs.pricing import Costs
from commtax.costs.topology import group_placement, inter_level, placement
from commtax.spec import Job, pool_cluster


def cross_pool_level(job: Job, pools: Iterable[int], flows: int) -> Level:
    """The network level of a group crossing ``pools``: the slowest of the pools' per-GPU NIC shares, and, over an
    explicit ``inter_pool`` link, that link's rate shared by the ``flows`` per-GPU streams crossing it at once
    (B_link / flows); latencies add up along the way (the slower side's NIC, then the link)."""
    c = job.cluster
    levels = [inter_level(pool_cluster(c, i)) for i in pools]
    bw = min(lv.bw_bytes_per_s for lv in levels)
    latency = max(lv.latency_s for lv in levels)
    if c.inter_pool is not None:
        bw = min(bw, c.inter_pool.bw_bytes_per_s / max(1, flows))
        latency += c.inter_pool.latency_s
    return Level("inter", bw, latency)


def binding_link(job: Job, pools: Iterable[int], flows: int) -> str:
    """Which link sets ``cross_pool_level``: a pool's NICs, or the inter_pool link."""
    c = job.cluster
    pools = list(pools)
    shares = {i: inter_level(pool_cluster(c, i)).bw_bytes_per_s for i in pools}
    slow = min(pools, key=shares.get)
    if c.inter_pool is not None and c.inter_pool.bw_bytes_per_s / max(1, flows) < shares[slow]:
        return f"the inter_pool link ({c.inter_pool.bw_Gbps:g} Gb/s shared by {flows} streams)"
    p = c.pools[slow]
    return f"pool {p.label}'s NICs ({p.nics_per_node} × {p.inter_node.name} for {p.gpus_per_node} GPUs per node)"


def pp_cross_placement(job_i: Job, cross: Level) -> Placement:
    """A pipeline send between stages on two pools: a pair on different nodes, at the crossing's level."""
    return replace(group_placement(job_i, "pp"), per_node=1, inter=cross)


def dp_cross_placement(job_i: Job, n: int, local: int, cross: Level) -> Placement:
    """The gradient reduction of data parallelism across pools: a ring over all ``n`` members (``local`` of them on
    pool i, laid out as its own DP group is) whose node crossings run at the slowest link the ring crosses."""
    pl = placement(job_i.cluster, n, job_i.plan.tp)
    inter = cross
    if pl.inter is not None:
        inter = Level(
            "inter", min(pl.inter.bw_bytes_per_s, cross.bw_bytes_per_s), max(pl.inter.latency_s, cross.latency_s)
        )
    return replace(pl, per_node=max(1, min(pl.per_node, local)), inter=inter)


class PoolCosts(Costs):
    """``Costs`` of one pool's part of the job, with the placements of the groups that leave the pool replaced."""

    def __init__(self, job: Job, crossing: dict[str, Placement]):
        self._crossing = dict(crossing)
        super().__init__(job)

    def _placement(self, group: str, op: str):
        pl = self._crossing.get(group)
        if pl is None:
            return super()._placement(group, op)
        self._placements[group, op] = pl
        return pl
