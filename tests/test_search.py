"""Plan search: the optimum of small spaces against brute force through ``estimate``, the memory filter
against ``estimate``'s ``fits``, agreement of every number, constraints, and clear errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from commtax.decide.plans import PlanRow
from commtax.decide.search import (
    COLUMNS,
    Space,
    agreement,
    brute_force,
    job_for,
    parse_constraint,
    search,
)
from commtax.errors import SpecError
from commtax.schedule.analytical import estimate
from commtax.spec import load_job
from commtax.units import GiB


def small_job(num_gpus: int = 16, global_batch: int = 64, gpu: str = "h100-sxm5-80gb", **plan) -> dict:
    return {
        "model": "llama2-7b",
        "cluster": {
            "gpu": gpu,
            "num_gpus": num_gpus,
            "gpus_per_node": 8,
            "intra_node": "nvlink4",
            "inter_node": "ib-ndr",
            "nics_per_node": 8,
        },
        "plan": {"tp": 2, "pp": 2, "micro_batch": 1, **plan},
        "training": {"seq_len": 2048, "global_batch": global_batch, "precision": "bf16"},
    }


SMALL_SPACE = Space.parse({"cp": "1,2", "vp": "1..2", "micro_batch": "1..4"})


@pytest.fixture(scope="module")
def small():
    job = load_job(small_job())
    return job, search(job, SMALL_SPACE, top=3, workers=1), brute_force(job, SMALL_SPACE)


def test_search_finds_the_brute_force_optimum(small):
    job, res, brute = small
    fitting = [(p, b) for p, b in brute if b.fits]
    best_step = min(b.step_time_s for _, b in fitting)
    plan, b = res.top[0]
    assert b.step_time_s == pytest.approx(best_step, rel=1e-12)
    assert b.fits
    # the returned breakdown is estimate's own, for the returned plan
    assert estimate(job_for(job, plan)).step_time_s == b.step_time_s


def test_every_plan_agrees_with_estimate(small):
    """Same set of valid plans as brute force; every step, memory and fits equal to estimate (1e-9)."""
    job, res, brute = small
    assert int(res.valid.sum()) == len(brute)
    by_plan = dict(brute)  # typed plans, hashable: the search's rows and brute force's are the same form
    assert len(by_plan) == len(brute)
    for i in np.flatnonzero(res.valid):
        b = by_plan[res.row(int(i))]
        assert res.step_s[i] == pytest.approx(b.step_time_s, rel=1e-9)
        assert res.mem_bytes[i] == pytest.approx(b.memory_gib_per_gpu["total"] * GiB, rel=1e-9)
        assert bool(res.fits[i]) == b.fits
        assert res.parts_s[i].sum() == pytest.approx(b.step_time_s, rel=1e-9)


def test_the_search_hands_out_one_typed_plan_form_that_round_trips_through_the_spec(small):
    """Its top plans and its table's rows are PlanRows with the table's columns; the job with a row's plan
    (``job_for``) reads back as that row; the JSON writes each row's columns, in order, as they are."""
    job, res, _ = small
    assert res.top and all(isinstance(p, PlanRow) and p.columns == COLUMNS for p, _ in res.top)
    for i in res.order[:10]:
        row = res.row(int(i))
        assert PlanRow.of(job_for(job, row), COLUMNS) == row
    assert [e["plan"] for e in res.to_dict()["top"]] == [p.to_dict() for p, _ in res.top]
    assert res.top[0][0] == res.row(int(res.order[0])) and res.best() == res.top[0]


def test_memory_filter_counts_match_estimate(small):
    _, res, brute = small
    assert int(res.fits.sum()) == sum(b.fits for _, b in brute)
    assert int((res.valid & ~res.fits).sum()) == sum(not b.fits for _, b in brute)
    assert sum(res.nofit_reasons.values()) == int((res.valid & ~res.fits).sum())


def test_ranking_is_by_step_then_memory(small):
    _, res, _ = small
    steps = res.step_s[res.order]
    assert np.all(np.diff(steps) >= 0)
    assert len(res.order) == int(res.fits.sum())


def test_sampled_agreement_on_a_large_space():
    """LLaMA-2 70B on 256 H100 (the seed article's job), tp fixed: a random sample checked against estimate."""
    job = load_job(
        small_job()
        | {
            "model": "llama2-70b",
            "cluster": {**small_job()["cluster"], "num_gpus": 256},
            "training": {"seq_len": 4096, "global_batch": 1024},
        }
    )
    res = search(job, Space.parse({"tp": "8", "cp": "1,2"}), top=3, workers=1)
    a = agreement(job, res, sample=40, seed=1)
    assert a["sample"] == 40
    assert a["step_rel"] <= 1e-9 and a["mem_rel"] <= 1e-9 and a["fits_mismatch"] == 0
    assert res.max_rel_diff <= 1e-9


def test_two_workers_give_the_same_ranking():
    job = load_job(small_job(num_gpus=32, global_batch=128))
    space = Space.parse({"cp": "1", "micro_batch": "1..2", "vp": "1..2"})
    one = search(job, space, top=3, workers=1)
    two = search(job, space, top=3, workers=2)
    assert [p for p, _ in one.top] == [p for p, _ in two.top]
    assert one.evaluated == two.evaluated
    # every output in the bases' order, whichever worker ends first: the CSV rows and the refusals' examples
    assert two.to_csv() == one.to_csv()
    assert two.invalid_examples == one.invalid_examples and list(two.order) == list(one.order)


def test_three_workers_give_what_one_gives():
    """--workers 3: the search process and two forked workers share the placements; every output as one process's."""
    job = load_job(small_job(num_gpus=32, global_batch=128))
    space = Space.parse({"cp": "1,2", "micro_batch": "1..2", "vp": "1..2"})
    one = search(job, space, top=3, workers=1)
    three = search(job, space, top=3, workers=3)
    assert three.to_csv() == one.to_csv() and list(three.order) == list(one.order)
    assert three.invalid_reasons == one.invalid_reasons and three.invalid_examples == one.invalid_examples
    assert [p for p, _ in three.top] == [p for p, _ in one.top]


def test_n_workers_fork_n_minus_one_processes(monkeypatch):
    """The search process evaluates a share itself: --workers 2 forks one worker, 3 two."""
    import multiprocessing.context as mpc

    started = []
    start = mpc.ForkProcess.start
    monkeypatch.setattr(mpc.ForkProcess, "start", lambda self: (started.append(self), start(self))[1])
    job = load_job(small_job(num_gpus=32, global_batch=128))
    space = Space.parse({"cp": "1,2", "micro_batch": "1"})
    for workers, forked in ((2, 1), (3, 2)):
        started.clear()
        search(job, space, top=1, workers=workers)
        assert len(started) == forked


def test_default_workers_follow_the_work(monkeypatch):
    """No --workers: a search whose one-process work is estimated under ``WORKER_S`` forks nothing (32 bases: the old
    default forked for 16 or more), a larger one a process per ``WORKER_S`` up to the CPUs it may use; --workers N is
    obeyed whatever the estimate. The example jobs: GPT-3 175B on 4,096 H100 (143,880 plans, ~1.5 CPU-s) in one
    process, DeepSeek-V3 on 2,048 H800 (46,188 MoE plans, ~2.5 CPU-s) in two on two CPUs."""
    import multiprocessing.context as mpc
    from pathlib import Path

    import commtax.decide.search as S

    started = []
    start = mpc.ForkProcess.start
    monkeypatch.setattr(mpc.ForkProcess, "start", lambda self: (started.append(self), start(self))[1])
    monkeypatch.setattr(S, "available_cpus", lambda: 2)
    job = load_job(small_job(num_gpus=32, global_batch=128))
    space = Space.parse({"cp": "1,2", "micro_batch": "1..2"})
    assert len(S.bases(job, space)[0]) >= 16
    one = search(job, space, top=1)
    assert started == []
    assert search(job, space, top=1, workers=2).to_csv() == one.to_csv() and len(started) == 1
    monkeypatch.setattr(S, "WORKER_S", S.serial_estimate(job, S.bases(job, space)[0]) / 2)  # as if it were larger
    started.clear()
    assert search(job, space, top=1).to_csv() == one.to_csv() and len(started) == 1
    monkeypatch.undo()
    repo = Path(__file__).resolve().parents[1]
    for name, cpus, workers in (("compare/gpt3-175b-4096-h100", 2, 1), ("moe/deepseek-v3-h800", 2, 2)):
        example = load_job(repo / "examples" / f"{name}.yaml")
        monkeypatch.setattr(S, "available_cpus", lambda cpus=cpus: cpus)
        assert S.default_workers(example, S.bases(example, Space())[0]) == workers, name
    monkeypatch.setattr(S, "available_cpus", lambda: 1)
    assert S.default_workers(example, S.bases(example, Space())[0]) == 1


def test_by_placement_keeps_a_placement_in_one_share_and_every_base_once():
    from commtax.decide.search import _by_placement, bases

    job = load_job(small_job(num_gpus=32, global_batch=128))
    todo = bases(job, Space.parse({"micro_batch": "1..2"}))[0]
    shares = _by_placement(list(enumerate(todo)), 2)
    placed = [(tuple(sorted({(b.tp, b.cp) for _, b in group})), w) for w, share in enumerate(shares) for group in share]
    assert all(len(key) == 1 for key, _ in placed)  # a placement's bases together
    assert len({key for key, _ in placed}) == len(placed)  # each placement in one share only
    assert sorted(i for share in shares for group in share for i, _ in group) == list(range(len(todo)))
    assert all(share for share in shares)  # both processes have work


def test_results_cross_the_pipe_as_they_were():
    """A worker's results (``_send_results``): a pickled header, then each array's bytes read into an array of its
    dtype and shape (``_recv_results``), empty arrays included."""
    import multiprocessing as mp
    from collections import Counter

    from commtax.decide.search import _BaseResult, _recv_results, _send_results

    rng = np.random.default_rng(0)
    sent = [
        (
            3,
            _BaseResult(
                plans=rng.integers(0, 9, (5, 10)),
                step=rng.random(5),
                parts=rng.random((5, 8)),
                exposed=rng.random(5),
                mem=rng.random(5) * GiB,
                valid=rng.random(5) > 0.5,
                invalid_reasons=Counter(a=2),
                nofit_reasons=Counter(),
                examples={"a": "tp(3) must divide heads(32)"},
            ),
        ),
        (
            0,
            _BaseResult(
                plans=np.zeros((0, 10), np.int64),
                step=np.zeros(0),
                parts=np.zeros((0, 8)),
                exposed=np.zeros(0),
                mem=np.zeros(0),
                valid=np.zeros(0, bool),
                invalid_reasons=Counter(),
                nofit_reasons=Counter(b=1),
            ),
        ),
    ]
    reader, writer = mp.Pipe(duplex=False)
    try:
        _send_results(writer, sent)  # small enough for the pipe's buffer: no reader needed meanwhile
        kind, head = reader.recv()
        got = _recv_results(reader, head)
    finally:
        reader.close()
        writer.close()
    assert kind == "results" and [i for i, _ in got] == [3, 0]
    for (_, a), (_, b) in zip(sent, got):
        for k in ("plans", "step", "parts", "exposed", "mem", "valid"):
            x, y = getattr(a, k), getattr(b, k)
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), k
        assert (b.invalid_reasons, b.nofit_reasons, b.examples) == (a.invalid_reasons, a.nofit_reasons, a.examples)


def test_fixed_fields_and_ranges_restrict_the_space():
    job = load_job(small_job())
    res = search(job, Space.parse({"tp": "2", "zero": "1..2", "micro_batch": "1"}, fix=["recompute"]), workers=1)
    plans = [res.row(int(i)) for i in np.flatnonzero(res.valid)]
    assert {p.tp for p in plans} == {2}
    assert {p.zero for p in plans} == {1, 2}
    assert {p.micro_batch for p in plans} == {1}
    assert {p.recompute for p in plans} == {job.plan.recompute}  # --fix pins the job file's value


def test_grad_dtype_is_the_jobs_unless_asked():
    job = load_job(small_job(grad_comm_dtype="bf16"))
    res = search(job, Space.parse({"tp": "2", "pp": "2", "cp": "1", "micro_batch": "1"}), workers=1)
    assert {res.row(int(i)).grad_comm_dtype for i in range(res.evaluated)} == {"bf16"}
    res = search(
        job,
        Space.parse({"tp": "2", "pp": "2", "cp": "1", "micro_batch": "1", "grad_comm_dtype": "bf16,fp8"}),
        workers=1,
    )
    assert {res.row(int(i)).grad_comm_dtype for i in range(res.evaluated)} == {"bf16", "fp8"}


def test_search_refuses_zero_stages_the_framework_cannot_run():
    # Megatron-Core's DistributedOptimizer is ZeRO-1: ZeRO-2/3 plans are invalid, each counted under one reason
    job = load_job(small_job(framework="megatron-core"))
    space = Space.parse({"tp": "2", "pp": "2", "cp": "1", "vp": "1", "micro_batch": "1,2"})
    res = search(job, space, workers=1)
    zeros = res.plans[:, COLUMNS.index("zero")]
    assert not res.valid[zeros >= 2].any() and res.valid[zeros <= 1].all()
    counted = [n for why, n in res.invalid_reasons.items() if "is not a stage megatron-core runs" in why]
    assert counted == [int((zeros >= 2).sum())]
    assert int((zeros >= 2).sum()) == 2 * 2 * 3 * 2  # zero 2,3 x micro-batch 1,2 x recompute x sequence_parallel


def test_a_zero_stage_the_user_names_is_searched_as_asked():
    # estimate prices a plan that states zero 3 under megatron-core (with a note); --fix zero / --zero 3 must not
    # then find "no valid plan": the stage the user named is searched, the ones the defaults add are still refused
    d = small_job(framework="megatron-core")
    d["plan"]["zero"] = 3
    job = load_job(d)
    base = {"tp": "2", "pp": "2", "cp": "1", "vp": "1", "micro_batch": "1"}
    fixed = search(job, Space.parse(base, fix=("zero",)), workers=1)
    assert fixed.valid.any() and set(fixed.plans[:, COLUMNS.index("zero")]) == {3}
    listed = search(job, Space.parse({**base, "zero": "2,3"}), workers=1)
    assert listed.valid[listed.plans[:, COLUMNS.index("zero")] == 3].all()
    assert listed.valid[listed.plans[:, COLUMNS.index("zero")] == 2].all()
    default = search(job, Space.parse(base), workers=1)
    assert not default.valid[default.plans[:, COLUMNS.index("zero")] >= 2].any()


def test_constraint_parsing():
    assert parse_constraint("tp", "1,2,4").values == (1, 2, 4)
    c = parse_constraint("pp", "2..8")
    assert (c.lo, c.hi) == (2, 8) and c.filter([1, 2, 4, 8, 16]) == [2, 4, 8]
    assert parse_constraint("sequence_parallel", "true").values == (True,)
    assert parse_constraint("zero", "0").values == (0,)
    for field, bad in (
        ("tp", "x"),
        ("tp", "0"),
        ("recompute", "some"),
        ("pp", "8..2"),
        ("grad_comm_dtype", "fp4"),
        ("recompute", "none..full"),
    ):
        with pytest.raises(SpecError):
            parse_constraint(field, bad)
    with pytest.raises(SpecError, match="cannot constrain"):
        parse_constraint("schedule", "1f1b")


def test_fixed_dimension_that_empties_the_space_says_why():
    job = load_job(small_job())
    with pytest.raises(SpecError, match=r"search space is empty.*tp\(3\)"):
        search(job, Space.parse({"tp": "3"}), workers=1)
    # interleaving with 64 / (dp 2 × 16) = 2 micro-batches on 4 stages: Megatron's interleaved schedule refuses it
    with pytest.raises(SpecError, match=r"search space is empty.*= 2, to be a multiple of pp\(4\)"):
        search(job, Space.parse({"tp": "2", "pp": "4", "cp": "1", "vp": "2", "micro_batch": "16"}), workers=1)


def test_nothing_fits_memory_says_how_much_is_needed():
    job = load_job(small_job(num_gpus=8, global_batch=8) | {"model": "llama2-70b"})
    with pytest.raises(
        SpecError, match=r"no plan fits memory: each of the 1 valid plans .*the smallest needs [\d.]+ GiB"
    ):
        search(job, Space.parse({"tp": "1", "pp": "1", "cp": "1", "zero": "0", "recompute": "none"}), workers=1)


def test_interrupt_keeps_the_best_found_so_far():
    job = load_job(small_job())
    calls = []

    def progress(done, total):
        calls.append(done)
        if done >= 3:
            raise KeyboardInterrupt

    res = search(job, Space.parse({"micro_batch": "1..2"}), workers=1, progress=progress)
    full = search(job, Space.parse({"micro_batch": "1..2"}), workers=1)
    assert res.interrupted and not full.interrupted
    assert 0 < res.evaluated < full.evaluated
    assert res.top and res.top[0][1].step_time_s >= full.top[0][1].step_time_s


# ----------------------------------------------------------------------------- CLI
def _app():
    from commtax.cli.main import app, register_commands

    register_commands()
    return app


def test_cli_search_json(tmp_path):
    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(small_job()))
    out = tmp_path / "res.json"
    csv = tmp_path / "plans.csv"
    r = CliRunner().invoke(
        _app(),
        [
            "search",
            str(f),
            "--cp",
            "1",
            "--micro-batch",
            "1..2",
            "--top",
            "2",
            "--json",
            "--workers",
            "1",
            "--out",
            str(out),
            "--csv",
            str(csv),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data == json.loads(out.read_text())
    assert len(data["top"]) == 2
    best = data["top"][0]
    assert best["breakdown"]["step_time_s"] <= data["top"][1]["breakdown"]["step_time_s"]
    job = load_job(small_job())
    assert estimate(job_for(job, PlanRow.from_dict(best["plan"]))).step_time_s == pytest.approx(
        best["breakdown"]["step_time_s"], rel=1e-12
    )
    # $ per B tokens = owned $/s × 1e9 / tokens/s (cost.py); tokens per dollar is its inverse × 1e9
    assert best["usd_per_B_tokens"] * best["tokens_per_dollar"] == pytest.approx(1e9, rel=1e-12)
    assert data["evaluated"] == data["valid"] + data["invalid"]
    import csv as csvlib

    rows = list(csvlib.DictReader(csv.open()))
    assert len(rows) == data["valid"]
    assert sum(r["fits"] == "True" for r in rows) == data["fit"]
    fastest = min(float(r["step_time_s"]) for r in rows if r["fits"] == "True")
    assert fastest == pytest.approx(best["breakdown"]["step_time_s"], rel=1e-9)
    assert math.isfinite(data["plans_per_s"])


def test_cli_search_bad_input_is_one_line_exit_2(tmp_path):
    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(small_job()))
    r = CliRunner().invoke(_app(), ["search", str(f), "--tp", "3"])
    assert r.exit_code == 2
    assert r.output.startswith("error: search space is empty") and "Traceback" not in r.output
    r = CliRunner().invoke(_app(), ["search", str(f), "--zero", "five"])
    assert r.exit_code == 2 and "--zero: expected one of 0, 1, 2, 3, got 'five'" in r.output
    r = CliRunner().invoke(_app(), ["search", str(f), "--vp", "0"])
    assert r.exit_code == 2 and "--vp: input should be greater than 0, got '0'" in r.output
    r = CliRunner().invoke(_app(), ["search", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "file not found" in r.output


def test_a_model_change_the_search_does_not_track_is_reported(monkeypatch):
    """If a part of the model starts to depend on a field the search groups over, the re-estimated top
    plans disagree with the assembled numbers: the search says so and ranks the top plans by estimate."""
    import commtax.decide.search as s

    real = s._est.pp_exposed
    # pipeline sends that (wrongly) depend on the ZeRO stage: the search prices them once per (vp, mb)
    monkeypatch.setattr(
        s._est,
        "pp_exposed",
        lambda job, wl, costs, stages, **kw: tuple(x * (1 + job.plan.zero) for x in real(job, wl, costs, stages, **kw)),
    )
    job = load_job(small_job(zero=1))
    res = search(job, Space.parse({"pp": "2", "cp": "1", "micro_batch": "1", "zero": "2,3"}), top=3, workers=1)
    assert res.max_rel_diff > 1e-9
    assert res.warnings and "differs from estimate" in res.warnings[0]
    steps = [b.step_time_s for _, b in res.top]
    assert steps == sorted(steps)


def test_verify_ranks_the_top_plans_by_the_simulated_step():
    from commtax.schedule.sim import simulate

    job = load_job(small_job())
    space = Space.parse({"tp": "2,4", "pp": "2", "cp": "1", "micro_batch": "1,2", "zero": "1"})
    res = search(job, space, top=2, workers=1, verify=3)
    assert len(res.verified) == 3
    sims = [v.simulate.step_time_s for v in res.verified]
    assert sims == sorted(sims)
    for v in res.verified:  # both times are the model's own: estimate and the event simulator on that plan
        j = job_for(job, v.plan)
        assert v.estimate.step_time_s == estimate(j).step_time_s
        assert v.simulate.step_time_s == simulate(j, compare=False).breakdown.step_time_s
    assert [p for p, _ in res.top[:3]] == [v.plan for v in res.verified]  # the best plan is the best simulated
    written = res.to_dict()["verified"]
    assert [w["plan"] for w in written] == [v.plan.to_dict() for v in res.verified]
    assert [w["simulate_step_s"] for w in written] == sims


def test_cli_search_verify_shows_both_times(tmp_path):
    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(small_job()))
    r = CliRunner().invoke(
        _app(),
        ["search", str(f), "--tp", "2", "--pp", "2", "--cp", "1", "--micro-batch", "1", "--verify", "2"],
        env={"COLUMNS": "160"},
    )
    assert r.exit_code == 0, r.output
    assert "simulated (ranked by the simulated step)" in r.output
    assert "estimate s" in r.output and "simulate s" in r.output


def test_the_search_s_stage_keys_are_each_plan_s_own():
    """The search computes a stage's cache key once per template (base key) and per split (layer counts) and hands
    them to ``prefill_stage_times``: each must be the key ``stage_key`` gives that plan's job and workload, over
    pp, vp, micro-batch, sp and recompute (an uneven split on 4 stages among them)."""
    from commtax.decide.search import _prepare
    from commtax.decide.space import bases
    from commtax.schedule.analytical import stage_key

    job = load_job(small_job(num_gpus=32, global_batch=128))
    space = Space.parse({"pp": "1,2,4", "vp": "1..3", "micro_batch": "1,2", "recompute": "none,selective,full"})
    cache: dict = {}
    checked = 0
    for b in bases(job, space)[0]:
        prep = _prepare(job, b, cache)
        if prep.g is None:
            continue
        assert set(prep.g.stage_keys) == set(prep.g.stage_plans)  # a dense model: every stage plan has its key
        for key, (plan_job, wl, _) in prep.g.stage_plans.items():
            assert prep.g.stage_keys[key] == stage_key(plan_job, wl), key
            checked += 1
    assert checked > 50


def test_the_python_example_of_docs_search_runs_on_the_typed_plans(monkeypatch):
    """docs/search.md shows the result from Python: its block runs, and what it binds is the one typed form."""
    import re
    from pathlib import Path

    from commtax.decide.plans import PlanRow as Row

    repo = Path(__file__).resolve().parents[1]
    text = (repo / "docs" / "search.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    monkeypatch.chdir(repo)
    scope: dict = {}
    exec(compile(block, "docs/search.md", "exec"), scope)  # noqa: S102 - the project's own documentation
    assert isinstance(scope["best"], Row) and scope["again"].plan.tp == scope["best"].tp
    assert list(scope["res"].to_dict()["top"][0]["plan"]) == list(scope["best"].columns)


def test_a_second_search_in_one_process_gives_what_the_first_gave_and_leaves_no_cyclic_garbage():
    """A search reuses the blocks and prices an earlier one kept: the same table again. It makes no reference
    cycles, so that ``commtax search`` may freeze what it leaves for the cyclic GC (``cli.planning``), and a
    long-running caller (advise, compare, tests) collects nothing after it."""
    import gc

    job = load_job(small_job())
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        first = search(job, SMALL_SPACE, top=3, workers=1)
        garbage = gc.collect()
        second = search(job, SMALL_SPACE, top=3, workers=1)
        garbage += gc.collect()
    finally:
        if enabled:
            gc.enable()
    assert garbage == 0
    for f in ("plans", "step_s", "parts_s", "exposed_s", "mem_bytes", "valid", "fits", "order"):
        np.testing.assert_array_equal(getattr(first, f), getattr(second, f), err_msg=f)
    assert [b.step_time_s for _, b in first.top] == [b.step_time_s for _, b in second.top]
