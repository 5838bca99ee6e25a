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
SMALL = Space.parse({"tp": "1", "cp": "1", "vp": "1", "micro_batch": "1", "zero": "1", "recompute": "full"})


def test_search_spans_ep_and_dispatcher_and_names_refusals():
    res = search_moe(load_job(JOB), {"ep": "2,8,16", "moe_dispatcher": "alltoall,deepep"}, SMALL, top=1)
    tried = [c for c in res.moe_choices if "best_step_s" in c]
    refused = [c for c in res.moe_choices if "refused" in c]
    assert len(tried) == 4 and len(refused) == 2  # ep 16 > 8 experts: Megatron's divisibility rule, named
    assert all("num_experts % expert_model_parallel_size" in c["refused"] for c in refused)
    best_plan, best = res.top[0]
    assert best.step_time_s == pytest.approx(min(c["best_step_s"] for c in tried))
    assert best_plan["ep"] in (2, 8) and best_plan["moe_dispatcher"] in ("alltoall", "deepep")


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
