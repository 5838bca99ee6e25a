"""The generated blocks of the README and docs/catalog.md: the catalog tables (from the catalog), the worked
example (the output of ``commtax estimate`` at 80 columns), the MoE example's table and the accuracy tables, so
the docs cannot drift from the code. Each block lives in one file (``BLOCK_FILES``).

    python -m commtax.report.readme                     # rewrite every block of README.md and docs/catalog.md
    python -m commtax.report.readme README.md           # the blocks of one file
    python -m commtax.report.readme --check README.md   # exit 1 if one differs (tests/test_readme.py does this)

Catalog numbers are printed as the YAML gives them (``0.7``, ``989.4``); each source is cut to 80 characters.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from commtax.spec import Model, _builtin_catalog, build

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = "examples/llama2-70b-h100.yaml"
SOURCE_CHARS = 80


def begin(name: str) -> str:
    return f"<!-- generated: {name} (make readme; do not edit by hand) -->"


def end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


def _num(x: float) -> str:
    return f"{x:g}"


def _source(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= SOURCE_CHARS else text[:SOURCE_CHARS] + "…"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def gpu_rows(gpus: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name, g in gpus.items():
        peak = g["peak_tflops"]
        eff = ", ".join(f"{k} {_num(v)}" for k, v in g.get("matmul_efficiency", {}).items())
        bf16 = _num(peak["bf16"]) if "bf16" in peak else f"— (fp16 {_num(peak['fp16'])})"  # Volta: no bf16
        rows.append(
            [
                f"`{name}`",
                bf16,
                _num(peak["fp8"]) if "fp8" in peak else "—",
                _num(g["mem_GiB"]),
                _num(g["mem_bw_GBps"]),
                _num(g["tdp_W"]),
                eff,
                _source(g["source"]),
            ]
        )
    return rows


def link_rows(links: dict[str, dict]) -> list[list[str]]:
    return [
        [
            f"`{name}`",
            ln["kind"],
            _num(ln["bw_GBps"]),
            _num(ln["efficiency"]),
            _num(ln["latency_us"]),
            "yes" if ln.get("nvls") else "no",
            _source(ln["source"]),
        ]
        for name, ln in links.items()
    ]


def network_rows(nets: dict[str, dict]) -> list[list[str]]:
    return [
        [f"`{name}`", _num(n["bw_Gbps"]), _num(n["efficiency"]), _num(n["latency_us"]), _source(n["source"])]
        for name, n in nets.items()
    ]


def model_rows(models: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name, raw in models.items():
        m = build(Model, {**raw, "name": name}, f"model.{name}")
        rows.append(
            [
                f"`{name}`",
                str(m.layers),
                str(m.hidden),
                str(m.heads),
                str(m.kv_heads_),
                str(m.ffn),
                str(m.vocab),
                "yes" if m.gated_mlp else "no",
                f"{m.params() / 1e9:.1f}B",
            ]
        )
    return rows


def price_rows() -> list[list[str]]:
    from commtax.decide.cost import load_prices

    p = load_prices()
    return [
        [
            f"`{name}`",
            f"{g.purchase_usd:,.0f}",
            f"{g.rent_usd_per_gpu_hour:.2f}",
            _num(g.typical_W),
            f"{p.node(name).purchase_usd:,.0f}" if name in p.nodes else "—",
            g.date,
        ]
        for name, g in p.gpus.items()
    ]


def catalog_tables() -> str:
    c = _builtin_catalog()
    parts = [
        "**GPUs** (dense peaks, TFLOP/s; memory as the driver reports it)",
        "",
        *_table(
            ["id", "bf16", "fp8", "memory GiB", "HBM GB/s", "TDP W", "matmul efficiency", "source"], gpu_rows(c["gpu"])
        ),
        "",
        "**Scale-up links** (per GPU, per direction)",
        "",
        *_table(["id", "kind", "GB/s", "efficiency", "latency µs", "NVLS", "source"], link_rows(c["intra_node"])),
        "",
        "**Networks** (per NIC, per direction)",
        "",
        *_table(["id", "Gb/s", "efficiency", "latency µs", "source"], network_rows(c["inter_node"])),
        "",
        "**Models**",
        "",
        *_table(
            ["id", "layers", "hidden", "heads", "kv heads", "FFN", "vocab", "gated MLP", "parameters"],
            model_rows(c["model"]),
        ),
        "",
        "**Prices** (`catalog/prices.yaml`, each with its sources; override with `--prices FILE`)",
        "",
        *_table(["GPU", "purchase $", "rent $/GPU-h", "typical W", "node $ (less GPUs)", "read"], price_rows()),
    ]
    return "\n".join(parts)


def estimate_example() -> str:
    """``commtax estimate`` of the seed scenario, as a user sees it at 80 columns."""
    from rich.console import Console

    from commtax.report.table import render_breakdown
    from commtax.schedule.analytical import estimate
    from commtax.spec import load_job

    job = load_job(REPO / EXAMPLE)
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    render_breakdown(estimate(job), console, job.cluster.gpu.mem_GiB)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(["```text", f"$ commtax estimate {EXAMPLE}", *lines, "```"])


MOE_EXAMPLE = "examples/moe/deepseek-v3-h800.yaml"


def moe_variants() -> list[tuple[str, object]]:
    """The MoE example (DeepSeek-V3 as its report ran it) and the same job changed one field at a time: EP inside
    the node, NCCL's all-to-all instead of DeepEP (docs/moe.md's table has these rows and 1F1B)."""
    from commtax.spec import job_with, load_job

    job = load_job(REPO / MOE_EXAMPLE)
    return [
        ("EP64 over 8 nodes, DeepEP (the report's)", job),
        ("EP8 inside the node, DeepEP", job_with(job, ep=8)),
        ("EP64 over 8 nodes, NCCL all-to-all", job_with(job, moe_dispatcher="alltoall")),
    ]


def moe_example() -> str:
    """The README's MoE table: ``estimate`` of each of ``moe_variants``, and one sentence read off it."""
    from commtax.schedule.analytical import estimate
    from commtax.workload.moe import local_experts

    runs = [(name, job, estimate(job)) for name, job in moe_variants()]
    rows = [
        [
            name,
            f"{b.step_time_s:.2f}",
            f"{b.tokens_per_s_per_gpu:,.0f}",
            f"{b.breakdown_s['ep_exposed']:.2f}",
            f"{b.comm_tax:.1%}",
            f"{b.memory_gib_per_gpu['total']:.1f}",
            "yes" if b.fits else "no",
        ]
        for name, _, b in runs
    ]
    (_, job, ours), (_, inside_job, inside), (_, _, nccl) = runs
    mem = job.cluster.gpu.mem_GiB

    def hidden(b) -> float:  # the share of the all-to-all's wire time the other direction's compute hides
        return 1.0 - b.breakdown_s["ep_exposed"] / b.comm_time_s["ep"]

    sentence = (
        f"EP inside the node cuts the exposed all-to-all from {ours.breakdown_s['ep_exposed']:.2f} s to "
        f"{inside.breakdown_s['ep_exposed']:.2f} s but holds {local_experts(inside_job)} experts per GPU, "
        f"{inside.memory_gib_per_gpu['total']:.0f} GiB of {mem:g}; NCCL's all-to-all sends each of a token's "
        f"{job.model.top_k} copies on its own, {nccl.comm_time_s['ep'] / ours.comm_time_s['ep']:.1f}× DeepEP's "
        f"wire time, of which DualPipe hides {hidden(nccl):.0%} (DeepEP's: {hidden(ours):.0%}): comm tax "
        f"{ours.comm_tax:.1%} → {nccl.comm_tax:.1%}."
    )
    header = ["plan", "step s", "tokens/s/GPU", "EP exposed s", "comm tax", "memory GiB", "fits"]
    return "\n".join([*_table(header, rows), "", sentence])


VALIDATION = REPO / "validation"  # shipped with the repo (a copy of ../shared/validation)
DENSE_RUNS_FILES = ("public_runs.csv", "public_runs_more.csv")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}%"


def accuracy_tables() -> str:
    """``commtax validate`` of the public dense runs, both files together (with ``--loso``), and the collectives,
    as README tables."""
    from commtax.decide.validate import validate, validate_files

    runs = validate_files([VALIDATION / f for f in DENSE_RUNS_FILES], loso=True).union
    rows = [[name, str(runs.rows_by_source[name]), _pct(mape)] for name, mape in runs.by_source.items()]
    n_ok = sum(r.error_pct is not None for r in runs.rows)
    fitted_rows = {row for rows_of in runs.fitted.values() for row in rows_of}
    n_unfitted = sum(1 for r in runs.rows if r.error_pct is not None and r.id not in fitted_rows)
    rows += [
        ["**all rows**", str(n_ok), f"**{_pct(runs.mape_pct)}**"],
        [
            "**averaged by source** (each source weighs the same)",
            str(len(runs.by_source)),
            f"**{_pct(runs.source_avg_mape_pct)}**",
        ],
        [
            "**leave-one-source-out**, averaged by source (each source with the constants fitted without it)",
            str(len(runs.by_source)),
            f"**{_pct(runs.loso_mape_pct)}**",
        ],
        ["rows no constant was fitted on", str(n_unfitted), _pct(runs.unfitted_mape_pct)],
        ["rows refused", str(len(runs.refused)), "—"],
        [
            "80% interval covers (`coverage_80`, each source's interval fitted without it)",
            str(n_ok),
            _pct(100 * runs.coverage_80 if runs.coverage_80 is not None else None),
        ],
    ]
    coll = validate(VALIDATION / "public_collectives.csv")
    band_names = {
        "messages_lt_1MiB": "< 1 MiB",
        "messages_1MiB_to_64MiB": "1 MiB to 64 MiB",
        "messages_ge_64MiB": "≥ 64 MiB",
    }
    bands = [[band_names.get(name, name), _pct(v)] for name, v in coll.subsets.items()]
    bands.append([f"all {len(coll.rows)} rows", _pct(coll.mape_pct)])
    return "\n".join(
        [
            "Training runs (`public_runs.csv` and `public_runs_more.csv` together, tokens/s per GPU):",
            "",
            *_table(["source", "rows", "MAPE"], rows),
            "",
            f"Leave-one-source-out: {runs.loso_note}.",
            "",
            "Collectives (`public_collectives.csv`, busbw) by message size:",
            "",
            *_table(["messages", "MAPE"], bands),
        ]
    )


BLOCKS = {
    "catalog tables": catalog_tables,
    "worked example": estimate_example,
    "moe worked example": moe_example,
    "accuracy tables": accuracy_tables,
}
BLOCK_FILES = {
    "catalog tables": "docs/catalog.md",
    "worked example": "README.md",
    "moe worked example": "README.md",
    "accuracy tables": "README.md",
}


def section(readme: str, name: str) -> str:
    """The generated block ``name`` of the README (between its markers), or '' when the markers are missing."""
    if begin(name) not in readme or end(name) not in readme:
        return ""
    return readme.split(begin(name), 1)[1].split(end(name), 1)[0].strip("\n")


def rewrite(readme: str) -> str:
    """Every block whose markers the text holds, made anew."""
    for name, make in BLOCKS.items():
        if begin(name) not in readme or end(name) not in readme:
            continue
        head, rest = readme.split(begin(name), 1)
        readme = f"{head}{begin(name)}\n{make()}\n{end(name)}{rest.split(end(name), 1)[1]}"
    return readme


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [Path(a) for a in args if a != "--check"] or sorted({REPO / f for f in BLOCK_FILES.values()})
    status = 0
    for path in paths:
        text = path.read_text()
        names = [name for name in BLOCKS if begin(name) in text]
        missing = [n for n, f in BLOCK_FILES.items() if (REPO / f).resolve() == path.resolve() and n not in names]
        if missing:
            print(f"{path}: markers of {', '.join(missing)} not found")
            status = 1
        if check:
            stale = [name for name in names if section(text, name) != BLOCKS[name]()]
            print(f"{path}: " + (f"stale: {', '.join(stale)}; run without --check" if stale else "up to date"))
            status |= 1 if stale else 0
            continue
        path.write_text(rewrite(text))
        print(f"{path}: {', '.join(names)} rewritten from the code")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
