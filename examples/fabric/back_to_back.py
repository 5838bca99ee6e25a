"""gloo's rendezvous turns when calls run back to back, as `bench collective` and the `cluster up` probe time them.

costs/rendezvous.py prices one call per entry order. Back to back, a rank starts its next call as soon as its own
part is done — its receives arrived and its sends written into the socket (gloo sizes SO_SNDBUF to the message,
so a send completes once queued) — so the early rank of a pair in turns starts the next call while the late one
still receives, and successive calls' turns interleave. This script steps that: each call's pairs in turns or
both ways by who entered later (gloo's rule), the same max-min fluid, each rank's next entry its own finish plus a
small jitter (1% of the wire time: which rank is first must be decided by something), the period each rank's
median, the slowest rank's (as bench.time_op), over 16 seeds.

Usage: python back_to_back.py   -> the probe's κ with 3 partner pairs on one link, and the 4 × 1 spine's time."""

from __future__ import annotations

import random
import statistics

from commtax.costs.rendezvous import max_min_rates, turns


def path(a: int, b: int, leaf: list[int]) -> tuple:
    links = [("out", a), ("in", b)]
    if leaf[a] != leaf[b]:
        links.append(("spine", leaf[a]))
    return tuple(links)


def one_call(leaf: list[int], entry: list[float], chunk: float, pairs, capacity) -> list[float]:
    """Each rank's finish time for one call entered at ``entry`` (a sender is done once its data are queued)."""
    n = len(leaf)
    flows = []  # [src, dst, links, bytes left, start or None, index of the flow it waits for]
    for a, b in pairs:
        late, early = (a, b) if entry[a] > entry[b] else (b, a)
        t = max(entry[a], entry[b])
        serial = turns(late, early, n)
        flows.append([late, early, path(late, early, leaf), chunk, t, None])
        flows.append([early, late, path(early, late, leaf), chunk, None if serial else t, len(flows) - 1])
    done: dict[int, float] = {}
    t = min(entry)
    while len(done) < len(flows):
        for f in flows:
            if f[4] is None and f[5] in done:
                f[4] = done[f[5]]
        live = [i for i, f in enumerate(flows) if i not in done and f[4] is not None and f[4] <= t + 1e-12]
        later = [f[4] for i, f in enumerate(flows) if i not in done and f[4] is not None and f[4] > t + 1e-12]
        nxt = min(later, default=float("inf"))
        if not live:
            t = nxt
            continue
        rates = max_min_rates([flows[i][2] for i in live], [float("inf")] * len(live), capacity)
        dt = min(min(flows[i][3] / r for i, r in zip(live, rates, strict=True)), nxt - t)
        t += dt
        for i, r in zip(live, rates, strict=True):
            flows[i][3] -= r * dt
            if flows[i][3] <= chunk * 1e-9:
                done[i] = t
    end = list(entry)
    for i, f in enumerate(flows):
        end[f[1]] = max(end[f[1]], done[i])  # a receiver: when the bytes have arrived
        end[f[0]] = max(end[f[0]], f[4])  # a sender: when its data were queued
    return end


def period(leaf, chunk, pairs, capacity, seed: int, calls: int = 30, jitter: float = 0.01) -> float:
    rng = random.Random(seed)
    entry = [rng.random() * 1e-3 for _ in leaf]
    per: list[list[float]] = [[] for _ in leaf]
    prev = None
    for _ in range(calls):
        end = one_call(leaf, entry, chunk, pairs, capacity)
        for r in range(len(leaf)):
            per[r].append(end[r] - (entry[r] if prev is None else prev[r]))
        prev = end
        entry = [e + rng.random() * jitter for e in end]
    return max(statistics.median(p[2:]) for p in per)


def main() -> None:
    def cap(link) -> float:
        return 1.0  # every link 1 byte/s

    probe = [period([0, 0, 0, 1, 1, 1], 1 / 3, [(0, 3), (1, 4), (2, 5)], cap, s) - 1 for s in range(16)]
    print(
        f"probe, 3 partner pairs, back to back: κ {min(probe):.2f}-{max(probe):.2f}, mean {statistics.mean(probe):.3f}"
    )
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    spine = [period([0, 0, 1, 1], 0.25, pairs, cap, s) for s in range(16)]
    print(
        f"4 x 1 all_to_all, back to back: {min(spine):.2f}-{max(spine):.2f} of S / B, mean {statistics.mean(spine):.3f}"
    )


if __name__ == "__main__":
    main()
