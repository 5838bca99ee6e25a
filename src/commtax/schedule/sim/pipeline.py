"""Pipeline schedules: the order in which each stage runs its forward and backward passes.

Each schedule is a generator of ``Pass(stage, mb, chunk, phase)``, stage 0's passes in order,
then stage 1's, and so on. ``chunk`` is the model chunk on the stage (virtual stage
``chunk * p + stage``); ``phase`` is "F" (forward), "B" (backward; under zero-bubble schedules the input
gradient only) or "W" (zero-bubble: the weight gradient).

* GPipe (Huang et al. 2019): all forwards, then all backwards (last micro-batch first).
* 1F1B (Narayanan et al. 2021, PipeDream-Flush): stage s runs p − s − 1 warm-up forwards,
  then alternates one forward, one backward, then drains the remaining backwards.
* Interleaved 1F1B (Narayanan et al. 2021 §2.2, Megatron-Core ``get_schedule_table``):
  micro-batches go in groups of p; within a group every chunk runs for each micro-batch
  (chunk-major); warm-up is 2(p − s − 1) + (v − 1)·g forwards for a first group of g. When p
  does not divide m the remainder joins the *first* group (g = p + m mod p): a group smaller
  than p waits on micro-batches that have not come round the ring yet and deadlocks, and a
  larger group later on would need a backward before its forward; with m < p there is one
  group of m.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from commtax.errors import SpecError


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


def zb_h1(p: int, m: int) -> Iterator[Pass]:
    """ZB-H1 (Qi et al. 2023 §2.1, Fig. 3 top): 1F1B's forwards and backwards, each backward split into B (input
    gradient, sent on) and W (weight gradient, local). Stage s runs 1F1B's p − s − 1 warm-up forwards and defers
    its W passes by s micro-batches, so that every stage holds p micro-batches in flight and the later stages'
    B passes reach the earlier ones sooner; the deferred W's fill the drain. With T_F = T_B = T_W the step is
    3m + (p − 1) units, the paper's bubble (p − 1)(T_F + T_B − T_W)."""
    for s in range(p):
        warm, delay = min(p - s - 1, m), min(s, m)
        order = [Pass(s, i, 0, "F") for i in range(warm)]
        pending: list[int] = []
        for b in range(m):
            if warm + b < m:  # steady state: one forward, then one B
                order.append(Pass(s, warm + b, 0, "F"))
            order.append(Pass(s, b, 0, "B"))
            pending.append(b)
            if len(pending) > delay:
                order.append(Pass(s, pending.pop(0), 0, "W"))
        yield from order + [Pass(s, i, 0, "W") for i in pending]


def interleaved_order(p: int, v: int, m: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in forward order on every stage: groups of p micro-batches, chunk-major."""
    first = m % p + p if m >= p else m
    bounds = [0] + list(range(first, m + 1, p))
    order = []
    for g0, g1 in zip(bounds, bounds[1:]):
        order += [(i, c) for c in range(v) for i in range(g0, g1)]
    return order


def interleaved_1f1b(p: int, v: int, m: int) -> Iterator[Pass]:
    fwd_order = interleaved_order(p, v, m)
    # backward visits the same groups with chunks reversed
    bwd_order = [(i, v - 1 - c) for i, c in fwd_order]
    total = len(fwd_order)
    first_group = m % p + p if m >= p else m
    for s in range(p):
        warmup = min(2 * (p - s - 1) + (v - 1) * first_group, total)
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
    """The plan's schedule: ``gpipe``, 1F1B (interleaved when v > 1; ``1f1b-flexible``, Llama 3's, is the
    interleaved order above, whose first group takes the remainder of m mod p), or ZB-H1; ZB-V is refused."""
    if name == "gpipe":
        return gpipe(p, m, v)
    if name in ("1f1b", "1f1b-flexible"):
        return one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, v, m)
    if name == "zb-h1":
        return zb_h1(p, m)
    if name == "dualpipe":
        return dualpipe(p, m)
    if name == "dualpipev":
        return dualpipev(p, m)
    if name == "zb-v":
        raise SpecError(
            "plan.schedule: zb-v's V-shaped placement of two chunks per stage is not simulated (zb-h1 is); use "
            "`commtax estimate` (its closed form, Qi et al. 2023) or schedule: zb-h1"
        )
    raise ValueError(f"unknown pipeline schedule {name!r}; use gpipe or 1f1b")


def by_stage(passes: Iterable[Pass], p: int) -> list[list[Pass]]:
    out: list[list[Pass]] = [[] for _ in range(p)]
    for x in passes:
        out[x.stage].append(x)
    return out


class ScheduleDeadlock(ValueError):
    """No stage can run its next pass: each waits for a pass that waits for it."""


def virtual_stage(p: int, stage: int, chunk: int, dual: str = "") -> int:
    """The virtual stage of a stage's chunk: chunk·p + stage; DualPipe's and DualPipeV's chunk 1 runs virtual
    stages p..2p−1 from rank p−1 down to rank 0 (``dualpipe``, ``dualpipev``)."""
    return (2 * p - 1 - stage if chunk else stage) if dual else chunk * p + stage


def pipeline_ends(p: int, v: int, dual: str = "") -> tuple[frozenset[int], frozenset[int]]:
    """(first, last) virtual stages of the pipelines: one pipeline of p·v (DualPipeV's V of 2p), or DualPipe's two
    of p each."""
    if dual == "dualpipe":
        return frozenset((0, p)), frozenset((p - 1, 2 * p - 1))
    return frozenset((0,)), frozenset((p * v - 1,))


def dependency_order(stages: list[list[Pass]], p: int, v: int, dual: str = "") -> Iterator[Pass]:
    """All passes, each after the passes it receives from (the forward from the previous virtual
    stage, the gradient from the next one) and after its stage's earlier passes: round-robin over
    stages, each as far as it can go. Raises ScheduleDeadlock if the schedule cannot run."""
    last = p * v - 1
    firsts, lasts = pipeline_ends(p, v, dual)
    done: set[tuple[int, int, str]] = set()
    pos = [0] * p
    left = sum(len(x) for x in stages)
    while left:
        moved = 0
        for s, passes in enumerate(stages):
            while pos[s] < len(passes):
                x = passes[pos[s]]
                k = virtual_stage(p, s, x.chunk, dual)
                if x.phase == "F":
                    need = (k - 1, x.mb, "F") if k not in firsts else None
                elif x.phase == "W":  # the weight gradient follows its own B (earlier in the stage's order)
                    need = (k, x.mb, "B")
                else:  # the gradient from the next virtual stage; on the last one, its own forward
                    need = (k + 1, x.mb, "B") if k not in lasts else (k, x.mb, "F")
                if need is not None and (0 <= need[0] <= last) and need not in done:
                    break
                done.add((k, x.mb, x.phase))
                pos[s] += 1
                moved += 1
                yield x
        if not moved:
            stuck = [stages[s][pos[s]] for s in range(p) if pos[s] < len(stages[s])]
            raise ScheduleDeadlock(f"schedule deadlock: no stage can run its next pass (first: {stuck[:3]})")
        left -= moved


def dualpipe(p: int, m: int) -> Iterator[Pass]:
    """DualPipe (DeepSeek-V3 report §3.2.1, Fig. 5; deepseek-ai/DualPipe ``dualpipe.py`` ``DualPipe.step``): two
    pipelines fed from both ends, m/2 micro-batches each. Rank r holds model stage r of the forward direction
    (chunk 0, micro-batches 0..m/2−1, fed at rank 0) and model stage p−1−r of the reverse one (chunk 1,
    micro-batches m/2..m−1, fed at rank p−1). The reference's eight steps, with h = min(r, p−1−r) and its local
    phase 0 = the direction fed nearest the rank (chunk 0 on the first half of the ranks, chunk 1 on the second):
    nF0 · nF0F1 · nB1W1F1 · nF0B1F1B0 · nB1F1B0 · nB1B0 · nWB0 · nW. A pair "F0B1" is the reference's overlapped
    forward-backward chunk (``_forward_backward_chunk``: here the forward then the backward on the compute stream;
    each one's all-to-all hides under the other's compute, as ``analytical.ep_exposed`` prices it). A zero-bubble
    backward ("B" with its weight gradient deferred to a later "W", ``WeightGradStore``) is B; a full backward is B
    followed at once by its W."""
    if p % 2 or m % 2 or m < 2 * p:
        raise SpecError(
            f"plan.schedule: dualpipe needs an even pp and an even micro-batch count ≥ 2·pp (pp {p}, m {m}); "
            "use a global batch that gives one, or schedule: 1f1b"
        )
    for r in range(p):
        mbs = (range(m // 2), range(m // 2, m))
        yield from _dualpipe_rank(r, p // 2, min(r, p - 1 - r), m // 2, (0, 1) if r < p // 2 else (1, 0), mbs)


def dualpipev(p: int, m: int) -> Iterator[Pass]:
    """DualPipeV (deepseek-ai/DualPipe ``dualpipev.py`` ``DualPipeV.step``, Sea AI Lab's cut-in-half DualPipe): one
    pipeline of 2p virtual stages in a V, rank r holding virtual stages r (chunk 0) and 2p − 1 − r (chunk 1); every
    micro-batch goes down through chunk 0 and back up through chunk 1. The same eight steps as ``dualpipe`` with the
    ranks and micro-batches whole (h = r, m micro-batches per chunk, local phase j = chunk j)."""
    if m < 2 * p:
        raise SpecError(
            f"plan.schedule: dualpipev needs at least 2·pp micro-batches (pp {p}, m {m}); use a global batch that "
            "gives them, or schedule: 1f1b"
        )
    for r in range(p):
        yield from _dualpipe_rank(r, p, r, m, (0, 1), (range(m), range(m)))


def _dualpipe_rank(
    r: int, half_p: int, h: int, half_m: int, chunk: tuple[int, int], mbs: tuple[range, range]
) -> list[Pass]:
    """Rank r's passes in the reference's eight steps (``dualpipe``): ``half_p`` ranks and ``half_m`` micro-batches
    per direction, ``h`` the rank's distance from its end, ``chunk`` the chunk of each local phase, ``mbs`` the
    micro-batches of each chunk."""
    fwd = [iter(x) for x in mbs]
    bwd = [iter(x) for x in mbs]
    weights: list[Pass] = []
    order: list[Pass] = []

    def f(j: int) -> None:
        c = chunk[j]
        order.append(Pass(r, next(fwd[c]), c, "F"))

    def b(j: int, zb: bool = False) -> None:
        c = chunk[j]
        x = Pass(r, next(bwd[c]), c, "B")
        order.append(x)
        if zb:
            weights.append(x._replace(phase="W"))
        else:
            order.append(x._replace(phase="W"))

    def w() -> None:
        order.append(weights.pop(0))

    for _ in range((half_p - h - 1) * 2):  # step 1: nF0
        f(0)
    for _ in range(h + 1):  # step 2: nF0F1
        f(0)
        f(1)
    for _ in range(half_p - h - 1):  # step 3: nB1W1F1 (zero bubble)
        b(1, zb=True)
        w()
        f(1)
    for _ in range(half_m - 2 * half_p + h + 1):  # step 4 (main): nF0B1F1B0, two overlapped pairs
        f(0)
        b(1)
        f(1)
        b(0)
    for _ in range(half_p - h - 1):  # step 5: nB1F1B0
        b(1)
        f(1)
        b(0)
    zb = False
    for i in range(h + 1):  # step 6: nB1B0, the second half zero-bubble
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        b(1, zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        b(0, zb)
    for _ in range(half_p - h - 1):  # step 7: nWB0 (zero bubble)
        w()
        b(0, zb=True)
    for _ in range(h + 1):  # step 8: nW
        w()
    assert not weights, weights
    return order
