"""Search, cost, compare and advice on clusters of GPU pools (decide/pool_search.py, decide/cost.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO
from test_pools import FAST, SLOW, job, pool
from typer.testing import CliRunner

from commtax.cli.main import app, register_commands
from commtax.decide.cost import cluster_cost, job_cluster_cost, load_prices
from commtax.decide.pool_search import pool_advice, pool_search, proportional_split
from commtax.spec import load_job

register_commands()
runner = CliRunner()


def test_proportional_split_hand_worked():
    # one stage per pool, speeds 2:1 over 12 layers: 8 and 4
    assert proportional_split(12, [1, 1], [2.0, 1.0]) == [8, 4]
    # 2 + 2 stages, 2:1 over 32 layers: 32·2/6 = 10.67 → 11, 11; 5.33 → 5, 5 (largest remainder)
    assert proportional_split(32, [2, 2], [2.0, 1.0]) == [11, 11, 5, 5]
    assert sum(proportional_split(80, [4, 4], [1.0, 1.0])) == 80


def test_pool_search_puts_more_layers_on_the_fast_pool_and_counts_refusals():
    j = load_job(job([pool("a", FAST), pool("b", dict(SLOW, mem_GiB=6))], stage_pools=["a", "b"]))
    res = pool_search(j, top=3)
    plan, b = res.top[0]
    assert b.fits and res.fit <= res.evaluated
    if plan.stage_pools:
        fast = [n for w, n in zip(plan.stage_pools, plan.stage_layers) if w == "a"]
        slow = [n for w, n in zip(plan.stage_pools, plan.stage_layers) if w == "b"]
        assert min(fast) >= max(slow)
    else:
        assert plan.pool_batch_share is None or plan.pool_batch_share[0] > plan.pool_batch_share[1]
    assert any(k.startswith("memory: pool b") for k in res.refusals)  # 6 GiB cannot hold what 80 GiB holds


def test_pools_are_priced_per_pool():
    prices = load_prices()
    j = load_job(REPO / "examples" / "pools" / "llama2-70b-a100-4090.yaml")
    got = job_cluster_cost(j, prices)
    a = cluster_cost("a100-sxm4-80gb", 128, 8, prices)
    r = cluster_cost("rtx-4090-24gb", 128, 8, prices)
    assert got.gpus == 256 and got.nodes == a.nodes + r.nodes
    assert got.capex_usd == pytest.approx(a.capex_usd + r.capex_usd)
    assert got.rented_usd_per_s == pytest.approx(a.rented_usd_per_s + r.rented_usd_per_s)


def test_advice_names_the_straggler_and_what_rebalancing_buys():
    j = load_job(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"]))  # even split: b straggles
    a = pool_advice(j)
    assert a.straggler == "b"
    assert a.rebalanced is not None and a.rebalanced_step_s < a.step_s and a.gain > 0
    assert a.rebalanced.stage_layers[0] > a.rebalanced.stage_layers[1]
    assert "straggler: pool b" in a.line()


def test_cli_search_and_advise_on_pools(tmp_path):
    p = tmp_path / "pools.yaml"
    p.write_text(yaml.safe_dump(job([pool("a", FAST), pool("b", SLOW)], stage_pools=["a", "b"])))
    r = runner.invoke(app, ["search", str(p), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["top"][0]["usd_per_B_tokens"] is None  # inline GPUs have no price: no $ column, not an error
    assert d["top"][0]["pools"] and d["evaluated"] >= d["fit"] > 0
    r = runner.invoke(app, ["search", str(REPO / "examples" / "pools" / "llama2-70b-a100-4090.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["top"][0]["usd_per_B_tokens"] > 0
    r = runner.invoke(app, ["advise", str(p)])
    assert r.exit_code == 0 and "straggler: pool b" in r.output, r.output


def test_a_pool_that_overflows_is_named_with_its_own_gpu(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(job([pool("a", FAST), pool("b", dict(SLOW, mem_GiB=4))], stage_pools=["a", "b"])))
    r = runner.invoke(app, ["estimate", str(p)])
    assert r.exit_code == 1 and "GiB on slow (pool b)" in r.output and "4.0 GiB" in r.output, r.output
    r = runner.invoke(app, ["advise", str(p)])
    assert "does not fit memory (pool b needs" in r.output, r.output
