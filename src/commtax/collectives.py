"""α-β cost of one collective on a two-level topology.

One description of each algorithm, used both by the predictor and (as the reference the
measured times are checked against) by ``commtax.measure``.  Costs follow Thakur, Rabenseifner
& Gropp, "Optimization of Collective Communication Operations in MPICH" (IJHPCA 2005):
a message of m bytes over a link costs α + m/B.  Sizes follow nccl-tests
(doc/PERFORMANCE.md): ``message_bytes`` is the whole buffer (all_gather: the output,
reduce_scatter: the input), and busbw = algbw × bus factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "tree", "recursive_doubling", "hierarchical", "nvls")


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


def nvls_time(op: str, S: float, p: Placement) -> tuple[float, str]:
    """NVLink SHARP all_reduce: each GPU pushes S into the switch and reads the reduced S back: n·α + S/B_nvls.

    Each of the n GPUs reduces (multimem.ld_reduce) and multicasts its 1/n slice in turn, so the pipeline
    fills over n steps; fits the published 8×H200 sweep (~100 µs above the bandwidth term at 64 MiB-1 GiB).
    """
    if op != "all_reduce" or not p.nvls or p.spans_nodes or p.nvls_bw_bytes_per_s <= 0:
        raise ValueError("nvls needs an all_reduce inside one NVLink-SHARP domain")
    return p.n * p.intra.latency_s + S / p.nvls_bw_bytes_per_s, "intra"


def all_to_all_time(S: float, p: Placement) -> tuple[float, str]:
    """Pairwise exchange: each GPU keeps 1/n, sends (k-1)/n·S over NVLink; the node's k GPUs send k(n-k)/n·S over its rails."""
    n, k = p.n, min(p.per_node, p.n)
    intra = (k - 1) / n * S / p.intra.bw_bytes_per_s
    if not p.spans_nodes or p.inter is None:
        return (n - 1) * p.intra.latency_s + intra, "intra"
    inter = k * (n - k) / n * S / p.node_inter_bw
    return (n - 1) * p.inter.latency_s + max(intra, inter), "inter" if inter >= intra else "intra"


def send_recv_time(S: float, p: Placement) -> tuple[float, str]:
    """Point-to-point: α + S/B over the level that joins the two GPUs (inter when the pair spans nodes)."""
    lvl = p.inter if (p.spans_nodes and p.inter is not None) else p.intra
    return lvl.latency_s + S / lvl.bw_bytes_per_s, lvl.name


_ALGO_FUNCS = {
    "ring": ring_time,
    "tree": tree_time,
    "recursive_doubling": recursive_doubling_time,
    "hierarchical": hierarchical_time,
    "nvls": nvls_time,
}


def applicable_algorithms(op: str, p: Placement) -> list[str]:
    """Algorithms that implement ``op`` on this placement, in NCCL's order of preference."""
    out = []
    if op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        out.append("ring")
    if op in ("all_reduce", "broadcast"):
        out.append("tree")
    if op in ("all_reduce", "all_gather", "reduce_scatter") and p.n > 1 and not p.n & (p.n - 1):
        out.append("recursive_doubling")
    if op in ("all_reduce", "all_gather", "reduce_scatter") and p.spans_nodes and p.inter is not None:
        out.append("hierarchical")
    if op == "all_reduce" and p.nvls and not p.spans_nodes and p.nvls_bw_bytes_per_s > 0:
        out.append("nvls")
    return out


# NCCL's low-latency (LL) protocol: 8-byte stores carrying 4 bytes of data and a 4-byte flag, so half the
# bandwidth, but per-hop latency of the link itself (NCCL src/graph/tuning.cc: baseLat 6.6 µs for ring LL,
# hwLat 0.6 µs per NVLink hop, 2.7 µs per network hop). Bulk transfers use the Simple protocol, whose
# per-step α is the catalog's ``latency_us``.
LL_BANDWIDTH_FRACTION = 0.5
# + a launch floor: CUDA kernel launch and NCCL host-side enqueue; both published 8-GPU sweeps bottom out at
# ~40 µs for a 32 KiB all_reduce (stas00/ml-engineering, nccl-tests on A100 and torch on H200)
LL_BASE_S = 6.6e-6 + 25e-6
LL_HOP_S = {"intra": 0.6e-6, "inter": 2.7e-6}


def low_latency(p: Placement) -> Placement:
    """The same placement as the LL protocol sees it: half the bandwidth, the link's own hop latency."""

    def ll(level: Level | None) -> Level | None:
        if level is None:
            return None
        return Level(level.name, level.bw_bytes_per_s * LL_BANDWIDTH_FRACTION, LL_HOP_S.get(level.name, 0.6e-6))

    return Placement(p.n, p.per_node, ll(p.intra), ll(p.inter), False, 0.0, p.rails, p.library)


def _gloo_cost(op: str, S: float, p: Placement, algorithm: str | None) -> CollectiveCost:
    """gloo (torch.distributed on CPU) runs rings with no low-latency protocol; its reduce_scatter reduces
    the whole buffer (an all-reduce, then a slice), measured on the emulated cluster (docs/measure.md)."""
    if op in ("all_to_all", "send_recv"):
        t, level = all_to_all_time(S, p) if op == "all_to_all" else send_recv_time(S, p)
        algo = "pairwise" if op == "all_to_all" else "p2p"
    else:
        algo = algorithm or "ring"
        if algo not in _ALGO_FUNCS:
            raise ValueError(f"unknown algorithm {algo!r}; choose one of {', '.join(ALGORITHMS)}")
        t, level = _ALGO_FUNCS[algo]("all_reduce" if op == "reduce_scatter" and algo == "ring" else op, S, p)
    algbw = S / t
    return CollectiveCost(t, algo, level, algbw, algbw * bus_factor(op, p.n))


def collective_cost(
    op: str, message_bytes: float, placement: Placement, algorithm: str | None = None
) -> CollectiveCost:
    """Time of one collective; ``algorithm=None`` picks the fastest applicable one, as NCCL's tuner does.

    Each algorithm is timed under the Simple and the LL protocol and the faster is taken (NCCL's tuner
    makes the same choice per size).
    """
    if op not in OPS:
        raise ValueError(f"unknown collective op {op!r}; choose one of {', '.join(OPS)}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes must be ≥ 0, got {message_bytes}")
    p = placement
    if p.n <= 1 or message_bytes == 0:
        return CollectiveCost(0.0, algorithm or "none", "none", math.inf, math.inf)
    if p.library == "gloo":
        return _gloo_cost(op, message_bytes, p, algorithm)
    if op == "all_to_all":
        t, level = all_to_all_time(message_bytes, p)
        algo = "pairwise"
    elif op == "send_recv":
        t, level = send_recv_time(message_bytes, p)
        algo = "p2p"
    else:
        candidates = [algorithm] if algorithm else applicable_algorithms(op, p)
        if algorithm and algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        best = None
        ll = low_latency(p)
        for name in candidates:
            t_a, lvl = _ALGO_FUNCS[name](op, message_bytes, p)
            if name != "nvls":
                t_a = min(t_a, LL_BASE_S + _ALGO_FUNCS[name](op, message_bytes, ll)[0])
            if best is None or t_a < best[0]:
                best = (t_a, lvl, name)
        t, level, algo = best
    algbw = message_bytes / t
    return CollectiveCost(t, algo, level, algbw, algbw * bus_factor(op, p.n))
