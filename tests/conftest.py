"""Shared fixtures: small jobs built from the catalog, and where the published validation data lives."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import settings

from commtax.spec import load_job

# no per-example deadline: hypothesis' 200 ms default fails on a loaded CI host, not on a wrong answer (tests that
# need a limit set their own); every test keeps pytest-timeout's per-test limit
settings.register_profile("commtax", deadline=None)
settings.load_profile("commtax")

REPO = Path(__file__).resolve().parents[1]
VALIDATION_DIR = REPO / "validation"  # a copy of ../shared/validation ships with the repo


def job_dict(**plan) -> dict:
    base_plan = {
        "tp": 8,
        "pp": 4,
        "dp": 8,
        "sequence_parallel": True,
        "zero": 1,
        "recompute": "selective",
        "micro_batch": 1,
    }
    base_plan.update(plan)
    return {
        "model": "llama2-70b",
        "cluster": {
            "gpu": "h100-sxm5-80gb",
            "num_gpus": 256,
            "gpus_per_node": 8,
            "intra_node": "nvlink4",
            "inter_node": "ib-ndr",
            "nics_per_node": 8,
        },
        "plan": base_plan,
        "training": {"seq_len": 4096, "global_batch": 1024, "precision": "bf16"},
    }


@pytest.fixture
def seed_job():
    return load_job(job_dict())


@pytest.fixture
def validation_dir() -> Path:
    if not (VALIDATION_DIR / "public_runs.csv").exists():
        pytest.skip(f"published validation data not found at {VALIDATION_DIR} (the repo ships it in validation/)")
    return VALIDATION_DIR


# ----------------------------------------------------------------------------- the model tier (make test-model)
# A test module is in the model tier when everything it imports runs spec -> schedule: the root modules, spec,
# workload, costs, schedule, and no torch, typer or subprocess (no netns, no CLI, no launched ranks). Decided from
# the module's own imports (every import statement, nested ones too), so a new test file is sorted by what it uses.
MODEL_PACKAGES = ("units", "errors", "atomic", "signals", "spec", "workload", "costs", "schedule")
NOT_MODEL = ("torch", "typer", "subprocess", "multiprocessing")


def _imports(path: Path) -> set[str]:
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


_TIER: dict[Path, bool] = {}


def in_model_tier(path: Path) -> bool:
    if path not in _TIER:
        mods = _imports(path)
        ours = [m.split(".")[1] for m in mods if m.startswith("commtax.")]
        _TIER[path] = all(p in MODEL_PACKAGES for p in ours) and not any(
            m == x or m.startswith(x + ".") for m in mods for x in NOT_MODEL
        )
    return _TIER[path]


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the model tier; skip the ``timing`` tests (measured times, which host load moves) unless asked for."""
    timing = os.environ.get("COMMTAX_TIMING") == "1"
    skip = pytest.mark.skip(
        reason="asserts measured times (host load moves them): run with COMMTAX_TIMING=1 on a quiet host"
    )
    for item in items:
        if in_model_tier(Path(str(item.path))):
            item.add_marker(pytest.mark.model)
        if "timing" in item.keywords and not timing:
            item.add_marker(skip)


# issue 21's winner's-curse job: Llama-2 70B on 256 A100-80GB, the plan search picks (tp2 pp8 vp10, no recompute)
LLAMA_256_A100 = {
    "model": "llama2-70b",
    "cluster": {
        "gpu": "a100-sxm4-80gb",
        "num_gpus": 256,
        "gpus_per_node": 8,
        "intra_node": "nvlink3",
        "inter_node": "ib-hdr",
        "nics_per_node": 8,
    },
    "plan": {"tp": 2, "pp": 8, "vp": 10, "recompute": "none", "sequence_parallel": True, "micro_batch": 1},
    "training": {"seq_len": 4096, "global_batch": 1024, "precision": "bf16"},
}


PROGRESS = REPO / "out" / "pytest-progress.log"  # .ci/run prints its tail when the run fails or times out


def pytest_sessionstart(session) -> None:
    PROGRESS.parent.mkdir(exist_ok=True)
    PROGRESS.write_text("")


def pytest_runtest_logstart(nodeid, location) -> None:
    """One line per test as it starts (seconds since boot, load average): a CI run that ends without pytest's
    summary still says which test was running and how busy the host was."""
    with open(PROGRESS, "a") as f:
        f.write(f"{time.monotonic():10.1f} load {os.getloadavg()[0]:5.2f} {nodeid}\n")
