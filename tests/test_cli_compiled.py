"""The start-up's cache of run-time compiled code (``commtax.cli.compiled``): what comes from it is what the
interpreter compiles, a damaged, foreign or unwritable cache is compiled anew, and the hooks go away after."""

from __future__ import annotations

import collections
import dataclasses
import marshal
import re
import subprocess
import sys
import typing
import uuid
from pathlib import Path

import pytest
from conftest import REPO

from commtax.cli import compiled
from commtax.cli.compiled import compiled_once
from commtax.spec import files

WORKED = REPO / "examples" / "llama2-70b-h100.yaml"


@pytest.fixture(autouse=True)
def writes_cache(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the suite may run under PYTHONDONTWRITEBYTECODE


def build(tag: str):
    """A frozen dataclass, a forward reference, a pattern and a named tuple no earlier code compiled (``tag`` is
    fresh)."""

    @dataclasses.dataclass(frozen=True)
    class Record:
        a: int
        b: str = tag

    pair = collections.namedtuple("Pair", ["x", tag])
    return Record, typing.ForwardRef(f"list[{tag!r}]"), re.compile(f"(?P<x>{tag})[0-9]+"), pair


def compiled_codes(record) -> list:
    return [getattr(record, m).__code__ for m in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__")]


def test_what_comes_from_the_cache_is_what_the_interpreter_compiles(tmp_path):
    cache = tmp_path / "c.marshal"
    tag = f"t{uuid.uuid4().hex}"
    plain = build(tag)
    re.purge()
    with compiled_once(cache):
        first = build(tag)  # compiled, then written
    assert cache.exists()
    re.purge()
    with compiled_once(cache):
        cached = build(tag)  # read back
    for made in (first, cached):
        assert compiled_codes(made[0]) == compiled_codes(plain[0])
        assert made[1].__forward_code__ == plain[1].__forward_code__
        assert made[2] == plain[2] and made[2].groupindex == plain[2].groupindex
        assert made[0](1) == made[0](1, tag) and made[0](1) != made[0](2)
        with pytest.raises(dataclasses.FrozenInstanceError):
            made[0](1).a = 2
        assert made[2].fullmatch(f"{tag}42").group("x") == tag
        assert made[3].__new__.__code__ == plain[3].__new__.__code__ and tuple(made[3](1, 2)) == (1, 2)


def test_the_cache_holds_exactly_the_last_runs_sources(tmp_path):
    cache = tmp_path / "c.marshal"
    tags = [f"t{uuid.uuid4().hex}" for _ in range(2)]
    with compiled_once(cache):
        build(tags[0])
    stamp, codes, patterns = marshal.loads(cache.read_bytes())
    assert stamp == compiled.STAMP
    assert any(tags[0] in source for source, _, _ in codes) and any(tags[0] in p for p, _ in patterns)
    re.purge()
    with compiled_once(cache):
        build(tags[1])  # a new source: the file is rewritten with this run's, the stale ones dropped
    _, codes, patterns = marshal.loads(cache.read_bytes())
    assert not any(tags[0] in source for source, _, _ in codes) and any(tags[1] in p for p, _ in patterns)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not marshal at all",
        marshal.dumps((("another python", 0), {}, {})),
        marshal.dumps((compiled.STAMP, [], {})),
        marshal.dumps((compiled.STAMP, {("x = 1", "<string>", "exec"): 3}, {("a", 0): "not a program"})),
    ],
    ids=["empty", "garbage", "foreign", "wrong-shape", "wrong-values"],
)
def test_a_damaged_or_foreign_cache_is_compiled_anew(tmp_path, content):
    cache = tmp_path / "c.marshal"
    cache.write_bytes(content)
    tag = f"t{uuid.uuid4().hex}"
    plain = build(tag)
    re.purge()
    with compiled_once(cache):
        made = build(tag)
        namespace: dict = {}
        dataclasses.exec("x = 1", namespace)  # the wrong-values entry's key
        assert namespace["x"] == 1
        assert re.compile("a").fullmatch("a")
    assert compiled_codes(made[0]) == compiled_codes(plain[0]) and made[2] == plain[2]
    assert marshal.loads(cache.read_bytes())[0] == compiled.STAMP  # rewritten


def test_an_unwritable_folder_or_pythondontwritebytecode_writes_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with compiled_once(blocker / "c.marshal"):  # its folder cannot be made
        build(f"t{uuid.uuid4().hex}")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with compiled_once(tmp_path / "c.marshal"):
        build(f"t{uuid.uuid4().hex}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_the_hooks_are_gone_after_the_block_even_on_an_error(tmp_path):
    re_compile = re._compiler.compile
    with pytest.raises(KeyboardInterrupt), compiled_once(tmp_path / "c.marshal"):
        assert "exec" in vars(dataclasses) and "compile" in vars(typing) and "eval" in vars(collections)
        raise KeyboardInterrupt
    assert "exec" not in vars(dataclasses) and "compile" not in vars(typing) and "eval" not in vars(collections)
    assert re._compiler.compile is re_compile
    assert not (tmp_path / "c.marshal").exists()  # an interrupted import writes nothing


def _two_runs(tmp_path, command: str) -> tuple[list[tuple[str, int]], Path]:
    """``commtax COMMAND WORKED --json`` twice in a copy of the package without byte code: each run's output and
    the command's cache file's mtime after it, and that file."""
    subprocess.run(["cp", "-r", str(REPO / "src"), str(tmp_path / "src")], check=True)
    for pycache in (tmp_path / "src").rglob("__pycache__"):
        subprocess.run(["rm", "-r", str(pycache)], check=True)
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin"}
    cache = tmp_path / "src" / "commtax" / "cli" / "__pycache__" / compiled.cache_for(command).name
    outputs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-m", "commtax.cli", command, str(WORKED), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert run.returncode == 0, run.stderr
        outputs.append((run.stdout, cache.stat().st_mtime_ns))
    return outputs, cache


def test_the_estimate_reads_the_cache_a_first_run_wrote(tmp_path):
    """The CLI in a copy of the package: the first run writes the cache, the second reads it and writes nothing."""
    outputs, cache = _two_runs(tmp_path, "estimate")
    assert cache.name == compiled.CACHE.name
    assert outputs[0][0] == outputs[1][0]
    assert outputs[0][1] == outputs[1][1]  # the second run found every source it compiled
    _, codes, patterns = marshal.loads(cache.read_bytes())
    assert len(codes) > 300 and len(patterns) > 20  # dataclass methods and forward references; yaml's patterns


def test_an_interrupt_while_the_cache_is_written_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)  # the one writer, spec.files.write_marshal_cache
    with pytest.raises(KeyboardInterrupt), compiled_once(tmp_path / "c.marshal"):
        build(f"t{uuid.uuid4().hex}")
    assert list(tmp_path.iterdir()) == []


def test_another_command_keeps_a_cache_of_its_own(tmp_path):
    """``cost`` (as every command in ``entry.CACHED_COMMANDS``) reads and writes its own file, its whole run under
    the hooks: the first run writes it, the second reads it and writes nothing; the estimate's file is not touched."""
    from commtax.cli.entry import CACHED_COMMANDS

    assert {"search", "simulate", "validate", "compare", "advise", "cost", "report"} <= CACHED_COMMANDS
    assert "estimate" not in CACHED_COMMANDS  # typer's estimate (--help, an error) would rewrite the plain one's
    assert compiled.cache_for("estimate") == compiled.CACHE
    assert compiled.cache_for("cost").parent == compiled.CACHE.parent
    outputs, cache = _two_runs(tmp_path, "cost")
    folder = cache.parent
    assert outputs[0] == outputs[1]
    assert not (folder / compiled.CACHE.name).exists()
    _, codes, patterns = marshal.loads(cache.read_bytes())
    assert len(codes) > 300 and len(patterns) > 20
