"""α-β collective costs against hand-worked cases (Thakur et al. 2005; nccl-tests doc/PERFORMANCE.md)."""

import math

import pytest

from commtax.collectives import (
    LL_BASE_S,
    Level,
    Placement,
    bus_factor,
    collective_cost,
    hierarchical_time,
    recursive_doubling_time,
    ring_time,
    tree_time,
)

GB = 1e9
NVL = Level("intra", 300 * GB, 10e-6)
NET = Level("inter", 25 * GB, 20e-6)


def one_node(n=8):
    return Placement(n=n, per_node=n, intra=NVL, inter=None)


def test_bus_factors_are_nccl_tests_definitions():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8  # nccl-tests PERFORMANCE.md
    assert bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("reduce_scatter", 4) == 3 / 4
    assert bus_factor("send_recv", 2) == 1.0


def test_ring_all_reduce_matches_thakur_formula():
    S = 1 * GB
    t, level = ring_time("all_reduce", S, one_node())
    assert t == pytest.approx(2 * 7 * 10e-6 + 2 * 7 / 8 * S / (300 * GB))  # 2(n-1)α + 2(n-1)/n·S/B
    assert level == "intra"


def test_ring_all_reduce_is_reduce_scatter_plus_all_gather():
    S = 256e6
    ar, _ = ring_time("all_reduce", S, one_node())
    rs, _ = ring_time("reduce_scatter", S, one_node())
    ag, _ = ring_time("all_gather", S, one_node())
    assert ar == pytest.approx(rs + ag)


def test_large_message_busbw_approaches_link_bandwidth():
    c = collective_cost("all_reduce", 16 * 2**30, one_node(), "ring")
    assert c.busbw_bytes_per_s / GB == pytest.approx(300, rel=0.01)


def test_ring_across_nodes_is_bounded_by_the_nodes_rails():
    # 4 nodes × 8 GPUs, 25 GB/s per GPU NIC share: 8 rails give 200 GB/s < 300 GB/s NVLink
    p = Placement(n=32, per_node=8, intra=NVL, inter=NET)
    S = 4 * GB
    t, level = ring_time("all_reduce", S, p)
    assert level == "inter"
    assert t == pytest.approx(2 * 31 * 20e-6 + 2 * 31 / 32 * S / (8 * 25 * GB))
    # one rail per GPU (Placement.rails=1): the node crosses at one NIC share
    t1, _ = ring_time("all_reduce", S, Placement(n=32, per_node=8, intra=NVL, inter=NET, rails=1))
    assert t1 == pytest.approx(2 * 31 * 20e-6 + 2 * 31 / 32 * S / (25 * GB))


def test_one_gpu_per_node_ring_runs_at_the_nic():
    p = Placement(n=16, per_node=1, intra=NVL, inter=NET)
    c = collective_cost("all_gather", 1 * GB, p, "ring")
    assert c.busbw_bytes_per_s == pytest.approx(25 * GB, rel=0.02)


def test_recursive_halving_doubling_power_of_two():
    S = 1 * GB
    t, _ = recursive_doubling_time("all_reduce", S, one_node())
    # Rabenseifner: 2·Σ_i (α + S/2^i / B), i = 1..log2 n
    expected = 2 * sum(10e-6 + S / 2**i / (300 * GB) for i in range(1, 4))
    assert t == pytest.approx(expected)
    with pytest.raises(ValueError):
        recursive_doubling_time("all_reduce", S, one_node(6))


def test_hierarchical_beats_flat_ring_when_network_is_slow():
    slow = Level("inter", 2.5 * GB, 20e-6)  # 10× slower than NVLink per rail... and one rail per node
    p = Placement(n=32, per_node=8, intra=NVL, inter=slow, rails=1)
    S = 1 * GB
    ring, _ = ring_time("all_reduce", S, p)
    hier, _ = hierarchical_time("all_reduce", S, p)
    # intra RS + AG: 2·(7/8·S/300G); inter AR over 4 nodes: 2·3/4·S / 2.5G (plus α terms)
    expected = 2 * (7 * 10e-6 + 7 / 8 * S / (300 * GB)) + 2 * 3 * 20e-6 + 2 * 3 / 4 * S / (2.5 * GB)
    assert hier == pytest.approx(expected)
    assert hier < ring


def test_tree_has_logarithmic_latency():
    t, _ = tree_time("all_reduce", 8.0, one_node(8))
    assert t == pytest.approx(2 * (3 * 10e-6 + 8.0 / (300 * GB)))


def test_small_messages_use_the_low_latency_protocol():
    c = collective_cost("all_reduce", 32 * 1024, one_node())
    simple, _ = ring_time("all_reduce", 32 * 1024, one_node())
    assert c.time_s < simple
    assert c.time_s >= LL_BASE_S


def test_nvls_only_inside_one_sharp_domain():
    p = Placement(n=8, per_node=8, intra=NVL, inter=None, nvls=True, nvls_bw_bytes_per_s=275 * GB)
    c = collective_cost("all_reduce", 16 * 2**30, p)
    assert c.algorithm == "nvls"
    assert c.busbw_bytes_per_s / GB == pytest.approx(275 * 1.75, rel=0.01)  # busbw above the wire rate
    with pytest.raises(ValueError):
        collective_cost("all_gather", 1e9, p, "nvls")


def test_fastest_algorithm_is_chosen_and_never_slower_than_ring():
    p = Placement(n=64, per_node=8, intra=NVL, inter=NET)
    for size in (1e3, 1e6, 1e9):
        best = collective_cost("all_reduce", size, p)
        ring = collective_cost("all_reduce", size, p, "ring")
        assert best.time_s <= ring.time_s


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="unknown collective"):
        collective_cost("allreduce", 1e6, one_node())
    with pytest.raises(ValueError):
        collective_cost("all_reduce", -1, one_node())
    zero = collective_cost("all_reduce", 1e6, one_node(1))
    assert zero.time_s == 0 and math.isinf(zero.busbw_bytes_per_s)


def test_gloo_runs_rings_without_ll_and_reduce_scatters_by_all_reduce():
    # measured on the emulated cluster (docs/measure.md): gloo's reduce_scatter takes an all-reduce's time
    p = Placement(n=4, per_node=1, intra=NVL, inter=NET, library="gloo")
    S = 4 * 2**20
    ar = collective_cost("all_reduce", S, p)
    assert ar.algorithm == "ring"
    assert ar.time_s == pytest.approx(ring_time("all_reduce", S, p)[0])  # no LL, no recursive doubling
    rs = collective_cost("reduce_scatter", S, p)
    assert rs.time_s == pytest.approx(ar.time_s)
    assert rs.busbw_bytes_per_s == pytest.approx(S / rs.time_s * 3 / 4)
    nccl = Placement(n=4, per_node=1, intra=NVL, inter=NET)
    assert collective_cost("reduce_scatter", S, nccl).time_s < rs.time_s
