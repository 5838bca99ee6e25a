"""Every command is a thin layer over a library function (issue 17): no function in cli/ grows back into a
100-line command that decides, renders or orchestrates; that work lives in decide/, report/, trace/, measure/ and
schedule/, where tests call it without typer."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[1] / "src" / "commtax" / "cli"
MAX_BODY_LINES = 60  # after the docstring; option plumbing (bench ddp's 20 options into its config) fits


def body_lines(fn: ast.FunctionDef) -> int:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_cli_function_body_is_longer_than_the_limit():
    long = {
        f"{f.name}:{n.name} ({body_lines(n)} lines)"
        for f in sorted(CLI.glob("*.py"))
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
        if isinstance(n, ast.FunctionDef) and body_lines(n) > MAX_BODY_LINES
    }
    assert long == set()


def test_the_cli_builds_no_tables():
    """Tables are report/'s: a command prints what a report function renders."""
    builds = {
        f"{f.name}:{n.lineno}"
        for f in sorted(CLI.glob("*.py"))
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) in ("add_column", "new_table")
    }
    assert builds == set()
