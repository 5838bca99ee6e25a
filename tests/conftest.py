"""Shared fixtures: small jobs built from the catalog, and where the published validation data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commtax.spec import load_job

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


def pytest_collection_modifyitems(config, items):
    """``timing`` tests assert measured times, which host load moves: they run only when asked for."""
    if os.environ.get("COMMTAX_TIMING") == "1":
        return
    skip = pytest.mark.skip(
        reason="asserts measured times (host load moves them): run with COMMTAX_TIMING=1 on a quiet host"
    )
    for item in items:
        if "timing" in item.keywords:
            item.add_marker(skip)
