"""The scale-out fabric a cluster's nodes hang off: leaf/spine levels, oversubscription, the job's placement and
other traffic on the links (``cluster.fabric``; catalog/fabrics.yaml has presets with sources).

Levels, bottom up: a node's NICs go to a leaf (``tor``: one top-of-rack switch per ``nodes_per_leaf`` nodes;
``rail-optimized``: one leaf per rail, shared by the ``nodes_per_leaf`` nodes of a scalable unit, NCCL's PXN
moving cross-rail traffic over NVLink first, so a unit behaves as one leaf); ``leaves_per_pod`` leaves join a
pod's spine, pods join above it. ``oversubscription`` is down- over up-link capacity at each level's uplink
(``leaf``: leaf → spine, ``pod``: pod → the layer above). ``single-switch``: every node on one non-blocking
switch. Nothing here is priced: commtax.costs.fabric turns it into links and flows.
"""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from commtax.spec.base import _Spec

FabricLevel = Literal["leaf", "pod"]


class FabricFlow(_Spec):
    """Traffic of someone else between two fabric nodes (``commtax cluster load`` records one per generator)."""

    src: int = Field(ge=0, le=10_000_000, description="fabric node the flow leaves from (fabric numbering)")
    dst: int = Field(ge=0, le=10_000_000, description="fabric node it goes to")
    rate_Gbps: float = Field(gt=0, le=100_000, allow_inf_nan=False, description="the most it sends, per direction")
    until_unix: float | None = Field(
        default=None,
        ge=0,
        le=1e11,
        allow_inf_nan=False,
        description="when it stops, unix seconds (`cluster load`: its start + --seconds); `collective` prices only "
        "flows alive now; unset: always on",
    )

    @model_validator(mode="after")
    def _distinct(self) -> "FabricFlow":
        if self.src == self.dst:
            raise ValueError(f"src and dst are both node {self.src}; a flow joins two different nodes")
        return self


class FabricJob(_Spec):
    """Another job on the same fabric, as the traffic it puts there: its gradient (DP) rings, each the fabric nodes
    it visits in rank order, always reducing (an upper bound on its load). ``colocated: [{job: FILE, nodes: [...]}]``
    is resolved to this at load (spec/catalog.py): its plan's DP rings on the nodes listed (default: the nodes
    after ours)."""

    name: str = "co-located job"
    rings: list[list[int]] = Field(min_length=1, max_length=1_000_000)
    rate_Gbps: float = Field(gt=0, le=100_000, allow_inf_nan=False, description="a ring's most per node")


class Fabric(_Spec):
    name: str = "custom-fabric"
    topology: Literal["rail-optimized", "tor", "single-switch"] = Field(
        default="rail-optimized", description="how nodes reach the spine (module docstring)"
    )
    nodes_per_leaf: int = Field(
        default=32, gt=0, le=100_000, description="nodes under one leaf (rail-optimized: one scalable unit)"
    )
    leaves_per_pod: int | None = Field(
        default=None, gt=0, le=100_000, description="leaves joined by one pod's spine (unset: one pod holds all)"
    )
    oversubscription: dict[FabricLevel, float] = Field(
        default_factory=dict, description="down:up capacity ratio at each level's uplink (1 = non-blocking)"
    )
    placement: Literal["contiguous", "scattered"] | list[int] = Field(
        default="contiguous",
        description="the fabric nodes the job's nodes land on: contiguous (job node i on fabric node i), "
        "scattered (dealt round-robin over the leaves it would fill, and over pods), or a list of node ids",
    )
    background: dict[FabricLevel, float] = Field(
        default_factory=dict, description="share of each level's uplinks other jobs keep busy, in [0, 1)"
    )
    # lambdas, not ``list``: pydantic reads each factory's signature, and a builtin's first costs ~4 ms (tokenize)
    flows: list[FabricFlow] = Field(default_factory=lambda: [], description="other traffic, flow by flow")
    colocated: list[FabricJob] = Field(
        default_factory=lambda: [], description="other jobs whose traffic shares the links"
    )
    sharing: Literal["max-min", "tcp"] = Field(
        default="max-min",
        description="how flows share a congested link: max-min (a switch's per-flow arbitration, InfiniBand's "
        "credits) or tcp (α-fair with α = 2 per TCP connection, Mo & Walrand 2000: what TCP gives a flow that "
        "crosses several congested links)",
    )
    queue_ms: float | None = Field(
        default=None,
        gt=0,
        le=10_000,
        allow_inf_nan=False,
        description="the standing queue, in ms of its rate, that a long-lived flow keeps on a link it saturates; "
        "each step of a collective that crosses such a link waits behind it once (unset: no queueing)",
    )
    source: str = "inline"

    @field_validator("oversubscription")
    @classmethod
    def _ratios(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (1 <= x <= 1000):  # false for nan
                raise ValueError(f"{k} must be in [1, 1000] (down:up, 1 = non-blocking), got {x}")
        return v

    @field_validator("background")
    @classmethod
    def _shares(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 <= x < 1):
                raise ValueError(f"{k} must be in [0, 1) (the share of the uplinks in use), got {x}")
        return v

    @field_validator("queue_ms")
    @classmethod
    def _queue_needs_tcp(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("sharing") != "tcp":
            raise ValueError(
                "a standing queue is what TCP keeps on a link it fills; set sharing: tcp, or drop queue_ms"
            )
        return v

    @field_validator("placement")
    @classmethod
    def _node_list(cls, v: str | list[int]) -> str | list[int]:
        if isinstance(v, list):
            if not v:
                raise ValueError("an empty node list; list the job's nodes or use contiguous")
            if any(not (0 <= i <= 10_000_000) for i in v):
                raise ValueError("node ids are in [0, 10000000]")
            seen: set[int] = set()
            for i in v:
                if i in seen:
                    raise ValueError(f"node {i} listed twice; each job node lands on its own node")
                seen.add(i)
        return v
