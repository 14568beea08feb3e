"""Patch 0002's predecoded GEMMs on the GPU: where the fused experts decode each GEMM's weights
once for the call (nvfp4_emulation_kernels.predecodes: many routed pairs per expert), every
output is the bits the fused kernel gives the same inputs (the same experts with predecode
turned off for the comparison), on released checkpoints' layers at the token counts where the
rule takes them: Qwen3-30B-A3B and Qwen3-235B-A22B whole at 8192 tokens, and one DeepSeek-R1
expert-parallel rank at 16384 (32 of 256 experts, an expert map with -1 entries: w2's zeros for
other ranks' pairs). Each in CUDA's configuration (the PTX decode, CUDA's tiles; on an H200
the predecode entry of the shape's table where it has one) and in ROCm's forced on this GPU
(the portable decode, ROCm's tile table, token block and predecoded tiles: what an AMD GPU
runs). Eager, the experts' own apply and the finalize's top-k sum
(tests/gpu/test_batch_invariance.py has a token alone against it in a batch of 8192, eager and
from CUDA graphs).

On the pristine pin there is no fused path (patch 0002's): skipped there (needs_fused).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import moe_setup
from test_fused_nvfp4_emulation import needs_fused
from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe

pytestmark = [pytest.mark.gpu, needs_fused]

CASES = [("qwen3-30b-a3b", 8192), ("qwen3-235b-a22b", 8192), ("deepseek-r1-ep8", 16384)]
NO_PREDECODE_ENV = "VLLM_PATCHSET_NVFP4_NO_PREDECODE"


def expected_predecode(name: str, platform: str) -> object:
    """The predecode the experts read at load: on an H200 in CUDA's configuration the shape's
    shipped table's entry where it has one (moe_setup.H200_PREDECODE), else the platform's
    generic one (ROCm's configuration forced here reads the rocm_generic tables: none ships)."""
    on_h200 = platform == "cuda" and torch.cuda.get_device_name() == "NVIDIA H200"
    if not on_h200 or name not in moe_setup.H200_PREDECODE:
        return nvfp4_emulation_moe.GENERIC_PREDECODE[platform]
    return moe_setup.h200_predecode(nvfp4_emulation_moe, name)


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
@pytest.mark.parametrize(("name", "tokens"), CASES)
def test_predecoded_gemms_give_the_fused_bits(
    name: str, tokens: int, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = moe_setup.shape_named(name)
    monkeypatch.delenv(NO_PREDECODE_ENV, raising=False)
    if platform == "rocm":
        monkeypatch.setenv(moe_setup.PLATFORM_ENV, "rocm")
        monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(moe_setup.PLATFORM_ENV, raising=False)
        monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)
    moe = moe_setup.make_moe(shape)
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    built = experts.experts
    assert (built.platform, built.ptx_decode) == (platform, platform == "cuda")
    assert built.predecode_config == expected_predecode(name, platform)
    sizes = (shape.experts, shape.held_experts, shape.hidden, shape.intermediate, 2)
    config = built.predecode_config
    assert nvfp4_emulation_moe.predecodes(tokens * shape.top_k, *sizes, config), "not predecoded"
    layer = moe_setup.MoeLayer(moe, shape, tokens, experts, seed=tokens)
    launched = []
    predecode = nvfp4_emulation_moe.predecode_nvfp4_weights

    def counted(*args, **kwargs):
        launched.append(1)
        return predecode(*args, **kwargs)

    monkeypatch.setattr(nvfp4_emulation_moe, "predecode_nvfp4_weights", counted)
    predecoded = layer.apply().clone()
    assert launched == [1, 1], "the predecoded path did not run"
    monkeypatch.setattr(built, "predecode", False)  # as NO_PREDECODE_ENV=1 sets it
    fused = layer.apply().clone()
    assert launched == [1, 1]
    assert not predecoded.isnan().any()
    differ = int((predecoded.view(torch.int16) != fused.view(torch.int16)).sum())
    assert differ == 0, f"{differ} of {fused.numel()} elements differ from the fused kernel's"
