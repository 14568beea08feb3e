"""How far an engine's logprobs can come to the float64 W4A4 model, on the CPU (no GPU).

    python benchmarks/engine_e2e.py checkpoints --work W --device cpu nvfp4-L2
    python benchmarks/w4a4_logprob_floor.py --work W [--prompts N] [--out DIR]

The engine check judges each engine's teacher-forced logprobs against its checkpoint's exact
forward in float64 (engine_check/reference.py). Here that forward runs again with one thing
changed in every MoE layer, everything else float64, and its logprobs are compared with the
exact forward's (mean |Δ| in nats over the positions of the check's prompts):

- ``bf16 input``: the float64 experts on their input rounded to BF16, as an engine holds it;
- ``patch 0002``: patch 0002's arithmetic (exact W4A4 in FP32; tests/gpu/nvfp4_reference.py
  ``nvfp4_moe_reference(..., exact=True)``), BF16 in and out;
- ``0.24.0``: vLLM 0.24.0's emulation (every weight and activation rounded to BF16), BF16 in
  and out.

Rounding the hidden states to BF16 moves some of them across E2M1 rounding boundaries (a whole
FP4 step each), and the layers after it carry that on: the first row is the floor that no MoE
arithmetic of an engine with BF16 hidden states goes below. Output: the table on stdout and in
``w4a4_logprob_floor_cpu.{json,md}`` under --out (each MoE's figures on stderr as it ends).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import stops
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "gpu"), str(REPO / "benchmarks")]
from engine_check import reference  # noqa: E402
from engine_check.runs import LOGPROB_LEN, LOGPROB_PROMPTS, prompts  # noqa: E402
from nvfp4_reference import Nvfp4Moe, nvfp4_moe_reference  # noqa: E402

F64 = torch.float64
BF16 = torch.bfloat16
MODEL = "nvfp4-L2"
Moe = reference.MoeLayer


def nvfp4_layer(ckpt: reference.Checkpoint, layer: int) -> Nvfp4Moe:
    """Layer ``layer``'s experts as vLLM's emulation holds them (w13: gate rows, then up)."""
    experts = int(ckpt.config["num_experts"])
    prefix = f"model.layers.{layer}.mlp.experts"

    def stacked(proj: str, key: str) -> torch.Tensor:
        return torch.stack([ckpt.tensor(f"{prefix}.{e}.{proj}.{key}") for e in range(experts)])

    scales = ckpt.experts(layer, "w4a4")
    assert scales.a13_gscale is not None and scales.a2_gscale is not None
    return Nvfp4Moe(
        torch.cat((stacked("gate_proj", "weight"), stacked("up_proj", "weight")), dim=1),
        torch.cat((stacked("gate_proj", "weight_scale"), stacked("up_proj", "weight_scale")), 1),
        stacked("gate_proj", "weight_scale_2").float().reshape(experts),
        stacked("down_proj", "weight"),
        stacked("down_proj", "weight_scale"),
        stacked("down_proj", "weight_scale_2").float().reshape(experts),
        scales.a13_gscale.float(),
        scales.a2_gscale.float(),
    )


def bf16_input(exact_moe: Moe) -> Moe:
    def moe(ckpt: reference.Checkpoint, layer: int, x: torch.Tensor, act: str) -> torch.Tensor:
        return exact_moe(ckpt, layer, x.to(BF16).to(F64), act)

    return moe


def emulated(exact: bool) -> Moe:
    """The MoE as patch 0002 (exact) or vLLM 0.24.0 computes it, BF16 in and out."""
    layers: dict[int, Nvfp4Moe] = {}

    def moe(ckpt: reference.Checkpoint, layer: int, x: torch.Tensor, act: str) -> torch.Tensor:
        if layer not in layers:
            layers[layer] = nvfp4_layer(ckpt, layer)
        flat = x.reshape(-1, x.shape[-1]).to(BF16)
        weights, ids = reference.router(ckpt, layer, flat)
        out = nvfp4_moe_reference(layers[layer], flat, weights.float(), ids, exact=exact)
        return out.to(F64).view_as(x)

    return moe


def measure(ckpt: reference.Checkpoint, count: int) -> list[dict[str, object]]:
    texts = prompts(count, LOGPROB_LEN, seed=1)
    exact = torch.tensor(reference.prompt_logprobs(ckpt, texts, "w4a4"), dtype=F64)
    rows: list[dict[str, object]] = []
    variants = {
        "bf16 input": bf16_input(reference.moe),
        "patch 0002": emulated(exact=True),
        "0.24.0": emulated(exact=False),
    }
    for name, moe in variants.items():
        start = time.monotonic()
        logprobs = reference.prompt_logprobs(ckpt, texts, "w4a4", moe_layer=moe)
        got = torch.tensor(logprobs, dtype=F64)
        delta = (got - exact).abs()
        row = {
            "moe": name,
            "mean_abs_nats": float(delta.mean()),
            "max_abs_nats": float(delta.max()),
            "positions": delta.numel(),
            "seconds": round(time.monotonic() - start, 1),
        }
        # Progress of a long run on stderr; the table goes to stdout once the files are written.
        mean, top = row["mean_abs_nats"], row["max_abs_nats"]
        print(f"{name}: mean |Δ| {mean:.4f} nats, max {top:.3f}", file=sys.stderr)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, object]], model: str) -> str:
    lines = [
        f"`benchmarks/w4a4_logprob_floor.py` on {model}: teacher-forced logprobs of the float64"
        " forward with one change in every MoE layer, against the exact float64 forward"
        " (module docstring).",
        "",
        "| MoE layers | positions | mean |Δ| nats | max |Δ| nats |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['moe']} | {r['positions']} | {r['mean_abs_nats']:.4f} |"
            f" {r['max_abs_nats']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def prompt_count(text: str) -> int:
    count = int(text)
    if not 1 <= count <= LOGPROB_PROMPTS:
        raise argparse.ArgumentTypeError(f"prompts: 1 to {LOGPROB_PROMPTS}, got {count}")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help=f"holds models/{MODEL}")
    parser.add_argument("--prompts", type=prompt_count, default=LOGPROB_PROMPTS)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    folder = args.work / "models" / MODEL
    if not (folder / "config.json").is_file():
        parser.error(f"no {MODEL} checkpoint in {folder} (engine_e2e.py checkpoints first)")
    rows = measure(reference.Checkpoint(folder, "cpu"), args.prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"model": MODEL, "prompts": args.prompts, "prompt_len": LOGPROB_LEN, "rows": rows}
    (args.out / "w4a4_logprob_floor_cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = markdown(rows, MODEL)
    (args.out / "w4a4_logprob_floor_cpu.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "w4a4_logprob_floor"))
