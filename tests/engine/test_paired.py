"""Two engines' per-position |Δ| paired prompt by prompt: the mean difference, its bootstrap
interval over prompts (the seed fixed: exact figures), the prompts each is closer on, and
the verdict in words."""

from __future__ import annotations

from typing import Any

import pytest
from engine_check import paired

# Three prompts of two positions: the first engine closer on A, level on B, farther on C
# (|Δ| sums per prompt, first minus second: -0.5, 0, +1.0); multiples of 1/4, exact in floats.
FIRST = [[0.25, 0.25], [0.5, 0.5], [1.0, 0.5]]
SECOND = [[0.5, 0.5], [0.5, 0.5], [0.25, 0.25]]


def test_abs_deltas_per_prompt_and_position() -> None:
    a = [[-1.0, -2.0], [-3.0, -0.123456789]]
    b = [[-1.5, -2.0], [-2.0, -0.5]]
    assert paired.abs_deltas(a, b) == [[0.5, 0.0], [1.0, 0.37654]]


def test_mean_over_runs() -> None:
    runs = [[[0.5, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.25]]]
    assert paired.mean_over_runs(runs) == [[0.25, 0.0], [0.0, 0.125]]
    assert paired.mean_over_runs(runs[:1]) == runs[0]


def test_compare_a_tiny_case_with_the_seed_fixed() -> None:
    """20 resamples of random.Random(0): their means (three prompts' sums picked, over 6
    positions) run from -0.5/6 (B, B, A picked) to 2/6 (B, C, C), and with 20 resamples the
    2.5% and 97.5% points are the lowest and the highest."""
    assert paired.compare(FIRST, SECOND, resamples=20, seed=0) == {
        "prompts": 3,
        "positions": 6,
        "mean": 0.5 / 6,
        "low": -0.5 / 6,
        "high": 2 / 6,
        "resamples": 20,
        "seed": 0,
        "first_closer": 1,
        "second_closer": 1,
    }
    # The default: 2,000 resamples, seed 0; the same data give the same interval.
    default = paired.compare(FIRST, SECOND)
    assert (default["low"], default["high"], default["resamples"]) == (-1.5 / 6, 3 / 6, 2000)
    assert paired.compare(FIRST, SECOND) == default


def test_compare_without_scatter_over_prompts() -> None:
    """Every prompt the same difference: every resample's mean is it, so is the interval."""
    first = [[0.5, 0.75]] * 4
    second = [[0.25, 0.5]] * 4
    result = paired.compare(first, second)
    assert (result["mean"], result["low"], result["high"]) == (0.25, 0.25, 0.25)
    assert (result["first_closer"], result["second_closer"]) == (0, 4)


VERDICTS = [  # (mean, low, high) -> the verdict
    ((-0.01, -0.02, 0.0), "at least as close"),
    ((0.0, -0.01, 0.01), "at least as close"),
    ((0.0046, 0.001, 0.008), "not as close (the interval excludes 0)"),
    (
        (0.0046, -0.0012, 0.0104),
        "no difference the 32 prompts can resolve (interval -0.0012 to +0.0104 includes 0)",
    ),
]


@pytest.mark.parametrize(("figures", "expected"), VERDICTS)
def test_verdict(figures: tuple[float, float, float], expected: str) -> None:
    mean, low, high = figures
    result: dict[str, Any] = {"prompts": 32, "mean": mean, "low": low, "high": high}
    assert paired.verdict(result) == expected
