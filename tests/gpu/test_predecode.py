"""Patch 0002's predecode (a table entry's ``predecode``): each GEMM's weights decoded once per
call by a kernel of their own into a buffer that the GEMM then reads, instead of being decoded in
every token block's program. For many tokens an expert (prefill) that work is repeated once per
block of tokens; decoded once, the GEMM's programs only load.

The bits must not change, or a token's output would depend on the batch it came in (batch
invariance) and on whether its bucket predecodes. So, on the shapes below (whole and ragged depths,
Qwen3-30B-A3B and DeepSeek-R1 at TP8), each tile set of TILES runs with and without predecode and
gives the bits of the layer with its own table, bitwise, eagerly and replayed from a CUDA graph,
and with the portable decode (what ROCm runs, FP16 operands) too. The tile sets include the wide
ones (blocks of 64 and 128 tokens, four and eight warps) that only a predecoded GEMM makes worth
having.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import cuda_graphs
import moe_setup

kernels = pytest.importorskip(
    "vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_kernels",
    reason="the vLLM under test has no kernel module of patch 0002",
)
if not hasattr(kernels, "invoke_nvfp4_decode"):
    pytest.skip("the vLLM under test has no predecode", allow_module_level=True)

pytestmark = pytest.mark.gpu

SHAPES = {
    s.name: s
    for s in (
        moe_setup.shape_named("qwen3-30b-a3b"),
        moe_setup.MoeShape("e128-h2048-i192", 128, 2048, 192, 8),
        moe_setup.MoeShape("e128-h2704-i192", 128, 2704, 192, 8),
        moe_setup.shape_named("deepseek-r1-tp8"),
    )
}
TOKENS = (1, 33, 600, 2048)
# (block_m, w13 tile, w2 tile): tile = (block_n, block_k, num_warps, num_stages).
TILES = {
    "bm32-2w": (32, (64, 128, 2, 3), (128, 128, 2, 3)),
    "bm64-4w": (64, (128, 128, 4, 3), (128, 128, 4, 3)),
    "bm128-4w": (128, (64, 128, 4, 4), (64, 128, 4, 4)),
    "bm128-8w": (128, (128, 128, 8, 3), (128, 128, 8, 3)),
}


def layer(name: str, tokens: int) -> moe_setup.MoeLayer:
    shape = SHAPES[name]
    moe = moe_setup.held_moe(shape)
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    return moe_setup.MoeLayer(moe, shape, tokens, experts)


def retiled(moe_layer: moe_setup.MoeLayer, tiles: str, predecode: bool) -> None:
    """Every token count of the layer on one tile set, with or without predecode."""
    block_m, w13, w2 = TILES[tiles]
    config = kernels.MoeConfig(
        False, block_m, False, kernels.GemmConfig(*w13), kernels.GemmConfig(*w2), predecode
    )
    moe_layer.experts.experts.configs = {1 << 62: config}


def same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert not want.isnan().any()
    differ = int((got != want).sum())
    assert differ == 0, f"{what}: {differ} of {got.numel()} elements differ"


@pytest.mark.parametrize("predecode", [False, True])
@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("shape", SHAPES)
def test_tiles_and_predecode_same_bits(
    shape: str, tokens: int, tiles: str, predecode: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)
    moe_layer = layer(shape, tokens)
    want = moe_layer.apply().clone()
    retiled(moe_layer, tiles, predecode)
    same_bits(moe_layer.apply(), want, f"{tiles}, predecode={predecode}")


@pytest.mark.parametrize("tiles", ["bm32-2w", "bm128-8w"])
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "e128-h2704-i192"])
def test_predecode_cuda_graph_same_bits(shape: str, tiles: str) -> None:
    moe_layer = layer(shape, 600)
    want = moe_layer.apply().clone()
    retiled(moe_layer, tiles, True)
    graph, output = cuda_graphs.capture(moe_layer.apply)
    moe_layer.refill(seed=1)  # the inputs of `want` again, after the capture's run
    graph.replay()
    torch.cuda.synchronize()
    same_bits(output, want, f"{tiles}, predecode, CUDA graph replay")


@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "e128-h2704-i192"])
def test_predecode_portable_same_bits(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The portable decode (FP16 decoded weights, ROCm's) predecoded gives the default bits."""
    monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)
    want = layer(shape, 600).apply().clone()
    monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")
    moe_layer = layer(shape, 600)
    assert not moe_layer.experts.experts.ptx_decode
    retiled(moe_layer, "bm64-4w", True)
    same_bits(moe_layer.apply(), want, "portable decode, predecode")
