"""The ``commtax`` entry point: the signal handlers, then the command.

``commtax estimate JOB.yaml [--json] [--out FILE] [--plot PNG] [--catalog FILE]``, the command that must start
at once, runs here without typer (whose import and parsing were a third of its start-up): the command line is
read by :func:`plain_estimate_args`, which accepts only what typer would read the same way. Any other command
line (``--help``, a missing, unknown or repeated option, a value that looks like an option or a folder) goes to
typer, which reports it as it reports every other command's; so does every error the estimate raises, through
the same handler (:func:`commtax.cli.io.user_errors`): the lines and exit codes are typer's. The estimate path
imports with the cyclic GC paused and the code that import compiles at run time (dataclass methods, forward
references, regular expressions) read from a cache keyed by its source (:mod:`commtax.cli.compiled`).
"""

from __future__ import annotations

import gc
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from commtax import __version__, signals

ESTIMATE_FILE_OPTIONS = {"--out": "out", "--plot": "plot", "--catalog": "catalog"}  # each takes a file name
# the commands whose whole run (imports, then the command's own lazy imports) reads the code it compiles at run time
# from a cache of its own (cli.compiled.cache_for); not the measuring commands (bench, cluster, calibrate, trace),
# which import torch and launch ranks
CACHED_COMMANDS = frozenset(
    {"search", "simulate", "validate", "compare", "advise", "cost", "report", "demo", "collective"}
)


def main() -> None:
    signals.install()  # SIGTERM/SIGHUP clean up like Ctrl-C (temp files, workers, launched ranks), exit 130
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if sys.argv[1:] == ["--version"]:  # no command to register: every module's import would cost a second
        print(f"commtax {__version__}")
        return
    plain = plain_estimate_args(sys.argv[2:]) if command == "estimate" else None
    try:
        with ExitStack() as whole_run:
            rc = _run(command, plain, whole_run)
    except KeyboardInterrupt as e:  # as a cached command's file is written, after its run
        _interrupted(e)
    forget_caught_interrupt()
    sys.exit(rc)


def _run(command: str | None, plain: dict[str, Any] | None, whole_run: ExitStack) -> int:
    """The command's exit status: its modules imported (a signal meanwhile: one line, exit 130), then run; the
    compiled-code cache and pydantic's plugin stand-in, for a command of ``CACHED_COMMANDS``, kept to ``whole_run``'s
    end (its command imports what it needs as it goes)."""
    try:  # from the handlers on, a signal is one line and exit 130, whatever is importing
        if plain is None and command in CACHED_COMMANDS:
            from commtax.cli.compiled import cache_for, compiled_once
            from commtax.cli.plugins import plugins_found_cheaply

            whole_run.enter_context(compiled_once(cache_for(command)))
            whole_run.enter_context(plugins_found_cheaply())
        if plain is not None:
            # the cyclic GC paused while the estimate path imports: its ~30,000 objects (classes, schemas, tables)
            # live to the exit, and the ~70 collections their making set off (~20 ms) free a few hundred; frozen,
            # they are skipped by the estimate's collections and the interpreter's at exit (~60 ms of a ~75 ms exit)
            gc.disable()
            try:
                from commtax.cli.compiled import compiled_once
                from commtax.cli.plugins import plugins_found_cheaply

                # the dataclasses' methods, forward references and patterns cached; pydantic's plugins (none
                # declared) found without importlib.metadata
                with compiled_once(), plugins_found_cheaply():
                    from commtax.cli.estimate import estimate_job
            finally:
                gc.freeze()
                gc.enable()
        else:
            gc.disable()  # as above: typer, click and the command's module live to the exit
            try:
                _register(command)
            finally:
                gc.freeze()
                gc.enable()
        if signals.RECEIVED:  # raised inside an import-lock callback, where Python ignores exceptions
            raise KeyboardInterrupt(signals.RECEIVED[0])
    except Exception as e:  # Python wraps an interrupt raised while a class is built ("Error calling __set_name__")
        if (cause := _interrupt_in(e)) is None:
            raise
        _interrupted(cause)
    except KeyboardInterrupt as e:  # a signal while the command's modules import: still one line, exit 130
        _interrupted(e)
    return run_plain(estimate_job, plain) if plain is not None else run_app(command)


def _register(command: str | None) -> None:
    """typer's app with ``command`` (all commands when it names none), once the output options are checked."""
    import typer

    from commtax.cli.io import refuse_folder_outputs
    from commtax.cli.main import COMMANDS, register_commands

    try:
        refuse_folder_outputs(sys.argv[1:])
    except typer.Exit as e:
        sys.exit(e.exit_code)
    register_commands({command} if command in COMMANDS else None)


def _interrupted(e: KeyboardInterrupt) -> None:
    print(f"error: interrupted{f' ({e})' if str(e) else ''}", file=sys.stderr)
    forget_caught_interrupt()
    sys.exit(130)  # errors.EXIT_INTERRUPTED


def plain_estimate_args(args: list[str]) -> dict[str, Any] | None:
    """``estimate``'s keyword arguments from its command line (after ``estimate``) when it is one typer would read
    the same way: one job file, ``--json`` at most once, each file option at most once with a value that is
    neither empty, nor an option, nor a folder (``x/``); None for any other (typer then reads and reports it)."""
    kw: dict[str, Any] = {}
    rest = iter(args)
    for arg in rest:
        option, eq, value = arg.partition("=")
        if arg == "--json" and "json_out" not in kw:
            kw["json_out"] = True
        elif option in ESTIMATE_FILE_OPTIONS and ESTIMATE_FILE_OPTIONS[option] not in kw:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-") or value.endswith("/"):
                return None
            kw[ESTIMATE_FILE_OPTIONS[option]] = Path(value)
        elif arg and not arg.startswith("-") and "job_file" not in kw:
            kw["job_file"] = Path(arg)
        else:
            return None
    return kw if "job_file" in kw else None


def run_plain(command: Any, kwargs: dict[str, Any]) -> int:
    """``command(**kwargs)``'s exit status, an error reported as the typer command would report it (one line)."""
    try:
        command(**kwargs)
        return 0
    except Exception as e:  # noqa: BLE001 - user_errors sorts it: bad input is one line, a bug its traceback
        error: BaseException = e
    except KeyboardInterrupt as e:
        error = e
    import typer

    from commtax.cli.io import user_errors

    def again() -> None:
        raise error

    try:
        user_errors(again)()
    except typer.Exit as e:
        return e.exit_code
    return 0


def forget_caught_interrupt() -> None:
    """CPython 3.11 marks a KeyboardInterrupt that left code run by ``exec(str)`` (dataclasses and pydantic build
    methods so, while the command's modules import) as unhandled even once caught, and the process then ends by
    SIGINT (-2) instead of exiting 130 (a CI rehearsal, and one run in eight signalled 65-225 ms after start-up).
    Running any string clears the mark (Python/pythonrun.c, run_eval_code_obj)."""
    exec("")  # noqa: S102 - an empty string: the reset is the point


def _interrupt_in(e: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP as ``Interrupted``) that caused ``e``, if one did."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def run_app(command: str | None) -> int:
    """``app()`` with click's usage errors (a range, a choice, a missing file or argument, an unknown option)
    as one ``error:`` line and exit 2, as the rest of the CLI reports bad input, not click's usage block."""
    from commtax.cli.main import COMMANDS, app

    try:
        rv = app(standalone_mode=False)
    except Exception as e:
        if type(e).__name__ == "Abort":  # click's: Ctrl-C or end of input at a prompt (cluster down --all)
            print("error: aborted", file=sys.stderr)
            return 130
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):  # not a click exception
            raise
        from commtax.cli.io import safe_text

        where = f"commtax {command} --help" if command in COMMANDS else "commtax --help"
        message = " ".join(safe_text(e.format_message()).split()).rstrip(".")
        print(f"error: {message}; see `{where}`", file=sys.stderr)
        return 2 if e.exit_code in (1, 2) else e.exit_code
    return rv if isinstance(rv, int) else 0
