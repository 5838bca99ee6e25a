"""Every command README.md shows runs as documented, from a copy of the repository with no ``../shared`` beside it.

The commands are read out of the README itself (``$ `` prompts in code blocks and every backticked ``commtax …``
span, the command table included), so a command added to or changed in the README is run here. Placeholders
(JOB.yaml, F, N, …) become shipped files or concrete values through the explicit table below; a placeholder the
table does not know fails the test. ``cluster``/``bench``/``calibrate`` need root, netns or torch ranks: only their
``--help`` is run, and every option the README names must be in it. All commands run in one subprocess (the
copy's ``src`` on PYTHONPATH, typer's CliRunner inside it), so the whole file costs one interpreter start plus the
commands themselves (the HTML report is most of it).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = (REPO / "README.md").read_text()
JOB = "examples/llama2-70b-h100.yaml"  # the README's worked example

# Placeholder -> concrete argument, keyed by (the flag before it or None for a positional, placeholder).
PLACEHOLDERS: dict[tuple[str | None, str], list[str]] = {
    (None, "JOB.yaml"): [JOB],  # any job file: the worked example
    (None, "JOB.yaml…"): [JOB, "examples/compare/llama2-70b-256-a100.yaml"],  # "one or more jobs": two clusters
    (None, "FILE.csv..."): ["validation/public_runs.csv", "validation/public_runs_more.csv"],  # the shipped runs
    (None, "OP"): ["all_reduce"],  # a collective name (the allowed values are in `collective --help`)
    (None, "TRACE.json"): ["trace.json"],  # a small synthetic profiler trace the test writes (no trace is shipped)
    ("--out", "F"): ["out.json"],  # an output file inside the copy
    ("--cluster", "F"): ["examples/emulated/results/cluster_2x4.yaml"],  # a shipped `cluster up` file (8 GPUs)
    ("--gpus", "N"): ["8"],  # within that cluster's 8 GPUs
    ("--algorithm", "A"): ["ring"],
    ("--protocol", "P"): ["Simple"],
    ("--max-mape", "X"): ["100"],  # a bound the shipped runs meet (docs/accuracy.md has the figure)
    ("--tokens", "N"): ["1000000000000"],  # 1T tokens
    ("--gpu", "a"): ["a100-sxm4-80gb"],  # `--gpu a b`: two catalog GPU ids
    (None, "b"): ["rtx-4090-24gb"],
    ("--num-gpus", "N,M"): ["128,256"],
}
HELP_ONLY = {"cluster", "bench", "calibrate"}  # root + netns or torch ranks: too slow or privileged for this test
# The bad-input examples of the README: the file each names, made from the worked example by one edit.
BAD_INPUTS = {
    "bad.yaml": [("  tp: 8\n", "  tp: 16\n"), ("  dp: 8\n", "  dp: 4\n")],  # tp=16 with the GPU count kept
    "typo.yaml": [("model: llama2-70b\n", "model: llama-2-70b\n")],  # a misspelt catalog id
}
# Prose that names a command without its arguments ("`commtax search` and `commtax advise` do that for you"):
# run on the worked example.
BARE = {"search": [JOB], "advise": [JOB]}
# Spans without the `commtax` prefix that continue a table row's command: the row's own example file.
FRAGMENTS = {
    # DeepSeek-V3's whole ep x dispatcher space is ~50 CPU-s, most of this file's budget: its options are checked
    # here, the search itself in tests/test_moe_search.py
    "search --ep 8,64 --moe-dispatcher alltoall,deepep": None,
    "cluster up --node-speed 1,0.5": None,  # netns: help only
}
MAKE_TARGETS = ["demo", "test", "validate", "bench", "readme"]  # the targets the README names


def readme_spans() -> list[str]:
    """Every backticked `commtax …` span (whitespace folded: one span wraps a line); `$ ` prompts are run with
    their shown output (prompts_with_output)."""
    spans = [" ".join(s.split()) for s in re.findall(r"`(commtax [^`]+)`", README)]
    return list(dict.fromkeys(spans))


def _concrete(words: list[str]) -> list[str]:
    out: list[str] = []
    for i, w in enumerate(words):
        flag = words[i - 1] if i and words[i - 1].startswith("--") else None
        key = (flag, w) if (flag, w) in PLACEHOLDERS else (None, w)
        if key in PLACEHOLDERS and not (flag and w.startswith("--")):
            out += PLACEHOLDERS[key]
        elif re.fullmatch(r"[A-Z][A-Z0-9_.]*[.…]*|[A-Z],[A-Z]", w) and w not in ("16MiB",):
            raise AssertionError(f"README placeholder {w!r} (after {flag!r}) has no entry in PLACEHOLDERS")
        else:
            out.append(w)
    return out


def forms(span: str) -> list[list[str]]:
    """The runnable forms of one README span: without its [optional] parts, and with all of them."""
    span = span.removeprefix("commtax ").strip()
    bare = re.sub(r"\s*\[[^\]]*\]", "", span)
    full = re.sub(r"\[([^\]]*)\]", r"\1", span)
    return [_concrete(shlex.split(s)) for s in dict.fromkeys([bare, full])]


def plan() -> tuple[list[list[str]], list[tuple[list[str], list[str]]]]:
    """(commands to run expecting their documented exit, help-only commands with the options the README names)."""
    runs: list[list[str]] = []
    helps: list[tuple[list[str], list[str]]] = []
    for span in readme_spans():
        if span.startswith("commtax COMMAND"):
            continue  # every command's --help: run below for each registered command
        if span.startswith("commtax cluster up/run/down"):
            helps += [(["cluster", sub], []) for sub in ("up", "run", "down")]
            continue
        words = span.split()
        if words[1] in HELP_ONLY:  # placeholders stay: only the option names are checked against --help
            sub = [w for w in words[2:3] if not w.startswith("-") and w not in ("…", "...")]
            helps.append(([words[1], *sub], [w.strip("[]") for w in words if w.strip("[]").startswith("--")]))
        else:
            runs += [argv + BARE.get(argv[0], []) if len(argv) == 1 else argv for argv in forms(span)]
    for frag, head in FRAGMENTS.items():
        assert f"`{frag}" in README, frag  # the README still shows it
        words = frag.split()
        if head is None:
            cmd = words[:2] if words[0] in HELP_ONLY else words[:1]
            helps.append((cmd, [w for w in words if w.startswith("--")]))
        else:
            runs.append(head + words[1:])
    unique = {shlex.join(r): r for r in runs}  # prose and table name some forms twice: run each once
    return list(unique.values()), helps


def test_the_readme_shows_the_commands_this_test_runs():
    runs, helps = plan()
    shown = {r[0] for r in runs}
    assert {"estimate", "demo", "validate", "collective", "cost", "simulate", "search"} <= shown
    assert {"compare", "advise", "trace", "report"} <= shown
    assert HELP_ONLY <= {h[0][0] for h in helps}


def test_an_unknown_placeholder_fails_loudly():
    with pytest.raises(AssertionError, match="PLACEHOLDERS"):
        forms("commtax estimate JOB.yaml --out WHERE")


TRACE = {
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "ampere_gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 600, "args": {}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "pid": 0,
            "tid": 8,
            "ts": 620,
            "dur": 300,
            "args": {},
        },
    ],
    "distributedInfo": {"rank": 0, "world_size": 1},
}

# Runs every command in the copy with CliRunner; prints one JSON record per command.
DRIVER = """
import json, sys
from pathlib import Path
import commtax
assert Path(commtax.__file__).resolve().is_relative_to(Path.cwd().resolve()), commtax.__file__
from typer.testing import CliRunner
from commtax.cli.main import app, register_commands
register_commands()
res = []
for argv in json.loads(sys.stdin.read()):
    r = CliRunner().invoke(app, argv, terminal_width=80)
    res.append({"argv": argv, "rc": r.exit_code, "out": r.output, "exc": repr(r.exception)})
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The repository as a user clones it, in a temporary folder with no ``shared/`` beside it."""
    root = tmp_path_factory.mktemp("clone")
    dst = root / "commtax"
    skip = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", ".pytest_cache", "shared")
    shutil.copytree(REPO, dst, ignore=skip, symlinks=True)
    assert not (dst.parent / "shared").exists() and not (dst / "shared").exists()
    text = (dst / JOB).read_text()
    for name, edits in BAD_INPUTS.items():
        bad = text
        for old, new in edits:
            assert old in bad, (name, old)
            bad = bad.replace(old, new)
        (dst / name).write_text(bad)
    (dst / "trace.json").write_text(json.dumps(TRACE))
    return dst


@pytest.fixture(scope="module")
def results(clone) -> dict[str, dict]:
    from commtax.cli.main import COMMANDS

    runs, helps = plan()
    argvs = [*runs, *[[*cmd, "--help"] for cmd, _ in helps], *[[c, "--help"] for c in COMMANDS]]
    argvs += [p.removeprefix("$ commtax ").split() for p in prompts_with_output()]
    argvs += make_validate(clone)
    argvs.append(["search", JOB, "--rank", "fastest"])  # the README: "choices are checked"
    env = {"PYTHONPATH": str(clone / "src"), "PATH": "/usr/bin:/bin", "HOME": str(clone), "COLUMNS": "80"}
    p = subprocess.run(
        [sys.executable, "-c", DRIVER], input=json.dumps(argvs), cwd=clone, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return {shlex.join(r["argv"]): r for r in json.loads(p.stdout.splitlines()[-1])}


def make_validate(clone: Path) -> list[list[str]]:
    """The commtax commands `make validate` runs (read from `make -n`), as argv lists."""
    if shutil.which("make") is None:
        return []
    recipe = subprocess.run(["make", "-n", "validate"], cwd=clone, capture_output=True, text=True).stdout
    return [ln.split("/commtax ", 1)[1].split() for ln in recipe.splitlines() if "/bin/commtax validate" in ln]


def prompts_with_output() -> list[str]:
    """The `$ commtax …` lines of text blocks, each followed by the output the README shows for it."""
    blocks = re.findall(r"```text\n(.*?)```", README, flags=re.DOTALL)
    return [ln for b in blocks for ln in b.splitlines() if ln.startswith("$ commtax ")]


def test_every_readme_command_runs_from_a_clone_without_shared(results):
    runs, _ = plan()
    failed = {}
    for argv in runs:
        r = results[shlex.join(argv)]
        # exit 1 is "does not fit memory": the README's commands are on jobs that fit
        if r["rc"] != 0:
            failed[shlex.join(argv)] = (r["rc"], r["out"][-400:], r["exc"])
    assert failed == {}
    assert results[shlex.join(["report", JOB, "--out", "report.html"])]["out"].startswith("wrote report.html")


def test_readme_outputs_are_what_the_commands_print(clone, results):
    """A `$ ` line's output in the README is what the command prints (`...` in it stands for the rest)."""
    readme_lines = README.splitlines()
    for prompt in prompts_with_output():
        argv = prompt.removeprefix("$ commtax ").split()
        i = readme_lines.index(prompt)
        shown = []
        for ln in readme_lines[i + 1 :]:
            if ln.startswith(("$ ", "```")):
                break
            shown.append(ln)
        r = results[shlex.join(argv)]
        if shown and shown[0].startswith("error: "):
            assert r["rc"] == 2 and len(shown) == 1, (prompt, r)
            pattern = ".*".join(re.escape(part) for part in shown[0].split("..."))
            assert re.fullmatch(pattern, r["out"].strip()), (prompt, shown[0], r["out"])
        else:
            assert r["rc"] == 0, (prompt, r)
            assert [ln.rstrip() for ln in r["out"].strip().splitlines()] == [ln.rstrip() for ln in shown], prompt


def test_help_of_privileged_commands_lists_the_options_the_readme_names(results):
    _, helps = plan()
    for cmd, options in helps:
        r = results[shlex.join([*cmd, "--help"])]
        assert r["rc"] == 0, (cmd, r)
        for opt in options:
            assert opt in r["out"], (cmd, opt)


def test_every_command_has_help_and_choices_are_checked(results):
    from commtax.cli.main import COMMANDS

    for c in COMMANDS:
        assert results[shlex.join([c, "--help"])]["rc"] == 0, c
    r = results[shlex.join(["search", JOB, "--rank", "fastest"])]
    assert r["rc"] == 2 and "fastest" in r["out"] and "cost" in r["out"]


def test_make_targets_the_readme_names_exist_and_validate_runs(clone, results):
    """`make demo`/`make test` are not run (slow, and `make test` is this suite): `make -n` shows each target
    exists and what it runs; `make validate`'s commands are run, with the clone's own validation files."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for target in MAKE_TARGETS:
        assert f"make {target}" in README, target
        p = subprocess.run(["make", "-n", target], cwd=clone, capture_output=True, text=True)
        assert p.returncode == 0, (target, p.stderr)
    cmds = make_validate(clone)
    assert len(cmds) == 3
    for argv in cmds:
        assert all(f.startswith("--") or (clone / f).is_file() for f in argv[1:]), argv
        r = results[shlex.join(argv)]
        assert r["rc"] == 0 and "MAPE" in r["out"], (argv, r["out"][-400:])
    demo = subprocess.run(["make", "-n", "demo"], cwd=clone, capture_output=True, text=True).stdout
    assert "commtax demo" in demo
    for b in ("estimate", "simulate", "search"):
        assert (clone / "benchmarks" / f"bench_{b}.py").is_file(), b
