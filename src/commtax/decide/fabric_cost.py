"""What a cluster's scale-out fabric costs to buy: switch ports, switches, transceivers and fibre, per level.

Counted from ``cluster.fabric`` (spec/fabric.py) and the node count, NIC count and NIC rate, priced by
catalog/fabric_prices.yaml (the entry whose ``port_Gbps`` is the NIC rate). Every NIC is one port on a leaf;
a leaf's uplinks are its down ports over the leaf oversubscription, and when leaves form pods a pod's uplinks are
its leaves' uplinks over the pod oversubscription (a fat tree's port arithmetic: Leiserson, "Fat-trees", IEEE
Trans. Computers 1985; NVIDIA DGX SuperPOD RA-11333-001 counts its leaf and spine switches the same way):

    leaf ports   = D + U1,   D = nodes · nics,   U1 = ⌈D / o_leaf⌉
    spine ports  = U1 + U2,  U2 = ⌈U1 / o_pod⌉ (pods only; else U2 = 0 and the spine has U1 down ports)
    core ports   = U2
    switches     = ⌈ports / radix⌉ per level (per leaf group: ⌈nodes_per_leaf · nics · (1 + 1/o_leaf) / radix⌉)

Links: D node links (a NIC transceiver, half a twin-port transceiver in the leaf, a fibre) and U1 + U2 switch
links (half a twin-port transceiver at each end, a fibre). ``single-switch``: D ports on one tier, no uplinks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from pydantic import Field

from commtax.errors import SpecError
from commtax.spec import CATALOG_DIR, Cluster, build, read_yaml
from commtax.spec.base import _Spec

FABRIC_PRICE_FILE = CATALOG_DIR / "fabric_prices.yaml"


class FabricPrice(_Spec):
    port_Gbps: float = Field(gt=0, le=100_000, allow_inf_nan=False)
    switch_radix: int = Field(gt=1, le=10_000)
    switch_usd: float = Field(ge=0, le=1e8, allow_inf_nan=False)
    nic_optic_usd: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    switch_optic_usd: float = Field(ge=0, le=1e6, allow_inf_nan=False, description="one twin-port (2-port) module")
    fiber_usd: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    source: str
    date: str


@lru_cache(maxsize=1)
def fabric_prices() -> dict[str, FabricPrice]:
    raw = read_yaml(FABRIC_PRICE_FILE)
    return {k: build(FabricPrice, v, f"fabric_prices.{k}") for k, v in raw.items()}


@dataclass(frozen=True)
class FabricCapex:
    """The parts of one fabric and their price."""

    price_id: str
    switches: dict[str, int]  # per level: leaf, spine, core
    ports: dict[str, int]  # switch ports used per level
    node_links: int
    switch_links: int
    nic_optics: int
    switch_optics: int  # twin-port modules
    fibers: int
    usd: float

    def to_dict(self) -> dict:
        return asdict(self)


def price_for(cluster: Cluster) -> tuple[str, FabricPrice] | None:
    """The catalog entry for the cluster's NIC rate, or None when no entry runs at it."""
    rate = cluster.inter_node.bw_Gbps
    for k, p in fabric_prices().items():
        if math.isclose(p.port_Gbps, rate, rel_tol=1e-6):
            return k, p
    return None


def fabric_capex(cluster: Cluster, price: tuple[str, FabricPrice] | None = None) -> FabricCapex | None:
    """Switches, optics and fibre of ``cluster.fabric`` and what they cost; None without a fabric or a price for
    its NIC rate."""
    f = cluster.fabric
    if f is None:
        return None
    price = price or price_for(cluster)
    if price is None:
        return None
    pid, p = price
    nodes, nics = cluster.nodes, cluster.nics_per_node
    D = nodes * nics
    if f.topology == "single-switch":
        ports = {"leaf": D}
        switches = {"leaf": math.ceil(D / p.switch_radix)}
        uplinks = 0
    else:
        o_leaf = f.oversubscription.get("leaf", 1.0)
        leaves = math.ceil(nodes / f.nodes_per_leaf)
        per_leaf_down = min(nodes, f.nodes_per_leaf) * nics
        per_leaf_up = math.ceil(per_leaf_down / o_leaf)
        U1 = leaves * per_leaf_up
        pods = math.ceil(leaves / f.leaves_per_pod) if f.leaves_per_pod else 1
        U2 = math.ceil(U1 / f.oversubscription.get("pod", 1.0)) if pods > 1 else 0
        ports = {"leaf": D + U1, "spine": U1 + U2}
        switches = {
            "leaf": leaves * math.ceil((per_leaf_down + per_leaf_up) / p.switch_radix),
            "spine": math.ceil((U1 + U2) / p.switch_radix),
        }
        if U2:
            ports["core"] = U2
            switches["core"] = math.ceil(U2 / p.switch_radix)
        uplinks = U1 + U2
    switch_ends = D + 2 * uplinks  # link ends in switch cages, two to a twin-port module
    optics = math.ceil(switch_ends / 2)
    usd = (
        sum(switches.values()) * p.switch_usd
        + D * p.nic_optic_usd
        + optics * p.switch_optic_usd
        + (D + uplinks) * p.fiber_usd
    )
    return FabricCapex(pid, switches, ports, D, uplinks, D, optics, D + uplinks, usd)


def fabric_capex_or_error(cluster: Cluster) -> FabricCapex:
    """As ``fabric_capex``, but a missing fabric or price is one SpecError line."""
    if cluster.fabric is None:
        raise SpecError("cluster.fabric: no fabric to price; give the cluster a fabric (catalog/fabrics.yaml)")
    capex = fabric_capex(cluster)
    if capex is None:
        rates = ", ".join(f"{p.port_Gbps:g}" for p in fabric_prices().values())
        raise SpecError(
            f"cluster.inter_node: no fabric price for {cluster.inter_node.bw_Gbps:g} Gb/s NICs (priced: {rates} Gb/s); "
            "add an entry to catalog/fabric_prices.yaml"
        )
    return capex
