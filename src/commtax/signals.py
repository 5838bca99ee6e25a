"""SIGTERM and SIGHUP handled like Ctrl-C, so every clean-up path a command has runs for all three.

``terminate_as_interrupt()`` makes SIGTERM/SIGHUP raise ``errors.Interrupted`` (a KeyboardInterrupt)
in the main thread: ``finally`` blocks remove temporary files, shut worker pools down, kill
launched process groups and tear emulated clusters down, and the command exits 130 with
partial results flagged. Outside the main thread (or when a handler other than the default is
installed) it changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from commtax.errors import Interrupted

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


RECEIVED: list[str] = []  # every signal _raise_interrupted saw: Python drops an exception raised inside a
# weakref or import-lock callback ("Exception ignored in ..."), so the CLI also checks this list


def _raise_interrupted(signum: int, frame) -> None:
    RECEIVED.append(signal.Signals(signum).name)
    raise Interrupted(RECEIVED[-1])


@contextlib.contextmanager
def terminate_as_interrupt(signals: tuple[int, ...] = TERMINATING) -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise ``Interrupted`` like Ctrl-C raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}
    for s in signals:
        current = signal.getsignal(s)
        if current in (signal.SIG_DFL, None) or current is _raise_interrupted:
            old[s] = current
            signal.signal(s, _raise_interrupted)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def install() -> None:
    """For a whole process (the CLI's entry point): SIGTERM/SIGHUP raise ``Interrupted`` from now on, and an
    interrupt Python cannot raise where it lands is remembered, not printed (``quiet_unraisable_interrupts``)."""
    if threading.current_thread() is threading.main_thread():
        for s in TERMINATING:
            if signal.getsignal(s) in (signal.SIG_DFL, None):
                signal.signal(s, _raise_interrupted)
        if not getattr(sys.unraisablehook, "_commtax", False):
            sys.unraisablehook = quiet_unraisable_interrupts(sys.unraisablehook)


def quiet_unraisable_interrupts(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """``sys.unraisablehook`` that keeps a Ctrl-C/SIGTERM/SIGHUP raised inside an import-lock or weakref callback
    (Python drops it there and printed "Exception ignored in: <function _get_module_lock.<locals>.cb>" with a
    traceback) in ``RECEIVED`` for the CLI's check, and prints nothing; anything else goes to ``hook``."""

    def quiet(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            if not RECEIVED:  # _raise_interrupted has noted SIGTERM/SIGHUP already; Ctrl-C's handler does not
                RECEIVED.append(str(unraisable.exc_value) or "SIGINT")
            return
        hook(unraisable)

    quiet._commtax = True  # type: ignore[attr-defined]
    return quiet


class Deferred:
    """The first of the deferred signals that arrived inside ``deferred()`` (its name), or None."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None

    def _note(self, signum: int, frame) -> None:  # only records: never raises inside pool or lock code
        if self.signal is None:
            self.signal = signal.Signals(signum).name


@contextlib.contextmanager
def deferred(signals: tuple[int, ...] = (signal.SIGINT, *TERMINATING)) -> Iterator[Deferred]:
    """Within the block Ctrl-C, SIGTERM and SIGHUP only set a flag, which the block checks between results.

    A worker pool's machinery (concurrent.futures, multiprocessing) takes non-reentrant locks in the main
    thread (``ProcessPoolExecutor.submit`` holds ``_shutdown_lock``); an exception raised by a signal handler
    while one is held leaves it held, and the clean-up's ``shutdown()`` then blocks on it for ever (issue 12:
    a SIGHUPped search hung on a futex). Only Python's Ctrl-C handler and ``_raise_interrupted`` (``install``,
    ``terminate_as_interrupt``) are replaced: a default SIGTERM still ends the process, and outside the main
    thread nothing changes."""
    flag = Deferred()
    if RECEIVED:  # one arrived earlier and its exception was dropped (an import-lock callback): stop at once
        flag.signal = RECEIVED[0]
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    old = {}
    for s in signals:
        current = signal.getsignal(s)
        if current in (signal.default_int_handler, _raise_interrupted):
            old[s] = current
            signal.signal(s, flag._note)
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
