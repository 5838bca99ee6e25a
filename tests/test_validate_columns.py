"""validate names the CSV columns it does not read and refuses rows it cannot model (issue 22)."""

from __future__ import annotations

import csv
from pathlib import Path

from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.decide.validate import KNOWN_COLUMNS, UNMODELLED_COLUMNS, unknown_columns, unmodelled, validate

register_commands()
VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def test_the_published_files_have_no_unknown_column():
    for name, kind in (
        ("public_runs", "runs"),
        ("public_runs_more", "runs"),
        ("public_moe_runs", "runs"),
        ("public_collectives", "collectives"),
    ):
        header = next(csv.reader((VALIDATION / f"{name}.csv").open()))
        assert unknown_columns(header, kind) == [], name


def test_a_row_with_a_column_the_model_cannot_honour_is_refused_with_its_reason(tmp_path, monkeypatch):
    """The mechanism that kept MoE rows from being scored as dense ones before MoE was modelled."""
    import commtax.decide.validate as V

    monkeypatch.setitem(V.UNMODELLED_COLUMNS, "pipeline_schedule_override", "a hand-written pipeline schedule")
    assert unmodelled({"pipeline_schedule_override": "zb-v"}).startswith("pipeline_schedule_override='zb-v'")
    assert unmodelled({"pipeline_schedule_override": ""}) is None
    rows = list(csv.DictReader((VALIDATION / "public_runs.csv").open()))[:2]
    out = tmp_path / "runs.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], "pipeline_schedule_override"])
        w.writeheader()
        w.writerow({**rows[0], "pipeline_schedule_override": "zb-v"})
        w.writerow({**rows[1], "pipeline_schedule_override": ""})
    rep = validate(out)
    assert rep.refused == [rows[0]["id"]] and "hand-written pipeline schedule" in rep.rows[0].reason
    assert rep.rows[1].predicted is not None
    r = CliRunner().invoke(app, ["validate", str(out)], terminal_width=80)
    assert f"refused {rows[0]['id']}: pipeline_schedule_override='zb-v'" in r.output


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
    assert {"num_experts", "top_k", "ep", "etp", "dispatcher", "moe_layers"} <= KNOWN_COLUMNS["runs"]  # modelled


def test_validate_at_80_columns_keeps_the_numbers_in_their_columns_with_long_ids():
    """public_runs_more.csv has 70-character ids: they fold onto a second line, the numbers stay in the table."""
    from commtax.cli.io import console

    width = console.width
    console.width = 80
    try:
        r = CliRunner().invoke(app, ["validate", str(VALIDATION / "public_runs_more.csv")])
    finally:
        console.width = width
    assert r.exit_code in (0, 1), r.output
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.lstrip().startswith("id ") and "measured" in line)
    col = header.index("measured") + len("measured")
    row = next(line for line in lines if line.lstrip().startswith("mcore24_h100_1 "))
    assert row[:col].rstrip().endswith("36,260")  # the measured figure sits under its header
