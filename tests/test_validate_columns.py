"""validate names the CSV columns it does not read and refuses rows it cannot model (issue 22)."""

from __future__ import annotations

import csv
from pathlib import Path

from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.decide.validate import KNOWN_COLUMNS, UNMODELLED_COLUMNS, unknown_columns, unmodelled, validate

register_commands()
VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def test_the_published_dense_files_have_no_unknown_column():
    for name, kind in (("public_runs", "runs"), ("public_runs_more", "runs"), ("public_collectives", "collectives")):
        header = next(csv.reader((VALIDATION / f"{name}.csv").open()))
        assert unknown_columns(header, kind) == [], name


def test_an_moe_row_is_refused_with_its_reason_not_scored_as_dense():
    assert unmodelled({"num_experts": "64", "top_k": "8"}).startswith("num_experts='64': mixture-of-experts")
    assert unmodelled({"num_experts": "1", "ep": "1", "dispatcher": ""}) is None  # one expert: a dense run
    rep = validate(VALIDATION / "public_moe_runs.csv")
    assert rep.rows and all(r.predicted is None and "not modelled" in r.reason for r in rep.rows)
    assert rep.mape_pct is None and len(rep.refused) == len(rep.rows)


def test_an_unknown_column_is_named_in_the_output(tmp_path):
    rows = list(csv.DictReader((VALIDATION / "public_runs.csv").open()))[:2]
    out = tmp_path / "runs.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], "wattage_W"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "wattage_W": "700"})
    r = CliRunner().invoke(app, ["validate", str(out)], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "columns this validator does not read (ignored): wattage_W" in r.output
    assert unknown_columns([*rows[0], "wattage_W"], "runs") == ["wattage_W"]


def test_the_column_sets_are_disjoint_so_a_branch_can_move_a_column_across():
    assert not set(UNMODELLED_COLUMNS) & KNOWN_COLUMNS["runs"]
