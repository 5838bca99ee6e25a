"""What a job is: typed, frozen, validated specs, and the catalog they name.

Edges are pydantic v2 models (``extra="forbid"``); catalog numbers are converted to SI once,
here, by the ``*_bytes_per_s`` / ``*_flops`` properties, so nothing downstream sees GB or µs.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from commtax.comm_dtypes import COMM_DTYPES
from commtax.errors import SpecError, excerpt
from commtax.units import GB, GBIT, TFLOPS, US, GiB

CATALOG_DIR = Path(__file__).parent / "catalog"
Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "int8"]
# gradient communication formats: fp32 … int4 (scaled per chunk), fp8_e4m3/e5m2, powersgd_rN; bytes in comm_dtypes
CommDtype = Literal[COMM_DTYPES]  # type: ignore[valid-type]
BYTES_PER = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}  # element sizes


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _strict_numbers(cls, data: Any) -> Any:
        """YAML ``true`` is not the number 1: a bool is accepted only where the field is a yes/no."""
        if isinstance(data, dict):
            for name, f in cls.model_fields.items():
                v = data.get(name)
                if isinstance(v, bool) and not _allows_bool(f.annotation):
                    raise ValueError(f"{name}: expected a number, got {str(v).lower()}")
        return data


# ----------------------------------------------------------------------------- hardware
def _allows_bool(annotation: Any) -> bool:
    args = get_args(annotation)
    return annotation is bool or annotation is Any or any(_allows_bool(a) for a in args if a is not type(None))


class GPU(_Spec):
    name: str = "custom-gpu"
    peak_tflops: dict[Precision, float] = Field(description="dense tensor-core peak per precision, TFLOP/s")
    mem_GiB: float = Field(gt=0, le=4096, description="device memory")
    mem_bw_GBps: float = Field(gt=0, le=100_000, description="device memory bandwidth")
    tdp_W: float = Field(default=700, gt=0, le=5000)
    sms: int = Field(default=132, gt=0, le=4096, description="SMs / compute units (GEMM wave quantisation)")
    p2p: bool = Field(default=True, description="GPU peer-to-peer over the scale-up link (false: host-bounced)")
    matmul_efficiency: dict[str, float] = Field(default_factory=lambda: {"default": 0.75})
    attention_efficiency: float = Field(default=0.5, gt=0, le=1, description="unused since attention kernel tables")
    arch: Literal["volta", "ampere", "hopper", "ada", "blackwell", "cdna2", "cdna3", "other"] = Field(
        default="other", description="architecture: picks the attention kernel table (catalog/attention.yaml)"
    )
    clock_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1.5,
        description="sustained SM clock / the clock the datasheet peak assumes (< 1 for a power-capped GPU): "
        "scales GEMM rates, not HBM bandwidth; MFU stays against the datasheet peak. Unset: 1, or for Hopper "
        "the assumption hopper_clock_fraction",
    )
    convert_Gelem_s: dict[str, float] = Field(
        default_factory=dict,
        description="dtype conversions slower than the memory stream, Gelem/s, keyed fp32->fp8_e4m3, "
        "fp8_e4m3->fp32, fp32->fp8_e5m2, fp8_e5m2->fp32 (CPU ranks: torch converts fp8 in scalar code; "
        "GPUs convert in hardware: leave empty)",
    )
    source: str = "inline"

    @field_validator("convert_Gelem_s")
    @classmethod
    def _conversions(cls, v: dict[str, float]) -> dict[str, float]:
        from commtax.comm_dtypes import CONVERSIONS

        for k, x in v.items():
            if k not in CONVERSIONS:
                raise ValueError(f"convert_Gelem_s.{k}: not a conversion; use one of {', '.join(CONVERSIONS)}")
            if not (0 < x < 1e4):
                raise ValueError(f"convert_Gelem_s.{k} must be in (0, 1e4) Gelem/s, got {x}")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 < x < 1e6):
                raise ValueError(f"peak_tflops.{k} must be in (0, 1e6) TFLOP/s, got {x}")
        return v

    @field_validator("matmul_efficiency")
    @classmethod
    def _efficiencies(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 < x <= 1):
                raise ValueError(f"matmul_efficiency.{k} must be in (0, 1], got {x}")
        return v

    def peak_flops(self, precision: str) -> float:
        if precision not in self.peak_tflops:
            have = ", ".join(self.peak_tflops)
            raise SpecError(
                f"training.precision: GPU {self.name} has no {precision} peak (has: {have}); set one of them"
            )
        return self.peak_tflops[precision] * TFLOPS

    def matmul_eff(self, precision: str) -> float:
        return self.matmul_efficiency.get(precision, self.matmul_efficiency.get("default", 0.75))

    @property
    def mem_bytes(self) -> float:
        return self.mem_GiB * GiB

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_GBps * GB


class IntraLink(_Spec):
    name: str = "custom-link"
    kind: Literal["nvlink", "pcie", "xgmi", "loopback"] = "nvlink"
    bw_GBps: float = Field(gt=0, le=100_000, description="per GPU, per direction")
    latency_us: float = Field(default=10, ge=0, le=1e6)
    efficiency: float = Field(default=0.8, gt=0, le=1)
    nvls: bool = False
    nvls_efficiency: float = Field(default=0.0, ge=0, le=1)
    source: str = "inline"

    @property
    def bw_bytes_per_s(self) -> float:
        return self.bw_GBps * GB * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class Network(_Spec):
    name: str = "custom-network"
    bw_Gbps: float = Field(gt=0, le=100_000, description="per NIC, per direction, line rate")
    latency_us: float = Field(default=20, ge=0, le=1e6)
    efficiency: float = Field(default=0.9, gt=0, le=1)
    source: str = "inline"

    @property
    def bw_bytes_per_s(self) -> float:
        return self.bw_Gbps * GBIT * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class LevelNumbers(_Spec):
    bw_GBps: float = Field(gt=0, le=100_000, allow_inf_nan=False)
    latency_us: float = Field(ge=0, le=1e7, allow_inf_nan=False)


class Profile(_Spec):
    """A measured hardware profile (``commtax calibrate``): replaces catalog link numbers."""

    model_config = ConfigDict(extra="allow", frozen=True)
    source: str
    levels: dict[Literal["intra", "inter"], LevelNumbers]
    ops: dict[str, dict[Literal["intra", "inter"], LevelNumbers]] = Field(default_factory=dict)
    gemm_efficiency: dict[str, float] = Field(default_factory=dict)
    assumptions: dict[str, float] = Field(default_factory=dict, description="overrides of catalog/assumptions.yaml")

    @field_validator("gemm_efficiency")
    @classmethod
    def _efficiencies(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (0 < x <= 1):  # also false for nan
                raise ValueError(
                    f"gemm_efficiency.{k} must be in (0, 1] (achieved / peak), got {x}; "
                    "re-measure with `commtax bench gemm` on real sizes"
                )
        return v


class Cluster(_Spec):
    gpu: GPU
    num_gpus: int = Field(gt=0, le=1_000_000)
    gpus_per_node: int = Field(default=8, gt=0, le=1024, description="size of the scale-up (NVLink) domain")
    intra_node: IntraLink
    inter_node: Network
    nics_per_node: int = Field(default=8, gt=0, le=1024)
    gpus_per_pcie_switch: int = Field(
        default=1, gt=0, le=64, description="GPUs sharing one PCIe uplink (host-bounced traffic)"
    )
    collective_library: Literal["nccl", "gloo"] = Field(
        default="nccl",
        description="nccl: the tuner picks ring/tree/NVLS and the LL protocol; gloo (CPU): rings only, and its "
        "reduce_scatter is an all-reduce",
    )
    uplink_Gbps: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        allow_inf_nan=False,
        description="line rate per direction of the one link joining the two halves of the nodes (an oversubscribed "
        "spine, as `commtax cluster up --uplink` builds); a group spanning more than half the nodes crosses it",
    )
    profile: Profile | None = None
    emulated: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _shape(self) -> Cluster:
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ValueError(
                f"num_gpus ({self.num_gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node}) "
                "when the cluster spans nodes"
            )
        return self

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.num_gpus / self.gpus_per_node))


# ----------------------------------------------------------------------------- model, plan, training
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
    fp8_recipe: Literal["delayed", "dynamic"]
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
    plan_defaults: dict[str, Any] = Field(default_factory=dict)
    legacy: LegacySoftware | None = None
    source: str


@lru_cache(maxsize=1)
def frameworks() -> dict[str, Framework]:
    data = read_yaml(CATALOG_DIR / "frameworks.yaml") or {}
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
    micro_batch: int = Field(default=1, gt=0, le=65_536)
    schedule: Literal["gpipe", "1f1b"] = "1f1b"
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
    fp8_recipe: Literal["delayed", "dynamic"] = Field(
        default="delayed", description="fp8 scaling: delayed (Transformer Engine) or dynamic tensorwise (torchao)"
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

    @model_validator(mode="after")
    def _error_feedback_needs_compression(self) -> Plan:
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
        if t.global_batch % (dp * p.micro_batch):
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
    n = p * v
    given = {
        "stage_layers": stage_layers,
        "first_stage_layers": first_stage_layers,
        "last_stage_layers": last_stage_layers,
    }
    explicit = [f for f, x in given.items() if x is not None]
    accounted = embedding or loss
    if explicit and p == 1:
        raise ValueError(f"{explicit[0]} needs pp > 1; remove it or raise pp")
    if stage_layers is not None and len(explicit) > 1:
        raise ValueError("stage_layers: give either stage_layers or first_stage_layers/last_stage_layers, not both")
    if explicit and accounted:
        raise ValueError(
            f"{explicit[0]}: Megatron-Core does not combine explicit stage layers with "
            "account_for_embedding/loss_in_pipeline_split; drop one of them"
        )
    if stage_layers is not None:
        stages = stage_layers
        if len(stages) != p:
            raise ValueError(f"stage_layers has {len(stages)} entries; give one per pipeline stage, pp({p})")
        if any(x < 0 for x in stages) or sum(stages) != layers:
            raise ValueError(
                f"stage_layers {list(stages)} must be ≥ 0 each and sum to layers({layers}), got {sum(stages)}"
            )
    elif first_stage_layers is not None or last_stage_layers is not None:
        first, last = first_stage_layers, last_stage_layers
        ends = [x for x in (first, last) if x is not None]
        rest, between = layers - sum(ends), p - len(ends)
        if rest < 0 or (between == 0 and rest) or (between and rest % between):
            raise ValueError(
                f"first_stage_layers/last_stage_layers ({first}, {last}) leave {rest} layers for the {between} other "
                f"stage(s); they must share them evenly (Megatron-Core): pick counts so that layers({layers}) minus "
                "them divides by the other stages"
            )
        middle = rest // between if between else 0
        stages = tuple(
            [first if first is not None else middle] + [middle] * (p - 2) + [last if last is not None else middle]
        )
    elif accounted:
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
    else:
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
        stages = [x * v for x in stages]
    if v > 1 and any(x % v for x in stages):
        raise ValueError(
            f"stage layers {list(stages)}: with vp({v}) each stage's layers must divide evenly over its "
            f"{v} chunks; change the split or vp"
        )
    return tuple(x // v for _ in range(v) for x in stages)


@lru_cache(maxsize=4096)
def per_rank(chunks: tuple[int, ...], p: int, v: int) -> tuple[int, ...]:
    """Layers of each pipeline rank from the layers of each virtual stage k = chunk·p + stage."""
    return tuple(sum(chunks[c * p + s] for c in range(v)) for s in range(p))


# ----------------------------------------------------------------------------- catalog
CATALOG_FILES = {"gpu": "gpus.yaml", "intra_node": "links.yaml", "inter_node": "networks.yaml", "model": "models.yaml"}


MAX_YAML_BYTES = 16 * 2**20  # far above any job, catalog or cluster file; /dev/zero stops here
MAX_YAML_NODES = 200_000  # nodes after expanding aliases: a 600-byte alias bomb expands to billions
MAX_YAML_DEPTH = 64  # nesting; job files need 4


def read_text(path: Path | str, what: str = "file") -> str:
    """A user's text file, bounded in size, as UTF-8 (a BOM is dropped): anything else is one SpecError line."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    except ValueError:  # a NUL byte in the path
        raise SpecError(f"{excerpt(str(path))}: not a file name (it holds a NUL byte)") from None
    if len(raw) > MAX_YAML_BYTES:
        raise SpecError(f"{path}: larger than {MAX_YAML_BYTES // 2**20} MiB; not a {what}")
    if b"\x00" in raw[:8192] and raw[:2] not in (b"\xff\xfe", b"\xfe\xff"):
        raise SpecError(f"{path}: a binary file, not a {what}")
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise SpecError(f"{path}: is UTF-16 text; save it as UTF-8")
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"{path}: not UTF-8 text (Latin-1?): byte 0x{raw[e.start]:02x} at offset {e.start}; save it as UTF-8"
        ) from None


_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """Safe YAML that refuses duplicate keys (the last would silently win)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"duplicate key {excerpt(key)} (first on line {seen[key].line + 1})",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark
                except TypeError:  # an unhashable key: the base constructor says so
                    pass
        return super().construct_mapping(node, deep=deep)


def _check_size(root: Any) -> None:
    """Nodes and depth of the document with aliases expanded, computed without expanding (memoised)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    active: set[int] = set()
    while stack:
        node, done = stack.pop()
        k = id(node)
        if k in size and not done:
            continue
        kids = []
        if isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            kids = [x for pair in node.value for x in pair]
        if not done:
            if k in active:
                raise SpecError("a YAML alias refers to itself (a recursive structure)")
            active.add(k)
            stack.append((node, True))
            stack.extend((c, False) for c in kids if id(c) not in size)
            continue
        active.discard(k)
        size[k] = min(1 + sum(size[id(c)] for c in kids), MAX_YAML_NODES + 1)
        depth[k] = 1 + max((depth[id(c)] for c in kids), default=0)
        if size[k] > MAX_YAML_NODES:
            raise SpecError(f"expands to more than {MAX_YAML_NODES:,} values through aliases (a YAML alias bomb?)")
        if depth[k] > MAX_YAML_DEPTH:
            raise SpecError(f"nested deeper than {MAX_YAML_DEPTH} levels")


def read_yaml(path: Path) -> Any:
    """A YAML file, bounded (size, alias expansion, depth), strict (no duplicate keys), one SpecError line on error."""
    text = read_text(path, "YAML file")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            _check_size(node)
        except SpecError as e:
            raise SpecError(f"{path}: {e}") from None
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(
            f"{path}:{where} malformed YAML ({excerpt(str(getattr(e, 'problem', '') or e), 80, quote=False)})"
        ) from None
    except RecursionError:
        raise SpecError(f"{path}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    finally:
        loader.dispose()
    if isinstance(data, dict):
        bad = [k for k in data if not isinstance(k, str)]
        if bad:
            raise SpecError(
                f"{path}: top-level key {excerpt(bad[0])} is not a name; keys are words like model, cluster"
            )
    return data


@lru_cache(maxsize=1)
def _builtin_catalog() -> dict[str, dict[str, dict]]:
    return {kind: read_yaml(CATALOG_DIR / f) or {} for kind, f in CATALOG_FILES.items()}


def read_overrides(
    path: Path | str, sections: Iterable[str], required: tuple[str, ...] = ("source",), kind: str = "catalog"
) -> dict[str, dict[str, dict]]:
    """A user file adding or overriding entries: {section: {name: {field: value}}}, each entry sourced."""
    sections = tuple(sections)
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a {kind} file is a mapping with sections {', '.join(sections)}")
    out: dict[str, dict[str, dict]] = {}
    for section, entries in data.items():
        if section not in sections:
            raise SpecError(f"{path}: unknown {kind} section {section!r}; use one of {', '.join(sections)}")
        if not isinstance(entries, dict):
            raise SpecError(f"{path}: {section}: expected a mapping of entries")
        for name, entry in entries.items():
            if not isinstance(entry, dict):
                raise SpecError(f"{path}: {section}.{name}: expected a mapping of fields")
            missing = [f for f in required if f not in entry]
            if missing:
                raise SpecError(
                    f"{path}: {section}.{name}: missing field {missing[0]!r} "
                    f"(every {kind} entry needs {' and '.join(required)})"
                )
            out.setdefault(section, {})[name] = dict(entry)
    return out


def load_catalog(extra: Path | str | None = None) -> dict[str, dict[str, dict]]:
    """Built-in catalog, plus/overridden by a user file with sections gpu/intra_node/inter_node/model."""
    cat = {k: dict(v) for k, v in _builtin_catalog().items()}
    if extra is not None:
        for section, entries in read_overrides(extra, CATALOG_FILES).items():
            cat[section].update(entries)
    return cat


def resolve_entry(kind: str, value: Any, catalog: dict, field: str) -> dict:
    """A catalog id -> its mapping (with name); a mapping passes through."""
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, str):
        raise SpecError(f"{field}: expected a catalog id or a mapping, got {excerpt(value)}")
    entries = catalog[kind]
    if value not in entries:
        close = difflib.get_close_matches(value, entries.keys(), n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SpecError(f"{field}: unknown {kind} {excerpt(value)}{hint} (known: {', '.join(sorted(entries))})")
    return {"name": value, **entries[value]}


def _format_validation_error(e: ValidationError, prefix: str = "") -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    field = ".".join(p for p in (prefix, loc) if p)
    msg = err["msg"].removeprefix("Value error, ")
    extra = (
        f" (got {excerpt(err['input'])})"
        if err["type"] not in ("value_error", "missing") and not isinstance(err.get("input"), dict)
        else ""
    )
    return f"{field or 'plan'}: {msg}{extra}"  # cross-field checks of a Job are about the plan


def build(model_cls: type[BaseModel], data: Any, field: str) -> Any:
    """Construct a spec model, turning pydantic's report into one SpecError line naming the field."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise SpecError(_format_validation_error(e, field)) from None


def resolve_cluster(raw: Any, catalog: dict, base_dir: Path | None = None, field: str = "cluster") -> dict:
    """Cluster section: a mapping or a path to a cluster YAML; ids resolved; profile file loaded."""
    if isinstance(raw, str):
        path = _relative_to(Path(raw), base_dir)
        data = read_yaml(path)
        if isinstance(data, dict) and "cluster" in data:
            data = data["cluster"]
        base_dir = path.parent
        raw = data
    if not isinstance(raw, dict):
        raise SpecError(f"{field}: expected a mapping or the path of a cluster YAML file")
    out = dict(raw)
    for key in ("gpu", "intra_node", "inter_node"):
        if key not in out:
            raise SpecError(f"{field}.{key}: missing (a catalog id or a mapping of numbers)")
        out[key] = resolve_entry(key, out[key], catalog, f"{field}.{key}")
    if isinstance(out.get("profile"), str):
        p = _relative_to(Path(out["profile"]), base_dir)
        out["profile"] = read_yaml(p)
        if not isinstance(out["profile"], dict):  # never echo the file: `profile:` can name any file
            raise SpecError(
                f"{field}.profile: {p} is not a hardware profile (a mapping with source and levels, "
                "written by `commtax calibrate`)"
            )
    return out


def _relative_to(path: Path, base_dir: Path | None) -> Path:
    """A relative path in a file is relative to that file's folder (as an include is), not to the current folder."""
    return base_dir / path if base_dir is not None and not path.is_absolute() else path


def load_job(source: Path | str | dict, catalog_file: Path | str | None = None) -> Job:
    """A job file (or mapping) -> a validated Job. Bad input raises one SpecError naming the field."""
    catalog = load_catalog(catalog_file)
    base_dir = None
    if isinstance(source, (str, Path)):
        base_dir = Path(source).parent
        data = read_yaml(Path(source))
    else:
        data = source
    if not isinstance(data, dict):
        raise SpecError("job: expected a mapping with model, cluster, plan, training")
    unknown = set(data) - {"model", "cluster", "plan", "training"}
    if unknown:
        raise SpecError(f"job: unknown section(s) {', '.join(sorted(unknown))}; use model, cluster, plan, training")
    for key in ("model", "cluster", "training"):
        if key not in data:
            raise SpecError(f"{key}: missing section")
    resolved = {
        "model": resolve_entry("model", data["model"], catalog, "model"),
        "cluster": resolve_cluster(data["cluster"], catalog, base_dir),
        "plan": data.get("plan") or {},
        "training": data["training"],
    }
    for key in ("plan", "training"):
        if not isinstance(resolved[key], dict):
            raise SpecError(f"{key}: expected a mapping")
    return build(Job, resolved, "")


def job_with(job: Job, **plan_changes: Any) -> Job:
    """The same job with some plan fields changed, validated again (used by search and advice)."""
    plan = job.plan.model_dump()
    plan.update(plan_changes)
    data = {"model": job.model, "cluster": job.cluster, "plan": plan, "training": job.training}
    return build(Job, data, "")
