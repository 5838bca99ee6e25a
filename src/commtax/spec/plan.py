"""The parallel plan and the training run."""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

from typing import Any, Literal

from pydantic import (
    Field,
    model_validator,
)

from commtax.spec.base import CommDtype, Precision, _Spec
from commtax.spec.frameworks import (
    AttentionKernel,
    Framework,
    FrameworkName,
    Overlap,
    Zero3Gather,
    framework_of,
    frameworks,
)

# Megatron-Core --recompute-modules (megatron/core/transformer/transformer_config.py recompute_modules @d98e8a6):
# the submodules selective recompute re-runs; unset it is ["core_attn"]
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]


class Plan(_Spec):
    framework: FrameworkName = Field(
        default="custom",
        description="training software (catalog/frameworks.yaml): sets the defaults of attention, elementwise, "
        "overlap, selective_policy, fp8_recipe and dropout; 'generation: legacy|current' is read as megatron-lm / "
        "megatron-core (deprecated)",
    )
    tp: int = Field(default=1, gt=0, le=4096)
    pp: int = Field(default=1, gt=0, le=4096)
    dp: int | None = Field(default=None, gt=0)
    cp: int = Field(default=1, gt=0, le=4096)
    vp: int = Field(
        default=1, gt=0, le=1024, description="virtual stages per pipeline rank (interleaved 1F1B when > 1)"
    )
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 1
    recompute: Literal["none", "selective", "full"] = "selective"
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        default=None,
        description="Megatron-Core --recompute-modules under recompute: selective (unset: core_attn): core_attn "
        "(the attention core), layernorm (input and pre-MLP norms), mla_up_proj (MLA q/kv up-projections and RoPE), "
        "mlp (a dense layer's MLP), moe_act (the experts' activation), moe (the whole MoE layer, its all-to-alls "
        "too), shared_experts; [] recomputes nothing",
    )
    micro_batch: int = Field(default=1, gt=0, le=65_536)
    schedule: Literal["gpipe", "1f1b", "1f1b-flexible", "zb-h1", "zb-v", "dualpipe", "dualpipev"] = Field(
        default="1f1b",
        description=(
            "pipeline schedule: gpipe; 1f1b (interleaved when vp > 1; Megatron needs pp | micro-batches); "
            "1f1b-flexible (Llama 3's interleaved 1F1B for any number of micro-batches, framework custom); "
            "zb-h1 / zb-v (zero-bubble, Qi et al. 2023: backward split into input and weight gradients; zb-v "
            "runs vp = 2 chunks in a V); dualpipe/dualpipev: DeepSeek-V3's bidirectional schedule (arXiv "
            "2412.19437 §3.2.1, Table 2: bubble (PP/2−1)(F&B+B−3W), 2× parameters, PP+1 activations; DualPipeV one "
            "copy), which hides the EP all-to-all under the other direction's compute"
        ),
    )
    # expert parallelism, Megatron-Core parallel folding (Liu et al. 2025, "MoE Parallel Folding", arXiv 2504.14960):
    # attention runs over tp×cp×dp×pp, the experts over etp×ep×edp×pp on the same GPUs
    ep: int = Field(default=1, gt=0, le=4096, description="expert-parallel size: experts split over ep GPUs")
    etp: int = Field(
        default=1, gt=0, le=4096, description="expert tensor-parallel size (Megatron expert_tensor_parallel_size)"
    )
    moe_dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep"] = Field(
        default="alltoall",
        description="token dispatcher (Megatron-Core --moe-token-dispatcher-type alltoall|allgather|flex; flex runs "
        "DeepEP (deepep) or HybridEP (hybridep), megatron/core/transformer/moe/token_dispatcher.py); the "
        "Megatron-Bridge performance recipes use alltoall unless they say flex",
    )
    moe_a2a_overlap: bool = Field(
        default=False,
        description="Megatron-Core --overlap-moe-expert-parallel-comm: 1F1B A2A overlap, one micro-batch's dispatch/"
        "combine under another's compute (needs pp > 1 with vp > 1, or pp == 1; docs moe README 'EP A2A overlap')",
    )
    cuda_graphs: Literal["none", "full_iteration"] = Field(
        default="none",
        description="MoE models: full_iteration = Megatron-Core --cuda-graph-impl full_iteration (Megatron-Bridge "
        "cuda_graph_impl local, scope full_iteration) with the sync-free expert path it needs: no host sync per MoE "
        "layer. none = eager MoE layers, each forward waiting on the host for its token counts; the per-layer TE "
        "graphs (attn, moe_router, moe_preprocess) keep that sync, so price them as none (docs/moe.md 'host sync')",
    )
    overlap: Overlap = Field(default_factory=Overlap)
    grad_comm_dtype: CommDtype = Field(
        default="bf16", description="dtype of the DP gradient reduction (default: the framework's reduce_dtype)"
    )
    grad_error_feedback: bool = Field(
        default=False,
        description="error feedback on a compressed grad_comm_dtype (int8, int4, fp8, PowerSGD): the residual is "
        "carried to the next step; its passes over the gradient are priced",
    )
    attention: AttentionKernel = Field(default="fa2", description="attention kernel; eager materialises the s×s scores")
    elementwise: Literal["fused", "compiled", "eager"] = Field(
        default="fused", description="norms, activations, residuals: hand-fused kernels, torch.compile, or eager ops"
    )
    selective_policy: Literal["attention_core", "per_op"] = Field(
        default="attention_core", description="what recompute: selective keeps (Megatron attention core / per-op SAC)"
    )
    fp8_recipe: Literal["delayed", "dynamic", "current", "mxfp8"] = Field(
        default="delayed",
        description="fp8 scaling: delayed (Transformer Engine), dynamic tensorwise (torchao), current "
        "(Transformer Engine per-tensor current scaling: an amax pass before each cast) or mxfp8 (Transformer "
        "Engine MXFP8 block scaling, Blackwell)",
    )
    fp8_attention: bool = Field(
        default=False,
        description="Transformer Engine's FP8 dot-product attention (Megatron-Core --fp8-dot-product-attention, the "
        "recipe's fp8_dpa): with fp8_recipe mxfp8 on Blackwell, cuDNN's MXFP8 fused attention, priced at its measured "
        "time over the BF16 kernel's (catalog/attention.yaml mxfp8_time_ratio) with TE's quantization of q, k, v and "
        "the output gradient; sliding-window layers' backward then computes every causal block",
    )
    fp8_output_proj: bool = Field(
        default=False,
        description="Megatron-Core fp8_output_proj (core 0.18+): the LM head as Transformer Engine's MXFP8 linear "
        "(TELMHeadColumnParallelLinear, fp8_utils.is_mxfp8_output_proj_active: fp8 with fp8_recipe mxfp8), its three "
        "GEMMs at the fp8 rate with their input and output-gradient casts; off, the head is a bf16 GEMM in fp8 runs",
    )
    zero3_gather: Zero3Gather = Field(
        default="bucketed_prefetch",
        description="ZeRO-3/FSDP parameter movement: bucketed_prefetch (one collective "
        "per block, prefetched) or per_parameter_sync (DeepSpeed < v0.6: one synchronised gather per tensor)",
    )

    @property
    def flash_attention(self) -> bool:
        """Fused attention: the s×s scores never reach memory."""
        return self.attention != "eager"

    @property
    def preset(self) -> Framework:
        return frameworks()[self.framework]

    # how the transformer layers are split over the pipeline stages (``pipeline_split``); default: the most balanced
    account_for_embedding_in_pipeline_split: bool = Field(
        default=False, description="Megatron-Core: the embedding counts as one layer of the first stage's share"
    )
    account_for_loss_in_pipeline_split: bool = Field(
        default=False, description="Megatron-Core: the LM head and loss count as one layer of the last stage's share"
    )
    first_stage_layers: int | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="layers on the first stage (Megatron num_layers_in_first_pipeline_stage)",
    )
    last_stage_layers: int | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="layers on the last stage (Megatron num_layers_in_last_pipeline_stage)",
    )
    stage_layers: tuple[int, ...] | None = Field(
        default=None, description="layers on each pipeline stage, first to last (pp entries)"
    )
    pipeline_layout: tuple[int, ...] | None = Field(
        default=None,
        description="layers of each virtual stage k = chunk·pp + stage (pp·vp entries), any split: Megatron-Core "
        "--pipeline-model-parallel-layout in counts (the Megatron-Bridge DeepSeek-V3 / Qwen3 recipes use it for "
        "layer counts that do not divide)",
    )

    # ---- GPU pools (spec/pools.py): where the stages run, and each pool's share of the batch
    stage_pools: tuple[int | str, ...] | None = Field(
        default=None,
        description="pool of each pipeline stage, first to last (pp entries: a pool's name or index); "
        "unset on a cluster with pools: data parallelism across pools, each pool holding whole pipelines",
    )
    pool_batch_share: tuple[float, ...] | None = Field(
        default=None,
        description="share of the global batch each pool computes (one per pool, summing to 1), data parallelism "
        "across pools; default: the same per replica",
    )

    def replace(self, **changes: Any) -> "Plan":
        """The plan with some fields changed, validated again as a whole (cross-field checks included; the
        framework's defaults fill no field, since every field is set). A bad change raises a SpecError naming
        ``plan.<field>``."""
        from commtax.spec.catalog import build  # the one place pydantic's report becomes a SpecError line

        data = {**self.model_dump(), **changes}
        if changes.get("recompute", "selective") != "selective" and "recompute_modules" not in changes:
            data["recompute_modules"] = None  # the modules are selective recompute's: none or full drops them
        return build(Plan, data, "plan")

    @property
    def recomputed(self) -> frozenset[str]:
        """The submodules selective recompute re-runs under the plan's recompute (``recomputed_under``)."""
        return self.recomputed_under(self.recompute)

    def recomputed_under(self, recompute: str) -> frozenset[str]:
        """The submodules selective recompute re-runs under ``recompute`` (the plan's, or a candidate a search
        prices): ``recompute_modules``, unset Megatron-Core's ["core_attn"] (attention_core policy); none for no or
        full recompute and for the per-op policy."""
        if recompute != "selective" or self.selective_policy != "attention_core":
            return frozenset()
        return frozenset(("core_attn",) if self.recompute_modules is None else self.recompute_modules)

    @model_validator(mode="after")
    def _recompute_modules_need_selective(self) -> "Plan":
        mods = self.recompute_modules
        if mods is None:
            return self
        if self.recompute != "selective":
            raise ValueError(
                f"recompute_modules applies to recompute: selective, not {self.recompute}: set recompute: selective "
                "or drop recompute_modules"
            )
        if self.selective_policy != "attention_core":
            raise ValueError(
                "recompute_modules are Megatron-Core's submodules (selective_policy attention_core), not "
                f"{self.selective_policy}: drop recompute_modules or set selective_policy: attention_core"
            )
        dup = sorted({m for m in mods if mods.count(m) > 1})
        if dup:
            raise ValueError(f"recompute_modules names {', '.join(dup)} twice: list each module once")
        return self

    @model_validator(mode="after")
    def _error_feedback_needs_compression(self) -> "Plan":
        if self.grad_error_feedback and self.grad_comm_dtype in ("fp32", "bf16", "fp16"):
            raise ValueError(
                f"grad_error_feedback applies to a quantized grad_comm_dtype (int8, int4, fp8_e4m3, fp8_e5m2, "
                f"powersgd_rN), not {self.grad_comm_dtype}: drop it or choose such a format"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data: Any) -> Any:
        """The framework's defaults fill the software fields the plan leaves out; fields the user sets win."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        fw_name = framework_of(data)
        data.pop("generation", None)
        data["framework"] = fw_name
        fw = frameworks()[fw_name]
        flash = data.pop("flash_attention", None)
        if flash is not None and not isinstance(flash, bool):
            raise ValueError(f"flash_attention must be true or false, got {flash!r}")
        if "attention" not in data:
            data["attention"] = fw.attention if flash is not False else "eager"
            if flash is True and data["attention"] == "eager":
                data["attention"] = "fa2"
        elif flash is not None and flash != (data["attention"] != "eager"):
            raise ValueError(f"flash_attention({flash}) contradicts attention({data['attention']}): set one of them")
        data.setdefault("elementwise", fw.elementwise)
        data.setdefault("selective_policy", fw.selective_policy)
        data.setdefault("fp8_recipe", fw.fp8_recipe)
        data.setdefault("zero3_gather", fw.zero3_gather)
        data.setdefault("grad_comm_dtype", fw.reduce_dtype)
        data.setdefault("moe_dispatcher", fw.moe_dispatcher)
        if "zero" not in data and 1 not in fw.zero_stages:  # FSDP-style frameworks have no ZeRO-1: their default
            data["zero"] = fw.plan_defaults.get("zero", max(fw.zero_stages))
        overlap = data.get("overlap")
        if overlap is None or isinstance(overlap, dict):
            zero3 = data.get("zero", 1) == 3
            defaults = {
                "dp": fw.overlap.dp_zero3 if zero3 else fw.overlap.dp,
                "tp": fw.overlap.tp,
                "pp": fw.overlap.pp,
                "cp": fw.overlap.cp,
            }
            data["overlap"] = {**defaults, **(overlap or {})}
        return data


class Training(_Spec):
    seq_len: int = Field(gt=0, le=10_000_000)
    global_batch: int = Field(gt=0, le=100_000_000, description="sequences per optimizer step")
    precision: Precision = "bf16"
    tokens: float | None = Field(default=None, gt=0, description="training tokens, for days-to-train")
    dropout: bool | None = Field(
        default=None, description="hidden/attention dropout on (default: the framework's, catalog/frameworks.yaml)"
    )
