"""α-β collective costs against hand-worked cases (Thakur et al. 2005; nccl-tests doc/PERFORMANCE.md;
NCCL's tuning model: NVIDIA/nccl src/graph/tuning.cc, NCCL 2.30.7, whose constants are catalog/nccl.yaml)."""

import math
import re

import pytest
import yaml

from commtax.costs.collectives import (
    NCCL_TUNING_FILE,
    Level,
    Placement,
    bus_factor,
    collective_cost,
    hierarchical_time,
    nccl_pat_time,
    nccl_ring_time,
    nccl_tree_time,
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
    assert c.protocol == "LL" and c.time_s < simple


US = 1e-6
H100_NVL = Level("intra", 450 * 0.816 * GB, 14e-6)  # links.yaml nvlink4: 367 GB/s effective


def test_8_byte_all_reduce_on_8_h100_is_nccl_ring_ll():
    # tuning.cc: ring LL latency = baseLat 6.6 + 2(n-1)=14 steps × hwLat[NVLINK][Ring][LL] 0.6 = 15.0 µs;
    # busbw min(llMaxBw Hopper-N1 141 GB/s, 0.5 × 367) = 141, algbw = 141 × 8/14
    p = Placement(n=8, per_node=8, intra=H100_NVL, inter=None, nvls=True, nvls_bw_bytes_per_s=277 * GB)
    c = collective_cost("all_reduce", 8, p)
    assert (c.algorithm, c.protocol, c.channels) == ("ring", "LL", 1)
    # 8 B < 1 channel · 512 threads · 8·8 B: one channel of 24 carries it (enqueue.cc topoGetAlgoInfo)
    assert c.time_s == pytest.approx(6.6 * US + 14 * 0.6 * US + 24 * 8 / (141 * GB * 8 / 14))
    assert c.time_s == pytest.approx(15.0 * US, rel=1e-3)


def test_ll_bandwidth_cap_follows_the_gpu_architecture():
    # llMaxBws single node: Ampere 87.7 GB/s, Hopper 141; ring LL busbw = min(cap, 0.5 × B) (tuning.cc)
    a100 = Placement(n=8, per_node=8, intra=Level("intra", 234 * GB, 14e-6), inter=None, arch="ampere")
    S = 2**20
    t = collective_cost("all_reduce", S, a100, "ring", "LL").time_s
    assert t == pytest.approx((6.6 + 14 * 0.6) * US + S * 14 / 8 / (87.7 * GB))
    h100 = Placement(n=8, per_node=8, intra=Level("intra", 234 * GB, 14e-6), inter=None, arch="hopper")
    t_h = collective_cost("all_reduce", S, h100, "ring", "LL").time_s
    assert t_h == pytest.approx((6.6 + 14 * 0.6) * US + S * 14 / 8 / (117 * GB))  # 0.5 × 234 < 141


def test_ring_broadcast_is_a_pipelined_chain():
    # NCCL ring broadcast: nsteps = n, algbw = busbw (tuning.cc); Simple over NVLink: 8.4 + 8 × 3.4 µs
    c = collective_cost("broadcast", 2**30, one_node(), "ring", "Simple")
    assert c.time_s == pytest.approx((8.4 + 8 * 3.4) * US + 2**30 / (300 * GB))


def test_multi_node_ring_latency_counts_network_steps_and_the_plateau():
    # 4 nodes × 8 GPUs, all_reduce, Simple: nsteps 62 of which 2(N-1) = 6 cross the network.
    # intra step max(hwLat NVLink ring Simple 3.4, 3 × netOverhead 1.0) = 3.4; network step 14.0 µs;
    # latency 8.4 + 56·3.4 + 6·14 = 282.8 µs, ×1.4 for a large message (ring plateau, compute capability ≥ 8.0)
    p = Placement(n=32, per_node=8, intra=NVL, inter=NET)
    S = 1 * GB
    t = nccl_ring_time("all_reduce", S, p, "Simple")
    assert t == pytest.approx(282.8 * US * 1.4 + S * 62 / 32 / (8 * 25 * GB))
    # LL across >2 nodes: busbw capped at llMaxBw Intel-N4 20.4 GB/s; latency 6.6 + 56·1.0 + 6·2.7
    t_ll = nccl_ring_time("all_reduce", S, p, "LL")
    assert t_ll == pytest.approx((6.6 + 56 * 1.0 + 6 * 2.7) * US + S * 62 / 32 / (20.4 * GB))
    # LL128: 0.92 of the ring's rate, latency 14.0 + 56·1.9 + 6·4.0 µs
    t_128 = nccl_ring_time("all_reduce", S, p, "LL128")
    assert t_128 == pytest.approx((14.0 + 56 * 1.9 + 6 * 4.0) * US + S * 62 / 32 / (0.92 * 8 * 25 * GB))
    best = collective_cost("all_reduce", S, p)
    assert best.time_s == pytest.approx(
        min(t, t_ll, t_128, nccl_tree_time(S, p, "Simple"), nccl_tree_time(S, p, "LL"), nccl_tree_time(S, p, "LL128"))
    )


def test_tree_all_reduce_latency_and_correction_factor():
    # tuning.cc: tree latency = base + 2·((ppn-1)·intraLat + log2i(nNodes)·interLat); LL, 4 nodes × 8:
    # 6.8 + 2·(7·0.6 + 2·5.0) = 35.2 µs. busbw = min(0.92·B / 3.8, llMaxBw 20.4), algbw = busbw/2,
    # × treeCorrectionFactor[LL][log2(S/64)]: S = 128 KiB -> index 11 -> 0.5
    p = Placement(n=32, per_node=8, intra=NVL, inter=NET)
    S = 128 * 1024
    bus = min(0.92 * 200 * GB / 3.8, 20.4 * GB)
    assert nccl_tree_time(S, p, "LL") == pytest.approx(35.2 * US + S / (bus * 0.5 * 0.5))


def test_nvls_tree_across_two_nodes():
    # tuning.cc NVLS Tree: latency hwLat[NVLINK][NVLSTree] 25 + 2·log2(2)·hwLat[NET][NVLSTree] 20.9 = 66.8 µs;
    # busbw = min(NVLS busbw inside the node, NIC rate × 2 for two nodes); algbw = busbw · n / (2(n-1)).
    # 2 × 8 H100: NVLS algbw 277 GB/s -> busbw 277·2·7/8 = 484.75 < 2 × 8 × 46 GB/s, but the per-channel cap
    # (perChMaxNVLSTreeBws Hopper N2 57.7 GB/s × 8 NVLS heads = 461.6 GB/s) binds first
    nic = Level("inter", 46 * GB, 14e-6)
    p = Placement(n=16, per_node=8, intra=H100_NVL, inter=nic, nvls=True, nvls_bw_bytes_per_s=277 * GB)
    S = 2**30
    c = collective_cost("all_reduce", S, p)
    assert (c.algorithm, c.protocol) == ("nvls_tree", "Simple")
    assert c.time_s == pytest.approx(66.8 * US + S / (461.6 * GB * 16 / 30))
    # more than two nodes: the NICs give 8 × 46 = 368 GB/s busbw, the cap (N4 45.5 × 8 heads) 364 GB/s
    p4 = Placement(n=32, per_node=8, intra=H100_NVL, inter=nic, nvls=True, nvls_bw_bytes_per_s=277 * GB)
    assert collective_cost("all_reduce", 16 * S, p4, "nvls_tree").busbw_bytes_per_s / GB == pytest.approx(364, rel=0.01)


def test_pat_all_gather_with_one_gpu_per_node():
    # tuning.cc PAT: latency 8.0 + log2i(16)·14/3.5 + 16·2.8 = 68.8 µs; bandwidth 0.75·busbw, not converted
    p = Placement(n=16, per_node=1, intra=NVL, inter=NET)
    S = 64 * 2**20
    assert nccl_pat_time(S, p) == pytest.approx(68.8 * US + S / (0.75 * 25 * GB))
    assert "pat" in [collective_cost("all_gather", s, p).algorithm for s in (2**16, 2**20, 2**22)]


def test_ll128_only_over_nvlink():
    pci = Placement(n=8, per_node=8, intra=Level("intra", 25 * GB, 20e-6), inter=None, intra_hw="pci")
    assert {collective_cost("all_reduce", s, pci).protocol for s in (8, 2**20, 2**26, 2**30)} <= {"LL", "Simple"}
    assert "LL128" in {collective_cost("all_reduce", s, one_node()).protocol for s in (2**22, 2**24, 2**26)}


def test_nccl_never_picks_recursive_doubling_but_it_can_be_asked_for():
    for size in (8, 2**20, 2**30):
        assert collective_cost("all_reduce", size, one_node()).algorithm in ("ring", "tree")
        assert collective_cost("all_gather", size, one_node()).algorithm == "ring"
    rd = collective_cost("all_reduce", 2**20, one_node(), "recursive_doubling")
    assert rd.time_s == pytest.approx(recursive_doubling_time("all_reduce", 2**20, one_node())[0])
    assert rd.protocol == ""  # an MPI-style algorithm: no NCCL protocol


def test_every_nccl_constant_has_a_source_and_fitted_on():
    data = yaml.safe_load(NCCL_TUNING_FILE.read_text())
    entries = {k: v for k, v in data.items() if isinstance(v, dict)}
    assert len(entries) >= 10
    for name, entry in entries.items():
        # an NVIDIA/nccl source file (tuning.cc, enqueue.cc, comm.h, ...) or NVIDIA's CUDA table
        assert re.search(r"\w\.(cc|h)\b", entry["source"]) or "CUDA" in entry["source"], name
        assert entry["fitted_on"] == [], name  # none is read off validation rows


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
