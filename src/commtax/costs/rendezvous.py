"""gloo's all_to_all on a fabric: a rendezvous per pair, the two directions of a connection in turns or at once.

gloo's TCP transport (gloo/transport/tcp/pair.cc) moves an unbound buffer only after the receiver has said it is
ready: ``recv`` writes a NOTIFY_RECV_READY to the peer, ``send`` writes its data at once if the peer's notice has
arrived and otherwise waits for it. Both go through the pair's one socket and its transmit queue
(``sendAsyncMode``: an op queues behind any earlier op still transmitting), so a notice written after a data
message reaches the peer only behind those bytes. gloo's all_to_all (gloo/alltoall.cc) posts, for
i = 1 … n − 1, ``send`` to rank r + i, then ``recv`` from rank r − i (mod n), without waiting in between.

So for a pair (a, b), whichever rank enters the call later (by more than a notice's one-way delay: ranks leave a
barrier or the previous call milliseconds apart on a loaded host, a notice takes tens of µs) finds the other's
notice waiting. If that late rank sends to its peer before it posts the receive from it — its send at step
d = (peer − late) mod n, its receive at step n − d, the send first within a step, so d ≤ n / 2 — its data goes
first and its own notice waits behind them: the early rank sends only after the late one's data has all arrived,
and the pair's connection carries one direction, then the other. Otherwise (d > n / 2) the late rank's notice
leaves first and both directions go at once. Measured on the emulated 4 × 1 cluster (docs/fabric.md "What the
all_to_all does on the wire"): `ss -ti` shows node 0 ↔ node 2's connection receiving 2 MiB while sending
nothing, then the reverse; the spine's tbf queue stands empty at the median sample under gloo's all_to_all and
at 80–100 KB when each direction has a connection of its own.

The time of one call is then a fluid: every connection's phases in order, each phase's bytes moving at the
max-min fair rate of its links (per connection, as TCP shares a link; Bertsekas & Gallager, *Data Networks*
§6.5.2), background flows always on at up to their own rate, recomputed whenever a phase ends. Which rank is late
is a draw the model cannot know, so the price is the mean over entry orders, each equally likely (all n! of them
up to ``EXACT_RANKS`` ranks, a fixed sample beyond), and the fastest and slowest orders bound what one run shows
(calls back to back settle on one of those order times: below).
Hand-worked cases in tests/test_rendezvous.py: one pair takes twice the wire time (κ = 1 of the probe); two nodes
with three partner pairs 1.625× (κ = 0.625, against 0.53–0.67 measured); the 4 × 1 cluster's spine 47/32.

**Back to back** (`bench collective`'s calls one after the other; examples/fabric/back_to_back_events.py steps
them event by event): the calls settle into a steady state whose period is one of the single call's order times
(1.25, 1.5, 1.625 or 1.75 of S / B on the 4 × 1 spine), which one set by how ties between ranks break: the price
stays the mean over entry orders, and `bench collective --rounds R` measures R fresh draws (docs/fabric.md).

**Two-way traffic** (``two_way``): a TCP connection's ACKs ride the reverse direction of its links behind whatever
data queue there (Zhang, Shenker & Clark 1991, "Observations on the dynamics of a congestion control algorithm: the
effects of two-way traffic"), so on links with a standing queue a direction moves less than its rate while the
reverse direction carries data as well. Measured, not derived (not losses: the same share retransmitted one way and
both ways; docs/fabric.md "Two-way traffic"): on the 4 × 1 cluster (reno, 5 ms tbf buffers) the spine's chunks each
way on one-way connections took 1.13× the wire time where one way alone took 1.01–1.05× (``TWO_WAY_SLOWDOWN``);
topology.py applies it on fabrics with ``sharing: tcp`` and a ``queue_ms``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Link = tuple  # the fabric's link key (costs.fabric.Link); any hashable works here
EXACT_RANKS = 5  # up to 5 ranks: all n! entry orders (120); beyond, SAMPLED_ORDERS of them
SAMPLED_ORDERS = 64
MAX_RANKS = 8  # larger groups keep κ (costs.collectives.link_time_s): 8 ranks take 0.14 s of CPU, 16 take 2 s
# One direction's time over its wire time while the reverse direction carries data too, on reno connections
# through 5 ms tbf queues: examples/fabric/results/wire_4x1_reno5ms.json (spine_split 379 ms / wire 336 ms, 8 MiB,
# 2026-12-01 19:36 UTC, load 2.5-2.9) and results/two_way_4x1_reno5ms.json (1.13 at 21:01 UTC, load 1.6-2.1; 1.29
# at 21:55 UTC, load 4.2-5.6, left out: the host's share of it); one way alone 1.01-1.05.
TWO_WAY_SLOWDOWN = 1.13


@dataclass(frozen=True)
class Flow:
    """A connection's phases in order (each the links it crosses, ``bytes`` each), or an always-on background
    flow (``bytes`` = inf) of at most ``cap`` bytes/s."""

    phases: tuple[tuple[Link, ...], ...]
    bytes: float = math.inf
    cap: float = math.inf


@dataclass(frozen=True)
class RendezvousTime:
    mean_s: float  # over entry orders: the price
    fastest_s: float  # the luckiest order
    slowest_s: float  # the unluckiest
    orders: int  # how many orders were averaged
    two_way: float = 1.0  # a link direction's slowdown while its reverse carries data too (TWO_WAY_SLOWDOWN or 1)


def turns(late: int, early: int, n: int) -> bool:
    """True when the pair's two directions go in turns: the later rank's send to its peer (step d) comes no later
    than its receive from it (step n − d), so its data leaves before its ready notice."""
    d = (early - late) % n
    return d <= n - d


def max_min_rates(links: Sequence[tuple[Link, ...]], caps: Sequence[float], capacity: Callable) -> list[float]:
    """Progressive filling: every flow rises at one pace until a link it crosses is full or it reaches its cap."""
    rate = [0.0] * len(links)
    frozen = [False] * len(links)
    residual: dict = {}
    for ls in links:
        for lk in ls:
            residual.setdefault(lk, capacity(lk))
    while not all(frozen):
        live = [i for i in range(len(links)) if not frozen[i]]
        count: dict = {}
        for i in live:
            for lk in links[i]:
                count[lk] = count.get(lk, 0) + 1
        step = min([residual[lk] / c for lk, c in count.items()] + [caps[i] - rate[i] for i in live])
        for lk, c in count.items():
            residual[lk] -= step * c
        for i in live:
            rate[i] += step
            full = any(residual[lk] <= 1e-9 * capacity(lk) for lk in links[i])
            frozen[i] = full or rate[i] >= caps[i] * (1 - 1e-12)
    return rate


def reverse(link: Link) -> Link | None:
    """The other direction of a fabric link (costs.fabric.Link: level, index, "up" | "down"); None for other keys."""
    if isinstance(link, tuple) and len(link) == 3 and link[2] in ("up", "down"):
        return (link[0], link[1], "down" if link[2] == "up" else "up")
    return None


def fluid_rates(
    links: Sequence[tuple[Link, ...]], caps: Sequence[float], capacity: Callable, two_way: float = 1.0
) -> list[float]:
    """Max-min rates, each link direction at 1 / ``two_way`` of its capacity while its reverse carries data too."""
    if two_way == 1.0:
        return max_min_rates(links, caps, capacity)
    busy = {lk for ls in links for lk in ls}
    return max_min_rates(links, caps, lambda lk: capacity(lk) / (two_way if reverse(lk) in busy else 1.0))


def fluid_time(flows: Sequence[Flow], capacity: Callable, two_way: float = 1.0) -> float:
    """Seconds until every finite flow has moved all its phases (background flows run throughout)."""
    phase = [0] * len(flows)
    left = [f.bytes for f in flows]
    t = 0.0
    while True:
        live = [i for i, f in enumerate(flows) if phase[i] < len(f.phases)]
        finite = [i for i in live if math.isfinite(flows[i].bytes)]
        if not finite:
            return t
        rates = fluid_rates([flows[i].phases[phase[i]] for i in live], [flows[i].cap for i in live], capacity, two_way)
        rate = dict(zip(live, rates, strict=True))
        dt = min(left[i] / rate[i] for i in finite)
        t += dt
        for i in finite:
            left[i] -= rate[i] * dt
            if left[i] <= flows[i].bytes * 1e-9:
                phase[i] += 1
                left[i] = flows[i].bytes


def exchange_flows(
    nodes: Sequence[int], order: Sequence[int], chunk: float, route: Callable[[int, int], tuple[Link, ...]]
) -> list[Flow]:
    """One uniform all_to_all's connections for an entry order (``order``: group ranks, earliest first); ranks on
    one node talk over loopback, off the fabric."""
    n = len(nodes)
    pos = {r: k for k, r in enumerate(order)}
    out = []
    for a, b in itertools.combinations(range(n), 2):
        if nodes[a] == nodes[b]:
            continue
        late, early = (a, b) if pos[a] > pos[b] else (b, a)
        there, back = route(nodes[late], nodes[early]), route(nodes[early], nodes[late])
        if turns(late, early, n):
            out.append(Flow((there, back), chunk))
        else:
            out += [Flow((there,), chunk), Flow((back,), chunk)]
    return out


def entry_orders(n: int) -> list[tuple[int, ...]]:
    if n <= EXACT_RANKS:
        return list(itertools.permutations(range(n)))
    rng = random.Random(n)  # fixed: the same price every time
    return [tuple(rng.sample(range(n), n)) for _ in range(SAMPLED_ORDERS)]


def rendezvous_time(
    nodes: Sequence[int],
    chunk: float,
    route: Callable[[int, int], tuple[Link, ...]],
    capacity: Callable,
    background: Sequence[Flow] = (),
    two_way: float = 1.0,
) -> RendezvousTime:
    """Network time of a uniform gloo all_to_all whose rank j sits on fabric node ``nodes[j]``, ``chunk`` bytes to
    each peer, over links of ``capacity(link)`` bytes/s shared with ``background`` flows: one call (the mean over
    entry orders, and the extremes), each link direction at 1 / ``two_way`` of its rate while its reverse is busy."""
    orders = entry_orders(len(nodes))
    flows = [exchange_flows(nodes, o, chunk, route) + list(background) for o in orders]
    times = [fluid_time(f, capacity, two_way) for f in flows]
    return RendezvousTime(sum(times) / len(times), min(times), max(times), len(times), two_way)
