"""Rich tables for what the commands print: a Breakdown, memory, validation, cost, search and compare.

Every table reads at 80 columns (tests run the commands with COLUMNS=80): short headers, plans written
compactly (``tp8·pp4·dp8·mb1``), numbers with the unit in the header. Wider views are opt-in (``--wide``).
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commtax.decide.plans import plan_label
from commtax.schedule.breakdown import Breakdown, fmt_step_interval, part_keys
from commtax.units import GB


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


WIDE_COLUMNS = 200  # --wide: a table's natural width, up to this many columns


def print_table(console: Console, table: Table, wide: bool = False) -> None:
    """Print a table at the console's width, or (``--wide``) at its natural width even past the console's edge."""
    if wide and console.width < WIDE_COLUMNS:
        Console(file=console.file, width=WIDE_COLUMNS, highlight=False, no_color=console.no_color).print(table)
    else:
        console.print(table)


def new_table(title: str | None = None, show_header: bool = True) -> Table:
    """The house style: a rule under the header, no vertical borders (two characters between columns)."""
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_header=show_header,
        header_style="bold",
        title_style="bold",
        title_justify="left",
        show_edge=False,
        collapse_padding=True,
        min_width=len(title) if title else None,
    )


# ----------------------------------------------------------------------------- a Breakdown
def breakdown_table(b: Breakdown, title: str = "Step") -> Table:
    t = new_table(title)
    t.add_column("component")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for key in part_keys(b):
        v = b.breakdown_s[key]
        t.add_row(key, f"{v:.4f}", pct(v / b.step_time_s if b.step_time_s else 0.0))
    t.add_row("[bold]step_time[/bold]", f"[bold]{b.step_time_s:.4f}[/bold]", "100.0%")
    return t


def summary_table(b: Breakdown) -> Table:
    t = new_table("Throughput and communication", show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("step time (80% interval)", fmt_step_interval(b, 3))] if b.step_time_s_p10 is not None else []
    rows += [
        ("tokens/s", f"{b.tokens_per_s:,.0f}"),
        ("tokens/s per GPU", f"{b.tokens_per_s_per_gpu:,.1f}"),
        ("model TFLOP/s per GPU", f"{b.tflops_per_gpu:.1f}"),
        ("MFU (model FLOPs / peak)", pct(b.mfu)),
        ("HFU (incl. recompute)", pct(b.hfu)),
        ("comm tax (exposed comm / step)", pct(b.comm_tax)),
        ("comm share (comm / (comm + compute), no overlap)", pct(b.comm_share)),
    ]
    if b.days_to_train is not None:
        rows.append(("days to train", f"{b.days_to_train:,.1f}"))
    for r in rows:
        t.add_row(*r)
    return t


def comm_table(b: Breakdown) -> Table:
    t = new_table("Communication per GPU per step (before overlap)")
    t.add_column("group")
    t.add_column("sent GB", justify="right")
    t.add_column("link time s", justify="right")
    for g in ("tp", "cp", "pp", "dp", "ep"):
        if g in b.comm_time_s:  # ep: MoE jobs only
            t.add_row(g, f"{b.comm_bytes_per_gpu[g] / GB:,.2f}", f"{b.comm_time_s[g]:.4f}")
    return t


def memory_table(b: Breakdown, capacity_gib: float | None = None) -> Table:
    t = new_table("Memory per GPU (busiest pipeline stage)")
    t.add_column("part")
    t.add_column("GiB", justify="right")
    for k, v in b.memory_gib_per_gpu.items():
        t.add_row(f"[bold]{k}[/bold]" if k == "total" else k, f"{v:.2f}")
    if capacity_gib is not None:
        over = not b.fits
        t.add_row("[red]capacity (does not fit)[/red]" if over else "capacity", f"{capacity_gib:.2f}")
    return t


def render_breakdown(b: Breakdown, console: Console, capacity_gib: float | None = None) -> None:
    """The four tables of one step (and, on GPU pools, what each pool does), then its notes (each printed once)."""
    tables = [breakdown_table(b, f"One training step ({b.source})"), summary_table(b), comm_table(b)]
    if b.pools:
        tables.append(pools_table(b))
        # the memory shown is the pool nearest its limit: its own GPU's capacity
        binding = max(b.pools, key=lambda x: x["memory_gib"] / x["mem_GiB"])
        capacity_gib = binding["mem_GiB"]
    for table in (
        *tables,
        memory_table(b, capacity_gib),
    ):
        console.print(table)
        console.print()
    for note in b.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)


def pools_table(b: Breakdown) -> Table:
    """One row per GPU pool: its stages and layers, the slowest stage's seconds per micro-batch, memory, straggler."""
    t = new_table("GPU pools")
    for col in ("pool", "GPU", "GPUs", "stages", "layers", "s/mb", "GiB/GPU", "slowest"):
        t.add_column(col, justify="left" if col in ("pool", "GPU", "stages", "layers", "slowest") else "right")
    for x in b.pools or []:
        st, ly = x["stages"], x["layers"]
        t.add_row(
            x["pool"],
            x["gpu"],
            str(x["num_gpus"]),
            f"{st[0]}-{st[-1]}" if len(st) > 1 and st == list(range(st[0], st[-1] + 1)) else ",".join(map(str, st)),
            f"{len(ly)}×{ly[0]}" if len(set(ly)) == 1 else ",".join(map(str, ly)),
            f"{max(x['stage_s']):.4g}",
            f"{x['memory_gib']:.1f}/{x['mem_GiB']:g}",
            "straggler" if x["straggler"] else "",
        )
    return t


# ----------------------------------------------------------------------------- validate
_SHORT = {"micro_batch": "mb", "sequence_parallel": "sp", "recompute": "rc", "grad_comm_dtype": "g"}


def _cell(name: str, value: Any) -> str:
    """``vp1``, ``mb2``, ``sp:on``, ``rc:selective``: one chosen plan cell, short."""
    short = _SHORT.get(name, name)
    if isinstance(value, bool):
        return f"{short}:{'on' if value else 'off'}"
    return f"{short}{value}" if isinstance(value, int) else f"{short}:{value}"


ID_ONE_LINE = 36  # validate's id column at 80 columns


def validation_table(report: Any, wide: bool = False) -> Table:
    """One row per published measurement. The note is short at 80 columns (the plan cells the search chose or the
    framework's defaults filled, ``vp2 mb1``, and the framework); ``wide`` gives where the framework came from too."""
    runs = report.kind == "runs"
    t = new_table(f"Validation: {report.kind} (measured {'tokens/s per GPU' if runs else 'busbw GB/s'})")
    # an id up to 36 characters stays on one line; a longer one folds onto the next (whole, never cut), so the
    # numbers keep their columns at 80
    longest = max((len(r.id) for r in report.rows), default=2)
    t.add_column("id", overflow="fold", min_width=min(longest, ID_ONE_LINE), max_width=None if wide else ID_ONE_LINE)
    for col, width in (("measured", 8), ("predicted", 9), ("error", 6)):
        t.add_column(col, justify="right", no_wrap=True, min_width=width)
    t.add_column(
        "chosen, framework" if runs else "algorithm",
        no_wrap=not wide,
        overflow="ellipsis",
        max_width=None if wide else 16,
    )
    for r in report.rows:
        if r.predicted is None:
            t.add_row(r.id, f"{r.measured}", "—", "—", f"[yellow]{escape(str(r.reason))}[/yellow]")
            continue
        if runs:
            software = r.extra.get("framework", "")
            chosen = " ".join(_cell(k, v) for k, v in {**r.extra.get("defaults", {}), **r.chosen.to_dict()}.items())
            note = " ".join(x for x in (chosen, software if wide else software.split(" (")[0]) if x)
        else:
            note = "/".join(x for x in (r.extra.get("algorithm", ""), r.extra.get("protocol", "")) if x)
        fmt = ",.0f" if runs else ",.2f"  # tokens/s per GPU: whole tokens; busbw: GB/s to 10 MB/s
        t.add_row(r.id, f"{r.measured:{fmt}}", f"{r.predicted:{fmt}}", f"{r.error_pct:+.1f}%", escape(note))
    return t


# ----------------------------------------------------------------------------- cost
def cost_table(c: Any, mode: str, title: str) -> Table:
    """Days, GPU-hours, energy and dollars of one training run (``commtax.decide.cost.TrainingCost``)."""
    t = new_table(title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for label, value in (
        ("tokens/day", f"{c.tokens_per_day / 1e9:,.2f} B"),
        ("days", f"{c.days:,.1f}"),
        ("GPU-hours", f"{c.gpu_hours:,.0f}"),
        ("energy (facility, × PUE)", f"{c.energy_MWh:,.1f} MWh"),
        ("facility power", f"{c.facility_power_kW:,.0f} kW"),
        (f"$ for the run ({mode})", f"{c.usd(mode):,.0f}"),
        (f"$ per B tokens ({mode})", f"{c.usd_per_B_tokens(mode):,.2f}"),
        ("capex (GPUs + nodes)", f"{c.capex_usd / 1e6:,.2f} M$"),
        ("racks", f"{c.racks} ({c.rack_units:g} U)"),
    ):
        t.add_row(label, value)
    return t


# ----------------------------------------------------------------------------- search and compare
def search_table(res: Any, mode: str, usd_per_s: float | None, n: int, wide: bool = False) -> Table:
    """The best ``n`` plans of a search; ``wide`` adds the exposed DP/TP shares and memory."""
    from commtax.decide.cost import usd_per_B_tokens
    from commtax.decide.space import MOE_AXES  # not at the top: estimate's table does not import the search space

    price = f"; $/B tok {mode}" if usd_per_s is not None else ""
    t = new_table(f"Top {min(n, len(res.top))} of {int(res.fits.sum()):,} plans that fit (by {res.rank_by}{price})")
    cols = ["#", "plan", "step s", "MFU", "tax", "bubble"] + (["dp exp", "tp exp", "GiB"] if wide else [])
    for col in cols:
        t.add_column(col, justify="left" if col == "plan" else "right", no_wrap=col == "plan")
    if usd_per_s is not None:
        t.add_column("$/B tok", justify="right")
    # MoE fields the shown plans share are left to the best plan's full label (the table stays at 80 columns)
    same = {f for f in MOE_AXES if len({p.get(f) for p, _ in res.top[:n]}) == 1}
    for k, (p, b) in enumerate(res.top[:n], 1):
        parts = b.breakdown_s
        row = [
            str(k),
            plan_label(p.without(same)),
            f"{b.step_time_s:.3f}",
            pct(b.mfu),
            pct(b.comm_tax),
            pct(parts["pp_bubble"] / b.step_time_s),
        ]
        if wide:
            row += [
                pct(parts["dp_exposed"] / b.step_time_s),
                pct(parts["tp_exposed"] / b.step_time_s),
                f"{b.memory_gib_per_gpu['total']:.1f}",
            ]
        if usd_per_s is not None:
            row.append(f"{usd_per_B_tokens(usd_per_s, b.tokens_per_s):,.0f}")
        t.add_row(*row)
    return t


def compare_table(rows: list[Any], mode: str, article: bool, wide: bool = False, searched: bool = True) -> Table:
    """Clusters side by side, each with its best plan (``searched``) or the job's own. 80 columns: the essentials;
    ``wide`` adds the plan, comm share, energy and capex; ``article`` adds the seed article's comm share,
    B tokens/day, days and $/B."""
    from commtax.decide.compare import ARTICLE_256

    plan_col = "best plan" if searched else "plan"
    whose = "its best" if searched else "the job's"
    t = new_table(f"Clusters, each with {whose} plan ($ {mode})")
    cols = ["cluster", "step s", "MFU", "tax", "B tok/day", "days", "$/B tok"]
    if wide:
        cols[1:1] = [plan_col]
        cols[5:5] = ["share"]
        cols += ["MWh", "capex M$"]
    fabrics = [r.fabric_capex for r in rows]
    if any(f is not None for f in fabrics):  # switches + optics + fibre (decide.fabric_cost), next to GPU time
        cols += ["fabric M$"]
    for c in cols:
        left = c in ("cluster", plan_col)
        t.add_column(
            c if wide else c.replace(" ", "\n"),
            justify="left" if left else "right",
            no_wrap=c != "cluster",
            overflow="fold",
        )
    if article:
        t.add_column("article share·B/day·days·$/B" if wide else "article\ndays, $/B", justify="right", no_wrap=True)
    unplaced = []
    for r, fab in zip(rows, fabrics, strict=True):
        if r.breakdown is None:  # the reason goes under the table: in a no_wrap number column it breaks the layout
            unplaced.append(f"{r.name}: {r.reason}")
            cells = [r.name] + ["—"] * (len(cols) - 1)
        else:
            b, c = r.breakdown, r.cost
            values = {
                "cluster": r.name,
                plan_col: plan_label(r.plan),
                "step s": f"{b.step_time_s:.2f}"
                + (f" ({b.step_time_s_p10:.2f}–{b.step_time_s_p90:.2f})" if wide and b.step_time_s_p10 else ""),
                "MFU": pct(b.mfu),
                "tax": pct(b.comm_tax),
                "share": pct(b.comm_share),
                "B tok/day": f"{c.tokens_per_day / 1e9:.1f}",
                "days": f"{c.days:.1f}",
                "$/B tok": f"{c.usd_per_B_tokens(mode):,.0f}",
                "MWh": f"{c.energy_MWh:,.0f}",
                "capex M$": f"{c.capex_usd / 1e6:.2f}",
                "fabric M$": f"{fab.usd / 1e6:.2f}" if fab is not None else "—",
            }
            cells = [values[col] for col in cols]
        if article:
            a = ARTICLE_256.get(r.job.cluster.gpu.name)
            if a is None:
                cells.append("")
            elif wide:
                cells.append(f"{a['comm_share']:.0%}·{a['tokens_per_day'] / 1e9:g}·{a['days']:g}·{a['usd_per_B']:g}")
            else:
                cells.append(f"{a['days']:g}, ${a['usd_per_B']:g}")
        t.add_row(*cells)
    if unplaced:
        t.caption = "— no plan: " + "; ".join(unplaced)
        t.caption_justify = "left"
    return t


def collective_table(pred: Any) -> Table:
    """``commtax collective``: one row per message size (``costs.predict.CollectivePrediction``)."""
    from commtax.units import format_duration, format_sig

    t = new_table(f"{pred.op} over {pred.gpus} GPUs ({pred.per_node} per node) — predicted")
    # "ch": channels NCCL runs its tuned algorithms on (enqueue.cc topoGetAlgoInfo); no column where none ran (gloo,
    # p2p); a short header keeps the table in 80 columns
    channels = any(r.get("channels") for r in pred.rows)
    for col in ("size (B)", "time", "algbw (GB/s)", "busbw (GB/s)", "algorithm", "bound by") + ("ch",) * channels:
        t.add_column(col, justify="right")
    for r in pred.rows:
        algo = f"{r['algorithm']}/{r['protocol']}" if r["protocol"] else r["algorithm"]
        t.add_row(
            f"{r['message_bytes']:.0f}",
            format_duration(r["time_s"]),
            format_sig(r["algbw_GBps"]),
            format_sig(r["busbw_GBps"]),
            algo,
            f"inter ({r['binding_link']})" if "binding_link" in r else r["bottleneck"],
            *([str(r["channels"]) if r.get("channels") else ""] if channels else []),
        )
    if getattr(pred, "note", ""):
        t.caption = pred.note
    return t
