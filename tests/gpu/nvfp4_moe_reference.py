"""NVFP4 MoE layers for the GPU tests and the benchmark, and a pure-torch reference.

Layout as vLLM 0.24.0's NVFP4 emulation takes it (oracle/nvfp4.py, EMULATION):
w13 [E, 2I, H // 2] and w2 [E, H, I // 2] uint8, two E2M1 values a byte along K (even k
in the low nibble); block scales [E, N, K // 16] FP8-E4M3, not swizzled; per-expert FP32
global scales; activation global scales as the oracle leaves them (large: 448 * 6 / amax).

The reference follows the unfused emulation step by step, with its roundings to the
activation dtype, but in plain torch: dequantize (FP32, then the dtype), NVFP4
quantize-dequantize of the input, w13, silu_and_mul, quantize-dequantize, w2 times the
router weight, sum over the top-k.
"""

from __future__ import annotations

import dataclasses

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BLOCK = 16
DEVICE = "cuda"  # the CPU, for a check of this module itself


@dataclasses.dataclass(frozen=True)
class MoeShape:
    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int


SHAPES = (
    MoeShape("qwen3-30b-a3b", 128, 2048, 768, 8),
    MoeShape("e128-h4096-i1536", 128, 4096, 1536, 8),
)
TOKENS = (1, 8, 32, 128, 512)


@dataclasses.dataclass(frozen=True)
class Nvfp4Moe:
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_gscale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_gscale: torch.Tensor
    a13_gscale: torch.Tensor
    a2_gscale: torch.Tensor


def _random_nvfp4(experts: int, rows: int, k: int, generator: torch.Generator):
    packed = torch.randint(
        0, 256, (experts, rows, k // 2), dtype=torch.uint8, generator=generator, device=DEVICE
    )
    # Block scales spread over two binades of E4M3, as real checkpoints' are.
    scale = torch.empty(experts, rows, k // BLOCK, device=DEVICE)
    scale.uniform_(64.0, 256.0, generator=generator)
    # Global scale so that a dequantized row has about unit norm (weights ~ 1/sqrt(k)).
    gscale = torch.empty(experts, device=DEVICE).uniform_(0.5, 1.5, generator=generator)
    gscale = gscale / (160.0 * 2.8 * k**0.5)
    return packed, scale.to(torch.float8_e4m3fn), gscale


def make_moe(shape: MoeShape, seed: int = 0) -> Nvfp4Moe:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    w13, w13_scale, w13_gscale = _random_nvfp4(
        shape.experts, 2 * shape.intermediate, shape.hidden, gen
    )
    w2, w2_scale, w2_gscale = _random_nvfp4(shape.experts, shape.hidden, shape.intermediate, gen)
    # oracle/nvfp4.py sets a13_scale = 1 / max(input_scale), input_scale = amax / (448 * 6):
    # amax 6 for randn hidden states, 8 for silu(gate) * up of unit-norm rows.
    fp8_x_fp4 = 448.0 * 6.0
    return Nvfp4Moe(
        w13,
        w13_scale,
        w13_gscale,
        w2,
        w2_scale,
        w2_gscale,
        a13_gscale=torch.tensor(fp8_x_fp4 / 6.0, device=DEVICE),
        a2_gscale=torch.tensor(fp8_x_fp4 / 8.0, device=DEVICE),
    )


def make_routing(tokens: int, shape: MoeShape, seed: int, dtype: torch.dtype = torch.bfloat16):
    """Hidden states, top-k weights (softmax) and distinct top-k expert ids per token."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    hidden = torch.randn(tokens, shape.hidden, generator=gen, device=DEVICE).to(dtype)
    logits = torch.randn(tokens, shape.experts, generator=gen, device=DEVICE)
    topk_logits, topk_ids = logits.topk(shape.top_k, dim=-1)
    return hidden, topk_logits.softmax(dim=-1), topk_ids.to(torch.int32)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, gscale: torch.Tensor) -> torch.Tensor:
    """[..., N, K // 2] uint8 -> [..., N, K] FP32; gscale broadcasts over [..., N, K // 16]."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    table = torch.tensor(E2M1_VALUES, device=packed.device)
    values = table[codes & 7] * (1.0 - 2.0 * (codes >> 3))
    block_scale = scale.float() * gscale
    return values * block_scale.repeat_interleave(BLOCK, dim=-1)


def quant_dequant(x: torch.Tensor, gscale: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantize-dequantize along the last dim, FP32 out (ref_nvfp4_quant's math)."""
    g = x.float().unflatten(-1, (-1, BLOCK))
    scale = gscale * (g.abs().amax(dim=-1, keepdim=True) / 6.0)
    scale = scale.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    inv = torch.where(scale == 0, torch.zeros_like(scale), gscale / scale)
    q = (g * inv).clamp(-6.0, 6.0)
    # Nearest E2M1 value, ties to even (cast_to_fp4's thresholds).
    m = q.abs()
    r = torch.full_like(m, 6.0)
    for bound, value, inclusive in (
        (5.0, 4.0, True),
        (3.5, 3.0, False),
        (2.5, 2.0, True),
        (1.75, 1.5, False),
        (1.25, 1.0, True),
        (0.75, 0.5, False),
        (0.25, 0.0, True),
    ):
        below = m <= bound if inclusive else m < bound
        r = torch.where(below, value, r)
    return (torch.copysign(r, q) * (scale / gscale)).flatten(-2)


def reference_moe(
    moe: Nvfp4Moe,
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    dtype = hidden.dtype
    tokens, top_k = topk_ids.shape
    x = quant_dequant(hidden, moe.a13_gscale).to(dtype).float()
    out = torch.zeros(tokens, top_k, hidden.size(1), device=hidden.device)
    for e in topk_ids.unique().tolist():
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        w13 = dequantize(moe.w13[e], moe.w13_scale[e], moe.w13_gscale[e]).to(dtype).float()
        w2 = dequantize(moe.w2[e], moe.w2_scale[e], moe.w2_gscale[e]).to(dtype).float()
        h = (x[tok] @ w13.T).to(dtype).float()
        gate, up = h.chunk(2, dim=-1)
        act = (torch.nn.functional.silu(gate).to(dtype).float() * up).to(dtype)
        act = quant_dequant(act, moe.a2_gscale).to(dtype).float()
        y = (act @ w2.T) * topk_weights[tok, slot, None].float()
        out[tok, slot] = y.to(dtype).float()
    return out.sum(dim=1).to(dtype)
