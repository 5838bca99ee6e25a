"""commtax bench: nccl-tests records, atomic results, a hung rank named and never a hang, clear CLI errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commtax.cli.measure import bench_app
from commtax.measure.results import ResultFile, load_records
from commtax.measure.testing import cli

KiB = 1024
HANG_GUARD_S = 120  # far above --timeout 5 + the heartbeat check: only a hang reaches it


@pytest.mark.torch
def test_local_sweep_writes_nccl_tests_records(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "b.json"
    r = cli(
        "bench",
        "collective",
        "--nproc",
        "2",
        "--ops",
        "all_reduce,all_gather,send_recv",
        "--min",
        "4KiB",
        "--max",
        "16KiB",
        "--iters",
        "2",
        "--impl",
        "torch,ring",
        "--out",
        str(out),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = load_records(out)
    # torch: 3 ops × 3 sizes; ring: all_reduce and all_gather × 3 sizes (it has no send_recv)
    assert len(recs) == 9 + 6
    for x in recs:
        n = x["world_size"]
        assert n == 2 and x["backend"] == "gloo"
        assert x["algbw_GBps"] == pytest.approx(x["message_bytes"] / x["time_s"] / 1e9)
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "send_recv": 1.0}[x["op"]]
        assert x["busbw_GBps"] == pytest.approx(x["algbw_GBps"] * factor)  # nccl-tests PERFORMANCE.md
    assert sorted({x["message_bytes"] for x in recs}) == [4 * KiB, 8 * KiB, 16 * KiB]
    assert len((tmp_path / "b.csv").read_text().splitlines()) == 1 + len(recs)


@pytest.mark.torch
def test_rounds_are_measured_apart_and_averaged(tmp_path):
    # --rounds 3: each size timed three times (warm-up, barrier, --iters back to back), time_s their mean: gloo's
    # all_to_all back to back settles into one of several steady states, a round after a barrier is a fresh draw
    pytest.importorskip("torch")
    out = tmp_path / "r.json"
    r = cli(
        "bench", "collective", "--nproc", "2", "--ops", "all_to_all", "--min", "4KiB", "--max", "4KiB",
        "--iters", "2", "--rounds", "3", "--out", str(out), timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (x,) = load_records(out)
    assert len(x["round_times_s"]) == 3 and x["iters"] == 2
    assert x["time_s"] == pytest.approx(sum(x["round_times_s"]) / 3)


@pytest.mark.torch
def _kill_matching(needle: str) -> None:
    """SIGKILL every process whose command line contains ``needle`` (a test's unique output path)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _pids_named(verdicts: list[str]) -> set[int]:
    """The pids of the ranks the verdict lines name (``rank R (node N, local rank L, HOST pid P) ...``)."""
    return {int(pid) for v in verdicts for pid in re.findall(r" pid (\d+)\)", v)}


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped; Z: a zombie); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_hung_rank_is_named_and_the_others_exit_within_the_timeout(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "h.json"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "commtax.cli.measure",
            "bench",
            "collective",
            "--nproc",
            "3",
            "--ops",
            "all_reduce",
            "--min",
            "1KiB",
            "--max",
            "64KiB",
            "--factor",
            "4",
            "--iters",
            "2",
            "--timeout",
            "5",
            "--fault",
            "1:2:stop",
            "--out",
            str(out),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    # a guard against a hang, not a timing assertion: a run that outlives it is killed and the test fails below
    hung: list[bool] = []
    guard = threading.Timer(HANG_GUARD_S, lambda: (hung.append(True), os.killpg(p.pid, signal.SIGKILL)))
    guard.start()
    try:
        verdicts = []
        for line in p.stderr:  # ranks 0 and 2 report; rank 1 is SIGSTOPped at measurement 2
            if line.startswith("commtax bench: rank"):
                verdicts.append(line)
            if len(verdicts) == 2:
                break
        # the survivor that names a stopped rank SIGKILLs it first (torchrun would wait 30 s for a SIGSTOPped rank
        # to honour its SIGTERM), so once both have spoken it is no longer stopped, and torchrun ends by itself
        still_stopped = [pid for pid in _pids_named(verdicts) if _state(pid) in ("T", "t")]
        p.stderr.read()
        p.wait()
    finally:
        guard.cancel()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        _kill_matching(str(out))  # the stopped rank runs in its own session: leave nothing behind
    assert len(verdicts) == 2, f"the survivors did not report within {HANG_GUARD_S} s (a hang): {verdicts}"
    assert all("rank 1 (node 0, local rank 1" in v and "died or stopped" in v for v in verdicts)
    assert {v.split(":")[0] for v in verdicts} == {"commtax bench"}
    assert _pids_named(verdicts) and not still_stopped, verdicts
    assert not hung and p.returncode != 0  # exited by itself (a failed rank), not ended by the hang guard
    assert [x["message_bytes"] for x in json.loads(out.read_text())] == [1 * KiB, 4 * KiB]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--ops", "allreduce"], "'--ops': unknown allreduce; choose from all_reduce"),
        (["--impl", "nccl"], "'--impl': unknown nccl; choose from torch"),
        (["--dtype", "fp64"], "'fp64' is not one of 'fp32', 'bf16', 'fp16', 'int64'"),
        (["--min", "1MiB", "--max", "1KiB"], "need min ≤ max"),
        (["--min", "lots"], "--min: cannot read size"),
        (["--ops", "broadcast", "--impl", "tree"], "implements all_reduce"),
        (["--rounds", "0"], "'--rounds'"),
    ],
)
def test_bad_bench_input_is_one_line_and_exit_2(args, needle):
    r = CliRunner().invoke(bench_app, ["collective", *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_results_survive_as_complete_files(tmp_path):
    f = ResultFile(tmp_path / "r.json")
    for i in range(3):
        f.append(
            {
                "op": "all_reduce",
                "impl": "torch",
                "backend": "gloo",
                "world_size": 2,
                "message_bytes": 2**i,
                "time_s": 1.0,
                "algbw_GBps": 0.0,
                "busbw_GBps": 0.0,
            }
        )
        assert len(load_records(tmp_path / "r.json")) == i + 1  # every append is a whole, valid file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.json"]  # no temp files left
    again = ResultFile(tmp_path / "r.json", append=True)
    assert len(again.records) == 3


@pytest.mark.torch
def test_gemm_reports_flops_of_transformer_shapes(tmp_path):
    pytest.importorskip("torch")
    r = CliRunner().invoke(
        bench_app,
        [
            "gemm",
            "--hidden",
            "64",
            "--tokens",
            "32",
            "--dtypes",
            "fp32",
            "--iters",
            "1",
            "--out",
            str(tmp_path / "g.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    recs = json.loads((tmp_path / "g.json").read_text())
    up = next(x for x in recs if x["name"] == "mlp_up")
    assert (up["m"], up["n"], up["k"]) == (32, 4 * 64, 64)
    assert up["flop"] == 2 * 32 * 256 * 64  # 2·m·n·k
    assert up["tflops"] == pytest.approx(up["flop"] / up["time_s"] / 1e12)


@pytest.mark.torch
def test_p2p_without_gpus_says_so_and_measures_memcpy(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    r = CliRunner().invoke(bench_app, ["p2p", "--bytes", "1MiB", "--iters", "2"])
    assert r.exit_code == 0 and "no CUDA GPUs" in r.output and "host_memcpy" in r.output


def test_dist_cli_does_not_import_torch():
    code = (
        "import sys, commtax.cli.measure, commtax.measure.calibrate, commtax.measure.schedules; "
        "print('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
