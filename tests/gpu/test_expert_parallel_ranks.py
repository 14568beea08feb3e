"""The NVFP4 emulation experts as one rank of expert parallelism, at the local-expert counts
that released checkpoints have under EP8 (DeepSeek-V3/R1: 32 of 256 experts, Kimi-K2: 48 of
384, Qwen3.5-397B-A17B: 64 of 512; every ``-ep8`` shape of ``moe_setup.SHAPES``).

Under expert parallelism a GPU holds only its rank's experts: vLLM loads those, runs the
experts' ``process_weights_after_loading`` on them (patch 0002 lays them out in tiles there)
and hands ``apply`` an expert map (global id -> local index, -1 for other ranks' experts).
A token routed to another rank's expert must contribute nothing here, and a token routed to
this rank's experts only must get exactly what the whole layer would give it from them.

Each case, eagerly and replayed from a CUDA graph (captured, then given new tokens and a new
routing): the output against the W4A4 reference of the rank's experts with the routing seen
through the map (``moe_setup.local_routing``), with the fused-kernel tests' tolerance (their
module docstring argues it); and, bitwise, one token's output alone against the same token at
a row of a batch (a rank sees any number of tokens from the all-to-all, so its tiles must not
depend on the count). On the pristine pin the unfused emulation runs and must pass as well:
these tests hold on both trees.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import moe_setup
from nvfp4_reference import Nvfp4Moe, nvfp4_moe_reference
from test_fused_nvfp4_emulation import HAS_FUSED, assert_agree

pytestmark = pytest.mark.gpu

EP_SHAPES = tuple(s.name for s in moe_setup.SHAPES if s.shard == "ep8")
TOKENS = (1, 8, 128, 512)
BATCH = 257  # past every token bucket's block boundary below 512
PROBE_ROW = 101


@pytest.fixture(scope="module", params=EP_SHAPES)
def rank(request: pytest.FixtureRequest) -> tuple[moe_setup.MoeShape, Nvfp4Moe]:
    shape = moe_setup.shape_named(request.param)
    return shape, moe_setup.make_moe(shape)  # the rank's experts only


def rank_layer(shape: moe_setup.MoeShape, moe: Nvfp4Moe, tokens: int) -> moe_setup.MoeLayer:
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)  # mapped by expert_map
    return moe_setup.MoeLayer(moe, shape, tokens, experts)


def assert_rank_agrees(got: torch.Tensor, want: torch.Tensor) -> None:
    """The fused-kernel tests' tolerance; where none of the tokens' experts is this rank's
    (one token routed to 8 of 256 experts misses a rank's 32 a third of the time), the
    reference is zero and the output must be exactly zero."""
    if not want.any():
        assert not got.isnan().any(), "output elements left unwritten (NaN)"
        assert not got.any(), "a token routed to other ranks' experts only got an output here"
        return
    assert_agree(got, want)


def rank_reference(layer: moe_setup.MoeLayer) -> torch.Tensor:
    weights, ids = moe_setup.local_routing(layer.shape, layer.topk_weights, layer.topk_ids)
    return nvfp4_moe_reference(layer.moe, layer.hidden, weights, ids, exact=HAS_FUSED)


def test_ep8_shapes_are_the_checkpoints() -> None:
    """The local-expert counts these tests run at (a new EP8 checkpoint row adds a case)."""
    counts = {name: moe_setup.shape_named(name).local_experts for name in EP_SHAPES}
    assert counts["deepseek-r1-ep8"] == 32
    assert counts["kimi-k2-ep8"] == 48


@pytest.mark.parametrize("tokens", TOKENS)
def test_rank_matches_reference_eager(rank, tokens: int) -> None:
    shape, moe = rank
    layer = rank_layer(shape, moe, tokens)
    assert_rank_agrees(layer.apply(), rank_reference(layer))


@pytest.mark.parametrize("tokens", TOKENS)
def test_rank_matches_reference_cuda_graph(rank, tokens: int, capture_graph) -> None:
    shape, moe = rank
    layer = rank_layer(shape, moe, tokens)
    graph, output = capture_graph(layer.apply)
    layer.refill(seed=2)  # new tokens and routing, same graph
    graph.replay()
    torch.cuda.synchronize()
    assert_rank_agrees(output, rank_reference(layer))


@pytest.mark.parametrize("tokens", (1, 2))
def test_every_rank_matches_reference_cuda_graph(rank, tokens: int, capture_graph) -> None:
    """Each of the N ranks on the same tokens (its own experts local: moe_setup.rank_routing),
    replayed from one graph: at one token rank 0 alone may route none of the token's experts,
    and the others route one, two or three of them, through the decode tiles."""
    shape, moe = rank
    layer = rank_layer(shape, moe, tokens)
    ids = layer.topk_ids.clone()
    graph, output = capture_graph(layer.apply)
    routed = []
    for r in range(moe_setup.ranks(shape)):
        layer.topk_ids.copy_(moe_setup.rank_routing(shape, ids, r))
        graph.replay()
        torch.cuda.synchronize()
        assert_rank_agrees(output, rank_reference(layer))
        routed.append(moe_setup.active_experts(shape, layer.topk_ids))
    assert sum(routed) == int(ids.unique().numel())  # every expert of the tokens, once


def test_rank_token_alone_equals_token_in_batch(rank, capture_graph) -> None:
    shape, moe = rank
    alone = rank_layer(shape, moe, 1)
    want = alone.apply()[0].clone()
    batch = rank_layer(shape, moe, BATCH)
    batch.hidden[PROBE_ROW].copy_(alone.hidden[0])
    batch.topk_weights[PROBE_ROW].copy_(alone.topk_weights[0])
    batch.topk_ids[PROBE_ROW].copy_(alone.topk_ids[0])
    eager = batch.apply()[PROBE_ROW].clone()
    assert torch.equal(eager, want), "a token's output changed with the batch (eager)"
    graph, output = capture_graph(batch.apply)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(output[PROBE_ROW], want), "a token's output changed with the batch (graph)"
