"""Collectives on a leaf/spine fabric: the links a group crosses, who else crosses them, max-min fair shares.

A group kind (all DP groups of every stage, all PP pairs, …) runs its collectives at once, so each group is a
*coflow*: its inter-node traffic is a set of node → node hops, each carrying a fixed fraction ``w`` of the rate
``x`` at which the group's members on one node push into the network (a ring: every hop w = 1; an all-to-all over
N nodes: w = 1/(N−1) to each other node; a pipeline pair: one hop). A hop crosses the NIC links of its
two nodes and, when they sit under different leaves (pods), the leaf (pod) uplink on each side. Rates are max-min
fair (progressive filling, Bertsekas & Gallager, *Data Networks* §6.5.2): every coflow's x rises at the same pace
until a link it loads is full or it reaches its own NIC rate; frozen coflows keep their rate, the rest go on.
Background flows (``fabric.flows``, another job's traffic) take part the same way, a background share of a
level (``fabric.background``) removes that share of its uplinks first.

The collective formulas then see the group's per-GPU inter-node rate scaled by x / (its own NIC rate), and the
binding link is named. Pure numbers in, pure numbers out: commtax.costs.topology builds the groups.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from commtax.spec import Cluster, Fabric
from commtax.units import GBIT

Link = tuple[str, int, str]  # (level "node" | "leaf" | "pod", index, direction "up" | "down")
Hop = tuple[int, int, float]  # (source fabric node, destination fabric node, share w of the coflow's rate)


@dataclass(frozen=True)
class FabricShare:
    """What the fabric leaves a group kind: its rate as a fraction of its own NIC rate, and what binds it."""

    factor: float  # x / x_own ≤ 1 for the slowest group of the kind
    binding: str  # "" when nothing in the fabric binds it (its own NICs do), else a link like "leaf 0 uplink"
    queue_s: float = 0.0  # standing queue each of its steps waits behind (``fabric.queue_ms`` on a saturated link)


# ----------------------------------------------------------------------------- placement of the job's nodes
def leaves_used(fabric: Fabric, nodes: int) -> int:
    return max(1, math.ceil(nodes / fabric.nodes_per_leaf))


def fabric_nodes(fabric: Fabric, nodes: int) -> tuple[int, ...]:
    """The fabric node each job node lands on. contiguous: i → i. scattered: dealt round-robin over the leaves the
    job would fill contiguously, alternating pods (leaf 0 of pod 0, leaf 0 of pod 1, …, leaf 1 of pod 0, …), so
    neighbouring ranks sit under different leaves wherever they can."""
    if isinstance(fabric.placement, list):
        return tuple(fabric.placement)
    if fabric.placement == "contiguous":
        return tuple(range(nodes))
    L = leaves_used(fabric, nodes)
    per_pod = fabric.leaves_per_pod or L
    pods = math.ceil(L / per_pod)
    order = [p * per_pod + i for i in range(per_pod) for p in range(pods) if p * per_pod + i < L]
    return tuple(order[j % L] * fabric.nodes_per_leaf + j // L for j in range(nodes))


def leaf_of(fabric: Fabric, node: int) -> int:
    return node // fabric.nodes_per_leaf


def pod_of(fabric: Fabric, leaf: int) -> int:
    return leaf // fabric.leaves_per_pod if fabric.leaves_per_pod else 0


def path(fabric: Fabric, a: int, b: int) -> tuple[Link, ...]:
    """Links a hop from fabric node a to b crosses (each direction of a link is a link of its own)."""
    out: list[Link] = [("node", a, "up"), ("node", b, "down")]
    if fabric.topology == "single-switch":
        return tuple(out)
    la, lb = leaf_of(fabric, a), leaf_of(fabric, b)
    if la != lb:
        out += [("leaf", la, "up"), ("leaf", lb, "down")]
        pa, pb = pod_of(fabric, la), pod_of(fabric, lb)
        if pa != pb:
            out += [("pod", pa, "up"), ("pod", pb, "down")]
    return tuple(out)


# ----------------------------------------------------------------------------- capacities
@dataclass(frozen=True)
class Capacities:
    """Per direction, bytes/s: a node's NICs (as the job's GPUs share them), a leaf's and a pod's uplink."""

    node: float
    leaf: float
    pod: float

    def of(self, link: Link) -> float:
        return {"node": self.node, "leaf": self.leaf, "pod": self.pod}[link[0]]


def capacities(cluster: Cluster, node_bytes_per_s: float) -> Capacities:
    """leaf uplink = nodes_per_leaf · nics · B_nic / oversubscription_leaf · (1 − background_leaf);
    pod uplink = leaves_per_pod · (leaf uplink before background) / oversubscription_pod · (1 − background_pod)."""
    f = cluster.fabric
    assert f is not None
    leaf_line = f.nodes_per_leaf * cluster.nics_per_node * cluster.inter_node.bw_bytes_per_s
    leaf = leaf_line / f.oversubscription.get("leaf", 1.0)
    pod = (f.leaves_per_pod or 0) * leaf / f.oversubscription.get("pod", 1.0)
    return Capacities(
        node=node_bytes_per_s,
        leaf=leaf * (1 - f.background.get("leaf", 0.0)),
        pod=pod * (1 - f.background.get("pod", 0.0)) if f.leaves_per_pod else math.inf,
    )


# ----------------------------------------------------------------------------- max-min fair rates
@dataclass(frozen=True)
class Coflow:
    """``count`` identical coflows: each with its own rate cap, loading ``usage[link]`` × its rate on each link.

    ``pace``: the coflow's rate per unit of the common fill level. TCP (and a switch's per-flow arbitration) shares
    a link per connection, not per job, so a coflow that spreads its rate over k connections of w = 1/k each
    (an all-to-all over k + 1 nodes) rises k times as fast as a single flow (Jain, Chiu & Hawe, DEC-TR-301
    1984: TCP's AIMD converges to equal shares per connection); 1 for a ring, a pipeline pair, a background flow."""

    cap: float
    usage: tuple[tuple[Link, float], ...]
    count: int = 1
    pace: float = 1.0


def max_min(coflows: Sequence[Coflow], capacity) -> list[tuple[float, Link | None]]:
    """Progressive filling: (rate, the link that froze it, or None when its own cap did) for each coflow.

    ``capacity(link)`` gives a link's capacity. Every active coflow's rate rises with the common level t as
    pace · t, to the next level at which a link fills, (C_l − frozen load_l) / Σ_active count·usage_l·pace, or a
    coflow reaches its cap (cap / pace)."""
    rate = [0.0] * len(coflows)
    why: list[Link | None] = [None] * len(coflows)
    active = set(range(len(coflows)))
    users: dict[Link, list[tuple[int, float]]] = {}  # link -> (coflow, the load it puts there per unit of rate)
    for i, c in enumerate(coflows):
        for link, u in c.usage:
            users.setdefault(link, []).append((i, c.count * u * c.pace))
    frozen_load = dict.fromkeys(users, 0.0)
    cap_of = {link: capacity(link) for link in users}
    while active:
        # the load the active coflows put on each link they share, per unit of their common rate
        load = {}
        for link, us in users.items():
            x = sum(w for i, w in us if i in active)
            if x > 0:
                load[link] = x
        level, bound = min(coflows[i].cap / coflows[i].pace for i in active), None
        for link, x in load.items():
            t = max(0.0, cap_of[link] - frozen_load[link]) / x
            if t < level:
                level, bound = t, link
        done = {i for i in active if coflows[i].cap <= coflows[i].pace * level * (1 + 1e-12)}
        for link, x in load.items():
            if frozen_load[link] + x * level >= cap_of[link] * (1 - 1e-9):
                for i, _ in users[link]:
                    if i in active and i not in done:
                        done.add(i)
                        why[i] = link
        if not done:  # rounding left nothing exactly full: freeze the users of the link that set the level
            done = {i for i, _ in users[bound] if i in active} if bound is not None else set(active)
            for i in done:
                why[i] = bound
        for i in done:
            c = coflows[i]
            rate[i] = min(c.pace * level, c.cap)
            for link, u in c.usage:
                frozen_load[link] += c.count * u * rate[i]
        active -= done
    return list(zip(rate, why, strict=True))


# ----------------------------------------------------------------------------- TCP-fair (α-fair) rates
TCP_ALPHA = 2.0  # Mo & Walrand 2000 §IV: TCP Reno's window control approximates (p, 2)-proportional fairness


@dataclass(frozen=True)
class Connection:
    """``count`` identical TCP connections along ``links`` (in the order they cross them), each carrying at most
    ``cap`` bytes/s; ``weight`` scales its utility (1 / RTT², below)."""

    cap: float
    links: tuple[Link, ...]
    count: int = 1
    weight: float = 1.0


def alpha_fair(
    conns: Sequence[Connection], capacity, alpha: float = TCP_ALPHA, tol: float = 1e-11, sweeps: int = 5000
) -> tuple[list[float], dict[Link, float]]:
    """The α-fair rates (Mo & Walrand 2000): maximise Σ count · weight · r^(1−α)/(1−α) (log r at α = 1) subject
    to every link's load ≤ its capacity and r ≤ cap; and each link's price.

    KKT: r = min(cap, (weight / Σ prices of its links)^(1/α)), a link's price > 0 only where it is full. Solved by
    dual coordinate ascent (Bertsekas, *Nonlinear Programming* §6.2): each link in turn gets the price that makes
    its load equal its capacity (bisection; 0 when it is not full at 0), until no rate moves by ``tol``. Rates
    are solved in units of the largest finite capacity, so prices stay near 1."""
    used = sorted({link for c in conns for link in c.links})
    cap_of = {link: capacity(link) for link in used}
    finite = [x for x in cap_of.values() if math.isfinite(x)]
    scale = max(finite) if finite else 1.0
    caps = [c.cap / scale for c in conns]
    on: dict[Link, list[int]] = {link: [] for link in used}
    for i, c in enumerate(conns):
        for link in c.links:
            on[link].append(i)
    price = dict.fromkeys(used, 0.0)
    q = [0.0] * len(conns)  # Σ prices along each connection

    def rate(i: int, extra: float = 0.0) -> float:
        p = q[i] + extra
        return caps[i] if p <= 0 else min(caps[i], (conns[i].weight / p) ** (1.0 / alpha))

    def load(link: Link, p: float) -> tuple[float, float]:
        """The link's load at price p (its other links' prices held) and its slope d load / dp."""
        total = slope = 0.0
        for i in on[link]:
            qi = q[i] - price[link] + p
            r = rate(i, p - price[link])
            total += conns[i].count * r
            if r < caps[i] and qi > 0:  # uncapped: r = (w / q)^(1/α), dr/dq = −r / (α q)
                slope -= conns[i].count * r / (alpha * qi)
        return total, slope

    def fill(link: Link, C: float) -> float:
        """The price at which the link is exactly full: Newton from its last price, kept inside a bracket by
        bisection (the load falls with the price, and is convex in it: Newton from the right never overshoots)."""
        lo, hi = 0.0, max(price[link], 1.0)
        while load(link, hi)[0] > C:
            lo, hi = hi, 2 * hi
        p = price[link] if price[link] > 0 else hi
        for _ in range(200):
            x, dx = load(link, p)
            if abs(x - C) <= 1e-14 * C or hi - lo <= 1e-15 * hi:
                break
            lo, hi = (p, hi) if x > C else (lo, p)
            step = p - (x - C) / dx if dx < 0 else (lo + hi) / 2
            p = step if lo < step < hi else (lo + hi) / 2
        return p

    rates = [rate(i) for i in range(len(conns))]
    for _ in range(sweeps):
        for link in used:
            C = cap_of[link] / scale
            if not math.isfinite(C):
                continue
            new = 0.0 if load(link, 0.0)[0] <= C else fill(link, C)
            for i in on[link]:
                q[i] += new - price[link]
            price[link] = new
        now = [rate(i) for i in range(len(conns))]
        moved = max((abs(a - b) for a, b in zip(now, rates, strict=True)), default=0.0)
        rates = now
        if moved <= tol:
            break
    return [r * scale for r in rates], price


def route(fabric: Fabric, a: int, b: int) -> tuple[Link, ...]:
    """``path``'s links in the order a packet crosses them: up from a, over the spine, down to b."""
    links = path(fabric, a, b)
    order = {("node", "up"): 0, ("leaf", "up"): 1, ("pod", "up"): 2, ("pod", "down"): 3, ("leaf", "down"): 4}
    return tuple(sorted(links, key=lambda lk: order.get((lk[0], lk[2]), 5)))


def connections_of(fabric: Fabric, hops: Sequence[Hop], cap: float, count: int) -> list[tuple[Connection, float]]:
    """A coflow's TCP connections: one per hop, carrying at most its share w of the coflow's rate cap; with w."""
    return [(Connection(cap * w, route(fabric, a, b), count), w) for a, b, w in hops]


def queued_links(conns: Sequence[Connection], rates: Sequence[float], background: int, capacity) -> set[Link]:
    """Links that hold a standing queue: full, carrying a background connection (``conns[background:]``) held below
    its own rate (a long-lived flow that always has more to send), and fed from two or more inputs — a port queues
    only where its inputs together exceed its rate (an output-queued switch); a link fed only by the one full link
    before it (the spine's far side, the receiver's port) gets no more than that link drains. The first link of a
    path is fed by the sender's sockets, each an input of its own."""
    load: dict[Link, float] = {}
    inputs: dict[Link, set] = {}
    for i, (c, r) in enumerate(zip(conns, rates, strict=True)):
        for j, link in enumerate(c.links):
            load[link] = load.get(link, 0.0) + c.count * r
            inputs.setdefault(link, set()).add(c.links[j - 1] if j else ("socket", i))
    greedy = {
        link
        for c, r in zip(conns[background:], rates[background:], strict=True)
        if r < c.cap * (1 - 1e-6)
        for link in c.links
    }
    return {lk for lk in greedy if load[lk] >= capacity(lk) * (1 - 1e-6) and len(inputs[lk]) > 1}


def own_queue_s(fabric: Fabric, nodes: Sequence[int], capacity) -> float:
    """The standing queue an all-to-all keeps with its own traffic under ``sharing: tcp``: its connections fill the
    link that binds it (the highest load over capacity of its hops), and where that link is fed from two or more
    inputs (``queued_links``' rule: an output-queued port queues where its inputs together exceed its rate) a
    loss-based sender's window keeps its buffer full, ``fabric.queue_ms`` deep. Seconds; 0 without ``queue_ms``.
    On the emulated 4 × 1 cluster the spine is fed from both nodes of a leaf (docs/fabric.md "Its own queue")."""
    if fabric.sharing != "tcp" or not fabric.queue_ms:
        return 0.0
    load: dict[Link, float] = {}
    inputs: dict[Link, set] = {}
    for a, b, w in all_to_all_hops(nodes):
        links = route(fabric, a, b)
        for j, link in enumerate(links):
            load[link] = load.get(link, 0.0) + w
            inputs.setdefault(link, set()).add(links[j - 1] if j else ("socket", a, b))
    if not load:
        return 0.0
    binding = max(load, key=lambda lk: load[lk] / capacity(lk))
    return fabric.queue_ms / 1e3 if len(inputs[binding]) > 1 else 0.0


def tcp_share(
    cluster: Cluster, groups: Sequence[Sequence[int]], pattern: str, cap: float, node_cap: float
) -> FabricShare:
    """``fabric_share`` under ``sharing: tcp``: every hop of every group, every background flow and every
    co-located ring is a TCP connection; the rates are α-fair (α = 2) among connections, weighted by 1 / RTT²,
    and a group moves at its slowest connection's rate over its share.

    TCP's rate goes as 1 / (RTT · √loss) (Mathis et al. 1997), which is α = 2 with weight 1 / RTT² (Mo & Walrand
    2000 §IV). A connection's RTT is the links' round trip (2 × the level's latency) plus ``fabric.queue_ms`` for
    each link with a standing queue it crosses (``queued_links``); which links queue depends on the rates, so the
    two are solved in turn until the set stands still. Each step of the group waits behind the standing queues
    of its slowest-queued connection's path, as a latency."""
    f = cluster.fabric
    assert f is not None
    hops_of = PATTERNS[pattern]
    mine = [(h, n) for h, n in Counter(hops_of(g) for g in groups).items() if h]
    if not mine:
        return FabricShare(1.0, "")
    conns: list[Connection] = []
    owner: list[tuple[int, float]] = []  # (group index, w) of each of our connections
    for k, (hops, count) in enumerate(mine):
        for c, w in connections_of(f, hops, cap, count):
            conns.append(c)
            owner.append((k, w))
    ours = len(conns)
    for fl in f.flows:
        conns.append(Connection(fl.rate_Gbps * GBIT, route(f, fl.src, fl.dst)))
    for job in f.colocated:
        for hops, count in Counter(ring_hops(r) for r in job.rings).items():
            conns += [c for c, _ in connections_of(f, hops, job.rate_Gbps * GBIT, count)]
    caps = capacities(cluster, node_cap)
    base_rtt = 2 * cluster.inter_node.latency_s
    queue = (f.queue_ms or 0.0) / 1e3
    queued: set[Link] = set()
    for _ in range(8):  # the queued set of one solve weights the next; it settles in two or three
        rtt = [base_rtt + queue * len(queued.intersection(c.links)) for c in conns]
        weighted = [
            Connection(c.cap, c.links, c.count, (base_rtt / t) ** 2 if t > 0 else 1.0) for c, t in zip(conns, rtt)
        ]
        rates, price = alpha_fair(weighted, caps.of)
        now = queued_links(conns, rates, ours, caps.of) if queue else set()
        if now == queued:
            break
        queued = now
    speed = [math.inf] * len(mine)
    slowest_conn = [0] * len(mine)
    for i in range(ours):
        k, w = owner[i]
        if rates[i] / w < speed[k]:
            speed[k], slowest_conn[k] = rates[i] / w, i
    k = min(range(len(mine)), key=lambda j: speed[j])
    queue_s = max(
        (queue * len(queued.intersection(conns[i].links)) for i in range(ours) if owner[i][0] == k), default=0.0
    )
    if speed[k] >= cap * (1 - 1e-9):
        return FabricShare(1.0, "", queue_s)
    conn = conns[slowest_conn[k]]
    link = max(conn.links, key=lambda lk: price.get(lk, 0.0))
    return FabricShare(speed[k] / cap, describe(link) if price.get(link, 0.0) > 0 else "", queue_s)


# ----------------------------------------------------------------------------- groups -> coflows
def ring_hops(nodes: Sequence[int]) -> tuple[Hop, ...]:
    """A ring through the members in rank order leaves each node once: consecutive distinct nodes, wrapping."""
    seq = [n for i, n in enumerate(nodes) if i == 0 or n != nodes[i - 1]]
    if len(seq) > 1 and seq[0] == seq[-1]:
        seq.pop()
    if len(seq) < 2:
        return ()
    return tuple((seq[i], seq[(i + 1) % len(seq)], 1.0) for i in range(len(seq)))


def all_to_all_hops(nodes: Sequence[int]) -> tuple[Hop, ...]:
    """Pairwise exchange: a node's inter-node traffic is split evenly over the other N − 1 nodes."""
    seq = list(dict.fromkeys(nodes))
    if len(seq) < 2:
        return ()
    w = 1.0 / (len(seq) - 1)
    return tuple((a, b, w) for a in seq for b in seq if a != b)


def pair_hops(nodes: Sequence[int]) -> tuple[Hop, ...]:
    """Pipeline neighbours: one send at a time, as the estimate prices a PP send (activations forward; the
    gradients going back use the other direction of the same links)."""
    a, b = nodes[0], nodes[-1]
    return () if a == b else ((a, b, 1.0),)


PATTERNS = {"ring": ring_hops, "all_to_all": all_to_all_hops, "pairs": pair_hops}


def coflows_of(fabric: Fabric, groups: Iterable[Sequence[int]], pattern: str, cap: float) -> list[Coflow]:
    """Identical groups (the same hops) become one Coflow with a count: a kind of 16K ranks is a handful of them."""
    hops_of = PATTERNS[pattern]
    counts = Counter(hops_of(g) for g in groups)
    out = []
    for hops, count in counts.items():
        if not hops:
            continue
        usage: dict[Link, float] = {}
        for a, b, w in hops:
            for link in path(fabric, a, b):
                usage[link] = usage.get(link, 0.0) + w
        # its connections share links as single flows do: the coflow's rate over one connection's share
        out.append(Coflow(cap, tuple(usage.items()), count, 1.0 / max(w for _, _, w in hops)))
    return out


def background_coflows(fabric: Fabric) -> list[Coflow]:
    """Other traffic: each flow, and each co-located job's gradient rings (always on: an upper bound)."""
    out = [Coflow(f.rate_Gbps * GBIT, tuple((link, 1.0) for link in path(fabric, f.src, f.dst))) for f in fabric.flows]
    for job in fabric.colocated:
        out += coflows_of(fabric, job.rings, "ring", job.rate_Gbps * GBIT)
    return out


def describe(link: Link | None) -> str:
    if link is None:
        return ""
    level, i, direction = link
    if level == "node":
        return f"node {i} NIC {'out' if direction == 'up' else 'in'}"
    return f"{level} {i} {'uplink' if direction == 'up' else 'downlink'}"


def fabric_share(
    cluster: Cluster, groups: Sequence[Sequence[int]], pattern: str, cap: float, node_cap: float
) -> FabricShare:
    """The slowest group's max-min rate over its own NIC rate ``cap`` (bytes/s its members on a node push).

    ``groups``: every concurrent group of the kind, as the fabric nodes of its members in rank order;
    ``node_cap``: what one node's NICs carry per direction (its GPUs' shares together)."""
    f = cluster.fabric
    assert f is not None
    if f.sharing == "tcp":
        return tcp_share(cluster, groups, pattern, cap, node_cap)
    mine = coflows_of(f, groups, pattern, cap)
    if not mine:
        return FabricShare(1.0, "")
    caps = capacities(cluster, node_cap)
    rates = max_min(mine + background_coflows(f), caps.of)
    r, link = min(rates[: len(mine)], key=lambda x: x[0])
    if r >= cap * (1 - 1e-9):
        return FabricShare(1.0, "")
    return FabricShare(r / cap, describe(link))
