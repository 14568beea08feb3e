"""Fix 2 (vLLM PR #46735, regression from #46254): TritonExperts.apply quantizes deferred
inputs with ``self.a1_scale or self.a1_gscale``; with a static activation scale that is
``bool(tensor)``, a device-to-host sync, which breaks CUDA/HIP graph capture
(cudaErrorStreamCaptureInvalidated). Red on pristine 0.24.0, green with the patch.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

from moe_setup import kernel_forward, modular_kernel, moe_config, route
from nvfp4_reference import (
    fp8_max,
    fp8_quant_dequant,
    moe_reference,
    quantize_fp8_per_expert,
    rms,
    silu_and_mul,
)
from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
from vllm.platforms import current_platform

pytestmark = pytest.mark.gpu

EXPERTS, HIDDEN, INTERMEDIATE, TOPK, TOKENS = 8, 256, 128, 2, 32


class DeferredQuantTritonExperts(TritonExperts):
    """TritonExperts as LoRA + DP/EP configures it: input quantization deferred to apply().

    In vLLM the switch is this property alone (true with a LoRA context on all2all kernels,
    i.e. several ranks); overriding it is the smallest honest way to reach the deferred
    path on one GPU without standing up LoRA and a DP/EP group.
    """

    @property
    def expects_unquantized_inputs(self) -> bool:
        return True


def fp8_weights(rows: int, cols: int, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert, per-tensor FP8 weights [E, rows, cols] and their float32 scales [E]."""
    w = torch.randn(EXPERTS, rows, cols, device="cuda") * cols**-0.5
    return quantize_fp8_per_expert(w, fp8)


def test_deferred_fp8_static_scale_graph_capture(capture_graph) -> None:
    dtype, fp8 = torch.bfloat16, current_platform.fp8_dtype()
    limit = fp8_max(fp8)
    w13, w13_scale = fp8_weights(2 * INTERMEDIATE, HIDDEN, fp8)
    w2, w2_scale = fp8_weights(HIDDEN, INTERMEDIATE, fp8)
    w13_ref = w13.float() * w13_scale[:, None, None]
    w2_ref = w2.float() * w2_scale[:, None, None]
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=dtype)
    topk_weights, topk_ids = route(TOKENS, EXPERTS, TOPK)

    # Static per-tensor activation scales, calibrated the way a checkpoint's are (amax / max).
    a1_scale = (x.abs().amax().float() / limit).reshape(1)
    x_ref = fp8_quant_dequant(x, a1_scale, fp8)
    mid = torch.stack([silu_and_mul((x_ref @ w13_ref[e].T).to(dtype)) for e in range(EXPERTS)])
    a2_scale = (mid.abs().amax().float() / limit).reshape(1)

    quant_config = fp8_w8a8_moe_quant_config(
        w1_scale=w13_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale
    )
    experts = DeferredQuantTritonExperts(
        moe_config(EXPERTS, TOPK, HIDDEN, INTERMEDIATE, dtype), quant_config
    )
    kernel = modular_kernel(experts)

    def forward() -> torch.Tensor:
        return kernel_forward(kernel, x, w13, w2, topk_weights, topk_ids)

    eager = forward()
    ref = moe_reference(
        x,
        topk_weights,
        topk_ids,
        lambda e: (w13_ref[e], w2_ref[e]),
        lambda t: fp8_quant_dequant(t, a1_scale, fp8),
        lambda t: fp8_quant_dequant(t, a2_scale, fp8),
    )
    # The reference repeats the kernel's roundings; what differs is the GEMMs' summation
    # order, which moves a few bf16 roundings of the intermediate by one ulp and then, rarely,
    # an FP8 rounding by one step (one element of 128): measured under 2% of the output RMS.
    # atol 0.15 * RMS leaves margin; a wrong scale or a missing quantization is off by far
    # more. rtol 2**-6 covers the final bf16 roundings (the top-k sum).
    torch.testing.assert_close(eager, ref, atol=0.15 * rms(ref), rtol=2**-6)

    graph, graph_out = capture_graph(forward)  # pristine 0.24.0 fails here
    x.copy_(torch.randn_like(x))
    expected = forward().clone()
    graph.replay()
    torch.cuda.synchronize()
    # Same kernels, same inputs: the replay is bit for bit the eager result.
    torch.testing.assert_close(graph_out, expected, atol=0, rtol=0)
