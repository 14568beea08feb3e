"""Patch 0002's fused NVFP4 MoE at GEMM depths that are not multiples of its K step (128): the
intermediate sizes of released checkpoints and their tensor-parallel shards (16, 48, 96, 192,
704, 1856) and a hidden size of 21 * 128 + 16, which the fused path takes since every depth that
is a multiple of the NVFP4 block (16) does (before: vLLM 0.24.0's unfused path, up to 36x
slower than Marlin).

- against the pure-torch reference (tests/gpu/nvfp4_reference.py, exact W4A4), eagerly and
  replayed from a CUDA graph, under test_fused_nvfp4_emulation.py's tolerance (its docstring);
- the same bits as the same layer with both depths zero-padded to multiples of 128 (zero E2M1
  codes, zero block scales, zero hidden columns), each depth's last K % 128 columns first
  (nvfp4_reference.tail_first): the masked K step, the kernel's first, sums exactly what a
  full step over those columns and zeros sums;
- the K order itself: on nvfp4_reference.order_moe's layer, whose FP32 sums give other bits in
  another order, the exact output the tail first gives, and the same bits as the zero-padded
  layer with the tail first, not as the one with the tail last;
- batch invariance, bitwise: a token alone and at a random row of batches of 2 to 600 tokens,
  through the experts' apply and FusedMoEKernel.apply, eager and replayed from CUDA graphs;
- the configuration ROCm runs (VLLM_PATCHSET_NVFP4_PLATFORM=rocm: ROCm's tile table and blocks
  of 16 tokens; with VLLM_PATCHSET_NVFP4_PORTABLE=1 the portable decode too) gives the same
  bits as the default one: tiles differ in their token and row extents, never in the K walk.

The vLLM under test must fuse such depths (patch 0002's supports_fused_nvfp4_moe): elsewhere
(the pristine pin) the module is skipped.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

pytest.importorskip("torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import cuda_graphs
import moe_setup
from nvfp4_reference import (
    ORDER_DEPTH,
    ORDER_HIDDEN,
    Nvfp4Moe,
    in_order,
    nvfp4_moe_reference,
    order_moe,
    order_output,
    padded_columns,
    tail_first,
    zero_padded,
)
from test_fused_nvfp4_emulation import assert_agree  # one tolerance for every path
from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe

supports = getattr(nvfp4_emulation_moe, "supports_fused_nvfp4_moe", None)
if supports is None or not supports(2048, 192):
    pytest.skip(
        "the vLLM under test does not fuse depths that are not multiples of 128",
        allow_module_level=True,
    )

pytestmark = pytest.mark.gpu

PLATFORM_ENV = getattr(nvfp4_emulation_moe, "PLATFORM_ENV", "VLLM_PATCHSET_NVFP4_PLATFORM")
# (name, E, hidden, intermediate, top-k): Qwen3-30B-A3B's hidden size with ragged
# intermediate sizes (192: its TP4 shard and Qwen3-235B-A22B's TP8; 704: Gemma-4-26B-A4B;
# 1856: Nemotron-3-Nano-30B-A3B), and a ragged hidden size.
SHAPES = {
    s[0]: moe_setup.MoeShape(*s)
    for s in (
        ("e128-h2048-i16", 128, 2048, 16, 8),
        ("e128-h2048-i48", 128, 2048, 48, 8),
        ("e128-h2048-i96", 128, 2048, 96, 8),
        ("e128-h2048-i192", 128, 2048, 192, 8),
        ("e128-h2816-i704", 128, 2816, 704, 8),
        ("e128-h2688-i1856", 128, 2688, 1856, 6),
        ("e128-h2704-i192", 128, 2704, 192, 8),
    )
}
TOKENS = (1, 32, 512)
CASES = [(shape, tokens) for shape in SHAPES for tokens in TOKENS]
INVARIANCE_SHAPES = ("e128-h2048-i192", "e128-h2704-i192", "e128-h2688-i1856")
BATCHES = (2, 3, 5, 9, 17, 33, 65, 129, 257, 600)
MODES = [("kernel", False), ("kernel", True), ("experts", False), ("experts", True)]
PROBE_SEED = 1_000_003


def up128(n: int) -> int:
    return -(-n // 128) * 128


def layer(name: str, tokens: int, moe: Nvfp4Moe | None = None) -> moe_setup.MoeLayer:
    shape = SHAPES[name]
    moe = moe or moe_setup.held_moe(shape)
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    return moe_setup.MoeLayer(moe, shape, tokens, experts)


def reference(moe_layer: moe_setup.MoeLayer) -> torch.Tensor:
    return nvfp4_moe_reference(
        moe_layer.moe,
        moe_layer.hidden,
        moe_layer.topk_weights,
        moe_layer.topk_ids,
        exact=True,
    )


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_ragged_matches_reference_eager(shape: str, tokens: int) -> None:
    moe_layer = layer(shape, tokens)
    assert_agree(moe_layer.apply(), reference(moe_layer))


@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_ragged_matches_reference_cuda_graph(shape: str, tokens: int, capture_graph) -> None:
    moe_layer = layer(shape, tokens)
    graph, output = capture_graph(moe_layer.apply)
    moe_layer.refill(seed=2)
    graph.replay()
    torch.cuda.synchronize()
    assert_agree(output, reference(moe_layer))


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize(("shape", "tokens"), CASES)
def test_ragged_same_bits_as_zero_padded(
    shape: str, tokens: int, portable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if portable:
        monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)
    s = SHAPES[shape]
    ragged = layer(shape, tokens)
    got = ragged.apply().clone()
    wide_shape = dataclasses.replace(s, hidden=up128(s.hidden), intermediate=up128(s.intermediate))
    wide_moe = zero_padded(
        moe_setup.held_moe(SHAPES[shape]), wide_shape.hidden, wide_shape.intermediate
    )
    experts = moe_setup.nvfp4_emulation_experts(wide_moe, wide_shape, tokens)
    wide = moe_setup.MoeLayer(wide_moe, wide_shape, tokens, experts)
    wide.hidden.copy_(padded_columns(ragged.hidden, wide_shape.hidden))
    wide.topk_weights.copy_(ragged.topk_weights)
    wide.topk_ids.copy_(ragged.topk_ids)
    want = wide.apply()[:, : s.hidden]
    differ = int((got != want).sum())
    assert differ == 0, f"{differ} of {got.numel()} elements differ from the zero-padded layer"


ORDER_SHAPE = moe_setup.MoeShape("e8-h128-i368", 8, 128, ORDER_DEPTH, 2)


def order_layer(
    moe: Nvfp4Moe, shape: moe_setup.MoeShape, tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output of ``moe``'s layer, every hidden element ORDER_HIDDEN, and its top-k
    weights (MoeLayer's seeded routing: the same for every intermediate size)."""
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    moe_layer = moe_setup.MoeLayer(moe, shape, tokens, experts)
    moe_layer.hidden.fill_(ORDER_HIDDEN)
    return moe_layer.apply().clone(), moe_layer.topk_weights


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("tokens", [1, 32, 512])
def test_the_masked_step_comes_first(
    tokens: int, portable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """order_moe's w2 sums +B (its tail), -B (step 0) and 18 (step 1), 18 under half an FP32
    ulp of B: the tail first gives 18 times each top-k weight, the tail last loses the 18."""
    if portable:
        monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)
    moe = order_moe(ORDER_SHAPE.experts, "cuda")
    got, weights = order_layer(moe, ORDER_SHAPE, tokens)
    differ = int((got != order_output(weights, got.dtype)).sum())
    assert differ == 0, f"{differ} of {got.numel()} elements not the tail-first sum"
    wide = dataclasses.replace(ORDER_SHAPE, intermediate=up128(ORDER_DEPTH))
    for place, same in ((tail_first, True), (in_order, False)):
        padded, _ = order_layer(zero_padded(moe, 128, wide.intermediate, place), wide, tokens)
        assert torch.equal(got, padded) == same, f"the zero-padded layer, {place.__name__}"


def probe_outputs(
    shape: moe_setup.MoeShape,
    moe: Nvfp4Moe,
    entry: str,
    graph: bool,
    batches: tuple[int, ...] = BATCHES,
) -> tuple[torch.Tensor, list]:
    """The probe token's output alone (eager), and at a random row of each batch
    (tests/gpu/test_shape_tables.py takes it too)."""
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, max(batches))
    kernel = moe_setup.emulation_or_bf16_kernel(experts)
    probe = moe_setup.random_inputs(1, shape, PROBE_SEED)

    def output(tokens: int, use_graph: bool) -> tuple[int, torch.Tensor]:
        rng = random.Random(tokens)
        moe_layer = moe_setup.MoeLayer(moe, shape, tokens, kernel.experts, seed=tokens)

        def place(row: int) -> None:
            moe_layer.hidden[row] = probe[0][0]
            moe_layer.topk_weights[row] = probe[1][0]
            moe_layer.topk_ids[row] = probe[2][0]

        row = rng.randrange(tokens)
        place(row)
        run = moe_setup.KernelCall(kernel, moe_layer).run if entry == "kernel" else moe_layer.run
        if not use_graph:
            return row, run()[row].clone()
        captured, out = cuda_graphs.capture(run)
        moe_layer.refill(seed=tokens + 1)
        row = rng.randrange(tokens)
        place(row)
        captured.replay()
        torch.cuda.synchronize()
        return row, out[row].clone()

    alone = output(1, False)[1]
    return alone, [(t, *output(t, graph)) for t in (1, *batches)]


@pytest.mark.parametrize(("entry", "graph"), MODES)
@pytest.mark.parametrize("shape", INVARIANCE_SHAPES)
def test_ragged_batch_invariant(shape: str, entry: str, graph: bool) -> None:
    alone, outputs = probe_outputs(SHAPES[shape], moe_setup.held_moe(SHAPES[shape]), entry, graph)
    assert not alone.isnan().any()
    differ = [
        f"{tokens} tokens, row {row}: {int((out != alone).sum())} elements differ"
        for tokens, row, out in outputs
        if not torch.equal(out, alone)
    ]
    assert not differ, f"{shape}, {entry}.apply, graph={graph}: " + "; ".join(differ)


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("tokens", [1, 8, 32, 128, 512])
@pytest.mark.parametrize("shape", ["e128-h2048-i192", "e128-h2688-i1856"])
def test_rocm_configuration_same_bits(
    shape: str, tokens: int, portable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ROCm's tile table and token block, forced on this GPU, give the default
    configuration's bits (and so do the portable decode's)."""
    monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)
    monkeypatch.delenv(PLATFORM_ENV, raising=False)
    default = layer(shape, tokens)
    want = default.apply().clone()
    monkeypatch.setenv(PLATFORM_ENV, "rocm")
    if portable:
        monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")
    forced = layer(shape, tokens)
    assert forced.experts.experts.min_block_m == 16
    for name in ("hidden", "topk_weights", "topk_ids"):
        getattr(forced, name).copy_(getattr(default, name))
    got = forced.apply()
    differ = int((got != want).sum())
    assert differ == 0, f"{differ} of {got.numel()} elements differ from the default tiles"
