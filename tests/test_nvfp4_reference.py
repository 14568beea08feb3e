"""The GPU tests' pure-torch NVFP4 reference (tests/gpu/nvfp4_reference.py), on the CPU: exact
E2M1 values and codes, the packing and the block-scale layout, quantize -> dequantize round
trips, the activation quantize-dequantize against a plain loop written from vLLM 0.24.0's
kernel, and the MoE reference against a plain loop over tokens and experts."""

from __future__ import annotations

import sys

import pytest
from support import REPO

pytest.importorskip("torch", reason="the NVFP4 reference runs torch (pip install torch)")
import torch

sys.path.insert(0, str(REPO / "tests" / "gpu"))

import nvfp4_reference as nvfp4

F8 = torch.float8_e4m3fn

# (x, the E2M1 code it rounds to): every value, every tie (to the even code), saturation, signs.
E2M1_CASES = [
    (0.0, 0),
    (-0.0, 0),
    (0.25, 0),  # tie 0 | 0.5: even code 0
    (0.2500001, 1),
    (0.5, 1),
    (0.75, 2),  # tie 0.5 | 1: even code 2
    (1.0, 2),
    (1.25, 2),  # tie 1 | 1.5
    (1.5, 3),
    (1.75, 4),  # tie 1.5 | 2
    (2.0, 4),
    (2.5, 4),  # tie 2 | 3
    (3.0, 5),
    (3.5, 6),  # tie 3 | 4
    (4.0, 6),
    (5.0, 6),  # tie 4 | 6
    (5.0001, 7),
    (6.0, 7),
    (100.0, 7),  # saturates
    (-0.1, 8),  # negative zero
    (-0.5, 9),
    (-3.5, 14),
    (-6.0, 15),
]


@pytest.mark.parametrize(("x", "code"), E2M1_CASES)
def test_e2m1_code(x: float, code: int) -> None:
    assert nvfp4.e2m1_codes(torch.tensor([x])).tolist() == [code]


def test_e2m1_decode_every_code() -> None:
    values = nvfp4.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    assert values.dtype == torch.float32
    positive = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert values.tolist() == positive + [-v for v in positive]
    assert torch.signbit(values[8])  # code 8 is negative zero


def test_pack_even_element_in_the_low_nibble() -> None:
    codes = torch.tensor([[1, 2, 3, 4, 15, 0, 8, 7]], dtype=torch.uint8)
    packed = nvfp4.pack(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F, 0x78]]
    assert torch.equal(nvfp4.unpack(packed), codes)


def test_block_scale_layout() -> None:
    """One E4M3 scale per 16 consecutive elements of a row, in order: block j's scale is its
    amax / 6 (global factor 1)."""
    steps = torch.tensor([[1.0, 2.0, 0.5], [0.25, 4.0, 8.0]])  # [rows, blocks]
    row_codes = torch.tensor([7] + [1] * 15, dtype=torch.uint8)  # a 6 first: amax = 6 * step
    block = nvfp4.e2m1_decode(row_codes)
    w = (block * steps.unsqueeze(-1)).flatten(-2)  # [2, 48]
    packed, scales = nvfp4.quantize_weights(w, 1.0)
    assert (packed.shape, packed.dtype, scales.shape, scales.dtype) == (
        (2, 24), torch.uint8, (2, 3), F8,
    )  # fmt: skip
    assert torch.equal(scales.float(), steps)
    assert torch.equal(nvfp4.unpack(packed), row_codes.repeat(2, 3))
    assert torch.equal(nvfp4.dequantize(packed, scales, 1.0), w)


def test_round_trip_exact_for_representable_weights() -> None:
    """Weights that are E2M1 values times an E4M3 block scale times a per-expert global
    factor come back bit for bit, codes included."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 4, 64), dtype=torch.uint8, generator=gen)
    codes[codes == 8] = 0  # negative zero quantizes to (positive) zero
    codes[..., ::16] = 7  # each block's amax is 6 * its step: its scale is found exactly
    scales = torch.tensor([0.5, 1.0, 1.5, 2.0, 448.0, 0.0078125])[
        torch.randint(0, 6, (3, 4, 4), generator=gen)
    ].to(F8)
    gscale = torch.tensor([1.0, 2.0**-10, 2.0**-4]).reshape(3, 1, 1)
    w = nvfp4.dequantize(nvfp4.pack(codes), scales, gscale)
    packed, got_scales = nvfp4.quantize_weights(w, gscale)
    assert torch.equal(got_scales.float(), scales.float())
    assert torch.equal(nvfp4.unpack(packed), codes)
    assert torch.equal(nvfp4.dequantize(packed, got_scales, gscale), w)


def test_round_trip_error_bound_and_global_scale() -> None:
    """Random weights: ModelOpt's weight_scale_2 (amax / (6 * 448), gate and up together), and
    every element within one E2M1 step of its block (the widest gap, 4 to 6, is 2 steps; the
    nearest value is at most 1 away; an amax whose E4M3 scale rounded down clamps to 6 within
    0.4 steps)."""
    gen = torch.Generator().manual_seed(1)
    gate, up = (torch.randn(2, 8, 64, generator=gen) for _ in range(2))
    gscale = nvfp4.weight_global_scale(gate, up)
    amax = torch.maximum(gate.abs().amax(dim=(1, 2)), up.abs().amax(dim=(1, 2)))
    assert torch.equal(gscale, (amax / (6.0 * 448.0)).reshape(2, 1, 1))
    largest = torch.zeros(2)
    for w in (gate, up):
        packed, scales = nvfp4.quantize_weights(w, gscale)
        step = (scales.float() * gscale).repeat_interleave(16, dim=-1)
        error = nvfp4.dequantize(packed, scales, gscale) - w
        assert bool((error.abs() <= step).all())
        largest = torch.maximum(largest, scales.float().amax(dim=(1, 2)))
    assert largest.tolist() == [448.0, 448.0]  # each expert's amax block uses E4M3's range


def plain_quant_dequant(x: torch.Tensor, global_scale: float) -> torch.Tensor:
    """vLLM 0.24.0's _nvfp4_quant_dequant_kernel, one FP32 element at a time, its rounding
    written as the kernel's chain of thresholds (_round_to_fp4)."""
    gs = torch.tensor(global_scale, dtype=torch.float32)
    out = torch.empty(x.shape, dtype=torch.float32)
    for row in range(x.shape[0]):
        for start in range(0, x.shape[1], 16):
            block = x[row, start : start + 16].float()
            scale = gs * (block.abs().max() * torch.tensor(1 / 6, dtype=torch.float32))
            scale = scale.clamp(-448.0, 448.0).to(F8).float()
            inverse = torch.tensor(0.0) if scale == 0 else gs / scale
            for i, element in enumerate(block):
                q = (element * inverse).clamp(-6.0, 6.0)
                m = q.abs().item()
                value = (
                    6.0 if m > 5.0 else 4.0 if m >= 3.5 else 3.0 if m > 2.5 else
                    2.0 if m >= 1.75 else 1.5 if m > 1.25 else 1.0 if m >= 0.75 else
                    0.5 if m > 0.25 else 0.0
                )  # fmt: skip
                signed = torch.tensor(-value if q < 0 else value, dtype=torch.float32)
                out[row, start + i] = signed * (scale / gs)
    return out


@pytest.mark.parametrize("global_scale", [448.0, 2688.0 / 3.7, 1.0])
def test_quant_dequant_against_a_plain_loop(global_scale: float) -> None:
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 64, generator=gen) * 1.5).to(torch.bfloat16)
    x[0, :16] = 0.0  # an all-zero block: scale 0, zeros out
    x[1, 16:32] *= 1000.0  # a block whose scale saturates at 448
    gs = torch.tensor(global_scale)
    got = nvfp4.quant_dequant(x, gs)
    assert got.dtype == torch.float32
    assert torch.equal(got, plain_quant_dequant(x, global_scale))
    # Quantize-dequantize is idempotent: its output is on the grid already.
    assert torch.equal(nvfp4.quant_dequant(got, gs), got)


# The activations' global scale as vLLM's oracle takes it from a checkpoint: the FP32
# reciprocal of input_scale = amax / (448 * 6) (oracle/nvfp4.py), for the engine check's
# checkpoints' amax (6 and 8: 447.99997 and 336, the scaled elements then land just off the
# E2M1 thresholds for a few percent of BF16 inputs) and for calibrated-looking ones.
ORACLE_AMAX = (6.0, 8.0, 5.3125, 2.71, 13.0, 0.9)


@pytest.mark.parametrize("amax", ORACLE_AMAX)
def test_float64_quant_dequant_decides_as_fp32(amax: float) -> None:
    """The float64 model (the engine check's exact forward) quantizes to the same E2M1 codes
    and E4M3 scales as FP32, vLLM's definition (it quantizes x.to(float32)): only the value
    e2m1 * scale / global_scale is FLOAT64. Deciding in FLOAT64 instead moved 3% of the
    elements of unit-RMS BF16 inputs a whole E2M1 step at amax 6 (H200 engine check,
    2026-12-02: the emulations 7% from the float64 W4A4 layer on their own inputs)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 2048, generator=gen).to(torch.bfloat16)  # unit RMS, as after RMSNorm
    gs = nvfp4.oracle_global_scale(amax / (448.0 * 6.0))
    fp32 = nvfp4.quant_dequant(x, gs)
    f64 = nvfp4.quant_dequant(x.double(), gs.double())
    assert f64.dtype == torch.float64
    # The same codes and scales: the values agree to FP32's rounding of scale / gs (a flip
    # would be a whole E2M1 step, a quarter of the value or more).
    torch.testing.assert_close(f64, fp32.double(), rtol=2**-23, atol=0)


def test_oracle_global_scale() -> None:
    """The FP32 reciprocal of the largest input scale: amax 6's is just off 448."""
    assert nvfp4.oracle_global_scale(6.0 / 2688.0).item() == 447.9999694824219
    scales = torch.tensor([8.0 / 2688.0, 6.0 / 2688.0])
    assert nvfp4.oracle_global_scale(scales).item() == 336.0


def test_activation_global_scale() -> None:
    assert nvfp4.activation_global_scale(6.0).item() == 448.0
    assert nvfp4.activation_global_scale(torch.tensor(8.0)).item() == 336.0


def test_move_off_e2m1_ties() -> None:
    """Elements on a rounding threshold move one bf16 step away from zero; the others stay."""
    x = torch.tensor([[6.0, 0.25, 0.75, 1.0, 2.5, -3.5, 5.0, 0.3] + [0.5] * 8]).to(torch.bfloat16)
    moved = nvfp4.move_off_e2m1_ties(x, torch.tensor(448.0))
    step_up = (x.view(torch.int16) + 1).view(torch.bfloat16)
    on_threshold = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0] + [0] * 8], dtype=torch.bool)
    assert torch.equal(moved, torch.where(on_threshold, step_up, x))


def dyadic_moe(experts: int, hidden: int, intermediate: int) -> nvfp4.Nvfp4Moe:
    """NVFP4 experts whose dequantized weights have two significant bits (E2M1 values, block
    scales 1, global factors powers of two), so that every GEMM of the reference is exact in
    FP32 whatever its summation order."""
    gen = torch.Generator().manual_seed(3)

    def weights(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        codes = torch.randint(0, 16, (experts, rows, cols), dtype=torch.uint8, generator=gen)
        scales = torch.ones(experts, rows, cols // 16).to(F8)
        return nvfp4.pack(codes), scales, 2.0 ** -torch.arange(3.0, 3.0 + experts)

    return nvfp4.Nvfp4Moe(
        *weights(2 * intermediate, hidden),
        *weights(hidden, intermediate),
        a13_gscale=torch.tensor(1.0),
        a2_gscale=torch.tensor(4.0),
    )


def plain_moe(
    moe: nvfp4.Nvfp4Moe, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The MoE, one token and one routed expert at a time."""
    dtype, out = x.dtype, torch.empty_like(x)
    for token in range(x.shape[0]):
        xq = nvfp4.quant_dequant(x[token : token + 1], moe.a13_gscale).to(dtype).float()
        total = torch.zeros(x.shape[1])
        for slot in range(topk_ids.shape[1]):
            e = int(topk_ids[token, slot])
            w13 = nvfp4.dequantize(moe.w13[e], moe.w13_scale[e], moe.w13_gscale[e]).to(dtype)
            w2 = nvfp4.dequantize(moe.w2[e], moe.w2_scale[e], moe.w2_gscale[e]).to(dtype)
            h = (xq @ w13.float().T).to(dtype)
            gate, up = h.chunk(2, dim=-1)
            act = torch.nn.functional.silu(gate.float()).to(dtype) * up
            act = nvfp4.quant_dequant(act, moe.a2_gscale).to(dtype).float()
            y = (act @ w2.float().T) * topk_weights[token, slot].float()
            total += y[0].to(dtype).float()
        out[token] = total.to(dtype)
    return out


def test_moe_reference_against_a_plain_loop() -> None:
    experts, hidden, intermediate, tokens = 4, 32, 16, 6
    moe = dyadic_moe(experts, hidden, intermediate)
    gen = torch.Generator().manual_seed(4)
    # Inputs on the E2M1 grid with a 6 in each block: the input quantization keeps them exactly.
    codes = torch.randint(0, 16, (tokens, hidden), dtype=torch.uint8, generator=gen)
    codes[:, ::16] = 7
    x = nvfp4.e2m1_decode(codes).to(torch.bfloat16)
    topk_ids = torch.tensor([[0, 1], [1, 0], [2, 3], [3, 2], [0, 3], [1, 2]], dtype=torch.int32)
    topk_weights = torch.rand(tokens, 2, generator=gen)
    got = nvfp4.nvfp4_moe_reference(moe, x, topk_weights, topk_ids)
    assert (got.dtype, got.shape) == (torch.bfloat16, (tokens, hidden))
    assert got.abs().amax() > 0
    assert torch.equal(got, plain_moe(moe, x, topk_weights, topk_ids))


def test_moe_reference_routing() -> None:
    """An expert routed with weight 0 contributes nothing; a token's output is the weighted
    sum of its routed experts' outputs (one expert at a time)."""
    moe = dyadic_moe(4, 32, 16)
    x = nvfp4.e2m1_decode(torch.full((1, 32), 7, dtype=torch.uint8)).to(torch.bfloat16)
    both = nvfp4.nvfp4_moe_reference(
        moe, x, torch.tensor([[1.0, 0.0]]), torch.tensor([[2, 1]], dtype=torch.int32)
    )
    alone = nvfp4.nvfp4_moe_reference(
        moe, x, torch.tensor([[1.0]]), torch.tensor([[2]], dtype=torch.int32)
    )
    assert torch.equal(both, alone)


@pytest.mark.parametrize(
    ("dtype", "limit"), [(torch.float8_e4m3fn, 448.0), (torch.float8_e4m3fnuz, 224.0)]
)
def test_fp8(dtype: torch.dtype, limit: float) -> None:
    w = torch.tensor([[[1.0, -2.0], [0.5, 4.0]], [[-8.0, 2.0], [1.0, 1.0]]])
    q, scale = nvfp4.quantize_fp8_per_expert(w, dtype)
    assert q.dtype == dtype
    assert torch.equal(scale, torch.tensor([4.0, 8.0]) / limit)
    # Each expert's amax maps to the FP8 limit; these values land on the FP8 grid exactly.
    assert torch.equal(q.float(), w * torch.tensor([limit / 4.0, limit / 8.0])[:, None, None])
    x = torch.tensor([[3.0, -1000.0]])
    assert nvfp4.fp8_quant_dequant(x, torch.tensor(1.0), dtype).tolist() == [[3.0, -limit]]
