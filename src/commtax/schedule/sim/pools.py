"""The event simulator on stages placed on GPU pools (``plan.stage_pools``): each stage's passes priced on its own
pool (``schedule.pools.pool_job``), sends at the slowest link between the pools (``costs.pools``), so the timeline
shows each pool's stages as they are. The DP reduction and the optimizer are priced on the first pool's stage
costs (the analytical estimate prices them per pool). DualPipe: rank r runs both of its model stages (r and
p − 1 − r) on its own pool."""

from __future__ import annotations

from commtax.costs.pools import PoolCosts, cross_pool_level, pp_cross_placement
from commtax.schedule.sim.step import StepBuilder
from commtax.spec import Job, stage_pool_indices
from commtax.workload.step import build_workload


class PoolStepBuilder(StepBuilder):
    """A ``StepBuilder`` whose chunk k is priced on the pool of its stage k mod p."""

    def __init__(self, job: Job, options, costs=None):
        from commtax.schedule.pools import pool_job  # the analytical pool module builds the per-pool jobs

        p = job.plan
        self.where = stage_pool_indices(job)
        used = sorted(set(self.where))
        cross = cross_pool_level(job, used, p.tp * p.cp * job.dp)
        self.pool_wls, self.pool_costs, self.pool_phases = {}, {}, {i: {} for i in used}
        for i in used:
            ji = pool_job(job, i, num_gpus=job.cluster.num_gpus)
            self.pool_wls[i] = build_workload(ji)
            self.pool_costs[i] = PoolCosts(ji, {"pp": pp_cross_placement(ji, cross)} if len(used) > 1 else {})
        first = self.where[0]
        self._pool: int | None = None  # the pool a chunk is priced on, where not its stage's (``_chunk``)
        super().__init__(job, self.pool_wls[first], options, costs or self.pool_costs[first])
        if self.p > 1:  # every send at the slowest boundary, as the estimate prices it
            self.t_send = max(c.collective(self.wl.pp_send) for c in self.pool_costs.values())
        if self.dual == "dualpipe" and len(used) > 1:
            # the reverse pipeline's virtual stage p + j runs model stage j on rank p − 1 − j: on that rank's pool
            # (``schedule.pools.pool_ranks``), not stage j's; the same layers and parameters, its pool's prices
            p, V = self.p, self.V
            self.V = p  # ``_chunk`` puts the head on virtual stage V − 1: model stage p − 1's
            try:
                for j in range(p):
                    self._pool = self.where[p - 1 - j]
                    self.chunks[p + j] = self._chunk(j)
            finally:
                self._pool, self.V = None, V

    def _chunk(self, k: int):
        i = self.where[k % self.p] if self._pool is None else self._pool
        # the pools' workloads share their layer blocks (same model and plan): prices are cached per pool
        wl, costs, cache = self.wl, self.costs, self._phase_cache
        self.wl, self.costs, self._phase_cache = self.pool_wls[i], self.pool_costs[i], self.pool_phases[i]
        try:
            return super()._chunk(k)
        finally:
            self.wl, self.costs, self._phase_cache = wl, costs, cache
