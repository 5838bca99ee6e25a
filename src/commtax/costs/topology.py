"""Where each process group of a plan sits on the cluster, as a collectives ``Placement``.

Ranks are laid out as Megatron-LM does (``--rank-order tp-cp-dp-pp``): TP fastest, then CP,
then DP, then PP, so a group of stride ``s`` has ``min(n, G // s)`` members per node of G GPUs.

NIC sharing: the groups of one kind (all DP groups, all PP pairs, …) run their collectives at the
same time, one per slice of the node, so a node's NICs are shared among its GPUs: each GPU's share
is nics·B_nic / G (no more than its PCIe path when the NIC traffic crosses PCIe). A group with k
members on a node crosses the network at k shares (NCCL opens one ring per NIC rail, every member's
ring leaves the node through its own rail): with TP=8 each of the node's 8 DP groups gets one
NIC; with TP=1 the single DP group spanning the node gets all of them (a 4-node × 8 B200 all-reduce
on 8 × 400 Gb/s is priced at ~368 GB/s busbw, the node's NIC rate). Groups of different kinds that
overlap in time (PP sends or CP exchanges during an overlapped DP reduction) are not split further.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from commtax.costs.collectives import Level, Placement, gpu_arch
from commtax.spec import Cluster, Job
from commtax.spec.assumptions import default_assumptions
from commtax.units import GB, GBIT, US

if TYPE_CHECKING:
    from commtax.costs.rendezvous import RendezvousTime

GROUPS = ("tp", "cp", "dp", "pp")  # "dp" is the gradient-reduction group: DP × CP ranks
# MoE groups (Megatron-Core parallel folding): the experts' grid etp×ep×edp×pp, etp fastest, on the same GPUs
MOE_GROUPS = ("ep", "etp", "edp")


def members_per_node(n: int, stride: int, gpus_per_node: int) -> int:
    """Members of a group (n ranks, ``stride`` apart) that share one node."""
    if stride >= gpus_per_node:
        return 1
    return max(1, min(n, gpus_per_node // stride))


def profiled_level(cluster: Cluster, name: str, op: str | None) -> Level | None:
    """A calibrated profile's numbers for this level (an op's own override first), when there is a profile."""
    prof = cluster.profile
    if prof is None:
        return None
    nums = (prof.ops.get(op or "", {}) or {}).get(name) or prof.levels.get(name)
    return Level(name, nums.bw_GBps * GB, nums.latency_us * US) if nums is not None else None


def intra_level(cluster: Cluster, op: str | None = None) -> Level:
    measured = profiled_level(cluster, "intra", op)
    if measured is not None:
        return measured
    link = cluster.intra_node
    bw = link.bw_bytes_per_s
    if link.kind == "pcie" and not cluster.gpu.p2p:
        # host-bounced: every GPU behind one PCIe switch shares its uplink to the CPU
        bw /= cluster.gpus_per_pcie_switch
    return Level("intra", bw, link.latency_s)


def inter_level(cluster: Cluster, op: str | None = None) -> Level:
    measured = profiled_level(cluster, "inter", op)
    if measured is not None:
        return measured
    net = cluster.inter_node
    share = cluster.nics_per_node * net.bw_bytes_per_s / cluster.gpus_per_node
    if cluster.intra_node.kind == "pcie":
        # NIC traffic crosses the same PCIe fabric: end-to-end = min(network, PCIe) (seed article §3.3)
        share = min(share, intra_level(cluster).bw_bytes_per_s)
    return Level("inter", share, net.latency_s)


def uplink_capped(inter: Level, uplink_Gbps: float, rails: int) -> Level:
    """A group spanning both halves of the nodes crosses the uplink between them: a ring crosses it once per
    direction, so a node's r rails together move no faster than the uplink's line rate (r · B ≤ B_uplink)."""
    return Level("inter", min(inter.bw_bytes_per_s, uplink_Gbps * GBIT / rails), inter.latency_s)


def placement(cluster: Cluster, n: int, stride: int, op: str | None = None, rails: int | None = None) -> Placement:
    """Placement of a group of n ranks spaced ``stride`` apart in the global rank order."""
    per_node = members_per_node(n, stride, cluster.gpus_per_node)
    spans = n > per_node
    link = cluster.intra_node
    nvls_bw = link.bw_GBps * GB * link.nvls_efficiency if link.nvls else 0.0
    inter = inter_level(cluster, op) if spans else None
    if inter is not None and cluster.uplink_Gbps and n // per_node > (cluster.nodes + 1) // 2:
        inter = uplink_capped(inter, cluster.uplink_Gbps, per_node if rails is None else max(1, min(rails, per_node)))
    share = None  # the fabric's FabricShare, where the group crosses one
    rendezvous = None
    if inter is not None and cluster.fabric is not None:
        from commtax.costs.fabric import FabricShare, capacities, fabric_share, own_queue_s  # a fabric only

        r = per_node if rails is None else max(1, min(rails, per_node))
        pattern = "pairs" if op == "send_recv" and n == 2 else "all_to_all" if op == "all_to_all" else "ring"
        share = fabric_share(
            cluster,
            concurrent_groups(cluster, n, stride, pattern),
            pattern,
            r * inter.bw_bytes_per_s,
            cluster.gpus_per_node * inter.bw_bytes_per_s,
        )
        if op == "all_to_all" and rails is None:
            node_cap = cluster.gpus_per_node * inter.bw_bytes_per_s
            rendezvous = gloo_rendezvous(cluster, n, stride, node_cap)
            if rendezvous is not None:  # its pairs' turns hand over behind the queue its own traffic keeps
                own = own_queue_s(
                    cluster.fabric, concurrent_groups(cluster, n, stride, pattern)[0], capacities(cluster, node_cap).of
                )
                share = FabricShare(share.factor, share.binding, max(share.queue_s, own))
        # a standing queue on its path is waited out once per step, as the link's latency is
        inter = Level("inter", inter.bw_bytes_per_s * share.factor, inter.latency_s + share.queue_s)
    ctas = "nccl_ctas_nvlink" if link.kind in ("nvlink", "xgmi") else "nccl_ctas_pcie"  # comm->nChannels
    return Placement(
        n=n,
        per_node=per_node,
        intra=intra_level(cluster, op),
        inter=inter,
        nvls=link.nvls and cluster.profile is None,
        nvls_bw_bytes_per_s=nvls_bw,
        rails=rails,
        library=cluster.collective_library,
        arch=gpu_arch(cluster.gpu.name),
        intra_hw="nvlink" if link.kind in ("nvlink", "xgmi") else "pci",
        measured=cluster.profile is not None,
        binding=share.binding if share is not None else "",
        queue_s=share.queue_s if share is not None else 0.0,
        reverse_share=gloo_duplex(cluster) or 0.0,
        rendezvous=rendezvous,
        channels=int(default_assumptions().v(ctas)),
    )


def gloo_rendezvous(cluster: Cluster, n: int, stride: int, node_cap: float) -> RendezvousTime | None:
    """gloo's uniform all_to_all on the fabric (costs/rendezvous.py), per byte of each pair's chunk: the
    connections of the group's one instance, each pair in turns or at once by who enters the call later,
    beside the fabric's background flows and co-located rings (each a connection up to its rate); None when the
    library is not gloo, the kind runs more than one group at a time or the group has more than MAX_RANKS ranks
    (priced with κ as before)."""
    f = cluster.fabric
    if f is None or cluster.collective_library != "gloo":
        return None
    from commtax.costs.fabric import capacities, path, ring_hops  # gloo on a fabric only
    from commtax.costs.rendezvous import MAX_RANKS, TWO_WAY_SLOWDOWN, Flow, rendezvous_time

    if n > MAX_RANKS:
        return None
    groups = concurrent_groups(cluster, n, stride, "all_to_all")
    if len(groups) != 1:
        return None
    background = [Flow((path(f, x.src, x.dst),), cap=x.rate_Gbps * GBIT) for x in f.flows]
    for job in f.colocated:
        background += [
            Flow((path(f, a, b),), cap=job.rate_Gbps * GBIT) for ring in job.rings for a, b, _ in ring_hops(ring)
        ]
    # TCP connections through standing queues: a direction slows while its reverse carries data (its ACKs queue)
    two_way = TWO_WAY_SLOWDOWN if f.sharing == "tcp" and f.queue_ms else 1.0
    caps = capacities(cluster, node_cap).of
    return rendezvous_time(groups[0], 1.0, lambda a, b: path(f, a, b), caps, background, two_way)


def gloo_duplex(cluster: Cluster) -> float | None:
    """κ of the node links under gloo, as `cluster up` measured it (``inter_node.gloo_a2a_duplex``); None when not
    measured (priced as 0, full duplex) or when the library is not gloo (NCCL drives both directions at once)."""
    return cluster.inter_node.gloo_a2a_duplex if cluster.collective_library == "gloo" else None


def concurrent_groups(cluster: Cluster, n: int, stride: int, pattern: str) -> list[list[int]]:
    """Every group of this shape that runs at the same time, as the fabric nodes of its members in rank order.

    Groups of n ranks ``stride`` apart tile the ranks in blocks of n·stride (Megatron's order: the DP groups of
    every stage and TP slot); pipeline pairs are every rank with the rank ``stride`` after it."""
    from commtax.costs.fabric import fabric_nodes  # a fabric only

    assert cluster.fabric is not None
    G = cluster.gpus_per_node
    where = fabric_nodes(cluster.fabric, cluster.nodes)
    if pattern == "pairs":
        return [[where[r // G], where[(r + stride) // G]] for r in range(max(0, cluster.num_gpus - stride))]
    block = n * stride
    return [
        [where[(b * block + t + j * stride) // G] for j in range(n)]
        for b in range(max(1, cluster.num_gpus // block))
        for t in range(stride)
    ]


@dataclass(frozen=True)
class GroupLayout:
    """Size and stride of each parallel group of a job."""

    size: dict[str, int]
    stride: dict[str, int]


def layout(job: Job) -> GroupLayout:
    p = job.plan
    # gradients are reduced over DP × CP (Megatron-Core's data-parallel-with-context-parallel group)
    size = {"tp": p.tp, "cp": p.cp, "dp": job.dp * p.cp, "pp": p.pp}
    stride = {"tp": 1, "cp": p.tp, "dp": p.tp, "pp": p.tp * p.cp * job.dp}
    if job.model.is_moe:
        # expert ranks: etp fastest, then ep, then edp (Megatron-Core RankGenerator order tp-ep-dp-pp for experts);
        # an EP group inside the NVLink domain when etp·ep ≤ gpus_per_node, else across nodes sharing their NICs
        # with the DP and PP traffic (each GPU's NIC share, ``inter_level``)
        size |= {"ep": p.ep, "etp": p.etp, "edp": job.edp}
        stride |= {"ep": p.etp, "etp": 1, "edp": p.etp * p.ep}
    return GroupLayout(size, stride)


def group_placement(job: Job, group: str, op: str | None = None) -> Placement:
    lay = layout(job)
    if group == "pp":  # neighbouring stages: a pair, one stride apart
        return placement(job.cluster, 2, lay.stride["pp"], op) if job.plan.pp > 1 else placement(job.cluster, 1, 1, op)
    return placement(job.cluster, lay.size[group], lay.stride[group], op)
