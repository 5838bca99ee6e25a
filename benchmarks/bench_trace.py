"""How fast, and in how much memory, does `commtax trace` read a large trace?

Run by hand: `.venv/bin/python benchmarks/bench_trace.py [--mb 100] [--gzip] [--compare]`.

Writes a synthetic Kineto trace of about --mb MB (a training step's mix: CPU ops, runtime launches,
compute kernels on one stream, NCCL all-reduce kernels with their args on another, memcpys), then
analyses it in a fresh process and prints CPU seconds (and wall seconds, which a busy host inflates) and
peak resident memory per 100 MB of trace,
next to the same process's baseline (interpreter + imports). --compare also times `json.load` of the
whole file (what a non-streaming reader needs) as the reference.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
from commtax.trace import analyze  # imports before the baseline
import gzip
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
if mode == "commtax":
    rep = analyze(path)
    n = sum(len(r.collectives) for r in rep.ranks)
else:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        n = len(json.load(f)["traceEvents"])
dt, dc = time.perf_counter() - t, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "base_kib": base, "peak_kib": peak, "n": n}))
"""


def synthetic_events(rng: random.Random):
    """An endless stream of one step's events: 4 layers × (CPU op, launch, kernel) + an all-reduce per layer."""
    ts, corr, step = 1_700_000_000_000_000.0, 1, 0
    while True:
        step += 1
        yield {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{step}",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": 400.0,
            "args": {"External id": corr},
        }
        for _layer in range(40):
            for name in ("aten::mm", "aten::add", "aten::gelu"):
                d = rng.uniform(1.0, 9.0)
                yield {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": name,
                    "pid": 1,
                    "tid": 1,
                    "ts": ts,
                    "dur": d,
                    "args": {
                        "External id": corr,
                        "Input Dims": [[1024, 4096], [4096, 4096]],
                        "Input type": ["c10::BFloat16", "c10::BFloat16"],
                        "Sequence number": corr,
                    },
                }
                yield {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": ts + 1,
                    "dur": 3.0,
                    "args": {"External id": corr, "correlation": corr},
                }
                kernel = f"void cutlass::Kernel<sm90_{name[6:]}_bf16_128x128>(Params)"
                yield {
                    "ph": "X",
                    "cat": "kernel",
                    "name": kernel,
                    "pid": 0,
                    "tid": 7,
                    "ts": ts + 5,
                    "dur": d,
                    "args": {
                        "queued": 0,
                        "device": 0,
                        "context": 1,
                        "stream": 7,
                        "correlation": corr,
                        "registers per thread": 168,
                        "shared memory": 232448,
                        "grid": [132, 1, 1],
                        "block": [384, 1, 1],
                        "est. achieved occupancy %": 12,
                    },
                }
                ts += d + 1.0
                corr += 1
            yield {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)",
                "pid": 0,
                "tid": 20,
                "ts": ts,
                "dur": 25.0,
                "args": {
                    "device": 0,
                    "stream": 20,
                    "correlation": corr,
                    "Collective name": "allreduce",
                    "In msg nelems": 4194304,
                    "Out msg nelems": 4194304,
                    "Group size": 8,
                    "dtype": "BFloat16",
                },
            }
            yield {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": "Memcpy DtoD (Device -> Device)",
                "pid": 0,
                "tid": 7,
                "ts": ts,
                "dur": 2.0,
                "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 65536},
            }
            corr += 1


def write_trace(path: Path, mb: float, gz: bool) -> int:
    """A Kineto-shaped trace of about ``mb`` MB (uncompressed); returns its uncompressed size in bytes."""
    rng = random.Random(0)
    target, written = mb * 1e6, 0
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        head = json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}})
        f.write(head[:-1] + ', "traceEvents": [\n')
        written += len(head) + 20
        first = True
        for ev in synthetic_events(rng):
            line = ("" if first else ",\n") + json.dumps(ev)
            f.write(line)
            written += len(line)
            first = False
            if written >= target:
                break
        f.write("\n]}\n")
    return written


def run(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="trace size, MB of JSON text")
    ap.add_argument("--gzip", action="store_true", help="write the trace gzip-compressed")
    ap.add_argument("--compare", action="store_true", help="also json.load the whole file (non-streaming reference)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("bench.json.gz" if args.gzip else "bench.json")
        size = write_trace(path, args.mb, args.gzip)
        per = 100e6 / size
        disk = f"{path.stat().st_size / 1e6:.0f} MB on disk" + (", gzip" if args.gzip else "")
        print(f"trace: {size / 1e6:.0f} MB of JSON ({disk})")
        modes = ["commtax"] + (["json.load"] if args.compare else [])
        for mode in modes:
            r = run(mode, path)
            grown = (r["peak_kib"] - r["base_kib"]) / 1024
            print(
                f"{mode:>9}: {r['cpu_seconds'] * per:6.2f} CPU s ({r['seconds'] * per:.2f} s wall) per 100 MB; "
                f"peak memory +{grown * per:6.1f} MiB per 100 MB (+{grown:.1f} MiB over a "
                f"{r['base_kib'] / 1024:.0f} MiB baseline for the whole file)"
            )


if __name__ == "__main__":
    main()
