"""The ``commtax`` command: thin typer sub-commands over the library API.

Every command is registered in one place, :data:`COMMANDS` (one line each: name -> ``module:function``);
a command's module is imported only when that command runs (or for ``--help``), so ``commtax estimate``
starts without loading the simulator or torch. Errors, JSON and output files: :mod:`commtax.cli.io`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from commtax import __version__

# the launcher is commtax.cli.entry (it runs a plain `estimate` before typer is imported); its names stay here too
from commtax.cli.entry import _interrupt_in, forget_caught_interrupt, main, run_app  # noqa: F401
from commtax.cli.io import (
    EXIT_INFEASIBLE,
    CatalogOpt,
    JobArg,
    JsonOpt,
    OutOpt,
    PlotOpt,
    WideOpt,
    console,
    emit,
    fail,
    flag,
    progress,
    user_errors,
)
from commtax.costs.collectives import ALGORITHMS, OPS, PROTOCOLS
from commtax.errors import SpecError

app = typer.Typer(
    name="commtax",
    help="Predict, simulate, measure and reduce the communication tax of distributed LLM training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(show: bool) -> None:
    if show:
        typer.echo(f"commtax {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", metavar="", is_eager=True, callback=_version, help="print the version and exit")
    ] = False,
) -> None:
    """Predict, simulate, measure and reduce the communication tax of distributed LLM training."""


# ----------------------------------------------------------------------------- estimate
def estimate(
    job_file: JobArg,
    json_out: JsonOpt = False,
    out: OutOpt = None,
    plot: PlotOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """Predict one training step: step time, MFU, comm tax, breakdown, memory."""
    from commtax.cli.estimate import estimate_job

    estimate_job(job_file, json_out, out, plot, catalog)


# ----------------------------------------------------------------------------- validate
def validate(
    csv_files: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE.csv...", help="published measurements (runs or collectives); several: each and the union"
        ),
    ],
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    max_mape: Annotated[
        Optional[float],
        typer.Option("--max-mape", metavar="PCT", help="exit 1 when a file's MAPE (%) is above this"),
    ] = None,
    plot: PlotOpt = None,
    loso: Annotated[
        bool, flag("--loso", "leave-one-source-out MAPE of fitted assumptions and coverage of the interval")
    ] = False,
    wide: WideOpt = False,
) -> None:
    """Predict published measurements and report the error per row, the MAPE and the 80% interval's coverage;
    several files: each file, then the runs files' rows together (by source)."""
    from commtax.decide.validate import max_mape_failure, read_rows, validate_files, validation_record

    if max_mape is not None and not (0 <= max_mape < float("inf")):
        raise SpecError(f"--max-mape: a percentage ≥ 0, got {max_mape}")
    n = sum(len(read_rows(f)) for f in csv_files)
    with progress("predicting", enabled=not json_out) as update:
        done = iter(range(1, n + 1))
        multi = validate_files(csv_files, catalog, progress=lambda: update(next(done, n), n), loso=loso)
    if plot is not None:
        from commtax.report.plots import parity_plot

        parity_plot(multi.union or next(iter(multi.files.values())), plot)
    if json_out:
        emit(validation_record(multi), True)
    else:
        from commtax.report.text import print_validation  # rich: only when a table is printed

        print_validation(multi, console, loso=loso, wide=wide)
    failure = max_mape_failure(multi, max_mape)
    if failure is not None:
        fail(failure, EXIT_INFEASIBLE)


# ----------------------------------------------------------------------------- collective
def collective(
    op: Annotated[Literal[OPS], typer.Argument(metavar="OP", help=f"the collective: {', '.join(OPS)}")],
    size: Annotated[
        str, typer.Option("--bytes", help="message size (nccl-tests convention): 4096, 16MiB, 1GB")
    ] = "256MiB",
    cluster_file: Annotated[
        Optional[Path], typer.Option("--cluster", metavar="FILE", help="cluster YAML, or a job file (its cluster:)")
    ] = None,
    gpus: Annotated[
        Optional[int], typer.Option("--gpus", help="GPUs in the group (default: all of the cluster)")
    ] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU catalog id (without --cluster)")] = "h100-sxm5-80gb",
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="NVLink domain size (without --cluster)")] = 8,
    intra: Annotated[str, typer.Option("--intra", help="intra-node link id (without --cluster)")] = "nvlink4",
    inter: Annotated[str, typer.Option("--inter", help="network id (without --cluster)")] = "ib-ndr",
    nics_per_node: Annotated[int, typer.Option("--nics-per-node")] = 8,
    algorithm: Annotated[
        Optional[Literal[ALGORITHMS]],
        typer.Option(
            "--algorithm",
            help="force ring, tree, nvls, nvls_tree, pat (NCCL) or recursive_doubling, hierarchical (MPI-style)",
        ),
    ] = None,
    protocol: Annotated[
        Optional[Literal[PROTOCOLS]],
        typer.Option("--protocol", help="force an NCCL protocol: LL, LL128 or Simple (as NCCL_PROTO)"),
    ] = None,
    sweep: Annotated[bool, flag("--sweep", "nccl-tests-style table from 8 B to --bytes, ×2 per row")] = False,
    json_out: JsonOpt = False,
    catalog: CatalogOpt = None,
    deepep: Annotated[
        Optional[Literal["dispatch", "combine"]],
        typer.Option("--deepep", help="all_to_all as DeepEP's normal dispatch or combine kernel (catalog/deepep.yaml)"),
    ] = None,
    dedup: Annotated[
        float,
        typer.Option("--dedup", min=0.0, max=1.0, help="with --deepep: inter-node bytes kept after node deduplication"),
    ] = 1.0,
    at: Annotated[
        Optional[float],
        typer.Option(
            "--at",
            min=0,
            metavar="UNIX_S",
            help="price the background flows (fabric.flows) alive at this moment, unix seconds (default: now)",
        ),
    ] = None,
) -> None:
    """Predict one collective: time, algbw, busbw, algorithm and the link that bounds it."""
    from commtax.costs.predict import check_options, cluster_from_options, predict_collective
    from commtax.units import parse_bytes

    check_options(op, gpus, algorithm, deepep)
    try:
        nbytes = parse_bytes(size)
    except ValueError as e:
        raise SpecError(f"--bytes: {e}") from None
    cluster = cluster_from_options(
        cluster_file,
        catalog,
        gpu=gpu,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        intra=intra,
        inter=inter,
        nics_per_node=nics_per_node,
    )
    pred = predict_collective(op, nbytes, cluster, gpus, algorithm, protocol, sweep, deepep, dedup, at)
    if json_out:
        emit(list(pred.rows) if sweep else pred.rows[0], True)
        return
    from commtax.report.table import collective_table

    console.print(collective_table(pred))


# ----------------------------------------------------------------------------- demo
def demo(json_out: JsonOpt = False, plot: PlotOpt = None) -> None:
    """The seed article's LLaMA-2 70B / 256-GPU scenario, recomputed next to the article's numbers."""
    from commtax.decide.demo import seed_demo
    from commtax.report.planning import print_demo

    d = seed_demo()
    if plot is not None:
        from commtax.report.plots import breakdown_plot

        breakdown_plot([(r.name, r.breakdown) for r in d.rows], plot, "Seed scenario: where the step goes")
    if json_out:
        emit(d.to_dict(), True)
    else:
        print_demo(d, console)


# ----------------------------------------------------------------------------- every command, one line each
# name -> "module:attribute": a command function, or a typer app for a command group. The module is imported
# only when its command runs (or for --help), so `commtax estimate` stays instant.
COMMANDS: dict[str, str] = {
    "estimate": "commtax.cli.main:estimate",
    "simulate": "commtax.cli.simulate:simulate_cmd",
    "search": "commtax.cli.planning:search_command",
    "compare": "commtax.cli.planning:compare_command",
    "advise": "commtax.cli.planning:advise_command",
    "cost": "commtax.cli.planning:cost_command",
    "validate": "commtax.cli.main:validate",
    "collective": "commtax.cli.main:collective",
    "demo": "commtax.cli.main:demo",
    "bench": "commtax.cli.measure:bench_app",
    "cluster": "commtax.cli.measure:cluster_app",
    "calibrate": "commtax.cli.measure:calibrate_command",
    "report": "commtax.cli.report:report",
    "trace": "commtax.cli.trace:trace_command",
}
_registered: set[str] = set()


def register_commands(names: set[str] | None = None) -> None:
    """Add the named commands (default: all) to ``app``; each command function is wrapped in ``user_errors``."""
    for name, target in COMMANDS.items():
        if name in _registered or (names is not None and name not in names):
            continue
        module, attr = target.split(":")
        obj = getattr(importlib.import_module(module), attr)
        if isinstance(obj, typer.Typer):
            app.add_typer(obj, name=name)
        else:
            app.command(name)(user_errors(obj))
        _registered.add(name)


if __name__ == "__main__":
    main()
