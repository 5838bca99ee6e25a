"""gloo's all_to_all calls back to back, stepped event by event (docs/fabric.md "Back to back").

`bench collective` times calls back to back: a rank starts its next call the moment its own sends have left and its
receives have arrived, so one call's tail runs beside the next call's head on the links, and gloo's rule (costs/
rendezvous.py: a pair's two directions in turns when the rank that enters later sends before it receives) decides
each pair of each call by who entered *that* call later. Here every ordered pair of ranks is one byte stream (the
pair's socket one way: gloo's transmit queue, data and ready notices in the order written); a send leaves when the
peer's ready notice has come out of the stream that carries it, a notice comes out once the data queued before it
have, the data move as costs/rendezvous.py's max-min fluid (``two_way``: its two-way slowdown). Ranks the
symmetric fluid finishes at the same instant enter one after another, in a seeded draw (``senders_first``: ranks
whose call ended with a send first). The period is timed as bench.time_op does (each rank's median, the slowest).

Usage: python back_to_back_events.py  -> per background flow on node 0 -> node 2 (none, 1/4 and all of a link):
the single call's mean over entry orders, and the back-to-back periods over 24 first-call orders x 6 draws, with
ties drawn and with senders first (in S / B of the 4 x 1 cluster's spine)."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence

from commtax.costs.rendezvous import Flow, fluid_rates, rendezvous_time

WARMUP, ITERS = 1, 5  # as examples/fabric/measure.sh runs `bench collective` (--warmup 1 --iters 5, per round)


class Calls:
    """gloo's all_to_all calls back to back, event by event: per ordered rank pair one byte stream of data and
    ready notices in the order written (the pair's socket one way), the data moving as a max-min fluid."""

    def __init__(self, nodes, chunk, route, capacity, background=(), two_way=1.0, seed=0, senders_first=False):
        self.nodes, self.chunk, self.route, self.capacity, self.two_way = nodes, chunk, route, capacity, two_way
        self.background = [f for f in background if f.phases]
        n = self.n = len(nodes)
        self.stream = {(a, b): [] for a in range(n) for b in range(n) if a != b}  # items: ("ready" | "data", call)
        self.peer_ready: set = set()  # (sender, receiver, call): the receiver's notice has reached the sender
        self.waiting: set = set()  # (sender, receiver, call): a send posted before that notice came
        self.left: dict = {}  # (sender, receiver): bytes of the data at the stream's head still to move
        self.done = [0] * n  # transfers of the rank's current call finished (2 (n − 1) make the call)
        self.call = [-1] * n
        self.ends: list[list[float]] = [[] for _ in range(n)]
        self.rng = random.Random(seed)
        self.senders_first = senders_first  # ties: ranks whose call ended with a send enter first (else all drawn)

    def post(self, r: int, k: int) -> None:
        """Rank r enters call k: for i = 1 … n − 1, send to r + i, then recv from r − i (gloo/alltoall.cc)."""
        self.call[r], self.done[r] = k, 0
        for i in range(1, self.n):
            to, frm = (r + i) % self.n, (r - i) % self.n
            if (r, to, k) in self.peer_ready:
                self.peer_ready.discard((r, to, k))
                self.stream[r, to].append(("data", k))
            else:
                self.waiting.add((r, to, k))
            self.stream[r, frm].append(("ready", k))  # "r is ready to receive from frm", to frm
        self.settle()

    def settle(self) -> None:
        """Deliver every notice at a stream's head (a send waiting on it leaves), start the data behind them."""
        moved = True
        while moved:
            moved = False
            for (a, b), items in self.stream.items():
                while items and items[0][0] == "ready":
                    _, k = items.pop(0)
                    moved = True
                    if (b, a, k) in self.waiting:  # b's send to a was waiting for a's notice
                        self.waiting.discard((b, a, k))
                        self.stream[b, a].append(("data", k))
                    else:
                        self.peer_ready.add((b, a, k))
                if items and (a, b) not in self.left:
                    size = self.chunk(a, b) if callable(self.chunk) else self.chunk  # a callable: bytes a -> b
                    self.left[a, b] = size if self.nodes[a] != self.nodes[b] else 0.0  # loopback: at once

    def step(self) -> tuple[float, list]:
        """Seconds to the next data end at the current rates, and the streams whose data end then."""
        live = [k for k, v in self.left.items() if v > 0]
        if len(live) < len(self.left):
            return 0.0, [k for k, v in self.left.items() if v <= 0]
        links = [self.route(self.nodes[a], self.nodes[b]) for a, b in live] + [f.phases[0] for f in self.background]
        caps = [math.inf] * len(live) + [f.cap for f in self.background]
        rates = fluid_rates(links, caps, self.capacity, self.two_way)[: len(live)]
        dt = min(self.left[k] / r for k, r in zip(live, rates, strict=True))
        for k, r in zip(live, rates, strict=True):
            self.left[k] -= r * dt
        return dt, [k for k in live if self.left[k] <= 1e-9 * dt * max(rates)]

    def run(self, order: Sequence[int], calls: int) -> list[list[float]]:
        """Each rank's call end times, the first call entered in ``order`` (earliest first)."""
        for r in order:
            self.post(r, 0)
        t = 0.0
        while self.left:
            dt, ended = self.step()
            t += dt
            entering = []
            for a, b in ended:
                del self.left[a, b]
                self.stream[a, b].pop(0)
                for r, recv in ((a, False), (b, True)):  # a sender is done once its data left, a receiver on arrival
                    self.done[r] += 1
                    if self.done[r] == 2 * (self.n - 1):
                        self.ends[r].append(t)
                        if self.call[r] + 1 < calls:
                            entering.append((recv and self.senders_first, self.rng.random(), r))
            self.settle()
            # ties: one after another (each rank's notices reach its peers before the next one posts), in a draw;
            # with senders_first a rank whose call ended with a send goes first (its last bytes still had the queue
            # and the wire ahead of them when it left)
            for _, _, r in sorted(entering):
                self.post(r, self.call[r] + 1)
        return self.ends


def period(nodes, chunk, route, capacity, order, seed=0, background=(), two_way=1.0, senders_first=False) -> float:
    """bench.time_op's time for calls back to back: each rank's median period over ITERS timed calls (after WARMUP),
    the slowest rank's; the first call entered in ``order`` (earliest first)."""
    ends = Calls(nodes, chunk, route, capacity, background, two_way, seed, senders_first).run(order, WARMUP + ITERS)
    periods = [sorted(b - a for a, b in itertools.pairwise(e[WARMUP - 1 :])) for e in ends]
    return max(p[len(p) // 2] for p in periods)


def fabric_leaves(a: int, b: int) -> tuple:
    """The emulated 4 x 1 cluster: nodes 0, 1 under leaf 0, nodes 2, 3 under leaf 1 (costs.fabric's link keys)."""
    links = [("node", a, "up"), ("node", b, "down")]
    if a // 2 != b // 2:
        links += [("leaf", a // 2, "up"), ("leaf", b // 2, "down")]
    return tuple(links)


def node_link(a: int, b: int) -> tuple:
    return (("node", a, "up"), ("node", b, "down"))


def partner_chunk(a: int, b: int) -> float:
    return 1 / 3 if abs(a - b) == 3 else 0.0


def main() -> None:
    def one(link) -> float:
        return 1.0  # every link direction 1 byte/s: times in S / B of the spine

    # `cluster up`'s probe: 3 ranks per node, rank k <-> rank k + 3 only, 1/3 of the link's bytes each way per pair
    rng = random.Random(0)
    probe = [
        period([0, 0, 0, 1, 1, 1], partner_chunk, node_link, one, tuple(rng.sample(range(6), 6)), s) - 1
        for s in range(24)
    ]
    print(
        f"probe (3 partner pairs on one link), back to back: κ {statistics.mean(probe):.3f} "
        f"({min(probe):.3f}-{max(probe):.3f})"
    )
    nodes, orders = [0, 1, 2, 3], list(itertools.permutations(range(4)))
    for cap in (0.0, 0.25, 1.0):
        bg = [Flow((fabric_leaves(0, 2),), cap=cap)] if cap else []
        single = rendezvous_time(nodes, 0.25, fabric_leaves, one, bg)
        line = [f"flow {cap:4.2f}: one call {single.mean_s:.3f} ({single.fastest_s:.3f}-{single.slowest_s:.3f})"]
        for first in (False, True):
            ps = [period(nodes, 0.25, fabric_leaves, one, o, s, bg, 1.0, first) for o in orders for s in range(6)]
            modes = sorted({round(p, 3) for p in ps})
            line.append(
                f"back to back{' (senders first)' if first else ''} {statistics.mean(ps):.3f} "
                f"({min(ps):.3f}-{max(ps):.3f}, {len(modes)} steady states)"
            )
        print("; ".join(line))


if __name__ == "__main__":
    main()
