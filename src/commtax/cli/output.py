"""JSON records on stdout and in ``--out`` files, without typer or rich: what ``commtax estimate --json`` needs.

``--json`` prints the record on stdout and nothing else; ``--out FILE`` writes the same record, atomically; the
JSON is strict (nan and ±inf become null). :mod:`commtax.cli.io` re-exports both for the other commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from commtax.atomic import strict_json, write_atomic


def to_json(data: Any) -> str:
    """Strict JSON (nan and ±inf become null), indented, with a final newline."""
    return strict_json(data, indent=2) + "\n"


def emit(data: Any, json_out: bool, out: Path | None = None) -> None:
    """Write ``data`` as JSON to ``out`` (atomically) when given, and to stdout when ``json_out``."""
    text = to_json(data)
    if out is not None:
        write_atomic(out, text)
    if json_out:
        sys.stdout.write(text)
