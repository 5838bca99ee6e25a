"""The README is a public interface: its set-up commands, catalog table and quoted figures must hold."""

import re

import pytest
from conftest import REPO

from commtax.spec import _builtin_catalog

README = (REPO / "README.md").read_text()
CATALOG_DOC = (REPO / "docs" / "catalog.md").read_text()  # the catalog tables' page (generated, as the README's blocks)


def test_readme_names_the_two_setup_commands():
    assert "make demo" in README and "make test" in README


def test_readme_catalog_table_lists_every_entry():
    listed = set(re.findall(r"^\| `([a-z0-9.-]+)` \|", CATALOG_DOC, flags=re.MULTILINE))
    for section in _builtin_catalog().values():
        assert set(section) <= listed, set(section) - listed


def test_required_catalog_ids_exist():
    c = _builtin_catalog()
    assert {
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "h100-sxm5-80gb",
        "h100-pcie-80gb",
        "h200-sxm-141gb",
        "b200-sxm-192gb",
        "rtx-4090-24gb",
        "l40s-48gb",
        "mi300x-192gb",
        "gb200",
    } <= set(c["gpu"])
    assert {"nvlink3", "nvlink4", "nvlink5", "pcie4-x16", "pcie5-x16"} <= set(c["intra_node"])
    assert {"eth-25g", "eth-100g", "roce-200g", "roce-400g", "ib-hdr", "ib-ndr", "ib-xdr"} <= set(c["inter_node"])
    assert {"gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"} <= set(
        c["model"]
    )
    for section in c.values():
        assert all(entry.get("source") for entry in section.values())


@pytest.mark.parametrize("block", ["catalog tables", "worked example", "moe worked example", "accuracy tables"])
def test_readme_generated_blocks_are_what_the_code_prints(block):
    from commtax.report.readme import BLOCK_FILES, BLOCKS, VALIDATION, section

    if block == "accuracy tables" and not (VALIDATION / "public_runs.csv").exists():
        pytest.skip(f"the accuracy tables are computed from {VALIDATION}, which this checkout lacks")
    text = (REPO / BLOCK_FILES[block]).read_text()
    assert section(text, block), f"{BLOCK_FILES[block]} markers for {block!r} not found"
    assert section(text, block) == BLOCKS[block](), f"{BLOCK_FILES[block]} {block} drifted: run `make readme`"


def test_readme_catalog_rows_carry_the_catalog_numbers():
    """A hand-checked sample of the generated table: the latencies and efficiencies the README once misquoted."""
    c = _builtin_catalog()
    for net in ("ib-ndr", "roce-400g"):
        row = re.search(rf"^\| `{net}` \| [^|]+ \| [^|]+ \| ([0-9.]+) \|", CATALOG_DOC, flags=re.M)
        assert row and float(row.group(1)) == c["inter_node"][net]["latency_us"], net
    row = re.search(r"^\| `h100-sxm5-80gb` \|(?: [^|]+ \|){5} default ([0-9.]+),", CATALOG_DOC, flags=re.M)
    assert row and float(row.group(1)) == c["gpu"]["h100-sxm5-80gb"]["matmul_efficiency"]["default"]


KNOWN_MISSES = {  # the row each figure of the README's "Known misses" paragraph quotes (whole percent)
    "nemo2407_Nemotron-8B_64g": "Nemotron-8B/22B rows ({:+.0f}%",
    "nemo2407_Nemotron-22B_64g": ", {:+.0f}%) list",
    "nemo2407_GPT3-20B_64g": "→ {:+.0f}%) and the TP",
    "mpt_a100_40gb_bf16_1b_2048_32": "MPT-1B at 32 GPUs ({:+.0f}%)",
    "mpt_a100_40gb_bf16_70b_2048_64": "MPT-70B on 64 A100-40GB ({:+.0f}%",
}


def test_readme_known_misses_are_what_validate_prints(validation_dir):
    from commtax.decide.validate import validate

    errors = {r.id: r.error_pct for r in validate(validation_dir / "public_runs.csv").rows}
    text = " ".join(README.split()).replace("−", "-")
    for row, quote in KNOWN_MISSES.items():
        assert quote.format(errors[row]) in text, (row, round(errors[row], 1))
