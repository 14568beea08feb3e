"""NVFP4 emulation end to end through vLLM's modular kernel (no-DP/EP prepare/finalize +
Nvfp4QuantizationEmulationTritonExperts), eagerly and replayed from a CUDA/HIP graph, against
a pure-torch reference that dequantizes the weights and applies the same NVFP4 activation
quantize-dequantize. Must pass on pristine 0.24.0 and on the overlay alike.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

from moe_setup import (
    kernel_forward,
    modular_kernel,
    moe_config,
    nvfp4_quant_config,
    random_nvfp4_weights,
    route,
)
from nvfp4_reference import (
    Nvfp4Moe,
    activation_global_scale,
    move_off_e2m1_ties,
    nvfp4_moe_reference,
    quant_dequant,
    rms,
    silu_and_mul,
)
from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe
from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
    Nvfp4QuantizationEmulationTritonExperts,
)

pytestmark = pytest.mark.gpu

# (experts, hidden, intermediate, top-k)
SHAPES = [
    (8, 128, 64, 2),
    (32, 1024, 512, 4),
    (128, 2048, 768, 8),  # Qwen3-30B-A3B's MoE layer
]
TOKENS = [1, 7, 64, 512]


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize(("experts", "hidden", "intermediate", "topk"), SHAPES)
def test_nvfp4_emulation_eager_and_graph_replay(
    capture_graph, experts: int, hidden: int, intermediate: int, topk: int, tokens: int
) -> None:
    dtype = torch.bfloat16
    w13 = random_nvfp4_weights(experts, 2 * intermediate, hidden, hidden**-0.5)
    w2 = random_nvfp4_weights(experts, hidden, intermediate, intermediate**-0.5)
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    topk_weights, topk_ids = route(tokens, experts, topk)

    # Global activation scales calibrated as a checkpoint's are, E4M3_MAX * E2M1_MAX / amax,
    # with a 1% margin (which also keeps a2's scaled values off exact E2M1 ties).
    a1_gscale = activation_global_scale(x.abs().amax().float()).reshape(1)
    x = move_off_e2m1_ties(x, a1_gscale)  # so the input quantization is reproducible bit for bit
    moe = Nvfp4Moe(*w13, *w2, a13_gscale=a1_gscale, a2_gscale=a1_gscale)  # a2: set below
    x_ref = quant_dequant(x, a1_gscale).to(dtype).float()
    mid_amax = torch.stack(
        [
            silu_and_mul((x_ref @ moe.dequantized(e, dtype)[0].T).to(dtype)).abs().amax()
            for e in range(experts)
        ]
    ).amax()
    a2_gscale = activation_global_scale(1.01 * mid_amax.float()).reshape(1)
    moe = dataclasses.replace(moe, a2_gscale=a2_gscale)

    config = moe_config(experts, topk, hidden, intermediate, dtype)
    kernel = modular_kernel(
        Nvfp4QuantizationEmulationTritonExperts(config, nvfp4_quant_config(moe))
    )

    def forward() -> torch.Tensor:
        return kernel_forward(kernel, x, moe.w13, moe.w2, topk_weights, topk_ids)

    eager = forward()
    # vLLM 0.24.0's emulation dequantizes the weights to the activation dtype before its bf16
    # GEMMs; patch 0002's fused kernel, where it runs, keeps them exact (the global scale on
    # the FP32 accumulator): each is held to its own arithmetic.
    supports_fused = getattr(nvfp4_emulation_moe, "supports_fused_nvfp4_moe", None)
    fused = supports_fused is not None and supports_fused(hidden, intermediate)
    ref = nvfp4_moe_reference(moe, x, topk_weights, topk_ids, exact=fused)
    scale = rms(ref)
    # The reference repeats every rounding of the path (0.24.0's bf16 weights, activations and
    # GEMM outputs, or none: exact W4A4); the input's quantization is bit-exact (see
    # move_off_e2m1_ties). What differs is the GEMMs' summation order, which moves a bf16
    # rounding of the intermediate by one ulp in about one element of 1000, and Triton's
    # approximate division: either flips an E2M1 rounding of the intermediate now and then (one
    # step, rarely a block scale), which moves the whole output row of its token a little.
    # Simulated for these shapes: at most 6% of the output RMS on one element; seen on the
    # H200: a mean error of 0.9% RMS over the one row of a single token. So: atol 0.15 RMS per
    # element (a missing or wrong activation quantization is off by 90% or more somewhere),
    # rtol 2**-6 for the final bf16 roundings (the top-k sum), and a mean error under 3% RMS
    # (a missing activation quantization: 7%).
    torch.testing.assert_close(eager, ref, atol=0.15 * scale, rtol=2**-6)
    mean_error = (eager.float() - ref.float()).abs().mean()
    torch.testing.assert_close(mean_error, torch.zeros_like(mean_error), atol=0.03 * scale, rtol=0)

    graph, graph_out = capture_graph(forward)
    x.copy_(torch.randn_like(x))
    expected = forward().clone()
    graph.replay()
    torch.cuda.synchronize()
    # Same kernels, same inputs: the replay is bit for bit the eager result.
    torch.testing.assert_close(graph_out, expected, atol=0, rtol=0)
