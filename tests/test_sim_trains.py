"""Trains of transfers (events.Sim.train): ZeRO-2's bucket reductions as one task per backward give the timeline a
task per bucket gives (issue 17: "events that provably repeat the same timeline may be generated once; nothing
that changes the step may be dropped").

Three checks: a hand-worked train, alone and sharing its link with a send; random trains against the same
transfers built as separate tasks (hypothesis); and whole ZeRO-2 steps simulated both ways, every Breakdown
figure within 1e-9."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.schedule.sim import SimOptions, simulate
from commtax.schedule.sim.chrome_trace import spans
from commtax.schedule.sim.events import Sim, SimError, Train, TrainShape
from commtax.spec import load_job
from commtax.spec.catalog import job_with

REL = 1e-9  # the bar: the step identical to the last digit, or within 1e-9 relative


def _sim_with_train(offsets, work, sends=(), link=True):
    """An anchor task of 10 s on a compute stream, a train launched from its start, and sends on the same link
    (each (start_s, work_s), started by a zero-work timer task on its own stream)."""
    sim = Sim()
    compute, dp = sim.stream(0, "compute"), sim.stream(0, "dp")
    nic = sim.link("nic") if link else None
    sim.task("wait", compute, 1.0)
    anchor = sim.task("pass", compute, 10.0)
    shape = TrainShape(tuple(offsets), tuple(work), tuple(1.0 for _ in work))
    train = sim.train("grad bucket", dp, shape, anchor, links=(nic,) if link else ())
    ids = []
    for i, (at, w) in enumerate(sends):
        s = sim.stream(0, f"pp{i}")
        timer = sim.task("timer", s, at)
        ids.append(sim.task("send", s, w, (timer,), "pp", links=(nic,)))
    return sim, train, ids


def test_a_train_alone_is_the_max_plus_recurrence():
    # anchor starts at 1 s; launches at 1 + (2, 5, 10): B = 3, max(6, 7) = 7, 11; ends 7, 8, 12
    sim, train, _ = _sim_with_train((2.0, 5.0, 10.0), (4.0, 1.0, 1.0))
    assert sim.run() == 12.0
    t = sim.tasks[train]
    assert (t.start_s, t.end_s, t.duration_s, t.work_s) == (3.0, 12.0, 6.0, 6.0)
    assert [(b, d) for _, b, d in t.train.spans()] == [(3.0, 4.0), (7.0, 1.0), (11.0, 1.0)]
    assert sim.events == len(sim.tasks) == 3  # one event for the three transfers


def test_a_send_on_the_link_shares_the_transfer_on_the_wire_and_the_next_one_waits():
    # the first transfer runs 3..7 alone; a send of 2 s comes at 4: both at half rate (max-min fair on one link)
    # until the send has moved its 2 s at 8; the transfer then has 3 − 2 = 1 s left: ends at 9. The second launches
    # at 9 (its offset, 1 + 5 = 6, has passed) and ends at 10; the third launches at 11.
    sim, train, (send,) = _sim_with_train((2.0, 5.0, 10.0), (4.0, 1.0, 1.0), sends=[(4.0, 2.0)])
    assert sim.run() == pytest.approx(12.0)
    assert sim.tasks[send].end_s == pytest.approx(8.0)
    assert sim.tasks[send].duration_s == pytest.approx(4.0)
    t = sim.tasks[train]
    assert [x for _, b, d in t.train.spans() for x in (b, d)] == pytest.approx([3.0, 6.0, 9.0, 1.0, 11.0, 1.0])
    assert t.duration_s - t.work_s == pytest.approx(2.0)  # what sharing the link cost it


def test_a_send_between_two_transfers_runs_alone_and_the_next_transfer_joins_it():
    # the send (1.5 s of work) comes at 7.5, after the first transfer (3..7); the second launches at 1 + 7.8 = 8.8
    # and shares: the send has 0.2 s left, done at 9.2 at half rate; the transfer moves 0.2 s by then, ends 10
    sim, train, (send,) = _sim_with_train((2.0, 7.8, 10.0), (4.0, 1.0, 1.0), sends=[(7.5, 1.5)])
    sim.run()
    assert sim.tasks[send].end_s == pytest.approx(9.2)
    spans_ = [x for _, b, d in sim.tasks[train].train.spans() for x in (b, d)]
    assert spans_ == pytest.approx([3.0, 4.0, 8.8, 1.2, 11.0, 1.0])


def test_the_next_transfer_takes_the_place_of_the_last_on_a_shared_link():
    # launches at 3, 3.5 and 11, 1 s each; a send of 3 s from 3: the first transfer and the send share 3..5 (the
    # transfer done, the send 1 s along); the second, due since 3.5, takes its place 5..7 (the send 2 s along);
    # the send ends alone at 8, the third transfer runs 11..12
    sim, train, (send,) = _sim_with_train((2.0, 2.5, 10.0), (1.0, 1.0, 1.0), sends=[(3.0, 3.0)])
    sim.run()
    assert sim.tasks[send].end_s == pytest.approx(8.0)
    spans_ = [x for _, b, d in sim.tasks[train].train.spans() for x in (b, d)]
    assert spans_ == pytest.approx([3.0, 2.0, 5.0, 2.0, 11.0, 1.0])


def test_a_train_is_checked_at_construction():
    sim = Sim()
    s = sim.stream(0, "dp")
    with pytest.raises(SimError, match="anchor"):
        sim.train("t", s, TrainShape((0.0,), (1.0,), (1.0,)), anchor=0)
    with pytest.raises(SimError, match="must not decrease"):
        TrainShape((2.0, 1.0), (1.0, 1.0), (1.0, 1.0))
    with pytest.raises(SimError, match="≥ 0"):
        TrainShape((0.0,), (-1.0,), (1.0,))


def _separate(offsets, work, sends, link=True):
    """The same transfers as tasks: the anchor cut into pieces that end at each launch, a task per transfer."""
    sim = Sim()
    compute, dp = sim.stream(0, "compute"), sim.stream(0, "dp")
    nic = sim.link("nic") if link else None
    sim.task("wait", compute, 1.0)
    ids, at = [], 0.0
    for o, w in zip(offsets, work):
        piece = sim.task("piece", compute, o - at)
        at = o
        ids.append(sim.task("bucket", dp, w, (piece,), "dp", links=(nic,) if link else ()))
    sim.task("rest", compute, max(0.0, 10.0 - at))
    sends_ = []
    for i, (t0, w) in enumerate(sends):
        s = sim.stream(0, f"pp{i}")
        timer = sim.task("timer", s, t0)
        sends_.append(sim.task("send", s, w, (timer,), "pp", links=(nic,)))
    return sim, ids, sends_


durations = st.floats(0.05, 3.0)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=6),
    work=st.data(),
    sends=st.lists(st.tuples(st.floats(0.0, 14.0), durations), max_size=4),
    link=st.booleans(),
)
def test_a_train_runs_as_its_transfers_would_as_separate_tasks(gaps, work, sends, link):
    offsets = tuple(math.fsum(gaps[: i + 1]) for i in range(len(gaps)))
    w = tuple(work.draw(st.lists(durations, min_size=len(gaps), max_size=len(gaps))))
    sends = sends if link else []
    a, train, a_sends = _sim_with_train(offsets, w, sends, link)
    b, buckets, b_sends = _separate(offsets, w, sends, link)
    assert a.run() == pytest.approx(b.run(), rel=1e-12, abs=1e-12)
    got = [x for _, s, d in a.tasks[train].train.spans() for x in (s, d)]
    want = [x for i in buckets for x in (b.tasks[i].start_s, b.tasks[i].duration_s)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert [a.tasks[i].end_s for i in a_sends] == pytest.approx([b.tasks[i].end_s for i in b_sends], abs=1e-12)


def _flat(b) -> dict:
    out = {}
    for k, v in dataclasses.asdict(b).items():
        if isinstance(v, dict):
            out.update({f"{k}.{x}": y for x, y in v.items()})
        elif k != "notes":  # the event count differs: that is the point
            out[k] = v
    return out


def _same(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        if isinstance(fa[k], float):
            assert fa[k] == pytest.approx(fb[k], rel=REL, abs=1e-12), k
        else:
            assert fa[k] == fb[k], k


def _small(**plan):
    """Llama-3-405B's shape cut to 4 layers: tp 8 spans a node, so PP sends and DP buckets share each GPU's NIC."""
    job = load_job("benchmarks/llama3-405b-16k-h100-fits.yaml")
    job = job.model_copy(update={"model": job.model.model_copy(update={"layers": 4 * plan.get("vp", 1)})})
    return job_with(job, **{"zero": 2, "pp": 2, "vp": 1, **plan})


STEPS = {
    "1f1b, NIC shared": ({}, SimOptions()),
    "interleaved vp2": ({"vp": 2}, SimOptions()),
    "tp overlapped": ({"overlap": {"tp": True, "dp": True, "pp": True}}, SimOptions()),
    "zb-h1": ({"schedule": "zb-h1"}, SimOptions()),
    "no NIC sharing": ({}, SimOptions(nic_contention=False)),
    "8 MiB buckets": ({}, SimOptions(bucket_bytes=8 * 2**20)),
}


@pytest.mark.parametrize("plan,options", STEPS.values(), ids=STEPS.keys())
def test_zero2_steps_are_the_same_with_trains_as_with_a_task_per_bucket(plan, options):
    job = _small(**plan)
    fast = simulate(job, options, compare=False)
    slow = simulate(job, dataclasses.replace(options, bucket_trains=False), compare=False)
    trains = [t for t in fast.sim.tasks if t.train is not None]
    assert len(trains) == job.micro_batches * job.plan.pp * job.plan.vp  # one per backward
    assert fast.events < slow.events
    assert fast.breakdown.step_time_s == pytest.approx(slow.breakdown.step_time_s, rel=REL)
    _same(fast.breakdown, slow.breakdown)
    if options.nic_contention:  # the sharing path ran: some bucket shared the NIC with a send
        assert any(t.train.took for t in trains)
    drawn = sum(1 for x in spans(fast.sim) if x[0].name == "grad bucket")
    assert drawn == sum(1 for x in spans(slow.sim) if x[0].name == "grad bucket")  # the trace draws every bucket


def test_a_nic_held_as_a_channel_keeps_a_task_per_bucket():
    job = _small()
    r = simulate(job, SimOptions(network="channel"), compare=False)
    assert not any(t.train for t in r.sim.tasks)


def test_moe_and_pools_zero2_steps_are_the_same_with_trains():
    moe = load_job("examples/moe/deepseek-v3-h800.yaml")
    # 8 layers on pp 2 and 30 micro-batches per replica (15 at the example's batch: DualPipe takes an even number)
    batch = moe.training.model_copy(update={"global_batch": 2 * moe.training.global_batch})
    moe = moe.model_copy(update={"model": moe.model.model_copy(update={"layers": 8}), "training": batch})
    moe = job_with(moe, zero=2, pp=2, pipeline_layout=None)  # the example's 16-stage layout: not for 8 layers on 2
    pools = load_job("examples/pools/llama2-70b-a100-4090.yaml")  # 128 micro-batches: 8 are enough here
    training = pools.training.model_copy(update={"global_batch": pools.training.global_batch // 16})
    pools = job_with(pools.model_copy(update={"training": training}), zero=2)
    for job in (moe, pools):
        fast, slow = (simulate(job, SimOptions(bucket_trains=x), compare=False) for x in (True, False))
        assert any(t.train for t in fast.sim.tasks)
        _same(fast.breakdown, slow.breakdown)


@settings(max_examples=80, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=8),
    data=st.data(),
    anchor_s=st.floats(0.0, 5.0),
    free_s=st.floats(0.0, 12.0),
)
def test_a_train_priced_again_is_its_recurrence_stepped_one_transfer_at_a_time(gaps, data, anchor_s, free_s):
    """``Train.end_after`` (``_makespan_without``): closed form around the transfers that took longer, against
    B_j = max(anchor + offset_j, E_{j−1}), E_j = B_j + d_j stepped over every transfer."""
    offsets = tuple(math.fsum(gaps[: i + 1]) for i in range(len(gaps)))
    n = len(offsets)
    work = tuple(data.draw(st.lists(durations, min_size=n, max_size=n)))
    shape = TrainShape(offsets, work, (1.0,) * n)
    tr = Train(shape, 0)
    slower = data.draw(st.dictionaries(st.integers(0, n - 1), st.floats(0.0, 2.0), max_size=3))
    tr.took = {j: work[j] + x for j, x in slower.items()} or None
    end = free_s
    for o, d in zip(offsets, tr.durations()):
        end = max(anchor_s + o, end) + d
    assert tr.end_after(anchor_s, free_s, False) == pytest.approx(end, rel=1e-12, abs=1e-12)
    assert tr.end_after(anchor_s, free_s, True) == max(free_s, anchor_s + offsets[-1])
