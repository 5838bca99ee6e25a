"""Results are written whole or not at all: a temporary file beside the target, then a rename.

A reader (or a crash half-way, or a rank dying in the next measurement) sees the old file or the
new one, never a mix; nothing the user had is overwritten half-way.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def write_atomic_with(path: Path | str, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path`` (same suffix), fsync it, rename it over ``path``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write text or bytes to ``path`` atomically."""
    if isinstance(data, str):
        return write_atomic_with(path, lambda tmp: tmp.write_text(data))
    return write_atomic_with(path, lambda tmp: tmp.write_bytes(data))
