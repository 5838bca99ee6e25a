"""The reference revision a benchmark times beside this one, in the same run: ``git archive REV`` of this clone,
extracted to a temporary folder (a host whose speed moves by ~2x over a day moves both; their ratio is the
figure to read). Shared by ``bench_search.py`` and ``bench_estimate.py``."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RELEASE = "a5401c3"  # the issue-5 release: issue 17's goals are ratios against it, timed in the same run


class ReferenceUnavailable(RuntimeError):
    """The revision could not be extracted (a shallow clone or an export without git history)."""


@contextmanager
def archived(rev: str) -> Iterator[Path]:
    """The tree of ``rev`` in a temporary folder, removed on exit; :class:`ReferenceUnavailable` if git cannot
    give it."""
    with tempfile.TemporaryDirectory(prefix="commtax-ref-") as tmp:
        try:
            tar = subprocess.run(
                ["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True, timeout=120
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise ReferenceUnavailable(f"not available ({type(e).__name__}): a clone with its history has it") from e
        yield Path(tmp)
