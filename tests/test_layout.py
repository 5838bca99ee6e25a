"""The layout is the architecture: a package per pipeline stage, imports that only run down the stack
(DESIGN.md: cli → report → trace → {decide, measure} → schedule → costs → workload → spec → root)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "commtax"
RANK = {
    "spec": 0,
    "workload": 1,
    "costs": 2,
    "schedule": 3,
    "decide": 4,
    "measure": 4,
    "trace": 5,
    "report": 6,
    "cli": 7,
}
ROOT_MODULES = {"units", "errors", "atomic", "signals"}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
            if node.module == "commtax":
                out += [f"commtax.{a.name}" for a in node.names]
    return out


def _modules() -> list[tuple[Path, tuple[str, ...]]]:
    return [(f, f.relative_to(SRC).with_suffix("").parts) for f in sorted(SRC.rglob("*.py"))]


def test_the_root_holds_only_units_errors_atomic_and_signals():
    root = {parts[0] for _, parts in _modules() if len(parts) == 1} - {"__init__"}
    assert root == ROOT_MODULES
    packages = {parts[0] for _, parts in _modules() if len(parts) > 1}
    assert packages == set(RANK)


def test_imports_only_run_down_the_stack():
    up = []
    for f, parts in _modules():
        here = RANK.get(parts[0], -1)  # a root module ranks below every package
        for m in _imports(f):
            seg = m.split(".")
            if seg[0] != "commtax" or len(seg) < 2:
                continue
            if seg[1] in RANK and RANK[seg[1]] > here:
                up.append(f"{'/'.join(parts)}: imports {m}")
    assert up == []


def test_typer_lives_in_cli_and_torch_in_measure():
    wrong = []
    for f, parts in _modules():
        for m in _imports(f):
            top = m.split(".")[0]
            if top == "typer" and parts[0] != "cli":
                wrong.append(f"{'/'.join(parts)}: typer")
            if top == "torch" and parts[0] != "measure":
                wrong.append(f"{'/'.join(parts)}: torch")
    assert wrong == []
