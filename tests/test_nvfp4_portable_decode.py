"""The arithmetic behind patch 0002's portable weight decode (``_dequant_dot`` without PTX),
checked exhaustively on the CPU: every E2M1 code in either nibble of a byte, times every finite
E4M3 block scale.

The decode moves a code's bits into an FP16 bit pattern (the value e2m1 * 2**-14) and multiplies
it in FP16 by the block scale times 2**7; the GEMM steps then take FP16 operands whatever the
model's dtype, and the epilogue takes the 2**-7 back. That gives the same bits as the BF16 PTX
decode only if every such product is exact in FP16, and so is every quantized activation
(e2m1 * block scale): this module asserts both for all 16 * 254 pairs, with the ranges the
kernel's comments give.
"""

from __future__ import annotations

import sys

import pytest
from support import REPO

pytest.importorskip("torch", reason="the decode's arithmetic runs in torch (pip install torch)")
import torch

sys.path.insert(0, str(REPO / "tests" / "gpu"))
import nvfp4_reference as nvfp4

CODES = torch.arange(16, dtype=torch.uint8)


def e2m1_values() -> torch.Tensor:
    """The 16 codes' values in float64 (the reference's decode; sign in bit 3)."""
    return nvfp4.e2m1_decode(CODES).to(torch.float64)


def finite_scales() -> torch.Tensor:
    """Every E4M3 byte but the two NaNs (0x7F, 0xFF), in float64."""
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
    return scales[~scales.isnan()]


def patterns(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high nibbles' FP16 bit patterns, as the portable decode builds them."""
    p = packed.to(torch.int32)
    lo = ((p << 9) & 0x0E00) | ((p << 12) & 0x8000)
    hi = ((p << 5) & 0x0E00) | ((p << 8) & 0x8000)
    return lo.to(torch.int16).view(torch.float16), hi.to(torch.int16).view(torch.float16)


def test_patterns_are_the_codes_times_two_to_the_minus_14() -> None:
    lo, _ = patterns(CODES)
    _, hi = patterns(CODES << 4)
    expected = e2m1_values() * 2.0**-14
    assert torch.equal(lo.to(torch.float64), expected)
    assert torch.equal(hi.to(torch.float64), expected)


def test_every_weight_is_exact_in_fp16() -> None:
    scales = finite_scales()
    assert scales.numel() == 254
    scale16 = (scales * 128.0).to(torch.float16)
    # The block scale times 2**7 is exact in FP16: at most 448 * 2**7 = 57344, at least 2**-2
    # for the smallest nonzero scale (2**-9).
    assert torch.equal(scale16.to(torch.float64), scales * 128.0)
    nonzero = scale16[scale16 != 0].to(torch.float64).abs()
    assert (nonzero.min().item(), nonzero.max().item()) == (2.0**-2, 57344.0)

    # Both nibbles give the same patterns (the test above): the low nibble's stand for both.
    pattern, _ = patterns(CODES)
    weights = pattern[:, None] * scale16[None, :]  # FP16 multiply, as in the kernel
    exact = e2m1_values()[:, None] * scales[None, :] * 2.0**-7
    assert torch.equal(weights.to(torch.float64), exact)
    magnitudes = exact.abs()
    # The range the kernel's comment gives: [2**-17, 21], FP16 subnormals included.
    assert magnitudes[magnitudes > 0].min().item() == 2.0**-17
    assert magnitudes.max().item() == 21.0


def test_every_quantized_activation_is_exact_in_fp16_and_bf16() -> None:
    values = e2m1_values()[:, None] * finite_scales()[None, :]
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(values.to(dtype).to(torch.float64), values)
    magnitudes = values.abs()
    assert (magnitudes[magnitudes > 0].min().item(), magnitudes.max().item()) == (2.0**-10, 2688.0)
