"""commtax bench: nccl-tests records, atomic results, a hung rank named and never a hang, clear CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commtax.measure.cli import bench_app
from commtax.measure.results import ResultFile, load_records
from commtax.measure.testing import cli

KiB = 1024


@pytest.mark.torch
def test_local_sweep_writes_nccl_tests_records(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "b.json"
    r = cli("bench", "collective", "--nproc", "2", "--ops", "all_reduce,all_gather,send_recv", "--min", "4KiB",
            "--max", "16KiB", "--iters", "2", "--impl", "torch,ring", "--out", str(out), timeout=120)
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


def test_hung_rank_is_named_and_the_others_exit_within_the_timeout(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "h.json"
    p = subprocess.Popen([sys.executable, "-m", "commtax.measure.cli", "bench", "collective", "--nproc", "3",
                          "--ops", "all_reduce", "--min", "1KiB", "--max", "64KiB", "--factor", "4", "--iters", "2",
                          "--timeout", "5", "--fault", "1:2:stop", "--out", str(out)],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        verdicts, t_stop = [], None
        for line in p.stderr:  # ranks 0 and 2 report; rank 1 is SIGSTOPped at measurement 2
            if t_stop is None and out.exists() and len(json.loads(out.read_text())) == 2:
                t_stop = time.monotonic()
            if line.startswith("commtax bench: rank"):
                verdicts.append((time.monotonic(), line))
            if len(verdicts) == 2:
                break
        # the survivors SIGKILL the stopped rank, so torchrun ends at once instead of waiting 30 s for it
        exited_by_itself = p.wait(timeout=25) is not None  # raises TimeoutExpired (a failure) if it waits 30 s
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        _kill_matching(str(out))  # the stopped rank runs in its own session: leave nothing behind
    assert exited_by_itself and p.returncode != 0
    assert all("rank 1 (node 0, local rank 1" in v and "died or stopped" in v for _, v in verdicts)
    assert {v.split(":")[0] for _, v in verdicts} == {"commtax bench"} and len(verdicts) == 2
    assert max(t for t, _ in verdicts) - (t_stop or verdicts[0][0]) < 5 + 2.5 + 5  # timeout + heartbeat check + slack
    assert [x["message_bytes"] for x in json.loads(out.read_text())] == [1 * KiB, 4 * KiB]


@pytest.mark.parametrize("args,needle", [
    (["--ops", "allreduce"], "--ops: unknown allreduce"),
    (["--impl", "nccl"], "--impl: unknown nccl"),
    (["--min", "1MiB", "--max", "1KiB"], "need min ≤ max"),
    (["--min", "lots"], "--min: cannot read size"),
    (["--ops", "broadcast", "--impl", "tree"], "implements all_reduce"),
])
def test_bad_bench_input_is_one_line_and_exit_2(args, needle):
    r = CliRunner().invoke(bench_app, ["collective", *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_results_survive_as_complete_files(tmp_path):
    f = ResultFile(tmp_path / "r.json")
    for i in range(3):
        f.append({"op": "all_reduce", "impl": "torch", "backend": "gloo", "world_size": 2, "message_bytes": 2**i,
                  "time_s": 1.0, "algbw_GBps": 0.0, "busbw_GBps": 0.0})
        assert len(load_records(tmp_path / "r.json")) == i + 1  # every append is a whole, valid file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.json"]  # no temp files left
    again = ResultFile(tmp_path / "r.json", append=True)
    assert len(again.records) == 3


@pytest.mark.torch
def test_gemm_reports_flops_of_transformer_shapes(tmp_path):
    pytest.importorskip("torch")
    r = CliRunner().invoke(bench_app, ["gemm", "--hidden", "64", "--tokens", "32", "--dtypes", "fp32",
                                       "--iters", "1", "--out", str(tmp_path / "g.json")])
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
    code = "import sys, commtax.measure.cli, commtax.measure.calibrate, commtax.measure.schedules; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
