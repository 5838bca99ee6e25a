"""Framework facts (catalog/frameworks.yaml) and the overlap settings a plan takes from them."""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

from functools import lru_cache
from typing import Any, Literal

from pydantic import (
    Field,
)

from commtax.spec.base import CATALOG_DIR, CommDtype, _Spec
from commtax.spec.files import read_catalog_yaml


class Overlap(_Spec):
    """Which communication overlaps compute. Defaults follow Megatron-Core / NeMo / torchtitan (2024)."""

    dp: bool = Field(default=True, description="DP gradient reduce / ZeRO gathers overlap backward (bucketed)")
    tp: bool = Field(default=False, description="TP collectives overlap GEMMs (userbuffers comm-GEMM overlap)")
    pp: bool = Field(default=True, description="pipeline sends overlap compute of other micro-batches")
    cp: bool = Field(default=True, description="ring-attention K/V exchange overlaps attention compute")


FrameworkName = Literal[
    "megatron-core",
    "nemo",
    "megatron-lm",
    "megatron-deepspeed",
    "deepspeed",
    "torchtitan",
    "fsdp",
    "pytorch-ddp",
    "nemo-automodel",
    "custom",
]
AttentionKernel = Literal["fa2", "fa3", "cudnn", "triton", "eager"]
# how ZeRO-3 / FSDP gathers parameters (catalog/frameworks.yaml zero3_gather): one bucketed collective per unit,
# prefetched on a side stream, or one synchronised list-form collective per parameter tensor (DeepSpeed < v0.6)
Zero3Gather = Literal["bucketed_prefetch", "per_parameter_sync"]
# deprecated `generation` values -> the framework they stood for
GENERATION_ALIAS = {"legacy": "megatron-lm", "current": "megatron-core"}


class FrameworkOverlap(_Spec):
    dp: bool
    dp_zero3: bool
    tp: bool
    pp: bool
    cp: bool


class LegacySoftware(_Spec):
    """What older releases of a framework did differently (validate applies it to runs published before)."""

    before_year: int = Field(description="runs whose source cites an earlier year (or generation: legacy) used it")
    plan: dict[str, Any] = Field(description="plan fields those releases fixed (e.g. zero3_gather)")
    source: str


class Framework(_Spec):
    """What a training framework does by default (catalog/frameworks.yaml, each entry sourced)."""

    attention: AttentionKernel
    elementwise: Literal["fused", "compiled", "eager"]
    overlap: FrameworkOverlap
    selective_policy: Literal["attention_core", "per_op"]
    fp8_recipe: Literal["delayed", "dynamic", "current", "mxfp8"]
    dropout: bool
    zero3_gather: Zero3Gather = "bucketed_prefetch"
    reduce_dtype: CommDtype = "bf16"  # dtype of the DP gradient reduction (plan.grad_comm_dtype's default)
    reduce_source: str = ""  # where a reduce_dtype other than bf16 comes from
    zero_stages: tuple[Literal[0, 1, 2, 3], ...] = (0, 1, 2, 3)  # stages it can run (plan.zero outside: refused)
    zero_source: str = ""  # where a restriction of zero_stages comes from
    # gradient bucket of the overlapped DP reduction, in parameters: max(bucket_params, bucket_params_per_dp · dp)
    # (Megatron-Core DistributedDataParallelConfig.bucket_size); None: PyTorch DDP's bucket_cap_mb = 25 MiB
    bucket_params: int | None = None
    bucket_params_per_dp: int = 0
    bucket_source: str = ""
    # PyTorch DDP with gradient_as_bucket_view=False (its default): each gradient is copied into its bucket before the
    # reduction and the reduced bucket back into the gradient after it
    grad_bucket_copies: bool = False
    # the MoE token dispatcher a plan that names none runs (plan.moe_dispatcher's default), and where it comes from
    moe_dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep"] = "alltoall"
    moe_source: str = ""
    plan_defaults: dict[str, Any] = Field(default_factory=dict)
    legacy: LegacySoftware | None = None
    source: str


@lru_cache(maxsize=1)
def frameworks() -> dict[str, Framework]:
    data = read_catalog_yaml(CATALOG_DIR / "frameworks.yaml") or {}
    return {name: Framework.model_validate(entry) for name, entry in data.items()}


def zero_refusal(framework: str, zero: int) -> str | None:
    """Why ``framework`` does not run ZeRO stage ``zero`` out of the box (catalog/frameworks.yaml zero_stages), or
    None. ``search`` and ``advise`` propose only the stages a framework runs; a plan that states another stage (a
    published run, Megatron-Core's newer FSDP, a patched framework) is priced as stated, with a note."""
    stages = frameworks()[framework].zero_stages
    if zero in stages:
        return None
    return (
        f"zero({zero}) is not a stage {framework} runs by default (it runs zero {', '.join(map(str, stages))}: "
        f"catalog/frameworks.yaml zero_stages)"
    )


def framework_of(data: dict) -> str:
    """The framework a plan mapping names: ``framework``, else the deprecated ``generation`` alias, else custom."""
    fw, gen = data.get("framework"), data.get("generation")
    if fw is None and gen is not None:
        if gen not in GENERATION_ALIAS:
            raise ValueError(
                f"generation must be one of {', '.join(GENERATION_ALIAS)} (deprecated: use framework), got {gen!r}"
            )
        fw = GENERATION_ALIAS[gen]
    fw = fw or "custom"
    if fw not in frameworks():
        raise ValueError(f"framework must be one of {', '.join(frameworks())}, got {fw!r}")
    return fw
