"""A tiny deterministic discrete-event core: in-order streams, task dependencies, shared channels.

A *task* runs for a fixed ``duration_s`` on one *stream*. A stream runs its tasks one at a
time in the order they were added (as a CUDA stream does). A task starts when it is the head
of its stream, the stream is idle, all its dependencies have finished and, if it names a
*channel* (a shared wire, e.g. one GPU's NIC used by its DP and PP streams), the channel is
free. Waiting tasks get a channel in (ready time, priority, sequence) order. A task may instead
name *links* (``Sim.link``): it starts at once and shares them with the other transfers on them at
max-min fair rates (schedule/sim/network.py), so its end moves whenever a transfer on its links
starts or ends; after the run its ``duration_s`` is the time it took, ``work_s`` its time alone.

Events are finish times kept in a heap of ``(time_s, priority, sequence, task)`` (SimPy's
ordering), so a run is reproducible to the bit. Each task records its *cause*: the task whose
finish let it start (its last dependency, its stream predecessor, or the channel holder), which
makes the critical path a walk over ``cause`` links.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

Tail = tuple[tuple[str, str, float], ...]  # (stream name, kind, seconds) at the end of a task


class SimError(ValueError):
    """A malformed task graph: negative duration, a dangling dependency, or a deadlock."""


@dataclass(slots=True)
class Stream:
    """One in-order queue of work on one device (``device`` is the trace process, ``name`` its thread)."""

    id: int
    device: int
    name: str
    tasks: list[int] = field(default_factory=list)
    head: int = 0  # index in ``tasks`` of the next task to start
    busy: bool = False


class Task:
    """One piece of work on one stream; times are filled in by ``Sim.run``."""

    __slots__ = (
        "id",
        "name",
        "stream",
        "duration_s",
        "deps",
        "kind",
        "priority",
        "channel",
        "meta",
        "tail",
        "succ",
        "waiting",
        "ready_s",
        "start_s",
        "end_s",
        "cause",
        "channel_prev",
        "links",
        "work_s",
    )

    def __init__(
        self,
        id: int,
        name: str,
        stream: int,
        duration_s: float,
        deps: tuple[int, ...],
        kind: str,
        priority: int = 0,
        channel: int | None = None,
        meta: tuple = (),
        tail: Tail = (),
    ):
        self.id, self.name, self.stream, self.duration_s, self.deps = id, name, stream, duration_s, deps
        self.kind = kind  # what the time is: compute | recompute | optimizer | tp | cp | pp | dp
        self.priority, self.channel = priority, channel
        self.meta = meta  # free-form (stage, micro-batch, chunk, phase[, bytes]) for traces
        self.tail = tail  # the last seconds of the task, spent on other streams of the device (see Sim.task)
        self.links: tuple[int, ...] = ()  # flow-network links it crosses (Sim.link), shared max-min fairly
        self.work_s = duration_s  # its time alone on its links (duration_s becomes the time it took)
        self.succ: list[int] = []
        self.waiting = 0  # unfinished dependencies
        # set by Sim.run: ready_s (when it could first start; it may then wait for its channel),
        # start_s, end_s, cause (the task whose finish let it start) and channel_prev (the task that
        # held its channel before it)
        self.ready_s = self.start_s = self.end_s = -1.0
        self.cause: int | None = None
        self.channel_prev: int | None = None

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.name!r}, stream={self.stream}, {self.start_s}..{self.end_s})"


class Sim:
    """Build a task graph with ``stream`` and ``task``, then ``run`` it once."""

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.tasks: list[Task] = []
        self.channel_names: list[str] = []
        self.events = 0
        self.start_order: list[int] = []  # task ids as they started: a topological order of every constraint
        self.network = None  # a FlowNetwork once a link is made
        self._ran = False

    # ------------------------------------------------------------------ construction
    def stream(self, device: int, name: str) -> int:
        s = Stream(len(self.streams), device, name)
        self.streams.append(s)
        return s.id

    def channel(self, name: str) -> int:
        self.channel_names.append(name)
        return len(self.channel_names) - 1

    def link(self, name: str, capacity: float = 1.0) -> int:
        """A link of the flow network: transfers on it share ``capacity`` (1 = one transfer at its own rate)."""
        if self.network is None:
            from commtax.schedule.sim.network import FlowNetwork

            self.network = FlowNetwork()
        return self.network.link(name, capacity)

    def task(
        self,
        name: str,
        stream: int,
        duration_s: float,
        deps: Iterable[int | None] = (),
        kind: str = "compute",
        priority: int = 0,
        channel: int | None = None,
        meta: tuple = (),
        tail: Tail = (),
        links: tuple[int, ...] = (),
    ) -> int:
        """Add a task after every task already on ``stream``; returns its id. ``None`` deps are skipped.

        ``tail`` — ((stream name, kind, seconds), ...) — says that the last seconds of
        ``duration_s`` are work on other streams of the same device while this stream waits for
        it (a collective on the critical path): one task for the engine, separate spans on the
        timeline and in the breakdown.
        """
        if not duration_s >= 0.0:  # also rejects NaN
            raise SimError(f"task {name!r}: duration must be ≥ 0 s, got {duration_s}")
        if tail and not (all(x[2] >= 0 for x in tail) and sum(x[2] for x in tail) <= duration_s * (1 + 1e-12)):
            raise SimError(f"task {name!r}: its tail {tail} must be ≥ 0 s and fit in its {duration_s} s")
        tasks = self.tasks
        tid = len(tasks)
        if type(deps) is not tuple or None in deps:
            deps = tuple(x for x in deps if x is not None)
        if deps and (min(deps) < 0 or max(deps) >= tid):
            bad = next(x for x in deps if not 0 <= x < tid)
            raise SimError(f"task {name!r}: dependency {bad} does not exist (tasks 0..{tid - 1})")
        if not 0 <= stream < len(self.streams):
            raise SimError(f"task {name!r}: stream {stream} does not exist")
        if channel is not None and not 0 <= channel < len(self.channel_names):
            raise SimError(f"task {name!r}: channel {channel} does not exist")
        t = Task(tid, name, stream, duration_s, deps, kind, priority, channel, meta, tail)
        if links:
            if channel is not None:
                raise SimError(f"task {name!r}: a task holds a channel or shares links, not both")
            if self.network is None or not all(0 <= x < len(self.network.capacity) for x in links):
                raise SimError(f"task {name!r}: link {links} does not exist")
            t.links = tuple(links)
        unique = set(deps) if len(deps) > 2 or (len(deps) == 2 and deps[0] == deps[1]) else deps
        t.waiting = len(unique)
        for x in unique:
            tasks[x].succ.append(tid)
        tasks.append(t)
        self.streams[stream].tasks.append(tid)
        return tid

    # ------------------------------------------------------------------ run
    def run(self) -> float:
        """Run to completion; returns the makespan in seconds. Raises SimError on a deadlock."""
        if self._ran:
            raise SimError("a Sim runs once; build a new one")
        self._ran = True
        tasks, streams = self.tasks, self.streams
        heap: list[tuple[float, int, int, int]] = []
        chan_busy = [False] * len(self.channel_names)
        chan_wait: list[list[tuple[float, int, int]]] = [[] for _ in self.channel_names]
        chan_last: list[int | None] = [None] * len(self.channel_names)
        started = self.start_order
        seq = 0
        net = self.network
        flow_end: dict[int, float] = {}  # a transfer's current finish time: heap entries at other times are stale
        # a transfer alone on its one link runs at its own rate, as a plain task (the common case, kept cheap);
        # it joins the network when another transfer comes onto its link
        on_link = [0] * (len(net.capacity) if net is not None else 0)
        solo: dict[int, int] = {}  # link -> the transfer alone on it, outside the network

        def reschedule(ends: dict[int, float]) -> None:
            nonlocal seq
            for tid, end in ends.items():
                flow_end[tid] = end
                seq += 1
                heapq.heappush(heap, (end, tasks[tid].priority, seq, tid))

        def start(t: Task, now: float, cause: int | None) -> None:
            nonlocal seq
            t.start_s, t.cause = now, cause
            if t.channel is not None:
                t.channel_prev, chan_last[t.channel] = chan_last[t.channel], t.id
            started.append(t.id)
            if t.links and t.duration_s > 0:
                links = t.links
                if len(links) == 1 and not on_link[links[0]] and net.capacity[links[0]] >= 1:
                    on_link[links[0]] = 1
                    solo[links[0]] = t.id
                else:
                    for lk in links:
                        on_link[lk] += 1
                        other = solo.pop(lk, None)
                        if other is not None:  # it shares from now on: into the network with the work it has left
                            o = tasks[other]
                            reschedule(net.start(other, o.start_s + o.duration_s - now, o.links, now))
                    reschedule(net.start(t.id, t.duration_s, links, now))
                    return
            seq += 1
            heapq.heappush(heap, (now + t.duration_s, t.priority, seq, t.id))

        def try_stream(s: Stream, now: float, cause: int | None) -> None:
            if s.busy or s.head >= len(s.tasks):
                return
            t = tasks[s.tasks[s.head]]
            if t.waiting:
                return
            s.busy = True
            t.ready_s = now
            if t.channel is not None:
                if chan_busy[t.channel]:
                    heapq.heappush(chan_wait[t.channel], (now, t.priority, t.id))
                    return
                chan_busy[t.channel] = True
            start(t, now, cause)

        for s in streams:
            try_stream(s, 0.0, None)
        now = 0.0
        events = 0
        while heap:
            now, _, _, tid = heapq.heappop(heap)
            t = tasks[tid]
            if t.links and t.duration_s > 0:
                if solo.get(t.links[0]) == tid:  # alone all along: done at its own rate
                    del solo[t.links[0]]
                    on_link[t.links[0]] = 0
                elif flow_end.get(tid) == now:
                    del flow_end[tid]
                    reschedule(net.finish(tid, now))
                    for lk in t.links:
                        on_link[lk] -= 1
                    t.duration_s = now - t.start_s  # the time it took, sharing its links
                else:
                    continue  # its rate changed since this finish was pushed
            events += 1
            t.end_s = now
            s = streams[t.stream]
            s.busy = False
            s.head += 1
            if t.channel is not None:
                waiters = chan_wait[t.channel]
                if waiters:
                    _, _, nxt = heapq.heappop(waiters)
                    start(tasks[nxt], now, tid)
                else:
                    chan_busy[t.channel] = False
            for x in t.succ:
                u = tasks[x]
                u.waiting -= 1
                if not u.waiting:
                    try_stream(streams[u.stream], now, tid)
            try_stream(s, now, tid)
        self.events = events
        if events != len(tasks):
            stuck = next(tasks[s.tasks[s.head]] for s in streams if s.head < len(s.tasks))
            raise SimError(
                f"deadlock: {len(tasks) - events} of {len(tasks)} tasks never ran; "
                f"first stuck: {stuck.name!r} on stream {streams[stuck.stream].name!r} of device "
                f"{streams[stuck.stream].device}"
            )
        return now

    def trace(self) -> list[tuple[str, int, float]]:
        """(name, device, start_s) of every task in start order: for exact-trace tests."""
        order = sorted(self.tasks, key=lambda t: (t.start_s, t.id))
        return [(t.name, self.streams[t.stream].device, t.start_s) for t in order]
