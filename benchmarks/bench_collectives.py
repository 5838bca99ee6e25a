"""Real collectives on an emulated cluster vs the cost model (needs root + netns + torch).

    sudo .venv/bin/python benchmarks/bench_collectives.py [--out-dir examples/emulated/results]

A. 4 nodes × 1 rank, 300 Mbit/s links: all_reduce, all_gather, reduce_scatter, 1–8 MiB,
   torch (gloo) and our ring, interleaved → model error before calibration; calibrate on
   that sweep (torch records); a second sweep → model error after calibration.
B. Same cluster, all_reduce 16 MiB: our ring's busbw / gloo's busbw, measured in one run.
C. 2 nodes × 4 ranks, loopback inside (GB/s) and 300 Mbit/s between nodes (> 10× slower):
   hierarchical vs flat ring all_reduce, measured and predicted.
Writes JSON, a summary and PNG figures to --out-dir.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from commtax.measure.calibrate import calibrate, compare, write_profile

PY = sys.executable
MiB = 2**20


def cli(*args: str) -> None:
    subprocess.run([PY, "-m", "commtax.cli.measure", *args], check=True)


def sweep(cluster: Path, out: Path, *bench_args: str) -> list[dict]:
    out.unlink(missing_ok=True)
    cli(
        "cluster",
        "run",
        "--cluster",
        str(cluster),
        "--",
        PY,
        "-m",
        "commtax.cli.measure",
        "bench",
        "collective",
        "--out",
        str(out),
        *bench_args,
    )
    return json.loads(out.read_text())


def with_cluster(path: Path, *up_args: str):
    cli("cluster", "up", *up_args, "--out", str(path))
    return yaml.safe_load(path.read_text())


def part_a_b(d: Path) -> dict:
    cpath = d / "cluster_4x1.yaml"
    spec = with_cluster(cpath, "--nodes", "4", "--ranks-per-node", "1", "--link", "300mbit")
    try:
        common = ["--ops", "all_reduce,all_gather,reduce_scatter", "--min", "1MiB", "--max", "8MiB", "--iters", "7"]
        a = sweep(cpath, d / "sweep_a.json", *common, "--impl", "torch,ring")
        profile = calibrate([r for r in a if r["impl"] == "torch"], spec, source="bench_collectives.py sweep A (torch)")
        write_profile(profile, d / "profile_4x1.yaml")
        b = sweep(cpath, d / "sweep_b.json", *common, "--impl", "torch")
        ratio_recs = sweep(
            cpath,
            d / "ring_vs_gloo.json",
            "--ops",
            "all_reduce",
            "--min",
            "16MiB",
            "--max",
            "16MiB",
            "--iters",
            "5",
            "--impl",
            "torch,ring",
        )
    finally:
        cli("cluster", "down", "--cluster", str(cpath))
    busbw = {r["impl"]: r["busbw_GBps"] for r in ratio_recs}
    return {
        "before": compare(a, spec),
        "after": compare(b, spec, profile),
        "profile": profile,
        "ring_vs_gloo_busbw_16MiB": {
            "torch_GBps": busbw["torch"],
            "ring_GBps": busbw["ring"],
            "ratio": busbw["ring"] / busbw["torch"],
        },
    }


def part_c(d: Path) -> dict:
    cpath = d / "cluster_2x4.yaml"
    spec = with_cluster(cpath, "--nodes", "2", "--ranks-per-node", "4", "--link", "300mbit")
    try:
        recs = sweep(
            cpath,
            d / "hier_vs_ring.json",
            "--ops",
            "all_reduce",
            "--min",
            "1MiB",
            "--max",
            "8MiB",
            "--iters",
            "5",
            "--impl",
            "ring,hier",
        )
    finally:
        cli("cluster", "down", "--cluster", str(cpath))
    rows = compare(recs, spec)
    by = {(r["impl"], r["message_bytes"]): r for r in rows}
    out = []
    for size in sorted({r["message_bytes"] for r in rows}):
        ring, hier = by[("ring", size)], by[("hier", size)]
        out.append(
            {
                "message_bytes": size,
                "ring_s": ring["measured_s"],
                "hier_s": hier["measured_s"],
                "measured_speedup": ring["measured_s"] / hier["measured_s"],
                "predicted_speedup": ring["predicted_s"] / hier["predicted_s"],
                "ring_error": ring["error"],
                "hier_error": hier["error"],
            }
        )
    return {
        "intra_bw_GBps": spec["intra_node"]["bw_GBps"],
        "inter_bw_GBps": spec["inter_node"]["bw_Gbps"] / 8,
        "rows": out,
    }


def figures(res: dict, d: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, impl, style in (("before", "torch", "o-"), ("before", "ring", "^:"), ("after", "torch", "s--")):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            pts = [r for r in res["ab"][key] if r["op"] == op and r["impl"] == impl]
            name = "gloo" if impl == "torch" else "our ring"
            note = " (gloo: all-reduce + slice)" if op == "reduce_scatter" and impl == "torch" else ""
            ax.plot(
                [p["message_bytes"] / MiB for p in pts],
                [100 * p["error"] for p in pts],
                style,
                label=f"{op}, {name}{note}, {key} calibration",
            )
    ax.axhspan(-10, 10, color="0.9")
    ax.axhspan(-5, 5, color="0.8")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message (MiB, nccl-tests size)")
    ax.set_ylabel("model − measured (%)")
    ax.set_title("4 nodes × 1 rank, 300 Mbit/s tbf links, gloo")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(d / "model_error_4x1.png", dpi=120)
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = res["c"]["rows"]
    sizes = [r["message_bytes"] / MiB for r in rows]
    ax.plot(sizes, [r["measured_speedup"] for r in rows], "o-", label="measured")
    ax.plot(sizes, [r["predicted_speedup"] for r in rows], "s--", label="predicted (collectives.py)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("all_reduce message (MiB)")
    ax.set_ylabel("ring time / hierarchical time")
    ax.set_ylim(1.0, 2.0)
    ax.set_title("2 nodes × 4 ranks: loopback inside, 300 Mbit/s between")
    ax.legend()
    fig.tight_layout()
    fig.savefig(d / "hier_vs_ring_2x4.png", dpi=120)


def load(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", type=Path, default=Path("examples/emulated/results"))
    ap.add_argument("--figures-only", action="store_true", help="redraw from an existing summary.json")
    args = ap.parse_args()
    d = args.out_dir
    d.mkdir(parents=True, exist_ok=True)
    if args.figures_only:
        res = load(d)
    else:
        res = {"ab": part_a_b(d), "c": part_c(d)}
        (d / "summary.json").write_text(json.dumps(res, indent=1))
    figures(res, d)
    for key in ("before", "after"):
        worst = {}
        for r in res["ab"][key]:
            if r["message_bytes"] >= MiB:
                k = f"{r['op']}/{r['impl']}"
                worst[k] = max(worst.get(k, 0.0), abs(r["error"]))
        print(f"worst |error| {key} calibration, ≥ 1 MiB:", {k: f"{v:.1%}" for k, v in worst.items()})
    print("ring / gloo busbw at 16 MiB:", res["ab"]["ring_vs_gloo_busbw_16MiB"])
    for r in res["c"]["rows"]:
        print(
            f"hier vs ring {r['message_bytes'] / MiB:g} MiB: measured ×{r['measured_speedup']:.2f}, "
            f"predicted ×{r['predicted_speedup']:.2f}"
        )


if __name__ == "__main__":
    main()
