"""Patch 0002's fused NVFP4 MoE at GEMM depths that are not multiples of its K step (128), under
Triton's interpreter (TRITON_INTERPRET=1) on the CPU: the depths of released checkpoints and
their tensor-parallel shards (intermediate 16, 48, 96, 192, 704, 1856; hidden 144 and
2704 = 21 * 128 + 16), which the fused path takes since every depth that is a multiple of the
NVFP4 block (16) does.

Each case runs the experts' own ``apply`` (as tests/test_kernels_interpret.py does: the
portable kernels, ROCm's tiles, the interpreter's faults mended) three ways, and the three
outputs are the same bits (``torch.equal``):

- on the weights as ``process_weights_after_loading`` lays them out (tiles of 16 rows by 128
  weights, each block of 16 rows ending with a narrower tile of the last K % 128 weights);
- on the checkpoint's rows (no layout);
- on weights padded to depths of a multiple of 128 with zero E2M1 codes and zero block
  scales, each depth's last K % 128 columns first (``tail_first``; the hidden states and
  the intermediate rows of w13 alike): the masked step, the kernel's first, sums exactly
  what a full step over those columns and zeros sums.

And the output is compared with the pure-torch reference (tests/gpu/nvfp4_reference.py, exact
weights) under the bounds of tests/test_kernels_interpret.py (relative Frobenius error under
1e-2, 99.5% of the elements within atol 1e-2 + 2 ulps: the GEMMs' FP32 sums run in another
order than torch's, and an activation on an E2M1 rounding boundary may take the other
neighbour); and bitwise equal to it in the cases of EXACT, up to two K steps a GEMM
(measured with triton 3.9.0 and torch 2.13.0: the interpreter's FP32 sums then give the
reference's bits; with more steps they part now and then by an FP16 ulp: at intermediate 704,
one element of 384, relative error 1e-6; at hidden 2704 and intermediate 1856 at once, 9 of
2704, 2e-5: a summation order, not a lost column).

``test_the_masked_step_comes_first``: a layer whose FP32 sums give other bits in another K
order (``nvfp4_reference.order_moe``), so that the zero-padded layer with the tail first is the
kernel's order, not one of many that sum alike: the exact output the tail first gives, and 0
from the zero-padded layer with the tail last.

``test_nothing_beyond_k_enters``: the weights and block scales end where a buffer of NaN
(E2M1 code 0xF, block scale 0x7F: FP8 NaN) begins, and the hidden states' rows are followed by
NaN in the workspaces: the masked step reads none of it (0 * NaN would be NaN).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the kernels run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton's interpreter runs the kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import overlay_kernels as kernels
from nvfp4_reference import (
    ORDER_DEPTH,
    ORDER_HIDDEN,
    REL_FROBENIUS,
    in_order,
    nvfp4_moe_reference,
    order_moe,
    order_output,
    padded_columns,
    tail_first,
    zero_padded,
)

# name -> (experts, hidden, intermediate, top-k, tokens, dtype, expert parallelism)
CASES = {
    "i16": (4, 128, 16, 2, 5, "fp16", False),
    "i48": (4, 128, 48, 2, 17, "fp16", False),
    "i96": (4, 128, 96, 2, 1, "fp16", False),
    "h144-i192": (4, 144, 192, 2, 5, "fp16", False),
    "h144-i192-ep": (4, 144, 192, 2, 5, "fp16", True),
    "h144-i192-bf16-sparse": (16, 144, 192, 2, 2, "bf16", False),
    "i704": (4, 128, 704, 2, 3, "fp16", False),
    # Many K steps then the tail, one GEMM at a time (both at once: minutes interpreted).
    "h2704-i192": (2, 2704, 192, 1, 2, "fp16", False),
    "i1856": (2, 128, 1856, 1, 2, "fp16", False),
}
NAN_CASE = "h144-i192"
EXACT = ["i16", "i48", "i96", "h144-i192", "h144-i192-ep", "h144-i192-bf16-sparse"]
ATOL, MIN_CLOSE = 1e-2, 0.995
RTOL = {"fp16": 2e-3, "bf16": 1.6e-2}


# Every case run once, under the interpreter, in a child process (kernels.run_interpreted).
results = kernels.interpreted_results_fixture()


@pytest.mark.parametrize("case", CASES)
def test_ragged_depth_layouts_and_padding_give_the_same_bits(
    results: dict[str, Any], case: str
) -> None:
    got = results["outputs"][case]
    assert not got["tiled"].isnan().any(), "output elements left unwritten (NaN)"
    assert torch.equal(got["tiled"], got["rows"]), "tiled layout != checkpoint rows"
    assert torch.equal(got["tiled"], got["padded"]), "ragged depth != zero-padded depth"


@pytest.mark.parametrize("case", CASES)
def test_ragged_depth_matches_reference(results: dict[str, Any], case: str) -> None:
    got, want = (results["outputs"][case][k].float() for k in ("tiled", "reference"))
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < REL_FROBENIUS, f"relative Frobenius error {rel:.2e}"
    rtol = RTOL[CASES[case][5]]
    close = ((got - want).abs() <= ATOL + rtol * want.abs()).float().mean().item()
    assert close >= MIN_CLOSE, f"only {close:.4f} of the elements within atol/rtol"


@pytest.mark.parametrize("case", EXACT)
def test_ragged_depth_bits_of_reference(results: dict[str, Any], case: str) -> None:
    got, want = (results["outputs"][case][k] for k in ("tiled", "reference"))
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} elements differ"


def test_ragged_cases_take_the_masked_step(results: dict[str, Any]) -> None:
    """The cases run the masked step (K_TAIL) in both GEMMs where both depths are
    ragged, and in w2 alone where only the intermediate size is."""
    tails = results["tails"]
    assert tails["h144-i192"] == [True, True]
    assert tails["i48"] == [False, True]


def test_the_masked_step_comes_first(results: dict[str, Any]) -> None:
    """order_moe's w2 sums +B (its tail), -B (step 0) and 18 (step 1), 18 under half an
    FP32 ulp of B: the tail first gives 18 times the top-k weight, the tail last exactly 0."""
    order = results["order"]
    got, want = order["got"], order["want"]
    differ, zeros = int((got != want).sum()), int((got == 0).sum())
    assert differ == 0, f"{differ} of {got.numel()} elements not the tail-first sum ({zeros} are 0)"
    assert torch.equal(got, order["first"]), "!= the zero-padded layer, tail first"
    assert not order["last"].any(), "the zero-padded layer, tail last: not 0"


def test_nothing_beyond_k_enters(results: dict[str, Any]) -> None:
    got, clean = results["nan"]
    assert not got.isnan().any()
    assert torch.equal(got, clean)


# -- the child process ------------------------------------------------------------------------


def up128(n: int) -> int:
    return -(-n // 128) * 128


def run_case(fused: kernels.FusedModule, case: str) -> dict[str, torch.Tensor]:
    moe, hidden, weights, ids = kernels.case_layer(case, CASES[case])
    _, h, i, _, _, _, ep = CASES[case]
    out = {
        "tiled": kernels.run_experts(fused, moe, hidden, weights, ids, ep=ep),
        "rows": kernels.run_experts(fused, moe, hidden, weights, ids, ep=ep, layout=False),
    }
    wide = padded_columns(hidden, up128(h))
    big = zero_padded(moe, up128(h), up128(i))
    out["padded"] = kernels.run_experts(fused, big, wide, weights, ids, ep=ep)[:, :h].contiguous()
    if ep:
        weights = weights * (ids % 2 == 0)  # the odd experts live on other ranks: zeros
    out["reference"] = nvfp4_moe_reference(moe, hidden, weights, ids, exact=True)
    out["exact"] = torch.tensor(torch.equal(out["tiled"], out["reference"]))
    return out


def nan_beyond(t: torch.Tensor, fill: int) -> torch.Tensor:
    """A copy of ``t`` (contiguous) at the start of a buffer whose bytes after it are
    ``fill``."""
    raw = t.contiguous().view(torch.uint8).flatten()
    buf = torch.full((raw.numel() + 4096,), fill, dtype=torch.uint8)
    buf[: raw.numel()] = raw
    return buf[: raw.numel()].view(t.dtype).view(t.shape)


def nan_case(fused: kernels.FusedModule) -> tuple[torch.Tensor, torch.Tensor]:
    moe, hidden, weights, ids = kernels.case_layer(NAN_CASE, CASES[NAN_CASE])
    clean = kernels.run_experts(fused, moe, hidden, weights, ids, layout=False)
    poisoned = dataclasses.replace(
        moe,
        w13=nan_beyond(moe.w13, 0xFF),
        w2=nan_beyond(moe.w2, 0xFF),
        w13_scale=nan_beyond(moe.w13_scale, 0x7F),
        w2_scale=nan_beyond(moe.w2_scale, 0x7F),
    )
    config = kernels.quant_config(
        poisoned.w13_scale,
        poisoned.w2_scale,
        moe.w13_gscale,
        moe.w2_gscale,
        moe.a13_gscale,
        moe.a2_gscale,
    )
    experts = fused.experts(None, config)
    got = kernels.fused_apply(fused, experts, hidden, poisoned.w13, poisoned.w2, weights, ids)
    return got, clean


# (experts, hidden, intermediate, top-k, tokens, dtype, expert parallelism), as CASES
ORDER_CASE = (8, 128, ORDER_DEPTH, 2, 32, "fp16", False)


def order_case(fused: kernels.FusedModule) -> dict[str, torch.Tensor]:
    """nvfp4_reference.order_moe's layer (eight experts, top-2, 32 tokens, FP16): the kernel's
    output, the zero-padded layer's with the tail first and last, and the output the tail
    first gives (order_output)."""
    _, hidden, weights, ids = kernels.case_layer("order", ORDER_CASE)  # its inputs alone
    moe = order_moe(ORDER_CASE[0])
    hidden.fill_(ORDER_HIDDEN)
    wide = padded_columns(hidden, 128)
    out = {"got": kernels.run_experts(fused, moe, hidden, weights, ids)}
    for name, place in (("first", tail_first), ("last", in_order)):
        padded = zero_padded(moe, 128, up128(ORDER_DEPTH), place)
        out[name] = kernels.run_experts(fused, padded, wide, weights, ids)
    out["want"] = order_output(weights, hidden.dtype)
    return out


def main(overlay_vllm: str, pristine_vllm: str, out: str) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    fused = kernels.interpreted_fused(overlay_vllm, pristine_vllm)
    tails: dict[str, list[bool]] = {}
    original = InterpretedFunction.run
    outputs = {}
    for case in CASES:
        seen: list[bool] = []

        def spy(self: Any, *args: Any, _seen: list[bool] = seen, **kwargs: Any) -> Any:
            if "K_TAIL" in kwargs:
                _seen.append(bool(kwargs["K_TAIL"]))
            return original(self, *args, **kwargs)

        InterpretedFunction.run = spy  # type: ignore[method-assign]
        try:
            result = run_case(fused, case)
        finally:
            InterpretedFunction.run = original  # type: ignore[method-assign]
        tails[case] = seen[:2]  # the first apply's w13 and w2 GEMMs
        outputs[case] = result
    results = {
        "outputs": outputs,
        "tails": tails,
        "nan": nan_case(fused),
        "order": order_case(fused),
    }
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
