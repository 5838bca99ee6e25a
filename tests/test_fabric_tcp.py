"""TCP-fair shares and the standing queue on the fabric (issue 20): `fabric.sharing: tcp`, `fabric.queue_ms`."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fabric import EMULATED, B  # the emulated 4 x 1 cluster `cluster up` writes

from commtax.costs.collectives import collective_cost
from commtax.costs.fabric import Connection, alpha_fair
from commtax.costs.topology import placement
from commtax.spec import Cluster, Fabric

S = 8 * 2**20
TCP_2_1 = {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": 2}, "sharing": "tcp"}
L1, L2 = ("leaf", 0, "up"), ("leaf", 1, "up")


def cluster(fabric=None) -> Cluster:
    return Cluster.model_validate({**EMULATED, "fabric": fabric})


def flows(*links, cap: float = 10.0) -> list[Connection]:
    return [Connection(cap, tuple(ls)) for ls in links]


# ----------------------------------------------------------------------------- α-fair rates, by hand
@pytest.mark.parametrize("alpha", [1.0, 2.0, 4.0])
def test_two_flows_on_one_link_get_half_each_whatever_alpha(alpha):
    rates, price = alpha_fair(flows([L1], [L1]), lambda _: 1.0, alpha)
    assert rates == pytest.approx([0.5, 0.5], abs=1e-12)
    assert price[L1] == pytest.approx(0.5**-alpha)  # U'(r) = r^-α at the share: the link's price


def test_two_flows_on_two_links_the_one_held_elsewhere_leaves_the_rest():
    # A crosses l1 (capacity 1) and l2 (capacity 2), B only l2: A is held to 1 by l1, B takes the other 1 of l2,
    # as max-min gives it (l2's price is then 1 = B's U'(1), l1's 0 + ... = A's: both at rate 1)
    rates, price = alpha_fair(flows([L1, L2], [L2]), {L1: 1.0, L2: 2.0}.get)
    assert rates == pytest.approx([1.0, 1.0], abs=1e-9)
    # a flow capped at 0.25 by its own sender leaves 0.75 of a shared link to the other
    capped = [Connection(0.25, (L1,)), Connection(10.0, (L1,))]
    assert alpha_fair(capped, lambda _: 1.0)[0] == pytest.approx([0.25, 0.75], abs=1e-12)


def test_a_2_hop_flow_against_two_1_hop_flows_parking_lot():
    # Mo & Walrand 2000 §III (Kelly 1997): links of capacity 1, the long flow on both, a short flow on each.
    # α = 1 (proportional): max log L + 2 log(1 − L) → L = 1/3, short 2/3.
    # α = 2 (TCP, minimum potential delay): r_short = p^(-1/2), r_long = (2p)^(-1/2) = r_short / √2,
    # r_short + r_long = 1 → r_short = 2 − √2 = 0.586, r_long = √2 − 1 = 0.414. Max-min (α → ∞): ½ each.
    lot = flows([L1, L2], [L1], [L2])
    assert alpha_fair(lot, lambda _: 1.0, 1.0)[0] == pytest.approx([1 / 3, 2 / 3, 2 / 3], abs=1e-9)
    short = 2 - math.sqrt(2)
    assert alpha_fair(lot, lambda _: 1.0, 2.0)[0] == pytest.approx([math.sqrt(2) - 1, short, short], abs=1e-9)
    assert alpha_fair(lot, lambda _: 1.0, 64.0)[0] == pytest.approx([0.5, 0.5, 0.5], abs=0.01)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sets(st.integers(0, 3), min_size=1, max_size=3), st.floats(0.05, 5.0), st.integers(1, 4)),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([1.0, 2.0]),
)
def test_alpha_fair_rates_are_feasible_and_fill_every_link_they_are_held_by(spec, alpha):
    links = [("node", i, "up") for i in range(4)]
    cap = {lk: 1.0 + i for i, lk in enumerate(links)}
    conns = [Connection(c, tuple(links[i] for i in sorted(ls)), n) for ls, c, n in spec]
    rates, price = alpha_fair(conns, cap.get, alpha)
    load = {lk: sum(c.count * r for c, r in zip(conns, rates) if lk in c.links) for lk in links}
    for lk in links:
        assert load[lk] <= cap[lk] * (1 + 1e-9)
    for c, r in zip(conns, rates):
        assert 0 < r <= c.cap * (1 + 1e-12)
        # Pareto: a flow below its own cap crosses a full link (else it could rise)
        if r < c.cap * (1 - 1e-6):
            assert any(load[lk] >= cap[lk] * (1 - 1e-6) for lk in c.links)


# ----------------------------------------------------------------------------- on the emulated 4 × 1, 2:1 cluster
def test_a_background_flow_at_the_link_rate_leaves_the_ring_2_minus_root_2_of_its_nic():
    # 0→2 crosses node 0's NIC (shared with the ring's hop 0→1) and leaf 0's uplink and node 2's downlink (with
    # the hop 1→2): the parking lot above, so the ring gets 2 − √2 = 0.586 of B where max-min gives ½
    fab = {**TCP_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.2}]}
    p = placement(cluster(fab), 4, 1, "all_reduce")
    assert p.inter.bw_bytes_per_s == pytest.approx((2 - math.sqrt(2)) * B, rel=1e-9) and p.binding
    max_min = placement(cluster({**fab, "sharing": "max-min"}), 4, 1, "all_reduce")
    assert max_min.inter.bw_bytes_per_s == pytest.approx(B / 2)
    # a flow held to 50 Mbit/s by its own pacing takes its 50 whatever the sharing: the ring gets the other 150
    slow = {**TCP_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.05}]}
    assert placement(cluster(slow), 4, 1, "all_reduce").inter.bw_bytes_per_s == pytest.approx(0.75 * B, rel=1e-9)


def test_without_background_tcp_and_max_min_agree():
    for op in ("all_reduce", "all_to_all"):
        a = placement(cluster(TCP_2_1), 4, 1, op)
        b = placement(cluster({**TCP_2_1, "sharing": "max-min"}), 4, 1, op)
        assert a.inter.bw_bytes_per_s == pytest.approx(b.inter.bw_bytes_per_s, rel=1e-9)
    # the all-to-all on a 2:1 spine: leaf 0's uplink carries 4 connections of x/3 each, 4/3 x ≤ B: x = 3B/4
    assert placement(cluster(TCP_2_1), 4, 1, "all_to_all").inter.bw_bytes_per_s == pytest.approx(0.75 * B)


# ----------------------------------------------------------------------------- the standing queue
def test_each_step_waits_behind_the_standing_queue_a_greedy_flow_keeps():
    # the full-rate flow 0→2 keeps two merge points full: node 0's NIC (its socket and the ring's hop 0→1) and leaf
    # 0's uplink (fed from nodes 0 and 1: the flow and the hop 1→2); the spine's far side and node 2's port are fed
    # by that uplink alone and hold no queue. So the flow's RTT is 2·50 µs + 2 · 5 ms = 10.1 ms, each ring hop's
    # 0.1 + 5 = 5.1 ms. TCP's rate ∝ 1/(RTT·√loss) (Mathis 1997): r_flow / r_hop = (5.1 / 10.1) / √2, and
    # r_hop + r_flow = B: the ring gets B / (1 + 0.357) = 0.737 B (0.586 B with equal RTTs, above).
    fab = {**TCP_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.2}], "queue_ms": 5.0}
    p = placement(cluster(fab), 4, 1, "all_reduce")
    assert p.inter.bw_bytes_per_s == pytest.approx(B / (1 + (5.1 / 10.1) / math.sqrt(2)), rel=1e-9)
    # each of the ring's 2(n − 1) = 6 steps waits behind one 5 ms queue: the step latency 50 µs + 5 ms
    assert p.inter.latency_s == pytest.approx(50e-6 + 5e-3, rel=1e-9)
    t = collective_cost("all_reduce", S, p).time_s
    assert t == pytest.approx(6 * (50e-6 + 5e-3) + 2 * 3 / 4 * S / p.inter.bw_bytes_per_s, rel=1e-9)
    # the all-to-all: only leaf 0's uplink is full (4 of its connections and the flow, B/5 each: x = 3/5 B; node
    # 0's NIC carries 4/5 B), so every connection across it has one queue: equal RTTs, the share is unchanged, and
    # its n − 1 = 3 steps wait 5 ms each
    a = placement(cluster(fab), 4, 1, "all_to_all")
    assert a.inter.bw_bytes_per_s == pytest.approx(0.6 * B, rel=1e-9) and a.inter.latency_s == pytest.approx(5.05e-3)


def test_no_standing_queue_without_a_flow_that_wants_more():
    # a flow held to 50 Mbit/s by its own pacing drains the queue between its packets: no queueing term
    for rate in (0.05, None):
        fab = {**TCP_2_1, "queue_ms": 5.0}
        if rate:
            fab["flows"] = [{"src": 0, "dst": 2, "rate_Gbps": rate}]
        p = placement(cluster(fab), 4, 1, "all_reduce")
        assert p.inter.latency_s == pytest.approx(50e-6)


def test_queue_ms_is_read_with_tcp_sharing_only():
    with pytest.raises(ValueError, match="set sharing: tcp, or drop queue_ms"):
        Fabric(queue_ms=5.0)
    assert Fabric(sharing="tcp", queue_ms=5.0).queue_ms == 5.0


def test_collective_names_the_standing_queue_it_priced():
    from commtax.costs.predict import predict_collective

    fab = {**TCP_2_1, "flows": [{"src": 0, "dst": 2, "rate_Gbps": 0.2}], "queue_ms": 5.0}
    p = predict_collective("all_reduce", S, cluster(fab))
    assert p.rows[0]["standing_queue_ms"] == pytest.approx(5.0) and "standing queue of 5 ms" in p.note
    calm = predict_collective("all_reduce", S, cluster({**TCP_2_1, "queue_ms": 5.0}))
    assert "standing_queue_ms" not in calm.rows[0] and "standing queue" not in calm.note
