"""Cost of one collective on a two-level topology.

Under NCCL the algorithm and protocol are chosen by NCCL's own tuning model (NVIDIA/nccl
src/graph/tuning.cc, NCCL 2.30.7; constants in catalog/nccl.yaml): see ``nccl_options`` / ``nccl_time``;
the pick is then timed as it runs, on the channels NCCL gives it and, for NVLS, with its pipeline fill
(src/enqueue.cc topoGetAlgoInfo, src/device/all_reduce.h): ``nccl_run_time``, docs/collectives.md.
The α-β formulas of Thakur, Rabenseifner
& Gropp, "Optimization of Collective Communication Operations in MPICH" (IJHPCA 2005) — a message
of m bytes over a link costs α + m/B — price gloo's rings, the MPI-style algorithms asked for by
name (recursive halving-doubling, hierarchical), point-to-point sends, and the schedules
``commtax.measure`` runs. Sizes follow nccl-tests (doc/PERFORMANCE.md): ``message_bytes`` is the
whole buffer (all_gather: the output, reduce_scatter: the input), and busbw = algbw × bus factor.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commtax.costs.rendezvous import RendezvousTime

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
# DeepEP's normal (training) kernels: dispatch and combine of MoE tokens (catalog/deepep.yaml)
DEEPEP_OPS = ("deepep_dispatch", "deepep_combine")
# NCCL picks among ring, tree, nvls, nvls_tree and pat (its tuning model, below); recursive_doubling (Rabenseifner, as
# MPI and gloo-style libraries run it) and hierarchical are there to be asked for by name.
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "pat", "recursive_doubling", "hierarchical")


@dataclass(frozen=True)
class Level:
    """One level of the topology as one GPU sees it (bandwidth already derated)."""

    name: str  # "intra" | "inter"
    bw_bytes_per_s: float  # per GPU, per direction, effective
    latency_s: float  # per message step (α)


@dataclass(frozen=True)
class Placement:
    """Where a process group sits: n GPUs, ``per_node`` of them on each node."""

    n: int
    per_node: int
    intra: Level
    inter: Level | None  # this GPU's share of its node's NICs; None when the group fits a node
    nvls: bool = False  # NVLink SHARP (in-switch reduction) available inside a node
    nvls_bw_bytes_per_s: float = 0.0  # effective per-GPU rate of an NVLS all-reduce
    rails: int | None = None  # NIC rails a ring spreads its node crossings over (default: per_node)
    library: str = "nccl"  # "gloo": rings only, no LL protocol, reduce_scatter done as an all-reduce
    arch: str = "hopper"  # NCCL's GPU-architecture column: volta | ampere | hopper | blackwell
    intra_hw: str = "nvlink"  # NCCL's intra-node hardware class: "nvlink" (NVLink, xGMI) | "pci"
    measured: bool = False  # levels from a calibrated profile: Simple ring/tree priced as calibrate fits them
    binding: str = ""  # the fabric link that caps ``inter`` (commtax.costs.fabric), "" when none does
    queue_s: float = 0.0  # standing queue in ``inter``'s latency (fabric.queue_ms on a link a flow keeps full)
    # κ of the node links for all_to_all (costs.alltoall): the lighter direction's share that does not overlap the
    # heavier one; 0 full duplex (NCCL), gloo's measured by `cluster up` (Network.gloo_a2a_duplex)
    reverse_share: float = 0.0
    # gloo's all_to_all on a fabric (costs.rendezvous): network seconds per byte of each pair's chunk, the mean over
    # entry orders of the pairs' turns; replaces κ and the fabric's share for a uniform all_to_all. None: not priced so
    rendezvous: RendezvousTime | None = None
    # comm->nChannels: NCCL's channels (one CTA each) for ring/tree/PAT, from its topology search
    # (assumptions.yaml nccl_ctas_nvlink 24, nccl_ctas_pcie 4; commtax.costs.topology sets it)
    channels: int = 24

    @property
    def nodes(self) -> int:
        return max(1, self.n // max(1, self.per_node))

    @property
    def rails_(self) -> int:
        return self.per_node if self.rails is None else max(1, min(self.rails, self.per_node))

    @property
    def node_inter_bw(self) -> float:
        """Rate at which the group's members on one node together cross the network: r · B_inter."""
        return self.rails_ * self.inter.bw_bytes_per_s if self.inter is not None else float("inf")

    @property
    def spans_nodes(self) -> bool:
        return self.n > self.per_node


@dataclass(frozen=True)
class CollectiveCost:
    time_s: float
    algorithm: str
    bottleneck: str  # the level whose bandwidth bounds the time
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    protocol: str = "Simple"  # NCCL protocol (LL, LL128, Simple); "" for gloo and MPI-style algorithms
    channels: int = 0  # channels (CTAs) NCCL runs it on (enqueue.cc topoGetAlgoInfo); 0 outside NCCL's tuned algorithms


def bus_factor(op: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n."""
    if n <= 1:
        return 0.0 if op != "send_recv" else 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _ring_bottleneck(p: Placement) -> tuple[float, float, str]:
    """Bandwidth and per-step latency of a ring over the group.

    NCCL builds one ring per NIC rail; each ring leaves a node once, so the node's k ring
    members together push at k × (per-GPU NIC share) while NVLink carries the rest:
    rate = min(B_intra, r · B_inter) with r = k rails (``Placement.rails`` may say fewer).
    """
    if not p.spans_nodes or p.inter is None:
        return p.intra.bw_bytes_per_s, p.intra.latency_s, "intra"
    inter_rate = p.node_inter_bw
    latency = max(p.intra.latency_s, p.inter.latency_s)
    if inter_rate < p.intra.bw_bytes_per_s:
        return inter_rate, latency, "inter"
    return p.intra.bw_bytes_per_s, latency, "intra"


def ring_time(op: str, S: float, p: Placement) -> tuple[float, str]:
    """Ring: all_reduce 2(n-1)α + 2(n-1)/n·S/B; all_gather/reduce_scatter (n-1)α + (n-1)/n·S/B (Thakur 2005)."""
    n = p.n
    B, alpha, level = _ring_bottleneck(p)
    if op == "all_reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / B, level
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * alpha + (n - 1) / n * S / B, level
    if op == "broadcast":  # pipelined chain: the message streams through n-1 hops
        return (n - 1) * alpha + S / B, level
    raise ValueError(f"ring has no {op}")


def tree_time(op: str, S: float, p: Placement) -> tuple[float, str]:
    """Pipelined (double) binary tree all_reduce: reduce up + broadcast down, 2·⌈log2 n⌉·α + 2·S/B (NCCL 2.4 trees)."""
    if op not in ("all_reduce", "broadcast"):
        raise ValueError(f"tree has no {op}")
    depth = math.ceil(math.log2(p.n))
    if p.spans_nodes and p.inter is not None:
        # one tree edge per node crosses the network, carried by the node's k GPUs in parallel (one per rail)
        B = min(p.intra.bw_bytes_per_s, p.node_inter_bw)
        alpha = p.inter.latency_s
        level = "inter" if B < p.intra.bw_bytes_per_s else "intra"
    else:
        B, alpha, level = p.intra.bw_bytes_per_s, p.intra.latency_s, "intra"
    passes = 2 if op == "all_reduce" else 1
    return passes * (depth * alpha + S / B), level


def _halving_steps(S: float, p: Placement) -> tuple[float, str]:
    """Recursive halving reduce-scatter: step i swaps S/2^i with the partner n/2^i ranks away (Thakur 2005, §4)."""
    steps = int(math.log2(p.n))
    total, worst = 0.0, "intra"
    for i in range(1, steps + 1):
        distance = p.n >> i
        crosses = p.spans_nodes and distance >= p.per_node and p.inter is not None
        if crosses:  # all k members of a node exchange S/2^i at once over the node's rails
            total += p.inter.latency_s + p.per_node * (S / 2**i) / p.node_inter_bw
            worst = "inter"
        else:
            total += p.intra.latency_s + (S / 2**i) / p.intra.bw_bytes_per_s
    return total, worst


def recursive_doubling_time(op: str, S: float, p: Placement) -> tuple[float, str]:
    """Rabenseifner: all_reduce = recursive-halving reduce-scatter + recursive-doubling all-gather (power-of-2 n)."""
    if p.n & (p.n - 1):
        raise ValueError("recursive halving-doubling needs a power-of-two group")
    half, level = _halving_steps(S, p)
    if op == "all_reduce":
        return 2 * half, level
    if op in ("all_gather", "reduce_scatter"):
        return half, level
    raise ValueError(f"recursive_doubling has no {op}")


def hierarchical_time(op: str, S: float, p: Placement) -> tuple[float, str]:
    """Intra-node reduce-scatter → inter-node all-reduce of S/k per rail → intra-node all-gather.

    all_reduce: 2·[(k-1)α_i + (k-1)/k·S/B_i] + 2(N-1)α_o + 2(N-1)/N·S/(r·B_o)  (k GPUs per node, N nodes,
    r rails: with r = k each GPU moves its S/k shard over its own NIC share B_o).
    """
    if not p.spans_nodes or p.inter is None:
        raise ValueError("hierarchical needs a group that spans nodes")
    k, N = p.per_node, p.nodes
    Bi, ai = p.intra.bw_bytes_per_s, p.intra.latency_s
    node_rate, ao = p.node_inter_bw, p.inter.latency_s  # the node's k shards of S/k share its rails
    intra_half = (k - 1) * ai + (k - 1) / k * S / Bi
    if op == "all_reduce":
        inter = 2 * (N - 1) * ao + 2 * (N - 1) / N * S / node_rate
        return 2 * intra_half + inter, "inter" if inter > 2 * intra_half else "intra"
    if op in ("all_gather", "reduce_scatter"):
        inter = (N - 1) * ao + (N - 1) / N * S / node_rate
        # all_gather: inter-node gather of each rail's shard, then intra-node gather of the rest
        return intra_half + inter, "inter" if inter > intra_half else "intra"
    raise ValueError(f"hierarchical has no {op}")


def link_time_s(out_bytes: float, in_bytes: float, bw_bytes_per_s: float, reverse_share: float) -> float:
    """One node link: the heavier direction at the link rate, plus κ of the lighter one that does not overlap it
    (docs/moe_bench.md "Why κ"; κ = 0: full duplex, the heavier direction alone)."""
    hi, lo = max(out_bytes, in_bytes), min(out_bytes, in_bytes)
    return (hi + reverse_share * lo) / bw_bytes_per_s


def all_to_all_time(S: float, p: Placement) -> tuple[float, str]:
    """Pairwise exchange: each GPU keeps 1/n, sends (k-1)/n·S over NVLink; the node's k GPUs send k(n-k)/n·S over
    its rails.

    NCCL runs all_to_all as grouped point-to-point sends (ncclGroupStart; ncclSend/ncclRecv to every peer, NCCL
    src/collectives.cc / enqueue.cc p2p path): n−1 peer exchanges each paying the level's step latency, the bytes
    moving at the level's bandwidth, NVLink and network in parallel; the MoE dispatch and combine of the
    ``alltoall`` dispatcher are this op. A node link carries as much in as out: (1 + κ) · vol / B_node with κ the
    placement's ``reverse_share`` (``link_time_s``, the routed all-to-all's formula; 0 unless gloo measured it)."""
    n, k = p.n, min(p.per_node, p.n)
    intra = (k - 1) / n * S / p.intra.bw_bytes_per_s
    if not p.spans_nodes or p.inter is None:
        return (n - 1) * p.intra.latency_s + intra, "intra"
    vol = k * (n - k) / n * S  # a node's bytes out, and as many in
    inter = link_time_s(vol, vol, p.node_inter_bw, p.reverse_share)
    if p.rendezvous is not None:  # gloo on a fabric: the pairs' turns, per byte of a pair's chunk S / n
        inter = p.rendezvous.mean_s * S / n
    return (n - 1) * p.inter.latency_s + max(intra, inter), "inter" if inter >= intra else "intra"


@functools.lru_cache(maxsize=1)
def deepep_table(path: str | None = None) -> dict:
    """DeepEP's published bandwidths (catalog/deepep.yaml)."""
    import yaml

    with open(path or Path(__file__).parents[1] / "catalog" / "deepep.yaml") as fh:
        return yaml.safe_load(fh)


def _interp(points: dict, x: float) -> float:
    """Piecewise-linear in log2(x) through {x: y} (flat outside the measured range)."""
    xs = sorted(points)
    if x <= xs[0]:
        return float(points[xs[0]])
    if x >= xs[-1]:
        return float(points[xs[-1]])
    for a, b in zip(xs, xs[1:]):
        if a <= x <= b:
            w = (math.log2(x) - math.log2(a)) / (math.log2(b) - math.log2(a))
            return float(points[a]) + w * (float(points[b]) - float(points[a]))
    return float(points[xs[-1]])


def deepep_efficiency(op: str, p: Placement) -> tuple[float, float]:
    """(NVLink, RDMA) rate of DeepEP's normal kernels as a share of the reference link rates they were measured on
    (DeepEP README / docs/legacy.md: H800, NVLink ~160 GB/s, ConnectX-7 400 Gb/s ~50 GB/s, DeepSeek-V3 shapes):
    intranode the EP-8 NVLink figure, internode the RDMA figure at the group's size (interpolated in log2 n)."""
    t = deepep_table()
    kind = "dispatch" if op == "deepep_dispatch" else "combine"
    nvl = t["intranode"][kind]["GBps"] / t["reference"]["nvlink_GBps"]
    rdma = _interp(t["internode"][kind], p.n) / t["reference"]["rdma_GBps"]
    return nvl, rdma


def hybridep_efficiency(op: str, kernel: str, p: Placement, level: str) -> float | None:
    """HybridEP's published rate (catalog/deepep.yaml ``hybridep``) as a share of the link it was measured on:
    ``level`` "nvl" inside a node or NVLink domain (Blackwell: NVL72 by ranks, 8-GPU nodes), "ib" between nodes
    (Hopper, by EP size); None where none was published (then DeepEP's rates price it). ``kernel``:
    "hybridep-fp8" / "hybridep-bf16" (workload.moe.token_exchange), the dispatch dtype picking the column."""
    if not kernel.startswith("hybridep"):
        return None
    h = deepep_table()["hybridep"]
    if level == "nvl" and p.arch == "blackwell":
        table, ref = h["nvl72"] if p.per_node > 8 else h["nvl8"], h["reference_nvlink_GBps"]
    elif level == "ib" and p.arch == "hopper":
        table, ref = h["ib_hopper"], deepep_table()["reference"]["rdma_GBps"]
    else:
        return None
    col = 2 if op == "deepep_combine" else (0 if kernel.endswith("fp8") else 1)
    return _interp({n: row[col] for n, row in table.items()}, p.n) / ref


def deepep_time(op: str, S: float, p: Placement, dedup: float = 1.0, kernel: str = "") -> float:
    """DeepEP (or HybridEP, ``kernel``) dispatch or combine of ``S`` bytes per GPU (all top-k copies, as the
    pairwise all-to-all's buffer).

    Intranode (one node or NVLink domain): each token goes once to each rank holding one of its experts (``dedup``
    · S; workload.moe.rank_dedup), every received byte counted as the kernels' tests count them, at their NVLink
    rate (HybridEP's published one on Blackwell, else DeepEP's H800 share of the link). Internode: each token
    crosses the network once per distinct remote node and is fanned out over NVLink on arrival; the two run
    concurrently (NVLink forwarding behind RDMA), so the slower sets the time, plus one latency per node step.
        t = max(S_inter / (η_rdma · B_nic), S_nvl / (η_nvl · B_nvl)) + α
    S_inter is counted as the tests that measured η_rdma count their RDMA bytes: once per distinct node a token
    goes to, its own node included (``dedup`` · S, workload.moe.internode_dedup; DeepEP tests/legacy/
    test_internode.py ``num_rdma_token_sent`` over all nodes, HybridEP tests/utils.py
    ``count_rdma_send_from_routing_map``: "we do not set the local node map to zeros"), so the published rate is
    read on the bytes it was measured on; the wire carries (N − 1)/N of them. Before moe15 the model divided only
    the remote share by that rate, 1/(1 − 1/N) too fast: 2× on two nodes (EP 16 of 8-GPU nodes).
    """
    if p.n <= 1 or S <= 0:
        return 0.0
    nvl_eff, rdma_eff = deepep_efficiency(op, p)
    k = min(p.per_node, p.n)
    if not p.spans_nodes or p.inter is None:
        eff = hybridep_efficiency(op, kernel, p, "nvl") or nvl_eff
        return p.intra.latency_s + dedup * S / (eff * p.intra.bw_bytes_per_s)
    rdma_eff = hybridep_efficiency(op, kernel, p, "ib") or rdma_eff
    inter_bytes = dedup * S  # the tests' RDMA bytes: a token once per distinct node, the local one included
    nvl_bytes = (p.n - 1) / p.n * S * min(1.0, k / p.n + dedup)  # local peers, and the remote tokens fanned out
    t_inter = inter_bytes / (rdma_eff * p.inter.bw_bytes_per_s)
    t_nvl = nvl_bytes / (nvl_eff * p.intra.bw_bytes_per_s)
    return p.inter.latency_s * p.nodes + max(t_inter, t_nvl)


def send_recv_time(S: float, p: Placement) -> tuple[float, str]:
    """Point-to-point: α + S/B over the level that joins the two GPUs (inter when the pair spans nodes)."""
    lvl = p.inter if (p.spans_nodes and p.inter is not None) else p.intra
    return lvl.latency_s + S / lvl.bw_bytes_per_s, lvl.name


_ALGO_FUNCS = {
    "ring": ring_time,
    "tree": tree_time,
    "recursive_doubling": recursive_doubling_time,
    "hierarchical": hierarchical_time,
}


def applicable_algorithms(op: str, p: Placement) -> list[str]:
    """Algorithms that implement ``op`` on this placement (NCCL's own, then the ones asked for by name)."""
    out = list(dict.fromkeys(a for a, _ in nccl_options(op, p)))
    if op == "broadcast":
        out.append("tree")
    if op in ("all_reduce", "all_gather", "reduce_scatter") and p.n > 1 and not p.n & (p.n - 1):
        out.append("recursive_doubling")
    if op in ("all_reduce", "all_gather", "reduce_scatter") and _multi(p):
        out.append("hierarchical")
    return out


# ----------------------------------------------------------------------------- NCCL's tuning model
# NCCL prices every (algorithm, protocol) pair with its own α-β model and runs the fastest
# (NVIDIA/nccl src/graph/tuning.cc, NCCL 2.30.7: ncclTopoTuneModel, ncclTopoGetAlgoTime). Its constants are
# data in catalog/nccl.yaml, each with its source; the Simple protocol's bus bandwidth and per-step latency
# are the catalog's (links.yaml, networks.yaml, shared among a node's GPUs by commtax.costs.topology).
PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")
NCCL_TUNING_FILE = Path(__file__).parents[1] / "catalog" / "nccl.yaml"


@dataclass(frozen=True)
class NcclTuning:
    """The constants of NCCL's tuning model (catalog/nccl.yaml), in µs and GB/s as tuning.cc writes them."""

    version: str
    base_us: dict  # algorithm -> protocol -> µs
    hop_us: dict  # "nvlink" | "pci" | "net" -> algorithm -> protocol -> µs
    ll_max_GBps: dict
    factors: dict
    tree_correction: dict  # protocol -> 24 multipliers, index log2(bytes/64)
    plateau: dict
    pat: dict
    net_overhead_us: dict
    compute_capability: dict  # catalog GPU id prefix -> architecture
    channels: dict  # "nvls": architecture -> comm->nvlsChannels (comm->nChannels is Placement.channels)
    thread_threshold: dict  # protocol -> bytes per thread (threadThresholds)
    max_threads: dict  # protocol -> threads per channel (maxThreads)
    nvls_pipeline: dict  # stages, step_bytes, max_chunk_bytes, shrink
    per_channel_max: dict  # perChMax*Bws: "ring_LL128" | "tree" | "tree_LL128" | "nvls_tree" -> arch -> [N1, N2, N4]
    p2p: dict  # all_to_all's point-to-point path: channels per peer, chunk sizes, batching (catalog/nccl.yaml p2p)
    simple_hop_from: str = "catalog"  # "catalog": a Simple step costs the level's latency_us; "nccl": hwLatencies


@functools.cache
def nccl_tuning(path: str | None = None) -> NcclTuning:
    if path is None:  # package data: libyaml, its parse kept beside it (spec.files.read_catalog_yaml)
        from commtax.spec.files import read_catalog_yaml

        d = read_catalog_yaml(Path(NCCL_TUNING_FILE))
    else:
        import yaml

        with open(path) as fh:
            d = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return NcclTuning(
        version=str(d["nccl_version"]),
        base_us=d["base_latency_us"]["values"],
        hop_us=d["hop_latency_us"]["values"],
        ll_max_GBps=d["ll_max_busbw_GBps"]["values"],
        factors=d["bandwidth_factors"]["values"],
        tree_correction=d["tree_correction"]["values"],
        plateau=d["ring_plateau"]["values"],
        pat=d["pat"]["values"],
        net_overhead_us=d["net_overhead_us"]["values"],
        compute_capability=d["compute_capability"]["values"],
        channels=d["channels"]["values"],
        thread_threshold=d["thread_threshold_bytes"]["values"],
        max_threads=d["max_threads"]["values"],
        nvls_pipeline=d["nvls_pipeline"]["values"],
        per_channel_max=d["per_channel_max_busbw_GBps"]["values"],
        p2p=d["p2p"]["values"],
        simple_hop_from=d["simple_hop_latency"]["values"]["from"],
    )


def gpu_arch(gpu_name: str) -> str:
    """NCCL's architecture column for a catalog GPU id (longest matching prefix; Hopper when unknown)."""
    table = nccl_tuning().compute_capability
    hits = [k for k in table if gpu_name.lower().startswith(k)]
    return table[max(hits, key=len)] if hits else "hopper"


def log2i(x: float) -> int:
    """NCCL's log2i: floor(log2 x) for x ≥ 1, −1 for x < 1."""
    return int(x).bit_length() - 1 if x >= 1 else -1


def _hop_s(p: Placement, hw: str, algo: str, proto: str) -> float:
    """Latency of one step over ``hw``: NCCL's hwLatencies; a Simple step costs the level's own α when
    catalog/nccl.yaml simple_hop_latency says "catalog"."""
    if proto == "Simple" and algo != "nvls" and nccl_tuning().simple_hop_from == "catalog":
        level = p.inter if hw == "net" and p.inter is not None else p.intra
        return level.latency_s
    return nccl_tuning().hop_us[hw][algo][proto] * 1e-6


def ll_max_busbw(p: Placement) -> float:
    """llMaxBws (bytes/s): one node by GPU architecture, several by the CPU (Intel assumed)."""
    t = nccl_tuning().ll_max_GBps
    if p.nodes == 1:
        return t["single_node"][p.arch] * 1e9
    return t["intel"]["two_nodes" if p.nodes == 2 else "more_nodes"] * 1e9


def _multi(p: Placement) -> bool:
    return p.spans_nodes and p.inter is not None


def graph_channels(p: Placement, algo: str) -> int:
    """graphs[algo]->nChannels of the tuner: ring/tree the searched graph (comm->nChannels / 2, connect.cc doubles
    it), NVLS and NVLS Tree one channel per NVLS head, min(NCCL_MAX_NVLS_ARITY, GPUs per node) (search.cc)."""
    c = nccl_tuning().per_channel_max
    if algo in ("nvls", "nvls_tree"):
        return min(c["max_nvls_arity"], p.per_node)
    return max(1, p.channels // c["comm_channels_per_graph_channel"])


def per_channel_cap(p: Placement, table: str, algo: str) -> float:
    """graphs[algo]->nChannels · perChMax<table>Bw (bytes/s): tuning.cc's cap on a bus bandwidth, by architecture and
    node count (column N1, N2, N4: nNodes <= 2 ? nNodes − 1 : 2)."""
    col = min(p.nodes, 3) - 1
    return graph_channels(p, algo) * nccl_tuning().per_channel_max[table][p.arch][col] * 1e9


def nccl_ring_time(op: str, S: float, p: Placement, proto: str) -> float:
    """NCCL ring: latency base + (nsteps − nInter)·intraLat + nInter·interLat, algbw = busbw·n/nsteps.

    busbw: Simple = the ring's bottleneck rate; LL = min(llMaxBw, 0.5·that); LL128 = 0.92·that
    (tuning.cc ncclTopoTuneModel). nsteps: all_reduce 2(n−1), all_gather/reduce_scatter n−1, broadcast n.
    """
    return sum(nccl_ring_terms(op, S, p, proto))


def nccl_ring_terms(op: str, S: float, p: Placement, proto: str) -> tuple[float, float]:
    """``nccl_ring_time`` as (latency, S/algbw) in seconds."""
    if p.measured and proto == "Simple":  # calibrate fits α, β to Thakur's ring: price it the same way
        return ring_time(op, S, p)[0], 0.0
    T, f = nccl_tuning(), nccl_tuning().factors
    n, N = p.n, p.nodes
    nsteps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "broadcast": n}[op]
    B = _ring_bottleneck(p)[0]
    bus = {"LL": min(ll_max_busbw(p), f["ring_LL"] * B), "LL128": f["ring_LL128"] * B, "Simple": B}[proto]
    if proto == "LL128":  # tuning.cc L329: nChannels · perChMaxRingLL128Bw
        bus = min(bus, per_channel_cap(p, "ring_LL128", "ring"))
    algbw = bus * n / nsteps
    base = T.base_us["ring"][proto] * 1e-6
    if op == "broadcast":  # chunks of the message pass every rank: nsteps hops of the level the ring crosses
        return base + nsteps * _hop_s(p, "net" if _multi(p) else p.intra_hw, "ring", proto), S / algbw
    intra = _hop_s(p, p.intra_hw, "ring", proto)
    n_inter, inter = 0, 0.0
    if _multi(p):
        overhead = T.net_overhead_us["intel"] * (T.net_overhead_us["simple_factor"] if proto == "Simple" else 1)
        intra = max(intra, overhead * 1e-6)
        n_inter = 2 * (N - 1) if op == "all_reduce" else N - 1
        # one GPU per node: every step is a network step, priced at the tree's network latency
        inter = _hop_s(p, "net", "tree" if p.per_node == 1 else "ring", proto)
    lat = base + (nsteps - n_inter) * intra + n_inter * inter
    pl = T.plateau
    big = S / (p.channels * n) >= pl["min_bytes_per_channel_rank"]
    if proto == "Simple" and _multi(p) and op == "all_reduce" and big:
        lat *= pl["factor_pre_ampere"] if p.arch == "volta" else pl["factor"]  # "plateau effect of ring"
    return lat, S / algbw


def nccl_tree_time(S: float, p: Placement, proto: str) -> float:
    """NCCL tree all_reduce: latency base + 2·((ppn−1)·intraLat + log2i(nNodes)·interLat);
    busbw 0.92·B (LL: /3.8 capped at llMaxBw; LL128: ×7/9 on one node, ×120/128 across), algbw = busbw/2,
    × treeCorrectionFactor[proto][log2(S/64)] (tuning.cc)."""
    return sum(nccl_tree_terms(S, p, proto))


def nccl_tree_terms(S: float, p: Placement, proto: str) -> tuple[float, float]:
    """``nccl_tree_time`` as (latency, S/algbw) in seconds."""
    if p.measured and proto == "Simple":  # as calibrate fits it
        return tree_time("all_reduce", S, p)[0], 0.0
    T, f = nccl_tuning(), nccl_tuning().factors
    multi = _multi(p)
    B = min(p.intra.bw_bytes_per_s, p.node_inter_bw) if multi else p.intra.bw_bytes_per_s
    bus = min(f["tree_all_reduce"] * B, per_channel_cap(p, "tree", "tree"))  # tuning.cc L331
    if proto == "LL":
        bus = min(bus / f["tree_LL_divisor"], ll_max_busbw(p))
    elif proto == "LL128":  # tuning.cc L333-335
        bus *= f["tree_LL128_multi_node"] if multi else f["tree_LL128_single_node"]
        bus = min(bus, per_channel_cap(p, "tree_LL128", "tree"))
    algbw = bus * f["tree_algbw_ratio"]
    k = log2i(S / 64)
    if 0 <= k < 23:
        algbw *= T.tree_correction[proto][k]
    hops = (p.per_node - 1) * _hop_s(p, p.intra_hw, "tree", proto)
    if multi:
        hops += log2i(p.nodes) * _hop_s(p, "net", "tree", proto)
    return T.base_us["tree"][proto] * 1e-6 + 2 * hops, S / algbw


def nccl_nvls_time(S: float, p: Placement) -> float:
    """NVLS all_reduce inside one NVLink domain: NCCL's latency is hwLatencies[NVLINK][NVLS][Simple] (25 µs);
    the bandwidth is the catalog's measured NVLS all-reduce algbw (links.yaml nvls_efficiency)."""
    return nccl_tuning().hop_us["nvlink"]["nvls"]["Simple"] * 1e-6 + S / p.nvls_bw_bytes_per_s


def nccl_nvls_tree_time(S: float, p: Placement) -> float:
    """NVLS Tree all_reduce (NVLS inside each node, a tree between nodes; tuning.cc): latency
    intraLat + 2·log2i(nNodes)·interLat; busbw = min(the node's NVLS all-reduce busbw, its NIC rate, ×2 with
    two nodes: "Handle 2 node case of NVLSTree"), algbw = busbw·n/(2(n−1)) as for ring and NVLS."""
    T, N = nccl_tuning(), p.nodes
    lat = T.hop_us["nvlink"]["nvls_tree"]["Simple"] + 2 * log2i(N) * T.hop_us["net"]["nvls_tree"]["Simple"]
    return lat * 1e-6 + S / (_nvls_tree_bus(p) * p.n / (2 * (p.n - 1)))


def _nvls_tree_bus(p: Placement) -> float:
    """NVLS Tree busbw: min(the node's NVLS all-reduce busbw, its NIC rate ×2 with two nodes, the NVLS graph's
    channels × perChMaxNVLSTreeBw) (tuning.cc)."""
    k = p.per_node
    nvls_bus = p.nvls_bw_bytes_per_s * 2 * (k - 1) / k  # the catalog's NVLS algbw as NCCL's busbw (nsteps/ppn)
    # tuning.cc L320-322: per channel min(intraBw, interBw, perChMaxNVLSTreeBw), × the NVLS graph's channels
    return min(nvls_bus, p.node_inter_bw * (2 if p.nodes <= 2 else 1), per_channel_cap(p, "nvls_tree", "nvls_tree"))


def nccl_pat_time(S: float, p: Placement) -> float:
    """PAT all_gather/reduce_scatter (one GPU per node): latency base + log2i(nNodes)·netLat/3.5 + 2.8 µs·n;
    bandwidth 0.75·busbw, not converted to algbw (tuning.cc)."""
    T = nccl_tuning()
    lat = (
        T.base_us["pat"]["Simple"] * 1e-6
        + log2i(p.nodes) * _hop_s(p, "net", "pat", "Simple") / T.pat["net_latency_divisor"]
        + p.n * T.pat["per_rank_us"] * 1e-6
    )
    return lat + S / (T.factors["pat"] * p.node_inter_bw)


def nccl_pat_terms(S: float, p: Placement) -> tuple[float, float]:
    """``nccl_pat_time`` as (latency, S/bw) in seconds."""
    wire = S / (nccl_tuning().factors["pat"] * p.node_inter_bw)
    return nccl_pat_time(S, p) - wire, wire


def nccl_protocols(p: Placement) -> tuple[str, ...]:
    """LL128 is on by default only over NVLink-class paths (tuning.cc: typeIntra <= PATH_NVB)."""
    return PROTOCOLS if p.intra_hw == "nvlink" else ("LL", "Simple")


def nccl_options(op: str, p: Placement) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL's tuner weighs for ``op`` here (CollNet needs SHARP switches and
    NCCL_COLLNET_ENABLE, plain NVLS across nodes needs CollNet: neither is modelled; NVLS Tree is)."""
    out = (
        [("ring", pr) for pr in nccl_protocols(p)]
        if op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
        else []
    )
    if op == "all_reduce":
        out += [("tree", pr) for pr in nccl_protocols(p)]
        if p.nvls and not p.spans_nodes and p.nvls_bw_bytes_per_s > 0:
            out.append(("nvls", "Simple"))
        if p.nvls and _multi(p) and p.per_node > 1 and p.nvls_bw_bytes_per_s > 0:
            out.append(("nvls_tree", "Simple"))  # NVLS Tree needs no CollNet, only NVLS inside the nodes
    if op in ("all_gather", "reduce_scatter") and p.per_node == 1 and _multi(p) and p.arch != "volta":
        out.append(("pat", "Simple"))
    return out


def nccl_time(op: str, S: float, p: Placement, algo: str, proto: str) -> float:
    """The time NCCL's tuner gives (algo, proto) at its full channel count (ncclTopoGetAlgoTime): what it picks by."""
    return sum(nccl_terms(op, S, p, algo, proto))


def nccl_terms(op: str, S: float, p: Placement, algo: str, proto: str) -> tuple[float, float]:
    """NCCL's tuner time of (algo, proto) as (latency, bytes / algbw) in seconds."""
    if algo == "ring":
        return nccl_ring_terms(op, S, p, proto)
    if algo == "tree":
        return nccl_tree_terms(S, p, proto)
    if algo == "nvls":
        wire = S / p.nvls_bw_bytes_per_s
        return nccl_nvls_time(S, p) - wire, wire
    if algo == "nvls_tree":
        wire = S / (_nvls_tree_bus(p) * p.n / (2 * (p.n - 1)))
        return nccl_nvls_tree_time(S, p) - wire, wire
    if algo == "pat":
        return nccl_pat_terms(S, p)
    raise ValueError(f"NCCL has no {algo}")


def nvls_channels(p: Placement) -> int:
    """comm->nvlsChannels: NVLS_NCHANNELS_SM90 16; SM100 24 in one NVLink domain, 32 across nodes (nvls.cc)."""
    t = nccl_tuning().channels["nvls"]
    if p.arch == "blackwell":
        return t["blackwell_multi_node" if p.spans_nodes else "blackwell_one_node"]
    return t[p.arch]


def nccl_channels(S: float, p: Placement, algo: str, proto: str) -> int:
    """Channels NCCL runs (algo, proto) on for S bytes (enqueue.cc topoGetAlgoInfo): NVLS a fixed nvlsChannels;
    ring and tree drop one channel while S < nc · nt · threadThreshold (ring LL's threshold ×nRanks); PAT has no
    maxThreads entry (0), so it keeps them all."""
    if algo in ("nvls", "nvls_tree"):
        return nvls_channels(p)
    T = nccl_tuning()
    nc = p.channels
    if algo not in ("ring", "tree"):
        return nc
    nt = T.max_threads[proto]
    threshold = T.thread_threshold[proto] * (p.n if algo == "ring" and proto == "LL" else 1)
    while S < nc * nt * threshold and nc >= 2:
        nc -= 1
    return nc


def nvls_chunk_bytes(S: float, concurrent_ops: int) -> int:
    """NVLS chunkSize (enqueue.cc calcCollChunking): one Simple step, capped at NCCL_NVLS_CHUNKSIZE, then shrunk
    to 64/32/16 KiB while S < 64/8/2 · concurrentOps · chunk (concurrentOps = nChannels · nHeads)."""
    c = nccl_tuning().nvls_pipeline
    chunk = min(c["step_bytes"], c["max_chunk_bytes"])
    for factor, smaller in c["shrink"]:
        if S < factor * concurrent_ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_fill_s(S: float, p: Placement, channels: int) -> float:
    """Pipeline fill of one-node NVLS all_reduce: each channel loops over nHeads · chunk bytes through 3 stages
    (scatter, reduce+broadcast through the switch, gather: device/all_reduce.h); the first loop crosses
    stages − 1 of them before the last stage starts, each at the channel's share of the NVLS rate:
    fill = (stages − 1) · min(S/nc, nHeads · chunk) / (B_nvls / nc), nHeads = GPUs on the node."""
    c = nccl_tuning().nvls_pipeline
    heads = p.per_node
    loop_bytes = min(S / channels, heads * nvls_chunk_bytes(S, channels * heads))
    return (c["stages"] - 1) * loop_bytes / (p.nvls_bw_bytes_per_s / channels)


def nccl_run_time(op: str, S: float, p: Placement, algo: str, proto: str) -> tuple[float, int]:
    """What the kernel NCCL picked takes, and on how many channels: NCCL's tuner assumes every channel; the bytes
    move at the per-channel rate (bus bandwidth / comm->nChannels, ``Placement.channels``) × the channels it runs
    (``nccl_channels``), and
    one-node NVLS pays its pipeline fill (``nvls_fill_s``). A calibrated Simple ring/tree is left as fitted."""
    lat, wire = nccl_terms(op, S, p, algo, proto)
    nc = nccl_channels(S, p, algo, proto)
    if algo in ("ring", "tree"):
        wire *= p.channels / nc
    if algo == "nvls":
        wire += nvls_fill_s(S, p, nc)
    return lat + wire, nc


# ----------------------------------------------------------------------------- NCCL's point-to-point path
# all_to_all is ncclSend/ncclRecv to every peer in one group: channels are picked per peer, not by the tuner
# (graph/paths.cc ncclTopoComputeP2pChannels, enqueue.cc addP2pToPlan; constants: catalog/nccl.yaml p2p).


def pow2_up(x: int) -> int:
    """NCCL's pow2Up: the smallest power of two ≥ x."""
    return 1 << max(0, int(x) - 1).bit_length()


@dataclass(frozen=True)
class P2pPlan:
    """How NCCL runs one all_to_all of per-peer messages: the per-peer and total p2p channels and the result."""

    p2p_channels: int  # comm->p2pnChannels
    per_peer_max: int  # comm->p2pnChannelsPerPeer (nChannelsMax)
    per_peer_min: int  # nChannelsMin of scheduleP2pTasksToPlan
    channels: int  # channels one peer's message runs on (addP2pToPlan)
    ctas: int  # channels (CTAs) the whole exchange occupies: one stripe of ``channels`` per base channel
    batches: int  # batches the busiest channel runs one after the other


def _nvlink_links(p: Placement) -> int:
    """pathBw / nvlBw of ncclTopoGetNchannels: NVLinks to the peer, from the level's per-GPU rate."""
    return max(1, int(p.intra.bw_bytes_per_s / (nccl_tuning().p2p["nvlink_bw_GBps"][p.arch] * 1e9)))


def _peer_channels(p: Placement, remote: bool) -> int:
    """ncclTopoGetNchannels (paths.cc L920-955): NVLink 2·links, PCIe 2, network max(1 NIC, ⌈netBw / 14 GB/s⌉)."""
    c = nccl_tuning().p2p
    if remote:
        return max(1, math.ceil(p.inter.bw_bytes_per_s / (c["per_channel_net_GBps"] * 1e9) - 1e-9))
    if p.intra_hw == "nvlink":
        return c["nvlink_channels_per_link"] * _nvlink_links(p)
    return c["pci_channels"]


def p2p_chunk_bytes(p: Placement) -> int:
    """comm->p2pChunkSize (init.cc L830-838): network across nodes, NVLink on an all-NVLink node, else PCI."""
    c = nccl_tuning().p2p["chunk_bytes"]
    return c["net"] if _multi(p) else c["nvlink" if p.intra_hw == "nvlink" else "pci"]


def p2p_plan(peer_bytes: float, p: Placement) -> P2pPlan:
    """Channels of one peer's send (and recv) in an all_to_all of ``p.n`` ranks, as NCCL 2.30.7 sets them."""
    c = nccl_tuning().p2p
    n, multi = p.n, _multi(p)
    total = pow2_up(min(p.channels, c["max_channels"]))  # paths.cc L984-990
    per_peer = _peer_channels(p, remote=False) if p.per_node > 1 or not multi else 10**9
    if multi:
        per_peer = min(per_peer, _peer_channels(p, remote=True))
    per_peer = pow2_up(per_peer)
    batch = c["max_p2p_per_batch"]
    if multi:  # paths.cc L993-1001: fit every peer in one round of batches
        while per_peer * math.ceil(n / batch) > total and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(total, per_peer)
    lo = per_peer  # enqueue.cc L1142-1144
    while lo * n > total and lo > 1:
        lo //= 2
    step = p2p_chunk_bytes(p)  # enqueue.cc L915-925
    key = "multi_node" if multi else "one_node"
    min_part, max_part = step // c["part_min_divisor"][key], step * c["part_max_factor"][key]
    b = max(1, math.ceil(peer_bytes))
    nc = min(lo, math.ceil(b / min_part))
    part = max(min_part, math.ceil(b / nc))
    while part > max_part and nc <= per_peer // 2:
        nc *= 2
        part = math.ceil(b / nc)
    # Where the stripes go (include/channel.h ncclP2pChannelBaseForRound, init.cc ncclP2pSchedule L888-899): on one
    # node every round has its own base channel; across nodes the rounds of one schedule group (gcd(8, GPUs per
    # node) rounds) share a base and so one batch (≤ 8 ops, enqueue.cc L140-149). Bases are bit-reversed over the
    # p2pnChannels, so stripes only pile up once they fill all of them.
    if multi:
        bases = math.ceil(n / math.gcd(batch, p.per_node))
        batches = max(1, math.ceil(bases * nc / total))
    else:
        bases = n - 1
        batches = max(1, min(math.ceil(n / batch), math.ceil(bases * nc / total)))
    return P2pPlan(total, per_peer, lo, nc, min(total, bases * nc), batches)


def _channel_rate(p: Placement, remote: bool) -> float:
    """Bytes/s one p2p channel (CTA) moves with the Simple protocol.

    Network: the 14 GB/s per channel that ncclTopoGetNchannels sizes a network peer's channels by. NVLink: at least
    the nvlBw/2 a channel is sized for, and at least what one CTA of NCCL's own collectives moves, B_intra /
    comm->nChannels (the level's effective rate is what a ring on ``p.channels`` CTAs reaches: links.yaml efficiency,
    nccl-tests ring all_reduce). nvlBw/2 alone (10.3 GB/s on Hopper) undercounts a CTA: 4 H100s move 335 GB/s per
    GPU on 24 p2p CTAs (tests/data/nccl_alltoall_measured.csv h100x4-500M, NVIDIA/nccl#2169), ≥ 14 GB/s per CTA."""
    c = nccl_tuning().p2p
    if remote:
        return c["per_channel_net_GBps"] * 1e9
    if p.intra_hw == "nvlink":
        sized = c["nvlink_bw_GBps"][p.arch] * 1e9 / c["nvlink_channels_per_link"]
        return max(sized, p.intra.bw_bytes_per_s / max(1, p.channels))
    return c["pci_bw_GBps"] * 1e9 / c["pci_channels"]


def p2p_uses_ll(peer_bytes: float, channels: int) -> bool:
    """addP2pToPlan (enqueue.cc L931-933): LL when the message is ≤ channels × NCCL_P2P_LL_THRESHOLD (16 KiB)."""
    return peer_bytes <= channels * nccl_tuning().p2p["ll_threshold_bytes"]


def proxy_overhead_s(p: Placement, remote_peers: int, ll: bool) -> float:
    """The proxy thread's cost of posting the network sends and receives, one peer after the other: the tuner's
    per-network-step overhead getNetOverhead (tuning.cc L228-233: 1 µs, x86 AMD 2 µs, not told apart here), ×3 with
    Simple (tuning.cc L405-408), once per remote peer. The wire moves the posted peers' bytes meanwhile, so the
    time is the slower of the two (``nccl_all_to_all_time``)."""
    c = nccl_tuning().p2p
    return remote_peers * c["net_overhead_us"] * 1e-6 * (1 if ll else c["simple_net_overhead_factor"])


def nccl_all_to_all_time(S: float, p: Placement) -> tuple[float, str, int]:
    """NCCL all_to_all of ``S`` bytes per GPU (S/n to each peer) on its p2p path: (time, level, channels per peer).

    Each peer's message runs on ``p2p_plan(S/n).channels`` channels; the exchange occupies ``P2pPlan.ctas`` CTAs,
    shared among the peers (the ops of one batch split a CTA's warps), so each level gets the CTAs of its share of
    the peers, a channel moving ``_channel_rate``:
        t = batches · α + max((n−k)·o, (k−1)/n·S / (ℓ·min(B_intra, c_intra·r_nvl)),
                              (1+κ)·k(n−k)/n·S / (ℓ·min(r·B_inter, k·c_net·r_net)))
    with c_intra = ctas·(k−1)/(n−1), c_net = ctas·(n−k)/(n−1), α the level's step latency once per batch the
    busiest channel runs (``P2pPlan.batches``), o the proxy's cost per remote peer (``proxy_overhead_s``; 0 on one
    node) and ℓ = 1/2 when the message runs on LL (``p2p_uses_ll``), else 1."""
    n, k = p.n, min(p.per_node, p.n)
    plan = p2p_plan(S / n, p)
    multi = _multi(p)
    ll = p2p_uses_ll(S / n, plan.channels)
    ll_share = nccl_tuning().p2p["ll_data_share"] if ll else 1.0  # LL lines carry half data (chunkDataSize /= 2)
    c_intra, c_net = plan.ctas * (k - 1) / (n - 1), (plan.ctas * (n - k) / (n - 1) if multi else 0.0)
    intra_rate = min(p.intra.bw_bytes_per_s, c_intra * _channel_rate(p, False)) * ll_share if k > 1 else math.inf
    intra = (k - 1) / n * S / intra_rate if k > 1 else 0.0
    if not multi:
        return plan.batches * p.intra.latency_s + intra, "intra", plan.channels
    node_rate = min(p.node_inter_bw, k * c_net * _channel_rate(p, True)) * ll_share
    vol = k * (n - k) / n * S
    inter = link_time_s(vol, vol, node_rate, p.reverse_share)
    level = "inter" if inter >= intra else "intra"
    proxy = proxy_overhead_s(p, n - k, ll)  # overlaps the wire: the last peer is posted while the others move
    return plan.batches * p.inter.latency_s + max(proxy, intra, inter), level, plan.channels


def _gloo_cost(op: str, S: float, p: Placement, algorithm: str | None) -> CollectiveCost:
    """gloo (torch.distributed on CPU) runs rings with no low-latency protocol; its reduce_scatter reduces
    the whole buffer (an all-reduce, then a slice), measured on the emulated cluster (docs/measure.md)."""
    if op in ("all_to_all", "send_recv"):
        t, level = all_to_all_time(S, p) if op == "all_to_all" else send_recv_time(S, p)
        algo = "pairwise" if op == "all_to_all" else "p2p"
    else:
        algo = algorithm or "ring"
        if algo not in _ALGO_FUNCS:
            raise ValueError(f"gloo has no {algo!r}; choose one of {', '.join(_ALGO_FUNCS)}")
        t, level = _ALGO_FUNCS[algo]("all_reduce" if op == "reduce_scatter" and algo == "ring" else op, S, p)
    algbw = S / t
    return CollectiveCost(t, algo, level, algbw, algbw * bus_factor(op, p.n), "")


def collective_cost(
    op: str, message_bytes: float, placement: Placement, algorithm: str | None = None, protocol: str | None = None
) -> CollectiveCost:
    """Time of one collective. Under NCCL, ``algorithm=None`` picks the fastest (algorithm, protocol) pair of
    NCCL's tuning model, as NCCL does; a named NCCL algorithm gets its fastest protocol (or ``protocol``).
    ``recursive_doubling`` and ``hierarchical`` (never picked by NCCL) are priced by their α-β formulas;
    under gloo every collective is a ring with no protocol choice.
    """
    if op not in OPS:
        raise ValueError(f"unknown collective op {op!r}; choose one of {', '.join(OPS)}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be ≥ 0, got {message_bytes}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    p = placement
    if p.n <= 1 or message_bytes == 0:
        return CollectiveCost(0.0, algorithm or "none", "none", math.inf, math.inf, "")
    if p.library == "gloo":
        return _gloo_cost(op, message_bytes, p, algorithm)
    channels = 0
    if op == "all_to_all" and not p.measured:  # NCCL's p2p path; a calibrated profile keeps its fitted α-β
        t, level, channels = nccl_all_to_all_time(message_bytes, p)
        algo, proto = "pairwise", "Simple"
    elif op in ("all_to_all", "send_recv"):
        t, level = all_to_all_time(message_bytes, p) if op == "all_to_all" else send_recv_time(message_bytes, p)
        algo, proto = ("pairwise" if op == "all_to_all" else "p2p"), "Simple"
    else:
        options = [
            (a, pr)
            for a, pr in nccl_options(op, p)
            if (algorithm is None or a == algorithm) and (protocol is None or pr == protocol)
        ]
        if options:
            # NCCL picks by its tuner's full-channel times, then runs the pick on the channels it gives it
            _, algo, proto = min((nccl_time(op, message_bytes, p, a, pr), a, pr) for a, pr in options)
            t, channels = nccl_run_time(op, message_bytes, p, algo, proto)
            level = "intra" if algo == "nvls" else _ring_bottleneck(p)[2]
            if algo == "nvls_tree":
                level = (
                    "inter"
                    if p.node_inter_bw * (2 if p.nodes <= 2 else 1)
                    < p.nvls_bw_bytes_per_s * 2 * (p.per_node - 1) / p.per_node
                    else "intra"
                )
        elif algorithm in _ALGO_FUNCS and protocol in (None, "Simple"):
            # MPI-style algorithms (and tree broadcast): Thakur's α-β formulas, no NCCL protocol
            t, level = _ALGO_FUNCS[algorithm](op, message_bytes, p)
            algo, proto = algorithm, ""
        else:
            what = f"{algorithm or 'any algorithm'}" + (f" with protocol {protocol}" if protocol else "")
            raise ValueError(f"{what} cannot run {op} on this placement")
    algbw = message_bytes / t
    return CollectiveCost(t, algo, level, algbw, algbw * bus_factor(op, p.n), proto, channels)
