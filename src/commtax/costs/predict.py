"""One collective on a cluster, as ``commtax collective`` predicts it: time, algbw, busbw, algorithm, bound.

The cluster comes from a file (a cluster or a job file) or from catalog ids; the group is ``gpus`` ranks placed
contiguously (``topology.placement`` with stride 1); each size is priced by ``collectives.collective_cost``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from commtax.costs.collectives import CollectiveCost, bus_factor, collective_cost, deepep_time
from commtax.costs.topology import gloo_duplex, placement
from commtax.errors import SpecError
from commtax.spec import Cluster, FabricFlow, build, load_catalog, resolve_cluster
from commtax.units import GB


@dataclass(frozen=True)
class CollectivePrediction:
    """The rows of one prediction (one per message size) and the group's shape."""

    op: str
    gpus: int
    per_node: int
    rows: tuple[dict[str, Any], ...]
    note: str = ""  # shown under the table: e.g. gloo all_to_all's duplex κ, measured or not
    ignored_flows: tuple[FabricFlow, ...] = ()  # background flows that had stopped at the moment priced


def cluster_from_options(
    cluster_file: Path | None,
    catalog: Path | None,
    *,
    gpu: str,
    gpus: int | None,
    gpus_per_node: int,
    intra: str,
    inter: str,
    nics_per_node: int,
) -> Cluster:
    """The cluster of a file (``--cluster``), or of catalog ids and a node size (one node unless ``gpus``)."""
    cat = load_catalog(catalog)
    if cluster_file is not None:
        raw = resolve_cluster(str(cluster_file), cat, field="--cluster")
    else:
        raw = resolve_cluster(
            {
                "gpu": gpu,
                "num_gpus": gpus_per_node if gpus is None else gpus,
                "gpus_per_node": gpus_per_node,
                "intra_node": intra,
                "inter_node": inter,
                "nics_per_node": nics_per_node,
            },
            cat,
            field="cluster",
        )
    return build(Cluster, raw, "cluster")


def check_options(op: str, gpus: int | None, algorithm: str | None, deepep: str | None = None) -> None:
    """What is wrong with the group, the kernel or the algorithm whatever the cluster (checked before it is built)."""
    if gpus is not None and gpus < 1:
        raise SpecError(f"--gpus: a group has at least 1 GPU, got {gpus}")
    if deepep is not None and op != "all_to_all":
        raise SpecError(f"--deepep: DeepEP kernels are all_to_all (MoE dispatch/combine), not {op}")
    if algorithm is not None and op in ("all_to_all", "send_recv"):
        raise SpecError(f"--algorithm: {op} has one algorithm (pairwise exchange); drop --algorithm")


def sweep_sizes(nbytes: float) -> list[float]:
    """nccl-tests' sweep: 8 B up to ``nbytes``, doubling."""
    sizes, s = [], 8.0
    while s <= nbytes:
        sizes.append(s)
        s *= 2
    return sizes


def predict_collective(
    op: str,
    nbytes: float,
    cluster: Cluster,
    gpus: int | None = None,
    algorithm: str | None = None,
    protocol: str | None = None,
    sweep: bool = False,
    deepep: str | None = None,
    dedup: float = 1.0,
    now: float | None = None,
) -> CollectivePrediction:
    """``op`` of ``nbytes`` (or the sweep up to it) over ``gpus`` ranks of ``cluster`` (all of them by default);
    ``deepep`` ("dispatch"/"combine"): an all_to_all as DeepEP's kernel, keeping ``dedup`` of its inter-node bytes.
    Background flows (``fabric.flows``) are priced only if alive at ``now`` (unix seconds; default: the clock)."""
    check_options(op, gpus, algorithm, deepep)
    cluster, gone = flows_alive(cluster, time.time() if now is None else now)
    n = cluster.num_gpus if gpus is None else gpus
    if n < 1 or n > cluster.num_gpus:
        raise SpecError(f"--gpus: must be between 1 and the cluster's num_gpus ({cluster.num_gpus}), got {n}")
    if n > cluster.gpus_per_node and n % cluster.gpus_per_node:
        raise SpecError(f"--gpus: a group spanning nodes must be a multiple of gpus_per_node ({cluster.gpus_per_node})")
    place = placement(cluster, n, 1, op)
    duplex_applies = op == "all_to_all" and cluster.collective_library == "gloo" and place.spans_nodes and not deepep
    rendezvous = place.rendezvous if duplex_applies else None
    duplex_applies = duplex_applies and rendezvous is None  # on a fabric the pairs' turns replace κ
    rows = []
    for s in sweep_sizes(nbytes) if sweep else [nbytes]:
        try:
            c = collective_cost(op, s, place, algorithm, protocol)
            if deepep is not None:
                t = deepep_time(f"deepep_{deepep}", s, place, dedup)
                bw = s / t if t > 0 else float("inf")
                c = CollectiveCost(t, f"deepep_{deepep}", c.bottleneck, bw, bw * bus_factor(op, n), "", 0)
        except ValueError as e:
            raise SpecError(f"{'--protocol' if 'protocol' in str(e) else '--algorithm'}: {e}") from None
        rows.append(
            {
                "op": op,
                "message_bytes": s,
                "gpus": n,
                "time_s": c.time_s,
                "algorithm": c.algorithm,
                "protocol": c.protocol,
                # channels (CTAs) NCCL runs it on (enqueue.cc topoGetAlgoInfo); 0 outside NCCL's tuned algorithms
                "channels": c.channels,
                "bottleneck": c.bottleneck,
                "algbw_GBps": c.algbw_bytes_per_s / GB,
                "busbw_GBps": c.busbw_bytes_per_s / GB,
                # the fabric link that binds the network level (cluster.fabric): a leaf uplink, a NIC shared
                # with a background flow, ...
                **({"binding_link": place.binding} if place.binding and c.bottleneck == "inter" else {}),
                **({"standing_queue_ms": place.queue_s * 1e3} if place.queue_s and c.bottleneck == "inter" else {}),
                **({"gloo_a2a_duplex": gloo_duplex(cluster)} if duplex_applies else {}),
                # gloo's rendezvous on the fabric: the fastest and slowest entry order's time (one run lands between)
                **({"rendezvous_range_s": rendezvous_range(c.time_s, s, n, rendezvous)} if rendezvous else {}),
                **({"ignored_flows": [f.model_dump(exclude_none=True) for f in gone]} if gone else {}),
            }
        )
    notes = [
        duplex_note(cluster) if duplex_applies else "",
        rendezvous_note(rendezvous, rows[-1]["message_bytes"], n) if rendezvous else "",
        ignored_note(gone),
        queue_note(place),
    ]
    return CollectivePrediction(op, n, place.per_node, tuple(rows), "\n".join(x for x in notes if x), gone)


def flows_alive(cluster: Cluster, now: float) -> tuple[Cluster, tuple[FabricFlow, ...]]:
    """The cluster with only the background flows still running at ``now``, and the ones that had stopped (a
    `cluster load` flow runs its --seconds, recorded as ``until_unix``; a flow without one is always on)."""
    f = cluster.fabric
    gone = tuple(x for x in f.flows if x.until_unix is not None and x.until_unix <= now) if f is not None else ()
    if not gone:
        return cluster, ()
    keep = [x for x in f.flows if x not in gone]
    return cluster.model_copy(update={"fabric": f.model_copy(update={"flows": keep})}), gone


def queue_note(place) -> str:
    """The standing queue each network step was priced to wait behind, when a background flow keeps one."""
    if not place.queue_s or place.inter is None:
        return ""
    return (
        f"each network step waits behind a standing queue of {place.queue_s * 1e3:g} ms (fabric.queue_ms: a "
        "background flow keeps a link on its path full"
        + (", or gloo's all_to_all its own connections do" if place.rendezvous is not None else "")
        + ")"
    )


def ignored_note(gone: tuple[FabricFlow, ...]) -> str:
    """Which background flows were left out because they had stopped, and when."""
    if not gone:
        return ""

    def when(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    each = "; ".join(
        f"node {x.src} → node {x.dst} at {x.rate_Gbps * 1e3:g} Mbit/s, ended {when(x.until_unix)}" for x in gone
    )
    return f"background flows not priced (stopped before the moment priced): {each}"


def rendezvous_range(time_s: float, nbytes: float, n: int, r) -> list[float]:
    """The op's time with the luckiest and the unluckiest entry order in place of their mean."""
    return [time_s + (x - r.mean_s) * nbytes / n for x in (r.fastest_s, r.slowest_s)]


def rendezvous_note(r, nbytes: float, n: int) -> str:
    """How gloo's all_to_all was priced on the fabric: its pairs' turns, the mean over entry orders."""
    lo, hi = (x * nbytes / n * 1e3 for x in (r.fastest_s, r.slowest_s))
    return (
        "gloo all_to_all on the fabric: a pair's connection carries its two directions in turns when the rank that "
        "enters later sends to the other before it receives (gloo's ready notices queue behind data; "
        f"docs/fabric.md); priced as the mean over {r.orders} entry orders, network part {lo:.0f}–{hi:.0f} ms "
        f"at {nbytes:.0f} B from the luckiest to the unluckiest order (κ not used)"
        + (
            f"; a link direction moves at 1/{r.two_way:g} of its rate while its reverse carries data too (TCP's ACKs "
            "queue behind it: sharing tcp with a standing queue)"
            if r.two_way != 1.0
            else ""
        )
    )


def duplex_note(cluster: Cluster) -> str:
    """What gloo's all_to_all was priced with: κ measured by `cluster up`, or the full-duplex default."""
    k = gloo_duplex(cluster)
    if k is None:
        return (
            "gloo all_to_all: duplex not measured (κ = 0, both directions of a node link at once); "
            "`commtax cluster up` measures it (inter_node.gloo_a2a_duplex)"
        )
    return f"gloo all_to_all: duplex κ = {k:g} (inter_node.gloo_a2a_duplex): each node link priced (1 + κ) · bytes / B"
