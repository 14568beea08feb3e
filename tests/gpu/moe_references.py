"""Pure-torch references for the MoE tests: NVFP4 and FP8 formats, routing, the expert MLP.

Nothing here imports vLLM. Each function reproduces the arithmetic of the kernel it stands
for, step by step and in the same dtypes, so that the tests can say which differences remain
(summation order only) and size their tolerances from that.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# NVFP4 (E2M1 elements, E4M3 scale per 16 elements, FP32 global scale).
NVFP4_BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value, ties to the even code (the kernels' thresholds)."""
    magnitude = x.abs().clamp(max=E2M1_MAX)
    midpoints = torch.tensor(_E2M1_MIDPOINTS, device=x.device, dtype=x.dtype)
    code = torch.bucketize(magnitude, midpoints)  # a tie lands on the lower code
    tie = magnitude == midpoints[code.clamp(max=len(_E2M1_MIDPOINTS) - 1)]
    code = code + (tie & (code % 2 == 1)).long()
    values = torch.tensor(E2M1_VALUES, device=x.device, dtype=x.dtype)
    return values[code] * torch.where(x < 0, -1.0, 1.0)


def nvfp4_quant_dequant(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Fake NVFP4 quantization of activations, as vLLM's emulation does it.

    Per block of 16: scale = E4M3(global_scale * amax / 6); elements are scaled by
    global_scale / scale, clamped to +-6 and rounded to E2M1; the result is
    e2m1 * scale / global_scale, returned in x's dtype.
    """
    rows, cols = x.shape
    blocks = x.float().reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    gs = global_scale.float().reshape(())
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = (gs * (amax * (1.0 / E2M1_MAX))).clamp(-E4M3_MAX, E4M3_MAX)
    scale = scale.to(torch.float8_e4m3fn).float()
    to_e2m1 = torch.where(scale == 0, torch.zeros_like(scale), gs / scale)
    codes = e2m1_round((blocks * to_e2m1).clamp(-E2M1_MAX, E2M1_MAX))
    return (codes * (scale / gs)).reshape(rows, cols).to(x.dtype)


def move_off_e2m1_ties(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """x (bf16/fp16), with each element that NVFP4 quantization would scale to within 8 ulp of
    an E2M1 rounding threshold moved one step of x's dtype away from zero.

    vLLM's Triton quantize-dequantize divides with Triton's default fp32 ``/``, PTX
    ``div.full.f32`` (up to 2 ulp off), where torch divides exactly: an element that lands on
    or next to a threshold (ties are frequent, the scales being short binary fractions) may
    round the other way. Away from the thresholds both round alike, bit for bit.
    """
    thresholds = torch.tensor(_E2M1_MIDPOINTS, device=x.device)
    for _ in range(8):
        rows, cols = x.shape
        blocks = x.float().reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
        gs = global_scale.float().reshape(())
        amax = blocks.abs().amax(dim=-1, keepdim=True)
        scale = (gs * (amax * (1.0 / E2M1_MAX))).clamp(-E4M3_MAX, E4M3_MAX)
        scale = scale.to(torch.float8_e4m3fn).float()
        scaled = (blocks * torch.where(scale == 0, torch.zeros_like(scale), gs / scale)).abs()
        gap = (scaled.unsqueeze(-1) - thresholds).abs().amin(dim=-1)
        near = (gap <= scaled * 2**-20).reshape(rows, cols)
        if not near.any():
            return x
        step_up = (x.view(torch.int16) + 1).view(x.dtype)  # next magnitude of x's dtype
        x = torch.where(near, step_up, x)
    raise AssertionError("could not move x off the E2M1 rounding thresholds")


def random_nvfp4_weights(
    experts: int, rows: int, cols: int, std: float, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random NVFP4 weights as a checkpoint holds them, dequantizing to roughly ``std``.

    Returns (packed uint8 [E, rows, cols/2], E4M3 block scales [E, rows, cols/16],
    FP32 global dequantization factor [E]). Element 2i is the low nibble of byte i.
    """
    packed = torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, device=device)
    block_scales = torch.empty(experts, rows, cols // NVFP4_BLOCK, device=device).uniform_(0.5, 2)
    # Random E2M1 codes have an RMS of about 3.2; the global factor brings that to ~std.
    global_scale = torch.full((experts,), std / 3.2, device=device)
    global_scale *= torch.empty(experts, device=device).uniform_(0.75, 1.25)
    return packed, block_scales.to(torch.float8_e4m3fn), global_scale


def dequantize_nvfp4(
    packed: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor
) -> torch.Tensor:
    """[E, rows, cols/2] packed NVFP4 -> float32 [E, rows, cols]."""
    values = torch.tensor(E2M1_VALUES, device=packed.device)
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).long()
    elements = values[nibbles & 0x7] * torch.where(nibbles >= 8, -1.0, 1.0)
    experts, rows, cols = elements.shape
    blocks = elements.reshape(experts, rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    scales = block_scales.float() * global_scale.float().reshape(experts, 1, 1)
    return (blocks * scales.unsqueeze(-1)).reshape(experts, rows, cols)


def fp8_quant_dequant(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Static per-tensor FP8: what a GEMM sees after quantizing x with ``scale`` (float32)."""
    limit = 224.0 if dtype == torch.float8_e4m3fnuz else torch.finfo(dtype).max
    q = (x.float() * (1.0 / scale.float())).clamp(-limit, limit).to(dtype)
    return q.float() * scale.float()


def route(
    tokens: int, experts: int, topk: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing with renormalized weights: (float32 weights, int32 ids)."""
    logits = torch.randn(tokens, experts, device=device)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), ids.to(torch.int32)


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    """SwiGLU in h's dtype: silu(gate) rounded to that dtype, times up (vLLM's op)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate.float()).to(h.dtype) * up


def moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    quantize_input: Callable[[torch.Tensor], torch.Tensor],
    quantize_intermediate: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The fused MoE of vLLM's TritonExperts, one expert at a time.

    w13 [E, 2I, H] and w2 [E, H, I] are float32 (dequantized). ``quantize_*`` return float32
    values equal to what the kernel's GEMMs read. GEMMs accumulate in float32 and round to
    x's dtype, as the Triton kernel stores its tiles; the routing weight is applied in float32
    before that rounding; the top-k partial outputs are summed and rounded once.
    """
    dtype = x.dtype
    xq = quantize_input(x)
    partial = torch.zeros(*topk_ids.shape, w2.shape[1], dtype=dtype, device=x.device)
    for expert in torch.unique(topk_ids).tolist():
        token, slot = torch.nonzero(topk_ids == expert, as_tuple=True)
        h = (xq[token].float() @ w13[expert].T).to(dtype)
        a = quantize_intermediate(silu_and_mul(h))
        o = (a.float() @ w2[expert].T) * topk_weights[token, slot, None].float()
        partial[token, slot] = o.to(dtype)
    return partial.float().sum(dim=1).to(dtype)


def rms(t: torch.Tensor) -> float:
    return t.float().pow(2).mean().sqrt().item()
