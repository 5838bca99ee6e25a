"""The simulator's flow-level network: transfers on shared links at max-min fair rates (issue 20)."""

from __future__ import annotations

import pytest

from commtax.schedule.sim.events import Sim, SimError
from commtax.schedule.sim.network import FlowNetwork


def two_streams(sim: Sim):
    return sim.stream(0, "a"), sim.stream(0, "b")


def test_two_transfers_on_one_link_share_it_and_end_together():
    sim = Sim()
    a, b = two_streams(sim)
    nic = sim.link("nic")
    x = sim.task("x", a, 1.0, kind="dp", links=(nic,))
    y = sim.task("y", b, 1.0, kind="pp", links=(nic,))
    assert sim.run() == 2.0  # 1 s each at rate 1/2
    assert (sim.tasks[x].end_s, sim.tasks[y].end_s) == (2.0, 2.0)
    assert sim.tasks[x].work_s == 1.0 and sim.tasks[x].duration_s == 2.0


def test_a_channel_serialises_what_the_link_shares():
    sim = Sim()
    a, b = two_streams(sim)
    ch = sim.channel("nic")
    sim.task("x", a, 1.0, channel=ch)
    y = sim.task("y", b, 1.0, channel=ch)
    assert sim.run() == 2.0 and sim.tasks[y].start_s == 1.0  # the same makespan, one after the other


def test_a_transfer_limited_elsewhere_leaves_the_rest_of_the_link():
    # x crosses the NIC (capacity 1) and a slow uplink (0.25); y only the NIC: x = 0.25, y = 0.75 until y ends at
    # 4/3 s, then x alone, still held to 0.25 by the uplink: 1 − 0.25·4/3 = 2/3 left at 0.25 → ends at 4 s
    sim = Sim()
    a, b = two_streams(sim)
    nic, up = sim.link("nic"), sim.link("uplink", 0.25)
    x = sim.task("x", a, 1.0, links=(nic, up))
    y = sim.task("y", b, 1.0, links=(nic,))
    assert sim.run() == pytest.approx(4.0)
    assert sim.tasks[y].end_s == pytest.approx(4 / 3) and sim.tasks[x].end_s == pytest.approx(4.0)


def test_rates_are_recomputed_when_a_transfer_starts():
    # x (2 s of work) runs alone for 1 s; y (1 s) starts behind a 1 s compute task: both at 1/2, both end at 3 s
    sim = Sim()
    a, b = two_streams(sim)
    nic = sim.link("nic")
    x = sim.task("x", a, 2.0, links=(nic,))
    c = sim.task("c", b, 1.0)
    y = sim.task("y", b, 1.0, (c,), links=(nic,))
    assert sim.run() == pytest.approx(3.0)
    assert sim.tasks[x].end_s == pytest.approx(3.0) and sim.tasks[y].end_s == pytest.approx(3.0)
    assert sim.events == 3


def test_network_by_hand():
    net = FlowNetwork()
    link = net.link("l", 2.0)
    assert net.start(0, 1.0, (link,), 0.0) == {0: 1.0}  # alone: capped at its own rate 1 on a link of 2
    assert net.start(1, 1.0, (link,), 0.0) == {1: 1.0}  # two fit: nobody's rate changed but the newcomer's
    assert net.start(2, 1.5, (link,), 0.5) == {0: 1.25, 1: 1.25, 2: 2.75}  # three share 2: 2/3 each


def test_bad_links_are_refused():
    sim = Sim()
    a = sim.stream(0, "a")
    with pytest.raises(SimError, match="does not exist"):
        sim.task("x", a, 1.0, links=(0,))
    nic, ch = sim.link("nic"), sim.channel("c")
    with pytest.raises(SimError, match="not both"):
        sim.task("x", a, 1.0, channel=ch, links=(nic,))
    with pytest.raises(ValueError, match="capacity"):
        sim.link("bad", 0.0)
