"""Plans travel as one typed form: ``PlanRow`` (a row of a plan table, written as a dict only at the edge) and
``Plan.replace`` (a changed plan, validated again)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO
from hypothesis import given
from hypothesis import strategies as st

from commtax.decide.compare import plan_of
from commtax.decide.plans import NO_CHOICE, POOL_COLUMNS, PlanRow, plan_label
from commtax.decide.space import COLUMNS, MOE_COLUMNS
from commtax.errors import SpecError
from commtax.spec import job_with, load_job

WORKED = REPO / "examples" / "llama2-70b-h100.yaml"  # tp8 pp4 on 256 H100: dp 8, ZeRO-1, selective, sp
POOLS = REPO / "examples" / "pools" / "llama2-70b-a100-4090.yaml"


def test_the_worked_example_as_a_search_row():
    row = PlanRow.of(load_job(WORKED), COLUMNS)
    assert row.to_dict() == {
        "tp": 8,
        "pp": 4,
        "cp": 1,
        "dp": 256 // (8 * 4),  # dp resolved from the GPUs: the plan leaves it to the spec
        "vp": 1,
        "micro_batch": 1,
        "sequence_parallel": True,
        "zero": 1,
        "recompute": "selective",
        "grad_comm_dtype": "bf16",
    }
    assert list(row.to_dict()) == list(COLUMNS)  # the table's order
    assert row.label == "tp8·pp4·dp8·mb1·z1·sel·sp" == plan_label(row)


def test_compare_writes_the_jobs_plan_in_the_specs_field_order():
    assert list(plan_of(load_job(WORKED)).to_dict()) == [
        "tp",
        "pp",
        "dp",
        "cp",
        "vp",
        "sequence_parallel",
        "zero",
        "recompute",
        "micro_batch",
        "grad_comm_dtype",
    ]


def test_a_pool_plan_keeps_its_stages_and_writes_lists():
    job = load_job(POOLS)
    row = PlanRow.of(job, POOL_COLUMNS)
    d = row.to_dict()
    assert list(d) == list(POOL_COLUMNS)
    assert d["stage_pools"] == list(job.plan.stage_pools) and d["stage_layers"] == list(job.stage_layers)
    assert sum(d["stage_layers"]) == job.model.layers
    assert json.loads(json.dumps(d)) == d and PlanRow.from_dict(d) == row


def test_rows_are_frozen_and_hashable():
    row = PlanRow.of(load_job(WORKED), COLUMNS)
    with pytest.raises(AttributeError):
        row.tp = 4  # type: ignore[misc]
    assert len({row, PlanRow.from_dict(row.to_dict())}) == 1
    assert NO_CHOICE.to_dict() == {}


def test_a_column_that_is_no_plan_field_is_a_programmers_error():
    with pytest.raises(AssertionError, match="no field"):
        PlanRow(("tp", "tensor_parallel"))


ROWS = st.fixed_dictionaries(
    {
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.integers(1, 64),
        "cp": st.integers(1, 8),
        "dp": st.integers(1, 4096),
        "vp": st.integers(1, 8),
        "micro_batch": st.integers(1, 32),
        "sequence_parallel": st.booleans(),
        "zero": st.sampled_from([0, 1, 2, 3]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "grad_comm_dtype": st.sampled_from(["bf16", "fp32", "int8"]),
        "ep": st.integers(1, 64),
        "etp": st.integers(1, 8),
        "moe_dispatcher": st.sampled_from(["alltoall", "deepep"]),
        "moe_a2a_overlap": st.booleans(),
    }
)


@given(ROWS, st.booleans())
def test_a_search_row_reads_back_as_it_was_written(d, moe):
    d = {k: d[k] for k in (MOE_COLUMNS if moe else COLUMNS)}
    row = PlanRow.from_dict(d)
    assert row.to_dict() == d and list(row.to_dict()) == list(d)
    tokens = row.label.split("·")  # the label reads the row's columns: the layout first, then what differs
    assert (
        tokens[:2] == [f"tp{d['tp']}", f"pp{d['pp']}"]
        and f"dp{d['dp']}" in tokens
        and f"mb{d['micro_batch']}" in tokens
    )
    assert ("sp" in tokens) == d["sequence_parallel"] and (f"z{d['zero']}" in tokens) == (d["zero"] > 0)
    assert ("·ep" in row.label) == moe  # a dense row has no expert fields to show


def test_replace_validates_the_changed_plan_and_names_the_field():
    plan = load_job(WORKED).plan
    assert plan.replace(micro_batch=2).micro_batch == 2 and plan.micro_batch == 1
    assert plan.replace(micro_batch=2).overlap == plan.overlap  # the framework's defaults are not re-applied
    with pytest.raises(SpecError, match=r"^plan\.tp: Input should be greater than 0"):
        plan.replace(tp=0)
    with pytest.raises(SpecError, match="^plan: grad_error_feedback applies to a quantized grad_comm_dtype"):
        plan.replace(grad_error_feedback=True)


def test_job_with_refuses_a_plan_the_job_cannot_run_as_before():
    job = load_job(WORKED)
    with pytest.raises(SpecError, match=r"plan: tp\(16\) must divide heads\(64\) and kv_heads\(8\)"):
        job_with(job, tp=16, pp=2)
    assert job_with(job, zero=2).plan == job.plan.replace(zero=2)
