"""OCP MX (MXFP4 weights and activations) emulation under CUDA/HIP graph capture.

vLLM 0.24.0's OCP_MXQuantizationEmulationTritonExperts dequantizes the weights and
fake-quantizes the activations through amd-quark's kernels, so this runs where amd-quark is
installed (vLLM's ROCm images) and skips elsewhere.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")
pytest.importorskip("quark", reason="vLLM's OCP MX emulation needs amd-quark (not installed)")

from moe_setup import kernel_forward, modular_kernel, moe_config, route
from nvfp4_reference import e2m1_decode, moe_reference, rms, unpack
from vllm.model_executor.layers.fused_moe.config import ocp_mx_moe_quant_config

experts_module = pytest.importorskip(
    "vllm.model_executor.layers.fused_moe.experts.ocp_mx_emulation_moe",
    reason="this vLLM has no OCP MX emulation experts",
)

pytestmark = pytest.mark.gpu

EXPERTS, HIDDEN, INTERMEDIATE, TOPK, TOKENS = 8, 256, 128, 2, 32
MX_BLOCK = 32


def random_mxfp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed MXFP4 [E, rows, cols/2], E8M0 scales [E, rows, cols/32], and the float32
    weights they encode (element 2i in the low nibble; value = e2m1 * 2**(scale - 127))."""
    packed = torch.randint(0, 256, (EXPERTS, rows, cols // 2), dtype=torch.uint8, device="cuda")
    exponent = torch.randint(120, 124, (EXPERTS, rows, cols // MX_BLOCK), device="cuda")
    elements = e2m1_decode(unpack(packed))  # MXFP4 elements are E2M1, packed as NVFP4's
    scales = torch.exp2(exponent.float() - 127).repeat_interleave(MX_BLOCK, dim=-1)
    return packed, exponent.to(torch.uint8), elements * scales


def test_ocp_mxfp4_emulation_graph_capture(capture_graph) -> None:
    dtype = torch.bfloat16
    w13, w13_scale, w13_ref = random_mxfp4(2 * INTERMEDIATE, HIDDEN)
    w2, w2_scale, w2_ref = random_mxfp4(HIDDEN, INTERMEDIATE)
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=dtype)
    topk_weights, topk_ids = route(TOKENS, EXPERTS, TOPK)

    quant_config = ocp_mx_moe_quant_config(
        quant_dtype="mxfp4", w1_scale=w13_scale, w2_scale=w2_scale
    )
    experts_cls = experts_module.OCP_MXQuantizationEmulationTritonExperts
    kernel = modular_kernel(
        experts_cls(moe_config(EXPERTS, TOPK, HIDDEN, INTERMEDIATE, dtype), quant_config)
    )

    def forward() -> torch.Tensor:
        return kernel_forward(kernel, x, w13, w2, topk_weights, topk_ids)

    eager = forward()
    unquantized = moe_reference(
        x,
        topk_weights,
        topk_ids,
        lambda e: (w13_ref[e], w2_ref[e]),
        lambda t: t.float(),
        lambda t: t.float(),
    )
    # Against a reference without activation quantization: MXFP4 fake quantization of both
    # GEMM inputs (2 mantissa bits, power-of-two block scales) leaves a relative RMS error of
    # about 0.1 to 0.2; 0.35 separates that from garbage (wrong expert, scale or layout: ~1.4).
    relative_error = torch.tensor(rms(eager.float() - unquantized.float()) / rms(unquantized))
    torch.testing.assert_close(relative_error, torch.tensor(0.0), atol=0.35, rtol=0)

    graph, graph_out = capture_graph(forward)
    x.copy_(torch.randn_like(x))
    expected = forward().clone()
    graph.replay()
    torch.cuda.synchronize()
    # Same kernels, same inputs: the replay is bit for bit the eager result.
    torch.testing.assert_close(graph_out, expected, atol=0, rtol=0)
