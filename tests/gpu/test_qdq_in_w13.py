"""Patch 0002's QDQ of the hidden states inside the w13 GEMM (a tile table's ``fuse_a1_qdq``),
where blocks are (token, expert) pairs: the kernel quantizes the token's row alone (ONE_ROW)
instead of the whole block of token rows, whose other rows are masked.

No shipped table picks it (benchmarks/tune_nvfp4_moe.py may). Here each layer's own table, with
``fuse_a1_qdq`` set in every one-block-per-pair bucket, is given through
VLLM_PATCHSET_NVFP4_CONFIG_DIR; the layer must give the bits of the shipped table, whose QDQ
pass is a kernel of its own: on launch-bound checkpoint shapes (a TP8 shard at top-8, one at
top-10, one at top-1, an EP8 rank with its expert map) at 1, 2 and 4 tokens, eagerly and from a
CUDA graph replayed on fresh tokens and routing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import moe_setup
from nvfp4_reference import Nvfp4Moe
from test_fused_nvfp4_emulation import needs_fused

pytestmark = [pytest.mark.gpu, needs_fused]

SHAPES = ("qwen3-30b-a3b-tp8", "qwen3.5-397b-a17b-tp8", "llama-4-scout-tp8", "deepseek-r1-ep8")
TOKENS = (1, 2, 4)
REPLAYS = 5


@pytest.fixture(scope="module", params=SHAPES)
def weights(request: pytest.FixtureRequest) -> tuple[moe_setup.MoeShape, Nvfp4Moe]:
    shape = moe_setup.shape_named(request.param)
    return shape, moe_setup.make_moe(shape)


def layer(shape: moe_setup.MoeShape, moe: Nvfp4Moe, tokens: int) -> moe_setup.MoeLayer:
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    return moe_setup.MoeLayer(moe, shape, tokens, experts)


def write_qdq_in_w13_table(shipped: moe_setup.MoeLayer, folder: Path) -> Path:
    """The shipped layer's own table with the QDQ inside w13 in each one-block-per-pair
    bucket, under the name the kernel module looks for first (the layer's shape, this GPU)."""
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_kernels as K

    configs = shipped.experts.experts.configs
    assert configs is not None and any(c.naive for c in configs.values())
    table = {b: dataclasses.replace(c, fuse_a1_qdq=c.naive) for b, c in configs.items()}
    w13, w2 = shipped.experts.w1, shipped.experts.w2
    device = K.device_table_name(K.nvfp4_platform())
    name = K.table_file_names(w13.size(0), w2.size(1), w2.size(2) * 2, device)[0]
    (folder / name).write_text(K.table_json(table))
    return folder


@pytest.mark.parametrize("tokens", TOKENS)
def test_qdq_in_w13_gives_the_bits_of_the_qdq_pass(
    weights, tokens: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture_graph
) -> None:
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_kernels as K

    shape, moe = weights
    shipped = layer(shape, moe, tokens)
    want = shipped.apply().clone()
    monkeypatch.setenv(K.CONFIG_DIR_ENV, str(write_qdq_in_w13_table(shipped, tmp_path)))
    inside = layer(shape, moe, tokens)
    picked = K.get_nvfp4_moe_config(
        tokens, shape.top_k, shape.experts, inside.experts.experts.min_block_m,
        inside.experts.experts.configs,
    )  # fmt: skip
    assert picked.fuse_a1_qdq, "the table given did not reach the layer"
    assert torch.equal(inside.apply(), want), "eager"
    graphs = [capture_graph(lay.apply) for lay in (shipped, inside)]
    for seed in range(2, 2 + REPLAYS):
        for lay, (graph, _) in zip((shipped, inside), graphs, strict=True):
            lay.refill(seed)
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(graphs[1][1], graphs[0][1]), f"replay on inputs of seed {seed}"
