"""Hardware specs: GPU, scale-up link, network, measured profile, cluster.

Catalog numbers are converted to SI once, here."""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

import math
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from commtax.errors import SpecError
from commtax.spec.base import Precision, _Spec
from commtax.spec.fabric import Fabric
from commtax.spec.pools import fill_from_pools
from commtax.units import GB, GBIT, TFLOPS, US, GiB


class GPU(_Spec):
    name: str = "custom-gpu"
    peak_tflops: dict[Precision, float] = Field(description="dense tensor-core peak per precision, TFLOP/s")
    mem_GiB: float = Field(gt=0, le=4096, description="device memory")
    mem_bw_GBps: float = Field(gt=0, le=100_000, description="device memory bandwidth")
    tdp_W: float = Field(default=700, gt=0, le=5000)
    sms: int = Field(default=132, gt=0, le=4096, description="SMs / compute units (GEMM wave quantisation)")
    p2p: bool = Field(default=True, description="GPU peer-to-peer over the scale-up link (false: host-bounced)")
    matmul_efficiency: dict[str, float] = Field(default_factory=lambda: {"default": 0.75})
    attention_efficiency: float = Field(default=0.5, gt=0, le=1, description="unused since attention kernel tables")
    arch: Literal["volta", "ampere", "hopper", "ada", "blackwell", "cdna2", "cdna3", "other"] = Field(
        default="other", description="architecture: picks the attention kernel table (catalog/attention.yaml)"
    )
    clock_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1.5,
        description="sustained SM clock / the clock the datasheet peak assumes (< 1 for a power-capped GPU): "
        "scales GEMM rates, not HBM bandwidth; MFU stays against the datasheet peak. Unset: 1, or for Hopper "
        "the assumption hopper_clock_fraction",
    )
    convert_Gelem_s: dict[str, float] = Field(
        default_factory=dict,
        description="dtype conversions slower than the memory stream, Gelem/s, keyed fp32->fp8_e4m3, "
        "fp8_e4m3->fp32, fp32->fp8_e5m2, fp8_e5m2->fp32 (CPU ranks: torch converts fp8 in scalar code; "
        "GPUs convert in hardware: leave empty)",
    )
    source: str = "inline"

    @field_validator("convert_Gelem_s")
    @classmethod
    def _conversions(cls, v: dict[str, float]) -> dict[str, float]:
        from commtax.spec.wire_dtypes import CONVERSIONS

        for k, x in v.items():
            if k not in CONVERSIONS:
                raise ValueError(f"convert_Gelem_s.{k}: not a conversion; use one of {', '.join(CONVERSIONS)}")
            if not (0 < x < 1e4):
                raise ValueError(f"convert_Gelem_s.{k} must be in (0, 1e4) Gelem/s, got {x}")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 < x < 1e6):
                raise ValueError(f"peak_tflops.{k} must be in (0, 1e6) TFLOP/s, got {x}")
        return v

    @field_validator("matmul_efficiency")
    @classmethod
    def _efficiencies(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 < x <= 1):
                raise ValueError(f"matmul_efficiency.{k} must be in (0, 1], got {x}")
        return v

    def peak_flops(self, precision: str) -> float:
        if precision not in self.peak_tflops:
            have = ", ".join(self.peak_tflops)
            raise SpecError(
                f"training.precision: GPU {self.name} has no {precision} peak (has: {have}); set one of them"
            )
        return self.peak_tflops[precision] * TFLOPS

    def matmul_eff(self, precision: str) -> float:
        return self.matmul_efficiency.get(precision, self.matmul_efficiency.get("default", 0.75))

    @property
    def mem_bytes(self) -> float:
        return self.mem_GiB * GiB

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_GBps * GB


class IntraLink(_Spec):
    name: str = "custom-link"
    kind: Literal["nvlink", "pcie", "xgmi", "loopback"] = "nvlink"
    bw_GBps: float = Field(gt=0, le=100_000, description="per GPU, per direction")
    latency_us: float = Field(default=10, ge=0, le=1e6)
    efficiency: float = Field(default=0.8, gt=0, le=1)
    nvls: bool = False
    nvls_efficiency: float = Field(default=0.0, ge=0, le=1)
    source: str = "inline"

    @property
    def bw_bytes_per_s(self) -> float:
        return self.bw_GBps * GB * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class _LineRate:
    """A link quoted as a line rate in Gb/s with an efficiency: the rate it delivers, in bytes/s, and its latency."""

    bw_Gbps: float
    efficiency: float
    latency_us: float

    @property
    def bw_bytes_per_s(self) -> float:
        return self.bw_Gbps * GBIT * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class Network(_LineRate, _Spec):
    name: str = "custom-network"
    bw_Gbps: float = Field(gt=0, le=100_000, description="per NIC, per direction, line rate")
    latency_us: float = Field(default=20, ge=0, le=1e6)
    efficiency: float = Field(default=0.9, gt=0, le=1)
    gloo_a2a_duplex: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="κ, a fraction (no unit): the share of the lighter direction of a node link that gloo's "
        "all_to_all does not overlap with the heavier one (0 full duplex, 1 the directions take turns); measured "
        "by `commtax cluster up` (a symmetric gloo all_to_all between two nodes: κ = t·B/bytes − 1; docs/fabric.md). "
        "Unset: not measured, priced as 0",
    )
    source: str = "inline"


class LevelNumbers(_Spec):
    bw_GBps: float = Field(gt=0, le=100_000, allow_inf_nan=False)
    latency_us: float = Field(ge=0, le=1e7, allow_inf_nan=False)


class Profile(_Spec):
    """A measured hardware profile (``commtax calibrate``): replaces catalog link numbers."""

    model_config = ConfigDict(extra="allow", frozen=True)
    source: str
    levels: dict[Literal["intra", "inter"], LevelNumbers]
    ops: dict[str, dict[Literal["intra", "inter"], LevelNumbers]] = Field(default_factory=dict)
    gemm_efficiency: dict[str, float] = Field(default_factory=dict)
    assumptions: dict[str, float] = Field(default_factory=dict, description="overrides of catalog/assumptions.yaml")

    @field_validator("gemm_efficiency")
    @classmethod
    def _efficiencies(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 < x <= 1):  # also false for nan
                raise ValueError(
                    f"gemm_efficiency.{k} must be in (0, 1] (achieved / peak), got {x}; "
                    "re-measure with `commtax bench gemm` on real sizes"
                )
        return v


class Pool(_Spec):
    """One homogeneous block of nodes."""

    name: str = Field(default="", description="how plans and reports name the pool (default: its GPU's name)")
    gpu: GPU
    num_gpus: int = Field(gt=0, le=1_000_000)
    gpus_per_node: int = Field(default=8, gt=0, le=1024)
    intra_node: IntraLink
    inter_node: Network
    nics_per_node: int = Field(default=8, gt=0, le=1024)

    @property
    def label(self) -> str:
        return self.name or self.gpu.name


class InterPoolLink(_LineRate, _Spec):
    """The link joining the pools, when it is not the shared network: total line rate per direction."""

    bw_Gbps: float = Field(gt=0, le=1_000_000, allow_inf_nan=False, description="line rate per direction, all of it")
    latency_us: float = Field(default=20, ge=0, le=1e6, allow_inf_nan=False)
    efficiency: float = Field(default=0.9, gt=0, le=1)
    source: str = "inline"


class Cluster(_Spec):
    gpu: GPU
    num_gpus: int = Field(gt=0, le=1_000_000)
    gpus_per_node: int = Field(default=8, gt=0, le=1024, description="size of the scale-up (NVLink) domain")
    intra_node: IntraLink
    inter_node: Network
    nics_per_node: int = Field(default=8, gt=0, le=1024)
    gpus_per_pcie_switch: int = Field(
        default=1, gt=0, le=64, description="GPUs sharing one PCIe uplink (host-bounced traffic)"
    )
    collective_library: Literal["nccl", "gloo"] = Field(
        default="nccl",
        description="nccl: the tuner picks ring/tree/NVLS and the LL protocol; gloo (CPU): rings only, and its "
        "reduce_scatter is an all-reduce",
    )
    uplink_Gbps: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        allow_inf_nan=False,
        description="line rate per direction of the one link joining the two halves of the nodes (an oversubscribed "
        "spine, as `commtax cluster up --uplink` builds); a group spanning more than half the nodes crosses it",
    )
    fabric: Fabric | None = Field(
        default=None,
        description="leaf/spine levels, oversubscription, the job's placement and other traffic (spec/fabric.py); "
        "unset: every node reaches every other at its NIC rate",
    )
    profile: Profile | None = None
    emulated: dict[str, Any] | None = None
    # ---- several GPU pools (spec/pools.py): the top-level hardware fields are then the first pool's
    pools: tuple[Pool, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="GPU pools, each {name, gpu, num_gpus, gpus_per_node, intra_node, inter_node, nics_per_node}; "
        "the top-level hardware fields are then taken from the first pool and num_gpus is their sum",
    )
    inter_pool: InterPoolLink | None = Field(
        default=None,
        description="the link joining the pools (total line rate per direction); unset: the shared network",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_pools(cls, data: Any) -> Any:
        return fill_from_pools(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _shape(self) -> "Cluster":
        if self.inter_pool is not None and not self.pools:
            raise ValueError("inter_pool: joins GPU pools; describe them in cluster.pools or remove inter_pool")
        if self.pools:
            return self  # each pool's shape is checked with the plan (spec/pools.py check_pools)
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ValueError(
                f"num_gpus ({self.num_gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node}) "
                "when the cluster spans nodes"
            )
        f = self.fabric
        if f is not None and self.uplink_Gbps is not None:
            raise ValueError(
                "uplink_Gbps and fabric both describe the links above the nodes; drop uplink_Gbps and give "
                "fabric.nodes_per_leaf and fabric.oversubscription.leaf instead"
            )
        if f is not None and isinstance(f.placement, list) and len(f.placement) != self.nodes:
            raise ValueError(
                f"fabric.placement lists {len(f.placement)} nodes but the job has {self.nodes} "
                f"(num_gpus {self.num_gpus} / gpus_per_node {self.gpus_per_node}); list one fabric node per job node"
            )
        return self

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.num_gpus / self.gpus_per_node))
