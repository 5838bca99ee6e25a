"""Collective algorithms as explicit point-to-point schedules: one description, two uses.

A schedule is a list of steps; a step is the set of transfers that run concurrently.
``algorithms.run_schedule`` executes it with torch.distributed isend/irecv, and
``schedule_time_s`` prices it with an α-β model on a two-level topology, so the code that
moves the bytes and the formula that predicts its time cannot drift apart.
No torch import here: this module is on the estimate path.

Sources: Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
Operations in MPICH" (ring, recursive halving/doubling, binomial/binary trees);
nccl-tests doc/PERFORMANCE.md (message-size and busbw conventions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest

ALGORITHMS = ("ring", "recursive_doubling", "tree", "hierarchical")
# bench --impl name → algorithm, and the ops each of ours implements ("torch" = the library's own, all ops)
IMPL_ALGORITHM = {"ring": "ring", "rhd": "recursive_doubling", "tree": "tree", "hier": "hierarchical"}
IMPL_OPS = {
    "ring": ("all_reduce", "all_gather", "reduce_scatter"),
    "rhd": ("all_reduce",),
    "tree": ("all_reduce",),
    "hier": ("all_reduce",),
}


def impl_supports(impl: str, op: str) -> bool:
    return impl == "torch" or op in IMPL_OPS.get(impl, ())


TREE_CHUNK_BYTES = 512 * 1024  # pipelining granularity of the binary tree


@dataclass(frozen=True)
class Transfer:
    """``src`` sends elements [lo, hi) of its flat buffer to ``dst``, which adds them (reduce) or copies them."""

    src: int
    dst: int
    lo: int
    hi: int
    reduce: bool


Step = tuple[Transfer, ...]
Schedule = list[Step]


def chunk_bounds(lo: int, hi: int, parts: int) -> list[int]:
    """Split [lo, hi) into ``parts`` near-equal chunks (the first ones shorter when uneven)."""
    return [lo + i * (hi - lo) // parts for i in range(parts + 1)]


def _step(transfers) -> Step:
    return tuple(t for t in transfers if t.hi > t.lo)


def merge(*schedules: Schedule) -> Schedule:
    """Run schedules on disjoint rank sets side by side, step by step."""
    return [tuple(t for step in steps for t in step) for steps in zip_longest(*schedules, fillvalue=())]


def ring_reduce_scatter(ranks: Sequence[int], lo: int, hi: int) -> Schedule:
    """n−1 steps; at step s rank i adds chunk (i−s−1) mod n into rank i+1. Ends with rank i owning chunk i."""
    n, b = len(ranks), chunk_bounds(lo, hi, len(ranks))
    steps = []
    for s in range(n - 1):
        c = [(i - s - 1) % n for i in range(n)]
        steps.append(_step(Transfer(ranks[i], ranks[(i + 1) % n], b[c[i]], b[c[i] + 1], True) for i in range(n)))
    return steps


def ring_all_gather(ranks: Sequence[int], lo: int, hi: int) -> Schedule:
    """n−1 steps; at step s rank i forwards chunk (i−s) mod n to rank i+1. Starts with rank i owning chunk i."""
    n, b = len(ranks), chunk_bounds(lo, hi, len(ranks))
    steps = []
    for s in range(n - 1):
        c = [(i - s) % n for i in range(n)]
        steps.append(_step(Transfer(ranks[i], ranks[(i + 1) % n], b[c[i]], b[c[i] + 1], False) for i in range(n)))
    return steps


def ring_all_reduce(ranks: Sequence[int], lo: int, hi: int) -> Schedule:
    """Reduce-scatter then all-gather: 2(n−1) steps of S/n each (Thakur et al. 2005, §4)."""
    return ring_reduce_scatter(ranks, lo, hi) + ring_all_gather(ranks, lo, hi)


def recursive_halving_doubling_all_reduce(ranks: Sequence[int], lo: int, hi: int) -> Schedule:
    """Rabenseifner: halving reduce-scatter + doubling all-gather over the largest power of two p ≤ n.

    The r = n − p extra ranks first fold into a partner and get the result back at the end
    (Thakur et al. 2005, §4.4): 2·log2(p) (+2) steps, S·(p−1)/p bytes each way.
    """
    n = len(ranks)
    p = 1 << (n.bit_length() - 1)
    r = n - p
    pre = _step(Transfer(ranks[2 * i], ranks[2 * i + 1], lo, hi, True) for i in range(r))
    active = [ranks[2 * i + 1] for i in range(r)] + list(ranks[2 * r :])
    ranges = [(lo, hi)] * p
    steps: Schedule = [pre] if pre else []
    history = []
    d = p // 2
    while d >= 1:
        new, transfers = list(ranges), []
        for j in range(p):
            a, z = ranges[j]
            mid = a + (z - a) // 2
            keep, give = ((a, mid), (mid, z)) if j & d == 0 else ((mid, z), (a, mid))
            transfers.append(Transfer(active[j], active[j ^ d], give[0], give[1], True))
            new[j] = keep
        history.append(ranges)
        ranges = new
        steps.append(_step(transfers))
        d //= 2
    d = 1
    while d < p:
        transfers = [Transfer(active[j], active[j ^ d], *ranges[j], False) for j in range(p)]
        ranges = history.pop()
        steps.append(_step(transfers))
        d *= 2
    post = _step(Transfer(ranks[2 * i + 1], ranks[2 * i], lo, hi, False) for i in range(r))
    return steps + ([post] if post else [])


def _heights(n: int) -> list[int]:
    """Height of each node of the heap-ordered binary tree on n nodes (leaves 0)."""
    h = [0] * n
    for i in reversed(range(n)):
        kids = [k for k in (2 * i + 1, 2 * i + 2) if k < n]
        h[i] = 1 + max(h[k] for k in kids) if kids else 0
    return h


def tree_chunks(message_bytes: float) -> int:
    """Pipeline depth of the binary tree: chunks of about TREE_CHUNK_BYTES, at most 32."""
    return max(1, min(32, math.ceil(message_bytes / TREE_CHUNK_BYTES)))


def binary_tree_all_reduce(ranks: Sequence[int], lo: int, hi: int, chunks: int = 1) -> Schedule:
    """Pipelined reduce up a binary tree then broadcast down it, chunk by chunk.

    Node i sends chunk c to its parent at step c + height(i); the root starts sending chunk c
    down at step c + H and a node at depth δ receives it at step c + H + δ − 1:
    k + H + D − 1 steps of S/k (k chunks, tree height H, depth D = ⌊log2 n⌋).
    """
    n = len(ranks)
    if n == 1:
        return []
    height = _heights(n)
    depth = [int(math.log2(i + 1)) for i in range(n)]
    b = chunk_bounds(lo, hi, chunks)
    total = chunks + height[0] + max(depth) - 1
    steps: list[list[Transfer]] = [[] for _ in range(total)]
    for i in range(1, n):
        parent = (i - 1) // 2
        for c in range(chunks):
            steps[c + height[i]].append(Transfer(ranks[i], ranks[parent], b[c], b[c + 1], True))
            steps[c + height[0] + depth[i] - 1].append(Transfer(ranks[parent], ranks[i], b[c], b[c + 1], False))
    return [_step(s) for s in steps]


def hierarchical_all_reduce(ranks: Sequence[int], lo: int, hi: int, per_node: int) -> Schedule:
    """Intra-node ring reduce-scatter → ring all-reduce across nodes per local index (rails) → intra-node all-gather.

    ``ranks`` are node-major: ranks[k·per_node:(k+1)·per_node] share node k.
    """
    assert len(ranks) % per_node == 0, "hierarchical all-reduce needs whole nodes"
    nodes = [list(ranks[k : k + per_node]) for k in range(0, len(ranks), per_node)]
    b = chunk_bounds(lo, hi, per_node)
    rails = [[node[l] for node in nodes] for l in range(per_node)]
    return (
        merge(*(ring_reduce_scatter(node, lo, hi) for node in nodes))
        + merge(*(ring_all_reduce(rail, b[l], b[l + 1]) for l, rail in enumerate(rails)))
        + merge(*(ring_all_gather(node, lo, hi) for node in nodes))
    )


def all_reduce_schedule(algorithm: str, n: int, numel: int, elem_bytes: int = 4, per_node: int = 1) -> Schedule:
    """The all-reduce schedule over ranks 0..n−1 for a flat buffer of ``numel`` elements."""
    ranks = list(range(n))
    if algorithm == "ring":
        return ring_all_reduce(ranks, 0, numel)
    if algorithm == "recursive_doubling":
        return recursive_halving_doubling_all_reduce(ranks, 0, numel)
    if algorithm == "tree":
        return binary_tree_all_reduce(ranks, 0, numel, tree_chunks(numel * elem_bytes))
    if algorithm == "hierarchical":
        return hierarchical_all_reduce(ranks, 0, numel, per_node)
    raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


def op_schedule(op: str, algorithm: str, n: int, numel: int, elem_bytes: int = 4, per_node: int = 1) -> Schedule:
    """Schedule of ``op`` on a buffer of ``numel`` elements.

    Sizes as nccl-tests counts them: the all_gather output, the reduce_scatter input."""
    if op == "all_reduce":
        return all_reduce_schedule(algorithm, n, numel, elem_bytes, per_node)
    if algorithm != "ring":
        raise ValueError(f"{op} is implemented with algorithm 'ring' only, got {algorithm!r}")
    if op == "reduce_scatter":
        return ring_reduce_scatter(list(range(n)), 0, numel)
    if op == "all_gather":
        return ring_all_gather(list(range(n)), 0, numel)
    raise ValueError(f"op must be all_reduce, reduce_scatter or all_gather, got {op!r}")


@dataclass(frozen=True)
class TwoLevelLinks:
    """Where ranks sit and what links join them: node-major placement, per_node ranks per node.

    ``intra`` is per rank per direction (memory/loopback/NVLink); ``nic`` is per node per
    direction, shared by the node's ranks (a tc-shaped veth, a NIC).
    """

    per_node: int
    intra_bw_bytes_per_s: float
    intra_latency_s: float
    nic_bw_bytes_per_s: float
    nic_latency_s: float

    def node(self, rank: int) -> int:
        return rank // self.per_node


def step_time_s(step: Step, elem_bytes: int, links: TwoLevelLinks) -> float:
    """α of the slowest level used + the busiest resource's bytes / its bandwidth (per direction)."""
    load: dict[tuple, float] = {}
    alpha = 0.0
    for t in step:
        nbytes = (t.hi - t.lo) * elem_bytes
        a, b = links.node(t.src), links.node(t.dst)
        if a == b:
            keys, bw, alpha = (
                [("tx", t.src), ("rx", t.dst)],
                links.intra_bw_bytes_per_s,
                max(alpha, links.intra_latency_s),
            )
        else:
            keys, bw, alpha = [("nic_tx", a), ("nic_rx", b)], links.nic_bw_bytes_per_s, max(alpha, links.nic_latency_s)
        for k in keys:
            load[k] = load.get(k, 0.0) + nbytes / bw
    return alpha + max(load.values(), default=0.0)


def schedule_time_s(schedule: Schedule, elem_bytes: int, links: TwoLevelLinks) -> float:
    """Σ over steps of (α + max resource bytes / bw): steps are separated by data dependencies."""
    return sum(step_time_s(step, elem_bytes, links) for step in schedule if step)


def predict_time_s(
    op: str, algorithm: str, n: int, message_bytes: float, links: TwoLevelLinks, elem_bytes: int = 4
) -> float:
    """Predicted time of ``op`` with our ``algorithm`` on ``links``, priced from the very schedule that runs."""
    numel = max(1, int(message_bytes // elem_bytes))
    return schedule_time_s(op_schedule(op, algorithm, n, numel, elem_bytes, links.per_node), elem_bytes, links)
