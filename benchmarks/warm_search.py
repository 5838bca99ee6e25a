"""Warm min-of-N timing of one search in one process (imports, catalog and first-call costs paid once).

    .venv/bin/python benchmarks/warm_search.py [--job FILE] [--repeat 5] [--workers 1] [--profile N]

Prints the CPU seconds of each run (this process and the workers it forked and reaped), the minimum and plans per
CPU-second at the minimum; ``--profile N`` then prints the N functions with the largest cumulative time of one more
run under cProfile (this process only; its overhead inflates small calls: read the shares, not the seconds). Run main
and a branch interleaved on a shared host: the load moves a single run more than a small change does.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from commtax.decide.search import search  # noqa: E402
from commtax.spec import load_job  # noqa: E402

DEFAULT_JOB = REPO / "examples" / "compare" / "gpt3-175b-4096-h100.yaml"


def _cpu_s() -> float:
    """CPU seconds of this process and of its reaped children (the search's workers are joined before it returns)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    args = ap.parse_args()
    job = load_job(args.job)
    search(job, workers=args.workers)  # warm: imports, catalog, first calls
    times, n = [], 0
    for _ in range(args.repeat):
        c0 = _cpu_s()
        res = search(job, workers=args.workers)
        times.append(_cpu_s() - c0)
        n = res.evaluated
    best = min(times)
    print(f"cpu_s: {' '.join(f'{t:.3f}' for t in times)}  min {best:.3f}  plans {n}  plans/CPU-s {n / best:,.0f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(search, job, workers=args.workers)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
