"""ReadsCache: results kept by the values their builder read of a job."""

import pytest
from pydantic import BaseModel, ConfigDict

from commtax.spec.reads import ReadsCache


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)
    tp: int = 1
    recompute: str = "none"
    policy: str = "attention_core"
    zero: int = 0

    def half(self) -> int:
        return self.tp // 2


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)
    plan: Plan
    name: str = "gpt"

    @property
    def doubled_tp(self) -> int:
        return 2 * self.plan.tp


def job(**plan) -> Job:
    return Job(plan=Plan(**plan))


def counting(build):
    calls = []

    def counted(j):
        calls.append(j)
        return build(j)

    return counted, calls


def recompute_cost(j) -> tuple:
    """Reads the policy only under selective recompute, as the layer's recompute pass does."""
    p = j.plan
    return (p.tp, p.recompute, p.policy if p.recompute == "selective" else None)


def test_jobs_differing_only_in_fields_not_read_share_one_result():
    cache, (build, calls) = ReadsCache(), counting(recompute_cost)
    first = cache.get("root", job(tp=2, zero=1), build)
    assert cache.get("root", job(tp=2, zero=3), build) is first
    assert cache.get("root", job(tp=2, policy="per_op"), build) is first  # the policy is unread without selective
    assert cache.get("root", job(tp=4), build) == (4, "none", None)
    assert len(calls) == 2 and cache.size == 2


def test_a_field_read_under_some_values_keys_those_results_only():
    cache, (build, calls) = ReadsCache(), counting(recompute_cost)
    a = cache.get("root", job(recompute="selective"), build)
    none = cache.get("root", job(recompute="none"), build)  # reads less: the first walk's node is split
    b = cache.get("root", job(recompute="selective", policy="per_op"), build)
    assert (a, none, b) == ((1, "selective", "attention_core"), (1, "none", None), (1, "selective", "per_op"))
    assert cache.get("root", job(recompute="none", policy="per_op"), build) is none
    assert cache.get("root", job(recompute="selective", zero=2), build) is a
    assert cache.get("root", job(recompute="selective", policy="per_op", zero=2), build) is b
    assert len(calls) == 3


def test_roots_keep_apart_what_the_builder_does_not_trace():
    cache = ReadsCache(untraced=frozenset({"name"}))
    assert cache.get("gpt", job(), lambda j: (j.name, j.plan.tp)) == ("gpt", 1)
    assert cache.get("llama", Job(plan=Plan(), name="llama"), lambda j: (j.name, j.plan.tp)) == ("llama", 1)


def test_properties_are_keyed_by_their_value():
    cache, (build, calls) = ReadsCache(), counting(lambda j: j.doubled_tp)
    assert [cache.get("r", job(tp=t, zero=z), build) for t, z in ((2, 0), (2, 1), (4, 0))] == [4, 4, 8]
    assert len(calls) == 2


def test_a_cache_inside_another_keys_the_outer_result_by_its_reads():
    inner, outer = ReadsCache(), ReadsCache()
    built = []

    def outer_build(j):
        built.append(j)
        return ("layer", inner.get("r", j, recompute_cost))

    first = outer.get("r", job(tp=2), outer_build)
    assert outer.get("r", job(tp=2, zero=2), outer_build) is first
    assert outer.get("r", job(tp=4), outer_build) == ("layer", (4, "none", None))
    assert outer.get("r", job(tp=4, recompute="selective"), outer_build)[1] == (4, "selective", "attention_core")
    assert len(built) == 3 and inner.size == 3


def test_a_method_call_or_a_builder_that_is_no_function_of_its_reads_raises():
    with pytest.raises(TypeError, match="plan.half"):
        ReadsCache().get("r", job(), lambda j: j.plan.half())
    cache, flip = ReadsCache(), iter([True, False])

    def fickle(j):
        return j.plan.tp if next(flip) else j.plan.zero

    cache.get("r", job(tp=2), fickle)
    with pytest.raises(RuntimeError, match="plan.zero"):
        cache.get("r", job(tp=4), fickle)


def test_the_cache_is_emptied_at_its_limit():
    cache = ReadsCache(limit=2)
    for t in (1, 2, 3):
        cache.get("r", job(tp=t), lambda j: j.plan.tp)
    assert cache.size == 1


def test_an_inner_walk_that_misses_keys_the_outer_result_by_the_builds_reads_only():
    """A node made by one walk reads all of that walk's paths at once; a job whose walk turns earlier reads some
    it does not need. Those do not key the outer result: the inner build's own reads do."""
    inner, outer = ReadsCache(), ReadsCache()
    built = []

    def zero_under_tp2(j):
        return (j.plan.tp, j.plan.zero) if j.plan.tp == 2 else (j.plan.tp,)

    def outer_build(j):
        built.append(j)
        return inner.get("r", j, zero_under_tp2)

    outer.get("r", job(tp=2), outer_build)
    four = outer.get("r", job(tp=4), outer_build)  # the inner node reads (tp, zero): split where this walk ends
    assert outer.get("r", job(tp=4, zero=1), outer_build) is four
    assert len(built) == 2 and outer.get("r", job(tp=2, zero=1), outer_build) == (2, 1)
