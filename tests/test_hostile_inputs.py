"""Hostile input files and arguments: one line naming the problem, exit 2, never a traceback, never a hang.

Classes (issue 12): YAML alias bombs / depth / size, duplicate keys, non-string top-level keys, strict ints,
non-UTF-8 files (Latin-1, UTF-16, binary) and a UTF-8 BOM, /dev/zero, absurd numeric arguments, validate's
measured cells / ids / --max-mape, relative `cluster:` paths, profile validation, excerpts of input in errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.errors import SpecError, excerpt
from commtax.spec import load_job, read_yaml

register_commands()
runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "llama2-70b-h100.yaml"
SMALL_JOB = {
    "model": "llama2-7b",
    "cluster": {
        "gpu": "h100-sxm5-80gb",
        "num_gpus": 16,
        "gpus_per_node": 8,
        "intra_node": "nvlink4",
        "inter_node": "ib-ndr",
    },
    "plan": {"tp": 2, "pp": 2},
    "training": {"seq_len": 4096, "global_batch": 64},
}
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBsZWNyZXRrZXltYXRlcmlhbHRoYXRtdXN0bmV2ZXJiZXNob3duAAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)

# 600 bytes that expand to 9^6 = 531,441 leaves: grows without end if anything walks it
ALIAS_BOMB = (
    "model: [&a [1,2,3,4,5,6,7,8,9], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], "
    "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]]\n"
)
BAD_FILES = {  # name -> (bytes, what the one line must say)
    "latin1": ("model: llama2-7b  # café\n".encode("latin-1"), "not UTF-8"),
    "utf16": ("model: llama2-7b\n".encode("utf-16"), "UTF-16"),
    "binary": (b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)), "binary file"),
    "alias_bomb": (ALIAS_BOMB.encode(), "alias bomb"),
    "self_alias": (b"model: &a [*a]\n", "refers to itself"),
    "deep_100": (("model: " + "[" * 100 + "]" * 100 + "\n").encode(), "nested deeper than 64"),
    "deep": (("model: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "nest"),
    "duplicate_key": (b"model: llama2-7b\nmodel: llama2-70b\n", "duplicate key 'model'"),
    "int_key": (b"1: 2\n", "top-level key 1"),
    "null_key": (b"null: x\n", "top-level key None"),
    "huge": (b"# " + b"x" * (17 * 2**20) + b"\n", "larger than 16 MiB"),
}


def one_line(r, code: int = 2) -> str:
    assert r.exit_code == code, (r.exit_code, r.output[-2000:])
    assert "Traceback" not in r.output
    err = r.stderr.strip()
    assert err.startswith("error:") and "\n" not in err, err
    assert len(err) < 600, err  # a line, not a dump of the input
    return err


def job_commands(path: Path) -> dict[str, list[str]]:
    """Every command that reads a job file, with the cheapest arguments."""
    p = str(path)
    return {
        "estimate": ["estimate", p],
        "simulate": ["simulate", p],
        "search": ["search", p, "--tp", "2", "--pp", "2"],
        "advise": ["advise", p, "--no-search"],
        "compare": ["compare", p],
        "collective": ["collective", "all_reduce", "--cluster", p],
    }


# ----------------------------------------------------------------------------- bad files, every reader
@pytest.mark.parametrize("kind", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["estimate", "simulate", "search", "advise", "compare", "collective"])
def test_bad_job_file_is_one_line_in_every_command(tmp_path, kind, command):
    data, needle = BAD_FILES[kind]
    p = tmp_path / "job.yaml"
    p.write_bytes(data)
    err = one_line(runner.invoke(app, job_commands(p)[command]))
    assert needle in err


@pytest.mark.parametrize("kind", ["latin1", "utf16", "binary", "alias_bomb", "duplicate_key"])
@pytest.mark.parametrize("option", ["--catalog", "--prices"])
def test_bad_catalog_and_price_files_are_one_line(tmp_path, kind, option):
    data, needle = BAD_FILES[kind]
    bad = tmp_path / "extra.yaml"
    bad.write_bytes(data)
    command = ["estimate", str(JOB)] if option == "--catalog" else ["compare", str(JOB)]
    assert needle in one_line(runner.invoke(app, [*command, option, str(bad)]))


@pytest.mark.parametrize("kind", ["latin1", "utf16", "binary", "alias_bomb"])
def test_bad_profile_file_is_one_line(tmp_path, kind):
    data, needle = BAD_FILES[kind]
    (tmp_path / "prof.yaml").write_bytes(data)
    job = {**SMALL_JOB, "cluster": {**SMALL_JOB["cluster"], "profile": "prof.yaml"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert needle in one_line(runner.invoke(app, ["estimate", str(tmp_path / "job.yaml")]))


def test_dev_zero_as_a_cluster_file_is_one_line():
    job = {**SMALL_JOB, "cluster": "/dev/zero"}
    with pytest.raises(SpecError, match="larger than 16 MiB"):
        load_job(job)
    assert "larger than 16 MiB" in one_line(runner.invoke(app, ["collective", "all_reduce", "--cluster", "/dev/zero"]))


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nd: {<<: *b, x: 3}\n")
    assert read_yaml(p) == {"base": {"x": 1, "y": 2}, "d": {"x": 3, "y": 2}}


def test_nested_duplicate_key_names_its_line(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("model: llama2-7b\nplan:\n  tp: 2\n  tp: 4\n")
    with pytest.raises(SpecError, match=r"line 4 .*duplicate key 'tp' \(first on line 3\)"):
        read_yaml(p)


def test_utf8_bom_job_file_is_read(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_bytes(b"\xef\xbb\xbf" + yaml.safe_dump(SMALL_JOB).encode())
    assert load_job(p).cluster.num_gpus == 16


# ----------------------------------------------------------------------------- strict numbers
@pytest.mark.parametrize(
    "section,field",
    [
        ("cluster", "gpus_per_node"),
        ("cluster", "num_gpus"),
        ("training", "seq_len"),
        ("training", "global_batch"),
        ("plan", "tp"),
        ("plan", "zero"),
        ("plan", "micro_batch"),
        ("cluster", "nics_per_node"),
    ],
)
def test_true_is_not_the_number_one(section, field):
    job = json.loads(json.dumps(SMALL_JOB))
    job[section][field] = True
    if section == "cluster" and field == "gpus_per_node":
        job["cluster"]["num_gpus"] = 1
    with pytest.raises(SpecError, match=rf"{field}: expected a number, got true"):
        load_job(job)


def test_yes_no_fields_still_take_booleans():
    job = json.loads(json.dumps(SMALL_JOB))
    job["plan"].update(sequence_parallel=True, overlap={"tp": True})
    assert load_job(job).plan.sequence_parallel is True


# ----------------------------------------------------------------------------- absurd arguments
@pytest.mark.parametrize(
    "args,needle",
    [
        (["collective", "all_reduce", "--gpus", "0"], "--gpus: a group has at least 1 GPU"),
        (["collective", "all_reduce", "--gpus", "-8"], "--gpus"),
        (["collective", "all_reduce", "--bytes", "1e400"], "at most 1 PiB"),
        (["collective", "all_reduce", "--bytes", "1e30"], "at most 1 PiB"),
        (["collective", "all_reduce", "--bytes", "nan"], "cannot read size"),
        (["collective", "all_to_all", "--algorithm", "ring"], "all_to_all has one algorithm"),
        (["collective", "send_recv", "--algorithm", "tree"], "send_recv has one algorithm"),
        (["simulate", str(JOB), "--bucket-mb", "1e-9"], "buckets"),
        (["simulate", str(JOB), "--bucket-mb", "nan"], "--bucket-mb"),
        (["simulate", str(JOB), "--gantt", "x.xyz"], "use .png, .svg or .pdf"),
    ],
)
def test_absurd_numeric_arguments_are_one_line(args, needle):
    assert needle in one_line(runner.invoke(app, args))


# ----------------------------------------------------------------------------- validate
COLLECTIVES_HEADER = "id,op,gpu,num_gpus,message_bytes,measured_busbw_GBps"


def collectives_csv(tmp_path: Path, *cells: str, encoding: str = "utf-8", bom: bool = False) -> Path:
    rows = [f"c{i},all_reduce,h100-sxm5-80gb,16,1073741824,{v}" for i, v in enumerate(cells)]
    p = tmp_path / "c.csv"
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "\n".join([COLLECTIVES_HEADER, *rows, ""]).encode(encoding))
    return p


@pytest.mark.parametrize("cell", ["nan", "inf", "-inf", "-300", "0"])
def test_validate_refuses_a_measured_cell_that_is_not_a_positive_number(tmp_path, cell):
    p = collectives_csv(tmp_path, "300", cell)
    err = one_line(runner.invoke(app, ["validate", str(p), "--max-mape", "1"]))
    assert "line 3, measured_busbw_GBps" in err and "not a positive finite measurement" in err


def test_validate_refuses_duplicate_ids(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text(
        "\n".join(
            [
                COLLECTIVES_HEADER,
                "a,all_reduce,h100-sxm5-80gb,16,1073741824,300",
                "a,all_reduce,h100-sxm5-80gb,16,1073741824,310",
                "",
            ]
        )
    )
    assert "id 'a' appears twice (lines 2 and 3)" in one_line(runner.invoke(app, ["validate", str(p)]))


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_validate_max_mape_must_be_a_percentage(tmp_path, value):
    p = collectives_csv(tmp_path, "300")
    assert "--max-mape" in one_line(runner.invoke(app, ["validate", str(p), "--max-mape", value]))


def test_validate_reads_a_utf8_bom_csv(tmp_path):
    r = runner.invoke(app, ["validate", str(collectives_csv(tmp_path, "300", bom=True)), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kind"] == "collectives"


@pytest.mark.parametrize("encoding,needle", [("utf-16", "UTF-16"), ("latin-1", "not UTF-8")])
def test_validate_non_utf8_csv_is_one_line(tmp_path, encoding, needle):
    p = collectives_csv(tmp_path, "300")
    p.write_bytes(p.read_text().replace("c0", "café").encode(encoding))
    assert needle in one_line(runner.invoke(app, ["validate", str(p)]))


def test_validate_json_is_strict_for_single_gpu_rows(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text(COLLECTIVES_HEADER + "\none,all_reduce,h100-sxm5-80gb,1,1048576,300\n")
    r = runner.invoke(app, ["validate", str(p), "--json"])
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in validate --json"))


# ----------------------------------------------------------------------------- relative paths, profiles
def test_relative_cluster_path_is_relative_to_the_job_file(tmp_path, monkeypatch):
    job_dir, elsewhere = tmp_path / "job", tmp_path / "cwd"
    job_dir.mkdir()
    elsewhere.mkdir()
    mine = {**SMALL_JOB["cluster"]}
    other = {**mine, "inter_node": {"bw_Gbps": 1, "source": "slow decoy"}}
    (job_dir / "c.yaml").write_text(yaml.safe_dump(mine))
    (elsewhere / "c.yaml").write_text(yaml.safe_dump(other))
    (job_dir / "job.yaml").write_text(yaml.safe_dump({**SMALL_JOB, "cluster": "c.yaml"}))
    monkeypatch.chdir(job_dir)
    here = load_job(job_dir / "job.yaml").cluster.inter_node.bw_Gbps
    monkeypatch.chdir(elsewhere)
    assert load_job(job_dir / "job.yaml").cluster.inter_node.bw_Gbps == here != 1


def _profile(**gemm: float) -> dict:
    return {
        "source": "test",
        "levels": {"intra": {"bw_GBps": 100, "latency_us": 5}, "inter": {"bw_GBps": 10, "latency_us": 10}},
        "gemm_efficiency": gemm,
    }


@pytest.mark.parametrize("eff", [0.0, float("nan"), -3.0, 50.0, float("inf")])
def test_profile_gemm_efficiency_must_be_a_fraction(eff):
    job = {**SMALL_JOB, "cluster": {**SMALL_JOB["cluster"], "profile": _profile(bf16=eff)}}
    with pytest.raises(SpecError, match=r"gemm_efficiency\.bf16 must be in \(0, 1\]"):
        load_job(job)


@pytest.mark.parametrize(
    "field,value",
    [
        ("bw_GBps", 0.0),
        ("bw_GBps", float("nan")),
        ("bw_GBps", float("inf")),
        ("latency_us", -1.0),
        ("latency_us", float("nan")),
    ],
)
def test_profile_level_numbers_are_positive_and_finite(field, value):
    prof = _profile()
    prof["levels"]["inter"][field] = value
    with pytest.raises(SpecError, match=field):
        load_job({**SMALL_JOB, "cluster": {**SMALL_JOB["cluster"], "profile": prof}})


def test_a_private_key_named_as_profile_is_never_printed(tmp_path):
    (tmp_path / "id_ed25519").write_text(PEM)
    job = {**SMALL_JOB, "cluster": {**SMALL_JOB["cluster"], "profile": str(tmp_path / "id_ed25519")}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    err = one_line(runner.invoke(app, ["estimate", str(tmp_path / "job.yaml")]))
    assert "not a hardware profile" in err
    for line in PEM.splitlines()[1:-1]:
        assert line[:12] not in err


@pytest.mark.parametrize("value", [PEM, "x" * 10_000, "a\x1b[31mred\x07", list(range(10**5)), {"k": 1}])
def test_excerpt_is_short_single_line_and_never_key_material(value):
    e = excerpt(value)
    assert len(e) <= 50 and "\n" not in e and "\x1b" not in e and "\x07" not in e
    assert "b3BlbnNz" not in e


def test_a_long_string_where_a_mapping_belongs_is_cut(tmp_path):
    job = {**SMALL_JOB, "training": "t" * 5000}
    with pytest.raises(SpecError) as e:
        load_job(job)
    assert len(str(e.value)) < 200


# ----------------------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_any_bytes_as_a_job_file_load_or_raise_one_spec_error(tmp_path, data):
    p = tmp_path / "fuzz.yaml"
    p.write_bytes(data)
    try:
        load_job(p)
    except SpecError as e:
        assert "\n" not in str(e) and len(str(e)) < 600


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=8))
_tree = st.recursive(
    _leaf,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(["gpu", "num_gpus", "tp", "pp", "layers", "hidden", "seq_len", "x", "profile", "zero"]),
            c,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(model=_tree, cluster=_tree, plan=_tree, training=_tree)
def test_any_structure_as_a_job_loads_or_raises_one_spec_error(model, cluster, plan, training):
    try:
        load_job({"model": model, "cluster": cluster, "plan": plan, "training": training})
    except SpecError as e:
        assert "\n" not in str(e)


@settings(max_examples=80, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_gemm_efficiency_is_accepted_only_in_0_1(eff):
    job = {**SMALL_JOB, "cluster": {**SMALL_JOB["cluster"], "profile": _profile(bf16=eff)}}
    try:
        load_job(job)
        assert 0 < eff <= 1
    except SpecError:
        assert not (0 < eff <= 1) or math.isnan(eff)


@pytest.mark.parametrize("gpus", ["a,b", "0,8", "-16"])
def test_compare_scaling_gpu_counts_are_one_line(tmp_path, gpus):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(SMALL_JOB))
    r = runner.invoke(
        app,
        [
            "compare",
            str(tmp_path / "job.yaml"),
            "--tp",
            "2",
            "--pp",
            "2",
            "--scaling",
            str(tmp_path / "s.png"),
            "--gpus",
            gpus,
        ],
    )
    assert "--gpus: expected" in one_line(r)
