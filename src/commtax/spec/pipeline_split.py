"""How transformer layers are split over pipeline stages and virtual stages."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from commtax.spec.plan import Plan


# ----------------------------------------------------------------------------- pipeline split
def pipeline_split(layers: int, plan: Plan) -> tuple[int, ...]:
    """Transformer layers of each virtual stage k = chunk·pp + stage (pp·vp entries; chunk 0 of stage 0 holds the
    embedding, the last chunk of the last stage the LM head and loss). Raises ValueError naming the field and the fix.

    * ``stage_layers``: as given (pp entries); with vp > 1 each entry splits evenly over its chunks.
    * ``first_stage_layers`` / ``last_stage_layers``: the rest go evenly to the other stages (Megatron-Core
      ``num_layers_in_first/last_pipeline_stage``: the middle stages must share them evenly).
    * ``account_for_embedding/loss_in_pipeline_split``: the embedding (loss) counts as one layer; layers + those
      must divide evenly over pp·vp virtual stages (Megatron-Core ``get_transformer_layer_offset``): Llama 3
      405B's 126 layers + 2 on 16 stages = 8 each, 7 on the first and the last.
    * otherwise the most balanced split: ⌊L/pp⌋ layers per stage, the remainder one each to the middle stages
      first (the ends carry the embedding and the head), then the first, then the last; with vp > 1 in units of
      vp layers, so that a stage's chunks are equal (Megatron-Core splits a stage evenly over its chunks).
    """
    if plan.pipeline_layout is not None:
        return _layout(layers, plan.pp, plan.vp, plan.pipeline_layout, plan)
    return _split(
        layers,
        plan.pp,
        plan.vp,
        plan.stage_layers,
        plan.first_stage_layers,
        plan.last_stage_layers,
        plan.account_for_embedding_in_pipeline_split,
        plan.account_for_loss_in_pipeline_split,
    )


def _layout(layers: int, p: int, v: int, layout: tuple[int, ...], plan: Plan) -> tuple[int, ...]:
    """``pipeline_layout`` as given: pp·vp non-negative counts summing to the layers, no other split field."""
    others = [f for f in ("stage_layers", "first_stage_layers", "last_stage_layers") if getattr(plan, f) is not None]
    if others or plan.account_for_embedding_in_pipeline_split or plan.account_for_loss_in_pipeline_split:
        raise ValueError("pipeline_layout gives every virtual stage's layers: drop the other pipeline-split fields")
    if len(layout) != p * v:
        raise ValueError(f"pipeline_layout has {len(layout)} entries; give pp({p}) * vp({v}) = {p * v}")
    if any(x < 0 for x in layout) or sum(layout) != layers:
        raise ValueError(f"pipeline_layout {list(layout)} must be ≥ 0 each and sum to layers({layers})")
    return tuple(layout)


def balanced_layout(layers: int, p: int, v: int) -> tuple[int, ...]:
    """The most even split of ``layers`` over pp·vp virtual stages, one more layer each to the middle ones first
    (the first and last carry the embedding and the loss), as a ``pipeline_layout``."""
    n = p * v
    out = [layers // n] * n
    order = list(range(1, n - 1)) + [0, n - 1]
    for k in order[: layers % n]:
        out[k] += 1
    return tuple(out)


@lru_cache(maxsize=4096)
def _split(
    layers: int,
    p: int,
    v: int,
    stage_layers: tuple[int, ...] | None,
    first_stage_layers: int | None,
    last_stage_layers: int | None,
    embedding: bool,
    loss: bool,
) -> tuple[int, ...]:
    _check_split_fields(p, stage_layers, first_stage_layers, last_stage_layers, embedding or loss)
    if stage_layers is not None:
        stages = _given_stages(layers, p, stage_layers)
    elif first_stage_layers is not None or last_stage_layers is not None:
        stages = _ends_given(layers, p, first_stage_layers, last_stage_layers)
    elif embedding or loss:  # the virtual stages come out of the counting whole: no per-stage split to check
        return _accounted_chunks(layers, p, v, embedding, loss)
    else:
        stages = _balanced_stages(layers, p, v)
    return _chunks_of(stages, v)


def _check_split_fields(
    p: int,
    stage_layers: tuple[int, ...] | None,
    first_stage_layers: int | None,
    last_stage_layers: int | None,
    accounted: bool,
) -> None:
    """The split fields given together only where Megatron-Core takes them together."""
    given = {
        "stage_layers": stage_layers,
        "first_stage_layers": first_stage_layers,
        "last_stage_layers": last_stage_layers,
    }
    explicit = [f for f, x in given.items() if x is not None]
    if explicit and p == 1:
        raise ValueError(f"{explicit[0]} needs pp > 1; remove it or raise pp")
    if stage_layers is not None and len(explicit) > 1:
        raise ValueError("stage_layers: give either stage_layers or first_stage_layers/last_stage_layers, not both")
    if explicit and accounted:
        raise ValueError(
            f"{explicit[0]}: Megatron-Core does not combine explicit stage layers with "
            "account_for_embedding/loss_in_pipeline_split; drop one of them"
        )


def _given_stages(layers: int, p: int, stages: tuple[int, ...]) -> tuple[int, ...]:
    """``stage_layers`` as given: one non-negative count per stage, summing to the layers."""
    if len(stages) != p:
        raise ValueError(f"stage_layers has {len(stages)} entries; give one per pipeline stage, pp({p})")
    if any(x < 0 for x in stages) or sum(stages) != layers:
        raise ValueError(f"stage_layers {list(stages)} must be ≥ 0 each and sum to layers({layers}), got {sum(stages)}")
    return stages


def _ends_given(layers: int, p: int, first: int | None, last: int | None) -> tuple[int, ...]:
    """``first_stage_layers`` / ``last_stage_layers``, the other stages sharing the rest evenly."""
    ends = [x for x in (first, last) if x is not None]
    rest, between = layers - sum(ends), p - len(ends)
    if rest < 0 or (between == 0 and rest) or (between and rest % between):
        raise ValueError(
            f"first_stage_layers/last_stage_layers ({first}, {last}) leave {rest} layers for the {between} other "
            f"stage(s); they must share them evenly (Megatron-Core): pick counts so that layers({layers}) minus "
            "them divides by the other stages"
        )
    middle = rest // between if between else 0
    return tuple([first if first is not None else middle] + [middle] * (p - 2) + [last if last is not None else middle])


def _accounted_chunks(layers: int, p: int, v: int, embedding: bool, loss: bool) -> tuple[int, ...]:
    """The embedding and the loss counted as a layer each, every virtual stage the same count."""
    n = p * v
    extra_first, extra_last = int(embedding), int(loss)
    total = layers + extra_first + extra_last
    if total % n:
        raise ValueError(
            f"account_for_embedding/loss_in_pipeline_split: layers({layers}) + {extra_first + extra_last} = "
            f"{total} must divide by pp({p}) * vp({v}) = {n} (Megatron-Core); change pp/vp or drop the flags"
        )
    chunks = [total // n] * n
    chunks[0] -= extra_first
    chunks[-1] -= extra_last
    if min(chunks) < 0:
        raise ValueError(f"account_for_*_in_pipeline_split: too few layers({layers}) for pp({p}) * vp({v})")
    return tuple(chunks)


def _balanced_stages(layers: int, p: int, v: int) -> list[int]:
    """The most balanced split in units of vp layers (a stage's chunks equal): the remainder one unit each to the
    middle stages first, then the first, then the last."""
    n = p * v
    if layers < n:
        raise ValueError(
            f"pp({p}) * vp({v}) = {n} virtual stages exceed layers({layers}): each needs a layer; lower pp or vp"
        )
    if layers % v:
        # interleaving runs a stage's chunks in turn: Megatron-Core needs each stage's layers to split evenly
        raise ValueError(
            f"vp({v}) must divide layers({layers}) so that each stage's chunks are equal "
            "(Megatron-Core); change vp or give stage_layers"
        )
    units = layers // v  # one unit = one layer on each of a stage's v chunks
    stages = [units // p] * p
    order = list(range(1, p - 1)) + [0, p - 1]
    for s in order[: units % p]:
        stages[s] += 1
    return [x * v for x in stages]


def _chunks_of(stages: Sequence[int], v: int) -> tuple[int, ...]:
    """Each stage's layers split evenly over its vp chunks, as virtual stages k = chunk·pp + stage."""
    if v > 1 and any(x % v for x in stages):
        raise ValueError(
            f"stage layers {list(stages)}: with vp({v}) each stage's layers must divide evenly over its "
            f"{v} chunks; change the split or vp"
        )
    return tuple(x // v for _ in range(v) for x in stages)


@lru_cache(maxsize=4096)  # a search reads a job's stage_layers ~3x per plan variant: a few hundred distinct splits
def per_rank(chunks: tuple[int, ...], p: int, v: int) -> tuple[int, ...]:
    """Layers of each pipeline rank from the layers of each virtual stage k = chunk·p + stage."""
    return tuple(sum(chunks[c * p + s] for c in range(v)) for s in range(p))
