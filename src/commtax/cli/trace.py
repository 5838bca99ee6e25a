"""``commtax trace``: a thin typer command over ``commtax.trace.analyze`` (and ``against.compare``).

Importing this module imports neither torch nor matplotlib. Bad input (a malformed trace, a bad
``--steps``) prints one line naming the file or option and the problem, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commtax.cli.io import CatalogOpt, JsonOpt, OutOpt, TraceJobOpt, emit, fail, safe_text, warn
from commtax.errors import SpecError
from commtax.units import MB

MAX_WIDTH = 100  # the table view fits 100 columns, or the terminal when it is narrower


def _table(title: str) -> Table:
    """The trace tables' one look: bold header, a rule under it, no edges or padding (every column counts at 80)."""
    return Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False, show_edge=False)


def width() -> int:
    """The terminal's columns (COLUMNS when not a terminal), at most MAX_WIDTH."""
    import shutil

    return max(40, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``a:b`` (inclusive ProfilerStep numbers), ``a:`` or ``:b``, or one step ``a``."""
    if not text:
        return None
    try:
        lo, _, hi = text.partition(":") if ":" in text else (text, ":", text)
        a = int(lo) if lo.strip() else 0
        b = int(hi) if hi.strip() else 2**62
    except ValueError:
        raise SpecError(f"--steps: expected a:b with ProfilerStep numbers (e.g. 3:7), got {text!r}") from None
    if a > b:
        raise SpecError(f"--steps: the first step ({a}) is after the last ({b})")
    return a, b


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


def trace_command(
    traces: Annotated[
        list[Path],
        typer.Argument(metavar="TRACE", help="Kineto trace files (.json or .json.gz), one per rank, or directories"),
    ],
    json_out: JsonOpt = False,
    against: Annotated[
        Optional[Path],
        typer.Option("--against", metavar="JOB.yaml", help="job YAML: show its prediction next to the measurement"),
    ] = None,
    steps: Annotated[Optional[str], typer.Option("--steps", metavar="A:B", help="only ProfilerStep#A … #B")] = None,
    job_k: TraceJobOpt = None,
    out: OutOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """Measured communication tax of a real job from PyTorch profiler traces; with --against, vs the prediction.

    Traces of several jobs (a folder of runs) give one set of tables per job; --job K keeps job K, and --against
    compares the one job of the YAML's world size (or job K)."""
    from commtax.trace.analyze import analyze, jobs_of, one_job

    try:
        from commtax.atomic import refuse_overwriting_inputs

        refuse_overwriting_inputs({"--out": out}, [*traces, against, catalog])
        step_range = parse_steps(steps)
        report = analyze(traces, step_range)
        every_job = jobs_of(report.ranks)
        cmp = None
        job = None
        if against is not None:
            from commtax.spec import load_job

            job = load_job(against, catalog)
        chosen, how = None, ""
        if job is not None or job_k is not None:  # without either, every job's tables
            report, chosen, how = one_job(report, job_k, job.cluster.num_gpus if job else None, "--against")
        if how and job_k is None:
            warn(f"--against: comparing {how}; --job K picks another")
        if job is not None:
            from commtax.trace.against import compare, job_mismatch

            for line in job_mismatch(report, job):  # on stderr too: the figures below may compare two jobs
                warn(f"--against: {line}")
            cmp = compare(report, job)
    except SpecError as e:
        fail(str(e))
    from commtax.trace.analyze import TraceReport, stragglers

    groups = jobs_of(report.ranks)
    data = report.to_dict()
    data["jobs"] = [
        {"world_size": g[0].world_size, "start_s": g[0].start_s, "files": list(dict.fromkeys(r.file for r in g))}
        for g in every_job
    ]
    if chosen is not None:
        data["job"] = chosen  # 1-based, in data["jobs"]
    if cmp is not None:
        data["against"] = cmp.to_dict()
    emit(data, json_out, out)
    if json_out:
        return
    console = Console(width=width())
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
            start = "" if t0 is None or g[0].start_s is None else f", started +{g[0].start_s - t0:.0f} s"
            files = ", ".join(safe_text(Path(f).name) for f in dict.fromkeys(r.file for r in g))
            console.print(
                f"[bold]job {k} of {len(groups)}[/bold]: world size {g[0].world_size or '?'}, "
                f"{len(g)} rank(s){start}; files: {escape(files)}",
                highlight=False,
            )
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
    if cmp is not None:
        for table in comparison_tables(cmp):
            console.print(table)
        console.print("[bold]Largest differences[/bold]")
        for line in cmp.explanations:
            console.print(f"  • {line}", highlight=False)
        for line in cmp.notes:
            console.print(f"  note: {line}", highlight=False)


def calibrate_from_trace(
    traces: list[Path], job_file: Path | None, out: Path, steps: str | None = None, catalog: Path | None = None
) -> dict:
    """``commtax calibrate --trace …``: the profile YAML a trace implies (needs the job that ran)."""
    from commtax.measure.calibrate import write_profile
    from commtax.spec import load_job
    from commtax.trace.against import profile_from_trace
    from commtax.trace.analyze import analyze

    if job_file is None:
        raise SpecError(
            "--job: calibrating from a trace needs the job YAML that ran (its model gives the FLOPs, "
            "its cluster the topology)"
        )
    job = load_job(job_file, catalog)
    report = analyze(traces, parse_steps(steps))
    profile = profile_from_trace(report, job, f"commtax calibrate --trace {', '.join(p.name for p in traces)}")
    write_profile(profile, out)
    return profile


def print_profile_summary(profile: dict, out: Path) -> None:
    eff = ", ".join(f"{k} {v:.3f}" for k, v in profile.get("gemm_efficiency", {}).items())
    typer.echo(f"GEMM efficiency: {eff}; measured compute {profile['measured_compute_s_per_step'] * 1e3:.2f} ms/step")
    if "compute_fit" in profile:
        typer.echo(f"warning: {profile['compute_fit']}")
    for m in profile.get("measured_busbw", []):
        typer.echo(
            f"{m['op']:>14} n={m['group_size']:<4} {m['message_bytes'] / MB:10.3g} MB  "
            f"{m['time_s'] * 1e3:9.3f} ms  busbw {m['busbw_GBps']:.3g} GB/s"
        )
    lv = profile.get("levels", {})
    typer.echo("links: " + ", ".join(f"{k} {v['bw_GBps']:.3g} GB/s α {v['latency_us']:.1f} µs" for k, v in lv.items()))
    typer.echo(f"wrote {safe_text(str(out))}; in a job file: `cluster: {{..., profile: {safe_text(str(out))}}}`")
