"""``commtax search``, ``compare``, ``advise`` and ``cost``: thin typer commands over search, compare, advise and
cost. Errors, JSON and progress: :mod:`commtax.cli.io`; tables: :mod:`commtax.report.table`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer

from commtax.atomic import write_atomic
from commtax.cli.io import (
    CatalogOpt,
    JobArg,
    JsonOpt,
    OutOpt,
    PricesOpt,
    RentOpt,
    WideOpt,
    WorkersOpt,
    console,
    does_not_fit,
    emit,
    err_console,
    flag,
    print_table,
    progress,
    search_flag,
)
from commtax.decide.cost import PowerBasis
from commtax.decide.plans import MOE_LABEL_KEY, PLAN_LABEL_KEY, plan_label
from commtax.decide.search import GRAD_DTYPES, RANK_BY, RECOMPUTE
from commtax.errors import EXIT_INTERRUPTED, SpecError
from commtax.report.table import (
    compare_table,
    cost_table,
    new_table,
    pct,
    render_breakdown,
    search_table,
)

TokensOpt = Annotated[Optional[float], typer.Option("--tokens", min=1, help="training tokens (default: the job's)")]
PowerOpt = Annotated[PowerBasis, typer.Option("--power", help="GPU power used for energy")]
SearchOpt = Annotated[
    bool, search_flag("each cluster gets its own best plan (about 5 s per cluster on an idle core, more on a busy one)")
]

# ----------------------------------------------------------------------------- the plan fields, declared once
# Each is a string typer passes through and ``Space.parse`` reads: values (``8``, ``1,2,4``) for every field, ranges
# (``2..16``) for the integer ones. ``@plan_options`` adds them all to a command and hands it ``plan: dict``.
PLAN_OPTIONS: dict[str, tuple[str, str]] = {  # field -> (option, help)
    "tp": ("--tp", "tensor parallel sizes: 8 or 1,2,4, or a range a..b"),
    "pp": ("--pp", "pipeline stages: 4 or 1,2,4,8, or a range a..b"),
    "cp": ("--cp", "context parallel sizes: 1 or 1,2, or a range a..b"),
    "vp": ("--vp", "virtual stages per pipeline rank: 1,2, or a range a..b"),
    "micro_batch": ("--micro-batch", "micro-batch sizes: 1,2,4, or a range a..b"),
    "zero": ("--zero", "ZeRO stages: 1 or 0,1,3, or a range 0..2"),
    "recompute": ("--recompute", f"activation recompute, one or more of: {','.join(RECOMPUTE)}"),
    "sequence_parallel": ("--sequence-parallel", "sequence parallelism: true, false or true,false"),
    "grad_comm_dtype": ("--grad-comm-dtype", f"gradient all-reduce dtypes, of: {','.join(GRAD_DTYPES)}"),
}

MAX_VERIFY = 100  # search --verify: plans simulated (each a whole step's event graph)


def plan_options(command: Callable) -> Callable:
    """Add one option per plan field (``PLAN_OPTIONS``) to ``command``, which receives them as ``plan``: a dict of
    field -> text or None, ready for ``Space.parse``."""
    sig = inspect.signature(command, eval_str=True)
    own = [p for name, p in sig.parameters.items() if name != "plan"]
    added = [
        inspect.Parameter(
            field,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[Optional[str], typer.Option(opt, metavar="V", help=help_)],
        )
        for field, (opt, help_) in PLAN_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        plan = {field: kwargs.pop(field, None) for field in PLAN_OPTIONS}
        return command(*args, plan=plan, **kwargs)

    # the job argument first, then the plan fields (the options every search shares), then the command's own
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
    params = params[:1] + added + params[1:]
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # typer must read the new signature, not the command's own
    return wrapper


# ----------------------------------------------------------------------------- search
@plan_options
def search_command(
    job_file: JobArg,
    plan: dict[str, Optional[str]],
    fix: Annotated[
        Optional[str], typer.Option("--fix", metavar="FIELDS", help="comma list of fields pinned to the job's plan")
    ] = None,
    rank: Annotated[Literal[RANK_BY], typer.Option("--rank", help="what ranks the plans")] = "step",
    top: Annotated[int, typer.Option("--top", min=1, metavar="N", help="plans to show")] = 5,
    verify: Annotated[
        int,
        typer.Option(
            "--verify",
            min=0,
            metavar="K",
            help="simulate the best K plans and rank them by the simulated step (both times shown)",
        ),
    ] = 0,
    rent: RentOpt = False,
    wide: WideOpt = False,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    csv_out: Annotated[
        Optional[Path], typer.Option("--csv", metavar="FILE", help="write every valid plan here")
    ] = None,
    workers: WorkersOpt = None,
    catalog: CatalogOpt = None,
    prices: PricesOpt = None,
    ep: Annotated[
        Optional[str], typer.Option("--ep", metavar="V", help="MoE: expert-parallel sizes, 8 or 8,16,64")
    ] = None,
    etp: Annotated[Optional[str], typer.Option("--etp", metavar="V", help="MoE: expert tensor-parallel sizes")] = None,
    moe_dispatcher: Annotated[
        Optional[str],
        typer.Option("--moe-dispatcher", metavar="V", help="MoE: dispatchers, of alltoall,allgather,deepep,hybridep"),
    ] = None,
    moe_a2a_overlap: Annotated[
        Optional[str], typer.Option("--moe-a2a-overlap", metavar="V", help="MoE: all-to-all overlap, true,false")
    ] = None,
) -> None:
    """Every valid plan for the job's model and cluster, ranked; the best ones with their breakdowns."""
    from commtax.decide.cost import job_cluster_cost, load_prices
    from commtax.decide.search import Space, search
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    moe = {"ep": ep, "etp": etp, "moe_dispatcher": moe_dispatcher, "moe_a2a_overlap": moe_a2a_overlap}
    if job.cluster.pools:  # several GPU pools: assignments, layer splits and batch shares (decide/pool_search.py)
        given = [k for k, v in {**plan, **moe}.items() if v is not None] + (["fix"] if fix else [])
        if given:  # the pool search spans its own space: a flag it would not read is named, not ignored
            name = f"--{given[0].replace('_', '-')}"
            raise SpecError(
                f"{name}: a cluster of GPU pools is searched over its pool assignments and splits "
                "(decide/pool_search.py), which take no plan flags; drop it or set the field in the job file"
            )
        _search_pools(job, top, rent, json_out, out, prices, wide)
        return
    space = Space.parse(plan, [f.strip() for f in fix.split(",") if f.strip()] if fix else [])
    mode = "rented" if rent else "owned"
    usd_per_s = None
    price_error = None
    try:
        usd_per_s = job_cluster_cost(job, load_prices(prices)).usd_per_s(mode)
    except SpecError as e:
        if prices is not None or rank != "step":
            raise
        price_error = str(e)
    if verify > MAX_VERIFY:
        raise SpecError(
            f"--verify: {verify:,} plans to simulate; the limit is {MAX_VERIFY} (each is a full simulation)"
        )
    with progress("searching plans", enabled=not json_out) as update:
        if any(v is not None for v in moe.values()):
            from commtax.decide.search import search_moe

            res = search_moe(job, moe, space, rank_by=rank, top=top, workers=workers, progress=update, verify=verify)
        else:
            res = search(job, space, rank_by=rank, top=top, workers=workers, progress=update, verify=verify)
    data = res.to_dict()
    if usd_per_s is not None:
        for entry, (_, b) in zip(data["top"], res.top):
            entry["usd_per_B_tokens"] = usd_per_s * 1e9 / b.tokens_per_s
            entry["tokens_per_dollar"] = b.tokens_per_s / usd_per_s
        data["price_mode"] = mode
    if csv_out is not None:
        write_atomic(csv_out, res.to_csv())
    emit(data, json_out, out)
    if json_out:
        _exit_if_interrupted(res.interrupted)
        return
    s = res.summary()
    console.print(
        f"{s['evaluated']:,} plans in {s['elapsed_s']:.2f} s ({s['plans_per_s']:,.0f}/s): {s['valid']:,} valid, "
        f"{s['fit']:,} fit memory, {s['do_not_fit']:,} do not fit, {s['invalid']:,} invalid",
    )
    for title, reasons in (("invalid", s["invalid_reasons"]), ("do not fit", s["do_not_fit_reasons"])):
        for why, count in list(reasons.items())[:4]:
            # the key has its numbers taken out to group messages ("vp(n) > n"): show one real message
            example = res.invalid_examples.get(why)
            text = f"{why}" if example is None else (f"e.g. {example}" if count > 1 else example)
            console.print(f"  {title}: {count:,} × {text}", markup=False)
    if res.interrupted:
        console.print("[yellow]interrupted: the best of the plans evaluated so far[/yellow]")
    for w in res.warnings:
        err_console.print(f"warning: {w}", markup=False)
    if price_error:
        console.print(f"(no $ column: {price_error})", markup=False)
    print_table(search_table(res, mode, usd_per_s, max(top, verify), wide), wide)
    _say_within_interval(res)
    console.print(PLAN_LABEL_KEY, style="dim")
    if job.model.is_moe:
        console.print(MOE_LABEL_KEY, style="dim")
    if res.verified:
        t = new_table(f"Top {len(res.verified)} simulated (ranked by the simulated step)")
        for col in ("#", "plan", "estimate s (80%)", "simulate s", "diff", "MFU"):
            t.add_column(col, justify="left" if col == "plan" else "right")
        for k, v in enumerate(res.verified, 1):
            est, sim = v.estimate.step_time_s, v.simulate.step_time_s
            lo, hi = v.estimate.step_time_s_p10, v.estimate.step_time_s_p90
            band = f" ({lo:.2f}–{hi:.2f})" if lo else ""
            mfu = f"{v.estimate.mfu:.1%}" + (" !" if v.above_published else "")
            t.add_row(str(k), plan_label(v.plan), f"{est:.3f}{band}", f"{sim:.3f}", f"{(sim - est) / est:+.1%}", mfu)
        print_table(t, wide)
        for v in res.verified[:1]:
            if v.above_published:
                err_console.print(f"warning: best plan: {v.above_published}", markup=False)
    best_plan, best = res.top[0]
    console.print(f"\n[bold]Best plan[/bold] {plan_label(best_plan)}:")
    render_breakdown(best, console, job.cluster.gpu.mem_GiB)
    _exit_if_interrupted(res.interrupted)


def within_interval_lines(named: list) -> list[str]:
    """One line per pair of options whose central steps lie inside each other's 80% interval."""
    from commtax.schedule.breakdown import within_each_other

    return [
        f"{a} and {b}: within each other's 80% interval (steps {ba.step_time_s:.2f} and {bb.step_time_s:.2f} s): "
        f"the model cannot rank them; their ratio {ba.step_time_s / bb.step_time_s:.2f} is firmer than either time"
        for i, (a, ba) in enumerate(named)
        for b, bb in named[i + 1 :]
        if within_each_other(ba, bb)
    ]


def _say_within_interval(res) -> None:
    """The model cannot rank two plans whose central steps lie inside each other's 80% interval: say so."""
    from commtax.schedule.breakdown import within_each_other

    if len(res.top) >= 2 and within_each_other(res.top[0][1], res.top[1][1]):
        console.print(
            f"plans #1 and #2 are within each other's 80% interval ({plan_label(res.top[0][0])} vs "
            f"{plan_label(res.top[1][0])}): the model cannot tell them apart; their ratio is firmer than either time",
            markup=False,
        )


def stage_runs(pools: list, layers: list[int]) -> str:
    """``4×rtx4090:6 + 4×a100:14``: runs of equal stages, each as count × pool:layers."""
    runs: list[list] = []
    for key in zip(pools, layers):
        if runs and runs[-1][1] == key:
            runs[-1][0] += 1
        else:
            runs.append([1, key])
    return " + ".join(f"{n}×{w}:{x}" for n, (w, x) in runs)


def _search_pools(job, top: int, rent: bool, json_out: bool, out: Path | None, prices, wide: bool) -> None:
    """``search`` on a cluster of GPU pools: the pool search's best plans, refusals counted by rule."""
    from commtax.decide.cost import job_cluster_cost, load_prices
    from commtax.decide.pool_search import pool_search

    mode = "rented" if rent else "owned"
    usd_per_s, price_error = None, None
    try:
        usd_per_s = job_cluster_cost(job, load_prices(prices)).usd_per_s(mode)
    except SpecError as e:  # an unpriced GPU: no $ column, as search does
        if prices is not None:
            raise
        price_error = str(e)
    with progress("searching pool plans", enabled=not json_out) as update:
        res = pool_search(job, top=top, progress=update)
    data = res.to_dict()
    for entry, (_, b) in zip(data["top"], res.top):
        entry["usd_per_B_tokens"] = usd_per_s * 1e9 / b.tokens_per_s if usd_per_s else None
    emit(data, json_out, out)
    if json_out:
        return
    if price_error:
        console.print(f"(no $ column: {price_error})", markup=False)
    console.print(f"{res.evaluated:,} pool plans: {res.fit:,} valid and fit memory")
    for why, count in res.refusals.most_common(5):
        console.print(f"  refused: {count:,} × {why}", markup=False)
    t = new_table(f"Top {len(res.top)} plans on the pools ($ {mode})")
    for col in ("#", "plan", "stages (pool:layers)", "step s", "tax", "MFU", "$/B tok", "straggler"):
        t.add_column(col, justify="left" if col in ("plan", "stages (pool:layers)", "straggler") else "right")
    for k, ((p, b), entry) in enumerate(zip(res.top, data["top"]), 1):
        where = (
            stage_runs(list(p.stage_pools), list(p.stage_layers or ()))
            if p.stage_pools
            else "dp across pools, shares " + (",".join(f"{x:.3g}" for x in p.pool_batch_share or ()) or "even")
        )
        slow = next((x["pool"] for x in b.pools or [] if x["straggler"]), "")
        label = f"tp{p.tp}·pp{p.pp}·dp{p.dp}·mb{p.micro_batch}·{p.recompute}"
        t.add_row(
            str(k),
            label,
            where,
            f"{b.step_time_s:.2f}",
            f"{b.comm_tax:.1%}",
            f"{b.mfu:.1%}",
            f"{entry['usd_per_B_tokens']:,.0f}",
            slow,
        )
    print_table(t, wide)
    best = res.top[0][1]
    console.print("\n[bold]Best plan[/bold]:")
    render_breakdown(best, console, job.cluster.gpu.mem_GiB)


def _exit_if_interrupted(interrupted: bool) -> None:
    """Partial results were shown (and flagged in --out/--json): Ctrl-C/SIGTERM still exit 130."""
    if interrupted:
        err_console.print('interrupted: results above are partial ("interrupted": true in the JSON)', markup=False)
        raise typer.Exit(EXIT_INTERRUPTED)


# ----------------------------------------------------------------------------- compare
@plan_options
def compare_command(
    inputs: Annotated[
        list[str], typer.Argument(metavar="JOB.yaml", help="job YAML files (with --gpu: one job, then more GPU ids)")
    ],
    plan: dict[str, Optional[str]],
    gpu: Annotated[
        Optional[list[str]], typer.Option("--gpu", help="GPU catalog ids to put on the first job's cluster")
    ] = None,
    fabric: Annotated[
        Optional[list[str]],
        typer.Option(
            "--fabric",
            help="fabric presets to put under the first job's cluster (catalog/fabrics.yaml), ID or ID@R for an "
            "R:1 spine, e.g. dgx-h100-superpod@1,dgx-h100-superpod@4,tor-4node",
        ),
    ] = None,
    tokens: TokensOpt = None,
    rent: RentOpt = False,
    power: PowerOpt = "typical",
    search: SearchOpt = False,
    article: Annotated[bool, flag("--article", "show the seed article's 256-GPU numbers alongside")] = False,
    pareto: Annotated[
        Optional[Path], typer.Option("--pareto", metavar="PNG", help="write the Pareto plot here")
    ] = None,
    scaling_png: Annotated[
        Optional[Path], typer.Option("--scaling", metavar="PNG", help="write comm tax and MFU vs GPUs here")
    ] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="GPU counts for --scaling, e.g. 64,128,256,512")] = None,
    num_gpus: Annotated[
        Optional[str], typer.Option("--num-gpus", help="compare each cluster at these GPU counts too, e.g. 128,256,512")
    ] = None,
    deadline: Annotated[
        Optional[float],
        typer.Option("--deadline", min=0, help="days: name the cheapest cluster that trains the tokens within it"),
    ] = None,
    wide: WideOpt = False,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    workers: WorkersOpt = None,
    catalog: CatalogOpt = None,
    prices: PricesOpt = None,
) -> None:
    """Side-by-side clusters: step time, MFU, comm tax, days, $/B tokens, energy, each with the job's plan.

    --search gives each cluster its own best plan instead; plan options (--tp, --pp, ...) restrict that search
    (e.g. to one fixed plan) and so imply --search."""
    from commtax.decide.compare import run_compare

    with progress("searching clusters" if search else "pricing clusters", enabled=not json_out) as update:
        c = run_compare(
            list(inputs),
            plan,
            search_plans=search,
            gpus=gpu,
            fabrics=fabric,
            num_gpus=num_gpus,
            tokens=tokens,
            mode="rented" if rent else "owned",
            power=power,
            deadline=deadline,
            pareto=pareto is not None,
            scaling_counts=gpus,
            want_scaling=scaling_png is not None,
            workers=workers,
            catalog=catalog,
            prices=prices,
            progress=update,
        )
    data = c.to_dict()
    if pareto is not None:
        from commtax.report.plots import pareto_plot

        pareto_plot(c.pareto, pareto, mode=c.mode)
        data["pareto_png"] = str(pareto)
    if scaling_png is not None:
        from commtax.report.plots import scaling_plot

        scaling_plot(c.scaling, scaling_png, "" if c.searched else "The job's plan at each scale")
        data["scaling_png"] = str(scaling_png)
    emit(data, json_out, out)
    if not json_out:
        _print_comparison(c, article, wide, [p for p in (pareto, scaling_png) if p is not None])


def _print_comparison(c, article: bool, wide: bool, written: list[Path]) -> None:
    from commtax.decide.compare import fabric_tradeoff_lines

    print_table(compare_table(c.rows, c.mode, article, wide, c.searched), wide)
    if not wide:
        for r in c.rows:
            if r.plan is not None and r.breakdown is not None:
                console.print(f"  {r.name}: {plan_label(r.plan)}", markup=False)
    for line in within_interval_lines([(r.name, r.breakdown) for r in c.rows if r.breakdown is not None]):
        console.print(line, markup=False)
    for line in fabric_tradeoff_lines(c.rows, c.mode):
        console.print(line, markup=False)
    if c.deadline_days is not None:
        if c.choice is None:
            console.print(f"no cluster trains {c.tokens:.3g} tokens within {c.deadline_days:g} days")
        else:
            console.print(
                f"cheapest within {c.deadline_days:g} days: {c.choice.name}: {c.choice.cost.days:.1f} days, "
                f"${c.choice.cost.usd_per_B_tokens(c.mode):,.0f} per B tokens ({c.mode})"
            )
    for path in written:
        console.print(f"wrote {path}")


# ----------------------------------------------------------------------------- advise
def advise_command(
    job_file: JobArg,
    top: Annotated[int, typer.Option("--top", min=1, metavar="N", help="changes to show")] = 8,
    search: Annotated[
        bool, search_flag("one more change, the best plan a full search finds (about 5–15 s; the rest takes ~1 s)")
    ] = False,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    workers: WorkersOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """What dominates the step, and the changes around the job's plan that cut the comm tax, each re-estimated.

    --search adds one more change, the best plan a full search finds (the slow part)."""
    from commtax.decide.advise import advise
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    if job.cluster.pools:  # several GPU pools: the straggler and what rebalancing buys (decide/pool_search.py)
        from commtax.decide.pool_search import pool_advice

        pa = pool_advice(job)
        emit(pa.to_dict(), json_out, out)
        if not json_out:
            console.print(pa.line(), markup=False, highlight=False)
        return
    with progress("re-estimating changes" + (" and searching plans" if search else ""), enabled=not json_out) as update:
        a = advise(job, search_best=search, workers=workers, progress=update)
    emit(a.to_dict(), json_out, out)
    if json_out:
        _exit_if_interrupted(a.interrupted)
        return
    b = a.breakdown
    console.print(
        f"step {b.step_time_s:.3f} s, MFU {pct(b.mfu)}, comm tax {pct(b.comm_tax)}"
        f"{'' if b.fits else ' (does not fit memory)'}; dominant: {a.dominant} ({pct(a.dominant_share)} of step)"
        + (
            f"; largest communication part: {a.dominant_comm} ({pct(b.breakdown_s[a.dominant_comm] / b.step_time_s)})"
            if a.dominant_comm
            else ""
        ),
    )
    # changes that fit memory come first, fastest first: with a plan that does not fit, a slower one can lead
    order = "best first" if b.fits else "those that fit memory first, then fastest"
    t = new_table(f"Changes, re-estimated ({order})")
    t.add_column("#", justify="right")
    t.add_column("change")
    t.add_column("step", justify="right", no_wrap=True)
    t.add_column("what moves")
    for k, c in enumerate(a.changes[:top], 1):
        step = f"{c.step_change:+.1%}" + (" ≈" if c.within_interval else "")
        t.add_row(str(k), c.label, step, c.text().split(": ", 1)[-1].split("; ", 1)[-1])
    console.print(t)
    if any(c.within_interval for c in a.changes[:top]):
        console.print(
            "≈: before and after lie within each other's 80% interval; the change's ratio is firmer than either time",
            markup=False,
        )
    helps = [r for r in a.remedies if r.change.step_change <= -0.0005]  # a cut that shows at 0.1%
    slower = [r for r in a.remedies if r.change.step_change > -0.0005]
    for r in helps:  # gradient compression as DDP comm hooks (commtax bench ddp measures them)
        console.print(f"remedy: {r.text()}", highlight=False)
    if slower:  # never listed as a remedy: the codec costs more than the bytes it saves on this network
        console.print(
            "not a remedy here (no faster step: the codec costs about what the bytes it saves): "
            + "; ".join(f"{r.label} {r.change.step_change:+.1%}" for r in slower),
            highlight=False,
        )
    for line in a.placement:  # cluster.fabric: where each group sits, what to keep where
        console.print(f"placement: {line}", highlight=False)
    for c in (c for c in a.changes if c.kind == "fabric"):  # every fabric what-if, better or worse
        console.print(
            f"fabric what-if: {c.label}: step {c.step_after_s:.3f} s ({c.step_change:+.1%}), comm tax "
            f"{pct(c.comm_tax_after)}",
            highlight=False,
        )
    s = a.sensitivities
    console.print(
        "sensitivity (elasticity d ln step / d ln x): "
        + ", ".join(
            f"{lvl} bandwidth {v['bw_elasticity']:+.3f}, {lvl} latency {v['latency_elasticity']:+.3f}"
            for lvl, v in s.items()
        ),
    )
    _exit_if_interrupted(a.interrupted)


# ----------------------------------------------------------------------------- cost
def cost_command(
    job_file: JobArg,
    rent: RentOpt = False,
    tokens: TokensOpt = None,
    power: PowerOpt = "typical",
    json_out: JsonOpt = False,
    out: OutOpt = None,
    catalog: CatalogOpt = None,
    prices: PricesOpt = None,
) -> None:
    """Days, GPU-hours, energy and $ per billion tokens of one job's training run (its own plan)."""
    from commtax.decide.cost import job_training_cost, load_prices
    from commtax.schedule.analytical import estimate as run_estimate
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    b = run_estimate(job)
    if not b.fits:
        does_not_fit(b, job)
    mode = "rented" if rent else "owned"
    c = job_training_cost(job, b.tokens_per_s, load_prices(prices), tokens, power)
    data = {
        "mode": mode,
        "power": power,
        **c.to_dict(),
        "usd": c.usd(mode),
        "usd_per_B_tokens": c.usd_per_B_tokens(mode),
    }
    emit(data, json_out, out)
    if not json_out:
        title = f"{job_file.name}: {c.tokens / 1e9:,.0f} B tokens on {job.cluster.num_gpus} × {job.cluster.gpu.name}"
        console.print(cost_table(c, mode, title))
