"""GPU-to-GPU copy bandwidth matrix (CUDA events, warm-up, synchronised, uni- and bidirectional).

Without CUDA GPUs it says so and measures host memcpy (one CPU buffer to another) instead.
Bandwidth = bytes / time in GB/s (10^9); bidirectional counts both directions' bytes.
"""

from __future__ import annotations

import time

import torch

from commtax.units import GB


def _gpu_copy_s(src: int, dst: int, nbytes: int, warmup: int, iters: int, both_ways: bool) -> float:
    """Seconds per copy of nbytes cuda:src → cuda:dst (and back at once when ``both_ways``), by CUDA events."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    a2 = torch.empty_like(a) if both_ways else None
    b2 = torch.empty_like(b) if both_ways else None
    s1 = torch.cuda.Stream(device=src)
    s2 = torch.cuda.Stream(device=dst) if both_ways else None

    def once() -> None:
        with torch.cuda.stream(s1):
            b.copy_(a, non_blocking=True)
        if both_ways:
            with torch.cuda.stream(s2):
                a2.copy_(b2, non_blocking=True)

    for _ in range(warmup):
        once()
    for d in {src, dst}:
        torch.cuda.synchronize(d)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(s1)
    if both_ways:
        s2.wait_event(start)
    for _ in range(iters):
        once()
    if both_ways:
        s1.wait_stream(s2)
    end.record(s1)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def host_memcpy_s(nbytes: int, warmup: int, iters: int) -> float:
    a = torch.ones(nbytes, dtype=torch.uint8)
    b = torch.empty_like(a)
    for _ in range(warmup):
        b.copy_(a)
    t0 = time.perf_counter()
    for _ in range(iters):
        b.copy_(a)
    return (time.perf_counter() - t0) / iters


def p2p_matrix(nbytes: int, warmup: int, iters: int) -> tuple[list[dict], str]:
    """Records for every ordered GPU pair (uni and bidirectional), or one host-memcpy record; plus a note."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        t = host_memcpy_s(nbytes, warmup, iters)
        rec = {
            "op": "p2p",
            "impl": "host_memcpy",
            "backend": "cpu",
            "world_size": 1,
            "message_bytes": nbytes,
            "time_s": t,
            "algbw_GBps": nbytes / t / GB,
            "busbw_GBps": nbytes / t / GB,
            "src": -1,
            "dst": -1,
        }
        return [rec], "no CUDA GPUs on this machine: measured host memcpy instead of GPU-to-GPU copies"
    out = []
    for src in range(count):
        for dst in range(count):
            for both in (False, True):
                t = _gpu_copy_s(src, dst, nbytes, warmup, iters, both)
                moved = nbytes * (2 if both else 1)
                out.append(
                    {
                        "op": "p2p",
                        "impl": "bidirectional" if both else "unidirectional",
                        "backend": "cuda",
                        "world_size": count,
                        "message_bytes": moved,
                        "time_s": t,
                        "algbw_GBps": moved / t / GB,
                        "busbw_GBps": moved / t / GB,
                        "src": src,
                        "dst": dst,
                    }
                )
    return out, f"{count} CUDA GPUs"
