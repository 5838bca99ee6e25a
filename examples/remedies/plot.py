"""Figures of examples/remedies/run.sh: loss curves per hook, and step time vs link rate per hook.

python plot.py RESULTS_DIR      # writes loss_curves.png and step_vs_link.png there
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RATES = {"100mbit": 100, "300mbit": 300, "1gbit": 1000}


def label(r: dict) -> str:
    return r["hook"] + (" +EF" if r.get("error_feedback") else "")


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def loss_curves(d: Path) -> None:
    recs = load(d / "quality.json") + load(d / "quality_ef.json")
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(11, 4))
    for r in recs:
        style = "--" if r.get("error_feedback") else "-"
        for a in (ax, zoom):
            a.plot(r["loss_curve"], style, label=f"{label(r)}: {r['loss']:.3f}")
    ax.set(xlabel="step", ylabel="training loss (nats)", title="bench ddp quality run (SGD, seed 0, 2 ranks)")
    n = len(recs[0]["loss_curve"]) if recs else 0
    zoom.set(xlim=(n * 0.6, n), ylim=(1.70, 2.3), xlabel="step", title="last 40% (final loss in legend)")
    zoom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d / "loss_curves.png", dpi=120)


def step_vs_link(d: Path) -> None:
    by_label: dict[str, list[tuple[float, dict]]] = {}
    for rate, mbit in RATES.items():
        for r in load(d / f"ddp_{rate}.json"):  # the error-feedback runs are in the table
            by_label.setdefault(label(r), []).append((mbit, r))
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, pts) in enumerate(sorted(by_label.items())):
        pts.sort(key=lambda p: p[0])
        color = f"C{i % 10}"
        x = [p[0] for p in pts]
        ax.plot(x, [p[1]["step_time_s"] * 1e3 for p in pts], "o-", color=color, label=f"{name} measured")
        ax.plot(x, [p[1]["predicted_step_time_s"] * 1e3 for p in pts], ":", color=color)
    ax.set(
        xscale="log",
        xlabel="link rate per node (Mbit/s, tc tbf)",
        ylabel="step time (ms)",
        title="bench ddp, 2 nodes × 1 rank: measured (o-) vs estimate, codec inside (dotted)",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(d / "step_vs_link.png", dpi=120)


def table(d: Path) -> str:
    """The markdown table of docs/remedies.md: measured vs predicted per link rate, run and hook (codec and error
    feedback inside the estimate: ``predicted_codec_s``), the codec predicted vs timed alone, exposed communication,
    and each hook's step relative to the uncompressed one of the same run, measured vs predicted."""
    rows = [
        "| link | run | hook | step ms measured | estimate | err | codec ms predicted / timed alone | "
        "exposed comm ms measured / estimate | compute-only ms measured / estimate | step vs none: measured / "
        "predicted | wire MB/step |",
        "|" + "---|" * 11,
    ]
    within = total = 0
    for rate in RATES:
        for run, files in (("1", (f"ddp_{rate}.json", f"ddp_ef_{rate}.json")), ("2", (f"ddp_{rate}_rep2.json",))):
            recs = [r for f in files for r in load(d / f)]
            none = next((r for r in recs if r["hook"] == "none"), None)
            for r in recs:
                m, p = r["step_time_s"], r["predicted_step_time_s"]
                within, total = within + (abs(p / m - 1) <= 0.10), total + 1
                alone = "—" if r.get("codec_s") is None else f"{r['codec_s'] * 1e3:.0f}"
                codec = f"{r.get('predicted_codec_s', 0.0) * 1e3:.0f} / {alone}"
                rel = "—"
                if none is not None:
                    rel = f"{m / none['step_time_s'] - 1:+.0%} / {p / none['predicted_step_time_s'] - 1:+.0%}"
                pb = r["predicted_breakdown_s"]
                rows.append(
                    f"| {rate} | {run} | {label(r)} | {m * 1e3:.0f} | {p * 1e3:.0f} | {p / m - 1:+.0%} | "
                    f"{codec} | {r['exposed_comm_s'] * 1e3:.0f} / {r['predicted_exposed_comm_s'] * 1e3:.0f} | "
                    f"{r['compute_step_s'] * 1e3:.0f} / {(pb['compute'] + pb['optimizer']) * 1e3:.0f} | "
                    f"{rel} | {r['wire_bytes_per_step'] / 1e6:.3f} |"
                )
    return "\n".join(rows) + f"\n\nWithin 10% of the measurement: {within} of {total} rows."


def knobs_table(d: Path) -> str:
    """The knobs run (knobs.sh): bucket size and accumulation, measured vs predicted."""
    rows = [
        "| knobs | hook | step ms measured / estimate | err | exposed comm ms measured / estimate | "
        "compute-only ms measured / estimate |",
        "|---|---|---|---|---|---|",
    ]
    for tag, name in (
        ("bucketmb25", "bucket 25 MiB (one bucket)"),
        ("bucketmb1", "bucket 1 MiB"),
        ("accumulate4", "accumulate 4 (4× the tokens per step)"),
    ):
        for i, r in enumerate(load(d / f"knobs_{tag}.json")):
            m, p, pb = r["step_time_s"], r["predicted_step_time_s"], r["predicted_breakdown_s"]
            rows.append(
                f"| {name if i == 0 else ''} | {label(r)} | {m * 1e3:.0f} / {p * 1e3:.0f} | {p / m - 1:+.0%} | "
                f"{r['exposed_comm_s'] * 1e3:.0f} / {r['predicted_exposed_comm_s'] * 1e3:.0f} | "
                f"{r['compute_step_s'] * 1e3:.0f} / {(pb['compute'] + pb['optimizer']) * 1e3:.0f} |"
            )
    return "\n".join(rows)


def quality_table(d: Path) -> str:
    recs = load(d / "quality.json") + load(d / "quality_ef.json")
    none = next(r for r in recs if r["hook"] == "none" and not r.get("error_feedback"))
    rows = ["| hook | loss after 40 steps | vs fp32 | wire bytes/step |", "|---|---|---|---|"]
    for r in recs:
        rows.append(
            f"| {label(r)} | {r['loss']:.4f} | {r['loss'] - none['loss']:+.4f} | {r['wire_bytes_per_step']:.0f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results")
    loss_curves(out)
    step_vs_link(out)
    (out / "table.md").write_text(table(out) + "\n\n" + knobs_table(out) + "\n\n" + quality_table(out) + "\n")
    print(f"wrote {out / 'loss_curves.png'}, {out / 'step_vs_link.png'} and {out / 'table.md'}")
