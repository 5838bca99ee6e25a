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
    """Links and the transfers on them; ``start``/``finish`` return the transfers whose rate changed."""

    def __init__(self) -> None:
        self.capacity: list[float] = []
        self.names: list[str] = []
        self.remaining: dict[int, float] = {}  # task id -> seconds of its own-rate work left
        self.links: dict[int, tuple[int, ...]] = {}
        self.rate: dict[int, float] = {}
        self.since = 0.0  # when ``remaining`` was last brought up to date

    def link(self, name: str, capacity: float = 1.0) -> int:
        if not capacity > 0:
            raise ValueError(f"link {name!r}: capacity must be > 0, got {capacity}")
        self.names.append(name)
        self.capacity.append(capacity)
        return len(self.capacity) - 1

    def _advance(self, now: float) -> None:
        dt = now - self.since
        if dt > 0:
            for tid, r in self.rate.items():
                self.remaining[tid] = max(0.0, self.remaining[tid] - r * dt)
        self.since = now

    def _share(self) -> dict[int, float]:
        ids = list(self.remaining)
        flows = [Coflow(1.0, tuple((("node", lk, "up"), 1.0) for lk in self.links[t])) for t in ids]
        rates = max_min(flows, lambda link: self.capacity[link[1]])
        new = {t: r for t, (r, _) in zip(ids, rates, strict=True)}
        changed = {t: r for t, r in new.items() if self.rate.get(t) != r}
        self.rate = new
        return changed

    def start(self, tid: int, work_s: float, links: tuple[int, ...], now: float) -> dict[int, float]:
        """Add a transfer; returns {task id: new finish time} of every transfer whose rate changed."""
        self._advance(now)
        self.remaining[tid], self.links[tid] = work_s, links
        return self._finishes(self._share(), now)

    def finish(self, tid: int, now: float) -> dict[int, float]:
        self._advance(now)
        del self.remaining[tid], self.links[tid], self.rate[tid]
        return self._finishes(self._share(), now)

    def _finishes(self, changed: dict[int, float], now: float) -> dict[int, float]:
        return {t: now + self.remaining[t] / r for t, r in changed.items()}
