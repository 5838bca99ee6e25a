"""Hostile outputs, issue 22: an output option naming the command's own input is refused (nothing replaced),
and `report -o` keeps the mode of what it writes over (never chmods a device or a symlink's target).

Each case: exit 2, one `error:` line naming the option, no traceback, the input byte-for-byte as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands

register_commands()
REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "trace" / "tiny_ddp.yaml"  # a job that reports in about a second of CPU


def invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(r, option: str = "--out") -> str:
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    err = r.stderr.strip()
    assert err.startswith(f"error: {option}: ") and "\n" not in err and "Traceback" not in r.output, err
    return err


@pytest.fixture
def files(tmp_path):
    job = tmp_path / "job.yaml"
    shutil.copy(TINY, job)
    bench = tmp_path / "bench.json"
    bench.write_text("[]")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(trace, folder / "rank0.json")
    return {"job": job, "bench": bench, "trace": trace, "folder": folder, "tmp": tmp_path}


def snapshot(tmp: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}


CASES = {
    "report -o job": lambda f: ("report", f["job"], "--no-search", "-o", f["job"]),
    "report -o bench": lambda f: ("report", f["job"], "--no-search", "--bench", f["bench"], "-o", f["bench"]),
    "report -o trace": lambda f: ("report", f["job"], "--no-search", "--trace", f["trace"], "-o", f["trace"]),
    "report -o compare": lambda f: ("report", f["job"], "--no-search", "--compare", f["job"], "-o", f["job"]),
    "report -o bench-cluster": lambda f: (
        "report",
        f["job"],
        "--no-search",
        "--bench-cluster",
        f["job"],
        "-o",
        f["job"],
    ),
    "trace --out trace": lambda f: ("trace", f["trace"], "--out", f["trace"]),
    "trace --out against": lambda f: ("trace", f["trace"], "--against", f["job"], "--out", f["job"]),
    "trace --out into its folder": lambda f: ("trace", f["folder"], "--out", f["folder"] / "summary.json"),
    "trace --out over a folder's trace": lambda f: ("trace", f["folder"], "--out", f["folder"] / "rank0.json"),
    "calibrate --out records": lambda f: ("calibrate", f["bench"], "--out", f["bench"]),
    "calibrate --out cluster": lambda f: ("calibrate", f["bench"], "--cluster", f["job"], "--out", f["job"]),
    "calibrate --out gemm": lambda f: ("calibrate", f["bench"], "--gemm", f["trace"], "--out", f["trace"]),
    "calibrate --out trace": lambda f: ("calibrate", "--trace", f["trace"], "--job", f["job"], "--out", f["trace"]),
    "calibrate --out job": lambda f: ("calibrate", "--trace", f["trace"], "--job", f["job"], "--out", f["job"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_output_naming_an_input_is_refused(files, case):
    before = snapshot(files["tmp"])
    err = one_line(invoke(*CASES[case](files)))
    assert "input" in err
    assert snapshot(files["tmp"]) == before


def test_calibrate_cluster_out_naming_out_is_refused(files):
    before = snapshot(files["tmp"])
    p = files["tmp"] / "p.yaml"
    err = one_line(invoke("calibrate", files["bench"], "--out", p, "--cluster-out", p), "--cluster-out")
    assert "is also --out" in err and snapshot(files["tmp"]) == before


def test_a_hard_link_to_an_input_is_the_input(files):
    link = files["tmp"] / "same.json"
    os.link(files["bench"], link)
    before = snapshot(files["tmp"])
    one_line(invoke("calibrate", files["bench"], "--out", link))
    assert snapshot(files["tmp"]) == before


def test_a_symlink_to_an_input_is_the_input(files):
    link = files["tmp"] / "alias.yaml"
    link.symlink_to(files["job"])
    before = snapshot(files["tmp"])
    one_line(invoke("report", files["job"], "--no-search", "-o", link))
    assert snapshot(files["tmp"]) == before and link.is_symlink()


# ----------------------------------------------------------------------------- report -o keeps modes
def test_report_over_an_existing_private_page_keeps_its_mode(files):
    page = files["tmp"] / "page.html"
    page.write_text("old")
    page.chmod(0o600)
    target = files["tmp"] / "private.html"
    target.write_text("old")
    target.chmod(0o640)
    link = files["tmp"] / "link.html"
    link.symlink_to(target)
    for out, mode in ((page, 0o600), (link, 0o640)):
        r = invoke("report", files["job"], "--no-search", "-o", out)
        assert r.exit_code == 0, r.output
        assert stat.S_IMODE(os.stat(out).st_mode) == mode and "<html" in Path(out).read_text()[:200].lower()
    assert link.is_symlink()


def test_report_to_dev_null_leaves_the_device_alone(files):
    before = os.stat("/dev/null")
    r = invoke("report", files["job"], "--no-search", "-o", "/dev/null")
    assert r.exit_code == 0, r.output
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_mode == before.st_mode and after.st_rdev == before.st_rdev
