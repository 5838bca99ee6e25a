"""``commtax search``, ``commtax compare``, ``commtax advise``: thin typer commands over search, cost,
compare and advise. Bad input prints ``error: <message>`` on stderr and exits 2 (no traceback)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from commtax.atomic import strict_json, write_atomic
from commtax.cli import user_errors
from commtax.errors import EXIT_INTERRUPTED, SpecError

EXIT_BAD_INPUT = 2
console = Console()
err_console = Console(stderr=True)

CatalogOpt = Annotated[Optional[Path], typer.Option("--catalog", help="YAML file adding or overriding catalog entries")]
PricesOpt = Annotated[Optional[Path], typer.Option("--prices", help="YAML file overriding catalog/prices.yaml entries")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="also write the JSON to this file")]
RentOpt = Annotated[bool, typer.Option("--rent", help="price by rental $/GPU-hour instead of owning (depreciation + power)")]
WorkersOpt = Annotated[Optional[int], typer.Option("--workers", min=1, help="processes for the search (default: 2 on large spaces)")]


def _field_opt(name: str, example: str) -> Any:
    return typer.Option(f"--{name}", help=f"values ({example}) or a range (a..b) for {name.replace('-', '_')}")


# the plan fields search and compare constrain: one declaration each, shared by both commands
TpOpt = Annotated[Optional[str], _field_opt("tp", "8 or 1,2,4")]
PpOpt = Annotated[Optional[str], _field_opt("pp", "4 or 1,2,4,8")]
CpOpt = Annotated[Optional[str], _field_opt("cp", "1")]
VpOpt = Annotated[Optional[str], _field_opt("vp", "1,2")]
MicroBatchOpt = Annotated[Optional[str], _field_opt("micro-batch", "1,2,4")]
ZeroOpt = Annotated[Optional[str], _field_opt("zero", "1 or 0..2")]
RecomputeOpt = Annotated[Optional[str], _field_opt("recompute", "none,selective")]
SequenceParallelOpt = Annotated[Optional[str], _field_opt("sequence-parallel", "true")]
GradCommDtypeOpt = Annotated[Optional[str], _field_opt("grad-comm-dtype", "bf16,fp8")]
PLAN_FIELDS = ("tp", "pp", "cp", "vp", "micro_batch", "zero", "recompute", "sequence_parallel", "grad_comm_dtype")


def _constraints(values: dict[str, Any]) -> dict[str, Optional[str]]:
    """The plan-field options of a command's arguments, by field name (for ``Space.parse``)."""
    return {f: values[f] for f in PLAN_FIELDS}


def _emit(data: Any, json_out: bool, out: Path | None) -> None:
    text = strict_json(data, indent=2) + "\n"
    if out is not None:
        write_atomic(out, text)
    if json_out:
        sys.stdout.write(text)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _render_breakdown(b: Any, mem_gib: float) -> None:
    try:
        from commtax.report.table import render_breakdown
    except ImportError:  # pragma: no cover - the lead's table module is optional
        t = Table(title="Step")
        t.add_column("component")
        t.add_column("seconds", justify="right")
        for k, v in b.breakdown_s.items():
            t.add_row(k, f"{v:.4f}")
        console.print(t)
        return
    render_breakdown(b, console, mem_gib)


def _progress(enabled: bool):
    """A rich progress bar over the search's bases, on stderr; a no-op when not a terminal."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    prog = Progress(TextColumn("searching plans"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True, disable=not (enabled and err_console.is_terminal))
    task = prog.add_task("search", total=None)

    def update(done: int, total: int) -> None:
        prog.update(task, completed=done, total=total)

    return prog, update


# ----------------------------------------------------------------------------- search
def plan_label(p: dict[str, Any]) -> str:
    """``tp8 pp4 cp1 dp8 vp1 mb1 z1 selective sp`` (grad dtype shown when not bf16)."""
    s = (f"tp{p['tp']} pp{p['pp']} cp{p['cp']} dp{p['dp']} vp{p['vp']} mb{p['micro_batch']} z{p['zero']} "
         f"{p['recompute']}{' sp' if p['sequence_parallel'] else ''}")
    return s + (f" g:{p['grad_comm_dtype']}" if p.get("grad_comm_dtype", "bf16") != "bf16" else "")


def _search_table(res: Any, mode: str, usd_per_s: float | None, n: int) -> Table:
    from commtax.cost import usd_per_B_tokens

    t = Table(title=f"Top {min(n, len(res.top))} of {int(res.fits.sum()):,} plans that fit (ranked by {res.rank_by})",
              header_style="bold")
    for col in ("#", "plan", "step s", "MFU", "tax", "bubble", "dp exp", "tp exp", "GiB"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    if usd_per_s is not None:
        t.add_column(f"$/B ({mode})", justify="right")
    for k, (p, b) in enumerate(res.top[:n], 1):
        parts = b.breakdown_s
        row = [str(k), plan_label(p), f"{b.step_time_s:.3f}", _pct(b.mfu), _pct(b.comm_tax),
               _pct(parts["pp_bubble"] / b.step_time_s), _pct(parts["dp_exposed"] / b.step_time_s),
               _pct(parts["tp_exposed"] / b.step_time_s), f"{b.memory_gib_per_gpu['total']:.1f}"]
        if usd_per_s is not None:
            row.append(f"{usd_per_B_tokens(usd_per_s, b.tokens_per_s):,.0f}")
        t.add_row(*row)
    return t


def search_command(
    job_file: Annotated[Path, typer.Argument(help="job YAML: model, cluster, plan, training")],
    tp: TpOpt = None,
    pp: PpOpt = None,
    cp: CpOpt = None,
    vp: VpOpt = None,
    micro_batch: MicroBatchOpt = None,
    zero: ZeroOpt = None,
    recompute: RecomputeOpt = None,
    sequence_parallel: SequenceParallelOpt = None,
    grad_comm_dtype: GradCommDtypeOpt = None,
    fix: Annotated[Optional[str], typer.Option("--fix", help="comma list of fields pinned to the job file's plan")] = None,
    rank: Annotated[str, typer.Option("--rank", help="step | cost | tokens_per_dollar")] = "step",
    top: Annotated[int, typer.Option("--top", min=1, help="plans to show")] = 5,
    rent: RentOpt = False,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="write every valid plan (CSV) here")] = None,
    workers: WorkersOpt = None,
    catalog: CatalogOpt = None,
    prices: PricesOpt = None,
) -> None:
    """Every valid plan for the job's model and cluster, ranked; the best ones with their breakdowns."""
    from commtax.cost import job_cluster_cost, load_prices
    from commtax.search import Space, search
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    space = Space.parse(
        _constraints(locals()),
        [f.strip() for f in fix.split(",") if f.strip()] if fix else [],
    )
    mode = "rented" if rent else "owned"
    usd_per_s = None
    price_error = None
    try:
        usd_per_s = job_cluster_cost(job, load_prices(prices)).usd_per_s(mode)
    except SpecError as e:
        if prices is not None or rank != "step":
            raise
        price_error = str(e)
    prog, update = _progress(not json_out)
    with prog:
        res = search(job, space, rank_by=rank, top=top, workers=workers, progress=update)
    data = res.to_dict()
    if usd_per_s is not None:
        for entry, (_, b) in zip(data["top"], res.top):
            entry["usd_per_B_tokens"] = usd_per_s * 1e9 / b.tokens_per_s
            entry["tokens_per_dollar"] = b.tokens_per_s / usd_per_s
        data["price_mode"] = mode
    if csv_out is not None:
        write_atomic(csv_out, res.to_csv())
    _emit(data, json_out, out)
    if json_out:
        _exit_if_interrupted(res.interrupted)
        return
    s = res.summary()
    console.print(
        f"{s['evaluated']:,} plans evaluated in {s['elapsed_s']:.2f} s ({s['plans_per_s']:,.0f} plans/s): "
        f"{s['valid']:,} valid, {s['fit']:,} fit memory, {s['do_not_fit']:,} do not fit, {s['invalid']:,} invalid",
        highlight=False,
    )
    for title, reasons in (("invalid", s["invalid_reasons"]), ("do not fit", s["do_not_fit_reasons"])):
        for why, count in list(reasons.items())[:4]:
            console.print(f"  {title}: {count:,} × {why}", highlight=False, markup=False)
    if res.interrupted:
        console.print("[yellow]interrupted: the best of the plans evaluated so far[/yellow]")
    for w in res.warnings:
        err_console.print(f"warning: {w}", highlight=False, markup=False)
    if price_error:
        console.print(f"(no $ column: {price_error})", highlight=False, markup=False)
    console.print(_search_table(res, mode, usd_per_s, top))
    best_plan, best = res.top[0]
    console.print(f"Best plan: {', '.join(f'{k}={v}' for k, v in best_plan.items())}", highlight=False)
    _render_breakdown(best, job.cluster.gpu.mem_GiB)
    _exit_if_interrupted(res.interrupted)


def _exit_if_interrupted(interrupted: bool) -> None:
    """Partial results were shown (and flagged in --out/--json): Ctrl-C/SIGTERM still exit 130."""
    if interrupted:
        err_console.print("interrupted: results above are partial (\"interrupted\": true in the JSON)", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED)


# ----------------------------------------------------------------------------- compare
def _compare_table(rows: list[Any], mode: str, article: bool) -> Table:
    from commtax.compare import ARTICLE_256

    t = Table(title=f"Clusters, each with its best plan ($ {mode})", header_style="bold")
    cols = ("cluster", "best plan", "step s", "MFU", "comm tax", "comm share", "B tokens/day", "days",
            "$/B tokens", "energy MWh", "capex $M")
    for c in cols:
        t.add_column(c, justify="left" if c in ("cluster", "best plan") else "right")
    if article:
        t.add_column("article: 通信税 · B/day · days · $/B", justify="right")
    for r in rows:
        if r.breakdown is None:
            cells = [r.name, f"— ({r.reason})"] + ["—"] * (len(cols) - 2)
        else:
            p, b, c = r.plan, r.breakdown, r.cost
            plan = plan_label(p)
            cells = [r.name, plan, f"{b.step_time_s:.2f}", _pct(b.mfu), _pct(b.comm_tax), _pct(b.comm_share),
                     f"{c.tokens_per_day / 1e9:.1f}", f"{c.days:.1f}", f"{c.usd_per_B_tokens(mode):,.0f}",
                     f"{c.energy_MWh:,.0f}", f"{c.capex_usd / 1e6:.2f}"]
        if article:
            a = ARTICLE_256.get(r.job.cluster.gpu.name)
            cells.append(f"{a['comm_share']:.0%} · {a['tokens_per_day'] / 1e9:g} · {a['days']:g} · {a['usd_per_B']:g}"
                         if a else "")
        t.add_row(*cells)
    return t


def compare_command(
    inputs: Annotated[list[str], typer.Argument(help="job YAML files (with --gpu: one job, then more GPU names)")],
    gpu: Annotated[Optional[list[str]], typer.Option("--gpu", help="GPU catalog ids to put on the first job's cluster")] = None,
    tokens: Annotated[Optional[float], typer.Option("--tokens", min=1, help="training tokens (default: the job's)")] = None,
    rent: RentOpt = False,
    power: Annotated[str, typer.Option("--power", help="typical | tdp: GPU power used for energy")] = "typical",
    article: Annotated[bool, typer.Option("--article", help="show the seed article's 256-GPU numbers alongside")] = False,
    pareto: Annotated[Optional[Path], typer.Option("--pareto", help="write the Pareto plot (PNG) here")] = None,
    scaling_png: Annotated[Optional[Path], typer.Option("--scaling", help="write comm tax and MFU vs GPUs (PNG) here")] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="GPU counts for --scaling, e.g. 64,128,256,512")] = None,
    num_gpus: Annotated[Optional[str], typer.Option(
        "--num-gpus", help="compare each cluster at these GPU counts too, e.g. 128,256,512")] = None,
    deadline: Annotated[Optional[float], typer.Option(
        "--deadline", min=0, help="days: name the cheapest cluster that trains the tokens within it")] = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    cp: CpOpt = None,
    vp: VpOpt = None,
    micro_batch: MicroBatchOpt = None,
    zero: ZeroOpt = None,
    recompute: RecomputeOpt = None,
    sequence_parallel: SequenceParallelOpt = None,
    grad_comm_dtype: GradCommDtypeOpt = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    workers: WorkersOpt = None,
    catalog: CatalogOpt = None,
    prices: PricesOpt = None,
) -> None:
    """Side-by-side clusters: step time, MFU, comm tax, days, $/B tokens, energy, each with its best plan.

    Plan options (--tp, --pp, ...) restrict every cluster's search, e.g. to one fixed plan.
    """
    from commtax.compare import (
        cheapest_within,
        compare,
        jobs_for_gpus,
        pareto_points,
        scaling,
        with_gpu_counts,
    )
    from commtax.cost import load_prices
    from commtax.search import Space
    from commtax.spec import load_catalog, load_job

    space = Space.parse(_constraints(locals()))

    if power not in ("typical", "tdp"):
        raise SpecError(f"--power: {power!r} is not one of typical, tdp")
    price_book = load_prices(prices)
    gpu_names = [g.strip() for item in (gpu or []) for g in item.split(",") if g.strip()]
    files = list(inputs)
    if gpu_names:
        # `--gpu a b c`: names after the first job that are not files are more GPUs
        known = load_catalog(catalog)["gpu"]
        extra = [x for x in files[1:] if not Path(x).exists() and x in known]
        files = [x for x in files if x not in extra]
        gpu_names += extra
    if not files:
        raise SpecError("compare: give at least one job file")
    jobs = [load_job(f, catalog) for f in files]
    if gpu_names:
        if len(jobs) != 1:
            raise SpecError("compare --gpu: give exactly one job file (its cluster gets each GPU in turn)")
        jobs = jobs_for_gpus(jobs[0], gpu_names, price_book, catalog)
    if num_gpus:
        counts = [_count(x) for x in num_gpus.split(",") if x.strip()]
        jobs = with_gpu_counts(jobs, counts)
    mode = "rented" if rent else "owned"
    rows = compare(jobs, prices=price_book, space=space, tokens=tokens, mode=mode, power=power, workers=workers)
    data: dict[str, Any] = {"mode": mode, "tokens": tokens or jobs[0].training.tokens,
                            "rows": [r.to_dict(mode) for r in rows]}
    choice = None
    if deadline is not None:
        choice = cheapest_within(rows, deadline, mode)
        data["deadline_days"] = deadline
        data["deadline_choice"] = choice.name if choice else None
    if pareto is not None:
        from commtax.report.plots import pareto_plot

        pts = pareto_points(rows, tokens, mode)
        pareto_plot(pts, pareto, mode=mode)
        data["pareto_png"] = str(pareto)
    if scaling_png is not None:
        from commtax.report.plots import scaling_plot

        counts = [_count(x, "--gpus") for x in (gpus or "").split(",") if x.strip()]
        if not counts:
            n = jobs[0].cluster.num_gpus
            counts = [n // 4, n // 2, n, n * 2, n * 4]
        pts = scaling(jobs[0], [c for c in counts if c > 0], space=space, workers=workers)
        scaling_plot(pts, scaling_png)
        data["scaling"] = [{"num_gpus": p.num_gpus, "plan": p.plan, "reason": p.reason,
                            **({"comm_tax": p.breakdown.comm_tax, "comm_share": p.breakdown.comm_share,
                                "mfu": p.breakdown.mfu, "step_time_s": p.breakdown.step_time_s}
                               if p.breakdown else {})} for p in pts]
        data["scaling_png"] = str(scaling_png)
    _emit(data, json_out, out)
    if json_out:
        return
    console.print(_compare_table(rows, mode, article))
    if deadline is not None:
        if choice is None:
            console.print(f"no cluster trains {data['tokens']:.3g} tokens within {deadline:g} days", highlight=False)
        else:
            console.print(f"cheapest within {deadline:g} days: {choice.name}: {choice.cost.days:.1f} days, "
                          f"${choice.cost.usd_per_B_tokens(mode):,.0f} per B tokens ({mode})", highlight=False)
    if pareto is not None:
        console.print(f"wrote {pareto}", highlight=False)
    if scaling_png is not None:
        console.print(f"wrote {scaling_png}", highlight=False)


def _count(text: str, option: str = "--num-gpus") -> int:
    try:
        n = int(text)
    except ValueError:
        raise SpecError(f"{option}: expected integers, got {text[:40]!r}") from None
    if n <= 0:
        raise SpecError(f"{option}: expected positive integers, got {n}")
    return n


# ----------------------------------------------------------------------------- advise
def advise_command(
    job_file: Annotated[Path, typer.Argument(help="job YAML: model, cluster, plan, training")],
    top: Annotated[int, typer.Option("--top", min=1, help="changes to show")] = 8,
    no_search: Annotated[bool, typer.Option("--no-search", help="skip the search for the best plan")] = False,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    workers: WorkersOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """What dominates the step, and the changes that cut the comm tax, each re-estimated."""
    from commtax.advise import advise
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    a = advise(job, search_best=not no_search, workers=workers)
    _emit(a.to_dict(), json_out, out)
    if json_out:
        _exit_if_interrupted(a.interrupted)
        return
    b = a.breakdown
    console.print(
        f"step {b.step_time_s:.3f} s, MFU {_pct(b.mfu)}, comm tax {_pct(b.comm_tax)}"
        f"{'' if b.fits else ' (does not fit memory)'}; dominant: {a.dominant} ({_pct(a.dominant_share)} of step)"
        + (f"; largest communication part: {a.dominant_comm} ({_pct(b.breakdown_s[a.dominant_comm] / b.step_time_s)})"
           if a.dominant_comm else ""),
        highlight=False,
    )
    t = Table(title="Changes, re-estimated (best first)", header_style="bold")
    t.add_column("#", justify="right")
    t.add_column("change")
    t.add_column("step", justify="right")
    t.add_column("what moves")
    for k, c in enumerate(a.changes[:top], 1):
        t.add_row(str(k), c.label, f"{c.step_change:+.1%}", c.text().split(": ", 1)[-1].split("; ", 1)[-1])
    console.print(t)
    s = a.sensitivities
    console.print(
        "sensitivity (elasticity d ln step / d ln x): "
        + ", ".join(f"{lvl} bandwidth {v['bw_elasticity']:+.3f}, {lvl} latency {v['latency_elasticity']:+.3f}"
                    for lvl, v in s.items()),
        highlight=False,
    )
    _exit_if_interrupted(a.interrupted)


def register(app: typer.Typer) -> None:
    """Add search, compare and advise to the commtax app."""
    app.command("search")(user_errors(search_command))
    app.command("compare")(user_errors(compare_command))
    app.command("advise")(user_errors(advise_command))
