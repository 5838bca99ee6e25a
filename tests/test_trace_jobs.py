"""`trace` on a folder holding several jobs' traces: one set of tables per job (world size, start time), each
naming its files; the JSON lists the jobs."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.trace.analyze import SAME_JOB_S, analyze, jobs_of

register_commands()
T0_US = 1.7e15  # an absolute Kineto timestamp (µs since the epoch)


def trace(path: Path, rank: int, world: int, start_us: float, gemm_us: float = 600) -> Path:
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": start_us, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "ampere_gemm", "pid": 0, "tid": 7, "ts": start_us + 10, "dur": gemm_us},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "pid": 0,
            "tid": 8,
            "ts": start_us + 20 + gemm_us,
            "dur": 300,
        },
    ]
    path.write_text(json.dumps({"traceEvents": ev, "distributedInfo": {"rank": rank, "world_size": world}}))
    return path


def folder(d: Path) -> Path:
    trace(d / "a0.json", 0, 2, T0_US)  # job A: 2 ranks, 0.5 s apart
    trace(d / "a1.json", 1, 2, T0_US + 0.5e6, gemm_us=400)
    trace(d / "b0.json", 0, 4, T0_US + 1e6)  # job B: another world size, a second later
    trace(d / "c0.json", 0, 2, T0_US + 3600e6)  # job C: A's world size, an hour later
    return d


def test_ranks_group_by_world_size_start_time_and_rank(tmp_path):
    groups = jobs_of(analyze(folder(tmp_path)).ranks)
    assert [[Path(r.file).name for r in g] for g in groups] == [["a0.json", "a1.json"], ["b0.json"], ["c0.json"]]
    assert 3600 > SAME_JOB_S > 0.5


def test_a_repeated_rank_is_another_job_even_at_the_same_time(tmp_path):
    trace(tmp_path / "x.json", 0, 2, T0_US)
    trace(tmp_path / "y.json", 0, 2, T0_US)
    assert len(jobs_of(analyze(tmp_path).ranks)) == 2


def test_one_job_prints_one_table_and_no_warning(tmp_path):
    trace(tmp_path / "a0.json", 0, 2, T0_US)
    trace(tmp_path / "a1.json", 1, 2, T0_US + 1e6)
    r = CliRunner().invoke(app, ["trace", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "job 1 of" not in r.output and "warning" not in r.output
    assert r.output.count("Measured per rank") == 1


def test_cli_prints_one_table_per_job_naming_its_files(tmp_path):
    r = CliRunner().invoke(app, ["trace", str(folder(tmp_path))])
    assert r.exit_code == 0, r.output
    assert "these 4 traces are 3 jobs" in r.stderr
    assert r.stdout.count("Measured per rank") == 3
    heads = [ln for ln in r.stdout.splitlines() if ln.startswith("job ")]
    assert heads == [
        "job 1 of 3: world size 2, 2 rank(s), started +0 s; files: a0.json, a1.json",
        "job 2 of 3: world size 4, 1 rank(s), started +1 s; files: b0.json",
        "job 3 of 3: world size 2, 1 rank(s), started +3600 s; files: c0.json",
    ]
    # the straggler table compares the two ranks of job A only: rank 0 computes 0.6 ms, rank 1 0.4 ms
    stragglers = r.stdout.split("Stragglers")
    assert len(stragglers) == 2 and "0.60" in stragglers[1].split("job 2")[0]


def test_json_lists_the_jobs(tmp_path):
    r = CliRunner().invoke(app, ["trace", str(folder(tmp_path)), "--json"])
    jobs = json.loads(r.stdout)["jobs"]
    assert [(j["world_size"], [Path(f).name for f in j["files"]]) for j in jobs] == [
        (2, ["a0.json", "a1.json"]),
        (4, ["b0.json"]),
        (2, ["c0.json"]),
    ]
    assert jobs[2]["start_s"] - jobs[0]["start_s"] == 3600.0


# ----------------------------------------------------------------------------- picking one job (issue 22)
def job_file(d: Path, num_gpus: int) -> Path:
    import yaml

    cluster = {"gpu": "a100-sxm4-80gb", "num_gpus": num_gpus, "gpus_per_node": num_gpus, "intra_node": "nvlink3"}
    cluster |= {"inter_node": "ib-hdr", "nics_per_node": 1}
    job = {"model": "llama2-7b", "cluster": cluster, "plan": {"zero": 3}}
    job["training"] = {"seq_len": 2048, "global_batch": 8, "precision": "bf16"}
    path = d / f"job-{num_gpus}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def traces_in(tmp_path: Path) -> Path:
    """The three jobs' traces in a folder of their own (the job YAMLs go beside it)."""
    (tmp_path / "t").mkdir()
    return folder(tmp_path / "t")


def test_job_k_keeps_one_job(tmp_path):
    traces_in(tmp_path)
    r = CliRunner().invoke(app, ["trace", str(tmp_path / "t"), "--job", "2"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count("Measured per rank") == 1 and "job 1 of" not in r.output and "warning" not in r.output
    data = json.loads(CliRunner().invoke(app, ["trace", str(tmp_path / "t"), "--job", "2", "--json"]).stdout)
    assert data["job"] == 2 and [Path(x["file"]).name for x in data["ranks"]] == ["b0.json"]
    assert len(data["jobs"]) == 3  # every job is still listed
    r = CliRunner().invoke(app, ["trace", str(tmp_path / "t"), "--job", "4"])
    assert r.exit_code == 2 and r.output.startswith("error: --job: 4 is not one of the 3 job(s) in these traces")


def test_against_compares_the_one_job_of_its_world_size_or_asks(tmp_path):
    traces = traces_in(tmp_path)
    r = CliRunner().invoke(app, ["trace", str(traces), "--against", str(job_file(tmp_path, 4)), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["job"] == 2 and "against" in data
    assert "comparing job 2 of 3, the one of the job's world size 4" in r.stderr
    # world size 2: jobs 1 and 3 are both candidates, so the command names them and asks for --job
    two = job_file(tmp_path, 2)
    r = CliRunner().invoke(app, ["trace", str(traces), "--against", str(two)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith("error: --against: these 4 traces are 3 jobs (job 1: world size 2, 2 rank(s); job 2:")
    assert "2 have the job's world size 2; pick one with --job K" in r.output
    r = CliRunner().invoke(app, ["trace", str(traces), "--against", str(two), "--job", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert [Path(x["file"]).name for x in json.loads(r.stdout)["ranks"]] == ["c0.json"]


def test_report_trace_picks_the_job_of_its_world_size_or_asks(tmp_path):
    traces = traces_in(tmp_path)
    page = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", str(job_file(tmp_path, 4)), "--trace", str(traces), "-o", str(page)])
    assert r.exit_code == 0, r.output
    assert "the page shows job 2 of 3" in r.stderr and "b0.json" not in r.stderr
    r = CliRunner().invoke(app, ["report", str(job_file(tmp_path, 2)), "--trace", str(traces), "-o", str(page)])
    assert r.exit_code == 2 and "pick one with --job K" in r.output and r.output.startswith("error: --trace: ")
    r = CliRunner().invoke(
        app, ["report", str(job_file(tmp_path, 2)), "--trace", str(traces), "--job", "1", "-o", str(page)]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["report", str(job_file(tmp_path, 2)), "--job", "1", "-o", str(page)])
    assert r.exit_code == 2 and r.output.startswith("error: --job: picks one job of the --trace files")
