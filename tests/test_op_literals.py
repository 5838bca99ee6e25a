"""Op groups, kinds and collectives are ``Literal``s (``workload.step.Group``, ``ComputeKind``, ``CollectiveOp``):
every op the builders make holds one of their values, and no code builds an op with, or compares an op's group,
kind or collective with, a bare string outside them (a misspelt ``"dpp"`` would silently never match)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import get_args

import pytest
from conftest import REPO

from commtax.costs.collectives import DEEPEP_OPS, OPS
from commtax.errors import SpecError
from commtax.spec import job_with, load_job
from commtax.workload.step import Block, Collective, CollectiveOp, Compute, ComputeKind, Group, build_workload

GROUPS, KINDS, COLLECTIVES = set(get_args(Group)), set(get_args(ComputeKind)), set(get_args(CollectiveOp))
SRC = Path(__file__).resolve().parents[1] / "src" / "commtax"
DENSE = REPO / "examples" / "llama2-70b-h100.yaml"
MOE = REPO / "examples" / "moe" / "deepseek-v3-h800.yaml"
# plan changes that reach every builder: TP with and without sequence parallelism, CP, each ZeRO stage, gradient
# codecs, the MoE dispatchers and expert TP
DENSE_VARIANTS = (
    {},
    {"sequence_parallel": False},
    {"cp": 2, "pp": 2, "dp": None},
    {"zero": 0},
    {"zero": 2},
    {"zero": 3, "pp": 1, "dp": None, "framework": "fsdp"},
    {"grad_comm_dtype": "int8"},
    {"grad_comm_dtype": "powersgd_r4"},
)
MOE_VARIANTS = (
    {},
    {"moe_dispatcher": "alltoall", "schedule": "1f1b"},
    {"moe_dispatcher": "allgather", "schedule": "1f1b"},
    {"etp": 2, "tp": 2, "sequence_parallel": True, "schedule": "1f1b", "moe_dispatcher": "alltoall"},
)


def _blocks(wl) -> list[Block]:
    return [b for b in (wl.layer, wl.embed, wl.head, wl.moe_layer) if b is not None]


def _ops(wl) -> list[Compute | Collective]:
    ops = [op for b in _blocks(wl) for ph in (b.fwd, b.bwd, b.recompute) for op in ph.ops]
    return ops + [wl.pp_send, *wl.dp_step, *wl.dp_microbatch, *wl.edp_step, wl.optimizer, *wl.dp_codec]


def _built() -> list[Compute | Collective]:
    ops, built = [], 0
    for path, variants in ((DENSE, DENSE_VARIANTS), (MOE, MOE_VARIANTS)):
        job = load_job(path)
        for change in variants:
            try:
                j = job_with(job, **change) if change else job
            except SpecError as e:  # a variant the spec refuses would leave a builder unreached: say which
                pytest.fail(f"{path.name} {change}: {e}")
            ops += _ops(build_workload(j))
            built += 1
    assert built == len(DENSE_VARIANTS) + len(MOE_VARIANTS)
    return ops


def test_every_op_the_builders_make_holds_a_literal_value():
    ops = _built()
    kinds = {op.kind for op in ops if isinstance(op, Compute)}
    groups = {op.group for op in ops if isinstance(op, Collective)}
    collectives = {op.op for op in ops if isinstance(op, Collective)}
    assert kinds == KINDS  # every kind is built, none outside the Literal
    assert groups == GROUPS
    assert collectives == COLLECTIVES - {"broadcast"}  # broadcast: priced for `commtax collective`, in no step
    assert set(OPS) | set(DEEPEP_OPS) == COLLECTIVES  # what the cost model prices is the Literal
    fields = {f.name: f.type for f in dataclasses.fields(Collective)} | {
        f.name: f.type for f in dataclasses.fields(Compute)
    }
    assert (fields["group"], fields["op"], fields["kind"]) == ("Group", "CollectiveOp", "ComputeKind")


# ----------------------------------------------------------------------------- the code, parsed
ROLE = {"group": GROUPS, "kind": KINDS, "op": COLLECTIVES}
ARG = {"Compute": {3: "kind", "kind": "kind"}, "Collective": {1: "op", "op": "op", 3: "group", "group": "group"}}
# comm dicts keyed by group (PhaseCost.comm / comm_bytes, Breakdown.comm_time_s / comm_bytes_per_gpu, the simulator's
# per-device bytes and NIC weights) and cost functions whose first two arguments are a group and a collective
GROUP_KEYED = {"comm", "comm_bytes", "comm_time_s", "comm_bytes_per_gpu", "nic_weight"}
GROUP_OP_CALLS = {"collective_time", "group_size"}


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string constants an expression can evaluate to: itself, an ``a if c else b``'s branches, a tuple's items."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _strings(e)]
    return []


def _op_attr(node: ast.AST) -> str | None:
    """``x.group`` / ``op.kind`` / ``c.op``: the op field an expression reads (``kind`` only of a name ``op``: other
    records have kinds of their own, links and simulator tasks)."""
    if not isinstance(node, ast.Attribute):
        return None
    if node.attr == "group" or (node.attr == "op" and isinstance(node.value, ast.Name) and node.value.id == "c"):
        return node.attr
    if node.attr == "kind" and isinstance(node.value, ast.Name) and node.value.id in ("op", "o"):
        return "kind"
    return None


def misspelt(source: str) -> list[tuple[int, str, str]]:
    """(line, role, value) of each string used as an op's group, kind or collective that is not in its Literal."""
    out = []

    def check(role: str, node: ast.AST) -> None:
        out.extend((c.lineno, c.col_offset, role, c.value) for c in _strings(node) if c.value not in ROLE[role])

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ARG:
            roles = ARG[node.func.id]
            for i, a in enumerate(node.args):
                if i in roles:
                    check(roles[i], a)
            for k in node.keywords:
                if k.arg in roles:
                    check(roles[k.arg], k.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in GROUP_OP_CALLS and len(node.args) >= 2:
                check("group", node.args[0])
                check("op", node.args[1])
            elif node.func.attr == "get" and isinstance(node.func.value, ast.Attribute) and node.args:
                if node.func.value.attr in GROUP_KEYED:
                    check("group", node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr in GROUP_KEYED:
                check("group", node.slice)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for role in filter(None, map(_op_attr, sides)):
                for other in sides:
                    check(role, other)
    return [(line, role, value) for line, _, role, value in sorted(out)]


def test_the_checker_finds_a_misspelt_group_kind_or_collective():
    bad = (
        'Collective("x", "all_reduce", 1.0, "dpp")\n'
        'Compute("y", 0.0, 0.0, kind="gemmm")\n'
        'if op.kind == "attn" or c.group in ("tp", "ccp"): pass\n'
        'costs.collective_time("dp", "allreduce", 1.0)\n'
        'pc.comm.get("tpp", 0.0)\n'
        'Collective("z", "all_gather" if sp else "al_reduce", 1.0, "tp")\n'
    )
    assert misspelt(bad) == [
        (1, "group", "dpp"),
        (2, "kind", "gemmm"),
        (3, "kind", "attn"),
        (3, "group", "ccp"),
        (4, "op", "allreduce"),
        (5, "group", "tpp"),
        (6, "op", "al_reduce"),
    ]
    good = 'Collective("x", "all_reduce", 1.0, "dp")\nif op.kind == "gemm" and c.group != "edp": pass\n'
    assert misspelt(good) == []


def test_no_source_file_builds_or_compares_an_op_with_a_string_outside_the_literals():
    found = {
        f"{path.relative_to(SRC)}:{line}: {role} {value!r}"
        for path in sorted(SRC.rglob("*.py"))
        for line, role, value in misspelt(path.read_text())
    }
    assert not found, sorted(found)
