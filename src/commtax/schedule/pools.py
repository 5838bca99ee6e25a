"""The analytical schedule on a cluster of several GPU pools (spec/pools.py).

* Stages on pools (``plan.stage_pools``): stage s is priced on its pool's GPU and links (a job of that pool's
  hardware and the same plan, ``pool_job``); the pipeline follows the slowest stage (``pipeline_bubble``,
  ``pp_exposed`` over the mixed stage list); a send between two pools runs at the slowest link it crosses
  (``cross_pool_level``; every send of the pipeline is priced at that boundary, the slowest); each stage's DP
  reduction stays inside its pool, the step waits for the slowest; memory is checked per pool.
* Data parallelism across pools (no ``stage_pools``): pool i runs whole pipelines on its share of the batch
  (``pool_batch_share``); the gradient reduction spans every replica at the slowest link it crosses; the step is
  the slowest pool's (the others wait at the reduction).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from commtax.costs.pools import PoolCosts, binding_link, cross_pool_level, dp_cross_placement, pp_cross_placement
from commtax.schedule.analytical import (
    StageTime,
    dp_exposed,
    dualpipe_dp_workload,
    dualpipe_ranks_bubble,
    estimate,
    pipeline_bubble,
    pipeline_ranks,
    plan_notes,
    pp_exposed,
    rank_pair,
    slowest_stage,
    stage_times,
    step_parts,
)
from commtax.schedule.breakdown import Breakdown, make_breakdown
from commtax.spec import Job, build, pool_cluster, pool_shares, stage_pool_indices
from commtax.workload.memory import stage_memory
from commtax.workload.step import build_workload


@dataclass(frozen=True)
class PoolPart:
    """What one pool does in the step, as reports show it."""

    pool: str
    gpu: str
    num_gpus: int
    stages: tuple[int, ...]  # pipeline stages on this pool (all of them: data parallelism across pools)
    layers: tuple[int, ...]  # their layers
    stage_s: tuple[float, ...]  # one micro-batch (fwd + bwd) on each of them
    micro_batches: int  # per pipeline per step
    step_s: float  # the pool's own step (data parallelism across pools) or its stages' m·T_max (stages)
    memory_gib: float  # the fullest of its stages
    mem_GiB: float  # the pool's GPU memory
    fits: bool
    straggler: bool = False

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def pool_job(job: Job, i: int, num_gpus: int | None = None, global_batch: int | None = None) -> Job:
    """The job as pool i sees it: pool i's hardware, the same plan without the pool fields, validated again
    (so the pool's own rules apply: its precision peaks, eager attention on architectures without fused kernels)."""
    cluster = pool_cluster(job.cluster, i)
    if num_gpus is not None:
        cluster = cluster.model_copy(update={"num_gpus": num_gpus})
    plan = job.plan.replace(stage_pools=None, pool_batch_share=None, dp=None)
    training = job.training if global_batch is None else job.training.model_copy(update={"global_batch": global_batch})
    return build(Job, {"model": job.model, "cluster": cluster, "plan": plan, "training": training}, "")


def pooled_estimate(job: Job) -> Breakdown:
    """``estimate`` of a job on a cluster with pools."""
    if job.plan.stage_pools is not None:
        return _stages_on_pools(job)
    return _dp_across_pools(job)


def _stages_on_pools(job: Job) -> Breakdown:
    c, p = job.cluster, job.plan
    where = stage_pool_indices(job)
    used = sorted(set(where))
    cross = cross_pool_level(job, used, p.tp * p.cp * job.dp)  # a stage's GPUs all send at once
    jobs, wls, costs, per_pool = {}, {}, {}, {}
    for i in used:
        jobs[i] = pool_job(job, i, num_gpus=c.num_gpus)
        wls[i] = build_workload(jobs[i])
        costs[i] = PoolCosts(jobs[i], {"pp": pp_cross_placement(jobs[i], cross)} if len(used) > 1 else {})
        per_pool[i] = stage_times(jobs[i], wls[i], costs[i])
    stages = [per_pool[where[s]][s] for s in range(p.pp)]
    m = wls[used[0]].micro_batches
    ranks = pool_ranks(p.schedule, where, per_pool, stages)
    slow = slowest_stage(ranks)  # DualPipe: the busiest rank's two stages, as ``estimate``
    slow_pool = where[ranks.index(slow)]
    sends = [pp_exposed(jobs[i], wls[i], costs[i], stages) for i in used]
    pp_link, pp_exp, pp_bytes = max(sends, key=lambda x: x[1])
    dps = {}
    for i in used:
        own = [ranks[s] for s in range(p.pp) if where[s] == i]
        # DualPipe: a rank reduces both of its stages' gradients (``dualpipe_dp_workload``, dense)
        dps[i] = dp_exposed(jobs[i], dualpipe_dp_workload(jobs[i], wls[i]), costs[i], max(own, key=lambda st: st.total))
    dp_pool = max(used, key=lambda i: dps[i][1])
    dp_link, dp_exp, dp_bytes = dps[dp_pool]
    optimizer = max(costs[i].compute(wls[i].optimizer) for i in used)
    parts = step_parts(
        micro_batches=m,
        compute=slow.compute,
        recompute=slow.recompute,
        tp_exposed=slow.tp_exposed,
        cp_exposed=slow.cp_exposed,
        bubble_s=dualpipe_ranks_bubble(ranks, m)
        if p.schedule == "dualpipe"
        else pipeline_bubble(p.schedule, m, p.vp, stages),
        pp_exposed=pp_exp,
        dp_exposed=dp_exp,
        optimizer=optimizer,
    )
    comm_time = {"tp": m * slow.link.comm.get("tp", 0.0), "cp": m * slow.link.comm.get("cp", 0.0)}
    comm_time |= {"pp": pp_link, "dp": dp_link}
    comm_bytes = {"tp": m * slow.link.comm_bytes.get("tp", 0.0), "cp": m * slow.link.comm_bytes.get("cp", 0.0)}
    comm_bytes |= {"pp": pp_bytes, "dp": dp_bytes}
    split = job.stage_layers
    pools = []
    for i in used:
        own = tuple(s for s in range(p.pp) if where[s] == i)
        mem = stage_memory(jobs[i], own)
        gib = max(x.total for x in mem) / 2**30
        pools.append(
            PoolPart(
                pool=c.pools[i].label,
                gpu=c.pools[i].gpu.name,
                num_gpus=c.pools[i].num_gpus,
                stages=own,
                layers=tuple(split[s] for s in own),
                stage_s=tuple(stages[s].total for s in own),
                micro_batches=m,
                step_s=m * max(ranks[s].total for s in own),  # DualPipe: its ranks' (two stages each)
                memory_gib=gib,
                mem_GiB=c.pools[i].gpu.mem_GiB,
                fits=all(x.total <= c.pools[i].gpu.mem_bytes for x in mem),
                straggler=i == slow_pool,
            )
        )
    fullest = {i: max(stage_memory(jobs[i], x.stages), key=lambda mm: mm.total) for i, x in zip(used, pools)}
    binding = max(used, key=lambda i: fullest[i].total / c.pools[i].gpu.mem_bytes)  # the pool nearest its limit
    mem_gib = fullest[binding].gib()
    notes = plan_notes(jobs[slow_pool], wls[slow_pool]) + pool_notes(
        pools, cross, binding_link(job, used, p.tp * p.cp * job.dp)
    )
    b = make_breakdown(
        job, build_workload(job), parts, comm_time, comm_bytes, mem_gib, all(x.fits for x in pools), notes=notes
    )
    return _mixed_peak(job, b, pools)


def _dp_across_pools(job: Job) -> Breakdown:
    c, p = job.cluster, job.plan
    shares = pool_shares(job)
    n = job.dp * p.cp  # the gradient reduction group: every replica's shard
    cross = cross_pool_level(job, range(len(c.pools)), p.tp * p.cp * p.pp)  # one ring per shard crosses at once
    parts, outs = [], []
    for i, pool in enumerate(c.pools):
        dp_i = pool.num_gpus // (p.tp * p.cp * p.pp)
        m_i = round(shares[i] * job.training.global_batch) // (dp_i * p.micro_batch)
        # pool i's pipelines run m_i micro-batches each; the gradient reduction and the training state's shards
        # span every replica: priced as the job on pool i's hardware with the whole DP group and m_i micro-batches
        state = pool_job(job, i, num_gpus=c.num_gpus, global_batch=job.dp * p.micro_batch * m_i)
        wi = build_workload(state)
        crossing = {"dp": dp_cross_placement(state, n, dp_i * p.cp, cross)} if len(c.pools) > 1 else {}
        bi = estimate(state, wi, PoolCosts(state, crossing))
        step = dict(bi.breakdown_s)
        mem = stage_memory(state)
        fullest = max(mem, key=lambda x: x.total)
        outs.append((step, bi, fullest))
        parts.append(
            PoolPart(
                pool=pool.label,
                gpu=pool.gpu.name,
                num_gpus=pool.num_gpus,
                stages=tuple(range(p.pp)),
                layers=tuple(state.stage_layers),
                stage_s=(sum(step.values()) / wi.micro_batches,),  # its step per micro-batch
                micro_batches=wi.micro_batches,
                step_s=sum(step.values()),
                memory_gib=fullest.total / 2**30,
                mem_GiB=pool.gpu.mem_GiB,
                fits=fullest.total <= pool.gpu.mem_bytes,
            )
        )
    slow = max(range(len(outs)), key=lambda i: parts[i].step_s)
    parts[slow] = replace(parts[slow], straggler=True)
    step, bs, _ = outs[slow]
    binding = max(range(len(parts)), key=lambda i: parts[i].memory_gib / parts[i].mem_GiB)
    notes = list(bs.notes) + pool_notes(parts, cross, binding_link(job, range(len(c.pools)), p.tp * p.cp * p.pp))
    fits = all(x.fits for x in parts)
    wl = build_workload(job)
    b = make_breakdown(job, wl, step, bs.comm_time_s, bs.comm_bytes_per_gpu, outs[binding][2].gib(), fits, notes=notes)
    return _mixed_peak(job, b, parts)


def _mixed_peak(job: Job, b: Breakdown, pools: list[PoolPart]) -> Breakdown:
    """MFU and HFU against the cluster's mean peak (Σ n_i · peak_i / N), not the first pool's, and the pools."""
    c, prec = job.cluster, job.training.precision
    mean_peak = sum(q.num_gpus * q.gpu.peak_flops(prec) for q in c.pools) / c.num_gpus
    scale = c.gpu.peak_flops(prec) / mean_peak
    return replace(b, mfu=b.mfu * scale, hfu=b.hfu * scale, pools=[x.to_dict() for x in pools])


def pool_ranks(
    schedule: str, where: list[int], per_pool: dict[int, list[StageTime]], stages: list[StageTime]
) -> list[StageTime]:
    """Each pipeline rank's micro-batch (``analytical.pipeline_ranks``): the stages on their pools, except under
    DualPipe, where rank r's GPUs (on pool ``where[r]``) run model stages r and p − 1 − r, both priced on that pool
    (``analytical.rank_pair``), as the simulator runs them (``sim.pools.PoolStepBuilder``)."""
    if schedule != "dualpipe" or len(stages) < 2:
        return pipeline_ranks(schedule, stages)
    p = len(stages)
    return [rank_pair(per_pool[where[r]][r], per_pool[where[r]][p - 1 - r]) for r in range(p)]


def pool_notes(pools: list[PoolPart], cross, binding: str) -> list[str]:
    """Which pool straggles and which link joins the pools, in words."""
    out = []
    for x in pools:
        if x.straggler:
            out.append(
                f"straggler: pool {x.pool} ({x.gpu}), stages {list(x.stages)}, {max(x.stage_s):.4g} s per micro-batch "
                "on its slowest stage"
            )
        if not x.fits:
            out.append(f"pool {x.pool}: a stage needs {x.memory_gib:.1f} GiB of the {x.mem_GiB:g} GiB per GPU")
    out.append(
        f"traffic between the pools runs at {cross.bw_bytes_per_s / 1e9:.3g} GB/s per GPU stream: {binding} binds"
    )
    return out
