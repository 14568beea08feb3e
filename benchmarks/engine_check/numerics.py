"""The engines against the float64 reference (reference.py): each engine's teacher-forced
logprobs, run by run, against the exact forward's (W4A4 and W4A16), the spread over its
runs, each run's |Δ| per position (W4A4), and whether the overlay is at least as close as the
pristine emulation: prompt by prompt (paired.py) where the per-position |Δ| are there, by the
means alone in a summary written before they were kept."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from . import paired as pairing
from .compare import compare_logprobs, spread
from .runs import LOGPROB_PROMPTS

# The engines judged against it: (label, the run's name; its repeats add "-nI").
REFERENCE_ENGINES = (
    ("0.24.0 emulation, pristine", "pristine-emulation-L2"),
    ("0.24.0 emulation + overlay", "overlay-emulation-L2"),
    ("Marlin W4A16 (0.24.0's default on Hopper)", "pristine-marlin-L2"),
)


def reference_logprobs(model: Path, texts: list[list[int]], device: str) -> dict[str, Any]:
    """The float64 forward's teacher-forced logprobs of ``texts`` (reference.py): W4A4 and
    W4A16 (no activation quantization), one batch."""
    from . import reference

    ckpt = reference.Checkpoint(model, device)
    result: dict[str, Any] = {"model": model.name, "device": device, "prompts": len(texts)}
    for kind in ("w4a4", "w4a16"):
        begin = time.monotonic()
        result[kind] = reference.prompt_logprobs(ckpt, texts, kind, batch=len(texts))
        result[f"{kind}_seconds"] = round(time.monotonic() - begin, 1)
    return result


def against_reference(
    ok: dict[str, dict[str, Any]], reference: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per engine of REFERENCE_ENGINES, each run's batch logprobs against the float64
    reference's (W4A4 and W4A16): mean and max |Δ| per run, the runs' spread; and each run's
    |Δ| against W4A4 per prompt and position (``w4a4_per_position``, by run)."""
    out = []
    for label, name in REFERENCE_ENGINES:
        repeat = re.compile(re.escape(name) + r"(-n\d+)?")
        runs = sorted(n for n in ok if repeat.fullmatch(n) and ok[n].get("logprobs_batch"))
        if not runs:
            continue
        row: dict[str, Any] = {"engine": label, "name": name, "runs": runs}
        for kind in ("w4a4", "w4a16"):
            compared = [compare_logprobs(ok[n]["logprobs_batch"], reference[kind]) for n in runs]
            row[kind] = {
                **spread([float(c["mean_abs"]) for c in compared]),
                "max_abs": max(float(c["max_abs"]) for c in compared),
                "positions": int(compared[0]["positions"]),
            }
        row["w4a4_per_position"] = {
            n: pairing.abs_deltas(ok[n]["logprobs_batch"], reference["w4a4"]) for n in runs
        }
        out.append(row)
    return out


def closer_verdict(rows: list[dict[str, Any]]) -> str | None:
    """Whether the overlay is at least as close to the W4A4 reference as the pristine
    emulation, in one line with the figures (None without both)."""
    by = {r["name"]: r for r in rows}
    pristine, overlay = by.get("pristine-emulation-L2"), by.get("overlay-emulation-L2")
    if pristine is None or overlay is None:
        return None
    p, o = pristine["w4a4"]["mean"], overlay["w4a4"]["mean"]
    answer = "yes" if o <= p else "NO"
    return (
        f"The overlay at least as close to the W4A4 reference as the pristine emulation:"
        f" {answer} ({o:.4f} vs {p:.4f} nats, mean over runs)."
    )


def paired_with_pristine(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The overlay minus the pristine emulation, prompt by prompt, against W4A4 (paired.py);
    None without both engines' per-position |Δ|."""
    by = {r["name"]: r for r in rows}
    pristine, overlay = by.get("pristine-emulation-L2"), by.get("overlay-emulation-L2")
    if pristine is None or overlay is None:
        return None
    if "w4a4_per_position" not in pristine or "w4a4_per_position" not in overlay:
        return None
    return pairing.compare(
        pairing.mean_over_runs(list(overlay["w4a4_per_position"].values())),
        pairing.mean_over_runs(list(pristine["w4a4_per_position"].values())),
    )


def verdict_lines(rows: list[dict[str, Any]], paired: dict[str, Any] | None) -> list[str]:
    """The overlay against the pristine emulation: the paired comparison's verdict and its
    figures, or, without it, the means' verdict and a line saying it is missing."""
    means = closer_verdict(rows)
    if means is None:
        return []
    if paired is None:
        missing = (
            "The paired comparison (the overlay minus the pristine emulation, prompt by"
            " prompt) is missing: these results keep no per-position |Δ|."
        )
        return [means, "", missing, ""]
    by = {r["name"]: r for r in rows}
    o, p = by["overlay-emulation-L2"]["w4a4"]["mean"], by["pristine-emulation-L2"]["w4a4"]["mean"]
    n = paired["prompts"]
    return [
        f"The overlay against the W4A4 reference, beside the pristine emulation:"
        f" {pairing.verdict(paired)} ({o:.4f} vs {p:.4f} nats, mean over runs).",
        "",
        f"Paired over the {n} prompts (per position, each engine's |Δ| averaged over its runs,"
        f" the overlay's minus the pristine emulation's): mean {paired['mean']:+.4f} nats, 95%"
        f" bootstrap interval {paired['low']:+.4f} to {paired['high']:+.4f}"
        f" ({paired['resamples']} resamples of the prompts, seed {paired['seed']}); the overlay"
        f" closer on {paired['first_closer']} of the {n} prompts, the pristine emulation on"
        f" {paired['second_closer']}.",
        "",
    ]


def reference_lines(rows: list[dict[str, Any]], paired: dict[str, Any] | None = None) -> list[str]:
    """The report's section on the float64 reference."""
    positions = rows[0]["w4a4"]["positions"]
    lines = [
        "Against the float64 reference (benchmarks/engine_check/reference.py: the 2-layer"
        " checkpoint's exact forward in float64, W4A4 as vLLM's reference quantization defines"
        " it, W4A16 without activation quantization): each engine's teacher-forced logprobs"
        f" of the batch of {LOGPROB_PROMPTS}, mean |Δ| in nats over {positions} positions;"
        " over the runs: their mean (lowest to highest), and the largest |Δ| of any run:",
        "",
        "| engine | runs | vs W4A4: mean |Δ| | max |Δ| | vs W4A16: mean |Δ| | max |Δ| |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a4, a16 = r["w4a4"], r["w4a16"]
        lines.append(
            f"| {r['engine']} | {len(r['runs'])} | {a4['mean']:.4f} ({a4['lowest']:.4f} to"
            f" {a4['highest']:.4f}) | {a4['max_abs']:.3f} | {a16['mean']:.4f}"
            f" ({a16['lowest']:.4f} to {a16['highest']:.4f}) | {a16['max_abs']:.3f} |"
        )
    return [*lines, "", *verdict_lines(rows, paired)]
