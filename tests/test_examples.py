"""Every shipped example runs as its header says: job files estimate and fit memory, cluster, profile and price
files load as the commands that take them read them, and the scripts' Python compiles."""

from __future__ import annotations

import py_compile

import pytest
import yaml
from conftest import REPO
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands

register_commands()
EXAMPLES = REPO / "examples"
YAMLS = sorted(EXAMPLES.rglob("*.yaml"))


def kind(path) -> str:
    data = yaml.safe_load(path.read_text())
    if "model" in data and "plan" in data:
        return "job"
    if "levels" in data:
        return "profile"
    if "gpus" in data or "nodes" in data or "site" in data:
        return "prices"
    if "intra_node" in data and "inter_node" in data:
        return "cluster"
    return "unknown"


def test_every_example_yaml_is_a_kind_a_command_reads():
    assert YAMLS and [p for p in YAMLS if kind(p) == "unknown"] == []


@pytest.mark.parametrize("path", [p for p in YAMLS if kind(p) == "job"], ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_job_estimates_and_fits(path):
    r = CliRunner().invoke(app, ["estimate", str(path), "--json"])
    assert r.exit_code == 0, r.output  # exit 1 is "does not fit memory": no shipped example shows that by accident
    out = yaml.safe_load(r.stdout)
    assert out["fits"] is True and out["step_time_s"] > 0


@pytest.mark.parametrize("path", [p for p in YAMLS if kind(p) == "cluster"], ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_cluster_loads(path):
    from commtax.spec import Cluster, build, load_catalog, resolve_cluster

    assert build(Cluster, resolve_cluster(str(path), load_catalog()), "cluster").num_gpus >= 2


@pytest.mark.parametrize("path", [p for p in YAMLS if kind(p) == "profile"], ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_profile_is_one_estimate_accepts(path):
    from commtax.spec import Profile

    assert Profile(**yaml.safe_load(path.read_text())).levels


def test_example_prices_override_loads():
    from commtax.decide.cost import load_prices

    for p in [p for p in YAMLS if kind(p) == "prices"]:
        assert load_prices(p).node("rtx-4090-24gb").gpus_per_node > 0


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.py")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_script_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)
