"""Clusters of several GPU pools (the seed article's "A100 for the critical nodes, 4090 for the rest").

A pool is a homogeneous block of nodes: its own GPU, node size, scale-up link, network and NICs. A cluster with
``pools`` is still one :class:`~commtax.spec.hardware.Cluster`; its top-level fields describe the first pool, so
code that reads one GPU keeps working, and every per-pool price is taken on the pool's own view (``pool_cluster``).

How pools reach each other: over the shared network (each pool's own NICs; a crossing runs at the slower side), or
over an explicit ``inter_pool`` link whose line rate all GPUs crossing at once share.

Two ways to place a job on pools (``plan``):

* ``stage_pools``: pipeline stage s runs on pool ``stage_pools[s]`` (its tp·cp·dp GPUs inside that pool);
* no ``stage_pools``: data parallelism across pools, each pool holding whole pipeline replicas, and
  ``pool_batch_share`` the share of the global batch each pool computes (compute share decoupled from the shard of
  the training state, as Cephalo and Poplar do; default: the same per replica).

TP, CP and EP groups never cross pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commtax.spec.hardware import Cluster
    from commtax.spec.job import Job


POOL_FIELDS = ("gpu", "num_gpus", "gpus_per_node", "intra_node", "inter_node", "nics_per_node")


def fill_from_pools(data: dict) -> dict:
    """A cluster mapping with ``pools``: the top-level hardware fields come from the first pool, num_gpus is the
    sum. A top-level field that says otherwise is refused (which one would win?)."""
    pools = data.get("pools")
    if not pools or not isinstance(pools, (list, tuple)):
        return data
    rows = [p.model_dump() if hasattr(p, "model_dump") else p for p in pools]
    if not all(isinstance(r, dict) for r in rows):
        return data  # pydantic names the bad entry
    implied = {f: rows[0][f] for f in POOL_FIELDS if f in rows[0]}
    try:
        implied["num_gpus"] = sum(int(r["num_gpus"]) for r in rows)
    except (KeyError, TypeError, ValueError):
        implied.pop("num_gpus", None)  # pydantic names the missing or bad num_gpus
    out = dict(data)
    for f, v in implied.items():
        have = out.get(f)
        if have is not None and _dumped(have) != _dumped(v):
            raise ValueError(
                f"{f}: a cluster with pools gives {f} per pool (the top level is the first pool's, num_gpus their "
                "sum); remove it from the cluster or drop pools"
            )
        out[f] = v
    return out


def _dumped(v):
    return v.model_dump() if hasattr(v, "model_dump") else v


def pool_cluster(cluster: Cluster, i: int) -> Cluster:
    """Pool ``i`` as a cluster of its own (what its stages are priced on)."""
    p = cluster.pools[i]
    return cluster.model_copy(
        update={
            "pools": None,
            "inter_pool": None,
            "gpu": p.gpu,
            "num_gpus": p.num_gpus,
            "gpus_per_node": p.gpus_per_node,
            "intra_node": p.intra_node,
            "inter_node": p.inter_node,
            "nics_per_node": p.nics_per_node,
            "profile": None,
            "emulated": None,
        }
    )


def pool_index(cluster: Cluster, key: int | str, field: str) -> int:
    """A pool named by its index or its label."""
    labels = [p.label for p in cluster.pools]
    if isinstance(key, int):
        if not 0 <= key < len(labels):
            raise ValueError(f"{field}: pool {key} does not exist; use 0..{len(labels) - 1} or one of {labels}")
        return key
    if key not in labels:
        raise ValueError(f"{field}: no pool named {key!r}; use one of {labels} (or an index)")
    return labels.index(key)


def check_pools(job: Job) -> None:
    """Cross-field rules of a job on pools; raises ValueError naming the field, the rule and the fix."""
    c, p = job.cluster, job.plan
    if not c.pools:
        if p.stage_pools is not None or p.pool_batch_share is not None:
            f = "stage_pools" if p.stage_pools is not None else "pool_batch_share"
            raise ValueError(f"{f} needs a cluster with pools (cluster.pools); remove it or describe the pools")
        return
    labels = [x.label for x in c.pools]
    if len(set(labels)) != len(labels):
        raise ValueError(f"cluster.pools: two pools share a name ({labels}); give each a distinct name:")
    inner = p.tp * p.cp
    for pool in c.pools:
        if pool.num_gpus % inner:
            raise ValueError(
                f"tp({p.tp}) * cp({p.cp}) = {inner} does not divide pool {pool.label}'s {pool.num_gpus} GPUs: a TP "
                "(and CP, EP) group stays inside one pool; choose tp*cp dividing every pool's GPU count"
            )
        if pool.num_gpus > pool.gpus_per_node and pool.num_gpus % pool.gpus_per_node:
            raise ValueError(
                f"cluster.pools.{pool.label}: num_gpus ({pool.num_gpus}) must be a multiple of gpus_per_node "
                f"({pool.gpus_per_node}) when the pool spans nodes"
            )
    if p.stage_pools is not None:
        if p.pool_batch_share is not None:
            raise ValueError(
                "pool_batch_share: a pipeline split over pools (stage_pools) runs every micro-batch on every "
                "stage; give pool_batch_share only for data parallelism across pools (no stage_pools)"
            )
        if len(p.stage_pools) != p.pp:
            raise ValueError(f"stage_pools has {len(p.stage_pools)} entries; give one pool per stage, pp({p.pp})")
        idx = [pool_index(c, k, "stage_pools") for k in p.stage_pools]
        per_stage = inner * job.dp
        for i, pool in enumerate(c.pools):
            need = idx.count(i) * per_stage
            if need != pool.num_gpus:
                raise ValueError(
                    f"stage_pools: pool {pool.label} has {pool.num_gpus} GPUs but its {idx.count(i)} stage(s) need "
                    f"{idx.count(i)} * tp*cp*dp({per_stage}) = {need}; give it {pool.num_gpus // per_stage} stage(s)"
                )
        return
    replica = inner * p.pp
    for pool in c.pools:
        if pool.num_gpus % replica:
            raise ValueError(
                f"tp({p.tp}) * cp({p.cp}) * pp({p.pp}) = {replica} does not divide pool {pool.label}'s "
                f"{pool.num_gpus} GPUs: without stage_pools each pool holds whole pipeline replicas (TP and PP "
                "inside a pool); give stage_pools or change tp/pp"
            )
    shares = pool_shares(job)
    for pool, share in zip(c.pools, shares):
        dp_i = pool.num_gpus // replica
        seqs = share * job.training.global_batch
        if abs(seqs - round(seqs)) > 1e-6 or round(seqs) % (dp_i * p.micro_batch) or round(seqs) == 0:
            raise ValueError(
                f"pool_batch_share: pool {pool.label}'s share {share:g} of global_batch({job.training.global_batch}) "
                f"is {seqs:g} sequences; it must be a positive multiple of its dp({dp_i}) * micro_batch"
                f"({p.micro_batch}) = {dp_i * p.micro_batch}"
            )


def pool_shares(job: Job) -> tuple[float, ...]:
    """Share of the global batch each pool computes (data parallelism across pools): as given, else per replica."""
    c, p = job.cluster, job.plan
    if p.pool_batch_share is not None:
        if len(p.pool_batch_share) != len(c.pools):
            raise ValueError(
                f"pool_batch_share has {len(p.pool_batch_share)} entries; give one per pool ({len(c.pools)})"
            )
        if abs(sum(p.pool_batch_share) - 1) > 1e-6:
            raise ValueError(
                f"pool_batch_share {list(p.pool_batch_share)} must sum to 1, got {sum(p.pool_batch_share):g}"
            )
        return tuple(p.pool_batch_share)
    return tuple(pool.num_gpus / c.num_gpus for pool in c.pools)


def stage_pool_indices(job: Job) -> tuple[int, ...]:
    """Pool of each pipeline stage (stage_pools), as indices."""
    return tuple(pool_index(job.cluster, k, "stage_pools") for k in job.plan.stage_pools)
