"""Results are written whole or not at all: a temporary file beside the target, then a rename.

A reader (or a crash half-way, or a rank dying in the next measurement) sees the old file or the
new one, never a mix; nothing the user had is overwritten half-way. Only a regular file (or
nothing) is replaced that way:

* a symlink keeps pointing where it did: its target is replaced;
* a character device (``/dev/null``, ``/dev/stdout``) or a FIFO with a reader is written through,
  in place, and a note says so; a FIFO nobody reads, a socket or a block device is refused;
* a new file gets the mode the umask allows (0666 & ~umask), an existing file keeps its mode
  (and, when root writes it, its owner);
* a missing folder is an error, never created (``--out /nonexistent/x.json`` creates nothing);
* SIGTERM/SIGHUP during the write remove the temporary file, as Ctrl-C does.

Every OSError becomes one ``SpecError`` line naming the path.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commtax.errors import SpecError, os_error_line
from commtax.signals import terminate_as_interrupt

NAME_MAX = 255  # bytes per path component on Linux file systems


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def target_of(path: Path | str) -> tuple[Path, os.stat_result | None]:
    """Where a write to ``path`` lands (symlinks followed) and its stat (None: a new file).

    Raises SpecError, before anything is written, for what cannot be written: a missing folder,
    a directory, a socket or block device, a name too long for the file system.
    """
    path = Path(path)
    if not str(path) or str(path).endswith("/"):
        raise SpecError(f"{path}: an output path names a file, not a folder")
    if len(path.name.encode(errors="surrogateescape")) > NAME_MAX:
        raise SpecError(
            f"{path}: file name too long ({len(path.name.encode(errors='surrogateescape'))} bytes; at most {NAME_MAX})"
        )
    try:
        st = os.stat(path)  # follows symlinks, /proc magic links too (/dev/stdout on a pipe)
    except FileNotFoundError:
        st = None
    except OSError as e:
        e.filename = str(path)
        raise SpecError(os_error_line(e, "write")) from None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        if stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode):
            raise SpecError(f"{path}: is a {_kind(st.st_mode)}; refusing to write to it")
        return path, st  # written through, in place, by the path the user gave
    real = Path(os.path.realpath(path))
    if st is None:
        parent = real.parent
        if not parent.is_dir():
            raise SpecError(f"{path}: folder {parent} does not exist (create it first; commtax creates no folders)")
        return real, None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"{path}: is a directory; give a file name")
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode):
        raise SpecError(f"{path}: is a {_kind(st.st_mode)}; refusing to write to it")
    return real, st


def check_writable(path: Path | str) -> None:
    """Fail now, with one line, if ``write_atomic(path, …)`` would fail later (checked before long work)."""
    real, st = target_of(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        return
    if not os.access(real.parent, os.W_OK | os.X_OK):
        raise SpecError(f"{path}: cannot write in folder {real.parent} (permission denied)")
    if st is not None and not os.access(real, os.W_OK) and os.geteuid() != 0:
        raise SpecError(f"{path}: permission denied")


def _write_through(path: Path, real: Path, st: os.stat_result, write: Callable[[Path], None]) -> Path:
    """Write to a character device or FIFO in place (nothing is replaced), via a temp file in $TMPDIR."""
    if stat.S_ISFIFO(st.st_mode):
        try:
            fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:
                raise SpecError(f"{path}: is a FIFO that nobody reads; nothing written") from None
            raise SpecError(os_error_line(e, "write")) from None
        os.set_blocking(fd, True)
    else:
        try:
            fd = os.open(real, os.O_WRONLY)
        except OSError as e:
            raise SpecError(os_error_line(e, "write")) from None
    import tempfile  # here, not at the top: a plain `estimate --json` writes no file and skips its ~15 M instructions

    tmp_fd, tmp = tempfile.mkstemp(prefix="commtax-", suffix=real.suffix[:16])
    os.close(tmp_fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as src, os.fdopen(fd, "wb", closefd=True) as dst:
            fd = -1
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    finally:
        Path(tmp).unlink(missing_ok=True)
        if fd >= 0:
            os.close(fd)
    if not str(real).startswith("/dev/std") and str(real) != "/dev/null":
        print(f"note: {path} is a {_kind(st.st_mode)}: written in place, not replaced", file=sys.stderr)
    return path


def write_atomic_with(path: Path | str, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path`` (same suffix), fsync it, rename it over ``path``."""
    path = Path(path)
    real, st = target_of(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        return _write_through(path, real, st, write)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    import tempfile  # here, not at the top: see _write_through

    with terminate_as_interrupt():
        try:
            fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name[:64]}.", suffix=real.suffix[:16])
        except OSError as e:
            e.filename = e.filename or str(path)
            raise SpecError(os_error_line(e, "write")) from None
        try:
            os.fchmod(fd, mode)
            if st is not None and os.geteuid() == 0:
                os.fchown(fd, st.st_uid, st.st_gid)
            os.close(fd)
            write(Path(tmp))
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, real)
        except BaseException as e:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(e, OSError):
                e.filename = str(path)
                raise SpecError(os_error_line(e, "write")) from None
            raise
    return path


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write text or bytes to ``path`` atomically."""
    if isinstance(data, str):
        return write_atomic_with(path, lambda tmp: tmp.write_text(data))
    return write_atomic_with(path, lambda tmp: tmp.write_bytes(data))


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def strict_json(data: Any, **kwargs: Any) -> str:
    """JSON text that every parser accepts: nan and ±inf become null (never ``NaN``/``Infinity``)."""

    def default(o: Any) -> Any:
        if hasattr(o, "item"):  # numpy scalars
            o = o.item()
        if isinstance(o, (int, float)):
            return _finite(float(o))
        if isinstance(o, Path):
            return str(o)
        raise TypeError(f"{type(o).__name__} is not JSON serialisable")

    return json.dumps(_finite(data), allow_nan=False, default=default, **kwargs)


TRACE_SUFFIXES = (".json", ".json.gz", ".gz")


def refuse_overwriting_inputs(outputs: dict[str, Path | str | None], inputs: list[Path | str | None]) -> None:
    """Raise SpecError (one line) when an output option names one of the command's inputs (or another output),
    or a trace-like file inside an input folder: writing it would replace what the command reads."""

    def same(a: Path, b: Path) -> bool:
        try:
            return os.path.samefile(a, b)  # hard links and symlinks too
        except OSError:
            return os.path.realpath(a) == os.path.realpath(b)

    seen: dict[str, Path] = {}
    for opt, out in outputs.items():
        if out is None or str(out) in ("-", "/dev/null", "/dev/stdout", "/dev/stderr"):
            continue
        out = Path(out)
        for inp in (Path(p) for p in inputs if p is not None):
            if inp.is_dir() and not out.is_dir():
                inside = os.path.realpath(out).startswith(os.path.realpath(inp) + os.sep)
                if inside and out.name.endswith(TRACE_SUFFIXES):
                    raise SpecError(
                        f"{opt}: {out} is inside the input folder {inp}, where it would be read as an input next "
                        "time; write it elsewhere"
                    )
            elif same(out, inp):
                raise SpecError(
                    f"{opt}: {out} is also an input ({inp}); writing it would replace it: give another file"
                )
        for other_opt, other in seen.items():
            if same(out, other):
                raise SpecError(f"{opt}: {out} is also {other_opt}; give each output its own file")
        seen[opt] = out
