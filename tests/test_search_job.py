"""The library under ``commtax search``, ``advise`` and ``demo``, called without typer: decide.search_job (the space
from the flags, the pool search, the $ of each plan), report.planning (what they print) and decide.demo.Demo."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from commtax.decide.plans import PLAN_LABEL_KEY, plan_label
from commtax.decide.search_job import MAX_VERIFY, JobSearch, PoolJobSearch, cluster_price, search_job
from commtax.errors import SpecError
from commtax.report.planning import print_demo, print_pool_search, print_search, stage_runs, within_interval_lines
from commtax.report.table import WIDE_COLUMNS, print_table
from commtax.spec import load_job

REPO = Path(__file__).resolve().parents[1]
DENSE = REPO / "examples" / "llama2-70b-h100.yaml"
POOLS = REPO / "examples" / "pools" / "llama2-70b-a100-4090.yaml"
NO_MOE = dict.fromkeys(("ep", "etp", "moe_dispatcher", "moe_a2a_overlap"))
SMALL = {"tp": "8", "pp": "2,4", "cp": None, "vp": None, "micro_batch": "1", "zero": "1", "recompute": "selective"}


def console(width: int = 80) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, highlight=False, no_color=True), buf


@pytest.fixture(scope="module")
def dense():
    return load_job(DENSE)


@pytest.fixture(scope="module")
def small_search(dense) -> JobSearch:
    return search_job(dense, dict(SMALL), NO_MOE, top=3)


def test_each_best_plan_has_its_dollars_per_billion_tokens(dense, small_search):
    s = small_search
    assert isinstance(s, JobSearch) and s.price.mode == "owned" and s.price.usd_per_s > 0
    data = s.to_dict()
    assert data["price_mode"] == "owned"
    for entry, (_, b) in zip(data["top"], s.result.top):
        # $ per B tokens = $/s × 1e9 tokens / (tokens/s); tokens per $ its inverse, per token
        assert entry["usd_per_B_tokens"] == pytest.approx(s.price.usd_per_s * 1e9 / b.tokens_per_s)
        assert entry["tokens_per_dollar"] * entry["usd_per_B_tokens"] == pytest.approx(1e9)
    rented = cluster_price(dense, None, "rented", required=True)
    assert rented.mode == "rented" and rented.usd_per_s != s.price.usd_per_s


def test_the_space_is_the_flags_and_the_best_plan_leads(small_search):
    top = small_search.result.top
    assert 1 <= len(top) <= 3
    assert all(p.tp == 8 and p.pp in (2, 4) and p.micro_batch == 1 for p, _ in top)
    steps = [b.step_time_s for _, b in top]
    assert steps == sorted(steps)


def test_print_search_names_the_best_plan_and_its_key(dense, small_search):
    out, buf = console()
    err, ebuf = console()
    print_search(small_search, dense, out, err, top=3, verify=0, wide=False)
    text = buf.getvalue()
    assert f"Best plan {plan_label(small_search.result.top[0][0])}:" in text
    assert " ".join(PLAN_LABEL_KEY.split()) in " ".join(text.split())  # the key to the labels (wrapped at 80)
    assert text.startswith(f"{small_search.result.summary()['evaluated']:,} plans in ")
    assert all(len(line) <= 80 for line in text.splitlines())


def test_verify_past_the_limit_and_a_plan_flag_on_pools_are_refused(dense):
    with pytest.raises(SpecError, match=f"--verify: 101 plans to simulate; the limit is {MAX_VERIFY}"):
        search_job(dense, dict(SMALL), NO_MOE, verify=MAX_VERIFY + 1)
    with pytest.raises(SpecError, match="^--tp: a cluster of GPU pools"):
        search_job(load_job(POOLS), {**dict.fromkeys(SMALL), "tp": "8"}, NO_MOE)
    with pytest.raises(SpecError, match="^--fix: a cluster of GPU pools"):
        search_job(load_job(POOLS), dict.fromkeys(SMALL), NO_MOE, fix="tp")


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"rank_by": "cost"}, "rank"),
        ({"verify": 2}, "verify"),
        ({"writes_csv": True}, "csv"),
        ({"workers": 1}, "workers"),
    ],
)
def test_search_flags_the_pool_search_does_not_read_are_named(kw, flag):
    with pytest.raises(SpecError, match=f"^--{flag}: the pool search"):
        search_job(load_job(POOLS), dict.fromkeys(SMALL), NO_MOE, **kw)


def test_search_csv_on_pools_is_one_line_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "plans.csv"
    r = subprocess.run(
        [sys.executable, "-m", "commtax.cli", "search", str(POOLS), "--csv", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert r.returncode == 2 and r.stderr.startswith("error: --csv: the pool search") and not out.exists()


def test_a_cluster_of_pools_gets_the_pool_search(tmp_path):
    job = load_job(POOLS)
    s = search_job(job, dict.fromkeys(SMALL), NO_MOE, top=2)
    assert isinstance(s, PoolJobSearch) and len(s.result.top) == 2
    assert all(entry["usd_per_B_tokens"] > 0 for entry in s.to_dict()["top"])
    out, buf = console()
    print_pool_search(s, job, out, wide=False)
    assert "pool plans:" in buf.getvalue() and "Best plan" in buf.getvalue()


def test_stage_runs_groups_equal_stages():
    assert stage_runs(["rtx4090"] * 4 + ["a100"] * 4, [6] * 4 + [14] * 4) == "4×rtx4090:6 + 4×a100:14"
    assert stage_runs(["a", "a", "b", "a"], [5, 5, 5, 5]) == "2×a:5 + 1×b:5 + 1×a:5"


def test_within_interval_names_only_pairs_inside_each_others_interval(dense, small_search):
    (_, b), *_ = small_search.result.top
    assert within_interval_lines([("x", b), ("y", b)]) == [
        f"x and y: within each other's 80% interval (steps {b.step_time_s:.2f} and {b.step_time_s:.2f} s): "
        "the model cannot rank them; their ratio 1.00 is firmer than either time"
    ]
    assert within_interval_lines([("x", b)]) == []


def test_wide_prints_past_the_console_edge_on_the_same_file():
    t = Table("a", "b")
    t.add_row("x" * 70, "y" * 70)
    out, buf = console(80)
    print_table(out, t, wide=True)
    widest = max(len(line) for line in buf.getvalue().splitlines())
    assert 80 < widest <= WIDE_COLUMNS
    narrow, nbuf = console(80)
    print_table(narrow, t, wide=False)
    assert max(len(line) for line in nbuf.getvalue().splitlines()) <= 80


def test_demo_record_and_text_carry_the_article_and_the_wall():
    from commtax.decide.demo import ARTICLE, seed_demo

    d = seed_demo()
    data = d.to_dict()
    assert [c["name"] for c in data["clusters"]] == list(ARTICLE)
    assert data["communication_wall"][0]["speedup"] == 1.0  # the first factor is 1×: no speed-up
    out, buf = console(100)
    print_demo(d, out)
    text = buf.getvalue()
    assert "commtax vs the seed article" in text and "The communication wall" in text
    for c in data["clusters"]:
        assert f"{c['breakdown']['step_time_s']:.1f}" in text


def test_print_advice_leads_with_the_step_and_lists_the_changes(dense):
    from commtax.decide.advise import advise
    from commtax.report.planning import advice_headline, print_advice

    a = advise(dense)
    b = a.breakdown
    assert advice_headline(a).startswith(f"step {b.step_time_s:.3f} s, MFU {100 * b.mfu:.1f}%, comm tax ")
    out, buf = console(100)
    print_advice(a, out, top=3)
    text = buf.getvalue()
    assert text.startswith(advice_headline(a)[:40]) and "Changes, re-estimated" in text
    assert "sensitivity (elasticity d ln step / d ln x): " in text
    assert a.changes[0].label in text


def test_pools_with_an_unpriced_gpu_print_no_dollars_instead_of_failing(tmp_path):
    """Once a traceback (formatting None as $): the table shows — and the reason is printed above it."""
    import yaml

    raw = yaml.safe_load(POOLS.read_text())
    raw["cluster"]["pools"][1]["gpu"] = {
        "name": "unpriced-gpu",
        "peak_tflops": {"bf16": 300, "fp32": 60},
        "mem_GiB": 80,
        "mem_bw_GBps": 2000,
        "tdp_W": 500,
        "source": "test: a GPU the price catalog does not list",
    }
    job = load_job(raw)
    s = search_job(job, dict.fromkeys(SMALL), NO_MOE, top=2)
    assert s.price.usd_per_s is None and "no price for GPU 'unpriced-gpu'" in s.price.error
    assert all(entry["usd_per_B_tokens"] is None for entry in s.to_dict()["top"])
    out, buf = console(100)
    print_pool_search(s, job, out, wide=False)
    text = buf.getvalue()
    assert text.startswith("(no $ column: prices: no price for GPU 'unpriced-gpu'") and "—" in text
