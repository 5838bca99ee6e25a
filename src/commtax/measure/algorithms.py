"""Collective algorithms executed on torch.distributed point-to-point (isend/irecv).

Each algorithm is the schedule from ``commtax.measure.schedules`` (the same one the cost model
prices); ``run_schedule`` moves the bytes. Works with any backend that supports p2p
(gloo on CPU, NCCL on GPU) on the default process group; subgroups are rank lists in the
schedule, so no extra communicator is needed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from commtax.measure import schedules
from commtax.measure.schedules import Schedule, chunk_bounds


def run_schedule(flat: torch.Tensor, schedule: Schedule, rank: int | None = None) -> torch.Tensor:
    """Execute ``schedule`` on the contiguous 1-D ``flat`` in place; returns ``flat``.

    Per step: post every receive (into scratch) and send, wait for all, then add or copy
    the received ranges. Sends read the buffer as it was before the step.
    """
    assert flat.dim() == 1 and flat.is_contiguous(), "run_schedule needs a flat contiguous tensor"
    rank = dist.get_rank() if rank is None else rank
    for tag, step in enumerate(schedule):
        recvs = [t for t in step if t.dst == rank]
        sends = [t for t in step if t.src == rank]
        if not recvs and not sends:
            continue
        scratch = [torch.empty(t.hi - t.lo, dtype=flat.dtype, device=flat.device) for t in recvs]
        works = [dist.irecv(x, src=t.src, tag=tag) for t, x in zip(recvs, scratch)]
        works += [dist.isend(flat[t.lo : t.hi], dst=t.dst, tag=tag) for t in sends]
        for w in works:
            w.wait()
        for t, x in zip(recvs, scratch):
            if t.reduce:
                flat[t.lo : t.hi].add_(x)
            else:
                flat[t.lo : t.hi].copy_(x)
    return flat


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    assert tensor.is_contiguous(), "collectives here work in place on contiguous tensors"
    return tensor.view(-1)


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", per_node: int = 1) -> torch.Tensor:
    """Sum-all-reduce ``tensor`` in place over the default group with our ``algorithm``."""
    flat = _flat(tensor)
    n = dist.get_world_size()
    sched = schedules.all_reduce_schedule(algorithm, n, flat.numel(), flat.element_size(), per_node)
    run_schedule(flat, sched)
    return tensor


def reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Ring reduce-scatter in place; returns this rank's fully reduced chunk (a view, chunk_bounds split)."""
    flat = _flat(tensor)
    n, r = dist.get_world_size(), dist.get_rank()
    run_schedule(flat, schedules.ring_reduce_scatter(list(range(n)), 0, flat.numel()))
    b = chunk_bounds(0, flat.numel(), n)
    return flat[b[r] : b[r + 1]]


def all_gather(output: torch.Tensor, local: torch.Tensor | None = None) -> torch.Tensor:
    """Ring all-gather into ``output``; this rank's chunk (chunk_bounds split) is ``local`` or already in place."""
    flat = _flat(output)
    n, r = dist.get_world_size(), dist.get_rank()
    b = chunk_bounds(0, flat.numel(), n)
    if local is not None:
        flat[b[r] : b[r + 1]].copy_(local.reshape(-1))
    run_schedule(flat, schedules.ring_all_gather(list(range(n)), 0, flat.numel()))
    return output
