"""Errors by kind (STYLE.md §4). A plan that does not fit memory is a result (Breakdown.fits), not an error.

Also what every command shares about failing well: exit codes, a short sanitised excerpt of user
input for messages (never a whole file: a job's ``profile:`` can name any file, a private key
included), and one line for an OSError on a user's path.
"""

from __future__ import annotations

import errno
import functools
import math
import re
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd program
# set in the ranks' environment by the commtax command that launched them: an interrupt exits 130 without a line of
# the rank's own, the launching command prints the one line
LAUNCHED_ENV = "COMMTAX_LAUNCHED"
EXCERPT_CHARS = 40


class SpecError(ValueError):
    """Bad user input: shown as one line naming the field and the fix; the CLI exits 2."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP (see ``commtax.signals``): partial results are flagged, exit 130."""


@functools.cache
def _control() -> re.Pattern[str]:
    """Terminal control characters and Unicode line breaks: compiled at first use, as only error messages read it
    (its character table costs ~0.7 ms of every start-up)."""
    return re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def excerpt(value: Any, limit: int = EXCERPT_CHARS, quote: bool = True) -> str:
    """A short, printable, single-line rendering of user input for an error message.

    Strings show only their first line, cut to ``limit`` characters (a PEM key shows its
    ``-----BEGIN …-----`` line and no key material); containers are never walked (an alias
    bomb would take forever), only named by type and length.
    """
    if isinstance(value, str):
        first, _, rest = value.strip().partition("\n")
        text = _control().sub("?", first)
        cut = len(text) > limit or bool(rest.strip())
        return (repr(text[:limit]) if quote else text[:limit]) + ("…" if cut else "")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    if isinstance(value, dict):
        return f"a mapping of {len(value)} keys"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    return f"a {type(value).__name__}"


def os_error_line(e: OSError, what: str = "") -> str:
    """One line for an OSError on a user's path: ``PATH: reason`` (with ``what`` was being done)."""
    name = e.filename if e.filename is not None else "(path)"
    reason = e.strerror or type(e).__name__
    if e.errno == errno.ENAMETOOLONG:
        reason = "file name too long (at most 255 bytes per path component)"
    return f"{excerpt(str(name), 120).strip(chr(39))}: {f'cannot {what}: ' if what else ''}{reason}"


def finite_or_none(x: Any) -> Any:
    """nan/inf -> None (JSON null); every other value unchanged."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def safe_text(text: str) -> str:
    """``text`` (a file name, a message quoting one) with terminal control characters escaped: an escape
    sequence cannot recolour or clear the terminal, a newline cannot forge another output line."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)
