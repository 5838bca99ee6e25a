"""A tiny deterministic discrete-event core: in-order streams, task dependencies, shared channels.

A *task* runs for a fixed ``duration_s`` on one *stream*. A stream runs its tasks one at a
time in the order they were added (as a CUDA stream does). A task starts when it is the head
of its stream, the stream is idle, all its dependencies have finished and, if it names a
*channel* (a shared wire, e.g. one GPU's NIC used by its DP and PP streams), the channel is
free. Waiting tasks get a channel in (ready time, priority, sequence) order. A task may instead
name *links* (``Sim.link``): it starts at once and shares them with the other transfers on them at
max-min fair rates (schedule/sim/network.py), so its end moves whenever a transfer on its links
starts or ends; after the run its ``duration_s`` is the time it took, ``work_s`` its time alone.

A *train* (``Sim.train``) is one task standing for n transfers that run one after another on its stream,
transfer j launched ``offsets_s[j]`` after an *anchor* task starts (ZeRO-2's gradient buckets, each launched
when the backward it runs under has produced its last gradient). Alone on its stream and link, its timeline
is the max-plus recurrence B_j = max(anchor start + offset_j, E_{j−1}), E_j = B_j + work_j, priced in closed
form with one event; it is stepped transfer by transfer only while another transfer shares its link, so the
timeline is the one n separate tasks would give.

Events are finish times kept in a heap of ``(time_s, priority, sequence, task)`` (SimPy's
ordering), so a run is reproducible to the bit. Each task records its *cause*: the task whose
finish let it start (its last dependency, its stream predecessor, or the channel holder), which
makes the critical path a walk over ``cause`` links.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate

Tail = tuple[tuple[str, str, float], ...]  # (stream name, kind, seconds) at the end of a task


class SimError(ValueError):
    """A malformed task graph: negative duration, a dangling dependency, or a deadlock."""


@dataclass(frozen=True, slots=True)
class TrainShape:
    """A train's transfers: when each launches after the anchor starts, its time alone, and its bytes (for traces).

    ``suffix_work_s[j]`` = Σ_{k≥j} work_k and ``suffix_reach_s[j]`` = max_{k≥j} (offset_k + Σ_{k'≥k} work_k'): from
    transfer j on, a train alone ends at max(F + suffix_work_s[j], anchor start + suffix_reach_s[j]), F the end of
    transfer j − 1 (the recurrence unrolled). Likewise up to transfer j: with W_j = ``prefix_work_s[j]`` = Σ_{k<j}
    work_k and ``prefix_reach_s[j]`` = max_{k<j} (offset_k − W_k), transfer j − 1 ends at
    max(F + W_j, anchor start + prefix_reach_s[j] + W_j), F the end of the stream's previous task.
    """

    offsets_s: tuple[float, ...]
    work_s: tuple[float, ...]
    bytes: tuple[float, ...]
    suffix_work_s: tuple[float, ...] = field(init=False)
    suffix_reach_s: tuple[float, ...] = field(init=False)
    prefix_work_s: tuple[float, ...] = field(init=False)
    prefix_reach_s: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.offsets_s)
        if not n or len(self.work_s) != n or len(self.bytes) != n:
            raise SimError(
                f"a train needs one offset, work and bytes per transfer, got {n}, {len(self.work_s)}, {len(self.bytes)}"
            )
        if not all(w >= 0.0 for w in self.work_s) or not all(o >= 0.0 for o in self.offsets_s):
            raise SimError(f"a train's offsets and work must be ≥ 0 s, got {self.offsets_s}, {self.work_s}")
        if any(b < a for a, b in zip(self.offsets_s, self.offsets_s[1:])):
            raise SimError(f"a train's transfers launch in order: offsets {self.offsets_s} must not decrease")
        suffix = tuple(accumulate(reversed(self.work_s)))[::-1]
        reach = tuple(accumulate((o + w for o, w in zip(reversed(self.offsets_s), reversed(suffix))), max))[::-1]
        object.__setattr__(self, "suffix_work_s", suffix)
        object.__setattr__(self, "suffix_reach_s", reach)
        prefix = (0.0, *accumulate(self.work_s))
        object.__setattr__(self, "prefix_work_s", prefix)
        object.__setattr__(
            self, "prefix_reach_s", (-math.inf, *accumulate((o - w for o, w in zip(self.offsets_s, prefix)), max))
        )

    @property
    def total_work_s(self) -> float:
        return self.suffix_work_s[0]


# what a train is doing: each transfer at its own rate up to a projected end (one event), waiting to launch its
# next transfer onto a link another transfer holds, or one transfer in the flow network
SOLO, WAIT, NET = 0, 1, 2


class Train:
    """A train's run state (``Sim.train``); ``took`` holds the transfers that took longer than their work (shared)."""

    __slots__ = ("shape", "anchor", "anchor_s", "next", "free_s", "launch_s", "state", "token", "took")

    def __init__(self, shape: TrainShape, anchor: int):
        self.shape, self.anchor = shape, anchor
        self.anchor_s = -1.0  # when the anchor started
        self.next = 0  # the first transfer not finished
        self.free_s = 0.0  # when transfer ``next`` − 1 ended (or the train became the head of its stream)
        self.launch_s = 0.0  # when transfer ``next`` started, while it is in the flow network
        self.state = SOLO
        self.token = -1  # the heap sequence of its live event (SOLO: its projected end; WAIT: its next launch)
        self.took: dict[int, float] | None = None

    def start_of(self, j: int, free_s: float) -> float:
        return max(self.anchor_s + self.shape.offsets_s[j], free_s)

    def projected_end(self) -> float:
        """Its end if every transfer from ``next`` on runs at its own rate (nothing else on its link)."""
        sh, j = self.shape, self.next
        return max(self.free_s + sh.suffix_work_s[j], self.anchor_s + sh.suffix_reach_s[j])

    def durations(self) -> list[float]:
        """Each transfer's time, as it ran."""
        d = list(self.shape.work_s)
        for j, x in (self.took or {}).items():
            d[j] = x
        return d

    def end_after(self, anchor_start_s: float, free_s: float, free: bool) -> float:
        """The end of its last transfer for another anchor start and stream predecessor end (``_makespan_without``),
        each transfer taking the time it took — or none when ``free``."""
        sh = self.shape
        if free:
            return max(free_s, anchor_start_s + sh.offsets_s[-1])
        if not self.took:
            return max(free_s + sh.suffix_work_s[0], anchor_start_s + sh.suffix_reach_s[0])
        # in closed form before the first transfer that took longer and after the last, stepped in between
        first, last = min(self.took), max(self.took)
        w = sh.prefix_work_s[first]
        end = max(free_s + w, anchor_start_s + sh.prefix_reach_s[first] + w) if first else free_s
        for j in range(first, last + 1):
            b = anchor_start_s + sh.offsets_s[j]
            end = (b if b > end else end) + self.took.get(j, sh.work_s[j])
        if last + 1 < len(sh.work_s):
            end = max(end + sh.suffix_work_s[last + 1], anchor_start_s + sh.suffix_reach_s[last + 1])
        return end

    def spans(self) -> Iterator[tuple[int, float, float]]:
        """(transfer, start_s, duration_s) of each transfer as it ran (after ``Sim.run``)."""
        end = -1.0
        for j, (o, d) in enumerate(zip(self.shape.offsets_s, self.durations())):
            b = max(self.anchor_s + o, end)
            yield j, b, d
            end = b + d


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
        "train",
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
        self.train: Train | None = None  # a train of transfers (Sim.train)
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

    def __init__(self, sharing: str = "max-min", rtt_s: float = 0.0) -> None:
        """``sharing``, ``rtt_s``: how the flow network's links are shared (schedule/sim/network.py)."""
        self.sharing, self.rtt_s = sharing, rtt_s
        self.streams: list[Stream] = []
        self.tasks: list[Task] = []
        self.channel_names: list[str] = []
        self.events = 0
        self.start_order: list[int] = []  # task ids as they started: a topological order of every constraint
        self.network = None  # a FlowNetwork once a link is made
        self.anchored: dict[int, list[int]] = {}  # task id -> the trains that launch when it starts
        self._ran = False

    # ------------------------------------------------------------------ construction
    def stream(self, device: int, name: str) -> int:
        s = Stream(len(self.streams), device, name)
        self.streams.append(s)
        return s.id

    def channel(self, name: str) -> int:
        self.channel_names.append(name)
        return len(self.channel_names) - 1

    def link(self, name: str, capacity: float = 1.0, queue_s: float = 0.0) -> int:
        """A link of the flow network: transfers on it share ``capacity`` (1 = one transfer at its own rate); each
        transfer crossing it waits ``queue_s`` behind its standing queue (``sharing="tcp"`` only)."""
        if self.network is None:
            from commtax.schedule.sim.network import FlowNetwork

            self.network = FlowNetwork(self.sharing, self.rtt_s)
        return self.network.link(name, capacity, queue_s)

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
        weight: float = 1.0,
    ) -> int:
        """Add a task after every task already on ``stream``; returns its id. ``None`` deps are skipped.

        ``weight``: a transfer's TCP weight on its links (1 / RTT², relative; ``sharing="tcp"`` only).

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
            if weight != 1.0:
                if not weight > 0:
                    raise SimError(f"task {name!r}: weight must be > 0, got {weight}")
                self.network.weight[tid] = weight
        unique = set(deps) if len(deps) > 2 or (len(deps) == 2 and deps[0] == deps[1]) else deps
        t.waiting = len(unique)
        for x in unique:
            tasks[x].succ.append(tid)
        tasks.append(t)
        self.streams[stream].tasks.append(tid)
        return tid

    def train(
        self,
        name: str,
        stream: int,
        shape: TrainShape,
        anchor: int,
        kind: str = "dp",
        priority: int = 0,
        meta: tuple = (),
        links: tuple[int, ...] = (),
        weight: float = 1.0,
    ) -> int:
        """Add a train of transfers after every task already on ``stream``; returns its id (see the module docstring).

        Transfer j launches ``shape.offsets_s[j]`` after task ``anchor`` starts, and after transfer j − 1; a train
        is one task for its stream, its successors and the breakdown (``duration_s`` the sum of its transfers'
        times, ``work_s`` of their times alone). ``links``: at most one flow-network link, shared with the other
        transfers on it.
        """
        tid = len(self.tasks)
        if not 0 <= anchor < tid:
            raise SimError(f"train {name!r}: anchor {anchor} does not exist (tasks 0..{tid - 1})")
        if len(links) > 1 or (links and (self.network is None or not 0 <= links[0] < len(self.network.capacity))):
            raise SimError(f"train {name!r}: links {links} must be one existing link, or none")
        tid = self.task(name, stream, shape.total_work_s, (), kind, priority, None, meta, (), links, weight)
        t = self.tasks[tid]
        t.train = Train(shape, anchor)
        t.waiting = 1  # its anchor's start
        self.anchored.setdefault(anchor, []).append(tid)
        return tid

    def transfers(self, t: Task) -> Iterator[tuple[Task, float, float]]:
        """The transfers a task stands for, as (task view, start_s, duration_s): itself, or each of a train's."""
        if t.train is None:
            yield t, t.start_s, t.duration_s
            return
        sh = t.train.shape
        for j, start, d in t.train.spans():
            u = Task(t.id, t.name, t.stream, d, (), t.kind, t.priority, None, t.meta + (sh.bytes[j],))
            u.ready_s = u.start_s = start
            u.end_s = start + d
            u.work_s = sh.work_s[j]
            yield u, start, d

    # ------------------------------------------------------------------ run
    def run(self) -> float:
        """Run to completion; returns the makespan in seconds. Raises SimError on a deadlock."""
        if self._ran:
            raise SimError("a Sim runs once; build a new one")
        self._ran = True
        run = _Run(self)
        for s in self.streams:
            run.try_stream(s, 0.0, None)
        makespan, self.events = run.drain()
        if self.events != len(self.tasks):
            raise self._deadlock()
        return makespan

    def _deadlock(self) -> SimError:
        """The error of a run that ended with tasks never started: how many, and the first stream stuck."""
        tasks, streams = self.tasks, self.streams
        stuck = next(tasks[s.tasks[s.head]] for s in streams if s.head < len(s.tasks))
        return SimError(
            f"deadlock: {len(tasks) - self.events} of {len(tasks)} tasks never ran; "
            f"first stuck: {stuck.name!r} on stream {streams[stuck.stream].name!r} of device "
            f"{streams[stuck.stream].device}"
        )

    def trace(self) -> list[tuple[str, int, float]]:
        """(name, device, start_s) of every task in start order: for exact-trace tests."""
        order = sorted(self.tasks, key=lambda t: (t.start_s, t.id))
        return [(t.name, self.streams[t.stream].device, t.start_s) for t in order]


class _Run:
    """One ``Sim.run``'s state — the event heap, the channels' queues, who is alone on which link — and its handlers."""

    __slots__ = (
        "tasks",
        "streams",
        "heap",
        "seq",
        "chan_busy",
        "chan_wait",
        "chan_last",
        "started",
        "net",
        "flow_end",
        "on_link",
        "solo",
        "trains",
    )

    def __init__(self, sim: Sim) -> None:
        self.tasks, self.streams = sim.tasks, sim.streams
        self.heap: list[tuple[float, int, int, int]] = []  # finish events: (time_s, priority, sequence, task id)
        self.seq = 0  # the last heap sequence number given out
        self.chan_busy = [False] * len(sim.channel_names)
        self.chan_wait: list[list[tuple[float, int, int]]] = [[] for _ in sim.channel_names]
        self.chan_last: list[int | None] = [None] * len(sim.channel_names)
        self.started = sim.start_order
        net = self.net = sim.network
        self.flow_end: dict[int, float] = {}  # a transfer's current finish time: heap entries at other times are stale
        # a transfer alone on its one link runs at its own rate, as a plain task (the common case, kept cheap);
        # it joins the network when another transfer comes onto its link
        self.on_link = [0] * (len(net.capacity) if net is not None else 0)
        self.solo: dict[int, int] = {}  # link -> the transfer (or train) alone on it, outside the network
        self.trains = sim.anchored

    # ------------------------------------------------------------------ the event loop
    def drain(self) -> tuple[float, int]:
        """Pop finish events in heap order until none is left; returns (makespan, tasks finished)."""
        heap, tasks, streams = self.heap, self.tasks, self.streams
        heappop, try_stream = heapq.heappop, self.try_stream
        train_event, transfer_ended = self.train_event, self.transfer_ended
        now = makespan = 0.0
        events = 0
        while heap:
            now, _, sq, tid = heappop(heap)
            t = tasks[tid]
            if t.train is not None:
                if not train_event(t, now, sq):
                    continue
            elif t.links and t.duration_s > 0:
                if not transfer_ended(t, now):
                    continue
            events += 1
            t.end_s = makespan = now  # the last task's end: a stale finish popped later is not the makespan
            s = streams[t.stream]
            s.busy = False
            s.head += 1
            if t.channel is not None:
                self.pass_channel(t.channel, now, tid)
            for x in t.succ:
                u = tasks[x]
                u.waiting -= 1
                if not u.waiting:
                    try_stream(streams[u.stream], now, tid)
            try_stream(s, now, tid)
        return makespan, events

    def try_stream(self, s: Stream, now: float, cause: int | None) -> None:
        """Start the head task of stream ``s`` if the stream is idle and the task's dependencies have finished."""
        if s.busy or s.head >= len(s.tasks):
            return
        t = self.tasks[s.tasks[s.head]]
        if t.waiting:
            return
        s.busy = True
        if t.train is not None:
            self.activate(t, now, cause)
            return
        t.ready_s = now
        if t.channel is not None:
            if self.chan_busy[t.channel]:
                heapq.heappush(self.chan_wait[t.channel], (now, t.priority, t.id))
                return
            self.chan_busy[t.channel] = True
        self.start(t, now, cause)

    def start(self, t: Task, now: float, cause: int | None) -> None:
        """Start a plain task (not a train) now: its finish event, or its transfer onto its links."""
        t.start_s, t.cause = now, cause
        if t.channel is not None:
            chan_last = self.chan_last
            t.channel_prev, chan_last[t.channel] = chan_last[t.channel], t.id
        self.started.append(t.id)
        trains = self.trains
        if trains and t.id in trains:
            self.anchor_started(t.id, now)
        if t.links and t.duration_s > 0 and not self.onto_links(t, now):
            return
        seq = self.seq = self.seq + 1
        heapq.heappush(self.heap, (now + t.duration_s, t.priority, seq, t.id))

    def pass_channel(self, channel: int, now: float, tid: int) -> None:
        """Task ``tid`` let go of ``channel``: the first waiter in (ready, priority, sequence) order takes it."""
        waiters = self.chan_wait[channel]
        if waiters:
            _, _, nxt = heapq.heappop(waiters)
            self.start(self.tasks[nxt], now, tid)
        else:
            self.chan_busy[channel] = False

    def anchor_started(self, anchor: int, now: float) -> None:
        """The trains that launch from ``anchor``'s start learn when it started, and may start on their streams."""
        tasks, streams = self.tasks, self.streams
        for x in self.trains[anchor]:
            u = tasks[x]
            u.train.anchor_s = now
            u.waiting -= 1
            if not u.waiting:
                self.try_stream(streams[u.stream], now, anchor)

    # ------------------------------------------------------------------ transfers on the flow network's links
    def push(self, t: Task, at: float) -> int:
        """An event for ``t`` at ``at``; returns its sequence number (a train's token)."""
        seq = self.seq = self.seq + 1
        heapq.heappush(self.heap, (at, t.priority, seq, t.id))
        return seq

    def reschedule(self, ends: dict[int, float]) -> None:
        """New finish times of transfers whose rates changed; their earlier events go stale."""
        heap, tasks, flow_end, seq = self.heap, self.tasks, self.flow_end, self.seq
        for tid, end in ends.items():
            flow_end[tid] = end
            seq += 1
            heapq.heappush(heap, (end, tasks[tid].priority, seq, tid))
        self.seq = seq

    def onto_links(self, t: Task, now: float) -> bool:
        """A transfer starting now: True if it runs alone at its own rate (a plain finish event), else it shares."""
        links = t.links
        if self.claim(links, now):
            self.on_link[links[0]] = 1
            self.solo[links[0]] = t.id
            return True
        self.into_network(t.id, t.duration_s, links, now)
        return False

    def transfer_ended(self, t: Task, now: float) -> bool:
        """A finish event of a transfer on links (not a train): True if it is its end, False if stale."""
        tid = t.id
        if self.solo.get(t.links[0]) == tid:  # alone all along: done at its own rate
            del self.solo[t.links[0]]
            self.on_link[t.links[0]] = 0
        elif self.flow_end.get(tid) == now:
            del self.flow_end[tid]
            self.reschedule(self.net.finish(tid, now))
            for lk in t.links:
                self.on_link[lk] -= 1
            t.duration_s = now - t.start_s  # the time it took, sharing its links
        else:
            return False  # its rate changed since this finish was pushed
        return True

    def claim(self, links: tuple[int, ...], now: float) -> bool:
        """Whether a transfer starting on ``links`` now runs alone at its own rate (a train there settled first)."""
        if self.trains:
            tasks = self.tasks
            for lk in links:
                o = self.solo.get(lk)
                if o is not None and tasks[o].train is not None:
                    self.settle(tasks[o], now)
        # a queued link's transfers go through the network, which adds the wait (``FlowNetwork._wait``)
        net = self.net
        return (
            len(links) == 1 and not self.on_link[links[0]] and net.capacity[links[0]] >= 1 and not net.queue[links[0]]
        )

    def into_network(self, tid: int, work_s: float, links: tuple[int, ...], now: float) -> None:
        """Transfer ``tid`` shares ``links`` from now on; a transfer that was alone on one of them joins it there."""
        net, on_link, solo = self.net, self.on_link, self.solo
        for lk in links:
            on_link[lk] += 1
            other = solo.pop(lk, None)
            if other is not None:  # it shares from now on: into the network with the work it has left
                o = self.tasks[other]
                tr = o.train
                if tr is None:
                    left = o.start_s + o.duration_s - now
                else:  # the train's transfer on the wire (``settle``)
                    left = tr.launch_s + tr.shape.work_s[tr.next] - now
                    tr.state = NET
                if len(links) == 1 and not net.multi and not net.weighted(other) and not net.weighted(tid):
                    # the two onto one link at once: their rates set once
                    self.reschedule(net.start_two(other, left, tid, work_s, lk, now))
                    return
                self.reschedule(net.start(other, left, o.links, now))
        self.reschedule(net.start(tid, work_s, links, now))

    # ------------------------------------------------------------------ trains
    def activate(self, t: Task, now: float, cause: int | None) -> None:
        """A train at the head of its stream, its anchor started: its first transfer launches."""
        tr = t.train
        t.ready_s = t.start_s = tr.start_of(0, now)
        t.cause = tr.anchor if cause is None or t.start_s > now else cause
        self.started.append(t.id)
        tr.free_s = now
        self.launch(t, now)

    def launch(self, t: Task, now: float) -> None:
        """A train's next transfer, once the one before it ended (``free_s``)."""
        tr = t.train
        if not t.links:
            self.go_solo(t)
            return
        at = tr.start_of(tr.next, tr.free_s)
        if self.claim(t.links, now):  # nothing else on its link: alone until another transfer comes (``settle``)
            self.go_solo(t)
        elif at <= now:  # launching now onto a link another transfer holds
            tr.state, tr.launch_s = NET, now
            self.into_network(t.id, tr.shape.work_s[tr.next], t.links, now)
        else:  # launching later, onto a link that is busy now
            tr.state, tr.token = WAIT, self.push(t, at)

    def go_solo(self, t: Task) -> None:
        """A train's transfers from ``next`` on at their own rate: one event at their end."""
        tr = t.train
        tr.state, tr.token = SOLO, self.push(t, tr.projected_end())
        if t.links:
            self.on_link[t.links[0]] = 1
            self.solo[t.links[0]] = t.id

    def settle(self, o: Task, now: float) -> None:
        """A train alone on its link (SOLO) when another transfer comes: bring it up to ``now``; between two of
        its transfers (or done) it leaves the link and waits for its next launch."""
        tr = o.train
        j, free, a = tr.next, tr.free_s, tr.anchor_s
        offsets, work = tr.shape.offsets_s, tr.shape.work_s
        n = len(work)
        b = 0.0
        while j < n:  # the recurrence, up to the transfer on the wire at ``now`` (or the next to launch)
            b = a + offsets[j]
            if free > b:
                b = free
            if b > now or b + work[j] > now:
                break
            free = b + work[j]
            j += 1
        tr.next, tr.free_s = j, free
        if j < n and b <= now:  # transfer j is on the wire: it will share (``into_network``)
            tr.launch_s = b
            return
        lk = o.links[0]
        del self.solo[lk]
        self.on_link[lk] = 0
        if j < n:  # between transfers: the next one launches onto the link as it is then
            tr.state, tr.token = WAIT, self.push(o, b)
        # else its projected end is now: that event (still live) finishes it

    def train_event(self, t: Task, now: float, sq: int) -> bool:
        """A heap event of a train; True when its last transfer ended."""
        tr = t.train
        if tr.state == NET:
            if self.flow_end.get(t.id) != now:
                return False  # stale: its rate changed since
            if self.shared_transfer_ended(t, now):
                return False
        elif sq != tr.token:
            return False  # stale: settled or launched since
        elif tr.state == WAIT:
            self.launch(t, now)
            return False
        else:  # SOLO: its projected end
            if t.links and self.solo.get(t.links[0]) == t.id:
                del self.solo[t.links[0]]
                self.on_link[t.links[0]] = 0
            tr.next, tr.free_s = len(tr.shape.work_s), now
        if tr.next < len(tr.shape.work_s):
            self.launch(t, now)
            return False
        t.duration_s = t.work_s
        if tr.took is not None:  # what sharing its link added
            t.duration_s += sum(x - tr.shape.work_s[j] for j, x in tr.took.items())
        return True

    def shared_transfer_ended(self, t: Task, now: float) -> bool:
        """A train's transfer in the flow network ended: noted if it took longer than alone; True when the next
        transfer took its place on the shared link at once (no other rate changes), else it left the network."""
        tr, net = t.train, self.net
        del self.flow_end[t.id]
        took = now - tr.launch_s
        if took != tr.shape.work_s[tr.next]:
            if tr.took is None:
                tr.took = {}
            tr.took[tr.next] = took
        tr.next += 1
        tr.free_s = now
        lk = t.links[0]
        if (
            tr.next < len(tr.shape.work_s)
            and self.on_link[lk] > 1
            and not net.multi
            and tr.start_of(tr.next, now) <= now
        ):
            tr.launch_s = now
            self.reschedule(net.renew(t.id, tr.shape.work_s[tr.next], now))
            return True
        self.reschedule(net.finish(t.id, now))
        self.on_link[lk] -= 1
        return False
