"""What ``search``, ``compare``, ``advise`` and ``demo`` print: their tables and lines, on a rich console.

Each function takes the library's record (``decide.search_job``, ``decide.compare``, ``decide.advise``,
``decide.demo``) and the console(s) to print on: stdout for the figures, ``err`` for warnings. Every view reads at
80 columns; ``wide`` prints tables at their natural width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from commtax.decide.plans import MOE_LABEL_KEY, PLAN_LABEL_KEY, plan_label
from commtax.report.table import (
    compare_table,
    new_table,
    pct,
    print_table,
    render_breakdown,
    search_table,
)
from commtax.schedule.breakdown import within_each_other

REASONS_SHOWN = 4  # search: the commonest reasons a plan is invalid or does not fit, each with one real message
POOL_REFUSALS_SHOWN = 5


# ----------------------------------------------------------------------------- search
def print_search(s: Any, job: Any, console: Console, err: Console, *, top: int, verify: int, wide: bool) -> None:
    """``commtax search``: counts, the reasons plans were refused, the best plans (and those simulated), the best
    plan's breakdown. ``s``: a ``decide.search_job.JobSearch``."""
    res = s.result
    print_search_counts(res, console)
    if res.interrupted:
        console.print("[yellow]interrupted: the best of the plans evaluated so far[/yellow]")
    for w in res.warnings:
        err.print(f"warning: {w}", markup=False)
    if s.price.error:
        console.print(f"(no $ column: {s.price.error})", markup=False)
    print_table(console, search_table(res, s.price.mode, s.price.usd_per_s, max(top, verify), wide), wide)
    if len(res.top) >= 2 and within_each_other(res.top[0][1], res.top[1][1]):
        console.print(
            f"plans #1 and #2 are within each other's 80% interval ({plan_label(res.top[0][0])} vs "
            f"{plan_label(res.top[1][0])}): the model cannot tell them apart; their ratio is firmer than either time",
            markup=False,
        )
    console.print(PLAN_LABEL_KEY, style="dim")
    if job.model.is_moe:
        console.print(MOE_LABEL_KEY, style="dim")
    if res.verified:
        print_table(console, verified_table(res.verified), wide)
        for v in res.verified[:1]:
            if v.above_published:
                err.print(f"warning: best plan: {v.above_published}", markup=False)
    best_plan, best = res.top[0]
    console.print(f"\n[bold]Best plan[/bold] {plan_label(best_plan)}:")
    render_breakdown(best, console, job.cluster.gpu.mem_GiB)


def print_search_counts(res: Any, console: Console) -> None:
    """How many plans were evaluated, valid, fit memory; the commonest reasons the others were refused."""
    s = res.summary()
    console.print(
        f"{s['evaluated']:,} plans in {s['elapsed_s']:.2f} s ({s['plans_per_s']:,.0f}/s): {s['valid']:,} valid, "
        f"{s['fit']:,} fit memory, {s['do_not_fit']:,} do not fit, {s['invalid']:,} invalid",
    )
    for title, reasons in (("invalid", s["invalid_reasons"]), ("do not fit", s["do_not_fit_reasons"])):
        for why, count in list(reasons.items())[:REASONS_SHOWN]:
            # the key has its numbers taken out to group messages ("vp(n) > n"): show one real message
            example = res.invalid_examples.get(why)
            text = f"{why}" if example is None else (f"e.g. {example}" if count > 1 else example)
            console.print(f"  {title}: {count:,} × {text}", markup=False)


def verified_table(verified: list) -> Any:
    """search --verify: each plan's estimate (with its 80% band), its simulated step and the difference."""
    t = new_table(f"Top {len(verified)} simulated (ranked by the simulated step)")
    for col in ("#", "plan", "estimate s (80%)", "simulate s", "diff", "MFU"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for k, v in enumerate(verified, 1):
        est, sim = v.estimate.step_time_s, v.simulate.step_time_s
        lo, hi = v.estimate.step_time_s_p10, v.estimate.step_time_s_p90
        band = f" ({lo:.2f}–{hi:.2f})" if lo else ""
        mfu = f"{v.estimate.mfu:.1%}" + (" !" if v.above_published else "")
        t.add_row(str(k), plan_label(v.plan), f"{est:.3f}{band}", f"{sim:.3f}", f"{(sim - est) / est:+.1%}", mfu)
    return t


def stage_runs(pools: list, layers: list[int]) -> str:
    """``4×rtx4090:6 + 4×a100:14``: runs of equal stages, each as count × pool:layers."""
    runs: list[list] = []
    for key in zip(pools, layers):
        if runs and runs[-1][1] == key:
            runs[-1][0] += 1
        else:
            runs.append([1, key])
    return " + ".join(f"{n}×{w}:{x}" for n, (w, x) in runs)


def print_pool_search(s: Any, job: Any, console: Console, *, wide: bool) -> None:
    """``commtax search`` on a cluster of GPU pools: the refusals counted by rule, the best plans with where
    their stages sit, the best plan's breakdown. ``s``: a ``decide.search_job.PoolJobSearch``."""
    res = s.result
    if s.price.error:
        console.print(f"(no $ column: {s.price.error})", markup=False)
    console.print(f"{res.evaluated:,} pool plans: {res.fit:,} valid and fit memory")
    for why, count in res.refusals.most_common(POOL_REFUSALS_SHOWN):
        console.print(f"  refused: {count:,} × {why}", markup=False)
    print_table(console, pool_plans_table(s), wide)
    console.print("\n[bold]Best plan[/bold]:")
    render_breakdown(res.top[0][1], console, job.cluster.gpu.mem_GiB)


def pool_plans_table(s: Any) -> Any:
    t = new_table(f"Top {len(s.result.top)} plans on the pools ($ {s.price.mode})")
    for col in ("#", "plan", "stages (pool:layers)", "step s", "tax", "MFU", "$/B tok", "straggler"):
        t.add_column(col, justify="left" if col in ("plan", "stages (pool:layers)", "straggler") else "right")
    for k, ((p, b), entry) in enumerate(zip(s.result.top, s.to_dict()["top"]), 1):
        where = (
            stage_runs(list(p.stage_pools), list(p.stage_layers or ()))
            if p.stage_pools
            else "dp across pools, shares " + (",".join(f"{x:.3g}" for x in p.pool_batch_share or ()) or "even")
        )
        slow = next((x["pool"] for x in b.pools or [] if x["straggler"]), "")
        label = f"tp{p.tp}·pp{p.pp}·dp{p.dp}·mb{p.micro_batch}·{p.recompute}"
        t.add_row(
            str(k),
            label,
            where,
            f"{b.step_time_s:.2f}",
            f"{b.comm_tax:.1%}",
            f"{b.mfu:.1%}",
            "—" if entry["usd_per_B_tokens"] is None else f"{entry['usd_per_B_tokens']:,.0f}",  # an unpriced GPU
            slow,
        )
    return t


# ----------------------------------------------------------------------------- compare
def within_interval_lines(named: list) -> list[str]:
    """One line per pair of options whose central steps lie inside each other's 80% interval."""
    return [
        f"{a} and {b}: within each other's 80% interval (steps {ba.step_time_s:.2f} and {bb.step_time_s:.2f} s): "
        f"the model cannot rank them; their ratio {ba.step_time_s / bb.step_time_s:.2f} is firmer than either time"
        for i, (a, ba) in enumerate(named)
        for b, bb in named[i + 1 :]
        if within_each_other(ba, bb)
    ]


def print_comparison(c: Any, console: Console, *, article: bool, wide: bool, written: list[Path]) -> None:
    """``commtax compare``: the clusters side by side, the plans, what the model cannot rank, the fabric
    trade-offs and the deadline's choice. ``c``: a ``decide.compare`` result."""
    from commtax.decide.compare import fabric_tradeoff_lines

    print_table(console, compare_table(c.rows, c.mode, article, wide, c.searched), wide)
    if not wide:
        for r in c.rows:
            if r.plan is not None and r.breakdown is not None:
                console.print(f"  {r.name}: {plan_label(r.plan)}", markup=False)
    for line in within_interval_lines([(r.name, r.breakdown) for r in c.rows if r.breakdown is not None]):
        console.print(line, markup=False)
    for line in fabric_tradeoff_lines(c.rows, c.mode):
        console.print(line, markup=False)
    if c.deadline_days is not None:
        if c.choice is None:
            console.print(f"no cluster trains {c.tokens:.3g} tokens within {c.deadline_days:g} days")
        else:
            console.print(
                f"cheapest within {c.deadline_days:g} days: {c.choice.name}: {c.choice.cost.days:.1f} days, "
                f"${c.choice.cost.usd_per_B_tokens(c.mode):,.0f} per B tokens ({c.mode})"
            )
    for path in written:
        console.print(f"wrote {path}")


# ----------------------------------------------------------------------------- advise
CUT_SHOWN = -0.0005  # a remedy's step cut that shows at 0.1%


def advice_headline(a: Any) -> str:
    """The step, MFU, comm tax and what dominates the step (and its largest communication part)."""
    b = a.breakdown
    return (
        f"step {b.step_time_s:.3f} s, MFU {pct(b.mfu)}, comm tax {pct(b.comm_tax)}"
        f"{'' if b.fits else ' (does not fit memory)'}; dominant: {a.dominant} ({pct(a.dominant_share)} of step)"
        + (
            f"; largest communication part: {a.dominant_comm} ({pct(b.breakdown_s[a.dominant_comm] / b.step_time_s)})"
            if a.dominant_comm
            else ""
        )
    )


def changes_table(a: Any, top: int) -> Any:
    """The best ``top`` changes, each re-estimated: its step change (≈ when within the interval) and what moves."""
    # changes that fit memory come first, fastest first: with a plan that does not fit, a slower one can lead
    order = "best first" if a.breakdown.fits else "those that fit memory first, then fastest"
    t = new_table(f"Changes, re-estimated ({order})")
    t.add_column("#", justify="right")
    t.add_column("change")
    t.add_column("step", justify="right", no_wrap=True)
    t.add_column("what moves")
    for k, c in enumerate(a.changes[:top], 1):
        step = f"{c.step_change:+.1%}" + (" ≈" if c.within_interval else "")
        t.add_row(str(k), c.label, step, c.text().split(": ", 1)[-1].split("; ", 1)[-1])
    return t


def print_advice(a: Any, console: Console, *, top: int) -> None:
    """``commtax advise``: the headline, the changes, the remedies (and the codecs that are none here), the
    placement and fabric what-ifs, the sensitivities. ``a``: a ``decide.advise`` result."""
    console.print(advice_headline(a))
    console.print(changes_table(a, top))
    if any(c.within_interval for c in a.changes[:top]):
        console.print(
            "≈: before and after lie within each other's 80% interval; the change's ratio is firmer than either time",
            markup=False,
        )
    helps = [r for r in a.remedies if r.change.step_change <= CUT_SHOWN]
    slower = [r for r in a.remedies if r.change.step_change > CUT_SHOWN]
    for r in helps:  # gradient compression as DDP comm hooks (commtax bench ddp measures them)
        console.print(f"remedy: {r.text()}", highlight=False)
    if slower:  # never listed as a remedy: the codec costs more than the bytes it saves on this network
        console.print(
            "not a remedy here (no faster step: the codec costs about what the bytes it saves): "
            + "; ".join(f"{r.label} {r.change.step_change:+.1%}" for r in slower),
            highlight=False,
        )
    for line in a.placement:  # cluster.fabric: where each group sits, what to keep where
        console.print(f"placement: {line}", highlight=False)
    for c in (c for c in a.changes if c.kind == "fabric"):  # every fabric what-if, better or worse
        console.print(
            f"fabric what-if: {c.label}: step {c.step_after_s:.3f} s ({c.step_change:+.1%}), comm tax "
            f"{pct(c.comm_tax_after)}",
            highlight=False,
        )
    console.print(
        "sensitivity (elasticity d ln step / d ln x): "
        + ", ".join(
            f"{lvl} bandwidth {v['bw_elasticity']:+.3f}, {lvl} latency {v['latency_elasticity']:+.3f}"
            for lvl, v in a.sensitivities.items()
        ),
    )


# ----------------------------------------------------------------------------- demo
def print_demo(d: Any, console: Console) -> None:
    """``commtax demo``: commtax's figures beside the seed article's, why they differ, the communication wall.
    ``d``: a ``decide.demo.Demo``."""
    from commtax.decide.demo import ARTICLE, REASONS

    rows = d.rows
    console.print(
        "[bold]Seed scenario:[/bold] LLaMA-2 70B, 4.19M tokens per step (1024 × 4096), "
        "TP=8 PP=4 DP=8, 256 GPUs, bf16, ZeRO-1, selective recompute"
    )
    console.print(demo_table(rows, ARTICLE))
    console.print(
        "comm s: link time, nothing overlapped; comm share = comm / (comm + compute) (the article's tax); "
        "comm tax = exposed comm / step"
    )
    for r in rows:
        if r.note != "article's plan as given":
            console.print(f"  {r.name}: {r.note}")
    console.print("[bold]Why the numbers differ[/bold]")
    for key, reason in REASONS.items():
        console.print(f"  • {key}: {reason}")
    console.print(wall_table(rows[0].name, d.wall))


DEMO_METRICS = (  # label, commtax's cell, the article's cell
    ("compute s", lambda r: f"{r.compute_s:.1f}", lambda a: f"{a.compute_s:.2f}"),
    ("comm s", lambda r: f"{r.comm_s:.1f}", lambda a: f"{a.comm_s:.2f}"),
    ("comm share", lambda r: f"{100 * r.breakdown.comm_share:.0f}%", lambda a: f"{100 * a.comm_tax:.0f}%"),
    ("comm tax", lambda r: f"{100 * r.breakdown.comm_tax:.0f}%", lambda a: "—"),
    ("step s", lambda r: f"{r.breakdown.step_time_s:.1f}", lambda a: "—"),
    ("MFU", lambda r: f"{100 * r.breakdown.mfu:.0f}%", lambda a: "—"),
    ("B tokens/day", lambda r: f"{r.tokens_per_day / 1e9:.1f}", lambda a: f"{a.tokens_per_day / 1e9:.1f}"),
)


def demo_table(rows: list, article: dict) -> Any:
    """One column per cluster, each beside the article's figure."""
    t = new_table("commtax vs the seed article (one step, 256 GPUs each)")
    t.add_column("metric")
    for r in rows:
        t.add_column(r.name.removeprefix("256× "), justify="right")
        t.add_column("article", justify="right", style="dim")
    for label, ours, theirs in DEMO_METRICS:
        cells = []
        for r in rows:
            cells += [ours(r), theirs(article[r.name])]
        t.add_row(label, *cells)
    return t


def wall_table(name: str, wall: list) -> Any:
    """Faster compute on a fixed network: the step's speed-up and the comm tax at each compute factor."""
    w = new_table(f"The communication wall ({name}, fixed network)")
    for col in ("compute ×", "step s", "step speed-up", "comm tax"):
        w.add_column(col, justify="right")
    for row in wall:
        w.add_row(f"{row.compute_speedup:g}×", f"{row.step_s:.2f}", f"{row.speedup:.2f}×", f"{100 * row.comm_tax:.0f}%")
    return w
