"""The model architecture: a transformer's shape, dense or Mixture-of-Experts, with MHA/GQA or MLA attention."""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from commtax.spec.base import _Spec


class Model(_Spec):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = "custom-model"
    layers: int = Field(gt=0, le=10_000)
    hidden: int = Field(gt=0, le=1_000_000)
    heads: int = Field(gt=0, le=100_000)
    kv_heads: int | None = Field(default=None, gt=0, le=100_000)
    ffn_hidden: int | None = Field(default=None, gt=0, le=10_000_000, description="MLP size of the dense layers")
    vocab: int = Field(gt=0, le=10_000_000)
    gated_mlp: bool = False
    tied_embeddings: bool = False
    attn_head_dim: int | None = Field(
        default=None,
        gt=0,
        le=100_000,
        alias="head_dim",
        description="head dimension when it is not hidden/heads (Qwen3, GPT-OSS); written `head_dim`",
    )
    # Multi-head latent attention (DeepSeek-V2 §2.1): Q through a rank-q_lora_rank bottleneck, K and V from one
    # compressed kv_lora_rank latent; each head's query/key has a nope part and a shared rope part
    q_lora_rank: int | None = Field(default=None, gt=0, le=1_000_000, description="MLA query LoRA rank (none: full Q)")
    kv_lora_rank: int | None = Field(default=None, gt=0, le=1_000_000, description="MLA: set to use latent attention")
    qk_nope_head_dim: int | None = Field(default=None, gt=0, le=100_000, description="MLA per-head non-rotary q/k dim")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=100_000, description="MLA per-head rotary q/k dim")
    v_head_dim: int | None = Field(default=None, gt=0, le=100_000, description="MLA per-head value dim")
    # Mixture of Experts (Shazeer 2017; GShard; Switch): the MLP of the MoE layers is num_experts experts of
    # moe_ffn_hidden, each token routed to top_k of them, plus shared_experts always-on experts
    num_experts: int | None = Field(default=None, gt=0, le=100_000, description="routed experts per MoE layer")
    top_k: int | None = Field(default=None, gt=0, le=1_000, description="experts each token is routed to")
    moe_ffn_hidden: int | None = Field(default=None, gt=0, le=10_000_000, description="MLP size of one expert")
    shared_experts: int = Field(default=0, ge=0, le=64, description="always-active experts per MoE layer")
    shared_expert_ffn: int | None = Field(
        default=None, gt=0, le=10_000_000, description="MLP size of one shared expert (default: moe_ffn_hidden)"
    )
    moe_layers: Literal["all", "alternate"] = Field(
        default="all",
        description="which layers are MoE: all, or every other one (Llama-4 Maverick interleave_moe_layer_step 2: "
        "layers 1, 3, 5, ...)",
    )
    first_k_dense: int = Field(default=0, ge=0, le=10_000, description="leading dense layers (DeepSeek: 3)")
    capacity_factor: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="expert capacity / mean load; tokens beyond it are dropped (none: dropless)",
    )
    routing_imbalance: float = Field(
        default=1.0,
        ge=1.0,
        le=1000,
        description="λ = max/mean tokens per EP rank (1: balanced, as NVIDIA's benchmark rows force it)",
    )
    router_score: Literal["softmax", "sigmoid"] = Field(
        default="softmax", description="router score function (DeepSeek-V3: sigmoid with aux-loss-free bias)"
    )
    route_max_nodes: int | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="node-limited routing: each token to at most M nodes (DeepSeek-V3: 4)",
    )
    qk_norm: bool = Field(
        default=False,
        description="RMSNorm on every head's query and key before RoPE (Qwen3 q_norm/k_norm; Megatron-Core "
        "qk_layernorm)",
    )
    swiglu_limit: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        description="expert GLU inputs clamped to this bound before the activation (GPT-OSS config.json "
        "swiglu_limit 7.0; Megatron-Core activation_func_clamp_value); priced in the MoE experts",
    )
    expert_bias: bool = Field(
        default=False,
        description="the experts' linear layers carry biases (GPT-OSS: transformers GptOssExperts gate_up_proj_bias, "
        "down_proj_bias; Megatron-Bridge gpt_oss_bridge.py add_bias_linear True); the down projection's bias is "
        "priced in the MoE experts",
    )
    rope_mscale: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="YaRN attention (concentration) factor that scales RoPE's cos and sin (GPT-OSS: rope_scaling "
        "factor 32 and no mscale, 0.1·ln 32 + 1 = 1.3466); Megatron runs such a YaRN RoPE unfused (Megatron-Bridge "
        "keeps apply_rope_fusion for position_embedding_type rope only; Megatron-Core's fused RoPE takes no mscale "
        "but 1), so q and k are roped in eager PyTorch (priced for the Megatron-family frameworks)",
    )
    sliding_window: int | None = Field(
        default=None,
        gt=0,
        le=100_000_000,
        description="keys a query attends to in the sliding-window layers, itself included (GPT-OSS 128)",
    )
    full_attention_every: int | None = Field(
        default=None,
        ge=2,
        le=10_000,
        description="with sliding_window: every N-th layer attends to the full context (GPT-OSS 2; Megatron-Core "
        "window_attn_skip_freq); none: every layer is windowed",
    )
    mtp_layers: int = Field(
        default=0,
        ge=0,
        le=16,
        description="multi-token prediction depth (DeepSeek-V3 num_nextn_predict_layers 1): each adds a layer, a "
        "2h→h projection and another logits + loss on the last pipeline stage; outside params() as in the model cards",
    )
    source: str = "inline"

    @model_validator(mode="after")
    def _window(self) -> "Model":
        if self.full_attention_every is not None and self.sliding_window is None:
            raise ValueError("full_attention_every applies to sliding-window models: set sliding_window, or drop it")
        return self

    @model_validator(mode="after")
    def _heads(self) -> "Model":
        if self.attn_head_dim is None and not self.mla and self.hidden % self.heads:
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), or give head_dim explicitly"
            )
        if self.heads % self.kv_heads_:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads_})")
        return self

    @model_validator(mode="after")
    def _mla(self) -> "Model":
        parts = {"qk_nope_head_dim": self.qk_nope_head_dim, "qk_rope_head_dim": self.qk_rope_head_dim}
        if self.kv_lora_rank is not None and None in parts.values():
            missing = [k for k, v in parts.items() if v is None]
            raise ValueError(f"kv_lora_rank (MLA) needs {' and '.join(missing)}: give both per-head q/k dims")
        if self.kv_lora_rank is None and (self.q_lora_rank or self.qk_rope_head_dim or self.qk_nope_head_dim):
            raise ValueError("q_lora_rank / qk_*_head_dim are MLA fields: set kv_lora_rank too, or drop them")
        return self

    @model_validator(mode="after")
    def _moe(self) -> "Model":
        moe = {"num_experts": self.num_experts, "top_k": self.top_k, "moe_ffn_hidden": self.moe_ffn_hidden}
        given = [k for k, v in moe.items() if v is not None]
        if given and len(given) < 3:
            missing = [k for k in moe if k not in given]
            raise ValueError(f"an MoE model needs num_experts, top_k and moe_ffn_hidden: {', '.join(missing)} missing")
        if not given:
            extras = {
                "shared_experts": self.shared_experts,
                "first_k_dense": self.first_k_dense,
                "capacity_factor": self.capacity_factor,
                "route_max_nodes": self.route_max_nodes,
                "expert_bias": self.expert_bias,
            }
            set_ = [k for k, v in extras.items() if v]
            if set_ or self.routing_imbalance != 1.0 or self.moe_layers != "all":
                what = ", ".join(set_) or "routing_imbalance / moe_layers"
                raise ValueError(f"{what} apply to MoE models: set num_experts, top_k and moe_ffn_hidden, or drop them")
            return self
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most num_experts ({self.num_experts})")
        if self.first_k_dense >= self.layers:
            raise ValueError(f"first_k_dense ({self.first_k_dense}) leaves no MoE layer of {self.layers}")
        if self.moe_dense_layers and self.ffn_hidden is None:
            raise ValueError("an MoE model with dense layers (first_k_dense or alternate) needs ffn_hidden for them")
        return self

    # ------------------------------------------------------------------ shape
    @property
    def kv_heads_(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or (self.moe_ffn_hidden if self.is_moe else 4 * self.hidden)

    @property
    def head_dim(self) -> int:
        """Per-head query/key dim (MLA: nope + rope parts)."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def value_head_dim(self) -> int:
        return (self.v_head_dim or self.qk_nope_head_dim) if self.mla else self.head_dim

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def windowed_share(self) -> float:
        """Share of the layers that attend through the sliding window: all, or all but every N-th (Megatron-Core
        window_attn_skip_freq N: layer numbers divisible by N attend fully)."""
        if self.sliding_window is None:
            return 0.0
        n = self.full_attention_every
        return 1.0 if n is None else 1.0 - (self.layers // n) / self.layers

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn or self.moe_ffn_hidden or 0

    def is_moe_layer(self, i: int) -> bool:
        """Layer i (0-based) has experts: after the first_k_dense, every one or every other (odd ones)."""
        if not self.is_moe or i < self.first_k_dense:
            return False
        return self.moe_layers == "all" or i % 2 == 1

    def moe_layers_before(self, i: int) -> int:
        """MoE layers among layers 0..i−1 (``is_moe_layer`` summed, in closed form: the search asks it per plan):
        after the first_k_dense K, all of them, or the odd ones, ⌊i/2⌋ − ⌊K/2⌋."""
        k = self.first_k_dense
        if not self.is_moe or i <= k:
            return 0
        return i - k if self.moe_layers == "all" else i // 2 - k // 2

    @property
    def moe_layer_count(self) -> int:
        return self.moe_layers_before(self.layers)

    @property
    def moe_dense_layers(self) -> int:
        return self.layers - self.moe_layer_count if self.is_moe else 0

    # ------------------------------------------------------------------ parameters
    def attention_params(self) -> float:
        """MHA/GQA: QKV + output projection; MLA (DeepSeek-V2 §2.1.2): W_DQ, q norm, W_UQ (with rope), W_DKV + W_KR,
        kv norm, W_UK and W_UV, output projection."""
        h, a = self.hidden, self.heads
        if not self.mla:
            return h * (a + 2 * self.kv_heads_) * self.head_dim + a * self.head_dim * h
        dq = self.head_dim
        q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * dq if self.q_lora_rank else h * a * dq
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * a * (self.qk_nope_head_dim + self.value_head_dim)
        return q + kv + a * self.value_head_dim * h

    def mlp_params(self, f: int) -> float:
        return (3 if self.gated_mlp else 2) * self.hidden * f

    def expert_params(self) -> float:
        """One routed expert's weights."""
        return self.mlp_params(self.moe_ffn_hidden) if self.is_moe else 0.0

    def moe_layer_params(self, active: bool = False) -> float:
        """An MoE layer's MLP part: router, routed experts (all or the top_k a token uses), shared experts."""
        routed = (self.top_k if active else self.num_experts) * self.expert_params()
        return self.hidden * self.num_experts + routed + self.shared_experts * self.mlp_params(self.shared_ffn)

    def layer_params(self) -> float:
        """A dense layer: attention (GQA or MLA) + MLP (gated: 3 matrices) + 2 norms."""
        return self.attention_params() + self.mlp_params(self.ffn) + 2 * self.hidden

    def mtp_params(self) -> float:
        """One MTP module (DeepSeek-V3 §2.2): two RMSNorms, the projection M ∈ R^{h×2h}, a transformer layer (an MoE
        layer in an MoE model); embedding and output head shared with the main model."""
        layer = self.attention_params() + 2 * self.hidden
        layer += self.moe_layer_params() if self.is_moe else self.mlp_params(self.ffn)
        return 2 * self.hidden + 2 * self.hidden * self.hidden + layer

    def embedding_params(self) -> float:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> float:
        if not self.is_moe:
            return self.layers * self.layer_params() + self.embedding_params() + self.hidden
        return self._moe_params(active=False)

    def active_params(self) -> float:
        """Parameters one token passes through (MoE: top_k routed + shared experts); dense: all of them."""
        return self._moe_params(active=True) if self.is_moe else self.params()

    def _moe_params(self, active: bool) -> float:
        per_moe = self.attention_params() + 2 * self.hidden + self.moe_layer_params(active)
        dense = self.moe_dense_layers * self.layer_params()
        return self.moe_layer_count * per_moe + dense + self.embedding_params() + self.hidden
