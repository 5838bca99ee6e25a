"""What ``commtax trace`` prints: per rank, per step, collectives, stragglers, and measured vs predicted.

Every table reads at 80 columns (numbers first; long file names go in a caption). ``print_trace`` prints a
``trace.traced_job.TracedJob`` on a rich console, one set of tables per job among the files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commtax.errors import safe_text
from commtax.units import MB


def _table(title: str) -> Table:
    """The trace tables' one look: bold header, a rule under it, no edges or padding (every column counts at 80)."""
    return Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False, show_edge=False)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def foreign_traces(report) -> list[str]:
    """Why the traces given together look like more than one job (world sizes differ, a rank repeats)."""
    worlds = sorted({r.world_size for r in report.ranks if r.world_size is not None})
    ranks = [r.rank for r in report.ranks if r.rank is not None]
    repeated = sorted({x for x in ranks if ranks.count(x) > 1})
    why = []
    if len(worlds) > 1:
        why.append(f"world sizes {', '.join(map(str, worlds))}")
    if repeated:
        why.append(f"rank {repeated[0]} appears {ranks.count(repeated[0])} times")
    if not why:
        return []
    return [
        f"these {len(report.ranks)} traces are not one job ({'; '.join(why)}): each row is its own file "
        "(the file column), and the straggler table compares unrelated runs; trace each job's folder on its own"
    ]


def rank_table(report) -> Table:
    t = _table("Measured per rank (ms over the traced window)")
    files = len({r.file for r in report.ranks}) > 1
    cols = ("rank", "device", "window", "compute", "comm", "overlap", "exposed", "idle", "tax", "share")
    for col in cols + (("file",) if files else ()):
        t.add_column(col, justify="left" if col in ("device", "file") else "right", no_wrap=True)
    index = {f: k for k, f in enumerate(dict.fromkeys(r.file for r in report.ranks), 1)}
    if files:  # the names are below the table (a long name would squeeze the numbers at 80 columns)
        t.caption = "  ".join(f"f{k}: {safe_text(Path(f).name)}" for f, k in index.items())
    for r in report.ranks:
        name = (f"f{index[r.file]}",) if files else ()
        t.add_row(
            "?" if r.rank is None else str(r.rank),
            r.device,
            _ms(r.window_s),
            _ms(r.compute_s),
            _ms(r.comm_s),
            _ms(r.overlapped_comm_s),
            _ms(r.exposed_comm_s),
            _ms(r.idle_s),
            _pct(r.comm_tax),
            _pct(r.comm_share),
            *name,
        )
    return t


def step_table(report) -> Table | None:
    rows = [(r, s) for r in report.ranks for s in r.steps]
    if not rows:
        return None
    t = _table("Per step (ms)")
    for col in ("rank", "step", "window", "compute", "comm", "exposed", "idle", "tax", "share"):
        t.add_column(col, justify="right", no_wrap=True)
    for r, s in rows:
        t.add_row(
            "?" if r.rank is None else str(r.rank),
            str(s.step),
            _ms(s.window_s),
            _ms(s.compute_s),
            _ms(s.comm_s),
            _ms(s.exposed_comm_s),
            _ms(s.idle_s),
            _pct(s.comm_tax),
            _pct(s.comm_share),
        )
    return t


DEEPEP_MODE = {"intranode": "nvl", "internode": "ib", "internode_ll": "ll"}  # DeepEP's normal/low-latency kernels


def _kind(c) -> str:
    """The kind with the group it names: ``all_to_all ep``; DeepEP's kernels as ``ep ll dispatch`` (mode: nvl =
    intranode, ib = internode over RDMA, ll = internode low-latency)."""
    group, kernel = getattr(c, "parallel_group", ""), getattr(c, "kernel", "")
    if kernel.startswith("deepep "):
        _, mode, phase = kernel.split(" ", 2)
        return f"{group} {DEEPEP_MODE.get(mode, mode)} {phase}"
    return f"{c.kind} {group}" if group else c.kind


def collective_table(report) -> Table | None:
    rows = [(r, c) for r in report.ranks for c in r.collectives]
    if not rows:
        return None
    t = _table("Collectives (size: nccl-tests convention)")
    for col in ("rank", "kind", "group", "size MB", "calls", "mean ms", "exposed ms", "algbw GB/s", "busbw GB/s"):
        t.add_column(col, justify="right" if col not in ("kind",) else "left", no_wrap=True)
    for r, c in rows:
        t.add_row(
            "?" if r.rank is None else str(r.rank),
            _kind(c),
            "?" if c.group_size is None else str(c.group_size),
            "?" if c.message_bytes is None else f"{c.message_bytes / MB:.3g}",
            str(c.count),
            f"{c.mean_time_s * 1e3:.3f}",
            _ms(c.exposed_s),
            "—" if c.algbw_GBps is None else f"{c.algbw_GBps:.3g}",
            "—" if c.busbw_GBps is None else f"{c.busbw_GBps:.3g}",
        )
    return t


def straggler_table(report) -> Table | None:
    if not report.stragglers:
        return None
    t = _table("Stragglers: slowest compute per step, and the others' wait in collectives")
    for col in ("step", "ranks", "slowest", "its compute ms", "median ms", "others wait ms", "max wait ms"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in report.stragglers:
        t.add_row(
            str(s.step),
            str(s.ranks),
            str(s.slowest_rank),
            _ms(s.slowest_compute_s),
            _ms(s.median_compute_s),
            _ms(s.others_wait_s),
            _ms(s.max_wait_s),
        )
    return t


def comparison_tables(cmp) -> list[Table]:
    t = _table("Measured vs predicted (per step)")
    for col in ("metric", "measured", "predicted", "measured/predicted"):
        t.add_column(col, justify="right" if col != "metric" else "left", no_wrap=True)
    for r in cmp.rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.3g}×"
        if r.metric == "mfu" and r.measured is not None and r.measured > 1:  # the job's FLOPs are not the trace's
            t.add_row(r.metric, ">100%: not this job?", _pct(r.predicted), "—")
        elif r.metric in ("comm_tax", "comm_share", "mfu"):
            t.add_row(r.metric, _pct(r.measured), _pct(r.predicted), ratio)
        else:
            t.add_row(
                r.metric.removesuffix("_s") + " ms",
                "—" if r.measured is None else _ms(r.measured),
                "—" if r.predicted is None else _ms(r.predicted),
                ratio,
            )
    out = [t]
    if cmp.collectives:
        c = _table("Collectives: measured vs predicted")
        for col in ("kind", "group", "n", "size MB", "meas ms", "pred ms", "meas busbw", "pred busbw", "ratio"):
            c.add_column(col, justify="right" if col != "kind" else "left", no_wrap=True)
        for x in cmp.collectives:
            c.add_row(
                x.kind,
                x.group,
                str(x.group_size),
                f"{x.message_bytes / MB:.3g}",
                f"{x.measured_time_s * 1e3:.3f}",
                f"{x.predicted_time_s * 1e3:.3f}",
                "—" if x.measured_busbw_GBps is None else f"{x.measured_busbw_GBps:.3g}",
                "—" if x.predicted_busbw_GBps is None else f"{x.predicted_busbw_GBps:.3g}",
                "—" if x.busbw_ratio is None else f"{100 * x.busbw_ratio:.0f}%",
            )
        out.append(c)
    return out


def print_trace(t: Any, console: Console, warn: Callable[[str], None]) -> None:
    """The tables of ``t`` (a ``TracedJob``): per job when the files hold several, what each rank's trace lacks,
    and with a job YAML, measured vs predicted and the largest differences. ``warn`` hears what is doubtful about
    the files (several jobs, or traces that look like more than one job)."""
    from commtax.trace.analyze import TraceReport, stragglers

    report, groups = t.report, t.groups()
    if len(groups) > 1:
        warn(
            f"these {len(report.ranks)} traces are {len(groups)} jobs (by world size and start time): "
            "one set of tables per job"
        )
    else:
        for line in foreign_traces(report):
            warn(line)
    t0 = min((r.start_s for r in report.ranks if r.start_s is not None), default=None)
    for k, g in enumerate(groups, 1):
        sub = report if len(groups) == 1 else TraceReport(ranks=g, stragglers=stragglers(g))
        if len(groups) > 1:
            console.print(job_header(k, len(groups), g, t0), highlight=False)
        for table in (rank_table(sub), step_table(sub), collective_table(sub), straggler_table(sub)):
            if table is not None:
                console.print(table)
    for r in report.ranks:
        for m in r.missing:
            console.print(
                f"[yellow]rank {'?' if r.rank is None else r.rank} ({escape(safe_text(Path(r.file).name))}):[/yellow] "
                f"{escape(safe_text(m))}",
                highlight=False,
            )
    if t.comparison is not None:
        print_comparison(t.comparison, console)


def job_header(k: int, n: int, ranks: list, t0: float | None) -> str:
    """``job 2 of 5: world size 8, 1 rank(s), started +12 s; files: …`` (rich markup)."""
    start = "" if t0 is None or ranks[0].start_s is None else f", started +{ranks[0].start_s - t0:.0f} s"
    files = ", ".join(safe_text(Path(f).name) for f in dict.fromkeys(r.file for r in ranks))
    return (
        f"[bold]job {k} of {n}[/bold]: world size {ranks[0].world_size or '?'}, "
        f"{len(ranks)} rank(s){start}; files: {escape(files)}"
    )


def print_comparison(cmp: Any, console: Console) -> None:
    """Measured vs predicted (``trace.against.Comparison``) and the largest differences, explained."""
    for table in comparison_tables(cmp):
        console.print(table)
    console.print("[bold]Largest differences[/bold]")
    for line in cmp.explanations:
        console.print(f"  • {line}", highlight=False)
    for line in cmp.notes:
        console.print(f"  note: {line}", highlight=False)
