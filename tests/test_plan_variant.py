"""``spec.plan_variant``, the search's fast validation of (vp, micro_batch, sequence_parallel) variants of a valid job:
the same verdict, the same refusal word for word and the same job as ``job_with``'s full validation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commtax.errors import SpecError
from commtax.spec import (
    JOB_CHECKS,
    VARIANT_FIELDS,
    job_unchecked,
    job_with,
    load_job,
    plan_variant,
    plan_variant_of,
    plan_variants,
    replaced,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOBS = {
    name: load_job(EXAMPLES / name)
    for name in (
        "compare/gpt3-175b-4096-h100.yaml",  # dense, 1f1b, vp refusals by micro-batch count
        "moe/deepseek-v3-h800.yaml",  # MoE: Megatron-Core's ep/etp checks read the micro-batches
        "pools/llama2-70b-a100-4090.yaml",  # two GPU pools: stages and batch shares per pool
        "llama2-70b-h100.yaml",
    )
}


def verdict(make, *args, **changes):
    """("ok", the job's dump) or ("refused", the message)."""
    try:
        job = make(*args, **changes)
    except SpecError as e:
        return "refused", str(e)
    return "ok", job.model_dump()


def a_valid_layout(job, tp: int, pp: int, cp: int):
    """The job with another layout (the balanced split), or None where the spec refuses it."""
    fields = {"tp": tp, "pp": pp, "cp": cp, "dp": None}
    if pp != job.plan.pp:
        fields |= dict.fromkeys(("stage_layers", "first_stage_layers", "last_stage_layers"))
    try:
        return job_with(job, **fields), fields
    except SpecError:
        return None, fields


VALUES = {
    "vp": st.sampled_from([1, 2, 3, 4, 6, 8, 0, -1, 2000, True]),
    "micro_batch": st.sampled_from([1, 2, 3, 4, 8, 16, 0, 100_000, False, 1.0]),
    "sequence_parallel": st.sampled_from([True, False, 1, 0, "yes"]),
}


# a base layout: which example job, and its tp, pp, cp (a_valid_layout makes it valid or skips)
LAYOUTS = {
    "name": st.sampled_from(sorted(JOBS)),
    "tp": st.sampled_from([1, 2, 4, 8]),
    "pp": st.sampled_from([1, 2, 4, 8, 16]),
    "cp": st.sampled_from([1, 2]),
}


@settings(max_examples=150, deadline=None)
@given(
    **LAYOUTS,
    changes=st.fixed_dictionaries({}, optional=VALUES),
)
def test_plan_variant_is_job_with(name, tp, pp, cp, changes):
    base, fields = a_valid_layout(JOBS[name], tp, pp, cp)
    if base is None:
        return
    full = verdict(job_with, base, **changes)
    assert verdict(plan_variant, base, **changes) == full
    # the search's first valid job of a base stands for the base's fields: a variant of it is the job itself changed
    assert verdict(job_with, JOBS[name], **fields, **changes) == full
    if full[0] == "ok":
        assert plan_variant(base, **changes) == job_with(base, **changes)


def test_refusals_are_the_full_validations():
    """Hand-picked: a vp the layers refuse, a micro-batch count the interleaved schedule refuses, bounds and types."""
    job = JOBS["compare/gpt3-175b-4096-h100.yaml"]
    for changes, starts in [
        ({"vp": 7}, "plan: vp(7) must divide layers(96)"),
        ({"vp": 2, "micro_batch": 2}, "plan: vp(2) > 1 needs the micro-batches per replica"),
        ({"micro_batch": 0}, "plan.micro_batch: Input should be greater than 0"),
        ({"micro_batch": True}, "plan: micro_batch: expected a number, got true"),
    ]:
        with pytest.raises(SpecError) as fast:
            plan_variant(job, **changes)
        with pytest.raises(SpecError) as full:
            job_with(job, **changes)
        assert str(fast.value) == str(full.value)
        assert str(fast.value).startswith(starts)


def test_only_the_variant_fields():
    with pytest.raises(AssertionError):
        plan_variant(JOBS["llama2-70b-h100.yaml"], tp=2)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_replaced_is_model_copy_to_the_last_attribute(name):
    """``spec.replaced`` (the search's copy of plans and jobs) leaves what pydantic's ``model_copy`` leaves: the
    same fields in the same order, the same set fields, equal and hashing alike; the original untouched."""
    job = JOBS[name]
    before = job.model_dump()
    changes = {"micro_batch": job.plan.micro_batch + 1, "recompute": "none"}
    ours, theirs = replaced(job.plan, **changes), job.plan.model_copy(update=changes)
    assert list(ours.__dict__.items()) == list(theirs.__dict__.items())
    assert ours.model_fields_set == theirs.model_fields_set and ours.model_extra is theirs.model_extra is None
    assert ours == theirs and hash(ours) == hash(theirs) and type(ours) is type(theirs)
    whole, whole_theirs = replaced(job, plan=ours), job.model_copy(update={"plan": theirs})
    assert list(whole.__dict__) == list(whole_theirs.__dict__) and whole == whole_theirs
    assert whole.model_dump() == whole_theirs.model_dump() and whole.plan.micro_batch == job.plan.micro_batch + 1
    assert job.model_dump() == before  # the copy shares nothing it changes


GRID_VALUES = {  # the search's grids: values of the Plan's own types (a few it refuses, to take the full path)
    "vp": st.lists(st.sampled_from([1, 2, 3, 4, 5, 6, 8, 0]), min_size=1, max_size=4, unique=True),
    "micro_batch": st.lists(st.sampled_from([1, 2, 3, 4, 8, 16, 100_000, 0]), min_size=1, max_size=4, unique=True),
    "sequence_parallel": st.lists(st.sampled_from([True, False]), min_size=1, max_size=2, unique=True),
}


@settings(max_examples=120, deadline=None)
@given(
    name=st.sampled_from(sorted(JOBS)),
    tp=st.sampled_from([1, 2, 3, 4, 8]),  # 3: the Job refuses some layouts whatever their variants
    pp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    cp=st.sampled_from([1, 2, 3]),
    axes=st.fixed_dictionaries({}, optional=GRID_VALUES),
)
def test_plan_variants_of_a_grid_are_job_with_of_each(name, tp, pp, cp, axes):
    """``plan_variants`` (each check once per value of what it reads) gives every combination of the grid the
    verdict, the refusal word for word and the job of ``job_with``'s full validation, in product order: of a valid
    job, and of a layout's ``job_unchecked`` (the plan validated, the Job's checks not run: a layout the Job refuses
    too, every check run on it)."""
    names = tuple(axes)
    product = list(itertools.product(*(range(len(axes[k])) for k in names)))
    base, fields = a_valid_layout(JOBS[name], tp, pp, cp)
    unchecked = job_unchecked(JOBS[name], **fields)
    assert unchecked is not None  # these layouts' plans are the Plan's own (only the Job refuses some)
    for start, checked, full in (
        (base, True, lambda c: verdict(job_with, base, **c)),
        (unchecked, False, lambda c: verdict(job_with, JOBS[name], **fields, **c)),
    ):
        if start is None:
            continue
        got = list(plan_variants(start, axes, checked=checked))
        assert [idx for idx, _ in got] == product
        for idx, result in got:
            changes = {k: axes[k][i] for k, i in zip(names, idx)}
            ours = ("refused", result) if isinstance(result, str) else ("ok", result.model_dump())
            assert ours == full(changes), (checked, changes)
        # build=False: the same verdicts, a job not built to run the checks left to ``plan_variant_of``
        lazy = list(plan_variants(start, axes, checked=checked, build=False))
        assert [idx for idx, _ in lazy] == product
        for (idx, result), (_, eager) in zip(lazy, got):
            if result is None:
                assert not isinstance(eager, str)
                result = plan_variant_of(start, axes, idx)
            assert (result if isinstance(result, str) else result.model_dump()) == (
                eager if isinstance(eager, str) else eager.model_dump()
            )


def test_job_unchecked_is_job_with_before_the_checks():
    """``job_unchecked``: job_with's plan, the Job's checks not run (None where the Plan itself refuses the plan)."""
    job = JOBS["compare/gpt3-175b-4096-h100.yaml"]
    same = job_unchecked(job, micro_batch=2, recompute="full")
    assert same.model_dump() == job_with(job, micro_batch=2, recompute="full").model_dump()
    assert same.plan.recompute_modules is None  # as job_with: full recompute drops the selective modules
    refused = job_unchecked(job, tp=3, dp=None)  # the Job refuses tp 3 (heads, GPUs); the Plan takes it
    assert refused is not None and refused.plan.tp == 3
    with pytest.raises(SpecError):
        job_with(job, tp=3, dp=None)
    assert job_unchecked(job, micro_batch=0) is None  # the Plan's own field refuses it


VARIANT_VALUES = {"vp": [1, 2, 3, 4, 6, 8], "micro_batch": [1, 2, 3, 4, 8, 16], "sequence_parallel": [True, False]}


def refusal(check, job):
    try:
        check.run(job)
    except ValueError as e:
        return str(e)
    return None


@settings(max_examples=150, deadline=None)
@given(
    **LAYOUTS,
    a=st.fixed_dictionaries({k: st.sampled_from(v) for k, v in VARIANT_VALUES.items()}),
    b=st.fixed_dictionaries({k: st.sampled_from(v) for k, v in VARIANT_VALUES.items()}),
)
def test_each_check_reads_no_variant_field_it_does_not_declare(name, tp, pp, cp, a, b):
    """A Job check's ``reads`` name every field of VARIANT_FIELDS it reads: two variants that differ only in the
    others get the same verdict and refusal from it (what lets ``plan_variants`` check it once per their value)."""
    base, _ = a_valid_layout(JOBS[name], tp, pp, cp)
    if base is None:
        return
    one = replaced(base, plan=replaced(base.plan, **a))
    for check in JOB_CHECKS:
        other = {k: (b[k] if k not in check.reads else a[k]) for k in VARIANT_FIELDS}
        two = replaced(base, plan=replaced(base.plan, **other))
        assert refusal(check, one) == refusal(check, two), (check.run.__name__, a, other)


def test_the_job_checks_cover_the_variant_fields_and_the_validator_runs_them_in_order():
    assert VARIANT_FIELDS == frozenset(VARIANT_VALUES)
    assert all(check.reads <= VARIANT_FIELDS for check in JOB_CHECKS)
    job = JOBS["compare/gpt3-175b-4096-h100.yaml"]
    # tp 3 fails the first check (the layout divides the GPUs) before the heads check it would fail too
    with pytest.raises(SpecError, match=r"^plan: tp\(3\) \* pp\(\d+\) \* cp\(1\) = \d+ does not divide num_gpus"):
        job_with(job, tp=3, dp=None)
