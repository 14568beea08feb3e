"""The engines against the float64 reference (reference.py): each engine's teacher-forced
logprobs, run by run, against the exact forward's (W4A4 and W4A16), the spread over its
runs, each run's |Δ| per position (W4A4), and whether the overlay is at least as close as the
pristine emulation: prompt by prompt (paired.py) where the per-position |Δ| are there, by the
means alone in a summary written before they were kept; beside it, how far the two emulations
are from each other. Each model with a float64 reference (nvfp4-L2, nvfp4-L12, ...) is judged
against its own, its engines' runs named ``<engine>-L<layers>`` (repeats ``-nI``)."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from . import paired as pairing
from .compare import compare_logprobs, spread
from .runs import LOGPROB_PROMPTS

# The engines judged against it: (label, the run's name less "-L<layers>"; repeats add "-nI").
REFERENCE_ENGINES = (
    ("0.24.0 emulation, pristine", "pristine-emulation"),
    ("0.24.0 emulation + overlay", "overlay-emulation"),
    ("Marlin W4A16 (0.24.0's default on Hopper)", "pristine-marlin"),
)
PRISTINE, OVERLAY = "pristine-emulation", "overlay-emulation"
_LAYERS = re.compile(r"-L(\d+)$")


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


def model_layers(model: str) -> int | None:
    """A checkpoint's layer count from its folder name: ``nvfp4-L12`` -> 12 (None: no count)."""
    found = _LAYERS.search(model)
    return int(found.group(1)) if found else None


def engine_runs(ok: dict[str, dict[str, Any]], name: str) -> list[str]:
    """The runs of ``name`` (``pristine-emulation-L12``) with batch logprobs: the run of that
    name and its repeats ``-nI``; not the runs of other checks (``-layers``, ``-ep2``, ...)."""
    repeat = re.compile(re.escape(name) + r"(-n\d+)?")
    return sorted(n for n in ok if repeat.fullmatch(n) and ok[n].get("logprobs_batch"))


def model_section(
    ok: dict[str, dict[str, Any]], model: str, reference: dict[str, Any]
) -> dict[str, Any] | None:
    """One model's engines against its float64 reference (``against_reference``), the
    overlay paired with the pristine emulation and the two emulations against each other;
    None where the model's name has no layer count or none of its engines ran."""
    layers = model_layers(model)
    if layers is None:
        return None
    rows = against_reference(ok, reference, layers)
    if not rows:
        return None
    return {
        "model": model,
        "layers": layers,
        "engines": rows,
        "paired": paired_with_pristine(rows),
        "apart": emulations_apart(ok, rows),
    }


def against_reference(
    ok: dict[str, dict[str, Any]], reference: dict[str, Any], layers: int = 2
) -> list[dict[str, Any]]:
    """Per engine of REFERENCE_ENGINES on the ``layers``-layer model, each run's batch
    logprobs against the float64 reference's (W4A4 and W4A16): mean and max |Δ| per run, the
    runs' spread; and each run's |Δ| against W4A4 per prompt and position
    (``w4a4_per_position``, by run)."""
    out = []
    for label, engine in REFERENCE_ENGINES:
        name = f"{engine}-L{layers}"
        runs = engine_runs(ok, name)
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


def by_engine(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rows by engine, the model's layer count taken off: ``pristine-emulation``, ..."""
    return {_LAYERS.sub("", r["name"]): r for r in rows}


def emulations_apart(
    ok: dict[str, dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The overlay's batch logprobs against the pristine emulation's themselves (engine vs
    engine), every run of the one with every run of the other: the mean of the pairs' mean
    |Δ|, the largest |Δ|; None without both engines."""
    by = by_engine(rows)
    pristine, overlay = by.get(PRISTINE), by.get(OVERLAY)
    if pristine is None or overlay is None:
        return None
    compared = [
        compare_logprobs(ok[o]["logprobs_batch"], ok[p]["logprobs_batch"])
        for o in overlay["runs"]
        for p in pristine["runs"]
    ]
    return {
        "a": overlay["name"],
        "b": pristine["name"],
        "pairs": len(compared),
        "mean_abs": statistics.fmean(float(c["mean_abs"]) for c in compared),
        "max_abs": max(float(c["max_abs"]) for c in compared),
        "positions": int(compared[0]["positions"]),
    }


def closer_verdict(rows: list[dict[str, Any]]) -> str | None:
    """Whether the overlay is at least as close to the W4A4 reference as the pristine
    emulation, in one line with the figures (None without both)."""
    by = by_engine(rows)
    pristine, overlay = by.get(PRISTINE), by.get(OVERLAY)
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
    by = by_engine(rows)
    pristine, overlay = by.get(PRISTINE), by.get(OVERLAY)
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
    by = by_engine(rows)
    o, p = by[OVERLAY]["w4a4"]["mean"], by[PRISTINE]["w4a4"]["mean"]
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


def apart_line(rows: list[dict[str, Any]], apart: dict[str, Any]) -> str:
    """The two emulations against each other, beside their distances from W4A4."""
    by = by_engine(rows)
    o, p = by[OVERLAY]["w4a4"]["mean"], by[PRISTINE]["w4a4"]["mean"]
    n = apart["pairs"]
    pairs = "one run each" if n == 1 else f"mean over {n} pairs of runs, each with each"
    return (
        f"Engine vs engine: the overlay's logprobs against the pristine emulation's themselves,"
        f" mean |Δ| {apart['mean_abs']:.4f} nats (max {apart['max_abs']:.3f}; {pairs}),"
        f" beside their distances from the W4A4 reference: {o:.4f} (overlay) and {p:.4f}"
        " (pristine emulation) nats."
    )


def reference_lines(
    rows: list[dict[str, Any]],
    paired: dict[str, Any] | None = None,
    layers: int = 2,
    apart: dict[str, Any] | None = None,
) -> list[str]:
    """The report's section on the float64 reference of the ``layers``-layer model."""
    positions = rows[0]["w4a4"]["positions"]
    lines = [
        f"Against the float64 reference (benchmarks/engine_check/reference.py: the {layers}-layer"
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
    lines += ["", *verdict_lines(rows, paired)]
    return lines + ([apart_line(rows, apart), ""] if apart else [])
