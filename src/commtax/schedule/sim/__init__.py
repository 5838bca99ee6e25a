"""Event simulator of one training step: pipeline schedules, streams, buckets, a timeline.

``simulate(job)`` -> ``SimResult`` whose ``breakdown`` has the same fields as ``estimate(job)``.
"""

from commtax.schedule.sim.events import Sim, SimError
from commtax.schedule.sim.simulate import SimResult, simulate
from commtax.schedule.sim.step import SimOptions
from commtax.workload.step import DDP_BUCKET_BYTES

__all__ = ["DDP_BUCKET_BYTES", "Sim", "SimError", "SimOptions", "SimResult", "simulate"]
