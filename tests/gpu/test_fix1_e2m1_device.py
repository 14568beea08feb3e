"""Fix 1 (vLLM PR #41630, bug from #40033): the NVFP4 EMULATION backend moves its E2M1 table
to the device ahead of CUDA graph capture, and must read that device from ``w13``: FusedMoE
has no ``weight`` attribute. Red on the nightly-like base (AttributeError), green with the fix.
"""

from __future__ import annotations

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
    random_nvfp4_weights,
    route,
)
from nvfp4_reference import E2M1_MAX, E4M3_MAX
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import (
    NvFp4MoeBackend,
    backend_to_kernel_cls,
    convert_to_nvfp4_moe_kernel_format,
    make_nvfp4_moe_quant_config,
)
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
    kE2M1ToFloat_handle,
)

pytestmark = pytest.mark.gpu

EXPERTS, HIDDEN, INTERMEDIATE, TOPK, TOKENS = 8, 256, 128, 2, 32


class ExpertsWithoutWeight(torch.nn.Module):
    """What the oracle sees of a FusedMoE layer: expert parameters and, like FusedMoE,
    no ``weight`` attribute (the attribute PR #40033 read)."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(w13, requires_grad=False)
        self.w2_weight = torch.nn.Parameter(w2, requires_grad=False)


def test_emulation_convert_without_weight_attr_then_graph_capture(
    capture_graph, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = torch.bfloat16
    w13, w13_sf, w13_gs = random_nvfp4_weights(EXPERTS, 2 * INTERMEDIATE, HIDDEN, 0.05)
    w2, w2_sf, w2_gs = random_nvfp4_weights(EXPERTS, HIDDEN, INTERMEDIATE, 0.05)
    layer = ExpertsWithoutWeight(w13, w2)
    assert not hasattr(layer, "weight")
    # The table as vLLM creates it at import: on the CPU (an earlier test may have moved it).
    monkeypatch.setattr(kE2M1ToFloat_handle, "val", kE2M1ToFloat_handle.val.cpu())

    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=dtype)
    topk_weights, topk_ids = route(TOKENS, EXPERTS, TOPK)
    # Checkpoint activation scales, one per expert: amax / (E4M3_MAX * E2M1_MAX).
    a13_in = (
        x.abs().amax().float()
        / (E4M3_MAX * E2M1_MAX)
        * torch.linspace(1, 1.2, EXPERTS, device="cuda")
    )
    a2_in = torch.full((EXPERTS,), 4.0 / (E4M3_MAX * E2M1_MAX), device="cuda")

    converted = convert_to_nvfp4_moe_kernel_format(
        nvfp4_backend=NvFp4MoeBackend.EMULATION,
        layer=layer,
        w13=w13,
        w13_scale=w13_sf,
        w13_scale_2=w13_gs,
        a13_scale=a13_in,
        w2=w2,
        w2_scale=w2_sf,
        w2_scale_2=w2_gs,
        a2_scale=a2_in,
        is_act_and_mul=True,
    )

    assert kE2M1ToFloat_handle.val.device == w13.device
    w13_c, w13_sf_c, w13_gs_c, a13, w2_c, w2_sf_c, w2_gs_c, a2 = converted
    assert w13_c is w13 and w2_c is w2 and w13_sf_c is w13_sf and w2_sf_c is w2_sf
    # EMULATION keeps one global activation scale per GEMM: the inverse of the largest.
    assert torch.equal(a13, 1.0 / a13_in.max().to(torch.float32))
    assert torch.equal(a2, 1.0 / a2_in.max().to(torch.float32))

    quant_config = make_nvfp4_moe_quant_config(
        backend=NvFp4MoeBackend.EMULATION,
        w13_scale=w13_sf_c,
        w2_scale=w2_sf_c,
        w13_scale_2=w13_gs_c,
        w2_scale_2=w2_gs_c,
        a13_scale=a13,
        a2_scale=a2,
    )
    (experts_cls,) = backend_to_kernel_cls(NvFp4MoeBackend.EMULATION)
    config = moe_config(EXPERTS, TOPK, HIDDEN, INTERMEDIATE, dtype)
    kernel = modular_kernel(experts_cls(config, quant_config))

    def forward() -> torch.Tensor:
        return kernel_forward(kernel, x, w13, w2, topk_weights, topk_ids)

    graph, graph_out = capture_graph(forward)
    fresh = torch.randn_like(x)
    x.copy_(fresh)
    expected = forward().clone()
    graph.replay()
    torch.cuda.synchronize()

    assert expected.abs().max() > 0
    # The graph replays the same kernels on the same inputs: bit for bit the eager result.
    torch.testing.assert_close(graph_out, expected, atol=0, rtol=0)
