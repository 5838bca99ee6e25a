"""Cost of training: days, GPU-hours, energy, dollars per billion tokens, owned or rented.

Owned (the seed article's §5.2 TCO, made explicit):
    $ = capex × t / (depreciation years) + energy × $/kWh,
    capex = N_gpu × price_gpu + N_node × price_node,
    energy = (N_gpu × P_gpu + N_node × P_node) × PUE × t.
Rented:
    $ = N_gpu × t[h] × rent $/GPU-h (the rate includes power, space and the host).
Both are a rate in $/s times the time to train, so $/B tokens = rate × 1e9 / (tokens/s).

Prices live in ``catalog/prices.yaml`` (each entry with a source and a date) and can be overridden.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from commtax.errors import SpecError
from commtax.spec import CATALOG_DIR, Job, build, read_overrides, read_yaml
from commtax.units import SECONDS_PER_DAY

HOUR_S = 3600.0
YEAR_DAYS = 365.0
KWH_J = 3.6e6  # joules in one kWh
BILLION = 1e9
PRICE_FILE = CATALOG_DIR / "prices.yaml"
PowerBasis = Literal["typical", "tdp"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuPrice(_Spec):
    purchase_usd: float = Field(gt=0, description="one GPU")
    rent_usd_per_gpu_hour: float = Field(gt=0, description="on-demand list price of one GPU")
    typical_W: float = Field(gt=0, le=5000, description="sustained board power while training")
    source: str
    date: str


class NodePrice(_Spec):
    purchase_usd: float = Field(ge=0, description="the server less its GPUs, plus its share of the network")
    power_W: float = Field(ge=0, description="non-GPU power of one node at load")
    rack_units: float = Field(gt=0, le=100)
    gpus_per_node: int = Field(gt=0, le=1024)
    intra_node: str
    inter_node: str
    nics_per_node: int = Field(gt=0, le=1024)
    gpus_per_pcie_switch: int = Field(default=1, gt=0, le=64, description="GPUs sharing one PCIe uplink")
    source: str
    date: str


class Site(_Spec):
    electricity_usd_per_kWh: float = Field(ge=0, le=10)
    pue: float = Field(ge=1, le=5, description="facility power / IT power")
    depreciation_years: float = Field(gt=0, le=50)
    rack_U: float = Field(default=42, gt=0)
    source: str
    date: str


@dataclass(frozen=True)
class Prices:
    gpus: dict[str, GpuPrice]
    nodes: dict[str, NodePrice]
    site: Site

    def gpu(self, name: str) -> GpuPrice:
        if name not in self.gpus:
            raise SpecError(
                f"prices: no price for GPU {name!r} (priced: {', '.join(sorted(self.gpus))}); give one in a --prices "
                f"file: gpus: {{{name}: {{purchase_usd: ..., rent_usd_per_gpu_hour: ..., typical_W: ..., source: ..., "
                "date: ...}} (the format of catalog/prices.yaml)"
            )
        return self.gpus[name]

    def node(self, name: str) -> NodePrice:
        if name not in self.nodes:
            raise SpecError(
                f"prices: no node entry for GPU {name!r} (have: {', '.join(sorted(self.nodes))}); give one in a "
                f"--prices file: nodes: {{{name}: {{purchase_usd: ..., power_W: ..., rack_units: ..., "
                "gpus_per_node: ..., intra_node: ..., inter_node: ..., nics_per_node: ..., source: ..., date: ...}} "
                "(see catalog/prices.yaml)"
            )
        return self.nodes[name]


_MODELS = {"gpus": GpuPrice, "nodes": NodePrice, "site": Site}


def load_prices(override: Path | str | None = None, **site_changes: Any) -> Prices:
    """Built-in prices, merged with an override file (same sections); ``site_changes`` override site fields."""
    raw = read_yaml(PRICE_FILE)
    data = {s: {k: dict(v) for k, v in (raw.get(s) or {}).items()} for s in _MODELS}
    if override is not None:
        for section, entries in read_overrides(override, _MODELS, ("source", "date"), "price").items():
            for name, entry in entries.items():
                data[section][name] = {**data[section].get(name, {}), **entry}
    gpus = {k: build(GpuPrice, v, f"prices.gpus.{k}") for k, v in data["gpus"].items()}
    nodes = {k: build(NodePrice, v, f"prices.nodes.{k}") for k, v in data["nodes"].items()}
    site_raw = {**data["site"].get("default", {}), **{k: v for k, v in site_changes.items() if v is not None}}
    site = build(Site, site_raw, "prices.site.default")
    return Prices(gpus, nodes, site)


# ----------------------------------------------------------------------------- a cluster's running cost
@dataclass(frozen=True)
class ClusterCost:
    """What one cluster costs per second, owned or rented, and what it draws and occupies."""

    gpus: int
    nodes: int
    capex_usd: float
    it_power_W: float  # GPUs + hosts, before PUE
    facility_power_W: float  # × PUE
    owned_usd_per_s: float  # depreciation + electricity
    rented_usd_per_s: float
    rack_units: float
    racks: int

    def usd_per_s(self, mode: str) -> float:
        return self.owned_usd_per_s if mode == "owned" else self.rented_usd_per_s


def cluster_cost(
    gpu_name: str,
    num_gpus: int,
    gpus_per_node: int,
    prices: Prices,
    power: PowerBasis = "typical",
    tdp_W: float | None = None,
) -> ClusterCost:
    g, n, s = prices.gpu(gpu_name), prices.node(gpu_name), prices.site
    nodes = max(1, math.ceil(num_gpus / gpus_per_node))
    if power == "tdp" and tdp_W is None:
        raise SpecError("power basis 'tdp' needs the GPU's TDP")
    p_gpu = tdp_W if power == "tdp" else g.typical_W
    capex = num_gpus * g.purchase_usd + nodes * n.purchase_usd
    it_w = num_gpus * p_gpu + nodes * n.power_W
    facility_w = it_w * s.pue
    depreciation_usd_per_s = capex / (s.depreciation_years * YEAR_DAYS * SECONDS_PER_DAY)
    electricity_usd_per_s = facility_w / KWH_J * s.electricity_usd_per_kWh  # W = J/s; J / (J/kWh) × $/kWh
    rack_units = nodes * n.rack_units
    return ClusterCost(
        gpus=num_gpus,
        nodes=nodes,
        capex_usd=capex,
        it_power_W=it_w,
        facility_power_W=facility_w,
        owned_usd_per_s=depreciation_usd_per_s + electricity_usd_per_s,
        rented_usd_per_s=num_gpus * g.rent_usd_per_gpu_hour / HOUR_S,
        rack_units=rack_units,
        racks=math.ceil(rack_units / s.rack_U),
    )


def job_cluster_cost(job: Job, prices: Prices, power: PowerBasis = "typical") -> ClusterCost:
    c = job.cluster
    if c.pools:
        return pools_cluster_cost(job, prices, power)
    return cluster_cost(c.gpu.name, c.num_gpus, c.gpus_per_node, prices, power, c.gpu.tdp_W)


def pools_cluster_cost(job: Job, prices: Prices, power: PowerBasis = "typical") -> ClusterCost:
    """A cluster of GPU pools: each pool priced as its own GPUs and nodes (prices.yaml by its GPU), summed."""
    parts = [
        cluster_cost(p.gpu.name, p.num_gpus, p.gpus_per_node, prices, power, p.gpu.tdp_W) for p in job.cluster.pools
    ]
    rack_units = sum(x.rack_units for x in parts)
    return ClusterCost(
        gpus=sum(x.gpus for x in parts),
        nodes=sum(x.nodes for x in parts),
        capex_usd=sum(x.capex_usd for x in parts),
        it_power_W=sum(x.it_power_W for x in parts),
        facility_power_W=sum(x.facility_power_W for x in parts),
        owned_usd_per_s=sum(x.owned_usd_per_s for x in parts),
        rented_usd_per_s=sum(x.rented_usd_per_s for x in parts),
        rack_units=rack_units,
        racks=math.ceil(rack_units / prices.site.rack_U),
    )


# ----------------------------------------------------------------------------- cost of a training run
@dataclass(frozen=True)
class TrainingCost:
    tokens: float
    tokens_per_s: float
    tokens_per_day: float
    days: float
    gpu_hours: float
    energy_MWh: float  # facility energy (× PUE)
    owned_usd: float
    rented_usd: float
    owned_usd_per_B_tokens: float
    rented_usd_per_B_tokens: float
    capex_usd: float
    facility_power_kW: float
    rack_units: float
    racks: int

    def usd_per_B_tokens(self, mode: str) -> float:
        return self.owned_usd_per_B_tokens if mode == "owned" else self.rented_usd_per_B_tokens

    def usd(self, mode: str) -> float:
        """Dollars for the whole run, owned (depreciation + electricity) or rented."""
        return self.owned_usd if mode == "owned" else self.rented_usd

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_cost(cc: ClusterCost, tokens_per_s: float, tokens: float) -> TrainingCost:
    """Cost of training ``tokens`` at ``tokens_per_s`` on a cluster whose running cost is ``cc``."""
    if tokens_per_s <= 0:
        raise SpecError("tokens_per_s must be positive")
    t = tokens / tokens_per_s  # seconds
    s_per_B = BILLION / tokens_per_s
    return TrainingCost(
        tokens=tokens,
        tokens_per_s=tokens_per_s,
        tokens_per_day=tokens_per_s * SECONDS_PER_DAY,
        days=t / SECONDS_PER_DAY,
        gpu_hours=cc.gpus * t / HOUR_S,
        energy_MWh=cc.facility_power_W * t / KWH_J / 1e3,
        owned_usd=cc.owned_usd_per_s * t,
        rented_usd=cc.rented_usd_per_s * t,
        owned_usd_per_B_tokens=cc.owned_usd_per_s * s_per_B,
        rented_usd_per_B_tokens=cc.rented_usd_per_s * s_per_B,
        capex_usd=cc.capex_usd,
        facility_power_kW=cc.facility_power_W / 1e3,
        rack_units=cc.rack_units,
        racks=cc.racks,
    )


def job_training_cost(
    job: Job, tokens_per_s: float, prices: Prices, tokens: float | None = None, power: PowerBasis = "typical"
) -> TrainingCost:
    """Cost of the job's training run (``training.tokens``, else ``tokens``, else one billion tokens)."""
    n = tokens or job.training.tokens or BILLION
    return training_cost(job_cluster_cost(job, prices, power), tokens_per_s, n)


def usd_per_B_tokens(usd_per_s: float, tokens_per_s: Any) -> Any:
    """$ per billion tokens at a running cost (works on NumPy arrays of tokens/s)."""
    return usd_per_s * BILLION / tokens_per_s
