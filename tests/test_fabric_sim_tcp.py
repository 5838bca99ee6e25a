"""The simulator's flow network under ``fabric.sharing: tcp``: the estimate's α-fair shares (costs/fabric.py:
alpha_fair, α = 2, weighted by 1 / RTT²) and the standing queue (docs/fabric.md; issue 20)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from commtax.costs.topology import group_placement
from commtax.schedule.sim.events import Sim, SimError
from commtax.schedule.sim.network import FlowNetwork
from commtax.schedule.sim.simulate import simulate
from commtax.schedule.sim.step import network_sharing
from commtax.spec import load_job

ROOT = Path(__file__).resolve().parents[1]


def streams(sim: Sim, n: int) -> list[int]:
    return [sim.stream(0, f"s{i}") for i in range(n)]


@pytest.mark.parametrize("sharing", ["max-min", "tcp"])
def test_two_transfers_on_one_link_get_half_each_either_way(sharing):
    sim = Sim(sharing)
    a, b = streams(sim, 2)
    nic = sim.link("nic")
    x = sim.task("x", a, 1.0, links=(nic,))
    y = sim.task("y", b, 1.0, links=(nic,))
    assert sim.run() == 2.0  # 1 s of work each at 1/2
    assert sim.tasks[x].end_s == sim.tasks[y].end_s == 2.0


def test_parking_lot_under_tcp():
    # Mo & Walrand 2000 §IV, α = 2: x crosses both links of 1, y and z one each. Rates x = √2 − 1, y = z = 2 − √2;
    # y and z (1 s of work) end at 1 / (2 − √2) = 1.7071 s, when x has done (√2 − 1)/(2 − √2) = 1/√2 of its
    # 1 s; the rest, 1 − 1/√2, alone at rate 1: x ends at 1/(2 − √2) + 1 − 1/√2 = 2 s
    sim = Sim("tcp")
    a, b, c = streams(sim, 3)
    l1, l2 = sim.link("l1"), sim.link("l2")
    x = sim.task("x", a, 1.0, links=(l1, l2))
    y = sim.task("y", b, 1.0, links=(l1,))
    z = sim.task("z", c, 1.0, links=(l2,))
    assert sim.run() == pytest.approx(2.0, rel=1e-9)
    assert sim.tasks[y].end_s == pytest.approx(1 / (2 - math.sqrt(2)), rel=1e-9)
    assert sim.tasks[z].end_s == pytest.approx(1 / (2 - math.sqrt(2)), rel=1e-9)
    assert sim.tasks[x].end_s == pytest.approx(2.0, rel=1e-9)


def test_parking_lot_rates_by_hand():
    for sharing, want in (("tcp", (math.sqrt(2) - 1, 2 - math.sqrt(2))), ("max-min", (0.5, 0.5))):
        net = FlowNetwork(sharing)
        l1, l2 = net.link("l1"), net.link("l2")
        net.start(0, 1.0, (l1, l2), 0.0)
        net.start(1, 1.0, (l1,), 0.0)
        net.start(2, 1.0, (l2,), 0.0)
        assert net.rate[0] == pytest.approx(want[0], rel=1e-9)
        assert net.rate[1] == pytest.approx(want[1], rel=1e-9) and net.rate[2] == pytest.approx(want[1], rel=1e-9)


def test_max_min_parking_lot_is_unchanged():
    # the default: every transfer ½ while all three share, all end at 2 s
    sim = Sim()
    a, b, c = streams(sim, 3)
    l1, l2 = sim.link("l1"), sim.link("l2")
    ids = [sim.task("x", a, 1.0, links=(l1, l2)), sim.task("y", b, 1.0, links=(l1,))]
    ids.append(sim.task("z", c, 1.0, links=(l2,)))
    assert sim.run() == 2.0 and [sim.tasks[i].end_s for i in ids] == [2.0, 2.0, 2.0]


def test_a_transfer_pays_the_standing_queue_once():
    # 1 s of work alone on a link holding a 5 ms standing queue: its bytes at its own rate, then the queue
    sim = Sim("tcp", rtt_s=1e-4)
    a, b = streams(sim, 2)
    q = sim.link("spine", queue_s=0.005)
    x = sim.task("x", a, 1.0, links=(q,))
    y = sim.task("y", a, 1.0, (x,), links=(q,))  # the next transfer waits it out again
    assert sim.run() == pytest.approx(2.010)
    assert sim.tasks[x].end_s == pytest.approx(1.005) and sim.tasks[y].duration_s == pytest.approx(1.005)
    # two at once share the link (½ each, same RTT) and both wait the queue after their bytes
    sim = Sim("tcp", rtt_s=1e-4)
    a, b = streams(sim, 2)
    q = sim.link("spine", queue_s=0.005)
    x, y = sim.task("x", a, 1.0, links=(q,)), sim.task("y", b, 1.0, links=(q,))
    assert sim.run() == pytest.approx(2.005) and sim.tasks[x].end_s == pytest.approx(2.005)


def test_the_queue_wait_survives_a_rate_change_in_it():
    # x (0.5 s) and y (1 s) share a queued link: x's bytes end at 1 s, its 5 ms wait runs until 1.005 s while
    # it keeps its share; y then goes alone: 1 − 0.5025 of its work left at rate 1 → bytes at 1.4975, + 5 ms
    sim = Sim("tcp", rtt_s=1e-4)
    a, b = streams(sim, 2)
    q = sim.link("spine", queue_s=0.005)
    x, y = sim.task("x", a, 0.5, links=(q,)), sim.task("y", b, 1.0, links=(q,))
    sim.run()
    assert sim.tasks[x].end_s == pytest.approx(1.005)
    assert sim.tasks[y].end_s == pytest.approx(1.005 + (1 - 1.005 / 2) + 0.005)


def test_a_longer_rtt_gets_less_in_proportion():
    # Mathis 1997: rate ∝ 1 / RTT. x crosses a queued link (5 ms) and the shared link, y only the shared link;
    # base RTT 0.1 ms: RTTs 5.1 and 0.1 ms, so on the shared link x : y = 1 : 51 (α = 2, weights 1 / RTT²)
    net = FlowNetwork("tcp", rtt_s=1e-4)
    queued, shared = net.link("queued", queue_s=0.005), net.link("shared")
    net.start(0, 1.0, (queued, shared), 0.0)
    net.start(1, 1.0, (shared,), 0.0)
    assert net.rate[0] == pytest.approx(1 / 52, rel=1e-6) and net.rate[1] == pytest.approx(51 / 52, rel=1e-6)


def test_bad_networks_are_refused():
    with pytest.raises(ValueError, match="sharing"):
        FlowNetwork("fair")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sharing='tcp'"):
        FlowNetwork().link("l", queue_s=0.005)
    with pytest.raises(ValueError, match="queue_s"):
        FlowNetwork("tcp").link("l", queue_s=-1.0)


def test_the_makespan_is_the_last_end_not_a_stale_finish():
    # x (2 s) and y (1 s) share a link at ½: y ends at 2 s, x then alone at rate 1 ends at 3 s; the finish pushed
    # for x at 4 s while it shared is stale and must not be the makespan (it was before this fix)
    sim = Sim()
    a, b = streams(sim, 2)
    nic = sim.link("nic")
    x = sim.task("x", a, 2.0, links=(nic,))
    sim.task("y", b, 1.0, links=(nic,))
    assert sim.run() == 3.0 and sim.tasks[x].end_s == 3.0


# ----------------------------------------------------------------------------- the step simulator on a tcp fabric
WORKED = [
    "llama3-70b-1024-h100",
    "llama3-70b-1024-h100-4to1",
    "llama3-70b-1024-h100-4to1-scattered",
    "llama3-70b-1024-h100-4to1-colocated",
]
# a full-rate flow across the 4:1 spine keeps a 5 ms standing queue on the links it fills (docs/fabric.md)
QUEUED = {"queue_ms": 5, "flows": [{"src": 0, "dst": 40, "rate_Gbps": 3200}]}


def tcp_job(name: str, **fabric):
    data = yaml.safe_load((ROOT / "examples" / "fabric" / f"{name}.yaml").read_text())
    data["cluster"]["fabric"].update({"sharing": "tcp", **fabric})
    return load_job(data)


@pytest.mark.parametrize("name", WORKED)
def test_worked_example_with_tcp_sharing_simulates_within_2_percent_of_estimate(name):
    r = simulate(tcp_job(name))
    assert r.sim.network is not None and r.sim.network.sharing == "tcp"  # the NICs are shared TCP-fairly
    est = r.estimate.step_time_s
    assert abs(r.breakdown.step_time_s - est) / est < 0.02


def test_a_standing_queue_is_in_the_simulated_step_as_in_the_estimate():
    plain, queued = tcp_job(WORKED[1]), tcp_job(WORKED[1], **QUEUED)
    assert group_placement(queued, "pp", "send_recv").queue_s == pytest.approx(0.005)  # the pair crosses it
    a, b = simulate(plain), simulate(queued)
    # the queue (and the flow's share) slow the step in both, and the two still agree
    assert b.breakdown.step_time_s > a.breakdown.step_time_s and b.estimate.step_time_s > a.estimate.step_time_s
    assert abs(b.breakdown.step_time_s - b.estimate.step_time_s) / b.estimate.step_time_s < 0.02


def test_max_min_and_fabricless_jobs_keep_the_max_min_network():
    assert network_sharing(load_job(ROOT / "examples" / "llama2-70b-h100.yaml")) == ("max-min", 0.0)
    assert network_sharing(load_job(ROOT / "examples" / "fabric" / f"{WORKED[1]}.yaml")) == ("max-min", 0.0)
    sharing, rtt = network_sharing(tcp_job(WORKED[1]))
    assert sharing == "tcp" and rtt > 0


def test_explain_says_how_the_nic_is_shared():
    from commtax.schedule.sim.explain import explain

    cases = (
        (load_job(ROOT / "examples" / "fabric" / f"{WORKED[1]}.yaml"), "max-min fair rates"),
        (tcp_job(WORKED[1]), "TCP-fairly"),
    )
    for job, how in cases:
        lines = [x for x in explain(simulate(job)) if x.startswith("shared NIC")]
        assert len(lines) == 1 and how in lines[0], lines


@pytest.mark.parametrize("sharing", ["max-min", "tcp"])
def test_a_weighted_transfer_gets_its_tcp_share(sharing):
    # α = 2: r ∝ √weight on a full link. x has weight 1/4 (twice y's RTT): x = 1/3, y = 2/3 until y's 1 s of work
    # ends at 1.5 s; x has done 1/2, the rest alone at rate 1: 2 s. Max-min ignores the weight: both at 2 s
    sim = Sim(sharing)
    a, b = streams(sim, 2)
    nic = sim.link("nic")
    x = sim.task("x", a, 1.0, links=(nic,), weight=0.25)
    y = sim.task("y", b, 1.0, links=(nic,))
    sim.run()
    want = (2.0, 1.5) if sharing == "tcp" else (2.0, 2.0)
    assert (sim.tasks[x].end_s, sim.tasks[y].end_s) == pytest.approx(want)


def test_a_weighted_transfer_running_alone_shares_by_weight_when_another_comes():
    # x (2 s, weight 1/4) alone at rate 1 for 1 s; y (1 s) comes after a 1 s compute task: x = 1/3, y = 2/3, y ends
    # at 2.5 s, x has 1 − 1.5/3 = 1/2 left, alone at 1: 3 s
    sim = Sim("tcp")
    a, b = streams(sim, 2)
    nic = sim.link("nic")
    x = sim.task("x", a, 2.0, links=(nic,), weight=0.25)
    c = sim.task("c", b, 1.0)
    y = sim.task("y", b, 1.0, (c,), links=(nic,))
    assert sim.run() == pytest.approx(3.0)
    assert sim.tasks[y].end_s == pytest.approx(2.5) and sim.tasks[x].end_s == pytest.approx(3.0)


def test_rtt_weights_of_the_nic_kinds():
    from commtax.schedule.sim.step import rtt_weights

    # RTT 0.1 ms; DP waits behind a 5 ms queue, PP behind none: DP's weight (0.1 / 5.1)², PP's 1
    w = rtt_weights(1e-4, {"dp": 0.005, "pp": 0.0})
    assert w["dp"] == pytest.approx((0.1 / 5.1) ** 2) and w["pp"] == 1.0
    assert rtt_weights(1e-4, {"dp": 0.005, "pp": 0.005}) == {"dp": 1.0, "pp": 1.0}  # equal: the equal shares
    assert rtt_weights(0.0, {"dp": 0.005, "pp": 0.0}) == {"dp": 1.0, "pp": 1.0}


def test_the_worked_example_keeps_equal_weights_and_bad_weights_are_refused():
    b = simulate(tcp_job(WORKED[1], **QUEUED)).builder
    assert b.nic_weight == {"dp": 1.0, "pp": 1.0}  # DP and PP both wait behind the 5 ms queue: one RTT
    sim = Sim("tcp")
    a = sim.stream(0, "a")
    nic = sim.link("nic")
    with pytest.raises(SimError, match="weight"):
        sim.task("x", a, 1.0, links=(nic,), weight=0.0)


def test_a_weighted_train_shares_by_weight_transfer_by_transfer():
    # a train of two 1 s transfers (weight 1/4) beside y (1 s) from 0: the first at 1/3 while y runs at 2/3 (y ends
    # at 1.5 s, the first has 1/2 left, alone: 2 s), the second alone: 3 s
    from commtax.schedule.sim.events import TrainShape

    sim = Sim("tcp")
    s0, s1, s2 = streams(sim, 3)
    nic = sim.link("nic")
    anchor = sim.task("anchor", s0, 0.0)
    tr = sim.train("t", s1, TrainShape((0.0, 0.0), (1.0, 1.0), (1.0, 1.0)), anchor, links=(nic,), weight=0.25)
    y = sim.task("y", s2, 1.0, links=(nic,))
    assert sim.run() == pytest.approx(3.0)
    assert sim.tasks[y].end_s == pytest.approx(1.5) and sim.tasks[tr].end_s == pytest.approx(3.0)
