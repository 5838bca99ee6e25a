"""The fabric's capex: switches, optics and fibre counted from cluster.fabric and priced (decide.fabric_cost)."""

from __future__ import annotations

import pytest

from commtax.decide.fabric_cost import fabric_capex, fabric_capex_or_error, fabric_prices
from commtax.errors import SpecError
from commtax.spec import Cluster, load_job

NODE = {
    "gpu": "h100-sxm5-80gb",
    "gpus_per_node": 8,
    "intra_node": "nvlink4",
    "inter_node": "ib-ndr",
}


def cluster(nodes: int, nics: int, fabric: dict | None) -> Cluster:
    from commtax.spec import build, load_catalog, resolve_cluster

    raw = {**NODE, "num_gpus": 8 * nodes, "nics_per_node": nics, "fabric": fabric}
    return build(Cluster, resolve_cluster(raw, load_catalog(None), field="cluster"), "cluster")


def test_a_two_leaf_fabric_counted_by_hand():
    # 8 nodes × 2 NICs under leaves of 4 nodes at 2:1: a leaf has 8 ports down and 4 up (12 ≤ 64: one switch each),
    # the spine 2 · 4 = 8 ports (one switch). 16 node links + 8 uplinks; link ends in switch cages 16 + 2·8 = 32,
    # two to a twin-port module: 16 modules; 16 NIC modules; 24 fibres.
    c = fabric_capex(cluster(8, 2, {"topology": "tor", "nodes_per_leaf": 4, "oversubscription": {"leaf": 2}}))
    assert c.switches == {"leaf": 2, "spine": 1} and c.ports == {"leaf": 24, "spine": 8}
    assert (c.node_links, c.switch_links, c.nic_optics, c.switch_optics, c.fibers) == (16, 8, 16, 16, 24)
    # 3 switches · $36,000 + 16 · $700 + 16 · $1,250 + 24 · $100 (catalog/fabric_prices.yaml ndr-400g)
    assert c.usd == pytest.approx(3 * 36000 + 16 * 700 + 16 * 1250 + 24 * 100) == 141_600


def test_pods_add_a_core_tier_over_their_oversubscription():
    # 8 nodes × 2 NICs, 2 nodes a leaf (4 down, 4 up at 1:1), 2 leaves a pod: 4 leaves, 2 pods; U1 = 16 leaf
    # uplinks, U2 = 16 / 4 = 4 pod uplinks: spine ports 16 + 4, core ports 4
    f = {"topology": "tor", "nodes_per_leaf": 2, "leaves_per_pod": 2, "oversubscription": {"leaf": 1, "pod": 4}}
    c = fabric_capex(cluster(8, 2, f))
    assert c.ports == {"leaf": 32, "spine": 20, "core": 4} and c.switches == {"leaf": 4, "spine": 1, "core": 1}
    assert c.switch_links == 20 and c.switch_optics == (16 + 2 * 20) // 2


def test_the_1024_gpu_superpod_and_its_4_to_1_spine():
    # 128 DGX H100 (4 scalable units of 32, 8 rails): 8 leaf switches per SU (32 down + 32 up each) and 16 spine
    # switches, 48 in all -- the count of the "H100 Freakonomics" sheet (tech-talk-cto.com, Aug 2024: 128 nodes,
    # 48 switches) and of the DGX SuperPOD RA's 4-SU compute fabric
    full = fabric_capex(load_job("examples/fabric/llama3-70b-1024-h100.yaml").cluster)
    assert full.switches == {"leaf": 32, "spine": 16}
    # 4:1: 64 uplinks per SU, so 320 leaf ports per SU (5 switches) and 256 spine ports (4 switches)
    thin = fabric_capex(load_job("examples/fabric/llama3-70b-1024-h100-4to1.yaml").cluster)
    assert thin.switches == {"leaf": 20, "spine": 4}
    assert full.usd - thin.usd == pytest.approx(24 * 36000 + 768 * 1250 + 768 * 100)  # 24 switches, 768 uplinks


def test_no_fabric_or_no_price_is_said_in_one_line():
    plain = load_job("examples/llama2-70b-h100.yaml").cluster
    assert fabric_capex(plain) is None
    with pytest.raises(SpecError, match="cluster.fabric: no fabric to price"):
        fabric_capex_or_error(plain)
    slow = cluster(2, 1, {"topology": "tor", "nodes_per_leaf": 2}).model_copy(
        update={"inter_node": plain.inter_node.model_copy(update={"bw_Gbps": 25.0})}
    )
    with pytest.raises(SpecError, match="no fabric price for 25 Gb/s NICs"):
        fabric_capex_or_error(slow)


def test_every_price_has_a_source_and_a_date():
    assert all(p.source.strip() and p.date for p in fabric_prices().values())


def test_compare_shows_fabric_dollars_and_what_the_thinner_spine_saves():
    from commtax.decide.compare import Row, fabric_tradeoff_lines

    jobs = [load_job(f"examples/fabric/llama3-70b-1024-h100{s}.yaml") for s in ("", "-4to1")]

    class Cost:  # the two runs' training as `compare --rent` gives them (days, $), any numbers do
        def __init__(self, days, usd):
            self.days, self._usd = days, usd

        def usd(self, mode):
            return self._usd

    rows = [Row(f"r{i}", j, None, None, Cost(200 + i, 16e6 + i * 0.1e6), None, None) for i, j in enumerate(jobs)]
    assert rows[0].to_dict()["fabric_capex_usd"] == pytest.approx(rows[0].fabric_capex.usd)
    (line,) = fabric_tradeoff_lines(rows, "rented")
    saved = (rows[0].fabric_capex.usd - rows[1].fabric_capex.usd) / 1e6
    assert (
        line == f"fabric: r1 against r0: ${saved:.2f}M less in switches, optics and fibre; training +1.0 days, "
        "+$0.10M (rented)"
    )
    assert (
        "fabric_capex_usd"
        not in Row("x", load_job("examples/llama2-70b-h100.yaml"), None, None, None, None, None).to_dict()
    )
