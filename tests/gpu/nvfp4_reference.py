"""The one pure-torch NVFP4 reference: the format, its quantizers, and the MoE that vLLM's
TritonExperts and NVFP4 emulation compute.

NVFP4: E2M1 elements (two a byte along K, even k in the low nibble, sign in bit 3), one
FP8-E4M3 scale per block of 16 elements, one FP32 global scale per tensor (per expert).
Nothing here imports vLLM or needs a GPU: the CPU tests check it (tests/test_nvfp4_reference.py),
and the GPU tests, the benchmarks and the engine check's checkpoint writer use it.

Two producers of NVFP4 data, two conventions for the global scale, each reproduced to the bit:
- weights as ModelOpt writes them (``quantize_weights``): the global scale is the
  dequantization factor, ``weight_scale_2 = amax / (6 * 448)``, and a block's scale is
  ``amax_block / 6 / weight_scale_2``;
- activations as vLLM's emulation fake-quantizes them (``quant_dequant``, vLLM 0.24.0's
  ``_nvfp4_quant_dequant_kernel``): the global scale is the quantization factor,
  ``448 * 6 / amax``, and a block's scale is ``global_scale * (amax_block * (1 / 6))``.
Each function reproduces the arithmetic of what it stands for step by step, in the same
dtypes, so that the tests can say which differences remain (summation order only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounding thresholds between neighbouring E2M1 magnitudes; a tie goes to the even code
# (vLLM's _round_to_fp4 and cast_to_fp4 use the same thresholds).
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
SIGN_BIT = 8
# The bound a MoE layer's output meets against this reference in the layer's own arithmetic
# (exact=True for patch 0002's kernel), relative Frobenius: the GPU tests', the interpreter's and
# the tuner's check of its picks (tests/gpu/test_fused_nvfp4_emulation.py's docstring says why).
REL_FROBENIUS = 1e-2


# -- E2M1 elements ------------------------------------------------------------------------------
def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes (sign in bit 3) of the nearest E2M1 value, ties to the even code;
    magnitudes over 6 saturate to 6."""
    magnitude = x.abs().clamp(max=E2M1_MAX)
    midpoints = torch.tensor(E2M1_MIDPOINTS, device=x.device, dtype=magnitude.dtype)
    code = torch.bucketize(magnitude, midpoints)  # a tie lands on the lower code
    tie = magnitude == midpoints[code.clamp(max=len(E2M1_MIDPOINTS) - 1)]
    code = code + (tie & (code % 2 == 1)).long()
    return (code | torch.where(x < 0, SIGN_BIT, 0)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E2M1 codes (code 8, negative zero, decodes to -0.0)."""
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    codes = codes.long()
    return table[codes & 7] * (1.0 - 2.0 * (codes >> 3))


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest E2M1 value (ties to the even code), FP32."""
    return e2m1_decode(e2m1_codes(x))


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K / 2] bytes, element 2i in the low nibble of byte i."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack``: [..., K / 2] bytes -> [..., K] codes."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


# -- whole tensors ------------------------------------------------------------------------------
def dequantize(
    packed: torch.Tensor,
    block_scales: torch.Tensor,
    global_scale: torch.Tensor | float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Packed NVFP4 [..., N, K / 2] -> [..., N, K] in ``dtype``: e2m1 * (block_scale *
    global_scale), the product in ``dtype`` (FP32: rounded where the FP32 global scale's 24
    bits and the E4M3 scale's 4 need more than 24; FLOAT64: exact).

    ``global_scale`` is the dequantization factor and broadcasts over the block scales
    [..., N, K / 16] (per expert of [E, N, K / 16]: pass it as [E, 1, 1])."""
    if isinstance(global_scale, torch.Tensor):
        global_scale = global_scale.to(dtype)
    step = block_scales.to(dtype) * global_scale
    return e2m1_decode(unpack(packed)).to(dtype) * step.repeat_interleave(BLOCK, dim=-1)


def weight_global_scale(*weights: torch.Tensor) -> torch.Tensor:
    """ModelOpt's weight_scale_2 per expert, amax / (6 * 448), over every weight given (gate
    and up share one). Weights are [E, N, K]; the result is [E, 1, 1]."""
    amax = torch.stack([w.abs().amax(dim=(-2, -1)) for w in weights]).amax(dim=0)
    return (amax / (E2M1_MAX * E4M3_MAX)).reshape(-1, 1, 1)


def quantize_weights(
    w: torch.Tensor, weight_scale_2: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] -> packed codes uint8 [..., N, K / 2] and E4M3 block scales [..., N, K / 16],
    as ModelOpt quantizes weights for the dequantization factor ``weight_scale_2`` (broadcast
    over [..., N, K / 16])."""
    blocks = w.float().unflatten(-1, (-1, BLOCK))
    amax = blocks.abs().amax(dim=-1)
    scale = (amax / E2M1_MAX / weight_scale_2).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    step = (scale.float() * weight_scale_2).unsqueeze(-1)
    scaled = torch.where(step == 0, torch.zeros_like(blocks), blocks / step)
    return pack(e2m1_codes(scaled).flatten(-2)), scale


def activation_global_scale(
    amax: torch.Tensor | float, device: torch.device | str | None = None
) -> torch.Tensor:
    """The quantization factor vLLM's emulation uses for activations of this amax: 448 * 6 /
    amax (the oracle's 1 / input_scale, input_scale = amax / (448 * 6)). FP32, on amax's
    device (a tensor) or ``device``."""
    return torch.as_tensor(E4M3_MAX * E2M1_MAX / amax, dtype=torch.float32, device=device)


def oracle_global_scale(input_scale: torch.Tensor | float) -> torch.Tensor:
    """The activations' quantization factor vLLM's oracle takes from a checkpoint's static
    input scales (oracle/nvfp4.py, EMULATION): the FP32 reciprocal of the largest. A round
    amax (input_scale = amax / (448 * 6)) gives a global scale just off a short binary
    fraction (amax 6: 447.99997), which puts activations on E2M1 near-ties."""
    return 1.0 / torch.as_tensor(input_scale, dtype=torch.float32).max()


def _scaled_blocks(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x in blocks of 16, each scaled by global_scale / its E4M3 scale, and the scales: vLLM's
    kernel up to its division (torch's is exact; see move_off_e2m1_ties). Always in FP32, as
    vLLM defines the quantization (its reference and its kernel take ``x.to(float32)``): a
    FLOAT64 x is rounded to FP32 first. The scaled elements land on the E2M1 thresholds
    often (the scales are short binary fractions), and there FLOAT64 arithmetic would round
    a few percent of the elements to the other E2M1 neighbour, a whole FP4 step each."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    gs = global_scale.float().reshape(())
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = (gs * (amax * (1.0 / E2M1_MAX))).clamp(-E4M3_MAX, E4M3_MAX)
    scale = scale.to(torch.float8_e4m3fn).float()
    to_e2m1 = torch.where(scale == 0, torch.zeros_like(scale), gs / scale)
    return blocks * to_e2m1, scale, gs


def quant_dequant(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Fake NVFP4 quantization along the last dim, as vLLM's emulation does it to activations;
    FP32 out (cast it to x's dtype as the kernel stores it). FLOAT64 in: the same codes and
    scales (decided in FP32, as vLLM does), their value e2m1 * scale / global_scale in
    FLOAT64, for an exact model (the engine check's float64 reference).

    Per block of 16: scale = E4M3(global_scale * amax / 6); elements are scaled by
    global_scale / scale, clamped to +-6 and rounded to E2M1; the result is
    e2m1 * scale / global_scale."""
    scaled, scale, gs = _scaled_blocks(x, global_scale)
    codes = e2m1_round(scaled.clamp(-E2M1_MAX, E2M1_MAX))
    if x.dtype == torch.float64:
        codes, scale, gs = codes.double(), scale.double(), gs.double()
    return (codes * (scale / gs)).flatten(-2)


def quant_dequant_reciprocal(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """quant_dequant as vLLM 0.24.0's torch reference (ref_nvfp4_quant) spells it: the
    elements scaled by 1 / (scale * (1 / global_scale)), FP32 (its Triton kernel, and
    quant_dequant, by global_scale / scale). The two agree except near E2M1 ties."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    gs = global_scale.float().reshape(())
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = (gs * (amax * (1.0 / E2M1_MAX))).clamp(-E4M3_MAX, E4M3_MAX)
    scale = scale.to(torch.float8_e4m3fn).float()
    inverse = torch.where(scale == 0, torch.zeros_like(scale), 1.0 / (scale * (1.0 / gs)))
    codes = e2m1_round((blocks * inverse).clamp(-E2M1_MAX, E2M1_MAX))
    return (codes * (scale / gs)).flatten(-2)


def activations_on_ties(global_scale: torch.Tensor) -> int:
    """How many of 2**17 BF16 activations (unit RMS, and 2x and 0.5x that) the two FP32
    spellings of vLLM's quantization round apart with ``global_scale``: elements whose
    rounding the last bit of the arithmetic decides, a whole FP4 step each. A round amax
    (6, 8: global scales 448 and 336, or the oracle's 447.99997) puts hundreds there; a
    calibrated one none."""
    x = torch.randn(64, 2048, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for spread in (1.0, 2.0, 0.5):  # hidden states, and intermediates of other sizes
        x = torch.cat((x, (x[:64].float() * spread).to(torch.bfloat16)))
    return int((quant_dequant(x, global_scale) != quant_dequant_reciprocal(x, global_scale)).sum())


def move_off_e2m1_ties(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """x (bf16/fp16), with each element that NVFP4 quantization would scale to within 8 ulp of
    an E2M1 rounding threshold moved one step of x's dtype away from zero.

    vLLM's Triton quantize-dequantize divides with Triton's default fp32 ``/``, PTX
    ``div.full.f32`` (up to 2 ulp off), where torch divides exactly: an element that lands on
    or next to a threshold (ties are frequent, the scales being short binary fractions) may
    round the other way. Away from the thresholds both round alike, bit for bit.
    """
    thresholds = torch.tensor(E2M1_MIDPOINTS, device=x.device)
    for _ in range(8):
        scaled = _scaled_blocks(x, global_scale)[0].abs()
        gap = (scaled.unsqueeze(-1) - thresholds).abs().amin(dim=-1)
        near = (gap <= scaled * 2**-20).flatten(-2)
        if not near.any():
            return x
        step_up = (x.view(torch.int16) + 1).view(x.dtype)  # next magnitude of x's dtype
        x = torch.where(near, step_up, x)
    raise AssertionError("could not move x off the E2M1 rounding thresholds")


# -- FP8 ----------------------------------------------------------------------------------------
def fp8_max(dtype: torch.dtype) -> float:
    # vLLM clamps to 224, not torch's 240, for the fnuz type on ROCm (quant_utils.get_fp8_min_max).
    return 224.0 if dtype == torch.float8_e4m3fnuz else float(torch.finfo(dtype).max)


def fp8_quant_dequant(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Static per-tensor FP8: what a GEMM sees after quantizing x with ``scale`` (FP32 out)."""
    limit = fp8_max(dtype)
    q = (x.float() * (1.0 / scale.float())).clamp(-limit, limit).to(dtype)
    return q.float() * scale.float()


def quantize_fp8_per_expert(
    w: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 of each expert of [E, N, K]: (FP8 weights, FP32 scales [E])."""
    scale = w.abs().amax(dim=(-2, -1)) / fp8_max(dtype)
    return (w / scale[:, None, None]).to(dtype), scale


# -- the MoE ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Nvfp4Moe:
    """One MoE layer's NVFP4 experts as vLLM 0.24.0's emulation takes them (oracle/nvfp4.py,
    EMULATION): w13 [E, 2I, H / 2] and w2 [E, H, I / 2] packed, block scales [E, N, K / 16]
    (not swizzled), per-expert FP32 global dequantization factors [E], and the activations'
    global quantization factors (0-dim)."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_gscale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_gscale: torch.Tensor
    a13_gscale: torch.Tensor
    a2_gscale: torch.Tensor

    def dequantized(
        self, expert: int, dtype: torch.dtype | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``expert``'s (w13, w2) in FP32: as vLLM 0.24.0's emulation dequantizes them
        (``dequantize_to_dtype``: rounded to ``dtype``), or with ``dtype=None`` exact (NVFP4's
        own values, e2m1 * block scale * global scale, as Blackwell's GEMM uses them)."""
        e = expert
        w13 = dequantize(self.w13[e], self.w13_scale[e], self.w13_gscale[e])
        w2 = dequantize(self.w2[e], self.w2_scale[e], self.w2_gscale[e])
        if dtype is None:
            return w13, w2
        return w13.to(dtype).float(), w2.to(dtype).float()


def tail_first(depth: int, step: int = 128) -> list[tuple[int, int, int]]:
    """Where a depth's columns go in the zero-padded layer that sums as the fused kernel does:
    (source, destination, count) for its last ``depth % step`` columns, first (then zeros to
    ``step``), and the whole steps before them, after. The kernel's masked step over the tail
    runs before its whole steps."""
    full = depth - depth % step
    if full == depth:
        return [(0, 0, depth)]
    return [(full, 0, depth - full), (0, step, full)]


def in_order(depth: int, step: int = 128) -> list[tuple[int, int, int]]:
    """``tail_first``'s other order: every column where it is, the zeros after (the tail
    last)."""
    return [(0, 0, depth)]


Placement = Callable[[int], list[tuple[int, int, int]]]


def zero_padded(moe: Nvfp4Moe, hidden: int, inter: int, place: Placement = tail_first) -> Nvfp4Moe:
    """``moe`` with both depths zero-padded to ``hidden`` and ``inter`` (zero E2M1 codes, zero
    block scales: they add exactly zero), each depth's columns placed by ``place``: w13's
    gate and up halves each to ``inter`` rows (the intermediate's order) of ``hidden``
    weights; w2 to ``hidden`` rows of ``inter`` weights. Its input: ``padded_columns``."""
    e, two_i, _ = moe.w13.shape
    i, h = two_i // 2, moe.w2.size(1)

    def pad(
        t: torch.Tensor,
        rows: list[tuple[int, int, int]],
        cols: list[tuple[int, int, int]],
        n: int,
        width: int,
        per: int,
    ) -> torch.Tensor:
        """t's rows and columns (``per`` values a byte column) placed as ``rows`` and
        ``cols`` say, in zeros [E, n, width]."""
        raw = t.view(torch.uint8)
        out = torch.zeros(e, n, width, dtype=torch.uint8, device=t.device)
        for src, dst, count in rows:
            for c_src, c_dst, c_count in cols:
                out[:, dst : dst + count, c_dst // per : (c_dst + c_count) // per] = raw[
                    :, src : src + count, c_src // per : (c_src + c_count) // per
                ]
        return out.view(t.dtype)

    inner = place(i)
    halves = [(src, dst, n) for src, dst, n in inner]
    halves += [(i + src, inter + dst, n) for src, dst, n in inner]
    return dataclasses.replace(
        moe,
        w13=pad(moe.w13, halves, place(h), 2 * inter, hidden // 2, 2),
        w13_scale=pad(moe.w13_scale, halves, place(h), 2 * inter, hidden // 16, 16),
        w2=pad(moe.w2, [(0, 0, h)], inner, hidden, inter // 2, 2),
        w2_scale=pad(moe.w2_scale, [(0, 0, h)], inner, hidden, inter // 16, 16),
    )


def padded_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """The hidden states ``x`` [tokens, H] as ``zero_padded``'s layer takes them: its columns
    placed by ``tail_first``, in zeros [tokens, width]."""
    out = torch.zeros(x.size(0), width, dtype=x.dtype, device=x.device)
    for src, dst, count in tail_first(x.size(1)):
        out[:, dst : dst + count] = x[:, src : src + count]
    return out


# order_moe: a layer whose FP32 sums give other bits in another K order. Hidden size 128, w2's
# depth ORDER_DEPTH = 368 = 2 * 128 + 112. w13 is all 1.0 (block scale 1) and every global scale
# 1, so hidden states of ORDER_HIDDEN in every element (6 at block scale 1/16) give every
# intermediate column SiLU(48) * 48 = 2304 (6 at block scale 384): exact in NVFP4. Each row of
# w2 holds +6 at block scale 448 in its 112 tail columns, -6 at 448 in step 0's first 112, and
# 0.5 at 2**-6 in step 1's first column: w2's steps sum +B (the tail), -B (step 0) and
# ORDER_OUT = 2**-7 * 2304 = 18 (step 1), B = 112 * 2688 * 2304, each sum exact in FP32. The
# tail first gives 18 (times the top-k weight); the tail last loses the 18 under half an FP32
# ulp of B (32): 0 where the sum rounds to nearest.
ORDER_DEPTH = 368
ORDER_HIDDEN = 0.375
ORDER_OUT = 18.0
E2M1_ONE, E2M1_HALF, E2M1_SIX = 0x2, 0x1, 0x7  # codes; SIGN_BIT makes them negative
E4M3_ONE, E4M3_448, E4M3_2M6 = 0x38, 0x7E, 0x08  # block scales 1, 448 and 2**-6


def order_moe(experts: int, device: torch.device | str = "cpu") -> Nvfp4Moe:
    """``experts`` experts of the order layer above, each alike."""
    h, i, e = 128, ORDER_DEPTH, experts

    def filled(rows: int, cols: int, byte: int) -> torch.Tensor:
        return torch.full((e, rows, cols), byte, dtype=torch.uint8, device=device)

    minus_six = E2M1_SIX | SIGN_BIT
    w2 = filled(h, i // 2, 0)
    w2[:, :, :56] = minus_six | (minus_six << 4)  # step 0's columns 0-111
    w2[:, :, 64] = E2M1_HALF  # step 1's column 128
    w2[:, :, 128:] = E2M1_SIX | (E2M1_SIX << 4)  # the tail, columns 256-367
    w2_scale = filled(h, i // 16, E4M3_ONE)
    w2_scale[:, :, :7] = E4M3_448
    w2_scale[:, :, 8] = E4M3_2M6
    w2_scale[:, :, 16:] = E4M3_448
    ones = torch.ones(e, dtype=torch.float32, device=device)
    one = torch.tensor(1.0, dtype=torch.float32, device=device)
    return Nvfp4Moe(
        w13=filled(2 * i, h // 2, E2M1_ONE | (E2M1_ONE << 4)),
        w13_scale=filled(2 * i, h // 16, E4M3_ONE).view(torch.float8_e4m3fn),
        w13_gscale=ones,
        w2=w2,
        w2_scale=w2_scale.view(torch.float8_e4m3fn),
        w2_gscale=ones.clone(),
        a13_gscale=one,
        a2_gscale=one.clone(),
    )


def order_output(topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The order layer's output with the tail first, per token [tokens, 128]: each pair's
    ORDER_OUT times its weight rounded to ``dtype``, summed in FP32, rounded once."""
    pairs = (ORDER_OUT * topk_weights.float()).to(dtype).float()
    return pairs.sum(dim=-1, keepdim=True).to(dtype).expand(-1, 128)


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    """SwiGLU in h's dtype: silu(gate) rounded to that dtype, times up (vLLM's op)."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate.float()).to(h.dtype) * up


def moe_reference(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    quantize_input: Callable[[torch.Tensor], torch.Tensor],
    quantize_intermediate: Callable[[torch.Tensor], torch.Tensor],
    rounded: bool = True,
) -> torch.Tensor:
    """The fused MoE of vLLM's TritonExperts, one expert at a time.

    ``expert_weights(e)`` gives expert e's (w13 [2I, H], w2 [H, I]) in FP32, as the kernel's
    GEMMs read them. ``quantize_*`` return FP32 values equal to what the GEMMs read of their
    input. GEMMs accumulate in FP32; the w13 output is rounded to x's dtype and so is silu
    (silu_and_mul), as the Triton kernel stores its tiles (``rounded=False``: both stay FP32,
    up to the intermediate's quantization); the routing weight is applied in FP32 before the
    w2 output's rounding; the top-k partial outputs are summed and rounded once.
    """
    dtype = x.dtype
    xq = quantize_input(x)
    partial = torch.zeros(*topk_ids.shape, x.shape[-1], dtype=dtype, device=x.device)
    for expert in torch.unique(topk_ids).tolist():
        token, slot = torch.nonzero(topk_ids == expert, as_tuple=True)
        w13, w2 = expert_weights(expert)
        h = xq[token].float() @ w13.T
        if rounded:
            a = quantize_intermediate(silu_and_mul(h.to(dtype)))
        else:
            gate, up = h.chunk(2, dim=-1)
            a = quantize_intermediate(F.silu(gate) * up)
        o = (a.float() @ w2.T) * topk_weights[token, slot, None].float()
        partial[token, slot] = o.to(dtype)
    return partial.float().sum(dim=1).to(dtype)


def nvfp4_moe_reference(
    moe: Nvfp4Moe,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    exact: bool = False,
) -> torch.Tensor:
    """vLLM 0.24.0's unfused NVFP4 emulation in plain torch: weights dequantized (FP32, then
    x's dtype), NVFP4 quantize-dequantize of the input and of silu_and_mul's output, each
    rounded to x's dtype, then ``moe_reference``'s GEMMs.

    ``exact``: exact W4A4, the arithmetic of a Blackwell NVFP4 GEMM, which patch 0002's fused
    kernel computes: the weights and the quantized activations unrounded (e2m1 * block scale
    * global scale in FP32), the GEMMs' outputs and SiLU-and-mul in FP32 up to the
    intermediate's quantization; only each expert's output (times the routing weight) is
    rounded to x's dtype, and the top-k sum once."""
    dtype = x.dtype

    def quantizer(gscale: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        if exact:
            return lambda t: quant_dequant(t.float(), gscale)
        return lambda t: quant_dequant(t, gscale).to(dtype).float()

    return moe_reference(
        x,
        topk_weights,
        topk_ids,
        lambda e: moe.dequantized(e, None if exact else dtype),
        quantizer(moe.a13_gscale),
        quantizer(moe.a2_gscale),
        rounded=not exact,
    )


def rms(t: torch.Tensor) -> float:
    return t.float().pow(2).mean().sqrt().item()
