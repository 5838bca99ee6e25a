"""How fast is the estimator? Run by hand: `.venv/bin/python benchmarks/bench_estimate.py`.

Prints estimates per second on one core (goal ≥ 2,000/s) and the wall and CPU time of the `commtax estimate
JOB --json` CLI (goal < 0.3 s on an idle core), each next to references measured in the same run, interleaved
with it: the bare Python start-up (`python -c pass`) and the import of pydantic and yaml alone (what any spec
reader pays), so the figures travel across machines as ratios. Each goal line ends in
`met` or `MISSED` (`make bench` counts the misses); the exit status is 0 either way, since speed
depends on the machine and its load.
"""

from __future__ import annotations

import itertools
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import job_with, load_job

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "llama2-70b-h100.yaml"
GOAL_ESTIMATES_PER_S = 2000
GOAL_DISTINCT_PER_S = 3000  # issue 17: distinct plans estimated one by one in-process
GOAL_CLI_S = 0.3  # issue 17: `commtax estimate JOB --json` on an idle core (the imports dominate)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def estimates_per_second(seconds: float = 3.0) -> float:
    job = load_job(JOB)
    plans = [job_with(job, micro_batch=mb, recompute=rc) for mb in (1, 2, 4) for rc in ("none", "selective", "full")]
    for p in plans:  # warm-up
        estimate(p)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for p in plans:
            estimate(p)
        n += len(plans)
    return n / (time.perf_counter() - start)


def distinct_plans_per_second() -> tuple[int, float]:
    """Each plan of a sweep estimated once, in a fresh process's first pass (nothing repeats): what a sweep over
    dp/ZeRO/schedule/gradient dtype gains from the blocks, placements and phase prices its plans share."""
    job = load_job(JOB)
    jobs = []
    for tp, pp, zero, mb, rc, sched, gd in itertools.product(
        (4, 8), (2, 4), (0, 1, 2, 3), (1, 2), ("none", "selective", "full"), ("1f1b", "gpipe"), ("bf16", "fp32")
    ):
        try:
            jobs.append(
                job_with(
                    job,
                    tp=tp,
                    pp=pp,
                    dp=job.cluster.num_gpus // (tp * pp),
                    zero=zero,
                    micro_batch=mb,
                    recompute=rc,
                    schedule=sched,
                    grad_comm_dtype=gd,
                )
            )
        except SpecError:
            continue
    start = time.perf_counter()
    for j in jobs:
        estimate(j)
    return len(jobs), len(jobs) / (time.perf_counter() - start)


def timed(cmds: dict[str, list[str]], repeats: int = 9) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds (the child's user + system) of each command, the commands interleaved so a
    change in the host's load touches them alike."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    # as a user runs it: byte code cached (a shell with PYTHONDONTWRITEBYTECODE=1 recompiles ~40 modules per run,
    # ~110 ms here), and a first untimed run writes the cache
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for cmd in cmds.values():
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, env=env)
    for _ in range(repeats):
        for name, cmd in cmds.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, env=env)
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            runs[name].append((wall, cpu))
    return {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for name, r in runs.items()}


def main() -> None:
    n, distinct = distinct_plans_per_second()  # first: before anything is shared
    print(
        f"distinct plans, each estimated once (one core): {distinct:,.0f}/s over {n} plans   "
        f"goal ≥ {GOAL_DISTINCT_PER_S:,}: {verdict(distinct >= GOAL_DISTINCT_PER_S)}"
    )
    rate = estimates_per_second()
    print(
        f"estimates per second (one core): {rate:,.0f}   goal ≥ {GOAL_ESTIMATES_PER_S:,}: "
        f"{verdict(rate >= GOAL_ESTIMATES_PER_S)} ({rate / GOAL_ESTIMATES_PER_S:.2f}× the goal)"
    )
    py = sys.executable
    t = timed(
        {
            "python": [py, "-c", "pass"],
            "pydantic+yaml": [py, "-c", "import pydantic, yaml"],
            "cli": [py, "-m", "commtax.cli", "estimate", str(JOB), "--json"],
        }
    )
    (py_wall, _), (deps_wall, _), (cli, cli_cpu) = t["python"], t["pydantic+yaml"], t["cli"]
    print(f"python start-up (reference): {py_wall * 1e3:.0f} ms; importing pydantic and yaml: {deps_wall * 1e3:.0f} ms")
    print(
        f"`commtax estimate JOB --json` wall: {cli * 1e3:.0f} ms ({cli_cpu * 1e3:.0f} ms CPU) = "
        f"{cli / py_wall:.1f}× python start-up, {cli / deps_wall:.1f}× importing pydantic and yaml   "
        f"goal < {GOAL_CLI_S * 1e3:.0f} ms: {verdict(cli < GOAL_CLI_S)} (load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
