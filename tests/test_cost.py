"""Cost arithmetic against hand-worked cases; the price catalog's sources; bad price files."""

from __future__ import annotations

import pytest
import yaml

from commtax.decide.cost import (
    HOUR_S,
    KWH_J,
    YEAR_DAYS,
    cluster_cost,
    load_prices,
    training_cost,
    usd_per_B_tokens,
)
from commtax.errors import SpecError
from commtax.units import SECONDS_PER_DAY

SIMPLE = {
    "gpus": {
        "h100-sxm5-80gb": {
            "purchase_usd": 30000,
            "rent_usd_per_gpu_hour": 3.0,
            "typical_W": 600,
            "source": "test",
            "date": "2025-01",
        }
    },
    "nodes": {
        "h100-sxm5-80gb": {"purchase_usd": 80000, "power_W": 3000, "rack_units": 8, "source": "test", "date": "2025-01"}
    },
    "site": {
        "default": {
            "electricity_usd_per_kWh": 0.10,
            "pue": 1.25,
            "depreciation_years": 3,
            "rack_U": 42,
            "source": "test",
            "date": "2025-01",
        }
    },
}


def _prices(tmp_path, data=SIMPLE, name="p.yaml"):
    f = tmp_path / name
    f.write_text(yaml.safe_dump(data))
    return load_prices(f)


def test_every_builtin_price_has_a_source_and_a_date():
    p = load_prices()
    for entry in [*p.gpus.values(), *p.nodes.values(), p.site]:
        assert entry.source.strip() and entry.date.strip()
    # the seed article's three GPUs are priced
    for g in ("h100-sxm5-80gb", "a100-sxm4-80gb", "rtx-4090-24gb"):
        assert p.gpu(g).purchase_usd > 0 and p.node(g).rack_units > 0
    assert 25_000 <= p.gpu("h100-sxm5-80gb").purchase_usd <= 35_000
    assert 10_000 <= p.gpu("a100-sxm4-80gb").purchase_usd <= 15_000
    assert 1_600 <= p.gpu("rtx-4090-24gb").purchase_usd <= 2_000 or p.gpu("rtx-4090-24gb").purchase_usd == 1_599


def test_cluster_cost_hand_worked(tmp_path):
    """256 H100 in 32 nodes of 8 (hand-worked):
    capex = 256 × $30,000 + 32 × $80,000 = $10.24M
    IT power = 256 × 600 W + 32 × 3,000 W = 249.6 kW; facility = × 1.25 = 312 kW
    owned $/s = 10.24e6 / (3 × 365 × 86,400) + 312,000 W / 3.6e6 J/kWh × $0.10
    rented $/s = 256 × $3 / 3,600
    """
    p = _prices(tmp_path)
    cc = cluster_cost("h100-sxm5-80gb", 256, 8, p)
    assert cc.nodes == 32
    assert cc.capex_usd == 256 * 30_000 + 32 * 80_000 == 10_240_000
    assert cc.it_power_W == 256 * 600 + 32 * 3000 == 249_600
    assert cc.facility_power_W == pytest.approx(312_000)
    assert cc.owned_usd_per_s == pytest.approx(10.24e6 / (3 * 365 * 86_400) + 312_000 / 3.6e6 * 0.10)
    assert cc.rented_usd_per_s == pytest.approx(256 * 3.0 / 3600)
    assert cc.rack_units == 32 * 8 and cc.racks == 7  # 256 U / 42 U per rack -> 6.1 -> 7 racks


def test_training_cost_hand_worked(tmp_path):
    """1 M tokens/s for 1e12 tokens: 1e6 s = 11.574 days; GPU-hours 256 × 1e6 / 3600 = 71,111;
    energy 312 kW × 1e6 s = 3.12e11 J = 86.67 MWh; $/B = $/s × 1000 s."""
    p = _prices(tmp_path)
    cc = cluster_cost("h100-sxm5-80gb", 256, 8, p)
    tc = training_cost(cc, tokens_per_s=1e6, tokens=1e12)
    assert tc.days == pytest.approx(1e6 / 86_400)
    assert tc.tokens_per_day == pytest.approx(86_400e6)
    assert tc.gpu_hours == pytest.approx(256 * 1e6 / 3600)
    assert tc.energy_MWh == pytest.approx(312_000 * 1e6 / 3.6e9)
    assert tc.owned_usd_per_B_tokens == pytest.approx(cc.owned_usd_per_s * 1000)
    assert tc.rented_usd_per_B_tokens == pytest.approx(256 * 3.0 / 3600 * 1000)  # $213.33 per B tokens
    assert tc.owned_usd == pytest.approx(tc.owned_usd_per_B_tokens * 1000)  # 1e12 tokens = 1000 B
    assert usd_per_B_tokens(cc.owned_usd_per_s, 1e6) == pytest.approx(tc.owned_usd_per_B_tokens)


def test_seed_article_formula_with_its_own_inputs(tmp_path):
    """The seed article §5.2: cost = (hardware × days / depreciation + electricity) / tokens, with $9M of H100
    (256 × $35,156), 3 years, 700 W per GPU, $0.10/kWh, no PUE, no host power, 14 days at 42 B tokens/day:
    9e6 × 14 / 1095 + 256 × 0.7 kW × 336 h × $0.10 = $115,068 + $6,021 = $121,089 over 588 B tokens = $205.9/B.
    (The article prints $58/B: its own inputs do not give it.)"""
    data = {
        "gpus": {
            "h100-sxm5-80gb": {
                "purchase_usd": 9e6 / 256,
                "rent_usd_per_gpu_hour": 1,
                "typical_W": 700,
                "source": "seed article",
                "date": "2025",
            }
        },
        "nodes": {"h100-sxm5-80gb": {"purchase_usd": 0, "power_W": 0, "source": "seed article", "date": "2025"}},
        "site": {
            "default": {
                "electricity_usd_per_kWh": 0.10,
                "pue": 1.0,
                "depreciation_years": 3,
                "source": "seed article",
                "date": "2025",
            }
        },
    }
    p = _prices(tmp_path, data)
    cc = cluster_cost("h100-sxm5-80gb", 256, 8, p, power="tdp", tdp_W=700)
    tps = 42e9 / SECONDS_PER_DAY
    tc = training_cost(cc, tps, tokens=42e9 * 14)
    assert tc.days == pytest.approx(14)
    hand = 9e6 * 14 / (3 * YEAR_DAYS) + 256 * 0.7 * 14 * 24 * 0.10
    assert hand == pytest.approx(121_089, abs=1)
    assert tc.owned_usd == pytest.approx(hand)
    assert tc.owned_usd_per_B_tokens == pytest.approx(hand / 588, rel=1e-9)
    assert tc.owned_usd_per_B_tokens == pytest.approx(205.9, abs=0.1)


def test_units_used_by_the_arithmetic():
    assert KWH_J == 3.6e6 and HOUR_S == 3600 and YEAR_DAYS == 365


def test_override_merges_fields_of_an_existing_entry(tmp_path):
    mine = {"purchase_usd": 25000, "source": "my quote", "date": "2026-01"}
    p = _prices(tmp_path, {"gpus": {"h100-sxm5-80gb": mine}})
    g = p.gpu("h100-sxm5-80gb")
    assert g.purchase_usd == 25000 and g.source == "my quote"
    assert g.rent_usd_per_gpu_hour == load_prices().gpu("h100-sxm5-80gb").rent_usd_per_gpu_hour
    assert load_prices(electricity_usd_per_kWh=0.2).site.electricity_usd_per_kWh == 0.2


def test_price_file_missing_a_field_is_named(tmp_path):
    new = {"gpus": {"my-gpu": {"purchase_usd": 1000, "typical_W": 300, "source": "x", "date": "2025"}}}
    with pytest.raises(SpecError, match=r"prices\.gpus\.my-gpu\.rent_usd_per_gpu_hour: Field required"):
        _prices(tmp_path, new)
    with pytest.raises(SpecError, match=r"gpus\.h100-sxm5-80gb: missing field 'date'"):
        _prices(tmp_path, {"gpus": {"h100-sxm5-80gb": {"purchase_usd": 1, "source": "x"}}})
    with pytest.raises(SpecError, match=r"unknown price section 'gpu'"):
        _prices(tmp_path, {"gpu": {}})
    with pytest.raises(SpecError, match=r"pue: Input should be greater than or equal to 1"):
        _prices(tmp_path, {"site": {"default": {"pue": 0.5, "source": "x", "date": "2025"}}})
    with pytest.raises(SpecError, match="no price for GPU 'b300'"):
        load_prices().gpu("b300")
    with pytest.raises(SpecError, match="file not found"):
        load_prices(tmp_path / "nope.yaml")


def test_every_catalog_gpu_is_priced_and_a_missing_price_says_how_to_give_one():
    from commtax.spec import _builtin_catalog

    prices = load_prices()
    for gpu in _builtin_catalog()["gpu"]:  # every catalog GPU is priced, with a source and a date
        assert prices.gpu(gpu).source and prices.node(gpu).source
    with pytest.raises(SpecError, match=r"give one in a --prices file: gpus: \{my-gpu: \{purchase_usd"):
        prices.gpu("my-gpu")
