"""``measure.ddp_options``: what ``commtax bench ddp`` refuses before torch is imported or ranks are launched."""

from __future__ import annotations

import json

import pytest

from commtax.errors import SpecError
from commtax.measure.ddp_options import check_ddp_options, read_gemm_records


def test_hooks_are_parsed_from_a_comma_list():
    assert check_ddp_options("none, int8,powersgd", False, 4, 256, 4, "adamw") == ("none", "int8", "powersgd")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("zstd", False, 4, 256, 4, "adamw"), "--hook: unknown zstd"),
        (("", False, 4, 256, 4, "adamw"), r"--hook: unknown \(none\)"),
        (("bf16,int8", True, 4, 256, 4, "adamw"), "--error-feedback: applies to fp8"),
        (("powersgd", False, 3, 256, 4, "adamw"), "--powersgd-rank: choose from 1, 2, 4, 8"),
        (("none", False, 4, 10, 3, "adamw"), r"--hidden \(10\) must be divisible by --heads \(3\)"),
        (("none", False, 4, 256, 4, "lion"), "--optimizer: choose adamw or sgd"),
    ],
)
def test_what_cannot_run_is_refused_with_the_option_named(args, message):
    with pytest.raises(SpecError, match=message):
        check_ddp_options(*args)


def test_gemm_records_are_the_fp32_gemms_of_a_bench_file(tmp_path):
    f = tmp_path / "gemm.json"
    rows = [{"op": "gemm", "dtype": "fp32", "tflops": 1.0}, {"op": "gemm", "dtype": "bf16"}, {"op": "all_reduce"}]
    f.write_text(json.dumps(rows))
    assert read_gemm_records(f) == rows[:1]
    f.write_text(json.dumps(rows[1:]))
    with pytest.raises(SpecError, match="no fp32 gemm records; run `commtax bench gemm --dtypes fp32"):
        read_gemm_records(f)
    with pytest.raises(SpecError, match="--gemm: cannot read"):
        read_gemm_records(tmp_path / "missing.json")
