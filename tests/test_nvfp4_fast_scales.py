"""Patch 0002's check of the block scales (``fast_nvfp4_scales``) and the experts' record of it,
on the CPU.

The PTX decode converts a block scale byte to BF16 scale * 2**63 with one integer operation,
(byte << 4) + (183 << 7), where every scale of a layer passes the check; otherwise with the
general FP8 conversion. The check must accept exactly the bytes for which that operation is
exact (a zero scale only over zero codes, which any factor leaves zero), else a layer would
decode wrong. The kernels themselves run on the GPU: tests/gpu/test_batch_invariance.py's
``test_block_scale_kinds_same_bits`` compares both conversions' bits there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the check runs on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="the overlaid module imports triton (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import moe_setup
import overlay_kernels as kernels
import standins
from vllm_install import Overlay, Pristine

# Two K steps of both GEMMs, 16-row tiles: the smallest layer that takes the tiled layout.
SHAPE = moe_setup.MoeShape("tiles", experts=2, hidden=256, intermediate=128, top_k=2)


@pytest.fixture(scope="module")
def fused(overlay: Overlay, full_pristine: Pristine) -> kernels.FusedModule:
    paths = (overlay.project.overlay_dir / "vllm", full_pristine.root / "vllm")
    return kernels.load_fused(*paths, standins.moe_align_block_size)


def one_operation(byte: int) -> float:
    """The PTX decode's fast conversion of a scale byte, as a number (scale * 2**63)."""
    bits = torch.tensor([byte * 16 + 0x5B80], dtype=torch.int16)
    return float(bits.view(torch.bfloat16).item())


def test_one_operation_is_exact_for_the_normals_only() -> None:
    """The bytes whose conversion is exact: 0x08-0x7E (the positive E4M3 normals), none else
    (subnormals, zero, negatives, NaN)."""
    exact = []
    for byte in range(256):
        value = float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        if one_operation(byte) == value * 2.0**63:
            exact.append(byte)
    assert exact == list(range(0x08, 0x7F))
    assert one_operation(0) == 2.0**56  # a zero scale gives 2**56: only zero codes take it


def blocks(scale_bytes: list[int], codes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert, one row, len(scale_bytes) blocks: w [1, 1, 8 * blocks] of the given bytes
    (each repeated over its block where one byte is given per block), scales [1, 1, blocks]."""
    per_block = (
        codes if len(codes) == 8 * len(scale_bytes) else [c for c in codes for _ in range(8)]
    )
    w = torch.tensor(per_block, dtype=torch.uint8).view(1, 1, -1)
    scale = torch.tensor(scale_bytes, dtype=torch.uint8).view(torch.float8_e4m3fn).view(1, 1, -1)
    return w, scale


@pytest.mark.parametrize(
    ("scale_bytes", "codes", "fast"),
    [
        ([0x08, 0x40, 0x7E], [0x77, 0x12, 0xFF], True),  # normals, any codes
        ([0x40, 0x07], [0x11, 0x11], False),  # a subnormal
        ([0x40, 0x7F], [0x11, 0x11], False),  # NaN
        ([0x40, 0xC0], [0x11, 0x11], False),  # negative
        ([0x40, 0x00], [0x11, 0x00], True),  # zero over +0 codes
        ([0x00, 0x40], [0x88, 0x11], True),  # zero over -0 codes (E2M1 code 8 is -0)
        ([0x40, 0x00], [0x11, 0x08], True),  # zero over +0 and -0
        ([0x40, 0x00], [0x11, 0x01], False),  # zero over a nonzero code (0.5)
        ([0x00, 0x40], [0x10, 0x00], False),  # zero over a nonzero high nibble
    ],
)
def test_check(
    fused: kernels.FusedModule, scale_bytes: list[int], codes: list[int], fast: bool
) -> None:
    w, scale = blocks(scale_bytes, codes)
    assert fused.module.fast_nvfp4_scales(w, scale) is fast


def test_check_reads_each_blocks_own_codes(fused: kernels.FusedModule) -> None:
    """A zero scale's block is its own 8 bytes of codes: nonzero codes in the block beside it
    (before and after) do not matter, one in it does."""
    codes = [0x11] * 8 + [0x00] * 8 + [0x11] * 8
    assert fused.module.fast_nvfp4_scales(*blocks([0x40, 0x00, 0x40], codes)) is True
    codes[8 + 7] = 0x20
    assert fused.module.fast_nvfp4_scales(*blocks([0x40, 0x00, 0x40], codes)) is False


def experts_over(fused: kernels.FusedModule, moe: Any) -> Any:
    """The fused experts with moe's scales in their quant config, before any loading."""
    config = kernels.quant_config(
        moe.w13_scale, moe.w2_scale, moe.w13_gscale, moe.w2_gscale, moe.a13_gscale, moe.a2_gscale
    )
    return fused.experts(None, config)


def experts_after_loading(fused: kernels.FusedModule, moe: Any) -> tuple[Any, Any, Any]:
    """The fused experts over copies of moe's weights and scales (the hook lays them out in
    place), after the hook: (experts, w13, w2 as apply takes them)."""
    moe = moe_setup.weight_copies(moe)
    experts = experts_over(fused, moe)
    w13, w2 = kernels.laid_out(experts, moe.w13, moe.w2)
    return experts, w13, w2


@pytest.mark.parametrize(("general", "fast"), [(False, True), (True, False)])
def test_hook_records_whether_the_scales_are_fast(
    fused: kernels.FusedModule, general: bool, fast: bool
) -> None:
    """The experts' process_weights_after_loading records the check's answer for both GEMMs'
    scales, and lays the weights out in tiles either way."""
    moe = moe_setup.with_block_scale_kinds(moe_setup.make_moe(SHAPE, device="cpu"), general)
    experts, w13, w2 = experts_after_loading(fused, moe)
    assert experts.fast_scales is fast
    assert experts.tiled_weights[0] is w13 and experts.tiled_weights[1] is w2


def test_hook_checks_both_gemms(fused: kernels.FusedModule) -> None:
    """One subnormal scale in w2 alone is enough for the general conversion."""
    moe = moe_setup.make_moe(SHAPE, device="cpu")
    experts, _, _ = experts_after_loading(fused, moe)
    assert experts.fast_scales is True
    moe.w2_scale.view(torch.uint8)[1, 5, 0] = 0x03
    experts, _, _ = experts_after_loading(fused, moe)
    assert experts.fast_scales is False


def test_untiled_weights_are_not_fast(fused: kernels.FusedModule) -> None:
    """Without the hook (weights in the checkpoint's rows) the record stays False: nothing
    checked the scales."""
    experts = experts_over(fused, moe_setup.make_moe(SHAPE, device="cpu"))
    assert (experts.fast_scales, experts.tiled_weights) == (False, None)
