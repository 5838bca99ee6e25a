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
