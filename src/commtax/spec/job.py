"""A job: model, cluster, plan, training, and the checks across them."""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from pydantic import (
    model_validator,
)

from commtax.spec.base import CATALOG_DIR, _Spec
from commtax.spec.files import read_catalog_yaml
from commtax.spec.hardware import Cluster
from commtax.spec.model import Model
from commtax.spec.pipeline_split import per_rank, pipeline_split
from commtax.spec.plan import Plan, Training
from commtax.spec.pools import check_pools


@lru_cache(maxsize=1)
def eager_attention_archs() -> frozenset[str]:
    """GPU architectures without fused attention kernels (catalog/attention.yaml ``eager_archs``)."""
    return frozenset(read_catalog_yaml(CATALOG_DIR / "attention.yaml").get("eager_archs", []))


class Job(_Spec):
    model: Model
    cluster: Cluster
    plan: Plan
    training: Training

    @model_validator(mode="after")
    def _consistent(self) -> "Job":
        """The cross-field checks (``JOB_CHECKS``), in order: the first that fails words the refusal."""
        for check in JOB_CHECKS:
            check.run(self)
        return _eager_attention(self)

    @property
    def edp(self) -> int:
        """Expert data-parallel size (Megatron-Core parallel folding): num_gpus / (etp·ep·pp)."""
        p = self.plan
        return self.cluster.num_gpus // (p.etp * p.ep * p.pp)

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
    def micro_batch_tokens(self) -> int:
        """Tokens of one micro-batch on one CP rank (micro_batch × seq_len / cp). A block whose ops scale with the
        tokens alone (the head, the embedding) reads this, not the micro-batch and cp apart: its builder's cache
        (``workload.step``, kept by the values read) then holds one block for the plans of equal token counts."""
        return self.plan.micro_batch * self.training.seq_len // self.plan.cp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (gradient accumulation steps)."""
        return self.training.global_batch // (self.dp * self.plan.micro_batch)


@dataclass(frozen=True)
class JobCheck:
    """One cross-field rule of a Job: ``run`` raises ValueError naming the rule and the fix. ``reads``: which of the
    plan fields a search varies within a layout (``catalog.VARIANT_FIELDS``) the rule reads; it reads none of the
    others (``catalog.plan_variants`` checks each rule once per value of those, tests/test_plan_variant.py)."""

    run: Callable[[Job], None]
    reads: frozenset[str]


JOB_CHECKS: list[JobCheck] = []  # in the order the Job validator runs them


def _check(*reads: str) -> Callable[[Callable[[Job], None]], Callable[[Job], None]]:
    def register(run: Callable[[Job], None]) -> Callable[[Job], None]:
        JOB_CHECKS.append(JobCheck(run, frozenset(reads)))
        return run

    return register


@_check()
def _layout_divides_gpus(job: Job) -> None:
    c, p = job.cluster, job.plan
    mp = p.tp * p.pp * p.cp
    if c.num_gpus % mp:
        raise ValueError(f"tp({p.tp}) * pp({p.pp}) * cp({p.cp}) = {mp} does not divide num_gpus({c.num_gpus})")
    if p.dp is not None and p.dp * mp != c.num_gpus:
        raise ValueError(f"dp({p.dp}) * tp({p.tp}) * pp({p.pp}) * cp({p.cp}) = {p.dp * mp} != num_gpus({c.num_gpus})")


@_check()
def _tp_divides_heads(job: Job) -> None:
    m, p = job.model, job.plan
    if m.heads % p.tp or m.kv_heads_ % p.tp:
        raise ValueError(
            f"tp({p.tp}) must divide heads({m.heads}) and kv_heads({m.kv_heads_}): choose tp in "
            f"{[d for d in range(1, m.kv_heads_ + 1) if m.kv_heads_ % d == 0]}"
        )


@_check("vp")
def _interleaving_schedule(job: Job) -> None:
    p = job.plan
    if p.vp > 1 and p.pp == 1:
        raise ValueError("vp > 1 (interleaved 1F1B) needs pp > 1")
    if p.vp > 1 and p.schedule not in ("1f1b", "1f1b-flexible", "zb-v"):
        raise ValueError(
            f"vp({p.vp}) > 1 needs schedule 1f1b, 1f1b-flexible or zb-v (interleaving is Megatron's interleaved "
            "1F1B); set vp: 1 or schedule: 1f1b"
        )
    if p.schedule == "zb-v" and p.vp != 2:
        raise ValueError(
            f"schedule zb-v runs two model chunks per stage in a V (Qi et al. 2023): set vp: 2, not {p.vp}"
        )


@_check()
def _flexible_is_custom(job: Job) -> None:
    p = job.plan
    if p.schedule == "1f1b-flexible" and p.framework != "custom":
        raise ValueError(
            f"schedule 1f1b-flexible is Llama 3's modified interleaved schedule (Llama Team 2024 §3.3.2), not "
            f"{p.framework}'s: set framework: custom, or schedule: 1f1b"
        )


@_check("vp")
def _pipeline_split(job: Job) -> None:
    pipeline_split(job.model.layers, job.plan)  # raises naming the stage-split field and the fix


@_check("micro_batch")
def _pools(job: Job) -> None:
    check_pools(job)  # pools: TP inside a pool, stages and batch shares per pool (spec/pools.py)


def _micro_batches(job: Job) -> int:
    """Micro-batches per replica as the checks read them (``Job.micro_batches``)."""
    return job.training.global_batch // (job.dp * job.plan.micro_batch)


@_check("micro_batch")
def _batch_divides(job: Job) -> None:
    c, p, t = job.cluster, job.plan, job.training
    dp_across_pools = bool(c.pools) and p.stage_pools is None
    if not dp_across_pools and t.global_batch % (job.dp * p.micro_batch):
        raise ValueError(
            f"global_batch({t.global_batch}) must be divisible by dp({job.dp}) * micro_batch({p.micro_batch}) = "
            f"{job.dp * p.micro_batch}"
        )


@_check("vp", "micro_batch")
def _interleaved_micro_batches(job: Job) -> None:
    p = job.plan
    m_micro = _micro_batches(job)
    if p.vp > 1 and p.schedule == "1f1b" and m_micro % p.pp:
        # Megatron-LM/Core schedules.py, forward_backward_pipelining_with_interleaving: "number of microbatches
        # is not divisible by pipeline-model-parallel-size when using interleaved schedule" (Narayanan 2021 §2.2)
        raise ValueError(
            f"vp({p.vp}) > 1 needs the micro-batches per replica, global_batch/(dp*micro_batch) = {m_micro}, to be "
            f"a multiple of pp({p.pp}) (Megatron's interleaved schedule); use vp: 1, a smaller micro_batch or pp"
            + (", or schedule: 1f1b-flexible (Llama 3's interleaving)" if p.framework == "custom" else "")
        )


@_check()
def _recompute_modules(job: Job) -> None:
    _recompute_modules_exist(job.model, job.plan)  # ``moe_refusal``'s checks, each on its own: what it reads


@_check("vp", "sequence_parallel")
def _moe_plan(job: Job) -> None:
    moe_plan_refusal(job.model, job.plan, job.cluster.num_gpus)


@_check("vp", "micro_batch")
def _dualpipe(job: Job) -> None:
    dualpipe_refusal(job.plan, _micro_batches(job))


@_check()
def _cp_divides_seq(job: Job) -> None:
    if job.training.seq_len % job.plan.cp:
        raise ValueError(f"seq_len({job.training.seq_len}) must be divisible by cp({job.plan.cp})")


@_check("sequence_parallel")
def _sequence_parallel_divides(job: Job) -> None:
    p, t = job.plan, job.training
    if p.sequence_parallel and t.seq_len // p.cp % p.tp:
        raise ValueError(f"sequence_parallel needs seq_len/cp ({t.seq_len // p.cp}) divisible by tp({p.tp})")


@_check()
def _precision_runs(job: Job) -> None:
    job.cluster.gpu.peak_flops(job.training.precision)  # raises SpecError naming the precision


@_check()
def _mxfp8_needs_blackwell(job: Job) -> None:
    # Transformer Engine quantization.py check_mxfp8_support (v2.14): "Device compute capability 10.0 or higher
    # required for MXFP8 execution."
    if job.plan.fp8_recipe == "mxfp8" and job.cluster.gpu.arch != "blackwell":
        raise ValueError(
            f"fp8_recipe mxfp8 needs a Blackwell GPU (compute capability 10.0; Transformer Engine's MXFP8 check), "
            f"not {job.cluster.gpu.arch}: use delayed or current scaling"
        )


@_check()
def _fp8_attention_runs(job: Job) -> None:
    # Transformer Engine runs FP8 attention only inside an fp8 autocast with the recipe's fp8_dpa, on FusedAttention
    # (cuDNN; FlashAttention and the unfused path are disabled for FP8, attention/dot_product_attention/utils.py
    # get_attention_backend, v2.16); MXFP8 attention needs sm100 and cuDNN >= 9.21. Only cuDNN's MXFP8 attention on
    # Blackwell is measured (catalog/attention.yaml mxfp8_time_ratio).
    p, arch = job.plan, job.cluster.gpu.arch
    if not p.fp8_attention:
        return
    if job.training.precision != "fp8" or p.fp8_recipe != "mxfp8":
        raise ValueError(
            "fp8_attention is Transformer Engine's FP8 dot-product attention inside an fp8 run: it is priced for "
            f"precision fp8 with fp8_recipe mxfp8 (here {job.training.precision}, {p.fp8_recipe})"
        )
    measured = read_catalog_yaml(CATALOG_DIR / "attention.yaml").get("mxfp8_time_ratio", {}).get(p.attention) or {}
    if p.attention != "cudnn" or arch not in measured:
        raise ValueError(
            f"fp8_attention runs on cuDNN's fused attention (Transformer Engine disables the other backends for FP8); "
            f"set attention: cudnn (cuDNN's MXFP8 attention is measured on blackwell, not {p.attention} on {arch})"
        )


@_check()
def _fp8_output_proj_runs(job: Job) -> None:
    # Megatron-Core fp8_utils.is_mxfp8_output_proj_active (core_v0.18.0): fp8_output_proj, fp8 and the mxfp8 recipe;
    # otherwise GPTModel keeps the bf16 ColumnParallelLinear head
    p = job.plan
    if p.fp8_output_proj and (job.training.precision != "fp8" or p.fp8_recipe != "mxfp8"):
        raise ValueError(
            "fp8_output_proj is Megatron-Core's MXFP8 LM head: it needs precision fp8 with fp8_recipe mxfp8 (here "
            f"{job.training.precision}, {p.fp8_recipe})"
        )


def _eager_attention(job: Job) -> Job:
    """The job with eager attention where no fused attention kernel runs on its GPU's architecture
    (catalog/attention.yaml eager_archs); the job itself otherwise (it reads none of ``VARIANT_FIELDS``)."""
    p = job.plan
    if p.attention != "eager" and job.cluster.gpu.arch in eager_attention_archs():
        object.__setattr__(job, "plan", p.model_copy(update={"attention": "eager"}))
    return job


def moe_refusal(m: Model, p: Plan, num_gpus: int, micro_batches: int) -> None:
    """Megatron-Core's checks of an expert-parallel plan, each refusal naming the rule (megatron/training/arguments.py
    validate_args, megatron/core/parallel_state.py initialize_model_parallel), and DualPipe's (deepseek-ai/DualPipe
    dualpipe.py ``step``: num_chunks >= 2·ranks, an even number of ranks)."""
    _recompute_modules_exist(m, p)
    moe_plan_refusal(m, p, num_gpus)
    dualpipe_refusal(p, micro_batches)


def moe_plan_refusal(m: Model, p: Plan, num_gpus: int) -> None:
    """Megatron-Core's checks of the expert-parallel fields (``moe_refusal``): MoE fields on a dense model, ep, etp
    and the all-to-all overlap."""
    if not m.is_moe:
        moe_only = {
            "ep": p.ep > 1,
            "etp": p.etp > 1,
            "moe_a2a_overlap": p.moe_a2a_overlap,
            "cuda_graphs": p.cuda_graphs != "none",  # priced only as the MoE layer's host sync (docs/moe.md)
        }
        bad = [k for k, v in moe_only.items() if v]
        if bad:
            raise ValueError(
                f"plan.{bad[0]} applies to MoE models: set model.num_experts, top_k, moe_ffn_hidden or drop it"
            )
    else:
        if m.num_experts % p.ep:
            fits = [d for d in range(1, min(m.num_experts, num_gpus) + 1) if m.num_experts % d == 0 == num_gpus % d]
            raise ValueError(
                f"num_experts({m.num_experts}) must be divisible by ep({p.ep}) (Megatron: num_experts % "
                f"expert_model_parallel_size == 0); choose ep in {fits}"
            )
        emp = p.etp * p.ep * p.pp
        if num_gpus % emp:
            raise ValueError(
                f"etp({p.etp}) * ep({p.ep}) * pp({p.pp}) = {emp} does not divide num_gpus({num_gpus}) (Megatron "
                "parallel folding: the expert grid etp×ep×edp×pp covers the same GPUs as tp×cp×dp×pp)"
            )
        if m.moe_ffn_hidden % p.etp:
            raise ValueError(f"moe_ffn_hidden({m.moe_ffn_hidden}) must be divisible by etp({p.etp})")
        if p.tp > 1 and not p.sequence_parallel:
            raise ValueError(
                f"tp({p.tp}) > 1 with MoE needs sequence_parallel: true (Megatron: 'When using MoE and tensor "
                "parallelism, sequence parallelism must be used')"
            )
        if p.moe_a2a_overlap:
            if p.ep == 1:
                raise ValueError(
                    "moe_a2a_overlap needs ep > 1 (Megatron overlap_moe_expert_parallel_comm: EP size > 1)"
                )
            if p.moe_dispatcher == "allgather":
                raise ValueError(
                    "moe_a2a_overlap needs moe_dispatcher alltoall, deepep or hybridep (Megatron: alltoall or flex)"
                )
            if p.pp > 1 and p.vp == 1 and p.schedule == "1f1b":
                raise ValueError(
                    "moe_a2a_overlap with pp > 1 needs interleaving, vp > 1 (Megatron: "
                    "overlap_moe_expert_parallel_comm requires virtual pipeline parallelism when pp > 1)"
                )
            if p.recompute == "full":
                raise ValueError("moe_a2a_overlap does not run with recompute: full (Megatron); use selective or none")
            if "moe" in p.recomputed:
                raise ValueError(
                    "moe_a2a_overlap does not run with recompute_modules moe (Megatron: 'disable moe in "
                    "recompute_modules when enabling overlap_moe_expert_parallel_comm'); drop moe or the overlap"
                )


def dualpipe_refusal(p: Plan, micro_batches: int) -> None:
    """DualPipe's checks (``moe_refusal``): an even number of ranks, its own two chunks, 2·pp micro-batches (an even
    number of them for DualPipe)."""
    if p.schedule in ("dualpipe", "dualpipev"):
        if p.pp < 2 or p.pp % 2:
            raise ValueError(f"schedule {p.schedule} needs an even pp ≥ 2, got pp({p.pp}) (DualPipe pairs ranks)")
        if p.vp != 1:
            raise ValueError(f"schedule {p.schedule} runs its own two chunks per rank: set vp: 1")
        if micro_batches < 2 * p.pp:
            raise ValueError(
                f"schedule {p.schedule} needs at least 2·pp = {2 * p.pp} micro-batches per replica, got "
                f"{micro_batches} (DualPipe: num_chunks >= num_ranks * 2); raise global_batch or lower micro_batch"
            )
        # dualpipe.py DualPipe.step asserts num_chunks % 2 == 0 (half the chunks enter from each end);
        # dualpipev.py does not
        if p.schedule == "dualpipe" and micro_batches % 2:
            raise ValueError(
                f"schedule dualpipe needs an even number of micro-batches per replica, got {micro_batches} "
                "(DualPipe: num_chunks % 2 == 0, half enter from each end); change global_batch or micro_batch"
            )


def _recompute_modules_exist(m: Model, p: Plan) -> None:
    """Each module of plan.recompute_modules is in the model: a module it lacks would be silently a no-op."""
    if not p.recompute_modules:  # none named: nothing to check (a search asks this ~10^4 times)
        return
    has = {
        "mla_up_proj": (m.mla, "an MLA model (kv_lora_rank)"),
        "moe_act": (m.is_moe, "an MoE model (num_experts)"),
        "moe": (m.is_moe, "an MoE model (num_experts)"),
        "shared_experts": (m.is_moe and m.shared_experts > 0, "shared experts (model.shared_experts)"),
        "mlp": (m.layers > m.moe_layer_count, "a dense MLP layer (an MoE model has them with first_k_dense/alternate)"),
    }
    for mod in p.recompute_modules or ():
        ok, needs = has.get(mod, (True, ""))
        if not ok:
            raise ValueError(f"recompute_modules: {mod} needs {needs}; drop {mod} from recompute_modules")
