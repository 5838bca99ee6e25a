"""A routed all-to-all: uneven splits, the traffic matrix an MoE router produced, priced on a two-level topology.

``matrix[i][j]`` is the bytes rank i sends rank j (ranks laid out node by node, ``p.per_node`` to a node). Every
rank exchanges with every other at once (gloo ``alltoallv`` posts all n − 1 sends and receives before waiting;
NCCL's all-to-all is n − 1 concurrent send/recv pairs), so the time is the busiest resource's:

* inside a node, one rank's sends to (and receives from) its node peers over the intra level:
  max(Σ_j∈node send_ij, Σ_j∈node recv_ij) / B_intra  (full duplex);
* across nodes, a node's link carries out_a = Σ_{i∈a, j∉a} M_ij one way and in_a = Σ_{i∉a, j∈a} M_ij the
  other: (max(out_a, in_a) + κ · min(out_a, in_a)) / (r · B_inter), with κ the share of the lighter
  direction that does not overlap the heavier one. κ = 0 is a full-duplex link (NCCL); on gloo κ is measured
  (``bench moe``'s probe: a symmetric exchange between the nodes, κ = t · B / bytes − 1; docs/moe_bench.md):
  gloo drives each pair's one TCP connection in both directions in turns (docs/remedies.md: 2× at 2 ranks), and
  with several connections per link the turns partly overlap;
* plus (n − 1) α of the level the exchange crosses (one message step per peer).

The busiest rank's (node's) send or receive bytes bound the time — λ > 1 routing makes one rank's receive side
the bound. Hand-worked cases in tests/test_bench_moe.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from commtax.costs.collectives import Placement, link_time_s  # the κ link formula, one copy

__all__ = ["RoutedAllToAll", "link_time_s", "node_of", "routed_all_to_all"]


@dataclass(frozen=True)
class RoutedAllToAll:
    time_s: float
    bottleneck: str  # "inter" (a node link) or "intra" (a rank's node-local exchange)
    inter_out_bytes: tuple[float, ...]  # per node: bytes leaving it
    inter_in_bytes: tuple[float, ...]  # per node: bytes entering it
    send_bytes: tuple[float, ...]  # per rank: bytes to other ranks
    recv_bytes: tuple[float, ...]  # per rank: bytes from other ranks


def node_of(rank: int, per_node: int) -> int:
    return rank // per_node


def routed_all_to_all(matrix: list[list[float]], p: Placement, reverse_share: float = 0.0) -> RoutedAllToAll:
    """Time of one all-to-all with send matrix ``matrix`` (bytes, diagonal kept local) on placement ``p``."""
    n = len(matrix)
    if n != p.n or any(len(row) != n for row in matrix):
        raise ValueError(f"matrix must be {p.n}×{p.n} (the group's ranks), got {n} rows")
    if not 0.0 <= reverse_share <= 1.0:
        raise ValueError(f"reverse_share is a fraction in [0, 1], got {reverse_share}")
    k = min(p.per_node, n)
    nodes = -(-n // k)
    send = tuple(sum(matrix[i][j] for j in range(n) if j != i) for i in range(n))
    recv = tuple(sum(matrix[i][j] for i in range(n) if i != j) for j in range(n))
    intra = 0.0
    for r in range(n):  # one rank's node-local exchange, full duplex
        peers = [j for j in range(n) if j != r and node_of(j, k) == node_of(r, k)]
        out, inn = sum(matrix[r][j] for j in peers), sum(matrix[j][r] for j in peers)
        intra = max(intra, max(out, inn) / p.intra.bw_bytes_per_s)
    outs = tuple(
        sum(matrix[i][j] for i in range(n) for j in range(n) if node_of(i, k) == a != node_of(j, k))
        for a in range(nodes)
    )
    ins = tuple(
        sum(matrix[i][j] for i in range(n) for j in range(n) if node_of(j, k) == a != node_of(i, k))
        for a in range(nodes)
    )
    if nodes == 1 or p.inter is None:
        return RoutedAllToAll((n - 1) * p.intra.latency_s + intra, "intra", outs, ins, send, recv)
    inter = max(link_time_s(o, i, p.node_inter_bw, reverse_share) for o, i in zip(outs, ins))
    bottleneck = "inter" if inter >= intra else "intra"
    return RoutedAllToAll((n - 1) * p.inter.latency_s + max(intra, inter), bottleneck, outs, ins, send, recv)
