"""Patch 0002's route program on the GPU: where a layer has at most ROUTE_MAX_PAIRS routed pairs
(and at most ROUTE_MAX_GROUPS groups), one more program of the QDQ pass sorts the pairs into blocks
of one expert instead of vLLM's alignment kernels.

- The blocks against vLLM's own compiled ``moe_align_block_size`` on the same routing, for
  checkpoint shapes and shards of every kind the route takes (top-8 over 128, 256 and 384
  experts, top-6, top-1 over 16 experts, an EP8 rank with its expert map) at 5 and 32 tokens
  and the most whose pairs the route takes (ROUTE_MAX_PAIRS // top-k), every token block: each expert's pairs, the blocks' experts and the padded total
  (vLLM's kernel orders an expert's pairs by atomics, so within an expert as sets); with an
  expert map, each of the rank's experts' pairs and the pairs of the other ranks' experts
  (vLLM pads each of those experts apart, the route puts them in one group: both expert -1).
- The layer with the route against the same layer with vLLM's alignment (ROUTE_MAX_PAIRS 0):
  the same bits, eagerly and from CUDA graphs replayed on fresh tokens and routing.
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

pytestmark = [pytest.mark.gpu, needs_fused]

SHAPES = (
    "qwen3-30b-a3b-tp8",
    "nemotron-3-nano-30b-a3b-tp4",
    "deepseek-r1-tp8",
    "kimi-k2-tp8",
    "llama-4-scout-tp8",
    "qwen3.5-397b-a17b-ep8",
)
TOKENS = ("5", "32", "most")  # most: ROUTE_MAX_PAIRS // top-k
BLOCKS = (8, 16, 32, 64)
LAYER_TOKENS = (5, 32)
REPLAYS = 3


def kernels_module():
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_kernels as K

    return K


def by_expert(
    sorted_ids: torch.Tensor, expert_ids: torch.Tensor, total: int, block_m: int, numel: int
) -> dict[int, list[int]]:
    """Each block's expert -> the pairs of its blocks (padding left out), in order."""
    out: dict[int, list[int]] = {}
    ids = sorted_ids[:total].view(-1, block_m).tolist()
    for expert, block in zip(expert_ids[: total // block_m].tolist(), ids, strict=True):
        out.setdefault(expert, []).extend(p for p in block if p < numel)
    return {e: sorted(p) for e, p in out.items()}


@pytest.mark.parametrize("block_m", BLOCKS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("name", SHAPES)
def test_route_blocks_are_vllms_alignment(name: str, tokens: str, block_m: int) -> None:
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    K = kernels_module()
    shape = moe_setup.shape_named(name)
    count = K.ROUTE_MAX_PAIRS // shape.top_k if tokens == "most" else int(tokens)
    _, _, ids = moe_setup.random_inputs(count, shape, seed=count)
    emap = moe_setup.expert_map(shape)
    local = shape.held_experts
    assert K.routes(ids.numel(), local), "a shape the route does not take"
    route = K.routing(ids, block_m, local, emap)
    K.invoke_nvfp4_qdq(None, torch.ones(1, device="cuda"), route=route)
    s, e, n = moe_align_block_size(ids, block_m, shape.experts, emap)
    torch.cuda.synchronize()
    numel = ids.numel()
    got_total, want_total = int(route.num_post_pad), int(n)
    got = by_expert(route.sorted_ids, route.expert_ids, got_total, block_m, numel)
    want = by_expert(s, e, want_total, block_m, numel)
    assert got == want
    if emap is None:
        assert got_total == want_total
        blocks = got_total // block_m
        assert torch.equal(route.expert_ids[:blocks], e[:blocks])


@pytest.mark.parametrize("tokens", LAYER_TOKENS)
@pytest.mark.parametrize("name", SHAPES)
def test_route_gives_the_bits_of_vllms_alignment(
    name: str, tokens: int, monkeypatch: pytest.MonkeyPatch, capture_graph
) -> None:
    K = kernels_module()
    shape = moe_setup.shape_named(name)
    moe = moe_setup.make_moe(shape)

    def layer() -> moe_setup.MoeLayer:
        experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
        return moe_setup.MoeLayer(moe, shape, tokens, experts)

    routed = layer()
    assert K.routes(routed.topk_ids.numel(), shape.held_experts)
    aligned = layer()
    want = routed.apply().clone()
    with monkeypatch.context() as m:
        m.setattr(K, "ROUTE_MAX_PAIRS", 0)
        assert torch.equal(aligned.apply(), want), "eager"
        graph_aligned = capture_graph(aligned.apply)
    graph_routed = capture_graph(routed.apply)
    for seed in range(2, 2 + REPLAYS):
        for lay, (graph, _) in ((routed, graph_routed), (aligned, graph_aligned)):
            lay.refill(seed)
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(graph_routed[1], graph_aligned[1]), f"replay on inputs of seed {seed}"
