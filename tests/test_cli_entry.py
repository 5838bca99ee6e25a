"""The entry point runs a plain `commtax estimate` without typer: the same output, the same error lines and exit
codes as the typer command, and every other command line still read (and refused) by typer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
import yaml
from conftest import REPO, job_dict
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from commtax.cli.entry import plain_estimate_args
from commtax.cli.io import refuse_folder_outputs
from commtax.cli.main import app, register_commands

WORKED = REPO / "examples" / "llama2-70b-h100.yaml"
register_commands({"estimate"})


def entry(*args, cwd=None) -> subprocess.CompletedProcess:
    """``python -m commtax.cli ARGS``: the installed command's entry point, in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "commtax.cli", *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def typer_run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    ("argv", "kwargs"),
    [
        (["job.yaml"], {"job_file": Path("job.yaml")}),
        (["--json", "job.yaml"], {"job_file": Path("job.yaml"), "json_out": True}),
        (
            ["job.yaml", "--out", "o.json", "--plot=p.png", "--catalog", "c.yaml"],
            {"job_file": Path("job.yaml"), "out": Path("o.json"), "plot": Path("p.png"), "catalog": Path("c.yaml")},
        ),
    ],
)
def test_a_plain_command_line_is_read_without_typer(argv, kwargs):
    assert plain_estimate_args(argv) == kwargs


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no job: typer says it is missing
        ["--help"],
        ["job.yaml", "-h"],
        ["job.yaml", "other.yaml"],  # an extra argument
        ["job.yaml", "--json", "--json"],  # repeated
        ["job.yaml", "--out", "a.json", "--out", "b.json"],
        ["job.yaml", "--out"],  # no value
        ["job.yaml", "--out="],
        ["job.yaml", "--out", "--json"],  # a value that is an option
        ["job.yaml", "--out", "dir/"],  # a folder: refused by refuse_folder_outputs
        ["job.yaml", "--wide"],  # not an estimate option
        ["job.yaml", "--json=1"],
        ["--", "job.yaml"],
        ["-"],
        [""],
    ],
)
def test_every_other_command_line_goes_to_typer(argv):
    assert plain_estimate_args(argv) is None


TOKENS = ["job.yaml", "b.yaml", "--json", "--out", "--out=o.json", "o.json", "--plot", "p.png", "--plot=", "--catalog",
          "c.yaml", "-h", "--help", "--", "", "x/", "--out=x/", "--json=1", "--wide", "-", "-o"]  # fmt: skip


@given(st.lists(st.sampled_from(TOKENS), max_size=7))
def test_what_the_entry_reads_typer_reads_the_same_way(argv):
    """Whenever the entry point reads a command line itself, typer reads the same arguments from it (a line it
    leaves to typer is safe whatever typer makes of it)."""
    kw = plain_estimate_args(argv)
    if kw is None:
        return
    estimate = typer.main.get_command(app).commands["estimate"]
    params = estimate.make_context("estimate", list(argv)).params
    assert params == {"json_out": False, "out": None, "plot": None, "catalog": None, **kw}
    refuse_folder_outputs(argv)  # no output named a folder (it would exit 2): typer's path checks it first


def _after_plain_estimate(report: str) -> str:
    """What ``report`` (Python lines, ending in a write to stderr) writes after ``commtax estimate WORKED --json`` has
    run in a fresh interpreter."""
    code = (
        "import gc, sys; from commtax.cli.entry import main; sys.argv=['commtax','estimate',"
        f"{str(WORKED)!r},'--json'];\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n" + report
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return r.stderr.strip()


def test_the_estimate_path_imports_neither_typer_rich_numpy_torch_nor_matplotlib():
    written = _after_plain_estimate(
        "heavy = ('typer', 'click', 'rich', 'numpy', 'torch', 'matplotlib')\n"
        "sys.stderr.write(repr(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))))"
    )
    assert written.endswith("[]"), written


def test_a_dense_job_without_a_fabric_imports_no_moe_fabric_or_rendezvous_module():
    """What only MoE (and MTP), fabric or gloo-on-a-fabric jobs use is imported where they use it, as is difflib
    (an unknown catalog id): start-up (docs/testing.md). The cyclic GC, paused while the path imports, is on again."""
    written = _after_plain_estimate(
        "unused = ('commtax.workload.moe', 'commtax.costs.fabric', 'commtax.costs.rendezvous', 'difflib')\n"
        "sys.stderr.write(repr((sorted(set(unused) & set(sys.modules)), gc.isenabled())))"
    )
    assert written.endswith("([], True)"), written


def test_plain_estimate_prints_what_the_typer_command_prints(tmp_path):
    fast = entry("estimate", WORKED, "--json", "--out", tmp_path / "b.json")
    slow = typer_run("estimate", WORKED, "--json")
    assert (fast.returncode, slow.exit_code) == (0, 0), fast.stderr
    assert fast.stdout == slow.stdout == (tmp_path / "b.json").read_text()
    assert json.loads(fast.stdout)["step_time_s"] > 0


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def test_errors_are_the_typer_commands_lines_and_exit_codes(tmp_path):
    bad_model = _write(tmp_path, "m.yaml", {**job_dict(), "model": "llama-2-70b"})
    too_big = _write(tmp_path, "big.yaml", job_dict(tp=1, pp=1, dp=256, zero=0, recompute="none"))
    bad_catalog = _write(tmp_path, "cat.yaml", {"gpu": {"x": {"peak_tflops": {"bf16": 1}}}})
    cases = [
        (["estimate", bad_model, "--json"], 2, "unknown model 'llama-2-70b'"),
        (["estimate", tmp_path / "nope.yaml"], 2, "file not found"),
        (["estimate", _write(tmp_path, "bad.yaml", "model: [unclosed\n"), "--json"], 2, "malformed YAML"),
        (["estimate", too_big, "--json"], 1, "does not fit GPU memory"),
        (["estimate", WORKED, "--json", "--catalog", bad_catalog], 2, "gpu.x: missing field 'source'"),
        (["estimate", WORKED, "--json", "--out", tmp_path / "no-such-dir" / "b.json"], 2, "no-such-dir"),
    ]
    for argv, code, message in cases:
        fast, slow = entry(*argv), typer_run(*argv)
        assert fast.returncode == slow.exit_code == code, (argv, fast.stderr, slow.stderr)
        assert message in fast.stderr and fast.stderr == slow.stderr, (argv, fast.stderr, slow.stderr)
        assert fast.stdout == slow.stdout and "Traceback" not in fast.stderr
    assert not (tmp_path / "no-such-dir").exists()


def test_help_and_bad_options_still_reach_typer():
    r = entry("estimate", "--help")
    assert r.returncode == 0 and "JOB.yaml" in r.stdout and "--catalog" in r.stdout
    r = entry("estimate", WORKED, "--wide")
    assert r.returncode == 2 and r.stderr.startswith("error: No such option: --wide")
    r = entry("estimate", WORKED, "--out", "x.json/")
    assert r.returncode == 2 and "ends in '/', a folder" in r.stderr
    r = entry("estimate")
    assert r.returncode == 2 and "Missing argument 'JOB.yaml'" in r.stderr


def _raises(error: BaseException):
    def command(**_):
        raise error

    return command


def test_run_plain_reports_as_the_typer_command_does(capsys):
    from commtax.cli.entry import run_plain
    from commtax.errors import Interrupted, SpecError

    assert run_plain(_raises(SpecError("plan.tp: must divide heads(64); choose 8")), {}) == 2
    assert capsys.readouterr().err == "error: plan.tp: must divide heads(64); choose 8\n"
    assert run_plain(_raises(Interrupted("SIGTERM")), {}) == 130  # a signal mid-estimate: one line, exit 130
    assert capsys.readouterr().err == "error: interrupted (SIGTERM)\n"
    assert run_plain(_raises(FileNotFoundError(2, "No such file or directory", "x.yaml")), {}) == 2
    assert capsys.readouterr().err.startswith("error: x.yaml")
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        run_plain(_raises(ZeroDivisionError("a bug")), {})
    assert run_plain(lambda **kw: None, {"json_out": True}) == 0
