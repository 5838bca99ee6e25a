"""What a mid-size NCCL collective runs on: the channels NCCL gives it (NVIDIA/nccl src/enqueue.cc topoGetAlgoInfo,
NCCL 2.30.7) and the pipeline fill of one-node NVLS (src/device/all_reduce.h, enqueue.cc calcCollChunking), against
hand-worked cases; constants in catalog/nccl.yaml."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.costs.collectives import (
    Level,
    Placement,
    collective_cost,
    nccl_channels,
    nccl_run_time,
    nccl_time,
    nvls_channels,
    nvls_chunk_bytes,
    nvls_fill_s,
)

GB, US, KiB, MiB, GiB = 1e9, 1e-6, 2**10, 2**20, 2**30
H100_NVL = Level("intra", 450 * 0.816 * GB, 14e-6)  # links.yaml nvlink4: 367.2 GB/s effective
NVLS_BW = 277 * GB  # NVLS all-reduce algbw, links.yaml nvlink4 450 GB/s × nvls_efficiency 0.615
NET = Level("inter", 50 * GB, 14e-6)


def h100_node(nvls: bool = False) -> Placement:
    return Placement(n=8, per_node=8, intra=H100_NVL, inter=None, nvls=nvls, nvls_bw_bytes_per_s=NVLS_BW)


def test_ring_all_reduce_8MiB_on_8_h100_runs_on_all_24_channels_at_the_tuners_time():
    # NCCL picks ring LL128 (tuning.cc): latency baseLat 14 + 2(n-1)=14 steps × hwLat[NVLINK][Ring][LL128] 1.9
    # = 40.6 µs; busbw 0.92 × 367.2 = 337.8 GB/s, algbw × 8/14 = 193.0 GB/s.
    # Channels: 8 MiB ≥ 24 channels × 640 threads × 8 B (LL128 threadThreshold): all 24 (comm->nChannels on NVLink
    # nodes, assumptions.yaml nccl_ctas_nvlink), so nothing changes.
    S = 8 * MiB
    c = collective_cost("all_reduce", S, h100_node())
    assert (c.algorithm, c.protocol, c.channels) == ("ring", "LL128", 24)
    t = 40.6 * US + S / (0.92 * 367.2 * GB * 8 / 14)
    assert c.time_s == pytest.approx(t)
    assert c.time_s == pytest.approx(84.06 * US, rel=1e-3)
    assert c.time_s == pytest.approx(nccl_time("all_reduce", S, h100_node(), "ring", "LL128"))


def test_ring_all_reduce_256KiB_on_8_h100_runs_on_8_of_24_channels():
    # ring LL: threadThreshold 8 B × nRanks 8 = 64 B/thread, 512 threads: 32 KiB per channel; NCCL drops channels
    # while 256 KiB < nc · 32 KiB: nc = 8. LL busbw min(llMaxBw Hopper 141, 0.5 × 367.2) = 141 GB/s over 24
    # channels, algbw 141 × 8/14; on 8 of them the bytes take three times as long.
    S = 256 * KiB
    c = collective_cost("all_reduce", S, h100_node())
    assert (c.algorithm, c.protocol, c.channels) == ("ring", "LL", 8)
    lat = 6.6 * US + 14 * 0.6 * US  # 15.0 µs
    assert c.time_s == pytest.approx(lat + 24 / 8 * S / (141 * GB * 8 / 14))
    assert c.time_s == pytest.approx(24.76 * US, rel=1e-3)


def test_channel_count_follows_thread_thresholds():
    p = h100_node()
    # Simple: 512 threads × 64 B = 32 KiB per channel; LL128: 640 × 8 = 5 KiB; ring LL: 512 × 8·8 = 32 KiB
    assert p.channels == 24  # comm->nChannels on NVLink nodes (assumptions.yaml nccl_ctas_nvlink)
    assert nccl_channels(768 * KiB, p, "ring", "Simple") == 24  # 24 × 32 KiB
    assert nccl_channels(768 * KiB - 1, p, "ring", "Simple") == 23
    assert nccl_channels(96 * KiB, p, "ring", "Simple") == 3
    assert nccl_channels(120 * KiB, p, "ring", "LL128") == 24  # 24 × 5 KiB
    assert nccl_channels(40 * KiB, p, "ring", "LL128") == 8
    assert nccl_channels(64 * KiB, p, "ring", "LL") == 2
    assert nccl_channels(64 * KiB, p, "tree", "LL") == 16  # tree LL: 512 × 8 B = 4 KiB, no ×nRanks
    assert nccl_channels(1, p, "ring", "Simple") == 1
    assert nccl_channels(1, p, "pat", "Simple") == 24  # PAT has no maxThreads entry: never reduced
    pcie = Placement(n=8, per_node=8, intra=H100_NVL, inter=None, intra_hw="pci", channels=4)
    assert nccl_channels(100 * KiB, pcie, "ring", "Simple") == 3


def test_nvls_chunk_shrinks_as_calc_coll_chunking_says():
    ops = 16 * 8  # nvlsChannels 16 × 8 heads
    assert nvls_chunk_bytes(1 * GiB, ops) == 128 * KiB  # 1 GiB = 64 · 128 · 128 KiB: not below
    assert nvls_chunk_bytes(1 * GiB - 1, ops) == 64 * KiB
    assert nvls_chunk_bytes(64 * MiB, ops) == 64 * KiB  # 8 · 128 · 64 KiB = 64 MiB
    assert nvls_chunk_bytes(64 * MiB - 1, ops) == 32 * KiB
    assert nvls_chunk_bytes(8 * MiB, ops) == 32 * KiB  # 2 · 128 · 32 KiB = 8 MiB
    assert nvls_chunk_bytes(8 * MiB - 1, ops) == 16 * KiB


def test_nvls_all_reduce_8MiB_on_8_h100_pays_two_loops_of_pipeline_fill():
    # tuner: hwLat[NVLINK][NVLS][Simple] 25 µs + S / 277 GB/s = 25 + 30.28 µs.
    # run: 16 NVLS channels, chunk 32 KiB (8 MiB is not < 2·128·32 KiB), a loop = 8 heads × 32 KiB = 256 KiB per
    # channel at 277/16 GB/s = 15.14 µs; 3 stages (scatter, reduce+bcast, gather) fill 2 loops = 30.28 µs.
    S = 8 * MiB
    c = collective_cost("all_reduce", S, h100_node(nvls=True))
    assert (c.algorithm, c.protocol, c.channels) == ("nvls", "Simple", 16)
    fill = 2 * 8 * 32 * KiB / (NVLS_BW / 16)
    assert fill == pytest.approx(30.28 * US, rel=1e-3)
    assert c.time_s == pytest.approx(25 * US + S / NVLS_BW + fill)
    assert c.time_s == pytest.approx(85.57 * US, rel=1e-3)
    assert c.busbw_bytes_per_s / GB == pytest.approx(171.5, rel=1e-3)  # measured on H200: 155.5 (tuner: 265)


def test_nvls_fill_of_a_small_message_is_its_own_share_per_channel():
    # 512 KiB: 32 KiB per channel, less than one 8 × 16 KiB loop: fill 2 × 32 KiB / (277/16 GB/s)
    p = h100_node(nvls=True)
    assert nvls_fill_s(512 * KiB, p, 16) == pytest.approx(2 * 32 * KiB / (NVLS_BW / 16))


def test_large_messages_keep_their_limit():
    ring, nvls = h100_node(), h100_node(nvls=True)
    for S in (256 * MiB, 1 * GiB, 16 * GiB):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            c = collective_cost(op, S, ring)
            assert c.channels == 24
            assert c.time_s == pytest.approx(nccl_time(op, S, ring, c.algorithm, c.protocol), rel=5e-3)
    # NVLS: the fill is at most 2 loops of 8 × 128 KiB per channel (121 µs), 0.2% of a 16 GiB all_reduce
    big = collective_cost("all_reduce", 16 * GiB, nvls)
    assert big.time_s == pytest.approx(nccl_time("all_reduce", 16 * GiB, nvls, "nvls", "Simple"), rel=5e-3)
    assert nvls_fill_s(16 * GiB, nvls, 16) == pytest.approx(2 * 8 * 128 * KiB / (NVLS_BW / 16))


def test_nvls_channels_by_architecture():
    # transport/nvls.cc: NVLS_NCHANNELS_SM90 16, SM100 24 in one NVLink domain, 32 across nodes
    assert nvls_channels(h100_node(nvls=True)) == 16
    b200 = Placement(
        n=8, per_node=8, intra=H100_NVL, inter=None, nvls=True, nvls_bw_bytes_per_s=NVLS_BW, arch="blackwell"
    )
    assert nvls_channels(b200) == 24
    two = Placement(
        n=16, per_node=8, intra=H100_NVL, inter=NET, nvls=True, nvls_bw_bytes_per_s=NVLS_BW, arch="blackwell"
    )
    assert nvls_channels(two) == 32


@settings(max_examples=150, deadline=None)
@given(
    S=st.integers(min_value=1, max_value=2**34),
    n=st.sampled_from([2, 4, 8]),
    algo_proto=st.sampled_from(
        [("ring", "LL"), ("ring", "LL128"), ("ring", "Simple"), ("tree", "LL"), ("tree", "Simple")]
    ),
)
def test_a_kernel_never_beats_the_tuner_and_channels_grow_with_size(S, n, algo_proto):
    algo, proto = algo_proto
    p = Placement(n=n, per_node=n, intra=H100_NVL, inter=None)
    t, nc = nccl_run_time("all_reduce", S, p, algo, proto)
    assert 1 <= nc <= p.channels
    assert t >= nccl_time("all_reduce", S, p, algo, proto) * (1 - 1e-12)
    assert nccl_channels(2 * S, p, algo, proto) >= nc


def test_collective_command_shows_the_channels():
    import json

    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    args = ["collective", "all_reduce", "--bytes", "8MiB", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["algorithm"], d["channels"]) == ("nvls", 16)  # NVLS_NCHANNELS_SM90
    r = CliRunner().invoke(app, args)
    header = next(line for line in r.stdout.splitlines() if "size (B)" in line)
    assert header.split()[-1] == "ch" and "nvls/Simple" in r.stdout
    assert r.stdout.splitlines()[-1].split()[-1] == "16"
    # no NCCL channels under a send_recv: the table keeps its columns
    r = CliRunner().invoke(app, ["collective", "send_recv", "--bytes", "8MiB", "--gpus", "2"])
    assert r.exit_code == 0, r.output
    header = next(line for line in r.stdout.splitlines() if "size (B)" in line)
    assert header.split()[-2:] == ["bound", "by"]
    # an all_to_all shows the channels of one peer's message on NCCL's p2p path (1 MiB per peer: 4)
    r = CliRunner().invoke(app, ["collective", "all_to_all", "--bytes", "8MiB", "--gpus", "8"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1].split()[-1] == "4"
