"""Bytes on the wire per gradient element, per gradient-communication format: the ONE table.

The estimator (``Plan.grad_comm_dtype`` → ``workload.grad_bytes_per_param``) and the DDP hooks
(``commtax.measure.hooks``) both read it; ``tests/test_hooks.py`` counts the bytes the hooks hand
to torch.distributed and checks them against it. Torch-free (the estimate path imports it).

Scaled formats carry one fp32 scale per ``CHUNK_ELEMS`` elements (absmax scaling per chunk,
as in Dettmers et al. 2022 "8-bit Optimizers via Block-wise Quantization", block 256… 2048; and
the per-tensor amax scale of FP8 training, Micikevicius et al. 2022, made per chunk). int4 packs
two values per byte. PowerSGD (Vogels et al. 2019) sends, per m×n matrix, P (m×r) and Q (n×r)
in the gradient's dtype (fp32 here, as torch's ``powerSGD_hook`` does for an fp32 bucket) and
leaves vectors and matrices it would not compress ``min_compression_rate``× uncompressed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CHUNK_ELEMS = 256  # elements per scale
SCALE_BYTES = 4  # one fp32 scale per chunk: gradients reach 1e-10, below fp16's smallest subnormal (6e-8)
POWERSGD_RANKS = (1, 2, 4, 8)
POWERSGD_MIN_COMPRESSION_RATE = 2.0  # torch PowerSGDState default: compress a matrix only if it saves ≥ 2×


@dataclass(frozen=True)
class CommFormat:
    name: str
    payload_bits: int  # bits per element of the payload
    scaled: bool  # one SCALE_BYTES scale per CHUNK_ELEMS elements
    source: str

    @property
    def bytes_per_element(self) -> float:
        """Payload + scale bytes per gradient element (e.g. int4: 4/8 + 4/256 = 0.515625 B)."""
        return self.payload_bits / 8 + (SCALE_BYTES / CHUNK_ELEMS if self.scaled else 0.0)


FORMATS: dict[str, CommFormat] = {
    "fp32": CommFormat("fp32", 32, False, "IEEE 754 binary32: DDP's default all-reduce of fp32 gradients"),
    "bf16": CommFormat("bf16", 16, False, "torch ddp_comm_hooks.default_hooks.bf16_compress_hook: cast, all-reduce"),
    "fp16": CommFormat("fp16", 16, False, "torch ddp_comm_hooks.default_hooks.fp16_compress_hook: cast, all-reduce"),
    "fp8": CommFormat("fp8", 8, True, "alias of fp8_e4m3"),
    "fp8_e4m3": CommFormat("fp8_e4m3", 8, True, "torch.float8_e4m3fn (OCP FP8 spec 2023), absmax-scaled per chunk"),
    "fp8_e5m2": CommFormat("fp8_e5m2", 8, True, "torch.float8_e5m2 (OCP FP8 spec 2023), absmax-scaled per chunk"),
    "int8": CommFormat("int8", 8, True, "symmetric int8, absmax-scaled per chunk (Dettmers et al. 2022)"),
    "int4": CommFormat("int4", 4, True, "symmetric int4 in [-7, 7], two per byte, absmax-scaled per chunk"),
}
POWERSGD = {f"powersgd_r{r}": r for r in POWERSGD_RANKS}
COMM_DTYPES = tuple(FORMATS) + tuple(POWERSGD)


def powersgd_rank(name: str) -> int | None:
    """``powersgd_r4`` → 4; any other format → None."""
    return POWERSGD.get(name)


def powersgd_compresses(
    rows: int, cols: int, rank: int, min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE
) -> bool:
    """torch powerSGD_hook._should_compress: (rows + cols)·r · rate < rows·cols."""
    return (rows + cols) * rank * min_compression_rate < rows * cols


def powersgd_bytes(
    shapes: Iterable[tuple[int, ...]],
    rank: int,
    elem_bytes: float = 4.0,
    min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE,
) -> float:
    """Message bytes PowerSGD all-reduces for gradients of these shapes (Vogels et al. 2019, Alg. 1).

    A tensor of ≥ 2 dims is viewed as rows = shape[0], cols = the rest (as torch's hook does);
    compressed: P (rows×r) + Q (cols×r); else (and every vector) its numel, at ``elem_bytes``.
    """
    total = 0.0
    for shape in shapes:
        numel = 1
        for d in shape:
            numel *= d
        if len(shape) >= 2:
            rows, cols = shape[0], numel // shape[0]
            if powersgd_compresses(rows, cols, rank, min_compression_rate):
                total += (rows + cols) * rank * elem_bytes
                continue
        total += numel * elem_bytes
    return total


def bytes_per_element(name: str, shapes: Iterable[tuple[int, ...]] | None = None) -> float:
    """Wire bytes per gradient element of format ``name`` (PowerSGD needs the gradients' shapes)."""
    if name in FORMATS:
        return FORMATS[name].bytes_per_element
    rank = powersgd_rank(name)
    if rank is None:
        raise ValueError(f"unknown gradient communication format {name!r}; choose from {', '.join(COMM_DTYPES)}")
    if shapes is None:
        raise ValueError(f"{name}: bytes per element depend on the gradients' shapes; pass shapes")
    shapes = list(shapes)
    numel = sum(_numel(s) for s in shapes)
    return powersgd_bytes(shapes, rank) / numel


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def packed_bytes(name: str, numel: int) -> int:
    """Exact bytes of ``numel`` elements packed by the hooks: payload (int4 rounded up to whole bytes,
    per chunk) + one scale per started chunk. Tends to ``numel · bytes_per_element`` for large numel."""
    f = FORMATS[name]
    if not f.scaled:
        return numel * f.payload_bits // 8
    chunks = -(-numel // CHUNK_ELEMS)
    return chunks * (CHUNK_ELEMS * f.payload_bits // 8 + SCALE_BYTES)


# ----------------------------------------------------------------------------- the codec's memory traffic
# DRAM/HBM bytes per gradient element that the hooks of commtax.measure.hooks move besides the wire, counted op by
# op from the code they run (each elementwise torch op reads its inputs and writes its output once; per-chunk
# scale vectors, 1/256 of the elements, are counted only where they are written into the packed buffer).
# compression.quantize, per element of its input (b = the format's packed bytes per element):
#   abs 4+4, amax 4, scale (mul, or div for fp8) 4+4; int: round_ 4+4, clamp_ 4+4, .to(int8) 4+1;
#   int4 also (q + 8) 1+1, .to(uint8) 1+1, odd << 4 0.5+0.5, | 1+0.5; fp8: .to(float8) 4+1; cat(payload, scales) b+b
QUANTIZE_BYTES = {"int8": 41.0, "int4": 47.5, "fp8": 25.0}
# compression.dequantize, per element of its output: int8/fp8 payload.contiguous() 1+1, .float() 1+4, mul_(scales)
# 4+4; int4: & 0x0F 0.5+0.5, >> 4 0.5+0.5, stack 1+1, .float() 1+4, sub_(8) 4+4, mul_(scales) 4+4
DEQUANTIZE_BYTES = {"int8": 15.0, "int4": 25.0, "fp8": 15.0}


# Error feedback (commtax.measure.compression.ErrorFeedback), per element it applies to: ``compensate`` x + e 4+4+4,
# ``update`` dequantize(packed) D and compensated − sent 4+4+4; applied to the worker's whole bucket and to the
# shard the rank owns (1/n of it). torch's powerSGD_hook with use_error_feedback, per bucket element:
# ``input_tensor.add_(error)`` 4+4+4, ``input_tensor.detach().clone()`` 4+4, ``input_tensor_cp - input_tensor`` 4+4+4.
ERROR_FEEDBACK_BYTES = 24.0
POWERSGD_ERROR_FEEDBACK_BYTES = 32.0
# Conversions between fp32 and the fp8 formats: on GPUs one instruction per pair of elements (PTX cvt.rn.satfinite
# .e4m3x2.f32, sm_89+), so memory-bound; torch on CPU converts element by element in scalar code, measured 0.23
# Gelem/s for e4m3 → fp32 where a copy streams 2.5 Gelem/s. A device lists its rates in ``GPU.convert_Gelem_s``.
CONVERSIONS = ("fp32->fp8_e4m3", "fp8_e4m3->fp32", "fp32->fp8_e5m2", "fp8_e5m2->fp32")
CONVERT_BYTES = 5.0  # fp32 read + fp8 written, or fp8 read + fp32 written


def _fp8_name(name: str) -> str:
    return "fp8_e4m3" if name == "fp8" else name


def codec_conversions(name: str, n: int, error_feedback: bool = False) -> dict[str, float]:
    """fp8 conversions per gradient element of our quantized hook (empty for other formats).

    quantize casts the bucket and, after the average, the owned shard: 1 + 1/n to fp8; dequantize casts the received
    shards and the gathered ones: 2 back to fp32; error feedback dequantizes what it sent once more: + (1 + 1/n).
    """
    if not name.startswith("fp8"):
        return {}
    f = _fp8_name(name)
    back = 2.0 + ((1 + 1.0 / n) if error_feedback else 0.0)
    return {f"fp32->{f}": 1 + 1.0 / n, f"{f}->fp32": back}


def codec_bytes_per_element(name: str, n: int, grad_bytes: float = 4.0, error_feedback: bool = False) -> float:
    """Memory bytes per gradient element of the hook that sends format ``name`` among ``n`` ranks (0 for fp32).

    fp16/bf16, torch default_hooks._compress_hook: ``buffer.to(dtype)`` g+2, ``.div_(n)`` 2+2, after the
    all-reduce ``buffer.copy_(value)`` 2+g: 2g + 8 (16 B for fp32 gradients, g = ``grad_bytes``).
    int8/int4/fp8, commtax.measure.hooks.quantized_hook, per bucket of N elements: ``torch.zeros`` 4, ``x[:N] = buf``
    g+4, quantize Q, dequantize the received shards D, ``.view(n, -1).sum(0)`` 4 + 4/n, ``.div_(n)`` 8/n, requantize
    the shard Q/n, dequantize the gathered shards D, ``buf.copy_`` 4+g:
    16 + 2g + 12/n + Q·(1 + 1/n) + 2D, with Q = QUANTIZE_BYTES + 2b and D = DEQUANTIZE_BYTES; error feedback adds
    (ERROR_FEEDBACK_BYTES + D)·(1 + 1/n). PowerSGD: see ``workload.powersgd_codec_ops`` (GEMMs, not a constant).
    """
    if name not in FORMATS:
        raise ValueError(f"{name}: codec bytes per element are defined for {', '.join(FORMATS)}")
    if name == "fp32":
        return 0.0
    if name in ("fp16", "bf16"):
        return 2 * grad_bytes + 8.0
    kind = "fp8" if name.startswith("fp8") else name
    q = QUANTIZE_BYTES[kind] + 2 * FORMATS[name].bytes_per_element
    fixed = 4.0 + (grad_bytes + 4.0) + (4.0 + grad_bytes) + 4.0 + 12.0 / n  # zeros, copy in, copy out, sum, div
    ef = (ERROR_FEEDBACK_BYTES + DEQUANTIZE_BYTES[kind]) * (1 + 1.0 / n) if error_feedback else 0.0
    return fixed + q * (1 + 1.0 / n) + 2 * DEQUANTIZE_BYTES[kind] + ef
