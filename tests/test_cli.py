"""The commtax command: outputs users read, and one clear line + exit 2 for every kind of bad input."""

import json

import pytest
import yaml
from conftest import REPO, job_dict
from typer.testing import CliRunner

from commtax.cli import app, register_commands

register_commands()
runner = CliRunner()


def write_job(tmp_path, data, name="job.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_estimate_json_has_the_documented_fields(tmp_path):
    r = run("estimate", REPO / "examples" / "llama2-70b-h100.yaml", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "comm_tax", "comm_share",
                "breakdown_s", "comm_bytes_per_gpu", "comm_time_s", "memory_gib_per_gpu", "fits", "days_to_train"):
        assert key in d
    assert set(d["breakdown_s"]) == {"compute", "recompute", "tp_exposed", "cp_exposed", "pp_bubble",
                                     "pp_exposed", "dp_exposed", "optimizer"}
    assert set(d["comm_bytes_per_gpu"]) == set(d["comm_time_s"]) == {"tp", "cp", "pp", "dp"}
    assert set(d["memory_gib_per_gpu"]) >= {"weights", "grads", "optimizer", "activations", "total"}
    assert d["fits"] is True and d["days_to_train"] > 0


def test_estimate_out_file_is_written(tmp_path):
    out = tmp_path / "b.json"
    r = run("estimate", REPO / "examples" / "llama2-70b-h100.yaml", "--out", out)
    assert r.exit_code == 0
    assert json.loads(out.read_text())["step_time_s"] > 0


BAD = [
    ({"model": "llama-2-70b"}, "unknown model 'llama-2-70b'; did you mean 'llama2-70b'"),
    ({"cluster.gpu": "h100"}, "cluster.gpu: unknown gpu 'h100'"),
    ({"plan.tp": 16, "plan.pp": 2}, "plan: tp(16) must divide heads(64) and kv_heads(8)"),
    ({"plan.tp": 3, "plan.dp": None}, "plan: tp(3) * pp(4) * cp(1) = 12 does not divide num_gpus(256)"),
    ({"plan.dp": 4}, "dp(4) * tp(8) * pp(4) * cp(1) = 128 != num_gpus(256)"),
    ({"training.global_batch": 1001}, "global_batch(1001) must be divisible by dp(8) * micro_batch(1)"),
    ({"plan.stage_layers": [40, 40]}, "stage_layers has 2 entries; give one per pipeline stage, pp(4)"),
    ({"cluster.num_gpus": -8}, "cluster.num_gpus: Input should be greater than 0"),
    ({"plan.zero": 5}, "plan.zero"),
    ({"plan.recompute": "partial"}, "plan.recompute"),
    ({"training.seq_len": None}, "training.seq_len"),
    ({"plan.tpp": 2}, "plan.tpp: Extra inputs are not permitted"),
    ({"cluster.gpu": {"peak_tflops": {"bf16": -1}, "mem_GiB": 80, "mem_bw_GBps": 3000}}, "peak_tflops.bf16"),
    ({"training.precision": "fp8", "cluster.gpu": "a100-sxm4-80gb"}, "has no fp8 peak"),
]


def _apply(d, changes):
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = d
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return d


@pytest.mark.parametrize("changes,message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_job_gets_one_clear_line_and_exit_2(tmp_path, changes, message):
    job = _apply(job_dict(), changes)
    r = run("estimate", write_job(tmp_path, job))
    assert r.exit_code == 2, r.output
    assert message in r.stderr.replace("\n", " ")
    assert "Traceback" not in r.output


def test_malformed_yaml_and_missing_file(tmp_path):
    r = run("estimate", write_job(tmp_path, "model: [unclosed\nplan: {"))
    assert r.exit_code == 2 and "malformed YAML" in r.stderr
    r = run("estimate", tmp_path / "nope.yaml")
    assert r.exit_code == 2 and "file not found" in r.stderr


def test_plan_that_does_not_fit_is_reported_with_the_memory_table(tmp_path):
    job = job_dict(tp=1, pp=1, dp=256, zero=0, recompute="none")
    r = run("estimate", write_job(tmp_path, job))
    assert r.exit_code == 1
    assert "does not fit GPU memory" in r.stderr
    assert "Memory per GPU" in r.stdout


def test_collective_prediction_and_sweep():
    r = run("collective", "all_reduce", "--bytes", "16GiB", "--gpu", "a100-sxm4-80gb", "--intra", "nvlink3",
            "--inter", "ib-hdr", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["busbw_GBps"] == pytest.approx(234.9, rel=0.02)  # nccl-tests on 8×A100 (stas00/ml-engineering)
    r = run("collective", "all_gather", "--bytes", "1MiB", "--sweep", "--json")
    rows = json.loads(r.stdout)
    assert rows[0]["message_bytes"] == 8 and rows[-1]["message_bytes"] == 2**20
    assert [x["time_s"] for x in rows] == sorted(x["time_s"] for x in rows)


def test_collective_bad_input():
    assert "cannot read size" in run("collective", "all_reduce", "--bytes", "12 parsecs").stderr
    r = run("collective", "allreduce")
    assert r.exit_code == 2 and "unknown collective 'allreduce'" in r.stderr
    r = run("collective", "all_reduce", "--gpus", "12", "--gpus-per-node", "8")
    assert r.exit_code == 2


def test_collective_reads_a_job_files_cluster():
    r = run("collective", "all_reduce", "--cluster", REPO / "examples" / "llama2-70b-h100.yaml", "--gpus", "64",
            "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["gpus"] == 64


def test_demo_prints_the_article_comparison():
    r = run("demo", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    names = [c["name"] for c in d["clusters"]]
    assert names == ["256× H100 SXM", "256× A100 SXM", "256× RTX 4090"]
    h100, a100, rtx = d["clusters"]
    assert h100["breakdown"]["step_time_s"] < a100["breakdown"]["step_time_s"] < rtx["breakdown"]["step_time_s"]
    assert rtx["breakdown"]["comm_tax"] > 0.5  # PCIe-bounced TP: the 4090 cluster mostly waits
    wall = d["communication_wall"]
    assert [w["compute_speedup"] for w in wall] == [1, 2, 4]
    assert all(w["speedup"] < w["compute_speedup"] for w in wall[1:])  # the communication wall
    assert wall[2]["comm_tax"] > wall[0]["comm_tax"]
    r = run("demo")
    assert "article" in r.stdout and "Why the numbers differ" in r.stdout


def test_user_catalog_adds_and_overrides_entries(tmp_path):
    cat = tmp_path / "cat.yaml"
    cat.write_text(yaml.safe_dump({
        "gpu": {"h100-slow": {"peak_tflops": {"bf16": 494.7}, "mem_GiB": 79.6, "mem_bw_GBps": 3350,
                              "source": "test: half an H100"}},
        "inter_node": {"ib-ndr": {"bw_Gbps": 100, "latency_us": 20, "efficiency": 0.9, "source": "test: slow NDR"}},
    }))
    base = json.loads(run("estimate", write_job(tmp_path, job_dict()), "--json").stdout)
    slow = job_dict()
    slow["cluster"]["gpu"] = "h100-slow"
    r = run("estimate", write_job(tmp_path, slow, "slow.yaml"), "--json", "--catalog", cat)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["step_time_s"] > base["step_time_s"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"gpu": {"x": {"peak_tflops": {"bf16": 1}}}}))
    r = run("estimate", write_job(tmp_path, job_dict()), "--catalog", bad)
    assert r.exit_code == 2 and "gpu.x: missing field 'source'" in r.stderr


def test_cluster_section_may_be_a_file(tmp_path):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(job_dict()["cluster"]))
    d = job_dict()
    d["cluster"] = "cluster.yaml"  # relative to the job file
    r = run("estimate", write_job(tmp_path, d), "--json")
    assert r.exit_code == 0, r.output


def test_estimate_path_imports_neither_torch_nor_matplotlib():
    import subprocess
    import sys

    code = (
        "import sys; from commtax.cli import main; sys.argv=['commtax','estimate',"
        f"{str(REPO / 'examples' / 'llama2-70b-h100.yaml')!r},'--json'];\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "sys.stderr.write(repr(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stderr.strip().endswith("[]"), r.stderr


def test_plots_are_written_as_png(tmp_path, validation_dir):
    for args, name in ((["estimate", REPO / "examples" / "llama2-70b-h100.yaml"], "e.png"),
                       (["demo"], "d.png"),
                       (["validate", validation_dir / "public_collectives.csv"], "v.png")):
        out = tmp_path / name
        r = run(*args, "--plot", out)
        assert r.exit_code == 0, r.output
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
