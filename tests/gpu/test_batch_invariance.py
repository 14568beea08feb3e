"""Batch invariance and numerics of the NVFP4 emulation MoE on each of its paths.

Batch invariance, bitwise: one token's output computed alone is the output of the same token
at a random row of a batch of 2 ... 8192 tokens whose other tokens are random, through
``FusedMoEKernel.apply`` (what a FusedMoE layer calls) and through the experts' own ``apply``,
eagerly and replayed from CUDA graphs (captured for the batch, then given new tokens and a new
row for the probe). Every output is compared with the eager output of the token alone: vLLM's
engine runs prefill chunks eagerly and decode steps from graphs, so a token's result must not
depend on which. A kernel whose tiles, split of K or summation order depend on the number of
tokens fails here.

Paths (a fixture each):
- ``default``: what the vLLM under test runs. On pristine 0.24.0 that is the unfused emulation
  (every expert dequantized, then BF16 TritonExperts), invariant today: these tests pass there
  and guard it. On the overlay, patch 0002's fused kernel.
- ``portable``: the overlay's portable Triton path, forced with VLLM_PATCHSET_NVFP4_PORTABLE=1
  (where the overlay also has a CUDA-only path, chosen by platform otherwise), set before the
  experts are built and while they run. The path is patch 0002's: the tests require that
  ``apply`` reads the routed experts only (0.24.0's path dequantizes every expert), so they
  fail on the pristine pin, as `vllm-patchset validate` expects (its NEW_PATH_TESTS). Where
  the overlay does not read the switch, its default path is its only one and is tested here.

The two paths agree bitwise: the same layer and tokens through the default path and the portable
one give the same output (patch 0002's CUDA-only decode computes the portable decode's
products; where the vLLM under test has one path, it is compared with itself).

Numerics: each path's output against the W4A4 reference (tests/gpu/nvfp4_reference.py, the
pristine emulation's arithmetic in plain torch) with the fused-kernel tests' tolerance
(test_fused_nvfp4_emulation.py's docstring argues it: the relative Frobenius error under 1e-2
and 99.5% of the elements within atol 1e-2 + rtol 1.6e-2; a summation order other than the
reference's moves an intermediate by an ulp, which now and then flips one activation's
E2M1 rounding by one FP4 step).

Qwen3-30B-A3B's MoE shape (E=128, hidden 2048, intermediate 768, top-8). Seconds on an H200.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import cuda_graphs
import moe_setup
from nvfp4_reference import Nvfp4Moe, nvfp4_moe_reference
from test_fused_nvfp4_emulation import assert_agree  # one tolerance for every path
from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe

pytestmark = pytest.mark.gpu

SHAPE = moe_setup.SHAPES[0]  # qwen3-30b-a3b
# (entry, graph): FusedMoEKernel.apply or the experts' apply; eager or replayed from a graph.
MODES = [("kernel", False), ("kernel", True), ("experts", False), ("experts", True)]
# Batch sizes around every token bucket and block boundary the emulation's paths use (4, 16,
# 64, 256 and 8/16/32/64/128-row blocks), up to 512, and a few larger (prefill chunks); from
# 8192 (512 routed pairs per expert) patch 0002's predecoded GEMMs.
BATCHES: tuple[int, ...] = (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127)
BATCHES += (128, 129, 255, 256, 257, 300, 511, 512, 1024, 2048, 3072, 4096, 8192)
NUMERICS_TOKENS = (1, 8, 32, 128, 512)
PROBE_SEED = 1_000_003


@pytest.fixture(scope="module")
def moe() -> Nvfp4Moe:
    return moe_setup.make_moe(SHAPE)


@pytest.fixture
def default_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path the vLLM under test takes by itself: the switch cleared."""
    monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)


@pytest.fixture
def portable_path(monkeypatch: pytest.MonkeyPatch, vllm_under_test, capsys) -> None:
    """The switch set for the whole test, and a guard that fails the test where apply()
    dequantizes every expert (0.24.0's path: no fused portable path there)."""
    monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")

    def dequantize_all(*args, **kwargs):
        raise AssertionError(
            "apply() dequantized every expert's weights: the vLLM under test has no fused"
            " portable path (vLLM 0.24.0's emulation; patch 0002 brings it)"
        )

    monkeypatch.setattr(nvfp4_emulation_moe, "dequantize_to_dtype", dequantize_all)
    package = Path(vllm_under_test.location)
    if not moe_setup.has_portable_switch(package):
        with capsys.disabled():
            print(f"\n{package} does not read {moe_setup.PORTABLE_ENV}: one path, the default")


def _experts(moe: Nvfp4Moe, loaded: bool = True) -> moe_setup.Kernel:
    experts = moe_setup.nvfp4_emulation_experts(moe, SHAPE, max(BATCHES), loaded=loaded)
    return moe_setup.emulation_or_bf16_kernel(experts)


class Probe:
    """One token (hidden state, top-k weights and ids) put at a row of a layer's inputs."""

    def __init__(self) -> None:
        self.hidden, self.weights, self.ids = moe_setup.random_inputs(1, SHAPE, PROBE_SEED)

    def place(self, layer: moe_setup.MoeLayer, row: int) -> None:
        layer.hidden[row] = self.hidden[0]
        layer.topk_weights[row] = self.weights[0]
        layer.topk_ids[row] = self.ids[0]


def _runner(kernel: moe_setup.Kernel, layer: moe_setup.MoeLayer, entry: str) -> Callable:
    if entry == "kernel":
        return moe_setup.KernelCall(kernel, layer).run
    return layer.run


def _output(
    moe: Nvfp4Moe, kernel: moe_setup.Kernel, probe: Probe, tokens: int, entry: str, graph: bool
) -> list[tuple[int, torch.Tensor]]:
    """(row, that row's output) for the probe at a random row of a batch of ``tokens``: eager,
    or from a graph captured with one batch and replayed with new tokens and a new row."""
    rng = random.Random(tokens)
    layer = moe_setup.MoeLayer(moe, SHAPE, tokens, kernel.experts, seed=tokens)
    row = rng.randrange(tokens)
    probe.place(layer, row)
    run = _runner(kernel, layer, entry)
    if not graph:
        return [(row, run()[row].clone())]
    captured, output = cuda_graphs.capture(run)
    layer.refill(seed=tokens + 1)
    row = rng.randrange(tokens)
    probe.place(layer, row)
    captured.replay()
    torch.cuda.synchronize()
    return [(row, output[row].clone())]


def check_batch_invariant(moe: Nvfp4Moe, path: str, entry: str, graph: bool) -> None:
    kernel = _experts(moe)
    probe = Probe()
    alone = _output(moe, kernel, probe, 1, entry, graph=False)[0][1]
    assert not alone.isnan().any()
    outputs = [(1, row, out) for row, out in _output(moe, kernel, probe, 1, entry, graph)]
    for tokens in BATCHES:
        outputs += [(tokens, r, o) for r, o in _output(moe, kernel, probe, tokens, entry, graph)]
    differ = [
        f"{tokens} tokens, row {row}: {int((out != alone).sum())} of {alone.numel()} elements"
        f" differ, max |Δ| {(out.float() - alone.float()).abs().max().item():.3g}"
        for tokens, row, out in outputs
        if not torch.equal(out, alone)
    ]
    mode = "graph replay" if graph else "eager"
    assert not differ, f"{path} path, {entry}.apply, {mode} vs alone eager: " + "; ".join(differ)


def _call(
    moe: Nvfp4Moe, tokens: int, loaded: bool = True
) -> tuple[moe_setup.Kernel, moe_setup.MoeLayer, torch.Tensor]:
    """Experts built now (they pick their decode when built) and one FusedMoEKernel.apply on
    a layer of ``tokens`` tokens: (the kernel, the layer, a copy of its output)."""
    kernel = _experts(moe, loaded)
    layer = moe_setup.MoeLayer(moe, SHAPE, tokens, kernel.experts, seed=tokens)
    return kernel, layer, moe_setup.KernelCall(kernel, layer).run().clone()


def _portable_switch(monkeypatch: pytest.MonkeyPatch, forced: bool) -> None:
    if forced:
        monkeypatch.setenv(moe_setup.PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(moe_setup.PORTABLE_ENV, raising=False)


def _reference(moe: Nvfp4Moe, layer: moe_setup.MoeLayer) -> torch.Tensor:
    """The reference for the layer's tokens in each path's own arithmetic: exact W4A4 where
    patch 0002's fused kernel runs, vLLM 0.24.0's BF16 roundings elsewhere
    (test_fused_nvfp4_emulation.py's docstring)."""
    fused = hasattr(
        nvfp4_emulation_moe.Nvfp4QuantizationEmulationTritonExperts, "_apply_dequantized"
    )
    return nvfp4_moe_reference(moe, layer.hidden, layer.topk_weights, layer.topk_ids, exact=fused)


def check_matches_reference(moe: Nvfp4Moe, tokens: int) -> None:
    _, layer, got = _call(moe, tokens)
    assert_agree(got, _reference(moe, layer))


@pytest.mark.parametrize(("entry", "graph"), MODES)
def test_batch_invariant(moe: Nvfp4Moe, default_path: None, entry: str, graph: bool) -> None:
    check_batch_invariant(moe, "default", entry, graph)


@pytest.mark.parametrize(("entry", "graph"), MODES)
def test_portable_batch_invariant(
    moe: Nvfp4Moe, portable_path: None, entry: str, graph: bool
) -> None:
    check_batch_invariant(moe, "portable", entry, graph)


@pytest.mark.parametrize("tokens", NUMERICS_TOKENS)
def test_matches_reference(moe: Nvfp4Moe, default_path: None, tokens: int) -> None:
    check_matches_reference(moe, tokens)


@pytest.mark.parametrize("tokens", NUMERICS_TOKENS)
def test_portable_matches_reference(moe: Nvfp4Moe, portable_path: None, tokens: int) -> None:
    check_matches_reference(moe, tokens)


@pytest.mark.parametrize("tokens", NUMERICS_TOKENS)
def test_default_and_portable_paths_same_bits(
    moe: Nvfp4Moe, monkeypatch: pytest.MonkeyPatch, tokens: int
) -> None:
    """The default path (on CUDA the PTX decode) and the forced portable one, on the weights
    as loading lays them out; and the default path on the checkpoint's rows (the layout of
    weights that no process_weights_after_loading saw): the same bits, all three."""
    outputs = {}
    for name, forced, loaded in (
        ("default", False, True),
        ("portable", True, True),
        ("rows", False, False),
    ):
        _portable_switch(monkeypatch, forced)
        outputs[name] = _call(moe, tokens, loaded)[2]
    for name in ("portable", "rows"):
        differ = int((outputs["default"] != outputs[name]).sum())
        total = outputs[name].numel()
        assert differ == 0, f"{tokens} tokens, {name}: {differ} of {total} elements differ"


@pytest.mark.parametrize("kinds", ["fast", "general"])
def test_block_scale_kinds_same_bits(
    moe: Nvfp4Moe, monkeypatch: pytest.MonkeyPatch, kinds: str
) -> None:
    """Block scales of the kinds a real checkpoint may hold beside E4M3 normals
    (moe_setup.with_block_scale_kinds): zero scales over zero codes, which patch 0002's PTX
    decode converts with one integer operation (``fast``), and with them subnormal scales and
    zero scales over nonzero codes, which send it to the general FP8 conversion
    (``general``). The default path and the portable one give the same bits, and agree with
    the reference; where the experts record the hook's check, it says which conversion ran."""
    edged = moe_setup.with_block_scale_kinds(moe, general=kinds == "general")
    tokens = 32
    outputs = {}
    for name, forced in (("default", False), ("portable", True)):
        _portable_switch(monkeypatch, forced)
        kernel, layer, outputs[name] = _call(edged, tokens)
        record = getattr(kernel.experts.experts, "fast_scales", None)
        assert record in (None, kinds == "fast"), f"{name}: fast_scales {record}"
    differ = int((outputs["default"] != outputs["portable"]).sum())
    assert differ == 0, f"{differ} of {outputs['default'].numel()} elements differ"
    assert_agree(outputs["default"], _reference(edged, layer))


@pytest.mark.parametrize("tokens", NUMERICS_TOKENS)
def test_pdl_on_and_off_same_bits(
    moe: Nvfp4Moe, monkeypatch: pytest.MonkeyPatch, tokens: int
) -> None:
    """Programmatic dependent launch changes when a kernel starts, not what it computes: with
    it (patch 0002's default on sm_90) and without (VLLM_PATCHSET_NVFP4_NO_PDL=1), the same
    bits, eagerly and replayed from a CUDA graph (where vLLM's decode steps run it). A kernel
    that read its input before the kernel writing it had ended would differ here. Where the
    experts record the choice (``pdl``), the switch turns it off."""
    _portable_switch(monkeypatch, False)
    outputs = {}
    for name, off in (("pdl", False), ("no pdl", True)):
        if off:
            monkeypatch.setenv(moe_setup.NO_PDL_ENV, "1")
        else:
            monkeypatch.delenv(moe_setup.NO_PDL_ENV, raising=False)
        kernel, layer, outputs[name] = _call(moe, tokens)
        if off:
            assert getattr(kernel.experts.experts, "pdl", None) in (None, False)
        captured, out = cuda_graphs.capture(moe_setup.KernelCall(kernel, layer).run)
        captured.replay()
        torch.cuda.synchronize()
        outputs[f"{name}, graph"] = out.clone()
    for name in ("pdl, graph", "no pdl", "no pdl, graph"):
        differ = int((outputs["pdl"] != outputs[name]).sum())
        total = outputs[name].numel()
        assert differ == 0, f"{tokens} tokens, {name}: {differ} of {total} elements differ"
