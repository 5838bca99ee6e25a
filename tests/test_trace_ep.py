"""`commtax trace` names all-to-all kernels as expert-parallel communication (group ``ep``): NCCL's SendRecv
kernels behind a c10d all_to_all, RCCL's AllToAll, DeepEP's dispatch/combine; small synthetic Kineto traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from commtax.cli.trace import trace_command
from commtax.trace import analyze

REPO = Path(__file__).resolve().parents[1]

DEEPEP = [
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, int*, int**, int, void**, int**, int)",  # noqa: E501
    "void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*, int*, long*, float*, int*, int4 const*)",
    "void deep_ep::internode::dispatch<true, 2, 8, 7168, 16>(int4*, float*, long*, float*, int4*)",
    "void deep_ep::internode_ll::dispatch<true, 3, 10, 7168>(void*, float*, int*, long*, int*, int*)",
    "void deep_ep::internode_ll::combine<3, 10, 7168, 9>(void*, void*, int*, void const*, long const*)",
]


def kernel(name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {
        "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
        "args": {"device": 0, "correlation": corr, **args},
    }  # fmt: skip


def launch(ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 11, "ts": ts, "dur": 1,
            "args": {"correlation": corr}}  # fmt: skip


def param_comms(ts: float, name: str, numel: int, group: int) -> dict:
    return {
        "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 11, "ts": ts, "dur": 1,
        "args": {"Collective name": name, "In msg nelems": numel, "Out msg nelems": numel, "dtype": "BFloat16",
                 "Group size": group},
    }  # fmt: skip


def write(tmp_path: Path, events: list[dict]) -> Path:
    p = tmp_path / "ep.json"
    p.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 8}}))
    return p


@pytest.fixture
def ep_trace(tmp_path) -> Path:
    """One MoE layer on rank 0 of 8: a GEMM, an NCCL all-to-all (a SendRecv kernel behind c10d's all_to_all of
    1 Mi bf16 elements over 8 ranks), a GEMM, then DeepEP's kernels, 100 µs each; and a PP send (SendRecv, no
    all_to_all op) that must stay send_recv."""
    ev = [
        kernel("void cutlass::Kernel<gemm>(Params)", 0, 100, 1),
        launch(150, 2),
        param_comms(149, "all_to_allv", 2**20, 8),
    ]
    ev.append(kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 200, 100, 2))
    ev.append(kernel("rcclKernel_AllToAll(ncclDevComm*)", 350, 100, 3))
    for i, name in enumerate(DEEPEP):
        ev.append(kernel(name, 500 + 200 * i, 100, 10 + i))
    ev.append(kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 2000, 100, 30))
    return write(tmp_path, ev)


def test_all_to_all_kernels_are_expert_parallel(ep_trace):
    r = analyze(ep_trace).ranks[0]
    ep = [c for c in r.collectives if c.parallel_group == "ep"]
    assert {c.kind for c in ep} == {"all_to_all"}
    assert sum(c.count for c in ep) == 2 + len(DEEPEP)  # NCCL SendRecv behind all_to_all, RCCL AllToAll, DeepEP
    nccl = [c for c in ep if c.message_bytes is not None]
    assert len(nccl) == 1 and nccl[0].message_bytes == 2**20 * 2  # bf16: 2 B per element
    assert nccl[0].group_size == 8 and nccl[0].size_source == "record_param_comms"
    assert nccl[0].busbw_GBps == pytest.approx(nccl[0].algbw_GBps * 7 / 8)  # all_to_all bus factor (n − 1)/n
    pp = [c for c in r.collectives if c.kind == "send_recv"]
    assert len(pp) == 1 and pp[0].parallel_group == "" and pp[0].count == 1  # a plain send stays a send
    assert r.comm_by_kind_s["all_to_all"] == pytest.approx((2 + len(DEEPEP)) * 100e-6)


def test_deepep_kernels_are_named_by_mode_and_phase(ep_trace):
    kernels = {c.kernel: c for c in analyze(ep_trace).ranks[0].collectives if c.kernel}
    assert set(kernels) == {
        "deepep intranode notify_dispatch",
        "deepep intranode dispatch",
        "deepep internode dispatch",
        "deepep internode_ll dispatch",
        "deepep internode_ll combine",
    }
    assert all(c.message_bytes is None and c.size_source == "unknown" for c in kernels.values())  # no size args


@pytest.mark.parametrize(
    "name, expected",
    [
        ("void deep_ep::intranode::combine<bf16, 8, 768>(bf16*, float*)", "deepep intranode combine"),
        ("void deep_ep::internode::cached_notify<8>(int, int)", "deepep internode cached_notify"),
        ("void deep_ep::internode_ll::clean_low_latency_buffer<256>(int*, int, int*, int)", None),
        ("void cutlass::Kernel<deep_gemm>(Params)", None),
        ("deep_epilogue_kernel", None),
    ],
)
def test_deepep_kernel_names(name, expected):
    from commtax.trace.collect import ep_kernel

    got = ep_kernel(name)
    if name.startswith("void deep_ep::internode_ll::clean"):
        expected = "deepep internode_ll clean_low_latency_buffer"
    assert got == expected


def test_the_trace_table_says_ep(ep_trace):
    app = typer.Typer()
    app.command("trace")(trace_command)

    @app.callback()
    def _root() -> None:
        """commtax"""

    res = CliRunner().invoke(app, ["trace", str(ep_trace)], terminal_width=100)
    assert res.exit_code == 0, res.output
    assert "all_to_all ep" in res.output and "ep ll dispatch" in res.output and "ep ib dispatch" in res.output


def test_against_puts_all_to_all_on_the_ep_group():
    from commtax.trace.against import group_of

    assert group_of(None, "all_to_all", 8) == "ep"  # the kind alone says it: no plan needed


def test_the_measured_breakdown_puts_the_all_to_alls_on_ep(ep_trace):
    """trace --against: the measured Breakdown of an MoE trace has ep_exposed and ep link time, as the estimate."""
    from commtax.spec import load_job
    from commtax.trace.against import measured_breakdown

    job = load_job(REPO / "examples" / "moe" / "deepseek-v3-h800.yaml")
    b = measured_breakdown(analyze(ep_trace), job)
    assert b.breakdown_s["ep_exposed"] == pytest.approx((2 + len(DEEPEP)) * 100e-6)  # nothing overlaps them
    assert b.comm_time_s["ep"] == pytest.approx((2 + len(DEEPEP)) * 100e-6)
    assert b.comm_bytes_per_gpu["ep"] == pytest.approx(2**20 * 2)  # only the NCCL one carries a size
