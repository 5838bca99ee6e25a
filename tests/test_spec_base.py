"""spec/base.py: the held key of the last specs met, and a spec hashed once as part of a key."""

from __future__ import annotations

from commtax.spec import load_job
from commtax.spec.base import HashedOnce, held_key


def test_held_key_is_made_again_only_for_other_objects():
    made = []

    def make(*specs):
        made.append(specs)
        return len(made)

    job = load_job("examples/llama2-70b-h100.yaml")
    twin = job.model.model_copy()  # equal, another object: made again (identity is the cheap test, value the key's)
    assert held_key("test", (job.model, job.training), make) == 1
    assert held_key("test", (job.model, job.training), make) == 1  # the very objects: held
    assert held_key("test", (twin, job.training), make) == 2
    assert held_key("other kind", (twin, job.training), make) == 3  # each kind holds its own
    assert held_key("test", (twin,), make) == 4  # another arity is another key
    assert made[1] == made[0]  # what was made again is equal


def test_hashed_once_compares_by_value_and_keeps_its_hash():
    job = load_job("examples/llama2-70b-h100.yaml")
    a = HashedOnce(job.model, hash(job.model))
    b = HashedOnce(job.model.model_copy(), hash(job.model))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != HashedOnce(job.training, hash(job.model))  # an equal hash is not enough


def test_specs_read_attributes_without_pydantic_hook_and_answer_alike():
    """``plain_attribute_reads``: the spec classes look attributes up as a plain object does (CPython), reading the
    same values and refusing a missing name as pydantic's ``__getattr__`` does; a class whose hook can answer (extra
    fields) keeps it."""
    import pydantic
    import pytest

    from commtax.spec import Job
    from commtax.spec.assumptions import Assumptions
    from commtax.spec.base import _GENERIC_GETATTR, _getattro_slot
    from commtax.spec.hardware import Profile
    from commtax.spec.plan import Plan

    if _GENERIC_GETATTR is not None:
        for cls in (Job, Plan, Assumptions):
            assert _getattro_slot(cls).value == _GENERIC_GETATTR, cls
        assert _getattro_slot(pydantic.BaseModel).value != _GENERIC_GETATTR  # pydantic itself is left alone
    job = load_job("examples/llama2-70b-h100.yaml")
    assert job.plan.tp == job.__dict__["plan"].__dict__["tp"]
    assert job.dp == job.cluster.num_gpus // (job.plan.tp * job.plan.pp * job.plan.cp)  # a property
    assert job.__pydantic_fields_set__ and job.__pydantic_extra__ is None
    for spec in (job, job.plan):
        with pytest.raises(AttributeError, match=rf"^'{type(spec).__name__}' object has no attribute 'nope'$"):
            spec.nope  # noqa: B018
        assert getattr(spec, "nope", 7) == 7 and not hasattr(spec, "nope")
    profile = Profile.model_validate({"source": "test", "levels": {}, "note": "kept"})  # extra="allow"
    assert profile.note == "kept"  # served by pydantic's hook
    if _GENERIC_GETATTR is not None:
        assert _getattro_slot(Profile).value != _GENERIC_GETATTR
