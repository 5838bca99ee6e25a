"""Hostile output paths: nothing a user had is replaced, leaked or left half-written, and every failure is one line.

Classes (issue 12): outputs over special files / symlinks / FIFOs, output modes (umask, existing mode),
nonexistent output folders, names too long, /proc files, strict JSON, temp files after SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commtax.atomic import check_writable, strict_json, write_atomic
from commtax.cli.main import app, register_commands
from commtax.errors import SpecError

register_commands()  # every command on `app` (main() registers only the one it runs)
runner = CliRunner()
JOB = Path(__file__).resolve().parents[1] / "examples" / "llama2-70b-h100.yaml"


def estimate_out(out: Path | str) -> object:
    return runner.invoke(app, ["estimate", str(JOB), "--out", str(out)])


def one_line_error(r, code: int = 2) -> str:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    err = r.stderr.strip()
    assert err.startswith("error:") and "\n" not in err, err
    return err


# ----------------------------------------------------------------------------- special files
def test_out_dev_null_is_written_through_not_replaced(tmp_path):
    before = os.stat("/dev/null")
    r = estimate_out("/dev/null")
    assert r.exit_code == 0, r.output
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev  # still the device


def test_symlink_keeps_pointing_at_its_target_which_is_replaced(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert estimate_out(link).exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["step_time_s"] > 0


def test_fifo_without_reader_is_refused_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    err = one_line_error(estimate_out(fifo))
    assert "FIFO that nobody reads" in err and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_fifo_with_reader_is_written_through(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there before the write
    reader = threading.Thread(target=lambda: got.append(_drain(fd)))
    try:
        write_atomic(fifo, '{"a": 1}\n')
        reader.start()
        reader.join(5)
    finally:
        os.close(fd)
    assert b"".join(got) == b'{"a": 1}\n' and stat.S_ISFIFO(os.stat(fifo).st_mode)


def _drain(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        out += chunk
    return out


def test_socket_is_refused(tmp_path):
    import socket

    path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    try:
        with pytest.raises(SpecError, match="socket; refusing"):
            write_atomic(path, "x")
        assert stat.S_ISSOCK(os.stat(path).st_mode)
    finally:
        s.close()


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: None, None),
    ],
)
def test_directory_refused_regular_written(tmp_path, make, needle):
    p = tmp_path / "o.json"
    make(p)
    r = estimate_out(p)
    if needle:
        assert needle in one_line_error(r)
    else:
        assert r.exit_code == 0 and p.is_file()


# ----------------------------------------------------------------------------- modes
@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_new_file_mode_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "x.yaml", "a: 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "x.yaml").st_mode) == mode


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o600, 0o664])
def test_existing_file_keeps_its_mode(tmp_path, mode):
    p = tmp_path / "x.json"
    p.write_text("old")
    p.chmod(mode)
    write_atomic(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(os.stat(p).st_mode) == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_root_rewriting_a_users_file_keeps_its_owner(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("old")
    os.chown(p, 1234, 1234)
    write_atomic(p, "new")
    assert (os.stat(p).st_uid, os.stat(p).st_gid) == (1234, 1234)


# ----------------------------------------------------------------------------- folders and names
@pytest.mark.parametrize(
    "out,needle",
    [
        ("/nonexistent/x.json", "does not exist"),
        ("{tmp}/missing/deeper/x.json", "does not exist"),
        ("{tmp}/" + "n" * 300 + ".json", "file name too long"),
        ("/proc/version", "cannot write"),
        ("{tmp}/", "is a directory"),
    ],
)
def test_bad_output_paths_are_one_line_and_create_nothing(tmp_path, out, needle):
    out = out.format(tmp=tmp_path)
    r = estimate_out(out)
    assert needle in one_line_error(r)
    assert not Path("/nonexistent").exists() and not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temp file left


def test_check_writable_fails_before_any_work(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        check_writable(tmp_path / "no" / "x.yaml")
    check_writable(tmp_path / "x.yaml")  # fine: nothing written
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writer", ["simulate", "search", "advise"])
def test_every_writer_reports_missing_folders_in_one_line(tmp_path, writer):
    args = {
        "simulate": ["simulate", str(JOB), "--trace", "/nonexistent/t.json"],
        "search": ["search", str(JOB), "--out", "/nonexistent/s.json", "--tp", "8", "--pp", "4"],
        "advise": ["advise", str(JOB), "--no-search", "--out", "/nonexistent/a.json"],
    }[writer]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "Traceback" not in r.output and "does not exist" in r.output
    assert not Path("/nonexistent").exists()


# ----------------------------------------------------------------------------- strict JSON
@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.text(max_size=5) | st.none(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
        max_leaves=20,
    )
)
def test_strict_json_is_always_parseable_and_keeps_finite_values(data):
    text = strict_json(data)
    # a bare NaN/Infinity token fails here (a substring test would also flag a string such as {"NaN": null})
    back = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard constant {c}"))

    def same(a, b):
        if isinstance(a, float):
            return b is None if not math.isfinite(a) else a == b
        if isinstance(a, dict):
            return all(same(v, b[k]) for k, v in a.items())
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    assert same(data, back)


@pytest.mark.parametrize(
    "args",
    [
        ["collective", "all_reduce", "--gpus", "1", "--json"],
        ["collective", "all_reduce", "--gpus", "1", "--sweep", "--bytes", "64", "--json"],
    ],
)
def test_json_output_never_contains_nan_or_infinity(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


def test_infinite_training_tokens_give_strict_json(tmp_path):
    import yaml

    job = yaml.safe_load(JOB.read_text())
    job["training"]["tokens"] = 1e308 * 10  # .inf in YAML
    p = tmp_path / "j.yaml"
    p.write_text(yaml.safe_dump(job))
    r = runner.invoke(app, ["estimate", str(p), "--json"])
    if r.exit_code == 0:
        json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))
    else:
        one_line_error(r)


# ----------------------------------------------------------------------------- SIGTERM during a write
def test_sigterm_during_an_atomic_write_leaves_no_temp_file(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from commtax.atomic import write_atomic_with
        def slow(tmp):
            tmp.write_text("partial")
            print("writing", flush=True)
            time.sleep(30)
        write_atomic_with(Path({str(tmp_path / "big.json")!r}), slow)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    assert p.returncode != 0
    assert list(tmp_path.iterdir()) == []  # neither the target nor a hidden .big.json.* temp file


def test_out_dev_stdout_on_a_pipe_is_written_through():
    r = subprocess.run(
        [sys.executable, "-m", "commtax.cli", "estimate", str(JOB), "--out", "/dev/stdout", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('"step_time_s"') == 2 and "Traceback" not in r.stderr  # --out, then --json
