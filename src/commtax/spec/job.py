"""A job: model, cluster, plan, training, and the checks across them."""

from __future__ import annotations

from functools import lru_cache

from pydantic import (
    model_validator,
)

from commtax.spec.base import CATALOG_DIR, _Spec
from commtax.spec.files import read_yaml
from commtax.spec.hardware import Cluster
from commtax.spec.model import Model
from commtax.spec.pipeline_split import per_rank, pipeline_split
from commtax.spec.plan import Plan, Training
from commtax.spec.pools import check_pools


@lru_cache(maxsize=1)
def eager_attention_archs() -> frozenset[str]:
    """GPU architectures without fused attention kernels (catalog/attention.yaml ``eager_archs``)."""
    return frozenset(read_yaml(CATALOG_DIR / "attention.yaml").get("eager_archs", []))


class Job(_Spec):
    model: Model
    cluster: Cluster
    plan: Plan
    training: Training

    @model_validator(mode="after")
    def _consistent(self) -> Job:
        m, c, p, t = self.model, self.cluster, self.plan, self.training
        mp = p.tp * p.pp * p.cp
        if c.num_gpus % mp:
            raise ValueError(f"tp({p.tp}) * pp({p.pp}) * cp({p.cp}) = {mp} does not divide num_gpus({c.num_gpus})")
        dp = c.num_gpus // mp
        if p.dp is not None and p.dp * mp != c.num_gpus:
            raise ValueError(
                f"dp({p.dp}) * tp({p.tp}) * pp({p.pp}) * cp({p.cp}) = {p.dp * mp} != num_gpus({c.num_gpus})"
            )
        if m.heads % p.tp or m.kv_heads_ % p.tp:
            raise ValueError(
                f"tp({p.tp}) must divide heads({m.heads}) and kv_heads({m.kv_heads_}): choose tp in "
                f"{[d for d in range(1, m.kv_heads_ + 1) if m.kv_heads_ % d == 0]}"
            )
        if p.vp > 1 and p.pp == 1:
            raise ValueError("vp > 1 (interleaved 1F1B) needs pp > 1")
        if p.vp > 1 and p.schedule != "1f1b":
            raise ValueError(
                f"vp({p.vp}) > 1 needs schedule 1f1b (interleaving is Megatron's interleaved 1F1B); "
                "set vp: 1 or schedule: 1f1b"
            )
        pipeline_split(m.layers, p)  # raises naming the stage-split field and the fix
        check_pools(self)  # pools: TP inside a pool, stages and batch shares per pool (spec/pools.py)
        dp_across_pools = bool(c.pools) and p.stage_pools is None
        if not dp_across_pools and t.global_batch % (dp * p.micro_batch):
            raise ValueError(
                f"global_batch({t.global_batch}) must be divisible by dp({dp}) * micro_batch({p.micro_batch}) = "
                f"{dp * p.micro_batch}"
            )
        m_micro = t.global_batch // (dp * p.micro_batch)
        if p.vp > 1 and m_micro % p.pp:
            # Megatron-LM/Core schedules.py, forward_backward_pipelining_with_interleaving: "number of microbatches
            # is not divisible by pipeline-model-parallel-size when using interleaved schedule" (Narayanan 2021 §2.2)
            raise ValueError(
                f"vp({p.vp}) > 1 needs the micro-batches per replica, global_batch/(dp*micro_batch) = {m_micro}, to be "
                f"a multiple of pp({p.pp}) (Megatron's interleaved schedule); use vp: 1, a smaller micro_batch or pp"
            )
        if t.seq_len % p.cp:
            raise ValueError(f"seq_len({t.seq_len}) must be divisible by cp({p.cp})")
        if p.sequence_parallel and t.seq_len // p.cp % p.tp:
            raise ValueError(f"sequence_parallel needs seq_len/cp ({t.seq_len // p.cp}) divisible by tp({p.tp})")
        c.gpu.peak_flops(t.precision)  # raises SpecError naming the precision
        if p.attention != "eager" and c.gpu.arch in eager_attention_archs():
            # no fused attention kernel runs on this architecture (catalog/attention.yaml eager_archs): eager
            object.__setattr__(self, "plan", p.model_copy(update={"attention": "eager"}))
        return self

    @property
    def dp(self) -> int:
        return self.cluster.num_gpus // (self.plan.tp * self.plan.pp * self.plan.cp)

    @property
    def dropout(self) -> bool:
        if self.training.dropout is not None:
            return self.training.dropout
        return self.plan.preset.dropout

    @property
    def chunk_layers(self) -> tuple[int, ...]:
        """Transformer layers of each virtual stage k = chunk·pp + stage (pp·vp entries): ``pipeline_split``."""
        return pipeline_split(self.model.layers, self.plan)

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers of each pipeline rank, first to last (its chunks together)."""
        return per_rank(self.chunk_layers, self.plan.pp, self.plan.vp)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (gradient accumulation steps)."""
        return self.training.global_batch // (self.dp * self.plan.micro_batch)
