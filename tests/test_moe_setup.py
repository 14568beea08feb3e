"""The GPU layer setup (tests/gpu/moe_setup.py) and capture helper (tests/gpu/cuda_graphs.py) on
the CPU: they import with no vLLM and no GPU (vLLM is imported only once a tree is chosen), and
their weights, scales and routing are what the GPU tests and the benchmark rely on."""

from __future__ import annotations

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
