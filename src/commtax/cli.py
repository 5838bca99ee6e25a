"""The ``commtax`` command: thin typer sub-commands over the library API.

Bad input prints one line naming the field and the fix and exits 2 — never a traceback.
Nothing on the estimate path imports torch or matplotlib.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from commtax.atomic import strict_json, write_atomic
from commtax.errors import EXIT_INTERRUPTED, SpecError, os_error_line

app = typer.Typer(
    name="commtax",
    help="Predict, simulate, measure and reduce the communication tax of distributed LLM training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 1

CatalogOpt = Annotated[Optional[Path], typer.Option("--catalog", help="YAML file adding or overriding catalog entries")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
PlotOpt = Annotated[Optional[Path], typer.Option("--plot", help="also draw a PNG chart to this file")]


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def user_errors(fn: Callable) -> Callable:
    """Map bad input (SpecError, OSError on user files) to one line and exit code 2; Ctrl-C/SIGTERM to exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            fail(str(e))
        except OSError as e:
            fail(os_error_line(e))
        except KeyboardInterrupt as e:
            fail(f"interrupted{f' ({e})' if str(e) else ''}", EXIT_INTERRUPTED)

    return wrapper


def emit_json(data: Any, out: Path | None = None) -> None:
    text = strict_json(data, indent=2)
    if out is not None:
        write_atomic(out, text + "\n")
    else:
        sys.stdout.write(text + "\n")


# ----------------------------------------------------------------------------- estimate
@app.command()
@user_errors
def estimate(
    job_file: Annotated[Path, typer.Argument(help="job YAML: model, cluster, plan, training")],
    json_out: JsonOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="also write the JSON breakdown to this file")] = None,
    plot: PlotOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """Predict one training step: step time, MFU, comm tax, breakdown, memory."""
    from commtax.estimate import estimate as run_estimate
    from commtax.report.table import memory_table, render_breakdown
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    b = run_estimate(job)
    if out is not None:
        emit_json(b.to_dict(), out)
    if plot is not None:
        from commtax.report.plots import breakdown_plot

        breakdown_plot([(job_file.stem, b)], plot)
    if json_out:
        emit_json(b.to_dict())
    else:
        render_breakdown(b, console, job.cluster.gpu.mem_GiB)
    if not b.fits:
        if json_out:
            raise typer.Exit(EXIT_INFEASIBLE)
        console.print(memory_table(b, job.cluster.gpu.mem_GiB))
        fail(
            f"plan does not fit GPU memory: {b.memory_gib_per_gpu['total']:.1f} GiB needed per GPU, "
            f"{job.cluster.gpu.mem_GiB:.1f} GiB on {job.cluster.gpu.name}; try a higher plan.zero, "
            "plan.recompute: full, a smaller plan.micro_batch, or larger tp/pp (commtax search finds one)",
            EXIT_INFEASIBLE,
        )


# ----------------------------------------------------------------------------- validate
@app.command()
@user_errors
def validate(
    csv_file: Annotated[Path, typer.Argument(help="published measurements (runs or collectives CSV)")],
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    max_mape: Annotated[
        Optional[float], typer.Option("--max-mape", help="exit 1 when the MAPE (%) is above this")
    ] = None,
    plot: PlotOpt = None,
) -> None:
    """Predict published measurements and report the error per row and the MAPE."""
    from rich.progress import Progress

    from commtax.validate import read_rows
    from commtax.validate import validate as run_validate

    if max_mape is not None and not (0 <= max_mape < float("inf")):
        raise SpecError(f"--max-mape: a percentage ≥ 0, got {max_mape}")
    n = len(read_rows(csv_file))
    with Progress(console=err_console, transient=True, disable=json_out or not err_console.is_terminal) as prog:
        task = prog.add_task("predicting", total=n)
        report = run_validate(csv_file, catalog, progress=lambda: prog.advance(task))
    if plot is not None:
        from commtax.report.plots import parity_plot

        parity_plot(report, plot)
    if json_out:
        emit_json(report.to_dict())
    else:
        console.print(_validation_table(report))
        for name, value in report.subsets.items():
            console.print(f"MAPE {name}: {value:.1f}%")
        console.print(f"[bold]MAPE ({report.kind}, {sum(r.error_pct is not None for r in report.rows)} rows): "
                      f"{report.mape_pct:.1f}%[/bold]" if report.mape_pct is not None else "no row could be predicted")
    if max_mape is not None and (report.mape_pct is None or not report.mape_pct <= max_mape):
        fail(f"MAPE {report.mape_pct}% is above --max-mape {max_mape}%", EXIT_INFEASIBLE)


def _validation_table(report) -> Table:
    runs = report.kind == "runs"
    t = Table(title=f"Validation: {report.kind}", header_style="bold")
    t.add_column("id")
    t.add_column("measured" + (" tok/s/GPU" if runs else " busbw GB/s"), justify="right")
    t.add_column("predicted", justify="right")
    t.add_column("error", justify="right")
    t.add_column("chosen / note")
    for r in report.rows:
        if r.predicted is None:
            t.add_row(r.id, f"{r.measured}", "—", "—", f"[yellow]{r.reason}[/yellow]")
            continue
        note = ", ".join(f"{k}={v}" for k, v in r.chosen.items())
        if runs:
            note = "; ".join(x for x in (note, r.extra.get("generation", "")) if x)
        else:
            note = r.extra.get("algorithm", "")
        t.add_row(r.id, f"{r.measured:,.2f}", f"{r.predicted:,.2f}", f"{r.error_pct:+.1f}%", note)
    return t


# ----------------------------------------------------------------------------- collective
@app.command()
@user_errors
def collective(
    op: Annotated[str, typer.Argument(help="all_reduce | all_gather | reduce_scatter | broadcast | all_to_all | send_recv")],
    size: Annotated[str, typer.Option("--bytes", help="message size (nccl-tests convention): 4096, 16MiB, 1GB")] = "256MiB",
    cluster_file: Annotated[
        Optional[Path], typer.Option("--cluster", help="cluster YAML, or a job file (its cluster: section)")
    ] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", help="GPUs in the group (default: the whole cluster)")] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU catalog id (without --cluster)")] = "h100-sxm5-80gb",
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="NVLink domain size (without --cluster)")] = 8,
    intra: Annotated[str, typer.Option("--intra", help="intra-node link id (without --cluster)")] = "nvlink4",
    inter: Annotated[str, typer.Option("--inter", help="network id (without --cluster)")] = "ib-ndr",
    nics_per_node: Annotated[int, typer.Option("--nics-per-node")] = 8,
    algorithm: Annotated[
        Optional[str], typer.Option("--algorithm", help="force ring, tree, recursive_doubling, hierarchical or nvls")
    ] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="nccl-tests-style table from 8 B to --bytes, ×2 per row")] = False,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
) -> None:
    """Predict one collective: time, algbw, busbw, algorithm and the link that bounds it."""
    from commtax.collectives import ALGORITHMS, OPS, collective_cost
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster
    from commtax.topology import placement
    from commtax.units import GB, parse_bytes

    if op not in OPS:
        raise SpecError(f"op: unknown collective {op!r}; choose one of {', '.join(OPS)}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise SpecError(f"--algorithm: unknown {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if gpus is not None and gpus < 1:
        raise SpecError(f"--gpus: a group has at least 1 GPU, got {gpus}")
    if algorithm is not None and op in ("all_to_all", "send_recv"):
        raise SpecError(f"--algorithm: {op} has one algorithm (pairwise exchange); drop --algorithm")
    try:
        nbytes = parse_bytes(size)
    except ValueError as e:
        raise SpecError(f"--bytes: {e}") from None
    cat = load_catalog(catalog)
    if cluster_file is not None:
        raw = resolve_cluster(str(cluster_file), cat, field="--cluster")
    else:
        raw = resolve_cluster(
            {"gpu": gpu, "num_gpus": gpus_per_node if gpus is None else gpus, "gpus_per_node": gpus_per_node,
             "intra_node": intra, "inter_node": inter, "nics_per_node": nics_per_node}, cat, field="cluster")
    cluster: Cluster = build(Cluster, raw, "cluster")
    n = cluster.num_gpus if gpus is None else gpus
    if n < 1 or n > cluster.num_gpus:
        raise SpecError(f"--gpus: must be between 1 and the cluster's num_gpus ({cluster.num_gpus}), got {n}")
    if n > cluster.gpus_per_node and n % cluster.gpus_per_node:
        raise SpecError(f"--gpus: a group spanning nodes must be a multiple of gpus_per_node ({cluster.gpus_per_node})")
    place = placement(cluster, n, 1, op)
    sizes = [nbytes]
    if sweep:
        sizes, s = [], 8.0
        while s <= nbytes:
            sizes.append(s)
            s *= 2
    rows = []
    for s in sizes:
        try:
            c = collective_cost(op, s, place, algorithm)
        except ValueError as e:
            raise SpecError(f"--algorithm: {e}") from None
        rows.append({"op": op, "message_bytes": s, "gpus": n, "time_s": c.time_s, "algorithm": c.algorithm,
                     "bottleneck": c.bottleneck, "algbw_GBps": c.algbw_bytes_per_s / GB,
                     "busbw_GBps": c.busbw_bytes_per_s / GB})
    if json_out:
        emit_json(rows if sweep else rows[0])
        return
    t = Table(title=f"{op} over {n} GPUs ({place.per_node} per node) — predicted", header_style="bold")
    for col in ("size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm", "bound by"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['message_bytes']:.0f}", f"{r['time_s'] * 1e6:.1f}", f"{r['algbw_GBps']:.2f}",
                  f"{r['busbw_GBps']:.2f}", r["algorithm"], r["bottleneck"])
    console.print(t)


# ----------------------------------------------------------------------------- demo
@app.command()
@user_errors
def demo(json_out: JsonOpt = False, plot: PlotOpt = None) -> None:
    """The seed article's LLaMA-2 70B / 256-GPU scenario, recomputed next to the article's numbers."""
    from commtax.demo import ARTICLE, REASONS, communication_wall, seed_rows

    rows = seed_rows()
    wall = communication_wall(rows[0].job)
    if plot is not None:
        from commtax.report.plots import breakdown_plot

        breakdown_plot([(r.name, r.breakdown) for r in rows], plot, "Seed scenario: where the step goes")
    if json_out:
        emit_json({
            "scenario": "llama2-70b, 1024×4096 tokens per step, TP=8 PP=4 DP=8, 256 GPUs",
            "clusters": [{"name": r.name, "note": r.note, "compute_s": r.compute_s, "comm_s": r.comm_s,
                          "article": ARTICLE[r.name].__dict__, "tokens_per_day": r.tokens_per_day,
                          "breakdown": r.breakdown.to_dict()} for r in rows],
            "reasons": REASONS,
            "communication_wall": [w.__dict__ for w in wall],
        })
        return
    console.print("[bold]Seed scenario:[/bold] LLaMA-2 70B, 4.19M tokens per step (1024 × 4096), "
                  "TP=8 PP=4 DP=8, 256 GPUs, bf16, ZeRO-1, selective recompute")
    t = Table(title="commtax vs the seed article (one training step)", header_style="bold")
    t.add_column("metric")
    for r in rows:
        t.add_column(f"{r.name}\ncommtax", justify="right")
        t.add_column("article", justify="right", style="dim")
    metrics = [
        ("compute s", lambda r: f"{r.compute_s:.1f}", lambda a: f"{a.compute_s:.2f}"),
        ("comm s (link time)", lambda r: f"{r.comm_s:.1f}", lambda a: f"{a.comm_s:.2f}"),
        ("comm share", lambda r: f"{100 * r.breakdown.comm_share:.0f}%", lambda a: f"{100 * a.comm_tax:.0f}%"),
        ("comm tax (exposed)", lambda r: f"{100 * r.breakdown.comm_tax:.0f}%", lambda a: "—"),
        ("step s", lambda r: f"{r.breakdown.step_time_s:.1f}", lambda a: "—"),
        ("MFU", lambda r: f"{100 * r.breakdown.mfu:.0f}%", lambda a: "—"),
        ("tokens/day", lambda r: f"{r.tokens_per_day / 1e9:.1f}B", lambda a: f"{a.tokens_per_day / 1e9:.1f}B"),
    ]
    for label, ours, theirs in metrics:
        cells = []
        for r in rows:
            cells += [ours(r), theirs(ARTICLE[r.name])]
        t.add_row(label, *cells)
    console.print(t)
    for r in rows:
        if r.note != "article's plan as given":
            console.print(f"  {r.name}: {r.note}")
    console.print("[bold]Why the numbers differ[/bold]")
    for key, reason in REASONS.items():
        console.print(f"  • {key}: {reason}")
    w = Table(title=f"The communication wall ({rows[0].name}, fixed network)", header_style="bold")
    for col in ("compute speed-up", "step s", "step speed-up", "comm tax"):
        w.add_column(col, justify="right")
    for row in wall:
        w.add_row(f"{row.compute_speedup:g}×", f"{row.step_s:.2f}", f"{row.speedup:.2f}×", f"{100 * row.comm_tax:.0f}%")
    console.print(w)


def _register_dist() -> None:
    from commtax.measure.cli import bench_app, calibrate_command, cluster_app

    app.add_typer(cluster_app, name="cluster", help="Emulated multi-node cluster: network namespaces + tc")
    app.add_typer(bench_app, name="bench", help="Measure collectives, p2p copies and GEMMs (torch.distributed)")
    app.command("calibrate")(calibrate_command)


def _register_sim() -> None:
    from commtax.sim.cli import register

    register(app)


def _register_planning() -> None:
    from commtax.planning_cli import register

    register(app)


def register_commands() -> None:
    """Commands that live with their own stage of the pipeline (simulator, planning, real communication).

    Their modules import nothing heavy at import time (torch and matplotlib load inside the commands).
    """
    for register in (_register_sim, _register_planning, _register_dist):
        register()


CORE_COMMANDS = {"estimate", "validate", "collective", "demo"}


def main() -> None:
    # the core commands skip importing the other stages, so `commtax estimate` starts instantly
    from commtax import signals

    signals.install()  # SIGTERM/SIGHUP clean up like Ctrl-C (temp files, workers, launched ranks), exit 130
    if len(sys.argv) < 2 or sys.argv[1] not in CORE_COMMANDS:
        register_commands()
    app()


if __name__ == "__main__":
    main()
