"""``costs.predict``: the library behind ``commtax collective`` (ring all-reduce time on one NVLink node)."""

from __future__ import annotations

import pytest

from commtax.costs.collectives import collective_cost
from commtax.costs.predict import cluster_from_options, predict_collective, sweep_sizes
from commtax.costs.topology import placement
from commtax.errors import SpecError

NODE = dict(gpu="h100-sxm5-80gb", gpus=None, gpus_per_node=8, intra="nvlink4", inter="ib-ndr", nics_per_node=8)


def test_a_prediction_is_the_cost_model_on_the_group_placement():
    cluster = cluster_from_options(None, None, **NODE)
    pred = predict_collective("all_reduce", 256 * 2**20, cluster, algorithm="ring", protocol="Simple")
    row = pred.rows[0]
    c = collective_cost("all_reduce", 256 * 2**20, placement(cluster, 8, 1, "all_reduce"), "ring", "Simple")
    assert (pred.gpus, pred.per_node) == (8, 8)
    assert row["time_s"] == c.time_s
    # busbw = algbw x 2(n-1)/n for all-reduce (nccl-tests PERFORMANCE.md)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * 7 / 8, rel=1e-12)


def test_the_sweep_doubles_from_8_bytes_as_nccl_tests_do():
    assert sweep_sizes(64) == [8.0, 16.0, 32.0, 64.0]
    cluster = cluster_from_options(None, None, **NODE)
    assert [r["message_bytes"] for r in predict_collective("all_gather", 100, cluster, sweep=True).rows] == [
        8.0,
        16.0,
        32.0,
        64.0,
    ]


def test_bad_groups_are_refused_with_the_flag_named():
    cluster = cluster_from_options(None, None, **{**NODE, "gpus": 16})
    with pytest.raises(SpecError, match="--gpus: a group spanning nodes must be a multiple of gpus_per_node"):
        predict_collective("all_reduce", 1e6, cluster, gpus=12)
    with pytest.raises(SpecError, match="--algorithm: all_to_all has one algorithm"):
        predict_collective("all_to_all", 1e6, cluster, algorithm="ring")
