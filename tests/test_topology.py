"""Where groups sit and what share of the node's links they get, against hand-worked cases.

Rank order: Megatron-LM's tp-cp-dp-pp (TP fastest). NIC share per GPU: nics · B_nic · efficiency / G
(every GPU of a node talks at once in DP/PP phases); a group with k members on a node crosses the
network at k shares, as NCCL's one-ring-per-rail layout does (nccl-tests multi-node busbw).
"""

import pytest
from conftest import job_dict

from commtax.costs.collectives import collective_cost
from commtax.costs.topology import (
    group_placement,
    inter_level,
    intra_level,
    layout,
    members_per_node,
    placement,
)
from commtax.spec import Cluster, build, load_catalog, load_job

GB = 1e9


def cluster(**kw) -> Cluster:
    from commtax.spec import resolve_cluster

    raw = {
        "gpu": "h100-sxm5-80gb",
        "num_gpus": 32,
        "gpus_per_node": 8,
        "intra_node": "nvlink4",
        "inter_node": "ib-ndr",
        "nics_per_node": 8,
        **kw,
    }
    return build(Cluster, resolve_cluster(raw, load_catalog()), "cluster")


def job(num_gpus=256, **plan):
    d = job_dict(**plan)
    d["cluster"]["num_gpus"] = num_gpus
    return load_job(d)


def test_members_per_node_follow_the_rank_order():
    assert members_per_node(8, 1, 8) == 8  # TP=8 fills a node
    assert members_per_node(2, 1, 8) == 2
    assert members_per_node(8, 2, 8) == 4  # DP after TP=2: 8 // 2 ranks per node
    assert members_per_node(32, 8, 8) == 1  # DP after TP=8: one per node
    assert members_per_node(4, 16, 8) == 1  # PP stride beyond a node


def test_nic_share_is_the_nodes_nics_over_its_gpus():
    # ib-ndr: 400 Gb/s × 0.92 = 46 GB/s per NIC; 8 NICs / 8 GPUs -> 46 GB/s per GPU
    assert inter_level(cluster()).bw_bytes_per_s == pytest.approx(46 * GB)
    # 4 × 100 GbE (0.8 over TCP) for 8 GPUs: 4 · 10 / 8 = 5 GB/s per GPU
    assert inter_level(cluster(inter_node="eth-100g", nics_per_node=4)).bw_bytes_per_s == pytest.approx(5 * GB)


def test_pcie_host_bounce_and_nic_cap():
    # RTX 4090 has no P2P: traffic bounces through the host, 2 GPUs share a PCIe 4.0 x16 uplink (32 GB/s × 0.8)
    c = cluster(gpu="rtx-4090-24gb", intra_node="pcie4-x16", gpus_per_pcie_switch=2)
    assert intra_level(c).bw_bytes_per_s == pytest.approx(32 * 0.8 / 2 * GB)
    # 8 NDR NICs would give 46 GB/s per GPU, but NIC traffic crosses the same PCIe path: capped at 12.8
    assert inter_level(c).bw_bytes_per_s == pytest.approx(12.8 * GB)


def test_dp_groups_share_the_nodes_nics():
    # TP=8: each node holds one member of each of its 8 DP groups -> every group crosses at one NIC (46 GB/s)
    tp8 = group_placement(job(32, tp=8, pp=1, dp=4), "dp", "all_reduce")
    assert (tp8.n, tp8.per_node) == (4, 1)
    assert tp8.node_inter_bw == pytest.approx(46 * GB)
    # TP=1: the single DP group spans the node and gets all 8 NICs (368 GB/s)
    tp1 = group_placement(job(32, tp=1, pp=1, dp=32, sequence_parallel=False), "dp", "all_reduce")
    assert (tp1.n, tp1.per_node) == (32, 8)
    assert tp1.node_inter_bw == pytest.approx(8 * 46 * GB)
    # TP=2: two DP groups per node, 4 members each: half of the NICs each
    tp2 = group_placement(job(32, tp=2, pp=1, dp=16), "dp", "all_reduce")
    assert tp2.node_inter_bw == pytest.approx(4 * 46 * GB)


def test_dp_over_cp_and_pp_pairs():
    j = job(32, tp=2, pp=1, dp=8, cp=2)
    lay = layout(j)
    assert lay.size["dp"] == 16 and lay.stride["dp"] == 2  # gradients reduce over DP × CP, after TP
    assert lay.stride["cp"] == 2 and group_placement(j, "cp").per_node == 2
    assert group_placement(j, "dp").per_node == 4  # CP and DP ranks of a node together: 8 // 2
    # TP=8 PP=4 DP=8: neighbouring stages are 64 ranks apart -> a pair on two nodes at one NIC share
    pp = group_placement(job(256), "pp", "send_recv")
    assert (pp.n, pp.per_node, pp.spans_nodes) == (2, 1, True)
    assert pp.inter.bw_bytes_per_s == pytest.approx(46 * GB)


def test_nccl_columns_of_the_placement():
    assert placement(cluster(gpu="a100-sxm4-80gb", intra_node="nvlink3", inter_node="ib-hdr"), 8, 1).arch == "ampere"
    assert placement(cluster(), 8, 1).arch == "hopper"
    assert placement(cluster(gpu="b200-sxm-192gb", intra_node="nvlink5"), 8, 1).arch == "blackwell"
    assert placement(cluster(gpu="rtx-4090-24gb", intra_node="pcie4-x16"), 8, 1).intra_hw == "pci"
    assert placement(cluster(), 8, 1).intra_hw == "nvlink"


def test_four_b200_nodes_all_reduce_runs_at_the_nodes_nic_rate():
    # issue 8: 4 nodes × 8 B200 on 8 × 400 Gb/s NDR: NCCL's rings leave each node on all 8 rails,
    # busbw -> 8 · 46 = 368 GB/s for large messages (ring/Simple, minus its latency)
    c = cluster(gpu="b200-sxm-192gb", intra_node="nvlink5")
    cost = collective_cost("all_reduce", 16 * 2**30, placement(c, 32, 1, "all_reduce"))
    assert cost.protocol == "Simple" and cost.bottleneck == "inter"
    assert cost.algorithm in ("ring", "nvls_tree")  # NVLS Tree: same NIC-bound busbw, tree latency
    assert cost.busbw_bytes_per_s / GB == pytest.approx(368, rel=0.02)
    ring = collective_cost("all_reduce", 16 * 2**30, placement(c, 32, 1, "all_reduce"), "ring")
    assert ring.busbw_bytes_per_s / GB == pytest.approx(368, rel=0.02)
