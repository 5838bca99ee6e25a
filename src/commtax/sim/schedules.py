"""Pipeline schedules: the order in which each stage runs its forward and backward passes.

Each schedule is a generator of ``Pass(stage, mb, chunk, phase)``, stage 0's passes in order,
then stage 1's, and so on. ``chunk`` is the model chunk on the stage (virtual stage
``chunk * p + stage``); ``phase`` is "F" (forward) or "B" (backward).

* GPipe (Huang et al. 2019): all forwards, then all backwards (last micro-batch first).
* 1F1B (Narayanan et al. 2021, PipeDream-Flush): stage s runs p − s − 1 warm-up forwards,
  then alternates one forward, one backward, then drains the remaining backwards.
* Interleaved 1F1B (Narayanan et al. 2021 §2.2, Megatron-Core ``get_schedule_table``):
  micro-batches go in groups of p; within a group every chunk runs for each micro-batch
  (chunk-major); warm-up is 2(p − s − 1) + (v − 1)·p forwards. A last group smaller than p
  is allowed, as in Megatron-Core's ``microbatch_group_size_per_vp_stage``.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple


class Pass(NamedTuple):
    stage: int
    mb: int
    chunk: int
    phase: str  # "F" | "B"


def gpipe(p: int, m: int, v: int = 1) -> Iterator[Pass]:
    for s in range(p):
        for c in range(v):
            for i in range(m):
                yield Pass(s, i, c, "F")
        for c in reversed(range(v)):
            for i in reversed(range(m)):
                yield Pass(s, i, c, "B")


def one_f_one_b(p: int, m: int) -> Iterator[Pass]:
    for s in range(p):
        warmup = min(p - s - 1, m)
        fwd = iter(range(m))
        bwd = iter(range(m))
        for _ in range(warmup):
            yield Pass(s, next(fwd), 0, "F")
        for i in fwd:  # steady state: one forward, one backward
            yield Pass(s, i, 0, "F")
            yield Pass(s, next(bwd), 0, "B")
        for i in bwd:  # cool-down
            yield Pass(s, i, 0, "B")


def interleaved_order(p: int, v: int, m: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in forward order on every stage: groups of p micro-batches, chunk-major."""
    order = []
    for g in range(0, m, p):
        group = range(g, min(g + p, m))
        order += [(i, c) for c in range(v) for i in group]
    return order


def interleaved_1f1b(p: int, v: int, m: int) -> Iterator[Pass]:
    fwd_order = interleaved_order(p, v, m)
    # backward visits the same groups with chunks reversed
    bwd_order = [(i, v - 1 - c) for i, c in fwd_order]
    total = len(fwd_order)
    for s in range(p):
        warmup = min(2 * (p - s - 1) + (v - 1) * p, total)
        for i, c in fwd_order[:warmup]:
            yield Pass(s, i, c, "F")
        b = 0
        for i, c in fwd_order[warmup:]:
            yield Pass(s, i, c, "F")
            yield Pass(s, *bwd_order[b], "B")
            b += 1
        for i, c in bwd_order[b:]:
            yield Pass(s, i, c, "B")


def schedule(name: str, p: int, m: int, v: int = 1) -> Iterator[Pass]:
    """The plan's schedule: ``gpipe``, or 1F1B (interleaved when v > 1)."""
    if name == "gpipe":
        return gpipe(p, m, v)
    if name == "1f1b":
        return one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, v, m)
    raise ValueError(f"unknown pipeline schedule {name!r}; use gpipe or 1f1b")


def by_stage(passes: Iterator[Pass], p: int) -> list[list[Pass]]:
    out: list[list[Pass]] = [[] for _ in range(p)]
    for x in passes:
        out[x.stage].append(x)
    return out
