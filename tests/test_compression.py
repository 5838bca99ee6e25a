"""Quantizers: packing, error bounds, the all-zero chunk, stochastic rounding, error feedback, the bytes table."""

from __future__ import annotations

import math

import pytest

from commtax.spec.wire_dtypes import CHUNK_ELEMS, FORMATS, bytes_per_element, packed_bytes, powersgd_bytes

torch = pytest.importorskip("torch")
from commtax.measure.compression import (  # noqa: E402
    ErrorFeedback,
    dequantize,
    padded_numel,
    quantize,
    roundtrip,
    row_bytes,
)

SCALED = ("int8", "int4", "fp8_e4m3", "fp8_e5m2")


def test_table_bytes_per_element_are_payload_plus_one_fp32_scale_per_chunk():
    assert bytes_per_element("fp32") == 4
    assert bytes_per_element("bf16") == 2
    assert bytes_per_element("int8") == 1 + 4 / 256
    assert bytes_per_element("int4") == 0.5 + 4 / 256  # two values per byte + the chunk's scale
    assert bytes_per_element("fp8_e5m2") == bytes_per_element("fp8") == 1 + 4 / 256


def test_powersgd_bytes_follow_torch_should_compress():
    # 1024×1024 rank 4: (1024 + 1024)·4 fp32 values; a 16×16 matrix would not save 2×: sent whole; a vector whole
    assert powersgd_bytes([(1024, 1024)], 4) == (1024 + 1024) * 4 * 4
    assert powersgd_bytes([(16, 16)], 4) == 16 * 16 * 4
    assert powersgd_bytes([(1024,)], 4) == 1024 * 4
    assert bytes_per_element("powersgd_r4", [(1024, 1024)]) == 2048 * 4 * 4 / 1024**2
    with pytest.raises(ValueError, match="shapes"):
        bytes_per_element("powersgd_r4")


@pytest.mark.parametrize("fmt", SCALED)
def test_packed_buffer_has_the_table_size(fmt):
    x = torch.randn(4 * CHUNK_ELEMS)
    p = quantize(x, fmt)
    assert p.dtype == torch.uint8
    assert p.numel() == packed_bytes(fmt, x.numel()) == 4 * row_bytes(fmt)
    assert p.numel() == x.numel() * FORMATS[fmt].bytes_per_element


@pytest.mark.parametrize(
    "fmt, rel_bound", [("int8", 0.5 / 127), ("int4", 0.5 / 7), ("fp8_e4m3", 2**-4), ("fp8_e5m2", 2**-3)]
)
def test_error_per_element_within_half_a_step_of_the_chunk_scale(fmt, rel_bound):
    torch.manual_seed(0)
    x = torch.randn(8 * CHUNK_ELEMS) * torch.logspace(-6, 2, 8).repeat_interleave(CHUNK_ELEMS)
    y = roundtrip(x, fmt)
    amax = x.view(-1, CHUNK_ELEMS).abs().amax(1).repeat_interleave(CHUNK_ELEMS)
    # ints: |x − Q(x)| ≤ s/2 = amax/(2 q_max); fp8: relative to the value (3 / 2 mantissa bits) or to amax
    assert torch.all((y - x).abs() <= rel_bound * amax * (1 + 1e-6) + 1e-30)


@pytest.mark.parametrize("fmt", SCALED)
def test_all_zero_gradient_is_sent_as_zeros_not_nan(fmt):
    # the seed article's sketch computes scale = q_max / max|x|: an all-zero gradient gives inf·0 = NaN
    x = torch.zeros(3 * CHUNK_ELEMS)
    x[2 * CHUNK_ELEMS + 5] = 0.25  # one live chunk beside two dead ones
    y = dequantize(quantize(x, fmt), fmt)
    assert torch.isfinite(y).all()
    assert torch.all(y[: 2 * CHUNK_ELEMS] == 0)
    assert y[2 * CHUNK_ELEMS + 5].item() == pytest.approx(0.25, rel=0.07)


def test_int4_packs_two_values_per_byte():
    x = torch.zeros(CHUNK_ELEMS)
    x[0], x[1] = 7.0, -7.0  # scale 1: q = 7 and −7 → nibbles 15 and 1 → byte 0x1F
    assert quantize(x, "int4")[0, 0].item() == 0x1F


@pytest.mark.parametrize("fmt", ("int8", "int4"))
def test_stochastic_rounding_is_unbiased_and_round_to_nearest_is_not(fmt):
    x = torch.full((CHUNK_ELEMS,), 0.3)
    x[0] = 7.0  # int4 scale 1 (int8 scale 7/127): 0.3 sits between grid points
    g = torch.Generator().manual_seed(0)
    mean = torch.stack([roundtrip(x, fmt, True, g) for _ in range(4000)]).mean(0)
    rtn = roundtrip(x, fmt)
    step = 7.0 / {"int8": 127, "int4": 7}[fmt]
    assert abs(mean[1:].mean().item() - 0.3) < 0.01 * step + 1e-3
    if fmt == "int4":
        assert rtn[1].item() == 0.0  # 0.3 < 0.5: round to nearest drops it every time


def test_error_feedback_delivers_what_rounding_drops():
    """A small constant gradient beside a large one: int4 rounds it to 0 every step; with error feedback
    the residual builds up until it is sent, so the sum of what was sent tracks the sum of gradients."""
    g = torch.full((CHUNK_ELEMS,), 0.01)
    g[0] = 1.0  # scale 1/7: 0.01 < half a step
    ef, sent_ef, sent_plain = ErrorFeedback(), torch.zeros(CHUNK_ELEMS), torch.zeros(CHUNK_ELEMS)
    steps = 100
    for _ in range(steps):
        x = ef.compensate(0, g)
        q = roundtrip(x, "int4")
        ef.update(0, x, q)
        sent_ef += q
        sent_plain += roundtrip(g, "int4")
    assert sent_plain[1].item() == 0.0  # lost for good without feedback
    # with feedback: the shortfall is the residual left at the end, at most half a step
    assert abs(sent_ef[1].item() - steps * 0.01) <= 0.5 / 7 + 1e-6
    assert math.isclose(sent_ef[0].item(), steps * 1.0, rel_tol=1e-6)


def test_padding_keeps_whole_chunks_per_rank():
    assert padded_numel(1, 2) == 2 * CHUNK_ELEMS
    assert padded_numel(2 * CHUNK_ELEMS, 2) == 2 * CHUNK_ELEMS
    assert padded_numel(2 * CHUNK_ELEMS + 1, 4) == 4 * CHUNK_ELEMS


def test_casts_for_unscaled_formats():
    x = torch.tensor([1.0 + 2**-10, 3.0])
    assert roundtrip(x, "bf16")[0].item() == 1.0  # bf16 keeps 8 mantissa bits
    assert roundtrip(x, "fp16")[0].item() == 1.0 + 2**-10
