"""Patch 0002's split-K w13 GEMM under Triton's interpreter (TRITON_INTERPRET=1) on the CPU: the
decode bucket's w13 chunks, each a program of its own whose FP32 sums a pass of its own adds up
(``partials``, ``_w13_reduce_kernel``), give the same bits as a program that loops over the
chunks itself; and both agree with the pure-torch reference (tests/gpu/nvfp4_reference.py).

The w13 GEMM sums its K steps of 128 columns in chunks of W13_CHUNK_STEPS (4) steps, each
chunk from zero, the masked step of a ragged depth in the last chunk, then the chunks in order
from 0.0, whatever the token count and tile: that is what makes the split path's bits the
in-program path's, and a token's output the same alone and in any batch (the GPU proof:
tests/gpu/test_batch_invariance.py). Cases:

- depths K (the hidden size) below, at and above one chunk (512 columns), ragged ones among
  them (16, 48, 192, 640, 704, 1856: the masked step), one block per (token, expert) pair
  (``naive``, the decode bucket's blocks) and sorted blocks of 16 (split_k on another bucket,
  or with an expert map whose -1 entries the sum's pass writes as zeros): the launcher's
  ``act`` with and without ``partials``, ``torch.equal``; and each against the reference's
  SiLU-and-mul quantized with a2_gscale (exact W4A4), under tests/test_kernels_interpret.py's
  bounds (relative Frobenius error under 1e-2, 99.5% of the elements within atol 1e-2 + 2
  FP16 ulps: the GEMMs' FP32 sums run in another order than torch's, and an activation on an
  E2M1 rounding boundary may take the other neighbour);
- the experts' own ``apply`` at 1 and 2 tokens (the decode bucket's naive blocks) with ROCm's
  generic table as it ships (split_k in that bucket) and with split_k off: the same output bits;
- a regression pin, crafted: one row's four K steps sum to 2**20, 2**-4, 2**-4, -2**20. In one
  chunk of four steps FP32 gives 0 (2**20 + 2**-4 is a tie, kept at 2**20); in chunks of two,
  2**-4 (2**-4 - 2**20 is exact). The GEMM's SiLU-and-mul output of that row is then zero with
  W13_CHUNK_STEPS = 4, both paths, and not zero with the chunk depth set to 2: a chunking other
  than the one both paths share changes the bits, so the equality above is no accident of
  data that sums alike in any order.

FP16 activations: the interpreter's BF16 dot is wrong (tests/test_kernels_interpret.py; BF16 is
mended by kernels.fix_interpreter, but FP16 needs no mending and the paths' equality does not
depend on the dtype). Portable kernels (the interpreter runs no inline PTX).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the kernels run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton's interpreter runs the kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import kernels
import moe_setup
import standins
from nvfp4_reference import SIGN_BIT as SIGN
from nvfp4_reference import dequantize, pack, quant_dequant
from vllm_install import Overlay, Pristine

# Depths (the w13 GEMM's K): below one chunk, one, and more; ragged ones (a masked last step)
# below and above a chunk, and one whose masked step starts a chunk of its own (640 = 5 * 128:
# no; 2048 + 16 would, at minutes interpreted: 640 is a chunk and a step, 1856 = 3 chunks and
# a half plus 64 columns).
DEPTHS = (16, 48, 128, 192, 512, 640, 704, 1856, 2048)
EXPERTS, INTERMEDIATE, TOP_K, TOKENS = 4, 32, 2, 3
# (blocks, expert map): naive (one block per pair); sorted blocks of 16; sorted with an
# expert map (this rank holds the even experts: the odd ones' rows are zeros).
BLOCKS = (("naive", False), ("sorted", False), ("sorted", True))
BLOCK_M = 16  # ROCm's smallest token block (platform_min_block_m)
GEMM_CASES = [(depth, blocks, ep) for depth in DEPTHS for blocks, ep in BLOCKS]
GEMM_IDS = [f"k{depth}-{blocks}{'-ep' if ep else ''}" for depth, blocks, ep in GEMM_CASES]
APPLY_DEPTHS = (192, 704)
APPLY_CASES = [(depth, tokens) for depth in APPLY_DEPTHS for tokens in (1, 2)]
APPLY_IDS = [f"k{depth}-{tokens}tok" for depth, tokens in APPLY_CASES]
REL_FROBENIUS = 1e-2  # module docstring (tests/test_kernels_interpret.py's bounds)
ATOL, RTOL, MIN_CLOSE = 1e-2, 2e-3, 0.995


@pytest.fixture(scope="module")
def results(
    overlay: Overlay, full_pristine: Pristine, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Every case run once, under the interpreter, in a child process (kernels.run_interpreted)."""
    out = tmp_path_factory.mktemp("split_k") / "results.pt"
    overlay_vllm, pristine_vllm = overlay.project.overlay_dir / "vllm", full_pristine.root / "vllm"
    results: dict[str, Any] = kernels.run_interpreted(__file__, overlay_vllm, pristine_vllm, out)
    return results


@pytest.mark.parametrize("case", GEMM_IDS)
def test_split_and_in_program_same_bits(results: dict[str, Any], case: str) -> None:
    got = results["gemm"][case]
    assert not got["split"].isnan().any(), "act elements left unwritten (NaN)"
    assert torch.equal(got["split"], got["in_program"])


@pytest.mark.parametrize("case", GEMM_IDS)
def test_split_matches_reference(results: dict[str, Any], case: str) -> None:
    got, want = (results["gemm"][case][k].float() for k in ("split", "reference"))
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < REL_FROBENIUS, f"relative Frobenius error {rel:.2e}"
    close = ((got - want).abs() <= ATOL + RTOL * want.abs()).float().mean().item()
    assert close >= MIN_CLOSE, f"only {close:.4f} of the elements within atol/rtol"


def test_expert_map_rows_are_zeros(results: dict[str, Any]) -> None:
    """With the expert map, the pairs routed to other ranks' experts: zeros from the sum's
    pass, as the GEMM writes them without split-K (and the reference has them zero)."""
    for depth in DEPTHS:
        got = results["gemm"][f"k{depth}-sorted-ep"]
        off_rank = got["off_rank"]
        assert off_rank.any() and not got["split"][off_rank].any()


@pytest.mark.parametrize("case", APPLY_IDS)
def test_apply_split_k_on_and_off_same_bits(results: dict[str, Any], case: str) -> None:
    got = results["apply"][case]
    assert got["launched_reduce"] and not got["launched_reduce_off"]
    assert not got["on"].isnan().any()
    assert torch.equal(got["on"], got["off"])


def test_other_chunking_changes_bits(results: dict[str, Any]) -> None:
    pin = results["pin"]
    assert pin["chunks_of_4"]["split"][0, 0].item() == 0.0
    assert torch.equal(pin["chunks_of_4"]["split"], pin["chunks_of_4"]["in_program"])
    assert torch.equal(pin["chunks_of_2"]["split"], pin["chunks_of_2"]["in_program"])
    assert pin["chunks_of_2"]["split"][0, 0].item() != 0.0


# -- the child process ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class W13:
    """One w13 GEMM's operands: packed weights [E, 2I, K / 2] and block scales (the
    checkpoint's rows, and copies in the kernel's tiled layout), per-expert global scales, the
    quantized activations (e2m1 * block scale, FP16) and their global scale, a2_gscale."""

    w: torch.Tensor
    w_scale: torch.Tensor
    w_gscale: torch.Tensor
    a: torch.Tensor
    a_gscale: torch.Tensor
    out_gscale: torch.Tensor


def launch(
    module: Any, op: W13, ids: torch.Tensor, blocks: str, emap: torch.Tensor | None, split: bool
) -> torch.Tensor:
    """The launcher's w13 GEMM (gated, SiLU-and-mul, QDQ with out_gscale) on tiled weights,
    act [pairs, I] (NaN first: an unwritten element shows)."""
    pairs, n_out, top_k = ids.numel(), op.w.size(1) // 2, ids.size(1)
    depth = op.a.size(1)
    if blocks == "naive":
        assert emap is None
        sorted_ids, expert_ids, post_pad = None, ids.view(-1), None
    else:
        sorted_ids, expert_ids, post_pad = module.moe_align_block_size(
            ids, BLOCK_M, op.w.size(0) if emap is None else emap.numel(), emap
        )
    w, w_scale = op.w.clone(), op.w_scale.clone()
    module.tile_nvfp4_weights(w, w_scale)
    act = torch.full((pairs, n_out), float("nan"), dtype=op.a.dtype)
    config = module.ROCM_CONFIGS[4].w13
    partials = module.w13_split_partials(pairs, n_out, depth, op.a.device) if split else None
    module.invoke_nvfp4_moe_gemm(
        op.a, op.a_gscale, w, w_scale, op.w_gscale, act, op.out_gscale, None, sorted_ids,
        expert_ids, post_pad, pairs, top_k, gated=True, block_m=BLOCK_M, config=config,
        ptx=False, tiled=True, partials=partials,
    )  # fmt: skip
    return act


def reference_act(op: W13, hidden_q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Exact W4A4 (the reference's ``exact``): FP32 GEMM of the dequantized operands,
    SiLU-and-mul in FP32, quantized with a2_gscale, as act holds it: e2m1 * block scale (the
    dequantized value times a2_gscale), FP16."""
    rows = []
    for pair, expert in enumerate(ids.view(-1).tolist()):
        w = dequantize(op.w[expert], op.w_scale[expert], op.w_gscale[expert])
        h = hidden_q[pair // TOP_K] @ w.T
        gate, up = h.chunk(2)
        rows.append(torch.nn.functional.silu(gate) * up)
    act = quant_dequant(torch.stack(rows), op.out_gscale) * op.out_gscale
    return act.to(torch.float16)


def gemm_case(module: Any, depth: int, blocks: str, ep: bool) -> dict[str, torch.Tensor]:
    shape = moe_setup.MoeShape(f"k{depth}", EXPERTS, depth, INTERMEDIATE, TOP_K)
    moe = moe_setup.make_moe(shape, seed=depth, device="cpu")
    hidden, _, ids = moe_setup.random_inputs(TOKENS, shape, seed=1, device="cpu")
    hidden = hidden.to(torch.float16)
    a = module.invoke_nvfp4_qdq(hidden, moe.a13_gscale)
    emap, local = None, ids
    if ep:
        emap = torch.where(torch.arange(EXPERTS) % 2 == 0, torch.arange(EXPERTS) // 2, -1).int()
        local = emap[ids.long()]
    pick = torch.arange(0, EXPERTS, 2) if ep else torch.arange(EXPERTS)
    op = W13(moe.w13[pick], moe.w13_scale[pick], moe.w13_gscale[pick], a, moe.a13_gscale,
             moe.a2_gscale)  # fmt: skip
    out = {
        "split": launch(module, op, ids, blocks, emap, split=True),
        "in_program": launch(module, op, ids, blocks, emap, split=False),
    }
    hidden_q = quant_dequant(hidden.float(), moe.a13_gscale)
    want = reference_act(op, hidden_q, local.clamp(min=0))
    off_rank = (local.view(-1) < 0)[:, None].expand_as(want)
    out["reference"] = torch.where(off_rank, 0.0, want.float()).to(torch.float16)
    out["off_rank"] = off_rank
    return out


def apply_case(fused: kernels.FusedModule, depth: int, tokens: int) -> dict[str, Any]:
    """The experts' apply with ROCm's generic table (split_k in its decode bucket), then with
    split_k off there; 16 experts: naive blocks at 1 and 2 tokens (tokens * top_k * 4 <=
    experts); which kernels ran."""
    from triton.runtime.interpreter import InterpretedFunction

    module = fused.module
    table = module.ROCM_CONFIGS  # the generic table apply takes (the one GENERIC_CONFIGS holds)
    shape = moe_setup.MoeShape(f"k{depth}", 16, depth, INTERMEDIATE, TOP_K)
    moe = moe_setup.make_moe(shape, seed=depth, device="cpu")
    hidden, weights, ids = moe_setup.random_inputs(tokens, shape, seed=2, device="cpu")
    hidden = hidden.to(torch.float16)
    config = kernels.quant_config(
        moe.w13_scale.clone(), moe.w2_scale.clone(), moe.w13_gscale, moe.w2_gscale,
        moe.a13_gscale, moe.a2_gscale,
    )  # fmt: skip
    experts = fused.experts(None, config)
    w13, w2 = kernels.laid_out(experts, moe.w13, moe.w2)
    original = InterpretedFunction.run
    out: dict[str, Any] = {}
    decode = table[4]
    assert decode.split_k and decode.naive
    for name, entry in (("on", decode), ("off", dataclasses.replace(decode, split_k=False))):
        launched: list[str] = []

        def spy(self: Any, *args: Any, _launched: list[str] = launched, **kwargs: Any) -> Any:
            _launched.append(self.fn.__name__)
            return original(self, *args, **kwargs)

        table[4] = entry
        InterpretedFunction.run = spy  # type: ignore[method-assign]
        try:
            out[name] = kernels.fused_apply(fused, experts, hidden, w13, w2, weights, ids)
        finally:
            InterpretedFunction.run = original  # type: ignore[method-assign]
            table[4] = decode
        suffix = "" if name == "on" else "_off"
        out["launched_reduce" + suffix] = "_w13_reduce_kernel" in launched
    return out


def pin_operands() -> tuple[W13, torch.Tensor]:
    """The crafted case (module docstring): K = 512 (four steps, one chunk), one expert, row 0
    of the gate: weight 1024 (e2m1 4 times block scale 256) at k = 0 and -1024 at k = 384,
    against activations 1024; weight 2**-4 (e2m1 0.5 times 0.125) at k = 128 and 256, against
    activations 1; row 0 of up: 1 at k = 0 (up = 1024). Global scales 1, every other weight
    zero; one token, top-1."""
    depth, inter = 512, 16
    codes = torch.zeros(2 * inter, depth, dtype=torch.uint8)
    scales = torch.zeros(2 * inter, depth // 16)
    for row, k, code, scale in ((0, 0, 6, 256.0), (0, 384, 6 | SIGN, 256.0),
                                (0, 128, 1, 0.125), (0, 256, 1, 0.125), (inter, 0, 2, 1.0)):  # fmt: skip
        codes[row, k], scales[row, k // 16] = code, scale
    w, w_scale = pack(codes)[None].contiguous(), scales.to(torch.float8_e4m3fn)[None].contiguous()
    values = dequantize(w[0], w_scale[0], 1.0)
    assert values[0, 0] == 1024 and values[0, 384] == -1024 and values[0, 128] == 2.0**-4
    a = torch.zeros(1, depth, dtype=torch.float16)
    a[0, 0] = a[0, 384] = 1024.0
    a[0, 128] = a[0, 256] = 1.0
    one = torch.tensor(1.0)
    return W13(w, w_scale, torch.ones(1), a, one, one), torch.zeros(1, 1, dtype=torch.int32)


def pin(module: Any, kernels_globals: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    """The crafted case's act at the shipped chunk depth (4 steps) and at 2 (the kernel
    module's W13_CHUNK_STEPS, which the launcher and the workspace read, set for the call)."""
    op, ids = pin_operands()
    out = {}
    shipped = kernels_globals["W13_CHUNK_STEPS"]
    for steps in (4, 2):
        kernels_globals["W13_CHUNK_STEPS"] = steps
        try:
            out[f"chunks_of_{steps}"] = {
                "split": launch(module, op, ids, "naive", None, split=True),
                "in_program": launch(module, op, ids, "naive", None, split=False),
            }
        finally:
            kernels_globals["W13_CHUNK_STEPS"] = shipped
    return out


def main(overlay_vllm: str, pristine_vllm: str, out: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    kernels.fix_interpreter()
    fused = kernels.load_fused(
        Path(overlay_vllm), Path(pristine_vllm), standins.moe_align_block_size, rocm=True
    )
    kernels.forbid_unfused(fused)
    module = fused.module
    kernels_globals = module.invoke_nvfp4_moe_gemm.__globals__  # the kernels module's names
    assert kernels_globals["W13_CHUNK_STEPS"] == 4
    gemm = {
        case_id: gemm_case(module, depth, blocks, ep)
        for case_id, (depth, blocks, ep) in zip(GEMM_IDS, GEMM_CASES, strict=True)
    }
    apply = {
        case_id: apply_case(fused, depth, tokens)
        for case_id, (depth, tokens) in zip(APPLY_IDS, APPLY_CASES, strict=True)
    }
    saved = {"gemm": gemm, "apply": apply, "pin": pin(module, kernels_globals)}
    torch.save(saved, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
