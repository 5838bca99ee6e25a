"""The model architecture: a transformer's shape."""

from __future__ import annotations

from pydantic import (
    Field,
    model_validator,
)

from commtax.spec.base import _Spec


class Model(_Spec):
    name: str = "custom-model"
    layers: int = Field(gt=0, le=10_000)
    hidden: int = Field(gt=0, le=1_000_000)
    heads: int = Field(gt=0, le=100_000)
    kv_heads: int | None = Field(default=None, gt=0, le=100_000)
    ffn_hidden: int | None = Field(default=None, gt=0, le=10_000_000)
    vocab: int = Field(gt=0, le=10_000_000)
    gated_mlp: bool = False
    tied_embeddings: bool = False
    source: str = "inline"

    @model_validator(mode="after")
    def _heads(self) -> Model:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads_:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads_})")
        return self

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> float:
        """QKV (with GQA) + output projection + MLP (gated: 3 matrices) + 2 norms."""
        h, f = self.hidden, self.ffn
        attn = h * (h + 2 * self.kv_heads_ * self.head_dim) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attn + mlp + 2 * h

    def embedding_params(self) -> float:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> float:
        return self.layers * self.layer_params() + self.embedding_params() + self.hidden
