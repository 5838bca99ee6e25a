"""The options of ``bench ddp``, ``bench pipeline`` and ``bench moe``, checked before torch is imported or a rank
started (measure.ddp_options, measure.bench_options): each bad one is one line naming it."""

from __future__ import annotations

import json

import pytest

from commtax.errors import SpecError
from commtax.measure.bench_options import (
    MAX_MOE_EXPERTS,
    check_moe,
    moe_rank_bytes,
    pipeline_records,
    pipeline_stages,
    stage_layers,
)
from commtax.measure.ddp_options import DDP_LIMITS, MAX_DDP_TOKENS, check_ddp_sizes

MOE = dict(experts=8, top_k=2, hidden=256, ffn=512, tokens=1024, imbalance=1.0, steps=10, warmup=2, timeout_s=300.0)


def test_stage_layers_are_block_counts_that_sum_to_the_layers():
    assert stage_layers("3,1", 4) == (3, 1)
    assert stage_layers("0,4", 4) == (0, 4)
    for text, layers, message in (
        ("3,x", 4, r"'3,x' is not a comma list"),
        ("1,1", 4, r"must be ≥ 0 each and sum to --layers \(4\)"),
        ("5,-1", 4, "must be ≥ 0 each"),
        ("4", 4, "at least 2 stages"),
    ):
        with pytest.raises(SpecError, match=message):
            stage_layers(text, layers)


def test_a_pipeline_on_a_cluster_of_nodes_takes_one_stage_per_node(tmp_path):
    import yaml

    with pytest.raises(SpecError, match=r"--hidden \(100\) must be divisible by --heads \(3\)"):
        pipeline_stages("2,2", 4, 100, 3)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"pools": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}))
    with pytest.raises(SpecError, match="2 stages on a cluster of 3 nodes; give one per node"):
        pipeline_stages("2,2", 4, 256, 4, tmp_path / "c.yaml")
    split, cluster = pipeline_stages("1,2,1", 4, 256, 4, tmp_path / "c.yaml")
    assert split == (1, 2, 1) and len(cluster["pools"]) == 3
    with pytest.raises(SpecError, match="^--cluster: .* does not exist"):
        pipeline_stages("2,2", 4, 256, 4, tmp_path / "none.yaml")


def test_append_reads_only_pipeline_records(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(json.dumps([{"bench": "pipeline", "step_s": 1.0}]))
    assert pipeline_records(good) == [{"bench": "pipeline", "step_s": 1.0}]
    other = tmp_path / "c.json"
    other.write_text(json.dumps([{"op": "all_reduce"}]))
    with pytest.raises(SpecError, match="does not hold `bench pipeline` records"):
        pipeline_records(other)
    with pytest.raises(SpecError, match="^--append: cannot read"):
        pipeline_records(tmp_path / "missing.json")


def test_moe_rank_memory_hand_worked():
    # 4 B × (T·h·(1 + 4k + 2nk) + 2·E·h·f) = 4 × (1024·256·17 + 2·8·256·512) = 26,214,400 B
    assert moe_rank_bytes(experts=8, top_k=2, hidden=256, ffn=512, tokens=1024, ranks=2) == 26_214_400


def test_moe_options_are_refused_by_name():
    check_moe(**MOE, ranks=2, free_bytes=2**34)  # the defaults run
    for change, message in (
        ({"experts": MAX_MOE_EXPERTS + 1}, "--experts: 1 to 1024"),
        ({"experts": 6}, "6 experts do not divide over 4 ranks; use a multiple of 4"),
        ({"top_k": 9}, r"--top-k: 1 to --experts \(8\)"),
        ({"imbalance": 5.0}, "λ from 1 to E/top-k = 4"),
        ({"imbalance": float("nan")}, "--imbalance"),
        ({"timeout_s": float("inf")}, "--timeout: seconds, finite"),
    ):
        with pytest.raises(SpecError, match=message):
            check_moe(**{**MOE, **change}, ranks=4)
    need = 4 * moe_rank_bytes(8, 2, 256, 512, 1024, 4)
    with pytest.raises(SpecError, match="4 ranks × .* GiB do not fit"):
        check_moe(**MOE, ranks=4, free_bytes=need - 1)
    check_moe(**MOE, ranks=4, free_bytes=need)


def test_ddp_sizes_name_the_option_over_its_limit():
    check_ddp_sizes(hidden=256, micro_batch=8, seq_len=64)
    with pytest.raises(SpecError, match=f"^--hidden: 100,000 is over the limit of {DDP_LIMITS['--hidden']:,}"):
        check_ddp_sizes(hidden=100_000)
    over = f"16,777,216 tokens per micro-batch per rank, over the limit of {MAX_DDP_TOKENS:,}"
    with pytest.raises(SpecError, match=over):
        check_ddp_sizes(micro_batch=4096, seq_len=4096)
