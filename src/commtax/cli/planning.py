"""``commtax search``, ``compare``, ``advise`` and ``cost``: thin typer commands over ``decide.search_job``,
``decide.compare``, ``decide.advise`` and ``decide.cost``. Errors, JSON and progress: :mod:`commtax.cli.io`; what
they print: :mod:`commtax.report.planning` and :mod:`commtax.report.table`."""

from __future__ import annotations

import functools
import gc
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
    progress,
    search_flag,
)
from commtax.decide.cost import PowerBasis
from commtax.decide.search import GRAD_DTYPES, RANK_BY, RECOMPUTE
from commtax.errors import EXIT_INTERRUPTED

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
    from commtax.decide.search_job import PoolJobSearch, search_job
    from commtax.spec import load_job

    job = load_job(job_file, catalog)
    moe = {"ep": ep, "etp": etp, "moe_dispatcher": moe_dispatcher, "moe_a2a_overlap": moe_a2a_overlap}
    # the cyclic GC paused through the search and what it leaves alive frozen (as ``cli.entry`` does for the
    # imports): the ~50,000 objects its caches keep live to this process's exit, and collecting them once after the
    # search and again at the exit cost ~0.1 G instructions (2026-12-07, 2-core KVM host, GPT-3 175B on 4,096 H100:
    # 5.53 -> 5.43 G for the command). The search makes no cyclic garbage (tests/test_search.py); the library's own
    # ``search`` freezes nothing, since a freeze would keep a long-running caller's cycles from collection
    gc.disable()
    try:
        s = search_job(
            job,
            plan,
            moe,
            fix,
            rank_by=rank,
            top=top,
            verify=verify,
            rent=rent,
            workers=workers,
            prices=prices,
            progress_bar=functools.partial(progress, enabled=not json_out),
            writes_csv=csv_out is not None,
        )
    finally:
        gc.freeze()
        gc.enable()
    if isinstance(s, PoolJobSearch):  # the pool search: no --csv, no --verify (refused in search_job)
        emit(s.to_dict(), json_out, out)
        if not json_out:
            from commtax.report.planning import print_pool_search  # rich: only when a table is printed

            print_pool_search(s, job, console, wide=wide)
        return
    if csv_out is not None:
        write_atomic(csv_out, s.result.to_csv())
    emit(s.to_dict(), json_out, out)
    if not json_out:
        from commtax.report.planning import print_search

        print_search(s, job, console, err_console, top=top, verify=verify, wide=wide)
    _exit_if_interrupted(s.result.interrupted)


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
    from commtax.report.plots import comparison_plots

    written = comparison_plots(c, pareto, scaling_png)
    emit({**c.to_dict(), **written}, json_out, out)
    if not json_out:
        from commtax.report.planning import print_comparison

        print_comparison(c, console, article=article, wide=wide, written=[Path(p) for p in written.values()])


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
    if not json_out:
        from commtax.report.planning import print_advice

        print_advice(a, console, top=top)
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
        from commtax.report.table import cost_table  # rich: only when a table is printed

        title = f"{job_file.name}: {c.tokens / 1e9:,.0f} B tokens on {job.cluster.num_gpus} × {job.cluster.gpu.name}"
        console.print(cost_table(c, mode, title))
