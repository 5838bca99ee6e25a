"""A flow-level network for the event simulator: transfers that share links progress at max-min fair rates.

Each transfer is a task whose ``duration_s`` is its time alone on the wire (its own rate is 1: it moves one second
of its work per second); a link has a capacity in the same units (1: one transfer at its own rate fills it). While
several transfers cross a link, their rates are the max-min fair shares (progressive filling,
commtax.costs.fabric.max_min), recomputed whenever a transfer starts or ends; a transfer's finish time is
``now + remaining work / rate``. Two transfers of 1 s on one link of capacity 1 both end at 2 s, where one
transfer per link (a channel) would end them at 1 s and 2 s.

With ``sharing="tcp"`` (a job whose ``fabric.sharing`` is ``tcp``, docs/fabric.md) the rates are the estimate's
TCP-fair shares instead (commtax.costs.fabric.alpha_fair: α = 2, weighted by 1 / RTT², Mo & Walrand 2000 §IV): a
transfer's RTT is ``rtt_s`` plus ``queue_s`` of each queued link it crosses, and ``weight[tid]`` (1 / RTT² of the
path beyond these links, set by ``Sim.task(weight=)``) scales its weight further. Transfers that cross the same links
with the same RTT get the same shares as under max-min (one link: min(1, C/k) either way), so the one-link fast
paths hold; a transfer over two full links gets less than one over one (the parking lot: √2 − 1 against 2 − √2).
A link's ``queue_s`` (a standing queue, ``fabric.queue_ms``) is also waited out once by every transfer crossing
it, after its bytes: a fixed delay that does not scale with its rate.
"""

from __future__ import annotations

from typing import Literal

from commtax.costs.fabric import TCP_ALPHA, Coflow, Connection, alpha_fair, max_min


class FlowNetwork:
    """Links and the transfers on them; ``start``/``finish`` return the transfers whose rate changed.

    A transfer on one link (a GPU's NIC: the simulator's case) shares it equally, min(1, C/k) for k transfers,
    and only that link's transfers are touched; transfers on several links are solved together by progressive
    filling (or α-fair rates under ``sharing="tcp"``). ``remaining`` is brought up to date per transfer, when its
    rate changes; ``delay`` is the standing-queue wait it has left after its work."""

    def __init__(self, sharing: Literal["max-min", "tcp"] = "max-min", rtt_s: float = 0.0) -> None:
        if sharing not in ("max-min", "tcp"):
            raise ValueError(f"sharing must be 'max-min' or 'tcp', got {sharing!r}")
        if not rtt_s >= 0:
            raise ValueError(f"rtt_s must be >= 0, got {rtt_s}")
        self.sharing = sharing
        self.tcp = sharing == "tcp"  # checked on the hot paths: max-min pays nothing for what follows
        self.rtt_s = rtt_s  # a connection's round trip without standing queues (2 × the level's latency)
        self.queue: list[float] = []  # link -> its standing queue, s (0: none)
        self.delay: dict[int, float] = {}  # task id -> standing-queue wait left after its work (0 if none)
        self.weight: dict[int, float] = {}  # task id -> its utility weight under tcp (1 / RTT², relative), if not 1
        self.capacity: list[float] = []
        self.names: list[str] = []
        self.on: list[set[int]] = []  # link -> transfers on it
        self.remaining: dict[int, float] = {}  # task id -> seconds of its own-rate work left at ``since[tid]``
        self.since: dict[int, float] = {}
        self.links: dict[int, tuple[int, ...]] = {}
        self.rate: dict[int, float] = {}
        self.multi = 0  # transfers whose share needs the solver: on more than one link, or weighted

    def link(self, name: str, capacity: float = 1.0, queue_s: float = 0.0) -> int:
        if not capacity > 0:
            raise ValueError(f"link {name!r}: capacity must be > 0, got {capacity}")
        if not queue_s >= 0:
            raise ValueError(f"link {name!r}: queue_s must be >= 0, got {queue_s}")
        if queue_s and self.sharing != "tcp":
            raise ValueError(f"link {name!r}: a standing queue is what TCP keeps on a link it fills; use sharing='tcp'")
        self.names.append(name)
        self.capacity.append(capacity)
        self.queue.append(queue_s)
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
                left = self.remaining[t] - old * (now - self.since[t])
                if left < 0 and self.delay.get(t):  # its work ended before now: the queue wait went on since
                    self.delay[t] = max(0.0, self.delay[t] + left / old)
                self.remaining[t] = max(0.0, left)
            self.since[t], self.rate[t] = now, r
            out[t] = now + self.remaining[t] / r + (self.delay.get(t, 0.0) if self.delay else 0.0)
        return out

    def weighted(self, tid: int) -> bool:
        """Whether ``tid``'s share differs from an equal one on its link (a TCP weight other than 1)."""
        return self.tcp and self.weight.get(tid, 1.0) != 1.0

    def _wait(self, tid: int, links: tuple[int, ...]) -> float:
        """The standing queues ``tid`` waits out crossing ``links`` (recorded for ``_set``)."""
        q = sum(self.queue[lk] for lk in links) if self.tcp else 0.0
        if q:
            self.delay[tid] = q
        return q

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
        if self.sharing == "tcp":
            return self._set(dict(zip(ids, self._tcp(ids), strict=True)), now)
        flows = [Coflow(1.0, tuple((("node", lk, "up"), 1.0) for lk in self.links[t])) for t in ids]
        solved = max_min(flows, lambda link: self.capacity[link[1]])
        return self._set({t: r for t, (r, _) in zip(ids, solved, strict=True)}, now)

    def _tcp(self, ids: list[int]) -> list[float]:
        """The α-fair rates of ``ids`` (costs/fabric.py: alpha_fair), each weighted by 1 / RTT² relative to a
        connection that crosses no queue: RTT = ``rtt_s`` + the standing queues on its links."""
        conns = []
        for t in ids:
            links = self.links[t]
            q = sum(self.queue[lk] for lk in links)
            w = (self.rtt_s / (self.rtt_s + q)) ** 2 if q and self.rtt_s > 0 else 1.0
            w *= self.weight.get(t, 1.0)
            conns.append(Connection(1.0, tuple(("node", lk, "up") for lk in links), weight=w))
        rates, _ = alpha_fair(conns, lambda link: self.capacity[link[1]], TCP_ALPHA)
        return rates

    def _others(self, lk: int, k_before: int, k_after: int, now: float) -> dict[int, float]:
        """One link's transfers when their count goes from k_before to k_after (the one-link case)."""
        cap = self.capacity[lk]
        if min(1.0, cap / max(1, k_before)) == min(1.0, cap / max(1, k_after)):
            return {}  # nobody's share changed (the link still carries them all at their own rate)
        return self._set(dict.fromkeys(self.on[lk], min(1.0, cap / k_after)), now) if k_after else {}

    def start(self, tid: int, work_s: float, links: tuple[int, ...], now: float) -> dict[int, float]:
        """Add a transfer; returns {task id: new finish time} of every transfer whose rate changed."""
        self.links[tid] = links
        general = len(links) > 1 or (self.tcp and self.weighted(tid))  # its share needs the solver, not min(1, C/k)
        if not general and not self.multi:
            lk = links[0]
            k = len(self.on[lk])
            out = self._others(lk, k, k + 1, now)
            self.on[lk].add(tid)
            r = min(1.0, self.capacity[lk] / (k + 1))
            self.remaining[tid], self.since[tid], self.rate[tid] = work_s, now, r
            out[tid] = now + work_s / r + (self._wait(tid, links) if self.tcp else 0.0)
            return out
        self.remaining[tid], self.since[tid] = work_s, now
        self._wait(tid, links)
        self.multi += general
        for lk in links:
            self.on[lk].add(tid)
        return self._share(links, now)

    def start_two(self, a: int, a_work_s: float, b: int, b_work_s: float, lk: int, now: float) -> dict[int, float]:
        """``start(a)`` then ``start(b)`` on the one link ``lk`` at the same instant (a transfer that ran alone outside
        the network, and the one that comes to share with it), each rate set once: the same rates and finish times."""
        assert not self.multi and not self.weighted(a) and not self.weighted(b)
        k = len(self.on[lk])
        out = self._others(lk, k, k + 2, now)
        r = min(1.0, self.capacity[lk] / (k + 2))
        for t, w in ((a, a_work_s), (b, b_work_s)):
            self.links[t] = (lk,)
            self.on[lk].add(t)
            self.remaining[t], self.since[t], self.rate[t] = w, now, r
            out[t] = now + w / r + (self._wait(t, (lk,)) if self.tcp else 0.0)
        return out

    def renew(self, tid: int, work_s: float, now: float) -> dict[int, float]:
        """Transfer ``tid`` ends and another of ``work_s`` takes its place on the same one link at once (a train's
        next transfer, ``events.Sim.train``): as many transfers share the link, so nobody's rate changes."""
        assert not self.multi and len(self.links[tid]) == 1
        self.remaining[tid], self.since[tid] = work_s, now
        return {tid: now + work_s / self.rate[tid] + (self._wait(tid, self.links[tid]) if self.tcp else 0.0)}

    def finish(self, tid: int, now: float) -> dict[int, float]:
        links = self.links.pop(tid)
        del self.remaining[tid], self.since[tid], self.rate[tid]
        if self.delay:
            self.delay.pop(tid, None)
        general = len(links) > 1 or (self.tcp and self.weighted(tid))
        self.multi -= general
        for lk in links:
            self.on[lk].discard(tid)
        if not general and not self.multi:
            k = len(self.on[links[0]])
            return self._others(links[0], k + 1, k, now)
        return self._share(links, now)
