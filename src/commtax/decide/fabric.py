"""Fabric advice for a job with a ``cluster.fabric``: where each parallel group sits, and what-ifs on the fabric.

Placement: for each group kind (tp, cp, dp, pp) the widest level it crosses (the NVLink domain, a leaf, the
spine of a pod, the layer above pods), the share of its NIC rate the fabric leaves it (max-min, with every group
of its kind at once: commtax.costs.fabric) and the link that binds it. What-ifs, each re-estimated: the spine's
oversubscription at 1:1, 2:1 and 4:1, rail-optimised vs ToR leaves, contiguous vs scattered placement, and a
co-located job that keeps half of every uplink busy (or the job alone, when the fabric has background traffic).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from commtax.costs.fabric import leaf_of, pod_of
from commtax.costs.topology import concurrent_groups, group_placement, inter_level, layout
from commtax.spec import Fabric, Job, build, load_catalog, resolve_entry
from commtax.units import GB

GROUP_NAMES = {"tp": "TP", "cp": "CP", "dp": "DP (gradients)", "pp": "PP (stage pairs)", "ep": "EP (all-to-all)"}
OP_OF = {"tp": "all_reduce", "cp": "all_gather", "dp": "all_reduce", "pp": "send_recv", "ep": "all_to_all"}


@dataclass(frozen=True)
class GroupPlace:
    group: str
    level: str  # "nvlink" | "leaf" | "pod" | "above pods"
    factor: float  # the share of its NIC rate the fabric leaves it
    binding: str
    bytes_per_gpu: float  # what one GPU sends for this group per step

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "level": self.level,
            "fabric_factor": self.factor,
            "binding_link": self.binding,
            "GB_per_gpu_per_step": self.bytes_per_gpu / GB,
        }

    def text(self) -> str:
        where = {
            "nvlink": "inside the NVLink domain",
            "leaf": "inside one leaf",
            "pod": "across leaves of one pod",
            "above pods": "across pods",
        }[self.level]
        rate = "" if self.factor >= 1 else f"; the fabric leaves it {self.factor:.0%} of its NIC rate ({self.binding})"
        return f"{GROUP_NAMES[self.group]}: {where}, {self.bytes_per_gpu / GB:.3g} GB per GPU per step{rate}"


def widest_level(job: Job, groups: list[list[int]]) -> str:
    f = job.cluster.fabric
    assert f is not None
    nodes = [set(g) for g in groups]
    if all(len(g) == 1 for g in nodes):
        return "nvlink"
    if f.topology == "single-switch" or all(len({leaf_of(f, n) for n in g}) == 1 for g in nodes):
        return "leaf"
    if all(len({pod_of(f, leaf_of(f, n)) for n in g}) == 1 for g in nodes):
        return "pod"
    return "above pods"


def group_places(job: Job, bytes_per_gpu: dict[str, float]) -> list[GroupPlace]:
    """Where each group kind of the plan sits on the fabric."""
    c, lay = job.cluster, layout(job)
    out = []
    for g in ("tp", "cp", "dp", "pp", "ep"):
        if lay.size.get(g, 1) <= 1:
            continue
        n, pattern = (2, "pairs") if g == "pp" else (lay.size[g], "all_to_all" if g == "ep" else "ring")
        pl = group_placement(job, g, OP_OF[g])
        factor = 1.0
        if pl.inter is not None and pl.spans_nodes:
            factor = pl.inter.bw_bytes_per_s / inter_level(c).bw_bytes_per_s
        level = widest_level(job, concurrent_groups(c, n, lay.stride[g], pattern))
        out.append(GroupPlace(g, level, factor, pl.binding, bytes_per_gpu.get(g, 0.0)))
    return out


def placement_advice(job: Job, places: list[GroupPlace]) -> list[str]:
    """Lines that say what to keep where, from where the groups sit and what they send."""
    lines = [p.text() for p in places]
    by = {p.group: p for p in places}
    if "tp" in by and by["tp"].level != "nvlink":
        lines.append("keep TP inside the NVLink domain: tp ≤ gpus_per_node; its traffic is per layer and exposed")
    if "ep" in by and by["ep"].level not in ("nvlink", "leaf"):
        lines.append("keep EP inside the NVLink domain or one leaf: its all-to-all runs every MoE layer, both passes")
    wide = [p for p in places if p.level in ("pod", "above pods")]
    if len(wide) >= 1 and len(places) > 1:
        light = min(places, key=lambda p: p.bytes_per_gpu if p.group != "tp" else float("inf"))
        heavy = [p for p in wide if p.group != light.group and p.bytes_per_gpu > light.bytes_per_gpu]
        for p in heavy:
            lines.append(
                f"put {GROUP_NAMES[light.group]} across the spine rather than {GROUP_NAMES[p.group]}: it sends "
                f"{light.bytes_per_gpu / GB:.3g} GB per GPU per step against {p.bytes_per_gpu / GB:.3g}"
                " (rank order puts the last-listed group outermost: PP)"
            )
    if isinstance(job.cluster.fabric.placement, str) and job.cluster.fabric.placement == "scattered":
        lines.append(
            "ask the scheduler for contiguous nodes (whole leaves): scattered nodes cross the spine at every hop"
        )
    return lines


def with_fabric(job: Job, **changes: Any) -> Job:
    """The job on a changed fabric (validated again: a placement list must still fit)."""
    c = job.cluster
    fab = build(Fabric, {**c.fabric.model_dump(), **changes}, "cluster.fabric")
    cluster = c.model_copy(update={"fabric": fab})
    return job.model_copy(update={"cluster": cluster})


def _preset(name: str) -> dict[str, Any]:
    e = resolve_entry("fabric", name, load_catalog(), "fabric")
    return {k: e[k] for k in ("topology", "nodes_per_leaf") if k in e}


def what_ifs(job: Job) -> Iterator[tuple[str, Job]]:
    """(label, job) for each fabric change worth pricing."""
    f = job.cluster.fabric
    assert f is not None
    now = f.oversubscription.get("leaf", 1.0)
    for r in (1.0, 2.0, 4.0):
        if r != now and f.topology != "single-switch":
            yield f"spine {r:g}:1 (now {now:g}:1)", with_fabric(job, oversubscription={**f.oversubscription, "leaf": r})
    if f.topology == "tor":
        yield (
            "rail-optimized leaves (32-node units, dgx-h100-superpod)",
            with_fabric(job, **_preset("dgx-h100-superpod")),
        )
    elif f.topology == "rail-optimized":
        yield "ToR leaves (4 nodes per ToR, tor-4node)", with_fabric(job, **_preset("tor-4node"))
    if f.placement == "contiguous":
        yield "scattered placement (what a bad allocation costs)", with_fabric(job, placement="scattered")
    else:
        yield "contiguous placement", with_fabric(job, placement="contiguous")
    if f.background or f.flows:
        yield "alone on the fabric (no background traffic)", with_fabric(job, background={}, flows=[])
    else:
        half = {"leaf": 0.5, **({"pod": 0.5} if f.leaves_per_pod else {})}
        yield "a co-located job using half of every uplink", with_fabric(job, background=half)
