"""How far each NVFP4 MoE arithmetic is from exact W4A4, on the CPU (pure torch, no GPU).

    python benchmarks/w4a4_roundings.py [--shapes NAME ...] [--tokens N] [--out DIR]

One MoE layer (tests/gpu/moe_setup.py's seeded NVFP4 experts and routing, BF16 hidden states of
unit RMS) computed three ways, each against the same layer in float64 (the NVFP4 weights and
both activations' NVFP4 quantization with 0.24.0's block scales and E2M1 rounding, nothing
rounded between the GEMMs):

- ``0.24.0``: vLLM 0.24.0's unfused emulation (tests/gpu/nvfp4_reference.py
  ``nvfp4_moe_reference``): every dequantized weight and activation rounded to BF16 with its
  global scale, the w13 output, silu and silu * up rounded to BF16;
- ``weights``: the weights exact, every activation rounding of 0.24.0 kept (patch 0002's
  arithmetic until 2026-12-02, 11:00 UTC: the GPU figures measured before then);
- ``exact``: patch 0002's arithmetic (``nvfp4_moe_reference(..., exact=True)``: the weights and
  quantized activations unrounded, FP32 between the GEMMs, each expert's output rounded to
  BF16), what a Blackwell NVFP4 GEMM computes;
- ``floor``: the float64 output rounded to BF16, what no BF16 output can beat.

Each BF16 rounding before the intermediate's quantization moves values across E2M1 rounding
boundaries, a whole FP4 step each time: that, not the roundings' own size, is what puts
0.24.0's arithmetic percents away. Output: the relative Frobenius errors on stdout and in
``w4a4_roundings_cpu.{json,md}`` under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import stops
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "gpu"), str(REPO / "benchmarks")]
import moe_setup  # noqa: E402
from engine_check.reference import Experts, experts_forward  # noqa: E402
from nvfp4_reference import (  # noqa: E402
    Nvfp4Moe,
    dequantize,
    moe_reference,
    nvfp4_moe_reference,
    quant_dequant,
)

F64 = torch.float64
DEFAULT_SHAPES = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4", "gemma-4-26b-a4b")


def float64_experts(moe: Nvfp4Moe) -> Experts:
    """``moe`` as the engine check's float64 reference holds a layer's experts (W4A4)."""
    experts = range(moe.w13.size(0))
    return Experts(
        torch.stack(
            [dequantize(moe.w13[e], moe.w13_scale[e], moe.w13_gscale[e], F64) for e in experts]
        ),
        torch.stack(
            [dequantize(moe.w2[e], moe.w2_scale[e], moe.w2_gscale[e], F64) for e in experts]
        ),
        moe.a13_gscale.to(F64),
        moe.a2_gscale.to(F64),
    )


def exact_weights_moe(
    moe: Nvfp4Moe, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The weights exact, the activations' quantization and the intermediates rounded to x's
    dtype as 0.24.0 rounds them (``moe_reference``'s GEMMs)."""

    def rounded(gscale: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: quant_dequant(t, gscale).to(x.dtype).float()

    return moe_reference(
        x,
        topk_weights,
        topk_ids,
        lambda e: moe.dequantized(e, None),
        rounded(moe.a13_gscale),
        rounded(moe.a2_gscale),
    )


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.to(F64) - want).norm() / want.norm())


def measure(name: str, tokens: int) -> dict[str, object]:
    shape = moe_setup.shape_named(name)
    moe = moe_setup.make_moe(shape, device="cpu")
    x, weights, ids = moe_setup.random_inputs(tokens, shape, seed=1, device="cpu")
    exact = experts_forward(float64_experts(moe), x.to(F64), weights.to(F64), ids.long())
    return {
        "shape": name,
        "tokens": tokens,
        "0.24.0": rel(nvfp4_moe_reference(moe, x, weights, ids), exact),
        "weights": rel(exact_weights_moe(moe, x, weights, ids), exact),
        "exact": rel(nvfp4_moe_reference(moe, x, weights, ids, exact=True), exact),
        "floor": rel(exact.to(torch.bfloat16), exact),
    }


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "# NVFP4 MoE arithmetic against exact W4A4 (float64), CPU",
        "",
        "`benchmarks/w4a4_roundings.py`: relative Frobenius error of each arithmetic's output"
        " against the float64 W4A4 layer on the same inputs (module docstring).",
        "",
        "| shape | tokens | 0.24.0's emulation | exact weights, 0.24.0's activation roundings"
        " | patch 0002 (exact W4A4) | BF16 floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['tokens']} | {r['0.24.0']:.3%} | {r['weights']:.3%} |"
            f" {r['exact']:.3%} |"
            f" {r['floor']:.3%} |"
        )
    return "\n".join(lines) + "\n"


def shape_name(name: str) -> str:
    """A tests/gpu/moe_setup.SHAPES name (or alias), for argparse: a wrong one is its error."""
    try:
        return moe_setup.shape_named(name).name
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown MoE shape {name!r}") from None


def token_count(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text}: a token count is 1 or more")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=shape_name,
        default=list(DEFAULT_SHAPES),
        help="tests/gpu/moe_setup.SHAPES names (default: %(default)s)",
    )
    parser.add_argument("--tokens", type=token_count, default=256)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    begin = time.monotonic()
    rows = [measure(name, args.tokens) for name in args.shapes]
    text = markdown(rows)
    print(text, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "seconds": round(time.monotonic() - begin, 1)}
    (args.out / "w4a4_roundings_cpu.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    (args.out / "w4a4_roundings_cpu.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "w4a4_roundings"))
