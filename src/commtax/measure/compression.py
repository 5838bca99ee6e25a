"""Gradient quantizers with per-chunk scales, packed into uint8 for the wire, and error feedback.

Formats and their bytes per element come from ``commtax.spec.wire_dtypes`` (the one table). A packed
buffer is a ``(chunks, CHUNK_ELEMS · bits / 8 + SCALE_BYTES)`` uint8 tensor: each row holds one
chunk's payload followed by its fp32 scale, so any split at row boundaries (one shard per rank)
is itself a valid packed buffer, and gloo (which has no float8 or int4 types) moves plain bytes.

* int8 / int4: symmetric absmax scaling per chunk, s = max|x| / q_max (q_max 127 / 7), q = round(x / s)
  (round to nearest, or stochastic: floor(x / s + u), u ~ U[0, 1), unbiased; Alistarh et al. 2017,
  "QSGD"). int4 stores q + 8 in a nibble, two per byte. An all-zero chunk has s = 0: it is sent with
  s = 0 and q = 0 (the seed article's 4-bit sketch divides by max|x| and returns NaN there).
* fp8 e4m3 / e5m2: x / s cast to ``torch.float8_e4m3fn`` / ``float8_e5m2`` with s = max|x| / fp8_max
  (448 / 57344), the per-tensor amax recipe of FP8 training (Micikevicius et al. 2022) per chunk.
* fp16 / bf16: plain casts, no scale (torch's own hooks do these; see ``commtax.measure.hooks``).

Error feedback (Seide et al. 2014, 1-bit SGD; Karimireddy et al. 2019, "EF-SGD"): the part the
quantizer dropped, e = x − Q(x), is added to the next step's gradient, so nothing is lost for good.
"""

from __future__ import annotations

import torch

from commtax.spec.wire_dtypes import CHUNK_ELEMS, FORMATS, SCALE_BYTES

INT_MAX = {"int8": 127, "int4": 7}  # symmetric ranges: -q_max … q_max
FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
CAST_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
QUANTIZED = tuple(INT_MAX) + tuple(FP8_DTYPES)


def row_bytes(fmt: str) -> int:
    """Bytes of one packed chunk: payload + scale (int8 260, int4 132, fp8 260)."""
    return CHUNK_ELEMS * FORMATS[fmt].payload_bits // 8 + SCALE_BYTES


def padded_numel(numel: int, parts: int = 1) -> int:
    """``numel`` rounded up to whole chunks per part (each rank's shard holds whole chunks)."""
    step = CHUNK_ELEMS * parts
    return -(-numel // step) * step


def _scales(chunks: torch.Tensor, q_max: float) -> torch.Tensor:
    """max|x| / q_max per chunk; 0 for an all-zero chunk (never divided by: see ``_safe``)."""
    return chunks.abs().amax(dim=1) / q_max


def _safe(scales: torch.Tensor) -> torch.Tensor:
    return torch.where(scales > 0, scales, torch.ones_like(scales))


def quantize(
    x: torch.Tensor, fmt: str, stochastic: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A flat float tensor (numel a multiple of CHUNK_ELEMS) → packed uint8 rows (chunks × row_bytes)."""
    if fmt not in QUANTIZED:
        raise ValueError(f"quantize: {fmt!r} is not a scaled format; choose from {', '.join(QUANTIZED)}")
    assert x.numel() % CHUNK_ELEMS == 0, "pad to whole chunks first (padded_numel)"
    chunks = x.detach().float().reshape(-1, CHUNK_ELEMS)
    if fmt in FP8_DTYPES:
        dtype = FP8_DTYPES[fmt]
        scales = _scales(chunks, torch.finfo(dtype).max)
        payload = (chunks / _safe(scales)[:, None]).to(dtype).view(torch.uint8)
    else:
        q_max = INT_MAX[fmt]
        scales = _scales(chunks, q_max)
        y = chunks * _safe(scales).reciprocal()[:, None]  # a fresh tensor: the rest works in place
        if stochastic:
            y.add_(torch.rand(y.shape, generator=generator, dtype=y.dtype)).floor_()
        else:
            y.round_()
        q = y.clamp_(-q_max, q_max).to(torch.int8)
        if fmt == "int8":
            payload = q.view(torch.uint8)
        else:  # int4: q + 8 ∈ [1, 15] in a nibble, even index low, odd index high
            u = (q + 8).to(torch.uint8)
            payload = u[:, 0::2] | (u[:, 1::2] << 4)
    return torch.cat([payload, scales.to(torch.float32).view(torch.uint8).reshape(-1, SCALE_BYTES)], dim=1)


def dequantize(packed: torch.Tensor, fmt: str) -> torch.Tensor:
    """Packed uint8 rows → flat fp32 tensor of rows × CHUNK_ELEMS elements."""
    packed = packed.reshape(-1, row_bytes(fmt))
    payload, scales = packed[:, :-SCALE_BYTES], packed[:, -SCALE_BYTES:].contiguous().view(torch.float32)
    if fmt in FP8_DTYPES:
        y = payload.contiguous().view(FP8_DTYPES[fmt]).float()
    elif fmt == "int8":
        y = payload.contiguous().view(torch.int8).float()
    else:
        y = torch.stack([payload & 0x0F, payload >> 4], dim=2).reshape(-1, CHUNK_ELEMS).float().sub_(8)
    return y.mul_(scales).reshape(-1)  # scales: (rows, 1), one per chunk


def roundtrip(
    x: torch.Tensor, fmt: str, stochastic: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Q(x) for a flat tensor of any length (padded with zeros, then cut back); casts for fp32/bf16/fp16."""
    if fmt in CAST_DTYPES:
        return x.to(CAST_DTYPES[fmt]).to(x.dtype)
    n = x.numel()
    xp = torch.zeros(padded_numel(n), dtype=torch.float32)
    xp[:n] = x.reshape(-1)
    return dequantize(quantize(xp, fmt, stochastic, generator), fmt)[:n].reshape(x.shape).to(x.dtype)


class ErrorFeedback:
    """Residuals e_t = (g_t + e_{t−1}) − Q(g_t + e_{t−1}), kept per key (a DDP bucket index)."""

    def __init__(self) -> None:
        self.residuals: dict[object, torch.Tensor] = {}

    def compensate(self, key: object, x: torch.Tensor) -> torch.Tensor:
        """x + the residual carried from the last step under ``key`` (x itself the first time)."""
        e = self.residuals.get(key)
        return x if e is None or e.shape != x.shape else x + e

    def update(self, key: object, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        self.residuals[key] = compensated - sent
