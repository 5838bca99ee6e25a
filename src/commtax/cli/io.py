"""What every ``commtax`` command shares: errors, JSON and output files, progress, and the common options.

Each CLI module (``cli.py``, ``planning_cli.py``, ``sim/cli.py``, ``measure/cli.py``) imports from here and
from nowhere else in the CLI layer, so there is no import cycle between them.

* Bad input (a ``SpecError``; an unreadable or unwritable user file) → one line on stderr, exit 2
  (:func:`user_errors`, :func:`fail`); a plan that does not fit memory → exit 1; Ctrl-C, SIGTERM or
  SIGHUP (``commtax.signals``) → one line, exit 130.
* ``--json`` prints the record on stdout and nothing else; ``--out FILE`` writes the same record,
  atomically (:func:`emit`); the JSON is strict (nan/inf become null).
* Progress bars go to stderr and only when stderr is a terminal (:func:`progress`).
* Choices are ``Literal`` types that typer checks and lists in ``--help``; flags are plain flags
  (``--json``, not ``--json <bool>``).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer

from commtax.cli.output import emit, to_json  # noqa: F401 - re-exported: every command's JSON and --out
from commtax.errors import EXIT_INTERRUPTED, LAUNCHED_ENV, SpecError, os_error_line, safe_text
from commtax.units import memory_need

EXIT_INFEASIBLE = 1  # the plan does not fit, or a check (--max-mape) failed
EXIT_BAD_INPUT = 2  # bad input: one line naming the field and the fix


class LazyConsole:
    """A rich ``Console`` made on first use: ``commtax estimate --json`` never imports rich (its import is a
    tenth of the command's start-up). Attributes are the console's, read and written."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    def _made(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def __setattr__(self, name: str, value: Any) -> None:  # console.width = 80 sets the console's width
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._made(), name, value)


console: Any = LazyConsole(highlight=False)
err_console: Any = LazyConsole(stderr=True, highlight=False)


def escape(text: str) -> str:
    """rich's markup escape, imported when a message is printed."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def flag(name: str, help: str) -> Any:  # noqa: A002 - typer's own keyword
    """A boolean flag shown in ``--help`` as ``--name`` (no ``<bool>`` value to guess at)."""
    return typer.Option(name, metavar="", help=help)


def search_flag(adds: str) -> Any:
    """``--search/--no-search`` (default: no search, the job's own plan), the same name on report, advise and
    compare; ``adds`` says what searching adds and roughly how long it takes."""
    return typer.Option(
        "--search/--no-search", help=f"also search every valid plan: {adds}; off by default", show_default=False
    )


def choice_list(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A typer ``parser`` for a comma list of choices (``--ops all_reduce,all_gather``): typer reports a bad item
    as ``Invalid value for '--ops': unknown X; choose from ...`` (exit 2)."""

    def parse(text: str | tuple[str, ...]) -> tuple[str, ...]:
        if isinstance(text, tuple):  # the default, already parsed
            return text
        values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise typer.BadParameter(f"unknown {', '.join(bad) or '(none)'}; choose from {', '.join(choices)}")
        return values

    return parse


# ----------------------------------------------------------------------------- options every command reuses
JsonOpt = Annotated[bool, flag("--json", "print JSON instead of tables")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", metavar="FILE", help="also write the JSON to this file")]
CatalogOpt = Annotated[
    Optional[Path], typer.Option("--catalog", metavar="FILE", help="YAML file adding or overriding catalog entries")
]
PricesOpt = Annotated[
    Optional[Path], typer.Option("--prices", metavar="FILE", help="YAML file overriding catalog/prices.yaml entries")
]
PlotOpt = Annotated[Optional[Path], typer.Option("--plot", metavar="PNG", help="also draw a chart to this file")]
TraceJobOpt = Annotated[
    Optional[int],
    typer.Option(
        "--job",
        min=1,
        metavar="K",
        help="of traces from several jobs, job K (as `commtax trace` numbers them, in the order they started); "
        "by default the one of the job's world size",
    ),
]
RentOpt = Annotated[bool, flag("--rent", "price by rental $/GPU-hour instead of owning (depreciation + power)")]
WideOpt = Annotated[bool, flag("--wide", "all columns, past 80 (the default fits 80 columns)")]
WorkersOpt = Annotated[
    Optional[int],
    typer.Option(
        "--workers",
        min=1,
        metavar="N",
        help="processes for the search (default: one per 2 s of estimated work, up to the CPUs)",
    ),
]
JobArg = Annotated[Path, typer.Argument(metavar="JOB.yaml", help="job YAML: model, cluster, plan, training")]


def print_table(table: Any, wide: bool = False) -> None:
    """Print a table at the terminal's width, or (``--wide``) at its natural width even past the terminal's edge."""
    from commtax.report.table import print_table as print_on

    print_on(console, table, wide)


# ----------------------------------------------------------------------------- errors
def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: message`` on stderr (one logical line) and exit with ``code``."""
    err_console.print(f"[red]error:[/red] {escape(safe_text(message))}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


FILE_OUTPUT_OPTIONS = ("--out", "-o", "--cluster-out")  # each names a file (--plots names a folder)


def refuse_folder_outputs(argv: list[str]) -> None:
    """``--out x.json/`` names a folder: refused here, since ``Path("x.json/")`` drops the slash and would
    write x.json. Checked on the raw command line, before typer converts it."""
    for i, arg in enumerate(argv):
        if arg == "--":  # what follows is another program's command line (`cluster run -- CMD ...`)
            break
        opt, eq, value = arg.partition("=")
        if opt in FILE_OUTPUT_OPTIONS:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.endswith("/") and value != "/dev/stdout/":
                fail(f"{opt}: {value} ends in '/', a folder; an output option names a file (drop the '/')")


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {escape(safe_text(message))}", soft_wrap=True, highlight=False)


def user_errors(fn: Callable) -> Callable:
    """Map bad input (``SpecError``; a user file that cannot be read or written) to one line and exit 2;
    Ctrl-C/SIGTERM/SIGHUP (a ``KeyboardInterrupt``) to one line and exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            fail(str(e))
        except OSError as e:
            fail(os_error_line(e))
        except KeyboardInterrupt as e:
            if os.environ.get(LAUNCHED_ENV):  # a rank commtax launched: the command that launched it says it once
                sys.stdout.flush()
                sys.stderr.flush()
                # the finally blocks have run (no temp file left); skip the C++ teardown of the process group's
                # threads, which can abort with "terminate called without an active exception"
                os._exit(EXIT_INTERRUPTED)
            fail(f"interrupted{f' ({e})' if str(e) else ''}", EXIT_INTERRUPTED)

    return wrapper


def does_not_fit(b: Any, job: Any) -> NoReturn:
    """A plan that does not fit memory: one line naming the need, the capacity and the fixes; exit 1."""
    need, cap, gpu = b.memory_gib_per_gpu["total"], job.cluster.gpu.mem_GiB, job.cluster.gpu.name
    over = [x for x in b.pools or [] if not x["fits"]]
    if over:  # GPU pools: the pool that overflows, on its own GPU
        x = max(over, key=lambda x: x["memory_gib"] / x["mem_GiB"])
        need, cap, gpu = x["memory_gib"], x["mem_GiB"], f"{x['gpu']} (pool {x['pool']})"
    fail(
        f"plan does not fit GPU memory: {memory_need(need, cap)} "
        f"on {gpu}; try a higher plan.zero, "
        "plan.recompute: full, a smaller plan.micro_batch, or larger tp/pp (commtax search finds one)",
        EXIT_INFEASIBLE,
    )


# ----------------------------------------------------------------------------- progress
def _no_progress(done: int, total: int) -> None:
    """``progress``'s update where no bar is shown."""


@contextmanager
def progress(label: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields ``update(done, total)``. Silent when stderr is not a terminal, and
    without rich when not ``enabled`` (``--json``: its import is ~100 M instructions of a command's start-up)."""
    if not enabled:
        yield _no_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not (enabled and err_console.is_terminal),
    )
    task = prog.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        prog.update(task, completed=done, total=total)

    with prog:
        yield update
