"""``commtax cluster``, ``commtax bench`` and ``commtax calibrate``: thin typer commands over commtax.measure.

Importing this module does not import torch (the estimate path stays instant); each command
imports what it needs. Bad input prints one line naming the option and the fix, exit 2.
Also runnable as ``python -m commtax.cli.measure …`` (that is how torchrun relaunches a sweep).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal, NoReturn, Optional

import typer

from commtax.cli.io import (  # user_errors: SpecError/OSError: one line, exit 2; Ctrl-C/SIGTERM: exit 130
    choice_list,
    fail,
    safe_text,
    user_errors,
)
from commtax.costs.collectives import OPS

cluster_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Emulated multi-node cluster: network namespaces + tc"
)
bench_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Measure collectives, p2p copies and GEMMs (torch.distributed)"
)
# the bench commands' watchdog: one step longer than this and a peer is named dead or hung
StepTimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1, help="seconds one step may take before a peer is declared dead/hung")
]
IMPLS = ("torch", "ring", "rhd", "tree", "hier")  # torch: the library's own; the rest: commtax.measure.algorithms
GEMM_DTYPES = ("fp32", "bf16", "fp16")

DEFAULT_CLUSTER_FILE = Path("emulated_cluster.yaml")
ClusterFile = Annotated[Path, typer.Option("--cluster", help="cluster YAML written by `commtax cluster up`")]


def _bytes(option: str, text: str) -> int:
    from commtax.units import parse_bytes

    try:
        return int(parse_bytes(text))
    except ValueError as e:
        fail(f"{option}: {e}")


def _read_cluster(path: Path) -> dict:
    from commtax.errors import SpecError
    from commtax.measure.calibrate import read_cluster

    try:
        return read_cluster(path)
    except SpecError as e:  # missing, unreadable, not UTF-8, an alias bomb, not a mapping: one line
        fail(str(e))


def _check_out(out: Path) -> None:
    """An output that cannot be written fails now, before any cluster is built or rank launched."""
    from commtax.atomic import check_writable
    from commtax.errors import SpecError

    try:
        check_writable(out)
    except SpecError as e:
        fail(f"--out: {e}")


def _refuse_live_record(out: Path) -> None:
    """`up --out F` must not overwrite the only record of a cluster that still exists."""
    from commtax.measure.cluster import live_cluster_recorded_in

    old = live_cluster_recorded_in(out)
    if old is not None:
        fail(
            f"--out: {out} records cluster {old.name}, which still exists; `commtax cluster down --cluster {out}` "
            "first, or choose another --out"
        )


# ---------------------------------------------------------------------------- cluster
# `cluster up`'s options: what each node is, its link, the fabric above the nodes, the shaped queue, TCP
NodesOpt = Annotated[int, typer.Option("--nodes", min=1, max=200, help="network namespaces, one per node")]
RanksPerNodeOpt = Annotated[int, typer.Option("--ranks-per-node", min=1, max=64, help="torchrun processes per node")]
LinkOpt = Annotated[
    str,
    typer.Option(
        "--link",
        help="each node's link rate per direction, tc units: 300mbit, 1gbit; or one per node: 1gbit,500mbit",
    ),
]
NodeSpeedOpt = Annotated[
    Optional[str],
    typer.Option(
        "--node-speed",
        metavar="X,...",
        help="CPUs per rank of each node, e.g. 1,0.5 (a cgroup CPU quota per node; priced as one pool per node)",
    ),
]
UplinkOpt = Annotated[
    Optional[str],
    typer.Option(
        "--uplink",
        help="oversubscribed uplink between two halves of the nodes, e.g. 200mbit (the legacy form of "
        "--leaves 2 --spine RATE, written as uplink_Gbps)",
    ),
]
LeavesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--leaves",
        min=1,
        max=200,
        help="leaf bridges, nodes/leaves consecutive nodes under each; written as a fabric: section",
    ),
]
SpineOpt = Annotated[
    Optional[str],
    typer.Option("--spine", help="rate of each leaf's shaped link to the spine, per direction, e.g. 200mbit"),
]
MtuOpt = Annotated[int, typer.Option("--mtu", min=576, max=65000, help="MTU of every veth")]
QueueMsOpt = Annotated[
    Optional[float],
    typer.Option(
        "--queue-ms",
        help="queue each shaped link holds, in ms of traffic at its rate (tc tbf latency), written as the fabric's "
        "standing queue; default: a deep 100 ms that TCP does not fill, no queue priced",
    ),
]
TcpOpt = Annotated[
    Optional[str],
    typer.Option("--tcp", help="TCP congestion control in every node: reno, cubic or bbr (default: the host's)"),
]
DuplexProbeOpt = Annotated[
    bool,
    typer.Option(
        "--duplex-probe/--no-duplex-probe",
        help="measure gloo all_to_all's duplex κ between nodes 0 and 1 (a few seconds; inter_node.gloo_a2a_duplex)",
    ),
]


@cluster_app.command("up")
@user_errors
def cluster_up(
    nodes: NodesOpt = 2,
    ranks_per_node: RanksPerNodeOpt = 1,
    link: LinkOpt = "1gbit",
    node_speed: NodeSpeedOpt = None,
    uplink: UplinkOpt = None,
    leaves: LeavesOpt = None,
    spine: SpineOpt = None,
    mtu: MtuOpt = 9000,
    queue_ms: QueueMsOpt = None,
    tcp: TcpOpt = None,
    out: Annotated[Path, typer.Option("--out", help="cluster YAML to write")] = DEFAULT_CLUSTER_FILE,
    duplex_probe: DuplexProbeOpt = True,
) -> None:
    """Build the cluster, measure it, write the cluster YAML that `estimate`, `collective` and `bench` share."""
    import yaml

    from commtax.measure.cluster import ClusterError, cluster_from_options, up_recorded, up_summary

    cluster = cluster_from_options(
        nodes,
        ranks_per_node,
        link,
        node_speed=node_speed,
        uplink=uplink,
        leaves=leaves,
        spine=spine,
        mtu=mtu,
        duplex_probe=duplex_probe,
        queue_ms=queue_ms,
        tcp=tcp,
    )
    _check_out(out)
    _refuse_live_record(out)
    try:
        up_recorded(cluster, out, lambda spec: yaml.safe_dump(spec, sort_keys=False))
    except ClusterError as e:
        fail(f"commtax cluster: {e}")
    typer.echo(up_summary(cluster, safe_text(str(out))))


@cluster_app.command("load")
@user_errors
def cluster_load(
    cluster_file: ClusterFile = DEFAULT_CLUSTER_FILE,
    src: Annotated[int, typer.Option("--from", min=0, help="node the background flow leaves from")] = 0,
    dst: Annotated[int, typer.Option("--to", min=0, help="node it goes to")] = 1,
    rate: Annotated[str, typer.Option("--rate", help="the most it sends per direction, tc units: 200mbit")] = "100mbit",
    seconds: Annotated[
        float, typer.Option("--seconds", min=1, max=3600, help="it stops after this long (or at `cluster down`)")
    ] = 600.0,
    max_bytes: Annotated[
        Optional[str], typer.Option("--bytes", help="it stops after this many bytes (default: rate × seconds)")
    ] = None,
) -> None:
    """Start background traffic between two nodes (another job's flow), recorded in the cluster file's fabric so
    `commtax collective … --cluster` prices it; it stops after --seconds/--bytes or at `cluster down`."""
    import yaml

    from commtax.measure.cluster import (
        ClusterError,
        EmulatedCluster,
        check_host,
        existing_namespaces,
        parse_rate_bit_s,
    )
    from commtax.measure.results import write_atomic
    from commtax.units import parse_bytes

    spec = _read_cluster(cluster_file)
    try:
        rate_bit_s = parse_rate_bit_s(rate)
    except ValueError as e:
        fail(f"--rate: {e}")
    try:
        nbytes = int(parse_bytes(max_bytes)) if max_bytes else int(rate_bit_s / 8 * seconds)
    except ValueError as e:
        fail(f"--bytes: {e}")
    if nbytes < 1:
        fail("--bytes: at least 1 byte")
    try:
        check_host()
        cluster = EmulatedCluster.from_spec(spec)
    except (ClusterError, ValueError) as e:
        fail(f"commtax cluster: {e}")
    if cluster.leaves is None:
        fail(
            f"--cluster: {cluster_file} was built without --leaves, so it has no fabric to record the flow in; "
            "rebuild with `commtax cluster up --leaves L [--spine RATE]` (`--uplink R` = `--leaves 2 --spine R`)"
        )
    for opt, i in (("--from", src), ("--to", dst)):
        if i >= cluster.nodes:
            fail(f"{opt}: node {i} does not exist; the cluster has nodes 0..{cluster.nodes - 1}")
    if src == dst:
        fail(f"--to: the flow joins two different nodes, got --from {src} --to {dst}")
    missing = set(cluster.namespaces) - set(existing_namespaces())
    if missing:
        fail(f"--cluster: namespaces {', '.join(sorted(missing))} are gone; run `commtax cluster up` again")
    cluster.load(src, dst, rate_bit_s, seconds, nbytes)
    fresh = cluster.spec()
    spec.update(fabric=fresh["fabric"], emulated=fresh["emulated"])
    write_atomic(cluster_file, yaml.safe_dump(spec, sort_keys=False))
    typer.echo(
        f"background flow node {src} → node {dst} at up to {rate_bit_s / 1e6:g} Mbit/s for {seconds:g} s "
        f"(≤ {nbytes} B), recorded in {cluster_file}; `commtax cluster down` stops it"
    )


@cluster_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def cluster_run(
    ctx: typer.Context,
    cluster_file: ClusterFile = DEFAULT_CLUSTER_FILE,
    grace: Annotated[
        float, typer.Option("--grace", min=0, help="seconds the other nodes get to exit after one fails")
    ] = 30.0,
) -> None:
    """Run `-- CMD ARGS` under torchrun on every node (gloo over the shaped links, loopback inside a node)."""
    from commtax.measure.cluster import (
        ClusterError,
        EmulatedCluster,
        check_host,
        existing_namespaces,
    )

    cmd = list(ctx.args)
    if not cmd:
        fail("cluster run: give the command after --, e.g. `commtax cluster run -- python train.py`")
    spec = _read_cluster(cluster_file)
    try:
        check_host()
        cluster = EmulatedCluster.from_spec(spec)
    except (ClusterError, ValueError) as e:
        fail(f"commtax cluster: {e}")
    missing = set(cluster.namespaces) - set(existing_namespaces())
    if missing:
        fail(f"--cluster: namespaces {', '.join(sorted(missing))} are gone; run `commtax cluster up` again")
    from commtax.measure.cluster import resolve_command

    try:
        resolve_command(cmd)
    except ValueError as e:
        fail(str(e))
    raise typer.Exit(cluster.run(cmd, grace_s=grace, log=lambda s: typer.echo(s, err=True)))


@cluster_app.command("down")
@user_errors
def cluster_down(
    cluster_file: ClusterFile = DEFAULT_CLUSTER_FILE,
    all_: Annotated[
        bool,
        typer.Option(
            "--all",
            metavar="",
            help="remove the clusters your `cluster up` built that nothing runs in "
            "(others: asks on a terminal, else lists them)",
        ),
    ] = False,
) -> None:
    """Kill what runs in the cluster and delete its namespaces, bridge, veths and qdiscs."""
    from commtax.measure.cluster import (
        ClusterError,
        EmulatedCluster,
        check_host,
        down_namespaces,
        existing_namespaces,
    )

    try:
        check_host()
    except ClusterError as e:
        fail(f"commtax cluster: {e}")
    if all_:
        names = _mine_to_remove()
    else:
        try:
            cluster = EmulatedCluster.from_spec(_read_cluster(cluster_file))
        except ValueError as e:
            fail(f"--cluster: {e}")
        names = cluster.namespaces
        why = _not_ours(cluster.name, names)
        if why:
            fail(f"--cluster: cluster {cluster.name} ({', '.join(names)}) is not removed: {why}")
    removed = down_namespaces(names)
    from commtax.measure.cluster import forget

    for name in {ns.split("-")[0] for ns in names}:
        if not any(ns.startswith(name + "-") for ns in existing_namespaces()):
            forget(name)
    typer.echo(f"removed {len(removed)} namespaces" + (f": {', '.join(removed)}" if removed else ""))


def _not_ours(name: str, names: list[str]) -> str | None:
    """Why ``cluster down --cluster`` must not touch cluster ``name``: it exists and this user's `cluster up`
    has no ownership record of it (another user's, another tool's, or a file naming someone else's cluster)."""
    from commtax.measure.cluster import existing_namespaces, owner_record, owner_uid, registry_dir

    if not set(names) & set(existing_namespaces()):
        return None  # nothing of it is left: nothing to kill or delete
    rec = owner_record(name)
    if rec is None:
        return (
            f"no record in {registry_dir()} that `commtax cluster up` built it; if it is yours, "
            f"`ip netns del` its namespaces yourself"
        )
    if rec.get("uid") != owner_uid():
        return f"built by uid {rec.get('uid')}, not by you"
    return None


def _mine_to_remove() -> list[str]:
    """Namespaces of the clusters this user's `cluster up` built and nothing runs in; the others are asked
    about on a terminal and listed (kept) otherwise."""
    import sys

    from commtax.measure.cluster import clusters_on_host, why_not_mine

    names: list[str] = []
    for cid, nss in sorted(clusters_on_host().items()):
        why = why_not_mine(cid, nss)
        if why is None:
            names += nss
        elif sys.stdin.isatty() and typer.confirm(f"cluster {cid} ({why}): remove it anyway?", default=False):
            names += nss
        else:
            typer.echo(f"kept cluster {cid}: {why}", err=True)
    return names


# ---------------------------------------------------------------------------- bench
# the options several benches share: the small GPT's shape, the loop, the records file, the local ranks
HiddenOpt = Annotated[int, typer.Option("--hidden", min=8)]
HeadsOpt = Annotated[int, typer.Option("--heads", min=1)]
VocabOpt = Annotated[int, typer.Option("--vocab", min=8)]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", min=2)]
WarmupStepsOpt = Annotated[int, typer.Option("--warmup", min=0, help="untimed steps first")]
SeedOpt = Annotated[int, typer.Option("--seed")]
AppendOpt = Annotated[bool, typer.Option("--append", help="add to the records already in --out")]
NprocOpt = Annotated[int, typer.Option("--nproc", min=1, help="local ranks to launch when not already under torchrun")]


@bench_app.command("collective")
@user_errors
def bench_collective(
    ops: Annotated[
        tuple, typer.Option("--ops", parser=choice_list(OPS), metavar="OP,...", help=f"comma list of: {', '.join(OPS)}")
    ] = ("all_reduce",),
    min_size: Annotated[str, typer.Option("--min", metavar="SIZE", help="smallest message (nccl-tests -b)")] = "1KiB",
    max_size: Annotated[str, typer.Option("--max", metavar="SIZE", help="largest message (nccl-tests -e)")] = "16MiB",
    factor: Annotated[float, typer.Option("--factor", help="size multiplier per row (nccl-tests -f)")] = 2.0,
    warmup: Annotated[int, typer.Option("--warmup", min=0)] = 2,
    iters: Annotated[int, typer.Option("--iters", min=1)] = 5,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            max=100,
            help="measure each size this many times (each: barrier, --warmup, --iters straight after), their mean",
        ),
    ] = 1,
    impl: Annotated[
        tuple,
        typer.Option(
            "--impl",
            parser=choice_list(IMPLS),
            metavar="IMPL,...",
            help="comma list: torch (the library's); ours: ring, rhd, tree, hier",
        ),
    ] = ("torch",),
    dtype: Annotated[Literal["fp32", "bf16", "fp16", "int64"], typer.Option("--dtype")] = "fp32",
    backend: Annotated[
        Literal["auto", "gloo", "nccl"], typer.Option("--backend", help="auto: nccl with GPUs, else gloo")
    ] = "auto",
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=1, help="seconds one measurement may take before a peer is declared dead/hung"),
    ] = 60.0,
    out: Annotated[
        Optional[Path], typer.Option("--out", metavar="FILE", help="JSON list of records (a .csv is written beside it)")
    ] = None,
    append: Annotated[bool, typer.Option("--append", metavar="", help="add to the records already in --out")] = False,
    nproc: NprocOpt = 2,
    fault: Annotated[str, typer.Option("--fault", hidden=True, help="test hook: RANK:INDEX:kill|stop")] = "",
) -> None:
    """nccl-tests-style sweep: time, algbw, busbw per size, from rank 0."""
    lo, hi = _bytes("--min", min_size), _bytes("--max", max_size)
    if lo > hi or not factor > 1:
        fail(f"--min/--max/--factor: need min ≤ max and factor > 1 (got {lo} B, {hi} B, {factor:g})")
    from commtax.measure.schedules import impl_supports

    if not any(impl_supports(i, o) for o in ops for i in impl):
        fail(
            f"--impl {','.join(impl)}: implements all_reduce (and ring: all_gather, reduce_scatter), "
            f"not {','.join(ops)}"
        )
    _check_sweep(lo, hi, factor, timeout, nproc, backend, fault)
    if "RANK" not in os.environ:  # not under torchrun: become it, locally (arguments checked once, here)
        if out is not None:
            _check_out(out)
            _check_out(out.with_suffix(".csv"))
            if append and out.exists():
                _check_records(out, "--append")
        _relaunch_locally(nproc, "collective")
    from commtax.measure.bench import SweepConfig, collective_sweep
    from commtax.measure.results import rank_sink

    cfg = SweepConfig(ops, lo, hi, factor, warmup, iters, impl, dtype, timeout, backend, rounds)
    crash = _fault(fault)
    sink = rank_sink(out, append)
    collective_sweep(cfg, sink, crash)


MAX_SIZES = 1000  # rows of one sweep (nccl-tests' default 8 B..128 MiB ×2 is 25)
MAX_BENCH_BYTES = 2**36  # 64 GiB per message buffer


def max_local_ranks() -> int:
    """Local ranks `bench --nproc` may start: 4 per core (more CPU ranks only wait for each other), 8 at least."""
    return max(8, 4 * (os.cpu_count() or 1))


def _check_nproc(nproc: int) -> None:
    if "RANK" not in os.environ and nproc > max_local_ranks():
        fail(f"--nproc: {nproc:,} local ranks on {os.cpu_count()} cores; the limit is {max_local_ranks()} (4 per core)")


def _check_sweep(lo: int, hi: int, factor: float, timeout: float, nproc: int, backend: str, fault: str) -> None:
    """Everything a rank would trip over, checked once in the launcher: one line, exit 2, no rank started."""
    import math

    _check_nproc(nproc)

    if not math.isfinite(factor):
        fail(f"--factor: a finite multiplier > 1, got {factor}")
    rows = math.floor(math.log(hi / lo) / math.log(factor) + 1e-9) + 1
    if rows > MAX_SIZES:
        fail(f"--factor {factor:g}: {rows:,} message sizes from {lo} B to {hi} B (at most {MAX_SIZES}); use e.g. 2")
    if hi > MAX_BENCH_BYTES:
        fail(f"--max: {hi:,} B is above {MAX_BENCH_BYTES // 2**30} GiB per message")
    if not math.isfinite(timeout):
        fail(f"--timeout: seconds, finite, got {timeout}")
    avail = _mem_available_bytes()
    if backend != "nccl" and avail and 3 * hi * nproc > avail:  # each CPU rank holds ~3 buffers of the message
        fail(f"--max: {nproc} ranks × 3 buffers × {hi:,} B do not fit the {avail / 2**30:.1f} GiB of free memory")
    if backend == "nccl":
        from commtax.measure.bench import cuda_available

        if not cuda_available():
            fail("--backend nccl: no CUDA GPU here; use --backend gloo (or auto)")
    try:
        _fault_parts(fault)
    except ValueError as e:
        fail(f"--fault: {e}")


def _mem_available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _check_records(path: Path, option: str) -> None:
    from commtax.measure.results import load_records

    try:
        load_records(path)
    except (OSError, ValueError) as e:
        fail(f"{option}: {e}")


def _fault_parts(spec: str) -> tuple[int, int, str] | None:
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in ("kill", "stop"):
        raise ValueError(f"expected RANK:INDEX:kill|stop, got {spec[:40]!r}")
    return int(parts[0]), int(parts[1]), parts[2]


def _fault(spec: str):
    """Test hook ``RANK:INDEX:kill|stop``: that rank kills (or SIGSTOPs) itself at measurement INDEX."""
    parts = _fault_parts(spec)
    if parts is None:
        return None
    rank, index, how = parts
    if int(os.environ.get("RANK", "-1")) != int(rank):
        return None
    return (int(index), how)


@bench_app.command("p2p")
@user_errors
def bench_p2p(
    size: Annotated[str, typer.Option("--bytes", help="bytes per copy")] = "64MiB",
    warmup: Annotated[int, typer.Option("--warmup", min=0)] = 3,
    iters: Annotated[int, typer.Option("--iters", min=1)] = 10,
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON list of records")] = None,
) -> None:
    """GPU-to-GPU copy bandwidth matrix (uni- and bidirectional); host memcpy without GPUs."""
    nbytes = _bytes("--bytes", size)
    avail = _mem_available_bytes()
    if nbytes > MAX_BENCH_BYTES or (avail and 4 * nbytes > avail):
        fail(
            f"--bytes: {nbytes:,} B per copy is too large here (at most {MAX_BENCH_BYTES // 2**30} GiB, and 4 copies "
            f"must fit the {avail / 2**30:.1f} GiB free)"
        )
    if out is not None:
        _check_out(out)
    from commtax.measure.p2p import p2p_matrix
    from commtax.measure.results import ResultFile

    records, note = p2p_matrix(nbytes, warmup, iters)
    typer.echo(note)
    sink = ResultFile(out)
    for r in records:
        sink.append(r)
        pair = "host memory" if r["src"] < 0 else f"cuda:{r['src']} -> cuda:{r['dst']}"
        typer.echo(f"{r['impl']:>15} {pair:<18} {r['algbw_GBps']:8.2f} GB/s")


MAX_GEMM_HIDDEN = 32_768  # the MLP GEMM is tokens × h × 4h: 32k already needs 4·h² = 4 Gi elements of weights


@bench_app.command("gemm")
@user_errors
def bench_gemm(
    hidden: Annotated[str, typer.Option("--hidden", help="comma list of hidden sizes")] = "512,1024",
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="tokens per micro-batch (GEMM m)")] = 512,
    dtypes: Annotated[
        tuple,
        typer.Option(
            "--dtypes", parser=choice_list(GEMM_DTYPES), metavar="DTYPE,...", help="comma list of: fp32, bf16, fp16"
        ),
    ] = ("fp32", "bf16"),
    warmup: Annotated[int, typer.Option("--warmup", min=0)] = 1,
    iters: Annotated[int, typer.Option("--iters", min=1)] = 3,
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON list of records")] = None,
) -> None:
    """Achieved TFLOP/s of a transformer layer's four GEMMs per dtype."""
    try:
        hiddens = [int(h) for h in hidden.split(",")]
    except ValueError:
        fail(f"--hidden: expected comma-separated integers, got {hidden[:40]!r}")
    bad = [h for h in hiddens if not 1 <= h <= MAX_GEMM_HIDDEN]
    if bad:
        fail(f"--hidden: sizes from 1 to {MAX_GEMM_HIDDEN}, got {bad[0]}")
    if tokens > 2**20:
        fail(f"--tokens: at most {2**20}, got {tokens}")
    if out is not None:
        _check_out(out)
    dts = list(dtypes)
    from commtax.measure.gemm import gemm_sweep
    from commtax.measure.results import ResultFile

    sink = ResultFile(out)
    for r in gemm_sweep(hiddens, tokens, dts, warmup, iters):
        sink.append(r)
        typer.echo(f"{r['dtype']:>5} {r['name']:>9} {r['m']}×{r['k']}·{r['k']}×{r['n']}: {r['tflops']:.3f} TFLOP/s")


@bench_app.command("gpu")
@user_errors
def bench_gpu(
    out: Annotated[Path, typer.Option("--out", help="directory for gpu_sweep.json and the profiled step's trace.json")],
    job: Annotated[Optional[Path], typer.Option("--job", help="job YAML whose layer GEMM shapes to measure")] = None,
    sustain_s: Annotated[
        float, typer.Option("--sustain-s", min=1.0, help="seconds of load before the sustained rate")
    ] = 120.0,
) -> None:
    """One GPU, about 5-10 minutes: GEMM bf16/fp8 over the job's shapes, burst vs sustained clock, flash attention
    against sequence length, HBM elementwise passes and a profiled small training step (commtax.measure.gpu_sweep)."""
    from commtax.measure.gpu_sweep import run

    r = run(job, out, sustain_s)
    typer.echo(f"{r['device']}: wrote {out / 'gpu_sweep.json'} and {out / r['trace']} (commtax trace reads it)")


@bench_app.command("gpu-entries")
@user_errors
def bench_gpu_entries(
    results: Annotated[Path, typer.Argument(metavar="gpu_sweep.json", help="results of `commtax bench gpu`")],
    gpu: Annotated[str, typer.Option("--gpu", help="catalog id of the GPU it ran on (its datasheet peaks)")],
) -> None:
    """The sweep's results as catalog entries (gpus.yaml, assumptions.yaml, attention.yaml), each with its source."""
    import yaml

    from commtax.measure.sweep_entries import entries_for_catalog_gpu, read_results

    data = entries_for_catalog_gpu(read_results(results), gpu)
    for name, fragment in data.items():
        typer.echo(f"# catalog/{name}.yaml")
        typer.echo(yaml.safe_dump(fragment, sort_keys=False, allow_unicode=True, width=110))


# `bench ddp`'s options: the comm hooks and how they quantize, DDP's buckets, what calibrates the prediction
HookOpt = Annotated[
    str, typer.Option("--hook", help="comma list: none, fp16, bf16, fp8, fp8_e5m2, int8, int4, powersgd")
]
ErrorFeedbackOpt = Annotated[
    bool,
    typer.Option("--error-feedback", help="carry the quantization residual to the next step (fp8/int8/int4/powersgd)"),
]
StochasticOpt = Annotated[bool, typer.Option("--stochastic", help="stochastic rounding (int8/int4)")]
AccumulateOpt = Annotated[
    int, typer.Option("--accumulate", min=1, help="micro-batches per step (all but the last under no_sync)")
]
PowerSGDRankOpt = Annotated[
    int, typer.Option("--powersgd-rank", help="PowerSGD matrix approximation rank: 1, 2, 4 or 8")
]
DDPClusterOpt = Annotated[
    Optional[Path], typer.Option("--cluster", help="cluster YAML: adds predicted_step_time_s from estimate")
]
GemmRecordsOpt = Annotated[
    Optional[Path],
    typer.Option("--gemm", help="`commtax bench gemm --out` records: calibrates the predicted compute"),
]


@bench_app.command("ddp")
def bench_ddp(
    hook: HookOpt = "none",
    error_feedback: ErrorFeedbackOpt = False,
    stochastic: StochasticOpt = False,
    bucket_mb: Annotated[float, typer.Option("--bucket-mb", min=0.01, help="DDP bucket_cap_mb")] = 25.0,
    accumulate: AccumulateOpt = 1,
    steps: Annotated[int, typer.Option("--steps", min=1, help="timed steps per hook")] = 20,
    warmup: WarmupStepsOpt = 3,
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1, help="sequences per micro-batch per rank")] = 8,
    hidden: HiddenOpt = 256,
    layers: Annotated[int, typer.Option("--layers", min=1)] = 2,
    heads: HeadsOpt = 4,
    vocab: VocabOpt = 512,
    seq_len: SeqLenOpt = 64,
    powersgd_rank: PowerSGDRankOpt = 4,
    lr: Annotated[float, typer.Option("--lr", min=0)] = 3e-3,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw or sgd (momentum 0.9)")] = "adamw",
    seed: SeedOpt = 0,
    cluster_file: DDPClusterOpt = None,
    gemm_json: GemmRecordsOpt = None,
    timeout: StepTimeoutOpt = 300.0,
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON list of records, one per hook")] = None,
    append: AppendOpt = False,
    nproc: NprocOpt = 2,
) -> None:
    """Train a small GPT with DDP under each comm hook: step time, exposed comm, bytes on the wire, loss, prediction."""
    from commtax.errors import SpecError
    from commtax.measure.ddp_options import check_ddp_options, check_ddp_sizes, read_gemm_records

    try:
        hooks = check_ddp_options(hook, error_feedback, powersgd_rank, hidden, heads, optimizer)
        cluster = _read_cluster(cluster_file) if cluster_file is not None else None
        gemm = read_gemm_records(gemm_json) if gemm_json is not None else None
        _check_nproc(nproc)
        check_ddp_sizes(
            seq_len=seq_len,
            accumulate=accumulate,
            steps=steps,
            warmup=warmup,
            micro_batch=micro_batch,
            hidden=hidden,
            layers=layers,
            heads=heads,
            vocab=vocab,
        )
    except SpecError as e:
        fail(str(e))
    if "RANK" not in os.environ:  # not under torchrun: become it, locally (the output checked once, here)
        if out is not None:
            _check_out(out)
            if append and out.exists():
                _check_records(out, "--append")
        _relaunch_locally(nproc, "ddp")
    from commtax.measure.ddp_bench import DDPBenchConfig, GPTConfig, run
    from commtax.measure.results import rank_sink

    cfg = DDPBenchConfig(
        hooks,
        error_feedback,
        stochastic,
        bucket_mb,
        accumulate,
        steps,
        warmup,
        micro_batch=micro_batch,
        lr=lr,
        optimizer=optimizer,
        powersgd_rank=powersgd_rank,
        seed=seed,
        timeout_s=timeout,
        model=GPTConfig(vocab, hidden, layers, heads, seq_len),
    )
    run(cfg, rank_sink(out, append), cluster, gemm, log=lambda s: typer.echo(s, err=True))


@bench_app.command("pipeline")
def bench_pipeline(
    layers: Annotated[int, typer.Option("--layers", min=1, max=64, help="transformer blocks of the small GPT")] = 4,
    stage_layers: Annotated[
        str, typer.Option("--stage-layers", metavar="N,...", help="blocks per pipeline stage (one rank each)")
    ] = "2,2",
    schedule: Annotated[Literal["gpipe", "1f1b"], typer.Option("--schedule", help="pipeline schedule")] = "1f1b",
    micro_batches: Annotated[int, typer.Option("--micro-batches", min=1, max=256, help="per step")] = 4,
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1, help="sequences per micro-batch")] = 8,
    hidden: HiddenOpt = 256,
    heads: HeadsOpt = 4,
    vocab: VocabOpt = 512,
    seq_len: SeqLenOpt = 64,
    steps: Annotated[int, typer.Option("--steps", min=1, help="timed steps")] = 6,
    warmup: WarmupStepsOpt = 2,
    seed: SeedOpt = 0,
    cluster_file: Annotated[
        Optional[Path], typer.Option("--cluster", help="cluster YAML: adds predicted_step_time_s")
    ] = None,
    timeout: StepTimeoutOpt = 300.0,
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON list of records, one per run")] = None,
    append: AppendOpt = False,
) -> None:
    """A small GPT split into pipeline stages over p2p: per-stage compute, send/recv, bubble, step, prediction."""
    from commtax.errors import SpecError
    from commtax.measure.bench_options import pipeline_records, pipeline_stages

    try:
        split, cluster = pipeline_stages(stage_layers, layers, hidden, heads, cluster_file)
    except SpecError as e:
        fail(str(e))
    if "RANK" not in os.environ:  # not under torchrun: become it, locally, one rank per stage
        if out is not None:
            _check_out(out)
        _relaunch_locally(len(split), "pipeline")
    if int(os.environ.get("WORLD_SIZE", "0")) != len(split):
        fail(
            f"--stage-layers: {len(split)} stages need {len(split)} ranks, torchrun started {os.environ['WORLD_SIZE']}"
        )
    from commtax.measure.ddp_bench import GPTConfig
    from commtax.measure.pipeline_bench import PipelineBenchConfig, run
    from commtax.measure.results import rank_sink

    cfg = PipelineBenchConfig(
        split,
        schedule,
        micro_batches,
        micro_batch,
        steps,
        warmup,
        seed=seed,
        timeout_s=timeout,
        model=GPTConfig(vocab, hidden, layers, heads, seq_len),
    )
    sink = rank_sink(out)
    if append and out is not None and out.exists() and int(os.environ["RANK"]) == 0:
        try:
            sink.records = pipeline_records(out)
        except SpecError as e:
            fail(str(e))
    run(cfg, sink, cluster, log=lambda s: typer.echo(s, err=True))


@bench_app.command("moe")
def bench_moe(
    experts: Annotated[int, typer.Option("--experts", help="experts E (a multiple of the ranks: E/n per rank)")] = 8,
    top_k: Annotated[int, typer.Option("--top-k", help="experts per token")] = 2,
    hidden: Annotated[int, typer.Option("--hidden", help="hidden size h (fp32 rows of 4h bytes)")] = 256,
    ffn: Annotated[int, typer.Option("--ffn", help="expert MLP width")] = 512,
    tokens: Annotated[int, typer.Option("--tokens", help="tokens per rank per step")] = 1024,
    imbalance: Annotated[
        float,
        typer.Option("--imbalance", help="target λ = max/mean tokens per expert (1: the router's own; ≤ E/top-k)"),
    ] = 1.0,
    steps: Annotated[int, typer.Option("--steps", help="timed steps")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed steps first")] = 2,
    seed: SeedOpt = 0,
    cluster_file: Annotated[
        Optional[Path], typer.Option("--cluster", help="cluster YAML: adds predicted_* per phase from the cost model")
    ] = None,
    timeout: StepTimeoutOpt = 300.0,
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON list with the run's record (and a .csv)")] = None,
    nproc: Annotated[int, typer.Option("--nproc", help="local ranks to launch when not already under torchrun")] = 2,
) -> None:
    """One MoE layer (router, permute, all_to_all dispatch, expert MLPs, combine, unpermute) per phase, measured and
    predicted."""
    from commtax.errors import SpecError
    from commtax.measure.bench_options import check_moe

    n = int(os.environ.get("WORLD_SIZE", nproc))
    cores = os.cpu_count() or 1
    if "RANK" not in os.environ and not 1 <= nproc <= max(2, 4 * cores):
        fail(f"--nproc: 1 to {max(2, 4 * cores)} local ranks on this {cores}-core machine, got {nproc}")
    try:
        check_moe(experts, top_k, hidden, ffn, tokens, imbalance, steps, warmup, timeout, n, _mem_available_bytes())
    except SpecError as e:
        fail(str(e))
    cluster = _read_cluster(cluster_file) if cluster_file is not None else None
    if "RANK" not in os.environ:  # not under torchrun: become it, locally (checked once, here)
        if out is not None:
            _check_out(out)
            _check_out(out.with_suffix(".csv"))
        _relaunch_locally(nproc, "moe")
    from commtax.measure.moe_bench import MoEBenchConfig, run
    from commtax.measure.results import rank_sink

    cfg = MoEBenchConfig(experts, top_k, hidden, ffn, tokens, imbalance, steps, warmup, seed, timeout)
    run(cfg, rank_sink(out), cluster, log=lambda s: typer.echo(s, err=True))


# ---------------------------------------------------------------------------- calibrate
@user_errors
def calibrate_command(
    bench_json: Annotated[Optional[Path], typer.Argument(help="records from `commtax bench collective --out`")] = None,
    cluster_file: Annotated[
        Path, typer.Option("--cluster", help="the cluster YAML the bench ran on")
    ] = DEFAULT_CLUSTER_FILE,
    gemm_json: Annotated[Optional[Path], typer.Option("--gemm", help="records from `commtax bench gemm --out`")] = None,
    out: Annotated[Path, typer.Option("--out", help="hardware profile YAML to write")] = Path("profile.yaml"),
    impl: Annotated[
        str, typer.Option("--impl", help="fit the records of this implementation (torch: the library's)")
    ] = "torch",
    cluster_out: Annotated[
        Optional[Path],
        typer.Option("--cluster-out", help="also write the cluster YAML with `profile:` pointing at --out"),
    ] = None,
    trace: Annotated[
        Optional[list[Path]], typer.Option("--trace", help="calibrate from profiler traces of a real job (with --job)")
    ] = None,
    job_file: Annotated[Optional[Path], typer.Option("--job", help="with --trace: the job YAML that ran")] = None,
    steps: Annotated[
        Optional[str], typer.Option("--steps", help="with --trace: only ProfilerStep#a … #b, as a:b")
    ] = None,
) -> None:
    """Fit α (latency) and β (1/bandwidth) per op and level into a hardware profile; print the residuals."""
    from commtax.atomic import refuse_overwriting_inputs

    refuse_overwriting_inputs(
        {"--out": out, "--cluster-out": cluster_out}, [bench_json, cluster_file, gemm_json, job_file, *(trace or [])]
    )
    if trace:
        from commtax.report.text import profile_summary_lines
        from commtax.trace.traced_job import calibrate_from_trace

        lines = profile_summary_lines(calibrate_from_trace(trace, job_file, out, steps), out)
    elif bench_json is None:
        fail("calibrate: give the bench records file, or --trace TRACE --job JOB.yaml")
    else:
        from commtax.measure.calibrate import calibrate_files, write_calibration
        from commtax.report.text import calibration_lines

        for path in (out, cluster_out):  # both checked before anything is written
            if path is not None:
                _check_out(path)
        c = calibrate_files(bench_json, cluster_file, gemm_json, impl)
        write_calibration(c, out, cluster_out)
        lines = calibration_lines(c, out, cluster_out)
    for line in lines:
        typer.echo(line)


def _relaunch_locally(nproc: int, sub: str) -> NoReturn:
    """Not under torchrun: run `bench SUB` again under it, ``nproc`` local ranks, and exit with its status."""
    from commtax.measure.bench import run_local

    raise typer.Exit(run_local(nproc, ["bench", sub, *_argv_tail(sub)]))


def _argv_tail(sub: str = "collective") -> list[str]:
    """The arguments after `bench SUB` in this process's command line."""
    argv = sys.argv[1:]
    for i in range(len(argv) - 1):
        if argv[i] == "bench" and argv[i + 1] == sub:
            return argv[i + 2 :]
    return argv


if __name__ == "__main__":
    from commtax import signals

    signals.install()  # SIGTERM/SIGHUP clean up like Ctrl-C
    app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(cluster_app, name="cluster")
    app.add_typer(bench_app, name="bench")
    app.command("calibrate")(calibrate_command)
    from commtax.cli.main import forget_caught_interrupt

    try:
        app()
    finally:  # exit 130 after a caught Ctrl-C, not death by SIGINT (see forget_caught_interrupt)
        forget_caught_interrupt()
