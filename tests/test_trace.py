"""`commtax trace` on real Kineto traces: figures vs an independent sweep and vs HTA, collectives, steps,
stragglers, malformed input, the table width and the JSON schema."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from commtax.cli.trace import trace_command
from commtax.errors import SpecError
from commtax.trace import analyze, reader

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
SHARED = [
    "a100-128gpu-sampled-rank0",
    "a100-128gpu-sampled-rank1",
    "a100-1gpu-train",
    "a100-2gpu-allreduce-rank0",
    "a100-8gpu-rank3",
    "mi250-toy-train",
]


def shared(name: str) -> Path:
    p = TRACES / f"{name}.json.gz"
    if not p.exists():
        pytest.skip(f"shared traces not found at {TRACES} (shared/ sits beside the repo)")
    return p


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    app.command("trace")(trace_command)

    @app.callback()
    def _root() -> None:
        """commtax"""

    return app


# ----------------------------------------------------------------------------- an independent computation
def sweep(path: Path) -> dict[str, float]:
    """The definitions, computed a second way: json.load, then one sweep over every start/end boundary,
    counting how many compute, communication and other GPU events are active on each elementary segment."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    t0 = min(e["ts"] for e in gpu)
    bounds = []
    for e in gpu:
        comm = re.match(r"nccl.*kernel", e["name"], re.IGNORECASE)
        kind = "other" if e["cat"] != "kernel" else ("comm" if comm else "compute")
        s, end = e["ts"] - t0, e["ts"] - t0 + e["dur"]
        bounds += [(s, 1, kind), (end, -1, kind)]
    bounds.sort(key=lambda b: (b[0], -b[1]))
    active = {"compute": 0, "comm": 0, "other": 0}
    out = {"compute": 0.0, "comm": 0.0, "both": 0.0, "busy": 0.0}
    prev = bounds[0][0]
    for t, delta, kind in bounds:
        dt = t - prev
        if dt > 0:
            out["compute"] += dt * (active["compute"] > 0)
            out["comm"] += dt * (active["comm"] > 0)
            out["both"] += dt * (active["compute"] > 0 and active["comm"] > 0)
            out["busy"] += dt * (sum(active.values()) > 0)
        active[kind] += delta
        prev = t
    window = max(e["ts"] - t0 + e["dur"] for e in gpu)
    return {k: v * 1e-6 for k, v in {**out, "window": window}.items()}


@pytest.mark.parametrize("name", SHARED)
def test_figures_equal_an_independent_sweep(name):
    r = analyze(shared(name)).ranks[0]
    ref = sweep(shared(name))
    assert r.window_s == pytest.approx(ref["window"], rel=1e-9)
    assert r.compute_s == pytest.approx(ref["compute"], rel=1e-9)
    assert r.comm_s == pytest.approx(ref["comm"], rel=1e-9, abs=1e-12)
    assert r.overlapped_comm_s == pytest.approx(ref["both"], rel=1e-9, abs=1e-12)
    assert r.exposed_comm_s == pytest.approx(ref["comm"] - ref["both"], rel=1e-9, abs=1e-12)
    assert r.idle_s == pytest.approx(ref["window"] - ref["busy"], rel=1e-9)
    assert r.comm_tax == pytest.approx((ref["comm"] - ref["both"]) / ref["window"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "name",
    [
        "a100-128gpu-sampled-rank0",
        "a100-128gpu-sampled-rank1",
        "a100-1gpu-train",
        "a100-2gpu-allreduce-rank0",
        "a100-8gpu-rank3",
        "mi250-toy-train",
    ],
)
def test_figures_equal_holistic_trace_analysis(name, tmp_path, monkeypatch):
    """HTA's temporal breakdown and comm-comp overlap, on the same trace: kernel_time = our window,
    idle and compute equal, overlap % = overlapped / comm. HTA rounds ns timestamps to µs unless told not to,
    and drops the last step unless told to keep it."""
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    shutil.copy(shared(name), tmp_path)
    a = hta.TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    tb = a.get_temporal_breakdown(visualize=False).iloc[0]
    r = analyze(shared(name)).ranks[0]
    assert r.window_s * 1e6 == pytest.approx(tb["kernel_time(us)"], rel=1e-9)
    assert r.idle_s * 1e6 == pytest.approx(tb["idle_time(us)"], rel=1e-9)
    assert r.compute_s * 1e6 == pytest.approx(tb["compute_time(us)"], rel=1e-9)
    if r.comm_s > 0:
        overlap_pct = a.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"]
        assert round(100 * r.overlapped_comm_s / r.comm_s, 2) == pytest.approx(overlap_pct, abs=0.006)


def test_one_gpu_job_has_no_communication():
    r = analyze(shared("a100-1gpu-train")).ranks[0]
    assert (r.comm_s, r.exposed_comm_s, r.comm_tax, r.comm_share) == (0, 0, 0, 0)
    assert r.compute_s > 0.9 * (r.window_s - r.idle_s - r.memcpy_s)  # a compute-bound job
    assert [s.step for s in r.steps] == [101, 102, 103, 104, 105]


def test_amd_trace_is_read_and_says_what_it_lacks():
    r = analyze(shared("mi250-toy-train")).ranks[0]
    assert r.device == "gpu:2" and r.device_name == "AMD Radeon Graphics"
    assert r.compute_s > 0 and r.comm_s == 0
    assert r.rank is None and any("no distributedInfo" in m for m in r.missing)


def test_message_sizes_from_kernel_args():
    """NCCL 2.17 kernels carry `In msg nelems` and `dtype`: 6,637,568 floats = 26,550,272 B; 2 ranks."""
    r = analyze(shared("a100-2gpu-allreduce-rank0")).ranks[0]
    rows = {(c.kind, c.message_bytes): c for c in r.collectives}
    ar = rows[("all_reduce", 6637568 * 4)]
    assert ar.group_size == 2 and ar.count == 3 and ar.size_source == "kernel args"
    assert ar.algbw_GBps == pytest.approx(ar.message_bytes * 3 / ar.time_s / 1e9)
    assert ar.busbw_GBps == pytest.approx(ar.algbw_GBps * 2 * (2 - 1) / 2)  # all_reduce bus factor 2(n-1)/n
    assert sum(c.count for c in r.collectives if c.kind == "all_reduce") == 15
    assert sum(c.count for c in r.collectives if c.kind == "broadcast") == 6


def test_message_sizes_from_linked_record_param_comms():
    """Older traces: the size is on the record_param_comms CPU op (Input Dims [[339738624]], unsigned char)."""
    r = analyze(shared("a100-128gpu-sampled-rank1")).ranks[0]
    sized = [c for c in r.collectives if c.message_bytes == 339738624]
    assert sized and sized[0].size_source == "record_param_comms" and sized[0].kind == "send_recv"
    assert any("carry no message size" in m for m in r.missing)  # some ops were recorded without shapes


def test_trace_without_sizes_says_so():
    r = analyze(shared("a100-8gpu-rank3")).ranks[0]
    assert all(c.message_bytes is None and c.busbw_GBps is None for c in r.collectives)
    assert any("60 of 60 collectives carry no message size" in m for m in r.missing)
    assert {c.kind for c in r.collectives} == {"all_reduce", "send_recv"}


def test_steps_and_step_range():
    whole = analyze(shared("a100-8gpu-rank3")).ranks[0]
    assert [s.step for s in whole.steps] == list(range(1009, 1015))
    part = analyze(shared("a100-8gpu-rank3"), (1010, 1011)).ranks[0]
    assert [s.step for s in part.steps] == [1010, 1011]
    by_step = {s.step: s for s in whole.steps}
    for s in part.steps:  # a step's figures do not depend on what else was read
        assert s.comm_s == pytest.approx(by_step[s.step].comm_s)
    assert part.window_s < whole.window_s / 2


def test_stragglers_two_ranks():
    rep = analyze([shared("a100-128gpu-sampled-rank0"), shared("a100-128gpu-sampled-rank1")])
    assert [s.step for s in rep.stragglers] == [551, 552]
    for s in rep.stragglers:
        steps = {r.rank: next(x for x in r.steps if x.step == s.step) for r in rep.ranks}
        slow = max(steps, key=lambda k: steps[k].compute_s)
        other = 1 - slow
        assert s.slowest_rank == slow
        assert s.others_wait_s == pytest.approx(max(0.0, steps[other].exposed_comm_s - steps[slow].exposed_comm_s))


def test_directory_reads_every_trace():
    if not TRACES.exists():
        pytest.skip("shared traces not found")
    rep = analyze(TRACES)
    assert len(rep.ranks) == len(SHARED)


# ----------------------------------------------------------------------------- streaming
def test_small_chunks_give_the_same_figures(monkeypatch):
    """Every event straddles a chunk boundary: the refill logic must not change a number."""
    path = shared("a100-2gpu-allreduce-rank0")
    ref = analyze(path).to_dict()
    monkeypatch.setattr(reader, "CHUNK_CHARS", 97)
    assert analyze(path).to_dict() == ref


def test_bare_array_and_plain_json(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 0, "dur": 10, "args": {}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)",
            "pid": 0,
            "tid": 9,
            "ts": 5,
            "dur": 10,
            "args": {
                "Collective name": "_allgather_base",
                "In msg nelems": 100,
                "Out msg nelems": 400,
                "dtype": "BFloat16",
                "Group size": 4,
            },
        },
    ]
    (tmp_path / "a.json").write_text(json.dumps(events))
    r = analyze(tmp_path / "a.json").ranks[0]
    # compute [0,10), comm [5,15): window 15 µs, overlap 5, exposed 5
    assert (r.window_s, r.compute_s, r.comm_s, r.overlapped_comm_s, r.exposed_comm_s) == pytest.approx(
        (15e-6, 10e-6, 10e-6, 5e-6, 5e-6)
    )
    assert r.comm_tax == pytest.approx(5 / 15) and r.comm_share == pytest.approx(10 / 20)
    c = r.collectives[0]
    assert (c.kind, c.message_bytes, c.group_size) == ("all_gather", 400 * 2, 4)  # all_gather: the output buffer
    assert c.busbw_GBps == pytest.approx(800 / 10e-6 / 1e9 * 3 / 4)  # (n-1)/n


# ----------------------------------------------------------------------------- CLI
def test_table_fits_100_columns(app):
    res = CliRunner().invoke(
        app, ["trace", str(shared("a100-2gpu-allreduce-rank0")), str(shared("a100-8gpu-rank3"))], terminal_width=200
    )
    assert res.exit_code == 0, res.output
    assert "Measured per rank" in res.output and "all_reduce" in res.output
    assert max(len(line) for line in res.stdout.splitlines()) <= 100  # stderr: one line per warning, by design


def test_json_schema(app):
    res = CliRunner().invoke(app, ["trace", str(shared("a100-8gpu-rank3")), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    rank = data["ranks"][0]
    for key in (
        "file",
        "rank",
        "world_size",
        "device",
        "window_s",
        "compute_s",
        "comm_s",
        "overlapped_comm_s",
        "exposed_comm_s",
        "idle_s",
        "comm_tax",
        "comm_share",
        "steps",
        "collectives",
    ):
        assert key in rank
    assert (rank["rank"], rank["world_size"]) == (3, 8)
    assert set(rank["steps"][0]) >= {"step", "window_s", "comm_tax", "exposed_comm_s"}


def _gz(path: Path, text: str, cut: int | None = None) -> Path:
    data = gzip.compress(text.encode())
    path.write_bytes(data[:cut] if cut else data)
    return path


GOOD = json.dumps(
    {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i * 10, "dur": 5, "args": {}}
            for i in range(2000)
        ]
    }
)


def _text(name: str, text: str):
    def make(d: Path) -> Path:
        (d / name).write_text(text)
        return d / name

    return make


EVENT = '{"ph": "X", "name": "k", "cat": "kernel", "ts": %s, "dur": 1%s}'


@pytest.mark.parametrize(
    "make, problem",
    [
        (_text("empty.json", ""), "empty file"),
        (_text("prose.json", "hello, world"), "not a JSON trace"),
        (lambda d: _gz(d / "trunc.json.gz", GOOD, cut=3000), "truncated or corrupt gzip"),
        (_text("cut.json", GOOD[: len(GOOD) // 2]), "cut short"),
        (_text("noev.json", '{"schemaVersion": 1}'), "no traceEvents"),
        (_text("evstr.json", '{"traceEvents": "x"}'), "traceEvents is a str"),
        (_text("ts.json", '{"traceEvents": [%s]}' % (EVENT % ('"12"', ""))), "'ts' is a str, expected a number"),
        (_text("args.json", '{"traceEvents": [%s]}' % (EVENT % ("1", ', "args": [1]'))), "'args' is a list"),
        (_text("elem.json", '{"traceEvents": [3]}'), "traceEvents[0] is a int"),
        (lambda d: d / "missing.json", "file not found"),
    ],
)
def test_malformed_input_is_one_line_exit_2(app, tmp_path, make, problem):
    path = make(tmp_path)
    res = CliRunner().invoke(app, ["trace", str(path)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and problem in lines[0], res.output
    assert "Traceback" not in res.output


def test_bad_steps_option(app):
    res = CliRunner().invoke(app, ["trace", str(shared("a100-8gpu-rank3")), "--steps", "9:x"])
    assert res.exit_code == 2 and "--steps" in res.output
    res = CliRunner().invoke(app, ["trace", str(shared("a100-8gpu-rank3")), "--steps", "1:5"])
    assert res.exit_code == 2 and "1009" in res.output  # names the steps the trace has


# ----------------------------------------------------------------------------- against / calibrate
A100_PAIR = {
    "model": "llama2-7b",
    "cluster": {
        "gpu": "a100-sxm4-40gb",
        "num_gpus": 2,
        "gpus_per_node": 2,
        "intra_node": "nvlink3",
        "inter_node": "ib-hdr",
        "nics_per_node": 1,
    },
    "plan": {"tp": 1, "pp": 1, "zero": 0, "micro_batch": 1},
    "training": {"seq_len": 2048, "global_batch": 2, "precision": "bf16"},
}


def test_against_puts_prediction_beside_measurement(app, tmp_path):
    import yaml

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(A100_PAIR))
    res = CliRunner().invoke(app, ["trace", str(shared("a100-2gpu-allreduce-rank0")), "--against", str(job), "--json"])
    assert res.exit_code == 0, res.output
    against = json.loads(res.output)["against"]
    rows = {r["metric"]: r for r in against["rows"]}
    steps = json.loads(res.output)["ranks"][0]["steps"]
    assert rows["comm_tax"]["measured"] == pytest.approx(sum(s["comm_tax"] for s in steps) / len(steps))
    assert rows["comm_tax"]["predicted"] == pytest.approx(against["predicted"]["comm_tax"])
    ar = [c for c in against["collectives"] if c["kind"] == "all_reduce"]
    assert {c["group"] for c in ar} == {"dp"} and all(c["group_size"] == 2 for c in ar)
    for c in ar:  # the predicted column is `commtax collective` for that size on that group
        from commtax.costs.collectives import collective_cost
        from commtax.costs.topology import group_placement
        from commtax.spec import load_job

        j = load_job(A100_PAIR)
        assert c["predicted_time_s"] == pytest.approx(
            collective_cost("all_reduce", c["message_bytes"], group_placement(j, "dp", "all_reduce")).time_s
        )
    assert against["explanations"] and "predicted" in against["explanations"][0]


def test_calibrate_from_a_gpu_trace_refuses_links_timed_by_waiting(tmp_path):
    """NCCL kernels in this trace run 10-30x under NVLink3 even at their fastest call (they wait for the peer
    and share the GPU with compute): a link fitted to them would make every estimate that reads it slower."""
    import yaml

    from commtax.spec import load_job
    from commtax.trace.against import calibration_records
    from commtax.trace.traced_job import calibrate_from_trace

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(A100_PAIR))
    recs = calibration_records(analyze(shared("a100-2gpu-allreduce-rank0")), load_job(job))
    sizes = sorted(r["message_bytes"] for r in recs if r["op"] == "all_reduce")
    assert sizes == [8196000, 9724160, 26255360, 26550272, 31502336]
    out = tmp_path / "profile.yaml"
    with pytest.raises(SpecError, match=r"intra link fits at .* under 1/10 of the job's .*waiting for peers"):
        calibrate_from_trace([shared("a100-2gpu-allreduce-rank0")], job, out)
    assert not out.exists()


def test_calibrate_from_a_trace_of_another_job_is_refused(tmp_path):
    """The 2-GPU A100 trace against the 256-GPU H100 example: world size and device both differ."""
    from commtax.trace.traced_job import calibrate_from_trace

    out = tmp_path / "profile.yaml"
    with pytest.raises(SpecError, match=r"world size \(2\) is not the job's num_gpus \(256\)"):
        calibrate_from_trace([shared("a100-2gpu-allreduce-rank0")], REPO / "examples/llama2-70b-h100.yaml", out)
    assert not out.exists()


def test_against_warns_on_a_trace_of_another_gpu():
    from commtax.spec import load_job
    from commtax.trace.against import job_mismatch

    pair = {**A100_PAIR, "cluster": {**A100_PAIR["cluster"], "gpu": "h100-sxm5-80gb"}}
    notes = job_mismatch(analyze(shared("a100-2gpu-allreduce-rank0")), load_job(pair))
    assert notes == ["the trace ran on NVIDIA A100-PG509-200, not the job's h100-sxm5-80gb: is this the job that ran?"]
    assert job_mismatch(analyze(shared("a100-2gpu-allreduce-rank0")), load_job(A100_PAIR)) == []


def test_measured_breakdown_is_comparable_field_by_field():
    from commtax.spec import load_job
    from commtax.trace.against import measured_breakdown

    rep = analyze(shared("a100-2gpu-allreduce-rank0"))
    b = measured_breakdown(rep, load_job(A100_PAIR))
    r = rep.ranks[0]
    assert b.source == "trace"
    assert b.step_time_s == pytest.approx(r.step_time_s)  # the parts (idle included) add up to the step
    mean = lambda name: sum(getattr(s, name) for s in r.steps) / len(r.steps)
    assert b.breakdown_s["compute"] == pytest.approx(mean("compute_s"))
    assert b.breakdown_s["dp_exposed"] + b.breakdown_s["idle"] + b.breakdown_s["compute"] == pytest.approx(
        b.step_time_s - sum(v for k, v in b.breakdown_s.items() if k not in ("dp_exposed", "idle", "compute"))
    )
    assert b.comm_tax == pytest.approx(b.breakdown_s["dp_exposed"] / b.step_time_s)
    assert b.comm_bytes_per_gpu["dp"] > 0 and b.tokens_per_s == pytest.approx(2 * 2048 / b.step_time_s)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),  # NCCL 2.17
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),  # NCCL ≥ 2.19
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "send_recv"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
        ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", None),  # the op is only in the args
        ("rcclKernel_AllToAll(ncclDevComm*)", "all_to_all"),  # an rccl-prefixed name (RCCL also keeps nccl names)
    ],
)
def test_communication_kernel_names(name, kind):
    from commtax.trace.collect import COMM_KERNEL, kernel_op

    assert COMM_KERNEL.match(name) and kernel_op(name) == kind


@pytest.mark.parametrize(
    "name",
    [
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>(Params)",
        "Cijk_Alik_Bljk_SB_MT64x16x32_MI16x16x1",
        "nchwToNhwcKernel",
    ],
)
def test_compute_kernel_names(name):
    from commtax.trace.collect import COMM_KERNEL

    assert not COMM_KERNEL.match(name)


@pytest.mark.parametrize(
    "collective, kind",
    [
        ("allreduce", "all_reduce"),
        ("_allgather_base", "all_gather"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("alltoall_base", "all_to_all"),
        ("send", "send_recv"),
        ("recv", "send_recv"),
        ("broadcast", "broadcast"),
        ("barrier", "other"),
    ],
)
def test_c10d_collective_names(collective, kind):
    from commtax.trace.collect import op_kind

    assert op_kind(collective) == kind


def test_interval_union_and_intersection_by_hand():
    from commtax.trace import intervals as iv

    u = iv.union([0, 2, 10, 11, 20], [3, 5, 12, 11.5, 20])  # [0,5) [10,12) and an empty one at 20
    assert list(u[0]) == [0, 10, 20] and list(u[1]) == [5, 12, 20] and iv.length(u) == 7
    other = iv.union([4, 11.5], [10.5, 30])  # [4,10.5) [11.5,30)
    assert iv.intersection_length(u, other) == pytest.approx(1 + 0.5 + 0.5)  # [4,5) [10,10.5) [11.5,12)
    assert iv.intersection_length(u, iv.EMPTY) == 0


def test_against_another_job_warns_and_never_states_mfu_as_a_time(app):
    """A100 pair trace vs the 256-GPU H100 example: two warnings on stderr, MFU over 100% shown as impossible,
    and the differences in words are times only (MFU is a ratio: no "mfu took 0.24x the predicted time")."""
    res = CliRunner().invoke(
        app,
        ["trace", str(shared("a100-2gpu-allreduce-rank0")), "--against", str(REPO / "examples/llama2-70b-h100.yaml")],
        terminal_width=200,
    )
    assert res.exit_code == 0, res.output
    assert "warning: --against: the trace's world size (2) is not the job's num_gpus (256)" in res.stderr
    assert "not the job's h100-sxm5-80gb" in res.stderr
    assert ">100%: not this job?" in res.stdout and "mfu took" not in res.stdout


def test_tables_fit_80_columns_and_a_folder_of_unrelated_traces_says_so(app, tmp_path, monkeypatch):
    """At 80 columns every line fits and no number is cut ("…"); three traces of three jobs are three jobs'
    tables (grouped by world size and start time), each naming its file, with a warning saying so."""
    for name in ("a100-2gpu-allreduce-rank0", "a100-8gpu-rank3", "a100-128gpu-sampled-rank0"):
        shutil.copy(shared(name), tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    res = CliRunner().invoke(app, ["trace", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and not any("…" in line for line in lines)
    text = " ".join(res.stdout.split())
    assert text.count("Measured per rank") == 3
    for world, name in ((2, "a100-2gpu-allreduce-rank0"), (8, "a100-8gpu-rank3"), (128, "a100-128gpu-sampled-rank0")):
        assert f"world size {world}, 1 rank(s)" in text and f"files: {name}.json.gz" in text
    assert "these 3 traces are 3 jobs (by world size and start time)" in " ".join(res.stderr.split())
