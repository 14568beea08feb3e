"""The GPU layer setup (tests/gpu/moe_setup.py) and capture helper (tests/gpu/cuda_graphs.py) on
the CPU: they import with no vLLM and no GPU (vLLM is imported only once a tree is chosen), and
their weights, scales and routing are what the GPU tests and the benchmark rely on."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from support import REPO

pytest.importorskip("torch", reason="the layer setup runs torch (pip install torch)")
import torch

GPU_TESTS = REPO / "tests" / "gpu"
sys.path.insert(0, str(GPU_TESTS))

import cuda_graphs  # noqa: E402
import moe_setup  # noqa: E402
import nvfp4_reference as nvfp4  # noqa: E402

SMALL = moe_setup.MoeShape("small", experts=4, hidden=64, intermediate=32, top_k=2)


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=GPU_TESTS, capture_output=True, text=True
    )


def test_imports_without_vllm() -> None:
    """The benchmark and the tuner import these before they pick a vLLM tree: importing them
    imports no vllm module and needs no GPU."""
    result = python(
        "import sys, cuda_graphs, moe_setup, nvfp4_reference, standins\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))"
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")


def test_import_vllm_where_there_is_none(tmp_path) -> None:
    result = python(
        f"import moe_setup\nmoe_setup.import_vllm(__import__('pathlib').Path({str(tmp_path)!r}))"
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "ModuleNotFoundError: no vllm importable (set VLLM_PATCHSET_VLLM_TREE)"
    )


def test_make_moe_layout_and_scales() -> None:
    moe = moe_setup.make_moe(SMALL, seed=0, device="cpu")
    e, h, i = SMALL.experts, SMALL.hidden, SMALL.intermediate
    layout = {
        name: (tuple(t.shape), t.dtype)
        for name, t in vars(moe).items()  # the dataclass's fields, in order
    }
    assert layout == {
        "w13": ((e, 2 * i, h // 2), torch.uint8),
        "w13_scale": ((e, 2 * i, h // 16), torch.float8_e4m3fn),
        "w13_gscale": ((e,), torch.float32),
        "w2": ((e, h, i // 2), torch.uint8),
        "w2_scale": ((e, h, i // 16), torch.float8_e4m3fn),
        "w2_gscale": ((e,), torch.float32),
        "a13_gscale": ((), torch.float32),
        "a2_gscale": ((), torch.float32),
    }
    # The oracle's scales for amax 6 (hidden states) and 8 (silu(gate) * up): 448 * 6 / amax.
    assert (moe.a13_gscale.item(), moe.a2_gscale.item()) == (448.0, 336.0)
    assert moe.w13_scale.float().min() >= 64.0
    assert moe.w13_scale.float().max() <= 256.0


def test_activation_scales_sit_on_ties() -> None:
    """The GPU tests' round activation amax put activations exactly on E2M1 thresholds
    (moe_setup's comment says why that is kept); calibrated-looking ones put none there."""
    ties = [
        nvfp4.activations_on_ties(nvfp4.activation_global_scale(amax))
        for amax in (moe_setup.HIDDEN_AMAX, moe_setup.INTERMEDIATE_AMAX, 5.83, 7.61)
    ]
    assert ties == [1228, 340, 0, 0]


def test_held_moe_keeps_one_shape() -> None:
    """held_moe gives the same weights again for the same shape, make_moe's (seed 0), and
    lets them go for the next shape."""
    other = dataclasses.replace(SMALL, name="other", hidden=32)
    first = moe_setup.held_moe(SMALL, "cpu")
    assert moe_setup.held_moe(SMALL, "cpu") is first
    assert torch.equal(first.w13, moe_setup.make_moe(SMALL, device="cpu").w13)
    assert moe_setup.held_moe(other, "cpu").w13.shape == (4, 64, 16)
    assert moe_setup.held_moe(SMALL, "cpu") is not first


def test_make_moe_weights_have_unit_rms_rows() -> None:
    """Weights of RMS 1 / sqrt(K), so rows of about unit norm: within 25% over the layer (the
    global factors of 4 experts, uniform within +-50%, move the mean square that much)."""
    moe = moe_setup.make_moe(SMALL, seed=0, device="cpu")
    w13 = torch.stack([moe.dequantized(e, torch.float32)[0] for e in range(SMALL.experts)])
    w2 = torch.stack([moe.dequantized(e, torch.float32)[1] for e in range(SMALL.experts)])
    for w, k in ((w13, SMALL.hidden), (w2, SMALL.intermediate)):
        assert nvfp4.rms(w) * k**0.5 == pytest.approx(1.0, rel=0.25)


def test_make_moe_is_seeded() -> None:
    a, b = (moe_setup.make_moe(SMALL, seed=7, device="cpu") for _ in range(2))
    other = moe_setup.make_moe(SMALL, seed=8, device="cpu")
    assert all(
        torch.equal(x.float(), y.float())
        for x, y in zip(vars(a).values(), vars(b).values(), strict=True)
    )
    assert not torch.equal(a.w13, other.w13)


@pytest.mark.parametrize("general", [False, True])
def test_with_block_scale_kinds(general: bool) -> None:
    """Each tensor's blocks, a scale and its 8 bytes of codes at one flat index: zero scales
    over zero codes at every 13th, and (general) subnormal scales 1-7 at 5 after those and
    zero scales over the block's own codes at 9 after; every other block as it was, and
    ``moe`` itself unchanged."""
    moe = moe_setup.make_moe(SMALL, seed=0, device="cpu")
    before = moe_setup.weight_copies(moe)
    out = moe_setup.with_block_scale_kinds(moe, general)
    for name in ("w13", "w2"):
        codes = getattr(out, name).view(-1, 8)
        old_codes = getattr(before, name).view(-1, 8)
        scales = getattr(out, f"{name}_scale").view(torch.uint8).view(-1)
        old_scales = getattr(before, f"{name}_scale").view(torch.uint8).view(-1)
        assert torch.equal(getattr(moe, name), getattr(before, name))
        residue = torch.arange(scales.numel()) % 13
        zero_codes = residue == 0
        assert (scales[zero_codes] == 0).all() and (codes[zero_codes] == 0).all()
        subnormal, zero_scale = residue == 5, residue == 9
        if general:
            want = (torch.arange(scales.numel())[subnormal] % 7 + 1).to(torch.uint8)
            assert torch.equal(scales[subnormal], want)
            assert (scales[zero_scale] == 0).all()
            assert (codes[zero_scale] != 0).any()  # the random codes kept
            kept = ~(zero_codes | subnormal | zero_scale)
        else:
            kept = ~zero_codes
        assert torch.equal(scales[kept], old_scales[kept])
        assert torch.equal(codes[~zero_codes], old_codes[~zero_codes])
        assert int(zero_codes.sum()) == (scales.numel() + 12) // 13


def test_random_inputs_and_routing() -> None:
    hidden, weights, ids = moe_setup.random_inputs(16, SMALL, seed=3, device="cpu")
    assert (hidden.shape, hidden.dtype) == ((16, SMALL.hidden), torch.bfloat16)
    assert (weights.shape, weights.dtype, ids.dtype) == ((16, 2), torch.float32, torch.int32)
    assert all(len(set(row)) == SMALL.top_k for row in ids.tolist())  # distinct experts
    assert bool((weights[:, 0] >= weights[:, 1]).all())  # the top expert first
    # A softmax over the top k: sums to one up to FP32 rounding.
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(16), rtol=0, atol=2**-22)
    again = moe_setup.random_inputs(16, SMALL, seed=3, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip((hidden, weights, ids), again, strict=True))


def test_random_nvfp4_weights_global_scale() -> None:
    """The global factor is spread over [0.5, 1.5] times rms / (RMS of the block scales * RMS
    of E2M1 codes), which are sqrt(28672) and sqrt(68.5 / 8)."""
    gen = torch.Generator().manual_seed(0)
    _, _, global_scale = moe_setup.random_nvfp4_weights(
        64, 16, 32, 0.5, device="cpu", generator=gen
    )
    unit = 0.5 / (28672**0.5 * (68.5 / 8) ** 0.5)
    assert bool(((global_scale >= 0.5 * unit) & (global_scale <= 1.5 * unit)).all())
    assert round(moe_setup.BLOCK_SCALE_RMS**2, 6) == 28672.0


SWITCH_CASES = [
    ({"experts/nvfp4_emulation_moe.py": "x = 1\n"}, False),
    ({"experts/nvfp4_emulation_moe.py": 'os.environ.get("VLLM_PATCHSET_NVFP4_PORTABLE")\n'}, True),
    ({"experts/nvfp4_cuda_path.py": "VLLM_PATCHSET_NVFP4_PORTABLE = 1\n"}, True),
    ({"../../../envs.py": "VLLM_PATCHSET_NVFP4_PORTABLE\n"}, False),  # outside the MoE code
]


@pytest.mark.parametrize(("files", "switch"), SWITCH_CASES)
def test_has_portable_switch(tmp_path, files: dict[str, str], switch: bool) -> None:
    moe_dir = tmp_path / "vllm" / "model_executor" / "layers" / "fused_moe"
    for name, text in files.items():
        (moe_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (moe_dir / name).write_text(text)
    assert moe_setup.has_portable_switch(tmp_path / "vllm") is switch


TOPOLOGICAL_CASES = [
    ([1, 2, 3], [(1, 2), (2, 3)], [1, 2, 3]),
    ([3, 1, 2], [(1, 2), (2, 3)], [1, 2, 3]),  # the driver's order is not the chain's
    ([4, 1, 2], [(1, 2)], [4, 1, 2]),  # ties: in the order given
    ([], [], []),
]


@pytest.mark.parametrize(("nodes", "edges", "order"), TOPOLOGICAL_CASES)
def test_graph_nodes_in_dependency_order(
    nodes: list[int], edges: list[tuple[int, int]], order: list[int]
) -> None:
    assert cuda_graphs._topological(nodes, edges) == order


def test_kernel_breakdown_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU here: the breakdown runs in the benchmark")
    with pytest.raises(cuda_graphs.BreakdownUnavailable) as exc:
        cuda_graphs.kernel_breakdown(lambda: None, 1)
    assert str(exc.value) == "needs CUDA (the driver API lists the graph's nodes)"


# Every layer the benchmark knows, exactly: (name, E, H, I, top-k, local experts, shard).
EXPECTED_SHAPES = [
    ("qwen3-30b-a3b", 128, 2048, 768, 8, 0, "whole"),
    ("qwen3-30b-a3b-tp2", 128, 2048, 384, 8, 0, "tp2"),
    ("qwen3-30b-a3b-tp4", 128, 2048, 192, 8, 0, "tp4"),
    ("qwen3-30b-a3b-tp8", 128, 2048, 96, 8, 0, "tp8"),
    ("qwen3-235b-a22b", 128, 4096, 1536, 8, 0, "whole"),
    ("qwen3-235b-a22b-tp2", 128, 4096, 768, 8, 0, "tp2"),
    ("qwen3-235b-a22b-tp4", 128, 4096, 384, 8, 0, "tp4"),
    ("qwen3-235b-a22b-tp8", 128, 4096, 192, 8, 0, "tp8"),
    ("qwen3.5-397b-a17b", 512, 4096, 1024, 10, 0, "whole"),
    ("qwen3.5-397b-a17b-tp2", 512, 4096, 512, 10, 0, "tp2"),
    ("qwen3.5-397b-a17b-tp4", 512, 4096, 256, 10, 0, "tp4"),
    ("qwen3.5-397b-a17b-tp8", 512, 4096, 128, 10, 0, "tp8"),
    ("qwen3.5-397b-a17b-ep8", 512, 4096, 1024, 10, 64, "ep8"),
    ("qwen3.6-35b-a3b", 256, 2048, 512, 8, 0, "whole"),
    ("qwen3.6-35b-a3b-tp2", 256, 2048, 256, 8, 0, "tp2"),
    ("qwen3.6-35b-a3b-tp4", 256, 2048, 128, 8, 0, "tp4"),
    ("qwen3.6-35b-a3b-tp8", 256, 2048, 64, 8, 0, "tp8"),
    ("deepseek-r1", 256, 7168, 2048, 8, 0, "whole"),
    ("deepseek-r1-tp2", 256, 7168, 1024, 8, 0, "tp2"),
    ("deepseek-r1-tp4", 256, 7168, 512, 8, 0, "tp4"),
    ("deepseek-r1-tp8", 256, 7168, 256, 8, 0, "tp8"),
    ("deepseek-r1-ep8", 256, 7168, 2048, 8, 32, "ep8"),
    ("kimi-k2", 384, 7168, 2048, 8, 0, "whole"),
    ("kimi-k2-tp2", 384, 7168, 1024, 8, 0, "tp2"),
    ("kimi-k2-tp4", 384, 7168, 512, 8, 0, "tp4"),
    ("kimi-k2-tp8", 384, 7168, 256, 8, 0, "tp8"),
    ("kimi-k2-ep8", 384, 7168, 2048, 8, 48, "ep8"),
    ("glm-5", 256, 6144, 2048, 8, 0, "whole"),
    ("glm-5-tp2", 256, 6144, 1024, 8, 0, "tp2"),
    ("glm-5-tp4", 256, 6144, 512, 8, 0, "tp4"),
    ("glm-5-tp8", 256, 6144, 256, 8, 0, "tp8"),
    ("minimax-m2.5", 256, 3072, 1536, 8, 0, "whole"),
    ("minimax-m2.5-tp2", 256, 3072, 768, 8, 0, "tp2"),
    ("minimax-m2.5-tp4", 256, 3072, 384, 8, 0, "tp4"),
    ("minimax-m2.5-tp8", 256, 3072, 192, 8, 0, "tp8"),
    # 704 / 8 = 88 and 1856 / 8 = 232 are not multiples of 16: no TP8 shard.
    ("gemma-4-26b-a4b", 128, 2816, 704, 8, 0, "whole"),
    ("gemma-4-26b-a4b-tp2", 128, 2816, 352, 8, 0, "tp2"),
    ("gemma-4-26b-a4b-tp4", 128, 2816, 176, 8, 0, "tp4"),
    ("nemotron-3-nano-30b-a3b", 128, 2688, 1856, 6, 0, "whole"),
    ("nemotron-3-nano-30b-a3b-tp2", 128, 2688, 928, 6, 0, "tp2"),
    ("nemotron-3-nano-30b-a3b-tp4", 128, 2688, 464, 6, 0, "tp4"),
    ("llama-4-maverick", 128, 5120, 8192, 1, 0, "whole"),
    ("llama-4-maverick-tp2", 128, 5120, 4096, 1, 0, "tp2"),
    ("llama-4-maverick-tp4", 128, 5120, 2048, 1, 0, "tp4"),
    ("llama-4-maverick-tp8", 128, 5120, 1024, 1, 0, "tp8"),
    ("llama-4-scout", 16, 5120, 8192, 1, 0, "whole"),
    ("llama-4-scout-tp2", 16, 5120, 4096, 1, 0, "tp2"),
    ("llama-4-scout-tp4", 16, 5120, 2048, 1, 0, "tp4"),
    ("llama-4-scout-tp8", 16, 5120, 1024, 1, 0, "tp8"),
]


def test_shapes_from_the_checkpoints() -> None:
    got = [
        (s.name, s.experts, s.hidden, s.intermediate, s.top_k, s.local_experts, s.shard)
        for s in moe_setup.SHAPES
    ]
    assert got == EXPECTED_SHAPES
    assert moe_setup.SHAPES[0].name == "qwen3-30b-a3b"  # test_batch_invariance.py's shape


def test_shapes_carry_their_checkpoint() -> None:
    shared = {s.checkpoint: s.shared_experts for s in moe_setup.SHAPES}
    assert shared == {
        "qwen3-30b-a3b": 0,
        "qwen3-235b-a22b": 0,
        "qwen3.5-397b-a17b": 1,
        "qwen3.6-35b-a3b": 1,
        "deepseek-r1": 1,
        "kimi-k2": 1,
        "glm-5": 1,
        "minimax-m2.5": 0,
        "gemma-4-26b-a4b": 0,
        "nemotron-3-nano-30b-a3b": 1,
        "llama-4-maverick": 1,
        "llama-4-scout": 1,
    }
    assert all(s.name.startswith(s.checkpoint) for s in moe_setup.SHAPES)


def test_a_new_checkpoint_is_one_row() -> None:
    row = moe_setup.Checkpoint("new-moe", 64, 1024, 480, 4, 2, ep_degrees=(4, 8))
    got = [
        (s.name, s.experts, s.intermediate, s.local_experts, s.held_experts, s.shared_experts)
        for s in moe_setup.checkpoint_shapes(row)
    ]
    # 480 / 4 = 120 and 480 / 8 = 60 are not multiples of 16.
    assert got == [
        ("new-moe", 64, 480, 0, 64, 2),
        ("new-moe-tp2", 64, 240, 0, 64, 2),
        ("new-moe-ep4", 64, 480, 16, 16, 2),
        ("new-moe-ep8", 64, 480, 8, 8, 2),
    ]
    with pytest.raises(ValueError) as exc:
        moe_setup.checkpoint_shapes(moe_setup.Checkpoint("odd", 6, 64, 64, 2, ep_degrees=(4,)))
    assert str(exc.value) == "odd: 6 experts do not split over EP4"


ALIAS_CASES = [
    ("e128-h4096-i1536", "qwen3-235b-a22b"),
    ("qwen3-235b-a22b", "qwen3-235b-a22b"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b"),
    ("kimi-k2-ep8", "kimi-k2-ep8"),
]


@pytest.mark.parametrize(("name", "canonical"), ALIAS_CASES)
def test_shape_named(name: str, canonical: str) -> None:
    assert moe_setup.shape_named(name).name == canonical


def test_shape_named_unknown() -> None:
    with pytest.raises(KeyError) as exc:
        moe_setup.shape_named("nope")
    assert exc.value.args[0].startswith("unknown MoE shape 'nope'; known: qwen3-30b-a3b, ")
    assert exc.value.args[0].endswith(", or sizes e<E>-h<H>-i<I>-k<top-k>[-ep<N>]")


def test_a_layer_named_by_its_sizes() -> None:
    """A checkpoint the table lacks: its layer by sizes, whole or as an expert-parallel rank."""
    got = [moe_setup.shape_named(n) for n in ("e64-h3584-i1280-k6", "e256-h7168-i2048-k8-ep8")]
    assert [dataclasses.astuple(s) for s in got] == [
        ("e64-h3584-i1280-k6", 64, 3584, 1280, 6, 0, "", "whole", 0),
        ("e256-h7168-i2048-k8-ep8", 256, 7168, 2048, 8, 32, "", "ep8", 0),
    ]
    assert got[1].held_experts == 32


# Each way a name's sizes make no NVFP4 MoE layer, and the one line that says so.
NO_LAYER = [
    ("e8-h100-i64-k2", "hidden and intermediate sizes are multiples of 16 (NVFP4)"),
    ("e8-h64-i40-k2", "hidden and intermediate sizes are multiples of 16 (NVFP4)"),
    ("e8-h0-i64-k2", "hidden and intermediate sizes are multiples of 16 (NVFP4)"),
    ("e8-h64-i0-k2", "hidden and intermediate sizes are multiples of 16 (NVFP4)"),
    ("e8-h64-i64-k0", "top-k is 1 to the 8 experts"),
    ("e8-h64-i64-k9", "top-k is 1 to the 8 experts"),
    ("e0-h64-i64-k1", "top-k is 1 to the 0 experts"),
    ("e8-h64-i64-k2-ep3", "8 experts do not split over EP3"),
    ("e8-h64-i64-k2-ep1", "8 experts do not split over EP1"),
    ("e8-h64-i64-k2-ep16", "8 experts do not split over EP16"),
    ("e8-h64-i64-k2-ep0", "8 experts do not split over EP0"),
]


@pytest.mark.parametrize(("name", "why"), NO_LAYER)
def test_sizes_of_no_layer_refused(name: str, why: str) -> None:
    with pytest.raises(ValueError) as exc:
        moe_setup.shape_named(name)
    assert str(exc.value) == f"{name}: {why}"


def test_test_shapes_are_the_first_two() -> None:
    """The GPU tests keep the two shapes they always ran (their runtime stays bounded)."""
    assert [(s.name, s.intermediate) for s in moe_setup.TEST_SHAPES] == [
        ("qwen3-30b-a3b", 768),
        ("qwen3-235b-a22b", 1536),
    ]


EP = moe_setup.MoeShape("ep", experts=8, hidden=64, intermediate=32, top_k=3, local_experts=2)


def test_expert_parallel_weights_and_map() -> None:
    """An expert-parallel rank holds E / N experts' weights, and maps global ids 0 .. E/N - 1
    to them (vLLM's linear placement, rank 0)."""
    moe = moe_setup.make_moe(EP, seed=0, device="cpu")
    assert (moe.w13.shape[0], moe.w2.shape[0], moe.w13_gscale.shape) == (2, 2, (2,))
    emap = moe_setup.expert_map(EP, "cpu")
    assert emap is not None and emap.tolist() == [0, 1, -1, -1, -1, -1, -1, -1]
    assert moe_setup.expert_map(SMALL, "cpu") is None


def test_local_routing() -> None:
    weights = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]])
    ids = torch.tensor([[1, 5, 0], [7, 6, 2]], dtype=torch.int32)
    local_w, local_ids = moe_setup.local_routing(EP, weights, ids)
    assert local_w.tolist() == [[0.5, 0.0, pytest.approx(0.2)], [0.0, 0.0, 0.0]]
    assert (local_ids.tolist(), local_ids.dtype) == ([[1, 0, 0], [0, 0, 0]], torch.int32)
    assert moe_setup.active_experts(EP, ids) == 2
    assert moe_setup.active_experts(EP, ids[1:]) == 0
    assert moe_setup.active_experts(SMALL, ids) == 6
    same = moe_setup.local_routing(SMALL, weights, ids)
    assert same[0] is weights and same[1] is ids


def test_rank_routing() -> None:
    """Rank r's view of the routing in rank 0's ids: its experts (2r, 2r + 1 of 8) local."""
    ids = torch.tensor([[1, 5, 0], [7, 6, 2]], dtype=torch.int32)
    views = [moe_setup.rank_routing(EP, ids, r) for r in range(moe_setup.ranks(EP))]
    assert [v.tolist() for v in views] == [
        [[1, 5, 0], [7, 6, 2]],
        [[7, 3, 6], [5, 4, 0]],
        [[5, 1, 4], [3, 2, 6]],
        [[3, 7, 2], [1, 0, 4]],
    ]
    assert {v.dtype for v in views} == {torch.int32}
    assert [moe_setup.active_experts(EP, v) for v in views] == [2, 1, 1, 2]
    assert (moe_setup.ranks(EP), moe_setup.ranks(SMALL)) == (4, 1)
    assert moe_setup.busiest_rank(EP, ids) == 0
    # Rank 0 routes none of this token's experts; ranks 1-3 one each: the first of them.
    assert moe_setup.busiest_rank(EP, torch.tensor([[5, 6, 2]], dtype=torch.int32)) == 1
    assert moe_setup.busiest_rank(SMALL, ids) == 0


def test_expert_parallel_reference_is_the_whole_layers_share() -> None:
    """What the benchmark checks an EP rank against: the reference over the rank's experts
    (make_moe's) with local_routing equals the whole layer's reference with the other ranks'
    experts weighted zero (what tests/gpu/test_fused_nvfp4_emulation.py checks EP by)."""
    whole_shape = dataclasses.replace(EP, local_experts=0)
    whole = moe_setup.make_moe(whole_shape, seed=3, device="cpu")
    rank = dataclasses.replace(
        whole,
        **{k: getattr(whole, k)[:2] for k in ("w13", "w13_scale", "w13_gscale")},
        **{k: getattr(whole, k)[:2] for k in ("w2", "w2_scale", "w2_gscale")},
    )
    hidden, weights, ids = moe_setup.random_inputs(6, EP, seed=4, device="cpu")
    local_w, local_ids = moe_setup.local_routing(EP, weights, ids)
    got = nvfp4.nvfp4_moe_reference(rank, hidden, local_w, local_ids, exact=True)
    masked = weights * torch.isin(ids, torch.tensor([0, 1], dtype=ids.dtype))
    want = nvfp4.nvfp4_moe_reference(whole, hidden, masked, ids, exact=True)
    assert bool(masked.any()) and bool((masked == 0).any())  # both kinds of tokens
    assert torch.equal(got, want)
