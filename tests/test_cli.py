"""The commtax command: outputs users read, and one clear line + exit 2 for every kind of bad input."""

import json
import re

import pytest
import yaml
from conftest import REPO, job_dict
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands

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
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "mfu",
        "hfu",
        "comm_tax",
        "comm_share",
        "breakdown_s",
        "comm_bytes_per_gpu",
        "comm_time_s",
        "memory_gib_per_gpu",
        "fits",
        "days_to_train",
    ):
        assert key in d
    assert set(d["breakdown_s"]) == {
        "compute",
        "recompute",
        "tp_exposed",
        "cp_exposed",
        "pp_bubble",
        "pp_exposed",
        "dp_exposed",
        "optimizer",
    }
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
    r = run(
        "collective",
        "all_reduce",
        "--bytes",
        "16GiB",
        "--gpu",
        "a100-sxm4-80gb",
        "--intra",
        "nvlink3",
        "--inter",
        "ib-hdr",
        "--json",
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["busbw_GBps"] == pytest.approx(234.9, rel=0.02)  # nccl-tests on 8×A100 (stas00/ml-engineering)
    r = run("collective", "all_gather", "--bytes", "1MiB", "--sweep", "--json")
    rows = json.loads(r.stdout)
    assert rows[0]["message_bytes"] == 8 and rows[-1]["message_bytes"] == 2**20
    assert [x["time_s"] for x in rows] == sorted(x["time_s"] for x in rows)


def test_collective_table_reads_in_adaptive_units_with_the_protocol():
    # issue 11: "170,186.8 µs" -> "170 ms"; small bandwidths keep 3 significant digits; algorithm/protocol shown
    r = run(
        "collective",
        "all_reduce",
        "--bytes",
        "16GiB",
        "--gpu",
        "a100-sxm4-80gb",
        "--intra",
        "nvlink3",
        "--inter",
        "ib-hdr",
    )
    assert r.exit_code == 0, r.output
    assert " ms " in r.stdout and "ring/Simple" in r.stdout and "µs" not in r.stdout
    r = run("collective", "all_reduce", "--bytes", "8", "--gpus", "8")
    assert "15.0 µs" in r.stdout and "ring/LL" in r.stdout  # NCCL LL: 6.6 + 14 × 0.6 µs (tuning.cc)
    assert "0.000533" in r.stdout  # algbw 8 B / 15.0 µs, not rounded to 0.00
    r = run("collective", "all_reduce", "--bytes", "8", "--gpus", "8", "--protocol", "Simple", "--json")
    assert json.loads(r.stdout)["protocol"] == "Simple"  # as NCCL_PROTO=Simple
    r = run("collective", "all_reduce", "--protocol", "LL256")
    assert r.exit_code == 2 and "'LL256' is not one of 'LL', 'LL128', 'Simple'" in r.stderr


def test_collective_bad_input():
    assert "cannot read size" in run("collective", "all_reduce", "--bytes", "12 parsecs").stderr
    r = run("collective", "allreduce")
    assert r.exit_code == 2 and "'allreduce' is not one of 'all_reduce', 'all_gather'" in r.stderr
    r = run("collective", "all_reduce", "--gpus", "12", "--gpus-per-node", "8")
    assert r.exit_code == 2


def test_collective_reads_a_job_files_cluster():
    r = run(
        "collective", "all_reduce", "--cluster", REPO / "examples" / "llama2-70b-h100.yaml", "--gpus", "64", "--json"
    )
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
    cat.write_text(
        yaml.safe_dump(
            {
                "gpu": {
                    "h100-slow": {
                        "peak_tflops": {"bf16": 494.7},
                        "mem_GiB": 79.6,
                        "mem_bw_GBps": 3350,
                        "source": "test: half an H100",
                    }
                },
                "inter_node": {
                    "ib-ndr": {"bw_Gbps": 100, "latency_us": 20, "efficiency": 0.9, "source": "test: slow NDR"}
                },
            }
        )
    )
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
        "import sys; from commtax.cli.main import main; sys.argv=['commtax','estimate',"
        f"{str(REPO / 'examples' / 'llama2-70b-h100.yaml')!r},'--json'];\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "sys.stderr.write(repr(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stderr.strip().endswith("[]"), r.stderr


def test_plots_are_written_as_png(tmp_path, validation_dir):
    for args, name in (
        (["estimate", REPO / "examples" / "llama2-70b-h100.yaml"], "e.png"),
        (["demo"], "d.png"),
        (["validate", validation_dir / "public_collectives.csv"], "v.png"),
    ):
        out = tmp_path / name
        r = run(*args, "--plot", out)
        assert r.exit_code == 0, r.output
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- what a new user reads
SMALL = {
    "model": "llama2-7b",
    "cluster": {
        "gpu": "h100-sxm5-80gb",
        "num_gpus": 16,
        "gpus_per_node": 8,
        "intra_node": "nvlink4",
        "inter_node": "ib-ndr",
        "nics_per_node": 8,
    },
    "plan": {"tp": 2, "pp": 2, "micro_batch": 1},
    "training": {"seq_len": 2048, "global_batch": 64, "precision": "bf16", "tokens": 1e11},
}
NARROW = ("--cp", "1", "--vp", "1", "--zero", "1", "--micro-batch", "1")  # a small space: a quick search


@pytest.fixture
def at_80_columns():
    from commtax.cli.io import console

    width = console.width
    console.width = 80
    yield
    console.width = width


def assert_reads_at_80_columns(text):
    lines = text.splitlines()
    assert lines, "no output"
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    assert "…" not in text, [line for line in lines if "…" in line]  # nothing truncated


@pytest.mark.parametrize(
    "args",
    [
        ("estimate", REPO / "examples" / "llama2-70b-h100.yaml"),
        ("simulate", REPO / "examples" / "llama2-70b-h100.yaml"),
        ("advise", REPO / "examples" / "llama2-70b-h100.yaml", "--no-search"),
        ("cost", REPO / "examples" / "llama2-70b-h100.yaml"),
        ("demo",),
        ("collective", "all_reduce", "--sweep", "--bytes", "1MiB"),
    ],
    ids=lambda a: a[0],
)
def test_every_table_reads_at_80_columns(at_80_columns, args):
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert_reads_at_80_columns(r.stdout)


def test_validate_reads_at_80_columns_with_whole_ids(at_80_columns, validation_dir):
    r = run("validate", validation_dir / "public_collectives.csv")
    assert r.exit_code == 0, r.output
    assert_reads_at_80_columns(r.stdout)
    assert "mleng_h200_16g_reduce_scatter_ring" in r.stdout  # the longest id, message size and all
    r = run("validate", validation_dir / "public_runs.csv")
    assert r.exit_code == 0, r.output
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    assert "mpt_a100_40gb_bf16_70b_2048_128 " in r.stdout


def test_search_and_compare_read_at_80_columns(at_80_columns, tmp_path):
    job = write_job(tmp_path, SMALL)
    r = run("search", job, *NARROW, "--top", "3")
    assert r.exit_code == 0, r.output
    assert_reads_at_80_columns(r.stdout)
    assert re.search(r"^ 1\s+tp\d+·pp\d+·dp\d+·mb1", r.stdout, flags=re.M)  # the plan in one token, on one line
    r = run("compare", job, "--gpu", "h100-sxm5-80gb", "a100-sxm4-80gb", *NARROW, "--article")
    assert r.exit_code == 0, r.output
    assert_reads_at_80_columns(r.stdout)
    assert "16×a100-sxm4-80gb" in r.stdout and "tp" in r.stdout


def test_wide_adds_columns_past_80(at_80_columns, tmp_path):
    r = run("search", write_job(tmp_path, SMALL), *NARROW, "--top", "2", "--wide")
    assert r.exit_code == 0, r.output
    header = next(line for line in r.stdout.splitlines() if "plan" in line and "step s" in line)
    assert "dp exp" in header and "GiB" in header


def test_plan_label_is_one_token():
    from commtax.decide.plans import PlanRow, plan_label

    p = {
        "tp": 8,
        "pp": 4,
        "cp": 1,
        "dp": 8,
        "vp": 1,
        "micro_batch": 1,
        "zero": 0,
        "recompute": "none",
        "sequence_parallel": False,
        "grad_comm_dtype": "bf16",
    }
    assert plan_label(PlanRow.from_dict(p)) == "tp8·pp4·dp8·mb1"
    p.update(cp=2, vp=2, zero=1, recompute="selective", sequence_parallel=True, grad_comm_dtype="fp8")
    assert plan_label(PlanRow.from_dict(p)) == "tp8·pp4·cp2·dp8·mb1·vp2·z1·sel·sp·g:fp8"


# ----------------------------------------------------------------------------- flags, choices, --version
def test_help_shows_flags_as_flags_and_ranges_only_where_they_apply():
    r = run("search", "--help")
    assert r.exit_code == 0
    assert "<bool>" not in r.stdout and "BOOLEAN" not in r.stdout
    assert re.search(r"--json\s+print JSON", r.stdout)
    rc = " ".join(r.stdout.split("--recompute", 1)[1].split("--sequence-parallel")[0].split())
    sp = " ".join(r.stdout.split("--sequence-parallel", 1)[1].split("--grad-comm-dtype")[0].split())
    assert "none,selective,full" in rc and ".." not in rc and ".." not in sp
    assert "a..b" in " ".join(r.stdout.split("--tp", 1)[1].split("--pp")[0].split())
    assert run("estimate", REPO / "examples" / "llama2-70b-h100.yaml", "--json", "true").exit_code == 2


def test_version():
    from commtax import __version__

    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"commtax {__version__}"


@pytest.mark.parametrize(
    "args,message",
    [
        (["search", "JOB", "--rank", "fastest"], "'--rank': Value error, 'fastest' is not one of 'step', 'cost'"),
        (["compare", "JOB", "--power", "max"], "'--power': Value error, 'max' is not one of 'typical', 'tdp'"),
        (["cost", "JOB", "--power", "max"], "'max' is not one of 'typical', 'tdp'"),
        (
            ["collective", "all_reduce", "--algorithm", "bruck"],
            "'--algorithm': Value error, 'bruck' is not one of 'ring'",
        ),
        (
            ["search", "JOB", "--recompute", "some"],
            "--recompute: input should be 'none', 'selective' or 'full', got 'some'",
        ),
        (["search", "JOB", "--sequence-parallel", "0..1"], "--sequence-parallel: give values (a,b), not a range"),
        (["compare", "JOB", "--num-gpus", "8,x"], "--num-gpus: expected integers, got 'x'"),
        (["cost", "JOB", "--prices", "PRICES"], "gpus.h100-sxm5-80gb: missing field 'source'"),
    ],
)
def test_bad_options_get_one_clear_line_and_exit_2(tmp_path, args, message):
    job = write_job(tmp_path, SMALL)
    prices = tmp_path / "p.yaml"
    prices.write_text(yaml.safe_dump({"gpus": {"h100-sxm5-80gb": {"purchase_usd": 1}}}))  # not a full entry
    r = run(*[job if a == "JOB" else prices if a == "PRICES" else a for a in args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.stderr.split()) or message in r.stderr.replace("\n", " "), r.stderr
    assert "Traceback" not in r.output


def test_max_mape_is_printed_to_one_decimal(validation_dir):
    r = run("validate", validation_dir / "public_collectives.csv", "--max-mape", "0.5")
    assert r.exit_code == 1
    assert re.search(r"error: MAPE \d+\.\d% is above --max-mape 0\.5%$", r.stderr.strip()), r.stderr


# ----------------------------------------------------------------------------- cost
def test_cost_of_one_job(tmp_path):
    from commtax.decide.cost import HOUR_S, load_prices
    from commtax.schedule.analytical import estimate as run_estimate
    from commtax.spec import load_job

    job_file = write_job(tmp_path, SMALL)
    d = json.loads(run("cost", job_file, "--json").stdout)
    b = run_estimate(load_job(job_file))
    assert d["mode"] == "owned" and d["tokens"] == 1e11
    assert d["days"] == pytest.approx(1e11 / b.tokens_per_s / 86400, rel=1e-9)
    assert d["gpu_hours"] == pytest.approx(16 * d["days"] * 24, rel=1e-9)
    rent = json.loads(run("cost", job_file, "--rent", "--json").stdout)
    rate = load_prices().gpu("h100-sxm5-80gb").rent_usd_per_gpu_hour
    assert rent["usd"] == pytest.approx(rent["gpu_hours"] * rate, rel=1e-9)  # GPU-hours × $/GPU-h
    assert rent["usd_per_B_tokens"] == pytest.approx(16 * rate / HOUR_S * 1e9 / b.tokens_per_s, rel=1e-9)
    r = run("cost", job_file)
    assert "GPU-hours" in r.stdout and "MWh" in r.stdout and "$ per B tokens (owned)" in r.stdout


def test_cost_of_a_plan_that_does_not_fit_exits_1(tmp_path):
    r = run("cost", write_job(tmp_path, job_dict(tp=1, pp=1, dp=256, zero=0, recompute="none")))
    assert r.exit_code == 1 and "does not fit GPU memory" in r.stderr


# ----------------------------------------------------------------------------- what was printed twice or not at all
def test_estimate_of_a_plan_that_does_not_fit_prints_the_memory_table_once(tmp_path):
    r = run("estimate", write_job(tmp_path, job_dict(tp=1, pp=1, dp=256, zero=0, recompute="none")))
    assert r.exit_code == 1
    assert r.stdout.count("Memory per GPU") == 1 and "capacity (does not fit)" in r.stdout


def test_simulate_of_a_plan_that_does_not_fit_warns_and_exits_1(tmp_path):
    r = run("simulate", write_job(tmp_path, job_dict(tp=1, pp=1, dp=256, zero=0, recompute="none")))
    assert r.exit_code == 1, r.output
    assert "capacity (does not fit)" in r.stdout
    assert "warning:" in r.stderr and "does not fit GPU memory" in r.stderr


def test_simulate_explain_prints_each_explanation_once(at_80_columns):
    r = run("simulate", REPO / "examples" / "llama2-70b-h100.yaml", "--explain")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert text.count("step: simulated") == 1
    assert "…" not in r.stdout


def test_progress_goes_to_stderr_only_on_a_terminal(tmp_path):
    r = run("search", write_job(tmp_path, SMALL), *NARROW, "--json")
    assert r.exit_code == 0 and r.stderr == ""  # no progress bar when stderr is not a terminal
    json.loads(r.stdout)


def test_a_signal_while_a_class_is_built_is_still_an_interrupt():
    """Ctrl-C landing in a descriptor's ``__set_name__`` (pydantic builds the spec classes at import) reaches the
    CLI as "RuntimeError: Error calling __set_name__" on Python 3.11: it must still exit 130, not print a
    traceback (a CI rehearsal's SIGINT at the handler moment did)."""
    from commtax.cli.main import _interrupt_in

    class Interrupting:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt("SIGINT")

    with pytest.raises(BaseException) as caught:
        type("Spec", (), {"field": Interrupting()})
    assert str(_interrupt_in(caught.value)) == "SIGINT"
    assert _interrupt_in(RuntimeError("a real error")) is None
