"""Helpers for the dist/cluster/bench tests: run the dist CLI in a subprocess, skip without netns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``python -m commtax.cli.measure ARGS`` (the module ``commtax bench|cluster|calibrate`` run), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "commtax.cli.measure", *args], capture_output=True, text=True, timeout=timeout, **kw
    )


def require_netns() -> None:
    import pytest

    from commtax.measure.cluster import ClusterError, check_host

    try:
        check_host()
    except ClusterError as e:
        pytest.skip(f"needs root and Linux network namespaces: {e}")


def records(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text()) if Path(path).exists() else []
