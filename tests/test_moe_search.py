"""search over the MoE plan fields (ep, etp, moe_dispatcher, moe_a2a_overlap)."""

import pytest

from commtax.decide.search import Space, search_moe
from commtax.errors import SpecError
from commtax.spec import load_job

JOB = {
    "model": "mixtral-8x7b",
    "cluster": {"gpu": "h100-sxm5-80gb", "num_gpus": 32, "intra_node": "nvlink4", "inter_node": "ib-ndr"},
    "plan": {"framework": "megatron-core", "ep": 8, "pp": 2},
    "training": {"seq_len": 4096, "global_batch": 64},
}
SMALL_FIELDS = {"tp": "1", "cp": "1", "vp": "1", "micro_batch": "1", "zero": "1", "recompute": "full"}
SMALL = Space.parse(SMALL_FIELDS)


def test_search_spans_ep_and_dispatcher_and_names_refusals():
    res = search_moe(load_job(JOB), {"ep": "2,8,16", "moe_dispatcher": "alltoall,deepep"}, SMALL, top=1)
    tried = [c for c in res.moe_choices if c.best_step_s is not None]
    refused = [c for c in res.moe_choices if c.refused is not None]
    assert len(tried) == 4 and len(refused) == 2  # ep 16 > 8 experts: Megatron's divisibility rule, named
    assert all("num_experts % expert_model_parallel_size" in c.refused for c in refused)
    assert {c.fields.ep for c in refused} == {16}
    best_plan, best = res.top[0]
    assert best.step_time_s == pytest.approx(min(c.best_step_s for c in tried))
    assert best_plan.ep in (2, 8) and best_plan.moe_dispatcher in ("alltoall", "deepep")
    # JSON: each choice its fields, then its best step or its refusal (docs/moe.md)
    written = res.to_dict()["moe_choices"]
    assert list(written[0]) == ["ep", "etp", "moe_dispatcher", "moe_a2a_overlap", "best_step_s"]
    assert list(written[-1]) == ["ep", "etp", "moe_dispatcher", "moe_a2a_overlap", "refused"]


def test_search_moe_with_nothing_valid_says_why():
    with pytest.raises(SpecError, match="no MoE combination is valid"):
        search_moe(load_job(JOB), {"ep": "3"}, SMALL)


def test_advise_names_the_all_to_all_and_what_cuts_it():
    from pathlib import Path

    from commtax.decide.advise import advise
    from commtax.spec import job_with

    example = Path(__file__).resolve().parents[1] / "examples" / "moe" / "deepseek-v3-h800.yaml"
    job = job_with(load_job(example), moe_dispatcher="alltoall", schedule="1f1b")
    a = advise(job, search_best=False)
    assert a.dominant_comm == "ep_exposed"
    by_label = {c.label.split(":")[0]: c for c in a.changes}
    for remedy in ("dispatcher alltoall→deepep", "EP inside the NVLink domain", "fewer experts per GPU"):
        assert remedy in by_label, sorted(by_label)
    # each re-estimated: DeepEP's node deduplication and EP inside the node both cut the exposed all-to-all
    assert by_label["dispatcher alltoall→deepep"].step_after_s < by_label["dispatcher alltoall→deepep"].step_before_s
    inside = by_label["EP inside the NVLink domain"]
    assert inside.step_after_s < inside.step_before_s


def test_collective_all_to_all_shows_deepep():
    import json

    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    runner = CliRunner()
    args = ["collective", "all_to_all", "--gpus", "64", "--bytes", "256MiB", "--json"]
    nccl = json.loads(runner.invoke(app, args).output)
    dep = json.loads(runner.invoke(app, [*args, "--deepep", "dispatch", "--dedup", "0.5"]).output)
    assert nccl["algorithm"] == "pairwise" and dep["algorithm"] == "deepep_dispatch"
    assert dep["time_s"] < nccl["time_s"]  # half the inter-node bytes
    bad = runner.invoke(app, ["collective", "all_reduce", "--deepep", "dispatch"])
    assert bad.exit_code == 2 and "DeepEP kernels are all_to_all" in bad.output


# ----------------------------------------------------------------------------- MoE fields as layout axes of the grid
def test_moe_fields_are_grid_axes_and_agree_with_estimate():
    from commtax.decide.search import agreement, job_for, search
    from commtax.decide.space import MOE_COLUMNS
    from commtax.schedule.analytical import estimate

    space = Space.parse({**SMALL_FIELDS, "ep": "2,4,8", "moe_dispatcher": "alltoall,deepep"})
    job = load_job(JOB)
    res = search(job, space, top=3, workers=1)
    assert res.plans.shape[1] == len(MOE_COLUMNS)
    tried = {(res.row(int(i)).ep, res.row(int(i)).moe_dispatcher) for i in res.order}
    assert tried == {(e, d) for e in (2, 4, 8) for d in ("alltoall", "deepep")}
    a = agreement(job, res, sample=20, seed=5)
    assert a["step_rel"] <= 1e-9 and a["mem_rel"] <= 1e-9 and a["fits_mismatch"] == 0
    head = res.to_csv().splitlines()[0].split(",")
    assert head[: len(MOE_COLUMNS)] == list(MOE_COLUMNS) and head[len(MOE_COLUMNS)] == "step_time_s"
    assert MOE_COLUMNS[-4:] == ("ep", "etp", "moe_dispatcher", "moe_a2a_overlap")
    assert "ep_exposed_s" in head and head.index("ep_exposed_s") == head.index("cp_exposed_s") + 1
    best_plan, best = res.top[0]
    assert {"ep", "etp", "moe_dispatcher", "moe_a2a_overlap"} <= set(best_plan.columns)
    # every part of the grid is estimate's, the exposed all-to-all apart from TP (as the Breakdown reports it)
    from commtax.decide.search import MOE_PART_KEYS

    for i in res.order[:3]:
        b = estimate(job_for(job, res.row(int(i))))
        for key, value in zip(MOE_PART_KEYS, res.parts_s[i]):
            assert value == pytest.approx(b.breakdown_s[key], rel=1e-9, abs=1e-12), key
    assert res.parts_s[res.order[0], MOE_PART_KEYS.index("ep_exposed")] > 0


def test_ep_range_spans_the_divisors_of_the_experts():
    from commtax.decide.space import bases

    b, _, _ = bases(load_job(JOB), Space.parse({**SMALL_FIELDS, "ep": "2..8"}))
    assert sorted({x.fields["ep"] for x in b}) == [2, 4, 8]  # mixtral: 8 experts


def test_a_dense_job_refuses_moe_fields():
    from commtax.decide.search import search

    dense = load_job({**JOB, "model": "llama2-7b", "plan": {"framework": "megatron-core", "pp": 2}})
    with pytest.raises(SpecError, match=r"--ep: the model has no experts"):
        search(dense, Space.parse({"ep": "2"}))


def test_overlap_refuses_full_recompute_by_name_and_keeps_the_rest():
    # Megatron: --overlap-moe-expert-parallel-comm does not run with full recompute; the job file says full
    from commtax.decide.search import COLUMNS, agreement, search

    job = load_job({**JOB, "plan": {**JOB["plan"], "recompute": "full", "pp": 1}})
    fields = {**SMALL_FIELDS, "pp": "1", "recompute": "none,selective,full", "moe_a2a_overlap": "true,false"}
    res = search(job, Space.parse(fields), top=2, workers=1)
    col = res.plans[:, len(COLUMNS) + 3]  # moe_a2a_overlap
    rc = res.plans[:, COLUMNS.index("recompute")]
    full = 2  # index of "full" in the recompute Literal
    assert not res.valid[(col == 1) & (rc == full)].any()
    assert res.valid[(col == 1) & (rc != full)].all() and res.valid[(col == 0)].all()
    assert any("does not run with recompute: full" in k for k in res.invalid_reasons)
    assert agreement(job, res, sample=12, seed=2)["step_rel"] <= 1e-9


def test_moe_blocks_are_priced_once_per_moe_configuration_not_per_layout():
    # bases of pp 1, 2, 4 with the same TP/CP placement and MoE fields share one set of layer-block templates
    from commtax.decide.search import _eval_base
    from commtax.decide.space import bases

    job = load_job(JOB)
    space = Space.parse({**SMALL_FIELDS, "pp": "1,2,4", "ep": "2,8", "micro_batch": "1,2"})
    cache: dict = {}
    todo = bases(job, space)[0]
    for b in todo:
        _eval_base(job, b, cache)
    assert len({b.pp for b in todo}) == 3
    assert len(cache) == 2  # one per ep (tp, cp, etp, dispatcher and overlap fixed)
    assert all(len(shared.workloads) == 2 for shared in cache.values())  # (mb 1, 2) × sp × recompute


def test_pool_search_names_a_plan_flag_it_does_not_read():
    # a cluster of GPU pools runs the pool search, which spans its own space: --ep (or --tp) is refused by name
    from pathlib import Path

    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    pools = Path(__file__).resolve().parents[1] / "examples" / "pools" / "llama2-70b-a100-4090.yaml"
    for flag in ("--ep", "--tp"):
        r = CliRunner().invoke(app, ["search", str(pools), flag, "2"])
        assert r.exit_code == 2 and f"error: {flag}: a cluster of GPU pools" in r.output, r.output


def test_cli_search_with_ep_on_a_dense_model_names_the_flag():
    from pathlib import Path

    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    dense = Path(__file__).resolve().parents[1] / "examples" / "llama2-70b-h100.yaml"
    r = CliRunner().invoke(app, ["search", str(dense), "--ep", "2"])
    assert r.exit_code == 2 and r.output.startswith("error: --ep: the model has no experts"), r.output
