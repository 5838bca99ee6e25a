"""CPU shares for the emulated cluster's nodes (``commtax cluster up --node-speed``): one cgroup per node.

A node at speed x gets x CPUs per rank: cgroup v2 ``cpu.max`` = "quota period" (quota = x · ranks · period), or on
a cgroup-v1 host ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (the same CFS bandwidth control; Linux
Documentation/scheduler/sched-bwc.rst). The period is short (10 ms) so that a throttled rank runs in many small
slices rather than 50 ms on, 50 ms off: a forward pass of a few ms sees the average share, not a stall.
Every rank torchrun starts in the node joins its cgroup (``join``, in the child before exec), so the share holds for
the node as a whole. Groups are named after the node's namespace (``commtax-ctxXXXXXX-n<i>``) and removed with it.
"""

from __future__ import annotations

import os
from pathlib import Path

PERIOD_US = 10_000
CGROUP_FS = Path("/sys/fs/cgroup")


class CgroupError(RuntimeError):
    """The host gives no CPU controller this process can write."""


def cpu_root() -> tuple[str, Path]:
    """("v2", /sys/fs/cgroup) where the unified hierarchy has the cpu controller, else ("v1", its cpu hierarchy)."""
    controllers = CGROUP_FS / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2", CGROUP_FS
    v1 = CGROUP_FS / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return "v1", v1
    raise CgroupError("no cgroup CPU controller (cgroup v2 cpu.max or v1 cpu.cfs_quota_us) under /sys/fs/cgroup")


def path_of(namespace: str) -> Path:
    return cpu_root()[1] / f"commtax-{namespace}"


def quota_us(speed: float, ranks: int, period_us: int = PERIOD_US) -> int:
    """CPU time per period for ``ranks`` ranks at ``speed`` CPUs each (≥ 1 ms: the kernel's minimum quota)."""
    return max(1000, round(speed * ranks * period_us))


def create(namespace: str, speed: float, ranks: int) -> Path:
    """The node's cgroup with its CPU share; raises CgroupError with the reason."""
    kind, root = cpu_root()
    path = root / f"commtax-{namespace}"
    try:
        if kind == "v2":
            control = root / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
        path.mkdir(exist_ok=True)
        q = quota_us(speed, ranks)
        if kind == "v2":
            (path / "cpu.max").write_text(f"{q} {PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(q))
    except OSError as e:
        raise CgroupError(f"cannot set the CPU share of {namespace} ({path}): {e.strerror or e}") from None
    return path


def join(path: Path) -> None:
    """Move the calling process into the cgroup (its children follow)."""
    (path / "cgroup.procs").write_text(str(os.getpid()))


def remove(namespace: str) -> None:
    """Delete the node's cgroup once nothing runs in it (missing: nothing to do)."""
    try:
        path = path_of(namespace)
    except CgroupError:
        return
    if path.exists():
        try:
            path.rmdir()
        except OSError:
            pass  # a process is still inside; `cluster down` kills them first, so this is a race, retried there


def throttled_s() -> float | None:
    """Seconds the calling process's CPU cgroup has been throttled (its quota spent, waiting for the next period),
    from ``cpu.stat``; None outside a cgroup with a CPU controller."""
    try:
        kind, root = cpu_root()
        lines = open("/proc/self/cgroup").read().splitlines()
    except (CgroupError, OSError):
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (kind == "v2" and controllers == "") or (kind == "v1" and "cpu" in controllers.split(",")):
            try:
                stat = dict(x.split() for x in (root / path.lstrip("/") / "cpu.stat").read_text().splitlines())
            except (OSError, ValueError):
                return None
            if "throttled_usec" in stat:
                return int(stat["throttled_usec"]) / 1e6
            if "throttled_time" in stat:
                return int(stat["throttled_time"]) / 1e9
    return None
