"""The discrete-event core and the pipeline schedule generators."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.schedule.sim.events import Sim, SimError
from commtax.schedule.sim.pipeline import (
    Pass,
    by_stage,
    dependency_order,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    schedule,
)


# ----------------------------------------------------------------------------- event core
def test_streams_run_in_order_and_wait_for_dependencies():
    sim = Sim()
    a, b = sim.stream(0, "compute"), sim.stream(1, "compute")
    f0 = sim.task("fwd", a, 1.0)
    sim.task("fwd", b, 1.0, deps=[f0])
    sim.task("bwd", a, 2.0)
    assert sim.run() == 3.0
    assert sim.trace() == [("fwd", 0, 0.0), ("fwd", 1, 1.0), ("bwd", 0, 1.0)]


def test_a_shared_channel_serialises_two_streams_in_ready_order():
    sim = Sim()
    nic = sim.channel("nic0")
    dp, pp, comp = sim.stream(0, "dp"), sim.stream(0, "pp"), sim.stream(0, "compute")
    c = sim.task("compute", comp, 1.0)
    bucket = sim.task("bucket", dp, 2.0, channel=nic)  # ready at 0
    send = sim.task("send", pp, 0.5, deps=[c], channel=nic)  # ready at 1, NIC busy until 2
    sim.run()
    assert sim.tasks[send].start_s == 2.0
    assert sim.tasks[send].ready_s == 1.0
    assert sim.tasks[send].cause == bucket


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_negative_or_nan_duration_raises_at_construction(bad):
    sim = Sim()
    s = sim.stream(0, "compute")
    with pytest.raises(SimError, match="duration"):
        sim.task("x", s, bad)


def test_dangling_dependency_raises_at_construction():
    sim = Sim()
    s = sim.stream(0, "compute")
    sim.task("a", s, 1.0)
    with pytest.raises(SimError, match="dependency 5 does not exist"):
        sim.task("b", s, 1.0, deps=[5])
    with pytest.raises(SimError, match="stream 3 does not exist"):
        sim.task("c", 3, 1.0)


def test_equal_times_are_ordered_by_priority_then_sequence():
    sim = Sim()
    streams = [sim.stream(d, "compute") for d in range(3)]
    for d, s in enumerate(streams):
        sim.task(f"t{d}", s, 1.0, priority=2 - d)
    sim.run()
    # all end at 1.0; the heap pops by (time, priority, sequence): t2 (priority 0) first
    assert sim.events == 3
    assert [t.end_s for t in sim.tasks] == [1.0, 1.0, 1.0]


def test_a_sim_runs_once():
    sim = Sim()
    sim.task("a", sim.stream(0, "c"), 1.0)
    sim.run()
    with pytest.raises(SimError, match="runs once"):
        sim.run()


# ----------------------------------------------------------------------------- schedules
def order(gen, p):
    return [[(x.phase, x.mb, x.chunk) for x in stage] for stage in by_stage(gen, p)]


def test_1f1b_order_two_stages():
    assert order(one_f_one_b(2, 3), 2) == [
        [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0), ("B", 2, 0)],  # warm-up 1
        [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0), ("B", 2, 0)],
    ]


def test_gpipe_order_two_stages():
    assert order(gpipe(2, 2), 2)[0] == [("F", 0, 0), ("F", 1, 0), ("B", 1, 0), ("B", 0, 0)]


def test_interleaved_order_two_stages_two_chunks():
    stages = order(interleaved_1f1b(2, 2, 4), 2)
    # groups of p = 2 micro-batches, chunk-major: (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) ...
    # stage 0 warms up 2(p−1) + (v−1)·p = 4 forwards, stage 1: 2
    assert stages[0][:6] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0), ("B", 0, 1)]
    assert stages[1][:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1)]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 20), st.sampled_from(["gpipe", "1f1b"]))
def test_every_schedule_runs_each_pass_once_and_never_deadlocks(p, v, m, name):
    if p == 1:
        v = 1
    passes = list(schedule(name, p, m, v))
    assert sorted(passes) == sorted(
        Pass(s, i, c, ph) for s in range(p) for i in range(m) for c in range(v) for ph in "FB"
    )
    stages = by_stage(passes, p)
    for s in stages:  # a stage's forward of a (micro-batch, chunk) comes before its backward
        seen = set()
        for x in s:
            assert x.phase == "F" or (x.mb, x.chunk) in seen
            seen.add((x.mb, x.chunk))
    assert len(list(dependency_order(stages, p, v))) == len(passes)


def test_a_tail_is_part_of_the_task_and_must_fit_in_it():
    sim = Sim()
    s = sim.stream(0, "compute")
    sim.stream(0, "tp")
    t = sim.task("F", s, 3.0, tail=(("tp", "tp", 1.0),))  # 2 s of compute, then 1 s of TP the stream waits for
    sim.task("B", s, 1.0)
    assert sim.run() == 4.0
    assert sim.tasks[t].tail == (("tp", "tp", 1.0),)
    with pytest.raises(SimError, match="tail"):
        sim.task("x", s, 1.0, tail=(("tp", "tp", 2.0),))
