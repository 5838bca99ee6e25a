"""Timeline outputs: Chrome trace-event JSON (Perfetto, chrome://tracing) and atomic file writes.

Trace format: the Trace Event Format's "X" (complete) events with ``ts``/``dur`` in
microseconds, ``pid`` = pipeline stage (one process per stage), ``tid`` = stream (one thread per
stream), named by "M" metadata events (process_name / thread_name / *_sort_index); "s"/"f" flow
events draw an arrow from each pipeline send to the pass that receives it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from commtax.atomic import write_atomic_with as write_atomic
from commtax.schedule.sim.events import Sim, Task
from commtax.schedule.sim.step import STREAMS

US_PER_S = 1e6


def label(t: Task, v: int) -> str:
    """'compute F12', 'tp B3.c1', 'send F0', 'grad bucket B127', 'optimizer'."""
    if len(t.meta) < 4 or t.meta[1] < 0:
        return t.name
    _, mb, chunk, phase = t.meta[:4]
    return f"{t.name} {phase}{mb}" + (f".c{chunk}" if v > 1 else "")


def spans(sim: Sim) -> Iterator[tuple[Task, int, float, float, str]]:
    """(task, stream id, start_s, duration_s, kind) of every span to draw: a task, and its tail on other streams."""
    by_name = {(s.device, s.name): s.id for s in sim.streams}
    for t in sorted(sim.tasks, key=lambda t: (t.start_s, t.id)):
        if t.train is not None:  # each of its transfers, as it ran
            for u, start, dur in sim.transfers(t):
                yield u, t.stream, start, dur, t.kind
            continue
        if not t.tail:
            yield t, t.stream, t.start_s, t.duration_s, t.kind
            continue
        own = t.duration_s - sum(x[2] for x in t.tail)
        yield t, t.stream, t.start_s, own, t.kind
        at, device = t.start_s + own, sim.streams[t.stream].device
        for stream, kind, secs in t.tail:
            yield t, by_name[(device, stream)], at, secs, kind
            at += secs


def trace_events(sim: Sim, v: int = 1) -> list[dict[str, Any]]:
    drawn = list(spans(sim))
    used = {sid for _, sid, _, _, _ in drawn}
    events: list[dict[str, Any]] = []
    for d in sorted({s.device for s in sim.streams}):
        events.append({"name": "process_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": f"stage {d}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": d, "tid": 0, "args": {"sort_index": d}})
    tids = {s.id: (STREAMS.index(s.name) if s.name in STREAMS else s.id) for s in sim.streams}
    for s in sim.streams:
        if s.id in used:
            tid = tids[s.id]
            events.append({"name": "thread_name", "ph": "M", "pid": s.device, "tid": tid, "args": {"name": s.name}})
            events.append(
                {"name": "thread_sort_index", "ph": "M", "pid": s.device, "tid": tid, "args": {"sort_index": tid}}
            )
    for t, sid, start, dur, kind in drawn:
        device = sim.streams[sid].device
        args: dict[str, Any] = {}
        if len(t.meta) >= 4 and t.meta[1] >= 0:
            args = {"micro_batch": t.meta[1], "chunk": t.meta[2], "phase": t.meta[3]}
        if len(t.meta) >= 5:
            args["bytes"] = t.meta[4]
        if t.start_s > t.ready_s >= 0:
            args["waited_for_nic_us"] = (t.start_s - t.ready_s) * US_PER_S
        name = label(t, v) if kind == t.kind else label(t, v).replace(t.name, kind, 1)
        events.append(
            {
                "name": name,
                "cat": kind,
                "ph": "X",
                "pid": device,
                "tid": tids[sid],
                "ts": start * US_PER_S,
                "dur": dur * US_PER_S,
                "args": args,
            }
        )
        if t.kind == "pp":  # an arrow from each send to the pass that receives it
            for u in (sim.tasks[i] for i in t.succ):
                to = sim.streams[u.stream]
                if to.device == device:
                    continue
                flow = {"name": "send", "cat": "pp", "id": t.id}
                events.append({**flow, "ph": "s", "pid": device, "tid": tids[sid], "ts": start * US_PER_S})
                events.append(
                    {**flow, "ph": "f", "bp": "e", "pid": to.device, "tid": tids[u.stream], "ts": u.start_s * US_PER_S}
                )
    return events


def write_trace(sim: Sim, path: Path | str, v: int = 1, metadata: dict[str, Any] | None = None) -> int:
    """Write the timeline as Chrome trace JSON; returns the number of events written."""
    events = trace_events(sim, v)
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata or {}}
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(doc, separators=(",", ":"))))
    return len(events)
