"""What ``commtax bench pipeline`` and ``bench moe`` are asked to run, checked once in the launcher, before torch
is imported or a rank started: each bad option is a ``SpecError`` naming it and the fix (no torch import here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from commtax.errors import SpecError

MAX_MOE_EXPERTS = 1024
MAX_MOE_HIDDEN = 8192
MAX_MOE_TOKENS = 65_536
MAX_MOE_STEPS = 10_000
FP32_BYTES = 4  # bench moe's activations and weights


# ----------------------------------------------------------------------------- bench pipeline
def stage_layers(text: str, layers: int) -> tuple[int, ...]:
    """``--stage-layers 3,1``: blocks per pipeline stage, each ≥ 0, summing to ``layers``, at least 2 stages."""
    try:
        split = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecError(f"--stage-layers: {text!r} is not a comma list of block counts, e.g. 3,1") from None
    if any(x < 0 for x in split) or sum(split) != layers:
        raise SpecError(f"--stage-layers {text}: must be ≥ 0 each and sum to --layers ({layers})")
    if len(split) < 2:
        raise SpecError("--stage-layers: a pipeline needs at least 2 stages, e.g. 2,2")
    return split


def pipeline_stages(
    text: str, layers: int, hidden: int, heads: int, cluster_file: Path | None = None
) -> tuple[tuple[int, ...], dict | None]:
    """The blocks per stage (``--stage-layers``) and the cluster YAML they run on (None: one machine): the model's
    heads divide its width, and a cluster of several nodes gets one stage per node."""
    split = stage_layers(text, layers)
    if hidden % heads:
        raise SpecError(f"--hidden ({hidden}) must be divisible by --heads ({heads})")
    if cluster_file is None:
        return split, None
    from commtax.measure.calibrate import read_cluster

    cluster = read_cluster(cluster_file)
    if cluster.get("pools") and len(cluster["pools"]) != len(split):
        raise SpecError(
            f"--stage-layers: {len(split)} stages on a cluster of {len(cluster['pools'])} nodes; give one per node"
        )
    return split, cluster


def pipeline_records(out: Path) -> list[dict]:
    """``--append``: the ``bench pipeline`` records already in ``out`` (ResultFile's loader checks collective
    records' fields, which pipeline records do not have)."""
    try:
        old = json.loads(out.read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"--append: cannot read {out}: {e}") from None
    if not isinstance(old, list) or not all(isinstance(r, dict) and r.get("bench") == "pipeline" for r in old):
        raise SpecError(f"--append: {out} does not hold `bench pipeline` records; give another --out")
    return old


# ----------------------------------------------------------------------------- bench moe
def moe_rank_bytes(experts: int, top_k: int, hidden: int, ffn: int, tokens: int, ranks: int) -> int:
    """Memory of one rank: its tokens, k copies out and back, the received rows (≤ n·T·k at λ = E/k) and all E
    experts' two weight matrices, fp32."""
    return FP32_BYTES * (tokens * hidden * (1 + 4 * top_k + 2 * ranks * top_k) + 2 * experts * hidden * ffn)


def check_moe(
    experts: int,
    top_k: int,
    hidden: int,
    ffn: int,
    tokens: int,
    imbalance: float,
    steps: int,
    warmup: int,
    timeout_s: float,
    ranks: int,
    free_bytes: int = 0,
) -> None:
    """Every option within what one MoE layer on ``ranks`` CPU ranks can run: experts that divide over the ranks,
    an imbalance λ the router can reach (≤ E/top-k), memory that fits ``free_bytes`` (0: unknown, not checked)."""
    if not 1 <= experts <= MAX_MOE_EXPERTS:
        raise SpecError(f"--experts: 1 to {MAX_MOE_EXPERTS}, got {experts}")
    if experts % ranks:
        raise SpecError(f"--experts: {experts} experts do not divide over {ranks} ranks; use a multiple of {ranks}")
    if not 1 <= top_k <= experts:
        raise SpecError(f"--top-k: 1 to --experts ({experts}), got {top_k}")
    for name, v, hi in (("--hidden", hidden, MAX_MOE_HIDDEN), ("--ffn", ffn, 4 * MAX_MOE_HIDDEN)):
        if not 1 <= v <= hi:
            raise SpecError(f"{name}: 1 to {hi}, got {v}")
    if not 1 <= tokens <= MAX_MOE_TOKENS:
        raise SpecError(f"--tokens: 1 to {MAX_MOE_TOKENS} per rank, got {tokens}")
    if not (math.isfinite(imbalance) and 1.0 <= imbalance <= experts / top_k):
        raise SpecError(
            f"--imbalance: λ from 1 to E/top-k = {experts / top_k:g} (every token on the hot expert), got {imbalance}"
        )
    if not 1 <= steps <= MAX_MOE_STEPS or not 0 <= warmup <= MAX_MOE_STEPS:
        raise SpecError(
            f"--steps/--warmup: 1 to {MAX_MOE_STEPS} timed steps, 0 to {MAX_MOE_STEPS} warm-up, got {steps}/{warmup}"
        )
    if not math.isfinite(timeout_s):
        raise SpecError(f"--timeout: seconds, finite, got {timeout_s}")
    rank_bytes = moe_rank_bytes(experts, top_k, hidden, ffn, tokens, ranks)
    if free_bytes and ranks * rank_bytes > free_bytes:
        raise SpecError(
            f"--tokens/--hidden/--ffn/--experts: {ranks} ranks × {rank_bytes / 2**30:.2f} GiB do not fit the "
            f"{free_bytes / 2**30:.1f} GiB free; make them smaller"
        )
