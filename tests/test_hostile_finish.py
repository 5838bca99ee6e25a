"""Hostile inputs, issue 22: FIFOs that would block, numbers a trace cannot hold, JSON that is not one trace.

Each case: exit 2, one `error:` line naming the file and what is wrong, no traceback, nothing written.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands

register_commands()
REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "trace" / "tiny_ddp.yaml"
EVENT = '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": %s, "dur": %s}'


def invoke(*args, timeout_s: float = 30.0):
    """The command in-process; a hang (a blocking open) fails the test instead of hanging the suite."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(CliRunner().invoke(app, [str(a) for a in args])), daemon=True)
    t.start()
    t.join(timeout_s)
    assert box, f"{args} still running after {timeout_s} s (blocked?)"
    return box[0]


def one_line(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in r.output, err
    for n in needles:
        assert n in err, err
    return err


def trace_file(tmp_path, text: str, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def events(*items: str) -> str:
    return '{"traceEvents": [' + ", ".join(items) + "]}"


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "f.json"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize(
    "args",
    [
        lambda f, t: ("trace", f),
        lambda f, t: ("trace", t, "--against", f),
        lambda f, t: ("estimate", f),
        lambda f, t: ("calibrate", f),
        lambda f, t: ("report", JOB, "--no-search", "--trace", f, "-o", t.parent / "r.html"),
        lambda f, t: ("calibrate", "--trace", f, "--job", JOB, "--out", t.parent / "p.yaml"),
    ],
    ids=["trace", "trace --against", "estimate", "calibrate", "report --trace", "calibrate --trace"],
)
def test_a_fifo_input_is_refused_without_blocking(tmp_path, fifo, args):
    t = trace_file(tmp_path, events(EVENT % (1, 1)))
    one_line(invoke(*args(fifo, t)), "FIFO")
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(
    "ts, dur",
    [("NaN", "1"), ("1", "NaN"), ("Infinity", "1"), ("1", "-Infinity"), ("1e999", "1"), ("1", "-1e999")],
)
def test_timestamps_and_durations_that_are_not_finite_are_refused(tmp_path, ts, dur):
    t = trace_file(tmp_path, events(EVENT % (1, 1), EVENT % (ts, dur)))
    one_line(invoke("trace", t), str(t), "traceEvents[1]")


@pytest.mark.parametrize(
    "text, needle",
    [
        (events(EVENT % (1, 1)) + events(EVENT % (1, 1)), "text after the top-level JSON"),
        ("[" + EVENT % (1, 1) + "] []", "text after the top-level JSON"),
        ('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}", "nested too deep"),
        (events(EVENT % ("9" * 5000, 1)), "beyond int64"),
        (events((EVENT % (1, 1)).replace('"dur"', '"args": {"correlation": 18446744073709551617}, "dur"')), "int64"),
        (events(EVENT % ("1" + "0" * 400, 1)), "beyond int64"),
    ],
    ids=["two objects", "two arrays", "nested 1e5 deep", "5000-digit int", "correlation beyond int64", "1e400 int"],
)
def test_json_that_is_not_one_trace_is_refused(tmp_path, text, needle):
    one_line(invoke("trace", trace_file(tmp_path, text)), needle)


def test_out_naming_a_folder_is_refused(tmp_path):
    """`--out x.json/` would write x.json (pathlib drops the slash): the raw command line is checked first."""
    import subprocess
    import sys

    t = trace_file(tmp_path, events(EVENT % (1, 1)))
    for out in (["--out", str(tmp_path / "x.json") + "/"], [f"--out={tmp_path / 'y.json'}/"]):
        r = subprocess.run(
            [sys.executable, "-m", "commtax.cli", "trace", str(t), *out], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and r.stderr.startswith("error: --out: ") and "a folder" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


# ----------------------------------------------------------------------------- unbounded work: a stated limit
@pytest.mark.parametrize(
    "args, needle",
    [
        (("bench", "ddp", "--nproc", "1000"), "the limit is"),
        (("bench", "collective", "--nproc", "1000"), "the limit is"),
        (("bench", "ddp", "--seq-len", "100000000"), "over the limit of 16,384"),
        (("bench", "ddp", "--accumulate", "100000000"), "over the limit of 4,096"),
        (("bench", "ddp", "--micro-batch", "4096", "--seq-len", "4096"), "tokens per micro-batch"),
        (("search", JOB, "--verify", "100000"), "the limit is 100"),
        (("compare", JOB, *["--gpu", "rtx-4090-24gb"] * 200), "given 200 times"),
    ],
    ids=["ddp nproc", "collective nproc", "ddp seq-len", "ddp accumulate", "ddp tokens", "verify", "compare --gpu"],
)
def test_unbounded_work_is_refused_naming_the_limit(args, needle, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    one_line(invoke(*args), needle)


def test_simulate_of_millions_of_micro_batches_is_refused(tmp_path):
    job = tmp_path / "huge.yaml"
    job.write_text(JOB.read_text().replace("global_batch: 4", "global_batch: 100000000"))
    one_line(invoke("simulate", job), "25,000,000 micro-batches", "limit of 200,000")


def test_validate_of_40k_rows_is_refused(tmp_path):
    import csv

    src = list(csv.DictReader((REPO / "validation" / "public_runs.csv").open()))
    big = tmp_path / "big.csv"
    with big.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(src[0]))
        w.writeheader()
        for i in range(40_000):
            w.writerow({**src[i % len(src)], "id": f"r{i}"})
    one_line(invoke("validate", big), "40,000 rows", "limit of 2,000")


# ----------------------------------------------------------------------------- one line, printed safely
def commtax(*args, timeout=120):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "commtax.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (("search", JOB, "--top", "0"), "'--top'"),
        (("search", JOB, "--rank", "bogus"), "'--rank'"),
        (("estimate",), "Missing argument"),
        (("estimate", JOB, "--bogus"), "No such option: --bogus"),
        (("bogus",), "No such command"),
        (("report", JOB, "--top", "1000"), "'--top'"),
    ],
    ids=["range", "choice", "missing argument", "unknown option", "unknown command", "report range"],
)
def test_click_usage_errors_are_one_error_line(args, needle):
    r = commtax(*args)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "Usage:" not in r.stderr, r.stderr
    assert needle in r.stderr and "--help`" in r.stderr


def test_file_names_are_printed_with_control_characters_escaped_and_markup_literal(tmp_path):
    name = "x\x1b[2Jy\n[bold]z.yaml"
    r = invoke("estimate", tmp_path / name)
    err = one_line(r, "file not found")
    assert "\x1b" not in err and "\\x1b[2Jy\\n[bold]z.yaml" in err  # escaped, and the markup shown as typed


# ----------------------------------------------------------------------------- report --bench of the wrong shape
@pytest.mark.parametrize(
    "records, needle",
    [
        ("[1, 2]", "record 0 is not a mapping"),
        ('{"a": 1}', "expected a JSON list"),
        ("[NaN]", "NaN is not a number"),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        (
            '[{"op": "all_reduce", "impl": "torch", "backend": "gloo", "world_size": 2, "message_bytes": -5, '
            '"time_s": 1, "algbw_GBps": 1, "busbw_GBps": 1}]',
            "message_bytes must be a positive finite number",
        ),
        (
            '[{"op": "all_reduce", "impl": "torch", "backend": "gloo", "world_size": 2, "message_bytes": 5, '
            '"time_s": 1e999, "algbw_GBps": 1, "busbw_GBps": 1}]',
            "time_s must be a positive finite number",
        ),
    ],
    ids=["list of ints", "mapping", "NaN", "deep", "negative size", "infinite time"],
)
def test_report_bench_of_the_wrong_shape_is_one_line(tmp_path, records, needle):
    bench = trace_file(tmp_path, records, "bench.json")
    one_line(invoke("report", JOB, "--no-search", "--bench", bench, "-o", tmp_path / "r.html"), "--bench", needle)
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    "cluster, needle",
    [("[1]", "a cluster file is a mapping"), ("intra_node: 5\ninter_node: {bw_Gbps: x}\n", "--bench-cluster")],
)
def test_report_bench_cluster_of_the_wrong_shape_is_one_line(tmp_path, cluster, needle):
    bench = trace_file(tmp_path, "[]", "bench.json")
    c = trace_file(tmp_path, cluster, "c.yaml")
    r = invoke("report", JOB, "--no-search", "--bench", bench, "--bench-cluster", c, "-o", tmp_path / "r.html")
    one_line(r, "--bench-cluster", needle)


def test_version_imports_no_command_module():
    """`commtax --version` answers without importing search, cost or numpy (it took 1.4 s when it did)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.argv = ['commtax', '--version']; from commtax.cli.main import main; main(); "
        "print(sorted(m for m in ('commtax.decide.search', 'commtax.decide.cost', 'commtax.cli.planning') "
        "if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    from commtax import __version__

    assert r.returncode == 0 and r.stdout.splitlines() == [f"commtax {__version__}", "[]"], r


def test_a_negative_message_size_in_a_trace_is_not_a_size(tmp_path):
    import json

    kernel = {
        "ph": "X",
        "cat": "kernel",
        "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "pid": 0,
        "tid": 7,
        "ts": 1,
        "dur": 5,
        "args": {"Collective name": "allreduce", "In msg nelems": -5, "Out msg nelems": -5, "dtype": "Float"},
    }
    t = trace_file(tmp_path, json.dumps({"traceEvents": [kernel]}))
    r = invoke("trace", t, "--json")
    assert r.exit_code == 0, r.output
    sizes = [c["message_bytes"] for c in json.loads(r.stdout)["ranks"][0]["collectives"]]
    assert sizes and all(s is None or s >= 0 for s in sizes)


def test_a_trace_of_more_devices_than_a_process_has_is_refused(tmp_path):
    from commtax.trace.analyze import MAX_DEVICES_PER_TRACE

    kernels = [EVENT.replace('"pid": 0', f'"pid": {d}') % (1, 1) for d in range(MAX_DEVICES_PER_TRACE + 1)]
    one_line(invoke("trace", trace_file(tmp_path, events(*kernels))), f"over {MAX_DEVICES_PER_TRACE:,} devices")


def test_a_gzip_bomb_is_refused_at_its_expansion_ratio(tmp_path):
    """80 MiB of blanks in 80 KB of gzip (1000:1): refused after 64 MiB of text, not parsed to the end."""
    import gzip

    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=6) as f:
        f.write(b'{"traceEvents": [')
        for _ in range(80):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    one_line(invoke("trace", bomb), "gzip expansion", "over the limit of 200:1")


def test_the_folder_output_check_stops_at_the_double_dash():
    from commtax.cli.io import refuse_folder_outputs

    refuse_folder_outputs(["cluster", "run", "--", "python", "train.py", "--out", "ckpt/"])  # the user's program's
    import typer

    with pytest.raises(typer.Exit) as e:
        refuse_folder_outputs(["trace", "t.json", "-o", "x/"])
    assert e.value.exit_code == 2
