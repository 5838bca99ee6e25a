"""A flow-level network for the event simulator: transfers that share links progress at max-min fair rates.

Each transfer is a task whose ``duration_s`` is its time alone on the wire (its own rate is 1: it moves one second
of its work per second); a link has a capacity in the same units (1: one transfer at its own rate fills it). While
several transfers cross a link, their rates are the max-min fair shares (progressive filling,
commtax.costs.fabric.max_min), recomputed whenever a transfer starts or ends; a transfer's finish time is
``now + remaining work / rate``. Two transfers of 1 s on one link of capacity 1 both end at 2 s, where one
transfer per link (a channel) would end them at 1 s and 2 s.
"""

from __future__ import annotations

from commtax.costs.fabric import Coflow, max_min


class FlowNetwork:
    """Links and the transfers on them; ``start``/``finish`` return the transfers whose rate changed.

    A transfer on one link (a GPU's NIC: the simulator's case) shares it equally, min(1, C/k) for k transfers,
    and only that link's transfers are touched; transfers on several links are solved together by progressive
    filling. ``remaining`` is brought up to date per transfer, when its rate changes."""

    def __init__(self) -> None:
        self.capacity: list[float] = []
        self.names: list[str] = []
        self.on: list[set[int]] = []  # link -> transfers on it
        self.remaining: dict[int, float] = {}  # task id -> seconds of its own-rate work left at ``since[tid]``
        self.since: dict[int, float] = {}
        self.links: dict[int, tuple[int, ...]] = {}
        self.rate: dict[int, float] = {}
        self.multi = 0  # transfers on more than one link

    def link(self, name: str, capacity: float = 1.0) -> int:
        if not capacity > 0:
            raise ValueError(f"link {name!r}: capacity must be > 0, got {capacity}")
        self.names.append(name)
        self.capacity.append(capacity)
        self.on.append(set())
        return len(self.capacity) - 1

    def _set(self, rates: dict[int, float], now: float) -> dict[int, float]:
        """New rates; returns {task id: finish time} for those that changed."""
        out = {}
        for t, r in rates.items():
            old = self.rate.get(t)
            if old == r:
                continue
            if old is not None:  # work done at the old rate since it was last set
                self.remaining[t] = max(0.0, self.remaining[t] - old * (now - self.since[t]))
            self.since[t], self.rate[t] = now, r
            out[t] = now + self.remaining[t] / r
        return out

    def _share(self, touched: tuple[int, ...], now: float) -> dict[int, float]:
        if not self.multi:  # every transfer on one link: an equal share of it, capped at its own rate
            rates = {}
            for lk in touched:
                k = len(self.on[lk])
                if k:
                    r = min(1.0, self.capacity[lk] / k)
                    rates.update(dict.fromkeys(self.on[lk], r))
            return self._set(rates, now)
        ids = list(self.remaining)
        flows = [Coflow(1.0, tuple((("node", lk, "up"), 1.0) for lk in self.links[t])) for t in ids]
        solved = max_min(flows, lambda link: self.capacity[link[1]])
        return self._set({t: r for t, (r, _) in zip(ids, solved, strict=True)}, now)

    def _others(self, lk: int, k_before: int, k_after: int, now: float) -> dict[int, float]:
        """One link's transfers when their count goes from k_before to k_after (the one-link case)."""
        cap = self.capacity[lk]
        if min(1.0, cap / max(1, k_before)) == min(1.0, cap / max(1, k_after)):
            return {}  # nobody's share changed (the link still carries them all at their own rate)
        return self._set(dict.fromkeys(self.on[lk], min(1.0, cap / k_after)), now) if k_after else {}

    def start(self, tid: int, work_s: float, links: tuple[int, ...], now: float) -> dict[int, float]:
        """Add a transfer; returns {task id: new finish time} of every transfer whose rate changed."""
        self.links[tid] = links
        if len(links) == 1 and not self.multi:
            lk = links[0]
            k = len(self.on[lk])
            out = self._others(lk, k, k + 1, now)
            self.on[lk].add(tid)
            r = min(1.0, self.capacity[lk] / (k + 1))
            self.remaining[tid], self.since[tid], self.rate[tid] = work_s, now, r
            out[tid] = now + work_s / r
            return out
        self.remaining[tid], self.since[tid] = work_s, now
        self.multi += len(links) > 1
        for lk in links:
            self.on[lk].add(tid)
        return self._share(links, now)

    def start_two(self, a: int, a_work_s: float, b: int, b_work_s: float, lk: int, now: float) -> dict[int, float]:
        """``start(a)`` then ``start(b)`` on the one link ``lk`` at the same instant (a transfer that ran alone outside
        the network, and the one that comes to share with it), each rate set once: the same rates and finish times."""
        assert not self.multi
        k = len(self.on[lk])
        out = self._others(lk, k, k + 2, now)
        r = min(1.0, self.capacity[lk] / (k + 2))
        for t, w in ((a, a_work_s), (b, b_work_s)):
            self.links[t] = (lk,)
            self.on[lk].add(t)
            self.remaining[t], self.since[t], self.rate[t] = w, now, r
            out[t] = now + w / r
        return out

    def renew(self, tid: int, work_s: float, now: float) -> dict[int, float]:
        """Transfer ``tid`` ends and another of ``work_s`` takes its place on the same one link at once (a train's
        next transfer, ``events.Sim.train``): as many transfers share the link, so nobody's rate changes."""
        assert not self.multi and len(self.links[tid]) == 1
        self.remaining[tid], self.since[tid] = work_s, now
        return {tid: now + work_s / self.rate[tid]}

    def finish(self, tid: int, now: float) -> dict[int, float]:
        links = self.links.pop(tid)
        del self.remaining[tid], self.since[tid], self.rate[tid]
        self.multi -= len(links) > 1
        for lk in links:
            self.on[lk].discard(tid)
        if len(links) == 1 and not self.multi:
            k = len(self.on[links[0]])
            return self._others(links[0], k + 1, k, now)
        return self._share(links, now)
