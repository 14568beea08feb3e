"""Patch 0002's predecoded GEMMs under Triton's interpreter (TRITON_INTERPRET=1) on the CPU: at
many routed pairs per expert the fused experts decode each GEMM's weights once for the call
(_nvfp4_predecode_kernel) and run plain GEMMs over them (_predecoded_moe_gemm_kernel), and a
token's output must be the bits the fused kernel gives it at any other count (batch
invariance: the same decoded values, products and order of sums).

Each case runs the experts' own ``apply`` twice on the same inputs, on weights as their
process_weights_after_loading lays them out: as the module takes them (at these few pairs per
expert, the fused kernel) and with its predecode threshold at one pair per expert
(``overlay_kernels.predecoding``: the predecoded GEMMs), and compares the bits. As in
tests/test_kernels_interpret.py, the module is loaded as on a ROCm machine (the interpreter
runs no inline PTX: the portable decode, FP16 operands): ROCm's tiles, which walk K as CUDA's
do. Depths of one and two whole K steps of both GEMMs, FP16 and BF16 activations, with and
without an expert map with -1 entries (expert parallelism: w2's zeros for other ranks' pairs).
The first case runs once more with VLLM_PATCHSET_NVFP4_NO_PREDECODE=1, which must keep the
fused kernels at that threshold.

The tuner's own forwards (benchmarks/tune_nvfp4_moe.py --predecode, which times and checks
candidate predecoded tiles against the fused layer on the GPU) run here too: its fused layer and
its predecoded layer with several of its candidate tiles (blocks of 64 and 128 pairs, products
of 32 and 64 columns) give the experts' own bits.

The rule itself (``predecodes``) is pinned on released checkpoints' layers at 2048 and 8192
tokens without the interpreter. On the GPU, tests/gpu/test_predecode.py compares the PTX
decode's and the portable decode's predecoded GEMMs (CUDA's and ROCm's configurations) with the
fused kernel's bits at the counts where the rule takes them.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the kernels run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton's interpreter runs the kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import moe_setup
import overlay_kernels as kernels
from test_kernels_interpret import expert_map

EXPERTS = 4
# (name, K steps of both GEMMs, tokens, dtype, expert map)
CASES = [
    (f"{steps}step-{tokens}tok-{name}{'-ep' if ep else ''}", steps, tokens, dtype, ep)
    for steps, tokens in ((1, 9), (1, 40), (2, 40))
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16))
    for ep in (False, True)
]
CASE_IDS = [c[0] for c in CASES]
NO_PREDECODE_ENV = "VLLM_PATCHSET_NVFP4_NO_PREDECODE"
SWITCHED_OFF = "switched-off"  # CASES[0] with NO_PREDECODE_ENV=1
# The case the tuner's forwards run on, and which of its PREDECODE_TILES (all but the
# first and third, which differ from the second in their stages only).
TUNER_CASE = "2step-40tok-fp16"
TUNER_TILES = (1, 3, 4, 5, 6)
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

results = kernels.interpreted_results_fixture()


@pytest.mark.parametrize("case", CASE_IDS)
def test_predecoded_gemms_give_the_fused_kernels_bits(results: dict[str, Any], case: str) -> None:
    fused, predecoded = results["outputs"][case]
    assert not fused.isnan().any()
    assert torch.equal(fused.view(torch.int16), predecoded.view(torch.int16))


def test_tuner_forwards_give_the_experts_bits(results: dict[str, Any]) -> None:
    """benchmarks/tune_nvfp4_moe.py's fused_forward and predecoded_forward (with TUNER_TILES of
    its candidates) on TUNER_CASE's weights and inputs, each aligning its blocks and (fused, and
    the last tiles predecoded) with blocks aligned before, as its sweep times them: the
    experts' own output, bit for bit."""
    experts = results["outputs"][TUNER_CASE][0].view(torch.int16)
    assert len(results["tuner"]) == 2 + len(TUNER_TILES) + 1
    for out in results["tuner"]:
        assert torch.equal(out.view(torch.int16), experts)


def test_tuner_pick_of_predecode() -> None:
    """benchmarks/tune_nvfp4_moe.py --predecode's pick: the tiles with the least time summed
    over the counts, and the least count from which they beat the fused layer at every count
    above; never (PREDECODE_NEVER) where they lose at the largest. Token counts: the layer's
    pairs an expert, rounded up."""
    sys.path.insert(0, str(BENCHMARKS))
    import tune_nvfp4_moe as tune

    fused = {64: 10.0, 128: 20.0, 256: 40.0, 512: 80.0}
    a, b = (128, "a"), (64, "b")  # tiles, as PREDECODE_TILES names them (any tuple)
    cases = [
        ({a: {64: 11.0, 128: 19.0, 256: 30.0, 512: 60.0}}, (a, 128)),
        # Faster at 64, slower at 128: the threshold is where it wins from there up.
        ({a: {64: 9.0, 128: 21.0, 256: 30.0, 512: 60.0}}, (a, 256)),
        ({a: {64: 9.0, 128: 19.0, 256: 39.0, 512: 81.0}}, (a, tune.PREDECODE_NEVER)),
        ({a: {64: 9.0, 128: 19.0, 256: 39.0, 512: 79.0}}, (a, 64)),
        # Equal is not faster.
        ({a: {64: 9.0, 128: 19.0, 256: 40.0, 512: 60.0}}, (a, 512)),
        # The least sum picks the tiles (b), whose own counts give the threshold.
        ({a: {64: 9.0, 128: 19.0, 256: 39.0, 512: 79.0},
          b: {64: 12.0, 128: 21.0, 256: 30.0, 512: 60.0}}, (b, 256)),
        # A failed timing (inf) never wins; all failed: never.
        ({a: {64: 9.0, 128: math.inf, 256: 30.0, 512: 60.0},
          b: {64: 12.0, 128: 21.0, 256: 30.0, 512: 60.0}}, (b, 256)),
        ({a: dict.fromkeys(fused, math.inf)}, (a, tune.PREDECODE_NEVER)),
    ]  # fmt: skip
    for predecoded, want in cases:
        assert tune.predecode_pick(fused, predecoded) == want
    assert tune.PREDECODE_PAIRS == (64, 128, 256, 512, 1024)
    qwen, scout = (moe_setup.shape_named(n) for n in ("qwen3-30b-a3b", "llama-4-scout-tp8"))
    assert [tune.predecode_tokens(qwen, p) for p in (64, 512)] == [1024, 8192]
    assert [tune.predecode_tokens(scout, p) for p in (64, 512)] == [1024, 8192]
    assert tune.predecode_tokens(moe_setup.shape_named("qwen3.5-397b-a17b"), 64) == 3277


@pytest.mark.parametrize("case", CASE_IDS)
def test_each_path_launches_its_own_kernels(results: dict[str, Any], case: str) -> None:
    """The fused run: the QDQ pass (with the route program), both fused GEMMs, the top-k sum.
    The predecoded run: vLLM's alignment into blocks of 128 pairs, the QDQ pass, then for each
    GEMM the decode pass and the plain GEMM, and the top-k sum."""
    fused, predecoded = results["launched"][case]
    assert fused == ["_nvfp4_qdq_kernel", "_nvfp4_moe_gemm_kernel", "_nvfp4_moe_gemm_kernel",
                     "_topk_sum_kernel"]  # fmt: skip
    assert predecoded == [
        "_nvfp4_qdq_kernel",
        "_nvfp4_predecode_kernel",
        "_predecoded_moe_gemm_kernel",
        "_nvfp4_predecode_kernel",
        "_predecoded_moe_gemm_kernel",
        "_topk_sum_kernel",
    ]
    assert results["aligned"][case] == 1


# Released checkpoints' layers (tests/gpu/moe_setup.SHAPES) -> whether 2048, 4096 and 8192
# tokens predecode on CUDA and on ROCm with the platform's generic predecode (GENERIC_PREDECODE):
# at least its min_pairs_per_expert routed pairs per expert of the layer (CUDA 512, ROCm 256),
# both depths whole K steps (multiples of 128), and the rank's w13 in BF16 within
# PREDECODE_MAX_BYTES (4 GiB).
TOKENS = (2048, 4096, 8192)
RULE = {
    # 16384, 32768 and 65536 pairs over 128 experts: 128, 256 and 512 an expert.
    "qwen3-30b-a3b": {"cuda": (False, False, True), "rocm": (False, True, True)},
    # w13 in BF16: 128 * 3072 * 4096 * 2 bytes = 3 GiB.
    "qwen3-235b-a22b": {"cuda": (False, False, True), "rocm": (False, True, True)},
    # Intermediate 192 and 1856: the last K step of w2 is not whole.
    "qwen3-30b-a3b-tp4": {"cuda": (False, False, False), "rocm": (False, False, False)},
    "nemotron-3-nano-30b-a3b": {"cuda": (False, False, False), "rocm": (False, False, False)},
    # 256 experts: 64, 128 and 256 pairs an expert.
    "deepseek-r1-tp4": {"cuda": (False, False, False), "rocm": (False, False, True)},
    # One EP8 rank's 32 experts: the pairs spread over all 256 (about an eighth are its own).
    "deepseek-r1-ep8": {"cuda": (False, False, False), "rocm": (False, False, True)},
    # Top-1 over 16 experts: 128, 256 and 512 pairs an expert; w13 of 320 MiB.
    "llama-4-scout-tp8": {"cuda": (False, False, True), "rocm": (False, True, True)},
}


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
@pytest.mark.parametrize("name", list(RULE))
def test_predecode_rule_on_released_layers(kernels_module: Any, name: str, platform: str) -> None:
    shape = moe_setup.shape_named(name)
    config = kernels_module.GENERIC_PREDECODE[platform]
    sizes = (shape.experts, shape.held_experts, shape.hidden, shape.intermediate, 2, config)
    got = tuple(kernels_module.predecodes(t * shape.top_k, *sizes) for t in TOKENS)
    assert got == RULE[name][platform]


def test_predecode_tiles_per_platform(kernels_module: Any) -> None:
    """Each platform of the generic tables has its generic predecode: its threshold, and
    predecoded tiles of blocks of 128 pairs (the alignment's) and 128 rows at three stages;
    CUDA's half a K step a product, ROCm's a quarter (LDS within MI300's 64 KiB:
    tests/test_kernels_compile.py; half steps at three stages would take 96 KiB for w13)."""
    configs = kernels_module.GENERIC_PREDECODE
    assert set(configs) == set(kernels_module.GENERIC_CONFIGS) == {"cuda", "rocm"}
    thresholds = {platform: c.min_pairs_per_expert for platform, c in configs.items()}
    assert thresholds == {"cuda": 512, "rocm": 256}
    tiles = {
        platform: [(c.block_m, g.block_n, g.block_k, g.num_warps, g.num_stages)
                   for g in (c.w13, c.w2)]
        for platform, c in configs.items()
    }  # fmt: skip
    assert tiles == {
        "cuda": [(128, 128, 64, 8, 3), (128, 128, 64, 4, 3)],
        "rocm": [(128, 128, 32, 8, 3), (128, 128, 32, 4, 3)],
    }


def test_no_predecode_switch_keeps_the_fused_kernel(results: dict[str, Any]) -> None:
    """VLLM_PATCHSET_NVFP4_NO_PREDECODE=1: at a count the rule predecodes (its threshold at one
    pair per expert), the experts launch the fused kernels, and give their bits."""
    (launched,) = results["launched"][SWITCHED_OFF]
    assert launched == ["_nvfp4_qdq_kernel", "_nvfp4_moe_gemm_kernel", "_nvfp4_moe_gemm_kernel",
                        "_topk_sum_kernel"]  # fmt: skip
    fused, switched_off = results["outputs"][SWITCHED_OFF]
    assert torch.equal(fused.view(torch.int16), switched_off.view(torch.int16))


def test_no_predecode_switch_is_read_from_the_environment(
    kernels_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert kernels_module.NO_PREDECODE_ENV == NO_PREDECODE_ENV
    for value, predecode in (("1", False), ("0", True), ("", True)):
        monkeypatch.setenv(NO_PREDECODE_ENV, value)
        assert kernels_module.use_predecode() is predecode
    monkeypatch.delenv(NO_PREDECODE_ENV)
    assert kernels_module.use_predecode() is True


def test_predecode_buffer_is_bounded(kernels_module: Any) -> None:
    """DeepSeek-R1's whole layer (256 experts, hidden 7168, intermediate 2048): w13 of 14 GiB in
    BF16, refused at any count; its EP8 rank's 32 experts (1.75 GiB) predecode at 512 pairs an
    expert of the layer (16384 tokens)."""
    cuda = kernels_module.GENERIC_PREDECODE["cuda"]
    assert not kernels_module.predecodes(1 << 20, 256, 256, 7168, 2048, 2, cuda)
    assert kernels_module.predecodes(16384 * 8, 256, 32, 7168, 2048, 2, cuda)
    assert not kernels_module.predecodes(16384 * 8 - 1, 256, 32, 7168, 2048, 2, cuda)


def test_gemm_order_is_the_step_order_by_halves(kernels_module: Any) -> None:
    """gemm_order (the columns the activations are gathered from) is _step_k's order per step:
    the low nibbles' 64 columns then the high nibbles', so a step's position 2j + h of the
    tiled layout's nibble order (step_order) lands at 64 h + j."""
    order = kernels_module.gemm_order(256, torch.device("cpu"))
    nibbles = kernels_module.step_order()
    assert sorted(order.tolist()) == list(range(256))
    for step in range(2):
        for j in range(64):
            for h in range(2):
                assert order[step * 128 + 64 * h + j] == step * 128 + nibbles[2 * j + h]


@pytest.fixture(scope="module")
def kernels_module(overlay: Any, full_pristine: Any) -> Any:
    import standins

    fused = kernels.load_fused(
        overlay.project.overlay_dir / "vllm",
        full_pristine.root / "vllm",
        standins.moe_align_block_size,
        rocm=False,
    )
    return sys.modules[fused.module.predecodes.__module__]


def run(fused: kernels.FusedModule, shape: moe_setup.MoeShape, tokens: int, ep: bool,
        dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    moe = moe_setup.make_moe(shape, seed=0, device="cpu")
    hidden, weights, ids = moe_setup.random_inputs(tokens, shape, seed=1, device="cpu")
    pick: Any = slice(None)
    emap = None
    if ep:
        pick, emap = expert_map(shape)
    config = kernels.quant_config(moe.w13_scale[pick], moe.w2_scale[pick], moe.w13_gscale[pick],
                                  moe.w2_gscale[pick], moe.a13_gscale, moe.a2_gscale)  # fmt: skip
    experts = fused.experts(None, config)
    w13, w2 = kernels.laid_out(experts, moe.w13[pick], moe.w2[pick])
    return kernels.fused_apply(
        fused, experts, hidden.to(dtype), w13, w2, weights, ids, emap, shape.experts
    )


def main(overlay_vllm: str, pristine_vllm: str, out: str) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    fused, calls = kernels.counting_fused(overlay_vllm, pristine_vllm)
    kernels.fix_interpreter()
    kernels.forbid_unfused(fused)
    launched: list[str] = []
    original = InterpretedFunction.run

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        launched.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    InterpretedFunction.run = spy  # type: ignore[method-assign]
    hidden, intermediate = kernels.small_fused_sizes(fused.module)
    outputs: dict[str, tuple[torch.Tensor, ...]] = {}
    runs: dict[str, list[list[str]]] = {}
    aligned: dict[str, int] = {}
    for case_id, steps, tokens, dtype, ep in CASES:
        shape = moe_setup.MoeShape(case_id, EXPERTS, steps * hidden, steps * intermediate, top_k=2)
        launched.clear()
        fused_out = run(fused, shape, tokens, ep, dtype)
        runs[case_id] = [list(launched)]
        launched.clear()
        before = calls.aligned
        with kernels.predecoding(fused):
            outputs[case_id] = (fused_out, run(fused, shape, tokens, ep, dtype))
        runs[case_id].append(list(launched))
        aligned[case_id] = calls.aligned - before
    # The switch: the threshold at one pair per expert, predecode turned off by the environment
    # (read when the experts are built): the fused kernels, and their bits.
    case_id, steps, tokens, dtype, ep = CASES[0]
    shape = moe_setup.MoeShape(case_id, EXPERTS, steps * hidden, steps * intermediate, top_k=2)
    os.environ[NO_PREDECODE_ENV] = "1"
    launched.clear()
    with kernels.predecoding(fused):
        outputs[SWITCHED_OFF] = (outputs[case_id][0], run(fused, shape, tokens, ep, dtype))
    runs[SWITCHED_OFF] = [list(launched)]
    del os.environ[NO_PREDECODE_ENV]
    InterpretedFunction.run = original  # type: ignore[method-assign]
    # The tuner's forwards on TUNER_CASE's weights and inputs (run's: same seeds).
    sys.path.insert(0, str(BENCHMARKS))
    import tune_nvfp4_moe as tune

    tune.K = fused.module
    _, steps, tokens, dtype, _ = next(c for c in CASES if c[0] == TUNER_CASE)
    shape = moe_setup.MoeShape(TUNER_CASE, EXPERTS, steps * hidden, steps * intermediate, top_k=2)
    moe = tune.laid_out(moe_setup.make_moe(shape, seed=0, device="cpu"))
    x, weights, ids = moe_setup.random_inputs(tokens, shape, seed=1, device="cpu")
    layer = (moe, x.to(dtype), weights, ids)
    config = fused.module.get_nvfp4_moe_config(tokens, 2, EXPERTS, 16, fused.module.ROCM_CONFIGS)
    # Aligned on each call, and with the blocks aligned before (what the sweep times).
    prealigned = {bm: tune.align(ids, bm, EXPERTS) for bm in (config.block_m, 64, 128)}
    tuner = [tune.fused_forward(*layer, config, EXPERTS, None, blocks)
             for blocks in (None, prealigned)]  # fmt: skip
    for i in TUNER_TILES:
        predecode = tune.predecode_config(1, tune.PREDECODE_TILES[i])
        tuner.append(tune.predecoded_forward(*layer, predecode, EXPERTS, None))
    predecode = tune.predecode_config(1, tune.PREDECODE_TILES[TUNER_TILES[-1]])
    tuner.append(tune.predecoded_forward(*layer, predecode, EXPERTS, None, prealigned))
    results = {"outputs": outputs, "launched": runs, "aligned": aligned}
    torch.save({**results, "tuner": tuner}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
