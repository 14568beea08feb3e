"""Two engines' outputs compared position by position: teacher-forced logprobs (|Δ| in nats)
and greedy tokens (common prefixes); the spread of a figure over repeated runs."""

from __future__ import annotations

import statistics


def compare_logprobs(a: list[list[float]], b: list[list[float]]) -> dict[str, float | int]:
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    diffs = [abs(x - y) for x, y in pairs]
    return {
        "positions": len(pairs),
        "identical": sum(d == 0.0 for d in diffs) / len(pairs),
        "mean_abs": statistics.fmean(diffs),
        "max_abs": max(diffs),
    }


def compare_greedy(a: list[list[int]], b: list[list[int]]) -> dict[str, float | int]:
    prefixes = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
        prefixes.append(same)
    return {
        "sequences": len(a),
        "identical": sum(p == len(x) for p, x in zip(prefixes, a, strict=True)) / len(a),
        "mean_common_prefix": statistics.fmean(prefixes),
        "tokens": len(a[0]) if a else 0,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "lowest": min(values),
        "highest": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }
