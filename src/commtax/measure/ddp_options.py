"""What ``commtax bench ddp`` is asked to run, checked before torch is imported or ranks are launched.

``check_ddp_options`` refuses what the benchmark cannot run (one line naming the option and the fix, a
``SpecError``); ``read_gemm_records`` reads the fp32 GEMM records of ``commtax bench gemm --out`` that calibrate
the benchmark's predicted compute.
"""

from __future__ import annotations

import json
from pathlib import Path

from commtax.errors import SpecError
from commtax.spec.wire_dtypes import POWERSGD_RANKS

DDP_HOOKS = ("none", "fp16", "bf16", "fp8", "fp8_e5m2", "int8", "int4", "powersgd")
DDP_OPTIMIZERS = ("adamw", "sgd")

# bench ddp's model and loop: each bound far above what a CPU rank trains in minutes, far below what fills memory
DDP_LIMITS = {
    "--seq-len": 16_384,
    "--accumulate": 4_096,
    "--steps": 100_000,
    "--warmup": 10_000,
    "--micro-batch": 4_096,
    "--hidden": 16_384,
    "--layers": 256,
    "--heads": 1_024,
    "--vocab": 1_048_576,
}
MAX_DDP_TOKENS = 1 << 20  # micro-batch × seq-len per rank per micro-batch


def check_ddp_sizes(**sizes: int) -> None:
    """Each size option (``hidden=256`` for ``--hidden``) within ``DDP_LIMITS``; given ``micro_batch`` and
    ``seq_len``, the tokens of a micro-batch within ``MAX_DDP_TOKENS``."""
    for name, v in sizes.items():
        opt = "--" + name.replace("_", "-")
        if v > DDP_LIMITS[opt]:
            raise SpecError(f"{opt}: {v:,} is over the limit of {DDP_LIMITS[opt]:,} for bench ddp's CPU model")
    tokens = sizes.get("micro_batch", 1) * sizes.get("seq_len", 1)
    if tokens > MAX_DDP_TOKENS:
        raise SpecError(
            f"--micro-batch × --seq-len: {tokens:,} tokens per micro-batch per rank, over the limit of "
            f"{MAX_DDP_TOKENS:,}"
        )


def check_ddp_options(
    hook: str, error_feedback: bool, powersgd_rank: int, hidden: int, heads: int, optimizer: str
) -> tuple[str, ...]:
    """The hooks of ``--hook`` (a comma list), after checking the options that depend on them."""
    hooks = tuple(h.strip() for h in hook.split(",") if h.strip())
    bad = [h for h in hooks if h not in DDP_HOOKS]
    if bad or not hooks:
        raise SpecError(f"--hook: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(DDP_HOOKS)}")
    if error_feedback and any(h in ("none", "fp16", "bf16") for h in hooks):
        raise SpecError(
            "--error-feedback: applies to fp8, fp8_e5m2, int8, int4 and powersgd; drop none/fp16/bf16 from --hook"
        )
    if powersgd_rank not in POWERSGD_RANKS:
        raise SpecError(f"--powersgd-rank: choose from {', '.join(map(str, POWERSGD_RANKS))}")
    if hidden % heads:
        raise SpecError(f"--hidden ({hidden}) must be divisible by --heads ({heads})")
    if optimizer not in DDP_OPTIMIZERS:
        raise SpecError(f"--optimizer: choose adamw or sgd, got {optimizer!r}")
    return hooks


def read_gemm_records(path: Path) -> list[dict]:
    """The fp32 GEMM records of a ``commtax bench gemm --out`` file (at least one)."""
    try:
        gemm = [r for r in json.loads(path.read_text()) if r.get("op") == "gemm" and r.get("dtype") == "fp32"]
    except (OSError, ValueError) as e:
        raise SpecError(f"--gemm: cannot read {path}: {e}") from None
    if not gemm:
        raise SpecError(f"--gemm: {path} has no fp32 gemm records; run `commtax bench gemm --dtypes fp32 --out {path}`")
    return gemm
