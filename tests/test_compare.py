"""compare: clusters with their own best plan, costs as numbers, the Pareto front, plots, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from commtax.decide.compare import (
    ARTICLE_256,
    compare,
    jobs_for_gpus,
    pareto_mask,
    pareto_points,
    scaling,
)
from commtax.decide.cost import load_prices
from commtax.decide.search import Space, job_for, search
from commtax.schedule.analytical import estimate
from commtax.spec import load_job
from commtax.units import SECONDS_PER_DAY


def small_job(num_gpus: int = 16, gpu: str = "h100-sxm5-80gb", tokens: float = 1e11) -> dict:
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
        "plan": {"tp": 2, "pp": 2, "micro_batch": 1},
        "training": {"seq_len": 2048, "global_batch": 64, "precision": "bf16", "tokens": tokens},
    }


SPACE = Space.parse({"cp": "1", "vp": "1", "micro_batch": "1..2", "zero": "1"})


@pytest.fixture(scope="module")
def rows():
    job = load_job(small_job())
    jobs = jobs_for_gpus(job, ["h100-sxm5-80gb", "a100-sxm4-80gb"])
    return compare(jobs, space=SPACE, workers=1)


def test_gpu_swap_takes_the_node_it_is_sold_in():
    job = load_job(small_job())
    h, a, r = jobs_for_gpus(job, ["h100-sxm5-80gb", "a100-sxm4-80gb", "rtx-4090-24gb"])
    assert (a.cluster.gpu.name, a.cluster.intra_node.name, a.cluster.inter_node.name) == (
        "a100-sxm4-80gb",
        "nvlink3",
        "ib-hdr",
    )
    # the seed article's 4090 servers: 8 GPUs on PCIe with one 200G port
    assert (r.cluster.intra_node.name, r.cluster.inter_node.name, r.cluster.nics_per_node) == (
        "pcie4-x16",
        "roce-200g",
        1,
    )
    assert h.cluster.num_gpus == a.cluster.num_gpus == r.cluster.num_gpus == 16


def test_cluster_names_are_short_and_progress_reaches_the_end(rows):
    assert [r.name for r in rows] == ["16×h100-sxm5-80gb 8×ib-ndr", "16×a100-sxm4-80gb 8×ib-hdr"]
    seen = []
    job = load_job(small_job())
    compare(
        jobs_for_gpus(job, ["h100-sxm5-80gb", "b200-sxm-192gb"]),
        space=SPACE,
        workers=1,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert {t for _, t in seen} == {2}  # two clusters
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1][0] == 2  # monotonic, to the end


def test_each_cluster_gets_its_own_best_plan(rows):
    for row in rows:
        best = search(row.job, SPACE, top=1, workers=1).top[0]
        assert row.plan == best[0]  # the search's own typed row
        assert row.breakdown.step_time_s == estimate(job_for(row.job, row.plan)).step_time_s


def test_costs_are_the_cost_module_numbers(rows):
    prices = load_prices()
    for row in rows:
        b, c = row.breakdown, row.cost
        tokens_per_step = 64 * 2048
        assert b.tokens_per_s == pytest.approx(tokens_per_step / b.step_time_s)
        assert c.days == pytest.approx(1e11 / b.tokens_per_s / SECONDS_PER_DAY)
        assert c.gpu_hours == pytest.approx(16 * c.days * 24)
        g = prices.gpu(row.job.cluster.gpu.name)
        # rented: 16 GPUs × $/GPU-h × hours per billion tokens
        assert c.rented_usd_per_B_tokens == pytest.approx(16 * g.rent_usd_per_gpu_hour * 1e9 / b.tokens_per_s / 3600)
        d = row.to_dict("rented")
        assert d["usd_per_B_tokens"] == c.rented_usd_per_B_tokens
        assert d["days"] == c.days and d["mfu"] == b.mfu and d["comm_tax"] == b.comm_tax


def test_h100_is_faster_than_a100_on_the_same_job(rows):
    h, a = rows
    assert h.breakdown.step_time_s < a.breakdown.step_time_s
    assert h.cost.days < a.cost.days


def test_a_cluster_where_nothing_fits_is_a_row_with_a_reason():
    job = load_job(small_job(num_gpus=8) | {"model": "llama2-70b"})
    (row,) = compare(
        [job], space=Space.parse({"tp": "1", "pp": "1", "cp": "1", "zero": "0", "recompute": "none"}), workers=1
    )
    assert row.breakdown is None and row.cost is None
    assert "no plan fits memory" in row.reason


def test_pareto_mask_hand_worked():
    # (days, $/B): (1, 10) and (2, 5) and (4, 1) are on the front; (3, 6) is beaten by (2, 5); (1, 12) by (1, 10)
    x = np.array([1.0, 2.0, 3.0, 4.0, 1.0])
    y = np.array([10.0, 5.0, 6.0, 1.0, 12.0])
    assert pareto_mask(x, y).tolist() == [True, True, False, True, False]


def test_pareto_points_and_plots(rows, tmp_path):
    pts = pareto_points(rows, mode="owned")
    assert [p.cluster for p in pts] == [r.name for r in rows]
    for p, r in zip(pts, rows):
        # the first point of each cluster is its best plan: days and $ equal the row's
        assert p.days[0] == pytest.approx(r.cost.days)
        assert p.usd_per_B[0] == pytest.approx(r.cost.owned_usd_per_B_tokens)
    assert sum(int(p.pareto.sum()) for p in pts) >= 1
    from commtax.report.plots import pareto_plot, scaling_plot

    png = pareto_plot(pts, tmp_path / "pareto.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sc = scaling(load_job(small_job()), [8, 16, 32], space=SPACE, workers=1)
    assert [s.num_gpus for s in sc] == [8, 16, 32]
    assert all(s.breakdown is not None for s in sc)
    # same global batch on more GPUs: fewer tokens per GPU per step, so more of the step is communication
    assert sc[-1].breakdown.comm_share >= sc[0].breakdown.comm_share
    png = scaling_plot(sc, tmp_path / "scaling.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_article_numbers_are_recorded():
    assert ARTICLE_256["h100-sxm5-80gb"]["usd_per_B"] == 58 and ARTICLE_256["rtx-4090-24gb"]["days"] == 280
    assert ARTICLE_256["a100-sxm4-80gb"]["comm_share"] == 0.50


def _app():
    from commtax.cli.main import app, register_commands

    register_commands()
    return app


def test_cli_compare_with_gpu_list_json(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(small_job()))
    # `--gpu a b`: the second name arrives as a positional argument and is taken as a GPU
    r = CliRunner().invoke(
        _app(),
        [
            "compare",
            str(f),
            "--gpu",
            "h100-sxm5-80gb",
            "a100-sxm4-80gb",
            "--json",
            "--rent",
            "--workers",
            "1",
            "--pareto",
            str(tmp_path / "p.png"),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [row["gpu"] for row in data["rows"]] == ["h100-sxm5-80gb", "a100-sxm4-80gb"]
    assert data["mode"] == "rented"
    for row in data["rows"]:
        assert row["usd_per_B_tokens"] == row["rented_usd_per_B_tokens"]
        assert row["days"] == pytest.approx(1e11 / row["breakdown"]["tokens_per_s"] / SECONDS_PER_DAY)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_compare_bad_input(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(small_job()))
    r = CliRunner().invoke(_app(), ["compare", str(f), "--gpu", "h100-sxm5-80gbb"])
    assert r.exit_code == 2 and "did you mean 'h100-sxm5-80gb'" in r.output
    bad = tmp_path / "prices.yaml"
    bad.write_text(yaml.safe_dump({"gpus": {"x-gpu": {"purchase_usd": 1, "source": "s", "date": "d"}}}))
    r = CliRunner().invoke(_app(), ["compare", str(f), "--prices", str(bad)])
    assert r.exit_code == 2
    assert r.output.startswith("error: prices.gpus.x-gpu.rent_usd_per_gpu_hour: Field required")


def test_cheapest_cluster_within_a_deadline(rows):
    from commtax.decide.compare import cheapest_within

    h, a = rows
    assert h.cost.days < a.cost.days
    # only the faster cluster meets a deadline between the two
    assert cheapest_within(rows, (h.cost.days + a.cost.days) / 2) is h
    # both meet a loose deadline: the lower $/B wins
    both = cheapest_within(rows, a.cost.days + 1, mode="rented")
    assert both is min(rows, key=lambda r: r.cost.rented_usd_per_B_tokens)
    assert cheapest_within(rows, h.cost.days / 2) is None


def test_gpu_counts_multiply_the_clusters():
    from commtax.decide.compare import with_gpu_counts
    from commtax.errors import SpecError

    job = load_job(small_job())
    jobs = with_gpu_counts([job], [8, 16, 32])
    assert [j.cluster.num_gpus for j in jobs] == [8, 16, 32]
    with pytest.raises(SpecError, match="no valid cluster size"):
        with_gpu_counts([job], [12])  # 12 GPUs in 8-GPU nodes


def test_cli_compare_sizes_and_deadline(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(small_job()))
    r = CliRunner().invoke(
        _app(),
        [
            "compare",
            str(f),
            "--num-gpus",
            "8,16",
            "--deadline",
            "1e6",
            "--json",
            "--cp",
            "1",
            "--micro-batch",
            "1",
            "--workers",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [row["num_gpus"] for row in data["rows"]] == [8, 16]
    cheapest = min(data["rows"], key=lambda row: row["usd_per_B_tokens"])
    assert data["deadline_choice"] == cheapest["name"]
    r = CliRunner().invoke(_app(), ["compare", str(f), "--num-gpus", "8,x"])
    assert r.exit_code == 2 and "--num-gpus: expected integers" in r.output


def test_compare_table_stays_whole_at_80_when_a_cluster_has_no_plan_that_fits():
    """The article's plan on three clusters (docs/compare.md): the 4090 fits no plan. Its row is dashes and the
    reason goes under the table, so cluster names and numbers stay whole at 80 columns."""
    from pathlib import Path

    from typer.testing import CliRunner

    from commtax.cli.io import console
    from commtax.cli.main import app, register_commands

    register_commands()
    repo = Path(__file__).resolve().parents[1]
    args = ["compare", str(repo / "examples/compare/llama2-70b-256-h100.yaml"), "--gpu", "h100-sxm5-80gb"]
    args += ["a100-sxm4-80gb", "rtx-4090-24gb", "--tokens", "6e11", "--tp", "8", "--pp", "4", "--cp", "1"]
    args += ["--vp", "1", "--micro-batch", "1", "--zero", "1", "--recompute", "selective", "--sequence-parallel"]
    args += ["true"]
    width = console.width
    console.width = 80
    try:
        r = CliRunner().invoke(app, args)
    finally:
        console.width = width
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in r.stdout
    assert any(line.startswith(" 256×rtx-4090-24gb 1×roce-200g") and line.rstrip().endswith("—") for line in lines)
    assert "no plan: 256×rtx-4090-24gb" in r.stdout and "0.8 MiB over the 24.0 GiB" in " ".join(r.stdout.split())


def test_docs_compare_tables_are_what_compare_prints_for_the_articles_plan():
    """docs/compare.md's second table (the article's own plan: no search, so cheap to re-run) holds the numbers
    `commtax compare --json` gives now; the first table is the same command with the search (run by hand)."""
    import json
    import re
    from pathlib import Path

    from typer.testing import CliRunner

    from commtax.cli.main import app, register_commands

    register_commands()
    repo = Path(__file__).resolve().parents[1]
    doc = (repo / "docs" / "compare.md").read_text()
    args = ["compare", str(repo / "examples/compare/llama2-70b-256-h100.yaml"), "--gpu", "h100-sxm5-80gb"]
    args += ["a100-sxm4-80gb", "--tokens", "6e11", "--tp", "8", "--pp", "4", "--cp", "1", "--vp", "1"]
    args += ["--micro-batch", "1", "--zero", "1", "--recompute", "selective", "--sequence-parallel", "true", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    got = {row["gpu"]: row for row in json.loads(r.stdout)["rows"]}
    for name, gpu in (("H100 SXM", "h100-sxm5-80gb"), ("A100 SXM 80GB", "a100-sxm4-80gb")):
        line = re.search(rf"^\| {name} \| ([0-9.]+) \| ([0-9.]+)% \| ([0-9.]+)% \| [0-9.]+% \| ([0-9.]+) \|", doc, re.M)
        assert line, name
        g = got[gpu]
        assert line.groups() == (
            f"{g['step_time_s']:.1f}",
            f"{100 * g['mfu']:.1f}",
            f"{100 * g['comm_tax']:.1f}",
            f"{g['tokens_per_day'] / 1e9:.1f}",
        ), name
