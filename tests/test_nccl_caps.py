"""The tuner's per-channel bandwidth caps (NVIDIA/nccl 2.30.7 src/graph/tuning.cc perChMaxRingLL128Bws,
perChMaxTreeBws, perChMaxTreeLL128Bws, perChMaxNVLSTreeBws, applied in ncclTopoTuneModel L322-335), against
hand-worked cases; constants in catalog/nccl.yaml per_channel_max_busbw_GBps."""

import pytest

from commtax.costs.collectives import (
    Level,
    Placement,
    collective_cost,
    graph_channels,
    nccl_ring_terms,
    nccl_tree_terms,
    per_channel_cap,
)

GB, US, MiB, GiB = 1e9, 1e-6, 2**20, 2**30
H100_NVL = Level("intra", 450 * 0.816 * GB, 14e-6)
B200_NVL = Level("intra", 720 * GB, 14e-6)  # NVLink5 900 GB/s per direction, derated
NIC = Level("inter", 50 * GB, 14e-6)


def test_graph_channels_are_half_the_communicators_and_one_per_nvls_head():
    p = Placement(n=8, per_node=8, intra=H100_NVL, inter=None)
    assert graph_channels(p, "ring") == graph_channels(p, "tree") == 12  # 24 / 2 (connect.cc doubles)
    assert graph_channels(p, "nvls_tree") == 8  # one NVLS head per GPU of the node
    pcie = Placement(n=8, per_node=8, intra=Level("intra", 20 * GB, 10e-6), inter=None, intra_hw="pci", channels=4)
    assert graph_channels(pcie, "ring") == 2


def test_caps_follow_the_architecture_and_node_columns():
    one = Placement(n=8, per_node=8, intra=H100_NVL, inter=None)
    two = Placement(n=16, per_node=8, intra=H100_NVL, inter=NIC)
    four = Placement(n=32, per_node=8, intra=H100_NVL, inter=NIC)
    assert per_channel_cap(one, "tree", "tree") == pytest.approx(12 * 38.7 * GB)  # Hopper N1
    assert per_channel_cap(two, "tree", "tree") == pytest.approx(12 * 41.4 * GB)  # N2
    assert per_channel_cap(four, "tree_LL128", "tree") == pytest.approx(12 * 29.0 * GB)  # N4 (more than two nodes)
    assert per_channel_cap(two, "nvls_tree", "nvls_tree") == pytest.approx(8 * 57.7 * GB)


def test_ring_LL128_on_one_b200_node_is_capped_at_40_GBps_per_channel():
    # ring LL128 busbw = min(0.92 · 720 = 662.4, 12 graph channels × perChMaxRingLL128Bws Blackwell 40.0 = 480) GB/s;
    # latency 14 + 14 steps × hwLat[NVLINK][Ring][LL128] 1.9 = 40.6 µs; algbw 480 × 8/14
    p = Placement(n=8, per_node=8, intra=B200_NVL, inter=None, arch="blackwell")
    S = 8 * MiB
    lat, wire = nccl_ring_terms("all_reduce", S, p, "LL128")
    assert lat == pytest.approx(40.6 * US)
    assert wire == pytest.approx(S / (480 * GB * 8 / 14))
    # on Hopper the cap (12 × 36.7 = 440.4) is above 0.92 × 367.2 = 337.8: nothing changes
    h = Placement(n=8, per_node=8, intra=H100_NVL, inter=None)
    assert nccl_ring_terms("all_reduce", S, h, "LL128")[1] == pytest.approx(S / (0.92 * 367.2 * GB * 8 / 14))


def test_tree_across_four_b200_nodes_is_capped_per_channel():
    # Simple: busbw = min(0.92 · min(720, 8 × 50 = 400) = 368, 12 × perChMaxTreeBws Blackwell N4 24.0 = 288) GB/s,
    # algbw = busbw / 2 (1 GiB: past treeCorrectionFactor's 23 entries). LL128: min(288 × 120/128 = 270,
    # 12 × perChMaxTreeLL128Bws Blackwell N4 20.0 = 240).
    p = Placement(n=32, per_node=8, intra=B200_NVL, inter=NIC, arch="blackwell")
    assert nccl_tree_terms(GiB, p, "Simple")[1] == pytest.approx(GiB / (288 * GB / 2))
    assert nccl_tree_terms(GiB, p, "LL128")[1] == pytest.approx(GiB / (240 * GB / 2))
    # the ring (400 GB/s busbw) now beats the tree at 1 GiB
    assert collective_cost("all_reduce", GiB, p).algorithm == "ring"
