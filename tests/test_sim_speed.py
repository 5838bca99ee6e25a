"""The simulator's by-value caches (a pass's pieces, templates and codec times priced once per chunk) change
no figure: every Breakdown field equals the uncached path's on small jobs (issue 17)."""

from __future__ import annotations

import importlib

import pytest

from commtax.schedule.sim.simulate import simulate
from commtax.schedule.sim.step import StepBuilder
from commtax.spec import load_job
from commtax.spec.catalog import job_with

JOB = "benchmarks/llama3-405b-16k-h100-fits.yaml"


class Uncached(StepBuilder):
    def _pass_template(self, k, which, frac):
        self._templates.clear()
        return super()._pass_template(k, which, frac)

    def _pieces(self, dev, x, chunk):
        self._cuts.clear()
        self._codec.clear()
        return super()._pieces(dev, x, chunk)


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("vp", [1, 2])
def test_cached_equals_uncached(zero, vp, monkeypatch):
    job = job_with(load_job(JOB), zero=zero, vp=1, pp=2)
    job = job.model_copy(
        update={
            "model": job.model.model_copy(update={"layers": 4 * vp}),
            "plan": job.plan.model_copy(update={"vp": vp}),
        }
    )
    fast = simulate(job, compare=False).breakdown
    monkeypatch.setattr(importlib.import_module("commtax.schedule.sim.simulate"), "StepBuilder", Uncached)
    slow = simulate(job, compare=False).breakdown
    assert fast == slow  # every field, to the bit
