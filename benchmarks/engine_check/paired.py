"""Two engines' per-position |Δ| against the same reference, paired prompt by prompt: whether
one is closer than the other by more than the prompts' own scatter.

Per position, each engine's |Δ| averaged over its runs; the difference (first minus second);
its mean over every position, with a 95% percentile bootstrap interval over prompts (the
prompts resampled with replacement, a fixed seed: the same data give the same interval), and
the count of prompts on which each engine is closer (its mean |Δ| over the prompt smaller).
Pure Python: the prompts are few (32), the resamples 2,000."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

RESAMPLES = 2000
SEED = 0
DIGITS = 5  # the |Δ| kept per position: 1e-5 nats, far below any difference judged


def abs_deltas(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """Per prompt, each position's |Δ| between two logprob series, rounded to DIGITS."""
    return [
        [round(abs(x - y), DIGITS) for x, y in zip(ra, rb, strict=True)]
        for ra, rb in zip(a, b, strict=True)
    ]


def mean_over_runs(runs: list[list[list[float]]]) -> list[list[float]]:
    """Per prompt and position, the mean |Δ| over an engine's runs."""
    return [
        [statistics.fmean(values) for values in zip(*prompts, strict=True)]
        for prompts in zip(*runs, strict=True)
    ]


def compare(
    first: list[list[float]],
    second: list[list[float]],
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """``first`` minus ``second`` (per prompt, per position |Δ|): the mean difference over
    every position, its 95% bootstrap interval over prompts, and on how many prompts each
    is closer (ties: neither)."""
    diffs = [[x - y for x, y in zip(p, q, strict=True)] for p, q in zip(first, second, strict=True)]
    sums, counts = [sum(d) for d in diffs], [len(d) for d in diffs]
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        picked = [rng.randrange(len(diffs)) for _ in diffs]
        means.append(sum(sums[i] for i in picked) / sum(counts[i] for i in picked))
    means.sort()
    return {
        "prompts": len(diffs),
        "positions": sum(counts),
        "mean": sum(sums) / sum(counts),
        "low": means[math.floor(0.025 * resamples)],
        "high": means[math.ceil(0.975 * resamples) - 1],
        "resamples": resamples,
        "seed": seed,
        "first_closer": sum(s < 0 for s in sums),
        "second_closer": sum(s > 0 for s in sums),
    }


def verdict(paired: dict[str, Any]) -> str:
    """The first engine against the second in words: at least as close (its mean difference
    is not above 0), not as close (above 0, and so is the whole interval), or no difference
    the prompts can resolve (above 0, the interval reaching 0)."""
    if paired["mean"] <= 0:
        return "at least as close"
    if paired["low"] > 0:
        return "not as close (the interval excludes 0)"
    return (
        f"no difference the {paired['prompts']} prompts can resolve (interval"
        f" {paired['low']:+.4f} to {paired['high']:+.4f} includes 0)"
    )
