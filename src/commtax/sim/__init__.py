"""Event simulator of one training step: pipeline schedules, streams, buckets, a timeline.

``simulate(job)`` -> ``SimResult`` whose ``breakdown`` has the same fields as ``estimate(job)``.
"""

from commtax.sim.events import Sim, SimError
from commtax.sim.simulate import SimResult, simulate
from commtax.sim.step import DDP_BUCKET_BYTES, SimOptions

__all__ = ["DDP_BUCKET_BYTES", "Sim", "SimError", "SimOptions", "SimResult", "simulate"]
