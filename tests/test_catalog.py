"""The built-in catalog (src/commtax/catalog): every entry sourced; every GPU predicts a plausible MFU with a
precision it has; a precision a GPU lacks is one clear error; Volta runs eager attention."""

from __future__ import annotations

import pytest
import yaml

from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import CATALOG_DIR, _builtin_catalog, load_job, read_catalog_yaml, read_yaml

# added for published runs on hardware the catalog lacked (issue 8)
NEW_GPUS = [
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "a800-sxm4-80gb",
    "h800-sxm5-80gb",
    "h20-96gb",
    "mi250x",
    "mi325x-256gb",
    "a10-24gb",
    "l4-24gb",
    "a6000-48gb",
    "rtx-3090-24gb",
    "b100-sxm-192gb",
]
NEW_LINKS = ["nvlink2", "nvlink-a800", "nvlink-h800", "xgmi-mi250x", "pcie3-x16"]
NEW_NETWORKS = ["ib-edr", "ib-fdr", "roce-100g", "eth-10g", "eth-200g", "eth-400g", "efa-p4d", "efa-p5"]


def _nodes() -> dict[str, dict]:
    return yaml.safe_load((CATALOG_DIR / "prices.yaml").read_text())["nodes"]


def _job(gpu: str, precision: str | None = None, framework: str = "megatron-lm", **cluster) -> dict:
    """A small standard job: a GPT-style 1.3B model (24 x 2048, GPT-3 paper Table 2.1 "GPT-3 XL") data-parallel
    over one 8-GPU node of the GPU's usual server (catalog/prices.yaml nodes), seq 2048, 256 sequences a step."""
    node = _nodes()[gpu]
    peaks = _builtin_catalog()["gpu"][gpu]["peak_tflops"]
    return {
        "model": {
            "name": "gpt-1.3b",
            "layers": 24,
            "hidden": 2048,
            "heads": 16,
            "ffn_hidden": 8192,
            "vocab": 50257,
            "gated_mlp": False,
            "tied_embeddings": True,
        },
        "cluster": {
            "gpu": gpu,
            "num_gpus": 8,
            "gpus_per_node": 8,
            "intra_node": node["intra_node"],
            "inter_node": node["inter_node"],
            "nics_per_node": node["nics_per_node"],
            **cluster,
        },
        "plan": {"framework": framework, "tp": 1, "pp": 1, "zero": 1, "micro_batch": 4, "recompute": "none"},
        "training": {
            "seq_len": 2048,
            "global_batch": 256,
            "precision": precision or ("bf16" if "bf16" in peaks else "fp16"),
        },
    }


@pytest.mark.parametrize("name", sorted(p.name for p in CATALOG_DIR.glob("*.yaml")))
def test_shipped_files_read_fast_as_the_strict_reader_reads_them(name):
    """The shipped catalog is read without the user-file checks (read_catalog_yaml): each file must pass them
    (no duplicate key, no alias bomb) and read the same both ways."""
    assert read_catalog_yaml(CATALOG_DIR / name) == read_yaml(CATALOG_DIR / name)


def test_a_duplicate_key_in_a_catalog_file_would_fail_the_check_above(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("a: 1\na: 2\n")
    assert read_catalog_yaml(p) == {"a": 2}
    with pytest.raises(SpecError, match="duplicate key 'a'"):
        read_yaml(p)


@pytest.mark.parametrize("kind", ["gpu", "intra_node", "inter_node", "model"])
def test_every_catalog_entry_has_a_source(kind):
    entries = _builtin_catalog()[kind]
    assert entries
    for name, entry in entries.items():
        assert len(str(entry.get("source", "")).strip()) > 20, f"{kind} {name} has no source"


def test_the_new_entries_exist():
    c = _builtin_catalog()
    assert set(NEW_GPUS) <= set(c["gpu"])
    assert set(NEW_LINKS) <= set(c["intra_node"])
    assert set(NEW_NETWORKS) <= set(c["inter_node"])


def test_link_bandwidths_are_the_datasheet_bidirectional_totals_halved():
    links = _builtin_catalog()["intra_node"]
    assert links["nvlink2"]["bw_GBps"] == 300 / 2  # V100: 6 NVLink 2 links x 50 GB/s, both directions
    assert links["nvlink-a800"]["bw_GBps"] == 400 / 2
    assert links["nvlink-h800"]["bw_GBps"] == 400 / 2
    nets = _builtin_catalog()["inter_node"]
    assert nets["efa-p4d"]["bw_Gbps"] * 4 == 400  # p4d: 4 x 100 Gb/s EFA per node
    assert nets["efa-p5"]["bw_Gbps"] * 32 == 3200  # p5: 32 x 100 Gb/s EFA per node


@pytest.mark.parametrize("gpu", NEW_GPUS)
def test_each_new_gpu_predicts_a_plausible_mfu(gpu):
    b = estimate(load_job(_job(gpu)))
    assert 0.25 <= b.mfu <= 0.60, f"{gpu}: MFU {b.mfu:.3f}"
    assert b.step_time_s > 0


def test_h800_is_the_h100_with_a_narrower_nvlink():
    """Same compute: with TP over NVLink the H800 is slower only by its communication."""
    h100 = _job("h100-sxm5-80gb")
    h800 = _job("h800-sxm5-80gb")
    for j in (h100, h800):
        j["plan"].update(tp=8, micro_batch=1)
    e100, e800 = estimate(load_job(h100)), estimate(load_job(h800))
    assert e800.step_time_s > e100.step_time_s
    assert e800.comm_tax > e100.comm_tax


def test_bf16_on_v100_is_one_clear_error():
    with pytest.raises((SpecError, ValueError)) as e:
        load_job(_job("v100-sxm2-32gb", precision="bf16"))
    msg = str(e.value)
    assert "training.precision" in msg and "no bf16 peak" in msg and "fp16" in msg


def test_bf16_on_v100_exits_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job("v100-sxm2-16gb", precision="bf16")))
    r = CliRunner().invoke(app, ["estimate", str(path)])
    assert r.exit_code == 2
    out = r.output.strip().splitlines()
    assert len(out) == 1, r.output
    assert "training.precision" in out[0] and "Traceback" not in r.output


def test_volta_runs_eager_attention_whatever_the_framework_names():
    """FlashAttention 2 needs Ampere+ (attention.yaml eager_archs): a V100 job's attention is eager (so memory
    counts its s x s scores), and the same job on an A100 keeps the framework's fused kernel."""
    v100 = load_job(_job("v100-sxm2-32gb", framework="fsdp"))
    a100 = load_job(_job("a100-sxm4-80gb", framework="fsdp"))
    assert a100.plan.attention != "eager"
    assert v100.plan.attention == "eager" and not v100.plan.flash_attention


def test_a_catalog_file_parse_is_kept_beside_it_and_dropped_when_the_file_changes(tmp_path, monkeypatch):
    """read_catalog_yaml keeps its parse in __pycache__ (as Python keeps byte code): the second read comes from
    there and equals the parse; an edited file (another size or mtime) is parsed anew, a damaged cache too."""
    import os
    import sys

    from commtax.spec import files

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    p = tmp_path / "c.yaml"
    p.write_text("a: [1, 2.5, x]\nb: {c: null, d: true, 3: e}\n")
    first = read_catalog_yaml(p)
    cache = files._catalog_cache(p)
    assert cache.is_file() and cache.parent == tmp_path / "__pycache__"
    assert read_catalog_yaml(p) == first == {"a": [1, 2.5, "x"], "b": {"c": None, "d": True, 3: "e"}}
    st = os.stat(p)
    p.write_text("a: 2\n")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, another size: still stale
    assert read_catalog_yaml(p) == {"a": 2}
    cache.write_bytes(b"\x00garbage")
    assert read_catalog_yaml(p) == {"a": 2}
    monkeypatch.setattr(files.yaml, "load", lambda *a, **k: pytest.fail("parsed although the cache is fresh"))
    assert read_catalog_yaml(p) == {"a": 2}


def test_a_catalog_value_marshal_cannot_keep_is_parsed_each_time(tmp_path, monkeypatch):
    import sys

    from commtax.spec import files

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    p = tmp_path / "d.yaml"
    p.write_text("when: 2024-05-01\n")  # a YAML date: marshal has no date
    assert str(read_catalog_yaml(p)["when"]) == "2024-05-01"
    assert not files._catalog_cache(p).exists()
    assert str(read_catalog_yaml(p)["when"]) == "2024-05-01"


def test_no_catalog_cache_is_written_under_pythondontwritebytecode(tmp_path, monkeypatch):
    import sys

    from commtax.spec import files

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    p = tmp_path / "e.yaml"
    p.write_text("a: 1\n")
    assert read_catalog_yaml(p) == {"a": 1}
    assert not files._catalog_cache(p).exists()


def test_a_pycache_that_is_a_file_leaves_the_catalog_uncached(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (tmp_path / "__pycache__").write_text("")  # not a folder: the cache cannot be written, nor its temporary removed
    p = tmp_path / "f.yaml"
    p.write_text("a: 1\n")
    assert read_catalog_yaml(p) == read_catalog_yaml(p) == {"a": 1}
