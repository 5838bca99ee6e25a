"""The event simulator on stages placed on GPU pools (``plan.stage_pools``): each stage's passes priced on its own
pool (``schedule.pools.pool_job``), sends at the slowest link between the pools (``costs.pools``), so the timeline
shows each pool's stages as they are. The DP reduction and the optimizer are priced on the first pool's stage
costs (the analytical estimate prices them per pool)."""

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
        super().__init__(job, self.pool_wls[first], options, costs or self.pool_costs[first])
        if self.p > 1:  # every send at the slowest boundary, as the estimate prices it
            self.t_send = max(c.collective(self.wl.pp_send) for c in self.pool_costs.values())

    def _chunk(self, k: int):
        i = self.where[k % self.p]
        # the pools' workloads share their layer blocks (same model and plan): prices are cached per pool
        wl, costs, cache = self.wl, self.costs, self._phase_cache
        self.wl, self.costs, self._phase_cache = self.pool_wls[i], self.pool_costs[i], self.pool_phases[i]
        try:
            return super()._chunk(k)
        finally:
            self.wl, self.costs, self._phase_cache = wl, costs, cache
