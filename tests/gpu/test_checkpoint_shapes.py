"""Every released checkpoint's MoE layer and shard (tests/gpu/moe_setup.SHAPES: each checkpoint
whole, at every TP degree that divides its intermediate size into a multiple of 16, and the EP8
ranks) through the NVFP4 emulation experts at 1, 32 and 512 tokens, eagerly, against the
pure-torch reference (tests/gpu/nvfp4_reference.py, exact W4A4) under
test_fused_nvfp4_emulation.py's tolerance.

A generator over what users run, not a list of tuned shapes: a checkpoint added to
moe_setup.CHECKPOINTS is tested here with every shard it has. Each layer takes the tiles its GPU
gives it (a shipped table of its shape, the GPU's table or the generic one), at a token count in
the decode, the small-batch and the large-batch buckets.

The vLLM under test must have patch 0002's fused kernel; elsewhere (the pristine pin) the module
is skipped: 0.24.0's unfused path is not what it tests, and on DeepSeek-R1's whole layer (256
experts, H 7168, I 2048) it dies with an illegal memory access that ends the process's CUDA
context.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import moe_setup
from nvfp4_reference import nvfp4_moe_reference
from test_fused_nvfp4_emulation import HAS_FUSED, assert_agree  # one tolerance for every path

if not HAS_FUSED:
    pytest.skip(
        "the vLLM under test has no fused NVFP4 emulation (patch 0002)", allow_module_level=True
    )

pytestmark = pytest.mark.gpu

TOKENS = (1, 32, 512)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("name", [s.name for s in moe_setup.SHAPES])
def test_checkpoint_layer_matches_reference(name: str, tokens: int) -> None:
    shape = moe_setup.shape_named(name)
    moe = moe_setup.held_moe(shape)
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    layer = moe_setup.MoeLayer(moe, shape, tokens, experts)
    weights, ids = moe_setup.local_routing(shape, layer.topk_weights, layer.topk_ids)
    want = nvfp4_moe_reference(moe, layer.hidden, weights, ids, exact=True)
    got = layer.apply()
    if not want.any():
        # An expert-parallel rank that holds none of the tokens' experts (at 1 token, DeepSeek's
        # EP8 rank holds 32 of 256: a third of the routings): zeros, exactly.
        assert torch.equal(got, torch.zeros_like(got))
        return
    assert_agree(got, want)
