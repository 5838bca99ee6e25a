"""A command asked for JSON does not import rich (~100 M instructions of its start-up): its tables, progress bar
and charts import it where they are drawn (``cli.io.progress`` yields a no-op when disabled)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

JOB = str(REPO / "examples" / "llama2-70b-h100.yaml")
COMMANDS = {
    "search": ["search", JOB, "--tp", "8", "--pp", "4", "--micro-batch", "1", "--zero", "1", "--workers", "1"],
    "simulate": ["simulate", JOB],
    "validate": ["validate", str(REPO / "validation" / "public_collectives.csv")],
    "cost": ["cost", JOB],
    "compare": ["compare", str(REPO / "examples" / "compare" / "llama2-70b-256-h100.yaml"), "--gpu", "a100-sxm4-80gb"],
    "advise": ["advise", JOB],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_json_does_not_import_rich(name):
    code = (
        "import sys; from commtax.cli.entry import main; sys.argv = ['commtax', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('rich' in sys.modules, rc, file=sys.stderr)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, *COMMANDS[name], "--json"], capture_output=True, text=True, timeout=300
    )
    assert run.stderr.split()[-2:] == ["False", "0"], run.stderr[-2000:]
