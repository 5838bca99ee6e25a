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
import time
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
    """Delete the node's cgroup once nothing runs in it, waiting up to 5 s for killed processes to go."""
    try:
        path = path_of(namespace)
    except CgroupError:
        return
    for _ in range(50):  # the node's processes were just killed: a cgroup empties once they are reaped
        if not path.exists():
            return
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def runqueue_wait_s() -> float | None:
    """Seconds the calling thread has spent runnable but not running (/proc/thread-self/schedstat, second field):
    what its node's CPU share (throttling) and the host's other work (contention) cost it. Readable inside a
    network namespace, where ``ip netns exec`` remounts /sys and the cgroup files are out of reach."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
