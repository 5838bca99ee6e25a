"""The estimate path does not load NumPy: ``costs.elementwise`` imports it only when given arrays (issue 17: the
search's formulas on arrays are estimate's own, and one plan's estimate keeps its start time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_estimate_path_does_not_load_numpy():
    """The helpers import NumPy only when given arrays: one plan's estimate stays without it (start time)."""
    example = Path(__file__).resolve().parents[1] / "examples" / "llama2-70b-h100.yaml"
    code = (
        "import sys; from commtax.schedule.analytical import estimate; from commtax.spec import load_job; "
        f"estimate(load_job({str(example)!r})); print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
