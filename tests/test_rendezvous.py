"""gloo's all_to_all rendezvous (costs/rendezvous.py): which pairs take turns, and the fluid time, by hand.

Source of the rule: gloo/transport/tcp/pair.cc (``send`` writes at once only after the peer's NOTIFY_RECV_READY;
``recv`` writes that notice through the same transmit queue, behind earlier data) and gloo/alltoall.cc (for
i = 1 … n − 1: send to r + i, then recv from r − i). Measured on the emulated 4 × 1 cluster: docs/fabric.md."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.rendezvous import (
    TWO_WAY_SLOWDOWN,
    Flow,
    exchange_flows,
    fluid_time,
    max_min_rates,
    rendezvous_time,
    reverse,
    turns,
)

ONE = lambda _link: 1.0  # noqa: E731 - every link (each direction of it) moves 1 byte per second


def two_leaves(a: int, b: int) -> tuple:
    """The emulated 4 × 1 cluster, 2:1 spine: nodes 0, 1 under leaf 0, nodes 2, 3 under leaf 1, every link 1."""
    links = [("out", a), ("in", b)]
    if a // 2 != b // 2:
        links.append(("spine", a // 2))
    return tuple(links)


def test_which_pairs_take_turns():
    # two ranks: each sends to the other at step 1 and receives at step 1, the send first: always in turns
    assert turns(0, 1, 2) and turns(1, 0, 2)
    # four ranks: the late rank 0's send to 1 is step 1, its receive from 1 step 3: its data goes first -> turns;
    # a late rank 1 receives from 0 at step 1 and sends to it at step 3: its notice leaves first -> both at once
    assert turns(0, 1, 4) and not turns(1, 0, 4)
    assert turns(0, 2, 4) and turns(2, 0, 4)  # opposite ranks: send and receive in the same step, send first


def test_one_pair_takes_twice_the_wire_time():
    # the probe's κ = 1 with one connection (docs/fabric.md): 1 byte one way, then 1 byte back
    r = rendezvous_time([0, 1], 1.0, lambda a, b: (("out", a), ("in", b)), ONE)
    assert (r.mean_s, r.fastest_s, r.slowest_s, r.orders) == (2.0, 2.0, 2.0, 2)


def test_three_partner_pairs_on_one_link_give_the_probes_kappa():
    # `cluster up`'s probe: ranks k and k + 3 of two nodes, 1/3 each way per pair, every pair in turns (opposite
    # ranks). Which side goes first is a coin per pair: all three the same way (2 of 8): one direction, then the
    # other, 2.0; two and one (6 of 8): the lone one finishes at 1/3, joins the other direction, which ends at 1,
    # the two others' second halves then have the link reverse to themselves from 5/6 to 3/2: 1.5.
    # Mean 2/8 · 2 + 6/8 · 1.5 = 1.625, κ = 0.625 (measured 0.53, 0.61, 0.67 with three connections).
    link = {0: ("up",), 1: ("down",)}
    times = []
    for first in itertools.product((0, 1), repeat=3):
        flows = [Flow((link[d], link[1 - d]), 1 / 3) for d in first]
        times.append(fluid_time(flows, ONE))
    assert sorted(set(round(t, 9) for t in times)) == [1.5, 2.0]
    assert sum(times) / len(times) == pytest.approx(1.625)


def test_the_4x1_spine_order_by_order():
    # order 0, 1, 2, 3 (rank 3 last), S = 1 per rank, 1/4 to each peer. Late 1 vs 0 and late 3 vs 2, late 2 vs 1:
    # notice first, both ways at once; (0, 2), (0, 3), (1, 3): the late rank's data first. Leaf 1 -> 0 carries
    # 2→0, 3→0, 3→1 and 2→1 at 1/4 each until 1.0; then 0→2, 0→3, 1→3 share leaf 0 -> 1 at 1/3: 0.75 more.
    flows = exchange_flows([0, 1, 2, 3], (0, 1, 2, 3), 0.25, two_leaves)
    assert len(flows) == 9  # three pairs in turns (one flow each), three both ways (two each)
    assert fluid_time(flows, ONE) == pytest.approx(1.75)
    # the 24 orders: 12 at 1.25, 2 at 1.5, 2 at 1.625, 8 at 1.75 -> 35.25 / 24 = 47/32 of the spine's wire time
    r = rendezvous_time([0, 1, 2, 3], 0.25, two_leaves, ONE)
    assert (r.orders, r.fastest_s, r.slowest_s) == (24, pytest.approx(1.25), pytest.approx(1.75))
    assert r.mean_s == pytest.approx(47 / 32)


def test_a_background_flow_takes_its_cap_from_the_phase_beside_it():
    # one pair in turns; a flow capped at 0.5 beside the first direction: max-min leaves the pair 0.5 there (2.0 s
    # for 1 byte), the way back is free (1.0 s): 3.0; the background flow does not count towards the finish
    there, back = ("up",), ("down",)
    bg = Flow((there,), cap=0.5)
    assert fluid_time([Flow((there, back), 1.0), bg], ONE) == pytest.approx(3.0)
    assert max_min_rates([there, there], [float("inf"), 0.5], ONE) == [0.5, 0.5]


def test_ranks_on_one_node_stay_off_the_fabric():
    flows = exchange_flows([0, 0, 1, 1], (0, 1, 2, 3), 1.0, lambda a, b: (("out", a), ("in", b)))
    assert all(("out", 0) in p or ("out", 1) in p for f in flows for p in f.phases)
    assert sum(len(f.phases) for f in flows) == 8  # 4 node-crossing pairs, both directions each


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(4)), st.floats(0.1, 10.0))
def test_an_order_lies_between_full_duplex_and_strict_turns(order, chunk):
    # never faster than the spine's one direction (S at rate 1), never slower than every pair strictly in turns
    # on the spine (2 S); and the fluid scales with the bytes
    t = fluid_time(exchange_flows([0, 1, 2, 3], tuple(order), chunk, two_leaves), ONE)
    assert 4 * chunk * (1 - 1e-9) <= t <= 2 * 4 * chunk * (1 + 1e-9)
    assert t == pytest.approx(chunk * fluid_time(exchange_flows([0, 1, 2, 3], tuple(order), 1.0, two_leaves), ONE))


def test_only_gloo_on_a_fabric_with_small_groups_is_priced_so():
    from commtax.costs.topology import placement
    from commtax.spec import Cluster

    base = {
        "gpu": {"name": "cpu-gloo", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "test"},
        "num_gpus": 4,
        "gpus_per_node": 1,
        "intra_node": {"name": "loopback", "bw_GBps": 2.0, "latency_us": 20.0, "kind": "loopback"},
        "inter_node": {"name": "veth", "bw_Gbps": 0.2, "latency_us": 50.0, "gloo_a2a_duplex": 0.3},
        "nics_per_node": 1,
        "collective_library": "gloo",
        "fabric": {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": 2}},
    }
    c = Cluster.model_validate
    assert placement(c(base), 4, 1, "all_to_all").rendezvous is not None
    assert placement(c(base), 4, 1, "all_reduce").rendezvous is None  # rings keep their own price
    assert placement(c({**base, "collective_library": "nccl"}), 4, 1, "all_to_all").rendezvous is None
    assert placement(c({**base, "fabric": None}), 4, 1, "all_to_all").rendezvous is None  # κ, as before
    big = {**base, "num_gpus": 16, "gpus_per_node": 4}  # 16 ranks: more than MAX_RANKS, κ as before
    p = placement(c(big), 16, 1, "all_to_all")
    assert p.rendezvous is None and p.reverse_share == 0.3


def test_a_direction_slows_while_its_reverse_carries_data():
    # costs/rendezvous.TWO_WAY_SLOWDOWN (measured: the spine's chunks each way on one-way connections, 1.13x the
    # wire time): 1 byte each way on the two directions of one link at once takes τ, one way alone 1.0; a pair in
    # turns never has both directions busy, so it keeps its 2.0 whatever τ
    up, down = ("leaf", 0, "up"), ("leaf", 0, "down")
    assert reverse(up) == down and reverse(down) == up and reverse(("spine", 0)) is None
    both = [Flow(((up,),), 1.0), Flow(((down,),), 1.0)]
    assert fluid_time(both, ONE, two_way=1.13) == pytest.approx(1.13)
    assert fluid_time(both[:1], ONE, two_way=1.13) == pytest.approx(1.0)
    assert fluid_time([Flow(((up,), (down,)), 1.0)], ONE, two_way=1.13) == pytest.approx(2.0)
    # a background flow on the reverse direction counts as data there
    assert fluid_time([both[0], Flow(((down,),), cap=0.1)], ONE, two_way=1.13) == pytest.approx(1.13)


def fabric_leaves(a: int, b: int) -> tuple:
    """The 4 × 1 cluster in costs.fabric's link keys (each direction of a link its own key)."""
    links = [("node", a, "up"), ("node", b, "down")]
    if a // 2 != b // 2:
        links += [("leaf", a // 2, "up"), ("leaf", b // 2, "down")]
    return tuple(links)


@settings(max_examples=20, deadline=None)
@given(st.permutations(range(4)), st.floats(1.0, 1.5))
def test_two_way_slowdown_lies_between_none_and_all_of_it(order, tau):
    # every link direction slows by at most τ, only while its reverse is busy: the call takes between its τ = 1
    # time and τ times that
    flows = exchange_flows([0, 1, 2, 3], tuple(order), 0.25, fabric_leaves)
    t1, t = fluid_time(flows, ONE), fluid_time(flows, ONE, two_way=tau)
    assert t1 * (1 - 1e-9) <= t <= tau * t1 * (1 + 1e-9)


def test_the_4x1_spine_with_two_way_slowdown():
    # 24 orders on the 4 × 1 spine: 47/32 = 1.469 of S / B with τ = 1 (above); with the measured τ = 1.13 the
    # mean is 1.558 (between 1.469 and 1.13 × 1.469 = 1.660: part of each call runs one way only)
    r1 = rendezvous_time([0, 1, 2, 3], 0.25, fabric_leaves, ONE)
    r = rendezvous_time([0, 1, 2, 3], 0.25, fabric_leaves, ONE, two_way=TWO_WAY_SLOWDOWN)
    assert r1.mean_s == pytest.approx(47 / 32) and r.two_way == TWO_WAY_SLOWDOWN == 1.13
    assert r.mean_s == pytest.approx(1.558, abs=5e-4)
    assert r1.mean_s < r.mean_s < 1.13 * r1.mean_s


def test_the_slowdown_applies_to_tcp_fabrics_with_a_standing_queue_only():
    from commtax.costs.topology import placement
    from commtax.spec import Cluster

    base = {
        "gpu": {"name": "cpu-gloo", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "test"},
        "num_gpus": 4,
        "gpus_per_node": 1,
        "intra_node": {"name": "loopback", "bw_GBps": 2.0, "latency_us": 20.0, "kind": "loopback"},
        "inter_node": {"name": "veth", "bw_Gbps": 0.2, "latency_us": 50.0},
        "nics_per_node": 1,
        "collective_library": "gloo",
        "fabric": {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": 2}},
    }

    def two_way(**fabric) -> float:
        c = Cluster.model_validate({**base, "fabric": {**base["fabric"], **fabric}})
        return placement(c, 4, 1, "all_to_all").rendezvous.two_way

    assert two_way() == 1.0  # max-min: a switch's per-flow arbitration, no ACK clock
    assert two_way(sharing="tcp") == 1.0  # TCP with deep buffers (no standing queue priced)
    assert two_way(sharing="tcp", queue_ms=5) == TWO_WAY_SLOWDOWN
    # and its steps wait out the 5 ms its own connections keep on the spine (own_queue_s), without any other flow
    c = Cluster.model_validate({**base, "fabric": {**base["fabric"], "sharing": "tcp", "queue_ms": 5}})
    assert placement(c, 4, 1, "all_to_all").queue_s == pytest.approx(0.005)
    assert placement(c, 4, 1, "all_reduce").queue_s == 0.0  # a ring's hop is fed from one input: no queue


def _example(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "fabric" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_back_to_back_calls_settle_on_one_of_the_single_calls_order_times():
    # examples/fabric/back_to_back_events.py: gloo's calls back to back, each pair's socket a byte stream of data
    # and ready notices. Two ranks: every call in turns (the later rank's data, then the other's), twice the wire time.
    ev = _example("back_to_back_events")
    pair = ev.period([0, 1], 0.5, lambda a, b: (("node", a, "up"), ("node", b, "down")), ONE, (0, 1))
    assert pair == pytest.approx(1.0)  # 0.5 each way in turns: 0.5 + 0.5 per call
    # the 4 × 1 spine: whatever the first call's order and the ties' draw, the steady period is one of the single
    # call's order times (1.25, 1.5, 1.625, 1.75 of S / B), as far as from the 47/32 mean as they are
    times = {1.25, 1.5, 1.625, 1.75}
    for order, seed in [((0, 1, 2, 3), 0), ((3, 1, 0, 2), 1), ((2, 0, 3, 1), 2), ((1, 3, 2, 0), 3)]:
        for first in (False, True):
            p = ev.period([0, 1, 2, 3], 0.25, ev.fabric_leaves, ONE, order, seed, senders_first=first)
            assert round(p, 9) in times, (order, seed, first, p)


def test_the_all_to_all_waits_out_the_queue_its_own_connections_keep():
    # costs/fabric.own_queue_s: under sharing tcp with a 5 ms buffer the all_to_all's reno connections fill the link
    # that binds it; fed from two or more inputs, that link's buffer stands full and every step waits it out
    from commtax.costs.fabric import capacities, own_queue_s
    from commtax.spec import Cluster

    def cluster(nodes: int, leaf: float, **fabric) -> Cluster:
        return Cluster.model_validate(
            {
                "gpu": {"name": "cpu", "peak_tflops": {"fp32": 0.1}, "mem_GiB": 8, "mem_bw_GBps": 10, "source": "t"},
                "num_gpus": nodes,
                "gpus_per_node": 1,
                "intra_node": {"name": "lo", "bw_GBps": 2.0, "latency_us": 20.0, "kind": "loopback"},
                "inter_node": {"name": "veth", "bw_Gbps": 0.2, "latency_us": 50.0},
                "nics_per_node": 1,
                "collective_library": "gloo",
                "fabric": {"topology": "tor", "nodes_per_leaf": 2, "oversubscription": {"leaf": leaf}, **fabric},
            }
        )

    def queue(c: Cluster, nodes) -> float:
        return own_queue_s(c.fabric, nodes, capacities(c, 25e6).of)

    tcp = {"sharing": "tcp", "queue_ms": 5}
    # 4 × 1, 2:1: leaf 0's uplink carries 4 of the 12 hops at 1/3 each (4/3 of a node's rate on a node's rate),
    # more than any NIC (3 × 1/3), fed by nodes 0 and 1: 5 ms
    assert queue(cluster(4, 2, **tcp), [0, 1, 2, 3]) == pytest.approx(0.005)
    # 1:1: the NICs bind (1 against 2/3 on the uplink), each fed by its node's three connections: 5 ms as well
    assert queue(cluster(4, 1, **tcp), [0, 1, 2, 3]) == pytest.approx(0.005)
    # two nodes: one connection each way, a single input: no standing queue; max-min or no buffer: none
    assert queue(cluster(2, 1, **tcp), [0, 1]) == 0.0
    assert queue(cluster(4, 2), [0, 1, 2, 3]) == 0.0 and queue(cluster(4, 2, sharing="tcp"), [0, 1, 2, 3]) == 0.0
