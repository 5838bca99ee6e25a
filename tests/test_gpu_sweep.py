"""The GPU sweep's results turned into catalog entries (no GPU here: a small synthetic results file)."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.errors import SpecError
from commtax.measure.sweep_entries import entries, read_results

register_commands()
runner = CliRunner()

RESULTS = {
    "device": "NVIDIA H100 80GB HBM3",
    "torch": "2.6.0",
    "cuda": "12.6",
    "date": "2026-12-01",
    "gemm": [
        {"name": "square_8192", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "tflops": 741.0},
        {"name": "llama_qkv", "dtype": "bf16", "m": 4096, "n": 1280, "k": 8192, "tflops": 600.0},
        {"name": "square_8192", "dtype": "fp8", "m": 8192, "n": 8192, "k": 8192, "tflops": 1300.0},
    ],
    "clock": {"burst_tflops": 740.0, "sustained_tflops": 629.0, "sustain_s": 120},
    "attention": [
        {"seq": 4096, "fwd_tflops": 330.0, "bwd_tflops": 280.0},
        {"seq": 2048, "fwd_tflops": 300.0, "bwd_tflops": 240.0},
    ],
    "hbm": {"copy_GBps": 3000.0, "add_GBps": 2850.0},
    "trace": "trace.json",
}
PEAKS = {"bf16": 989.4, "fp8": 1978.9}


def test_entries_from_a_sweep():
    e = entries(RESULTS, "h100-sxm5-80gb", PEAKS, 3350.0, "hopper")
    g = e["gpus"]["h100-sxm5-80gb"]
    # MAMF: the best shape's rate over the dense peak
    assert g["matmul_efficiency"] == {"default": round(741.0 / 989.4, 3), "fp8": round(1300.0 / 1978.9, 3)}
    assert g["clock_fraction"] == round(629.0 / 740.0, 3)  # sustained / burst
    assert "NVIDIA H100 80GB HBM3 (2026-12-01, torch 2.6.0" in g["source"]
    mem = e["assumptions"]["memory_efficiency"]
    assert mem["value"] == round(2850.0 / 3350.0, 3) and mem["fitted_on"] == []
    fa = e["attention"]["fa2"]["hopper"]
    assert fa["seq"] == [2048, 4096] and fa["fwd"] == [300.0, 330.0] and fa["bwd"] == [240.0, 280.0]
    assert fa["ref_peak_tflops"] == 989.4


def test_a_precision_without_a_peak_is_refused():
    with pytest.raises(SpecError, match="no fp8 peak"):
        entries(RESULTS, "a100-sxm4-80gb", {"bf16": 312.0}, 2039.0, "ampere")


def test_gpu_entries_command(tmp_path):
    p = tmp_path / "gpu_sweep.json"
    p.write_text(json.dumps(RESULTS))
    r = runner.invoke(app, ["bench", "gpu-entries", str(p), "--gpu", "h100-sxm5-80gb"])
    assert r.exit_code == 0, r.output
    gpus = yaml.safe_load(r.stdout.split("# catalog/gpus.yaml")[1].split("# catalog/")[0])
    assert gpus["h100-sxm5-80gb"]["matmul_efficiency"]["default"] == round(741.0 / 989.4, 3)
    bad = runner.invoke(app, ["bench", "gpu-entries", str(p), "--gpu", "h900"])
    assert bad.exit_code == 2 and "unknown 'h900'" in bad.stderr
    p.write_text("{}")
    r = runner.invoke(app, ["bench", "gpu-entries", str(p), "--gpu", "h100-sxm5-80gb"])
    assert r.exit_code == 2 and "missing device" in r.stderr


def test_read_results_refuses_a_non_json_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("not json")
    with pytest.raises(SpecError, match="not a readable gpu sweep"):
        read_results(p)


def test_the_sweep_needs_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the sweep would run for minutes")
    from commtax.measure.gpu_sweep import main

    assert main(["--out", str(tmp_path / "s")]) == 2
