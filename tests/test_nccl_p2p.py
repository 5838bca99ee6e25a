"""NCCL's all_to_all on its point-to-point path (grouped ncclSend/ncclRecv): channels per peer, the rate of a few
channels for small per-peer messages, and one latency per batch of 8 rounds, against hand-worked cases
(NVIDIA/nccl 2.30.7 graph/paths.cc ncclTopoComputeP2pChannels, enqueue.cc addP2pToPlan / scheduleP2pTasksToPlan;
constants in catalog/nccl.yaml p2p)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.collectives import (
    Level,
    Placement,
    all_to_all_time,
    collective_cost,
    nccl_all_to_all_time,
    p2p_chunk_bytes,
    p2p_plan,
    p2p_uses_ll,
    pow2_up,
    proxy_overhead_s,
)

GB, US, KiB, MiB = 1e9, 1e-6, 2**10, 2**20
H100_NVL = Level("intra", 450 * 0.816 * GB, 14e-6)  # links.yaml nvlink4: 367.2 GB/s effective
H800_NVL = Level("intra", 200 * 0.816 * GB, 14e-6)  # H800: 8 NVLinks, 200 GB/s per direction
NET = Level("inter", 45 * GB, 14e-6)  # one 400 Gb/s NIC per GPU, derated


def h100_node() -> Placement:
    return Placement(n=8, per_node=8, intra=H100_NVL, inter=None)


def h800_ep64() -> Placement:
    return Placement(n=64, per_node=8, intra=H800_NVL, inter=NET)


def test_pow2_up():
    assert [pow2_up(x) for x in (1, 2, 3, 4, 5, 24, 33)] == [1, 2, 4, 4, 8, 32, 64]


def test_one_h100_node_runs_1MiB_per_peer_on_4_channels():
    # p2pnChannels = pow2Up(nChannels 24) = 32. NVLink peer: 2 · ⌊367.2 / 20.6⌋ = 34 -> pow2Up 64 -> capped at 32
    # on one node. nChannelsMin: 32 halved while ·8 ranks > 32: 4. Step NCCL_P2P_NVL_CHUNKSIZE 512 KiB,
    # minPart 64 KiB, maxPart 16 MiB: 1 MiB starts on min(4, 16) = 4 channels, 256 KiB each: stays at 4.
    p = h100_node()
    assert p2p_chunk_bytes(p) == 512 * KiB
    plan = p2p_plan(1 * MiB, p)
    assert (plan.p2p_channels, plan.per_peer_max, plan.per_peer_min, plan.channels, plan.batches) == (32, 32, 4, 4, 1)
    # 7 peers × 4 channels = 28 CTAs at max(20.6/2, 367.2/24 channels) = 15.3 GB/s: 428.4 GB/s > NVLink's 367.2,
    # which binds; 1 MiB > 4 × 16 KiB: Simple; one batch: one α
    t, level, nc = nccl_all_to_all_time(8 * MiB, p)
    assert (level, nc) == ("intra", 4)
    assert t == pytest.approx(14 * US + 7 / 8 * 8 * MiB / (367.2 * GB))
    assert t == pytest.approx(33.99 * US, rel=1e-3)
    c = collective_cost("all_to_all", 8 * MiB, p)
    assert (c.algorithm, c.channels, c.time_s) == ("pairwise", 4, pytest.approx(t))


def test_small_per_peer_messages_run_on_one_channel_each():
    # 64 KiB per peer: min(4, ⌈64 KiB / 64 KiB⌉) = 1 channel: 7 CTAs × 15.3 = 107.1 GB/s; the α-β pairwise model
    # gave 7 latencies and NVLink's full rate: 99.25 µs
    p = h100_node()
    assert p2p_plan(64 * KiB, p).channels == 1
    t, _, _ = nccl_all_to_all_time(512 * KiB, p)
    assert t == pytest.approx(14 * US + 7 / 8 * 512 * KiB / (7 * 367.2 / 24 * GB))
    assert t == pytest.approx(18.28 * US, rel=1e-3)
    assert all_to_all_time(512 * KiB, p)[0] == pytest.approx(99.25 * US, rel=1e-3)
    # a huge per-peer message doubles its channels past maxPart (16 MiB per channel): 128 MiB -> 4 (32 MiB each) then 8
    assert p2p_plan(64 * MiB, p).channels == 4 and p2p_plan(128 * MiB, p).channels == 8


def test_ep64_across_8_h800_nodes_1MiB_per_peer():
    # network peer: max(1 NIC, ⌈45 / 14⌉) = 4 channels; NVLink peer 2 · ⌊163.2 / 20.6⌋ = 14; min 4 = pow2Up 4;
    # across nodes 4 · ⌈64 / 8⌉ = 32 is not > 32: stays 4. nChannelsMin: 4 -> 2 -> 1 (1 · 64 > 32 but 1 is the floor).
    # Step NCCL_P2P_NET_CHUNKSIZE 128 KiB, minPart 64 KiB, maxPart 128 KiB: 1 MiB starts on 1 channel, 1 MiB > 128 KiB
    # -> 2 (512 KiB) -> 4 (256 KiB), and 4 > 4/2 stops it.
    p = h800_ep64()
    assert p2p_chunk_bytes(p) == 128 * KiB
    plan = p2p_plan(1 * MiB, p)
    assert (plan.p2p_channels, plan.per_peer_max, plan.per_peer_min, plan.channels) == (32, 4, 1, 4)
    # across nodes the 8 rounds of a schedule group (gcd(8, 8 GPUs per node)) share a base channel and one batch:
    # 8 groups × 4 channels on bit-reversed bases fill the 32 channels once: 32 CTAs, one batch, one α
    assert (plan.ctas, plan.batches) == (32, 1)
    # the CTAs go to the peers in proportion: 56/63 of 32 to the network (8 GPUs × 28.4 × 14 GB/s ≫ the node's
    # rails, 8 × 45 = 360 GB/s, which bind), 7/63 to NVLink: 3.56 × 10.3 = 36.6 GB/s for 7/64 of the buffer
    S = 64 * MiB
    t, level, nc = nccl_all_to_all_time(S, p)
    inter = 8 * 56 / 64 * S / (8 * 45 * GB)
    assert (level, nc) == ("inter", 4)
    assert t == pytest.approx(14 * US + inter)
    assert t == pytest.approx(1318.9 * US, rel=1e-3)
    # the α-β pairwise model paid 63 latencies: 2186.9 µs
    assert all_to_all_time(S, p)[0] == pytest.approx(1318.9 * US + 62 * 14 * US, rel=1e-3)


def test_ep64_small_messages_occupy_few_ctas():
    # 64 KiB per peer: 1 channel each; 8 schedule groups on 8 bases: 8 CTAs, the network's 56/63 of them
    # (7.1 × 14 GB/s × 8 GPUs = 796 GB/s) still above the rails
    plan = p2p_plan(64 * KiB, h800_ep64())
    assert (plan.channels, plan.ctas, plan.batches) == (1, 8, 1)


def test_one_nvlink_domain_of_64_runs_two_batches():
    # 64 B200 in one NVLink domain: NVLink peer 2 · ⌊720 / 40.1⌋ = 34 -> 64, capped at 32; nChannelsMin 1;
    # 1 MiB per peer on 1 channel (≤ maxPart 16 MiB); 63 rounds on bit-reversed bases over 32 channels: the
    # busiest runs 2 batches (rounds r and r+32 are in different groups of 8). 32 CTAs × max(40.1/2, 720/24) =
    # 960 GB/s > 720, which binds: t = 2 α + 63/64 · 64 MiB / 720 GB/s
    p = Placement(n=64, per_node=64, intra=Level("intra", 720 * GB, 14e-6), inter=None, arch="blackwell")
    plan = p2p_plan(1 * MiB, p)
    assert (plan.per_peer_max, plan.per_peer_min, plan.channels, plan.ctas, plan.batches) == (32, 1, 1, 32, 2)
    t, level, _ = nccl_all_to_all_time(64 * MiB, p)
    assert t == pytest.approx(2 * 14 * US + 63 * MiB / (720 * GB))
    assert t == pytest.approx(119.75 * US, rel=1e-3)


def test_channels_per_peer_halve_to_fit_every_peer_in_one_round():
    # 128 ranks across nodes: 4 · ⌈128 / 8⌉ = 64 > 32 -> 2 (2 · 16 = 32)
    p = replace(h800_ep64(), n=128)
    assert p2p_plan(1 * MiB, p).per_peer_max == 2
    # a faster NIC share asks more channels: 100 GB/s -> ⌈100/14⌉ = 8 -> pow2Up 8, halved to 4 at 64 ranks
    p = replace(h800_ep64(), inter=Level("inter", 100 * GB, 14e-6))
    assert p2p_plan(1 * MiB, p).per_peer_max == 4


def test_pcie_node_uses_two_channels_per_peer_and_the_pci_chunk():
    p = Placement(n=8, per_node=8, intra=Level("intra", 20 * GB, 10e-6), inter=None, intra_hw="pci", channels=4)
    assert p2p_chunk_bytes(p) == 128 * KiB
    plan = p2p_plan(1 * MiB, p)
    # p2pnChannels pow2Up(4) = 4; PCIe peer 2; nChannelsMin 2 -> 1 (1 · 8 > 4, floor 1)
    assert (plan.p2p_channels, plan.per_peer_max, plan.per_peer_min, plan.channels) == (4, 2, 1, 1)


def test_gloo_and_calibrated_profiles_keep_the_pairwise_model():
    p = replace(h800_ep64(), library="gloo")
    assert collective_cost("all_to_all", 64 * MiB, p).time_s == pytest.approx(all_to_all_time(64 * MiB, p)[0])
    p = replace(h800_ep64(), measured=True)
    assert collective_cost("all_to_all", 64 * MiB, p).time_s == pytest.approx(all_to_all_time(64 * MiB, p)[0])


@settings(max_examples=60, deadline=None)
@given(
    per_peer=st.integers(1, 64 * MiB),
    nodes=st.integers(1, 16),
    per_node=st.sampled_from([1, 2, 4, 8]),
)
def test_p2p_never_beats_the_links(per_peer, nodes, per_node):
    # the channels can only slow the bytes down: the bandwidth term is at least the pairwise model's, and the
    # latency is at least one α; channels per peer stay within [1, p2pnChannels]
    n = nodes * per_node
    if n < 2:
        return
    p = Placement(n=n, per_node=per_node, intra=H100_NVL, inter=NET if nodes > 1 else None)
    S = per_peer * n
    t, _, nc = nccl_all_to_all_time(S, p)
    old = all_to_all_time(S, p)[0]
    alpha = (p.inter if nodes > 1 else p.intra).latency_s
    assert t - p2p_plan(per_peer, p).batches * alpha >= old - (n - 1) * alpha - 1e-12
    assert t >= alpha
    assert 1 <= nc <= 32


def test_small_per_channel_messages_run_on_LL():
    # addP2pToPlan (enqueue.cc L931-933): LL while bytes ≤ channels × NCCL_P2P_LL_THRESHOLD 16 KiB
    assert p2p_uses_ll(16 * KiB, 1) and not p2p_uses_ll(16 * KiB + 1, 1)
    assert p2p_uses_ll(64 * KiB, 4) and not p2p_uses_ll(64 * KiB, 2)
    # one H100 node, 1 KiB per peer: one channel, LL at half rate: 7 CTAs × 15.3 GB/s / 2
    p = h100_node()
    t, _, _ = nccl_all_to_all_time(8 * KiB, p)
    assert t == pytest.approx(14 * US + 7 / 8 * 8 * KiB / (0.5 * 7 * 367.2 / 24 * GB))


def test_across_nodes_the_proxy_posts_each_remote_peer():
    # EP 64 over 8 H800 nodes, 1 KiB per peer (LL): one batch, then 56 remote peers at getNetOverhead 1 µs
    # (tuning.cc L228-233) while the wire moves next to nothing: 14 + 56 µs
    p = h800_ep64()
    assert proxy_overhead_s(p, 56, ll=True) == pytest.approx(56 * US)
    assert proxy_overhead_s(p, 56, ll=False) == pytest.approx(3 * 56 * US)  # Simple: ×3 (tuning.cc L405-408)
    t, _, _ = nccl_all_to_all_time(64 * KiB, p)
    assert t == pytest.approx(14 * US + 56 * US, rel=1e-2)
    # bandwidth-bound (1 MiB per peer, test above): 168 µs of Simple posting hides under the 1305 µs on the wire
    assert nccl_all_to_all_time(64 * MiB, p)[0] == pytest.approx(1318.9 * US, rel=1e-3)
    # one node has no proxy: one α and 8 KiB per peer on LL
    t = nccl_all_to_all_time(64 * KiB, h100_node())[0]
    assert t == pytest.approx(14 * US + 7 / 8 * 64 * KiB / (0.5 * 7 * 367.2 / 24 * GB))
