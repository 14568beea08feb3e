"""Two engines' outputs compared position by position."""

from __future__ import annotations

import pytest
from engine_check import compare


def test_compare_logprobs_and_greedy() -> None:
    a = [[-1.0, -2.0], [-3.0, -4.0]]
    b = [[-1.0, -2.5], [-3.0, -3.0]]
    assert compare.compare_logprobs(a, b) == {
        "positions": 4,
        "identical": 0.5,
        "mean_abs": 0.375,
        "max_abs": 1.0,
    }
    assert compare.compare_greedy([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == {
        "sequences": 2,
        "identical": 0.5,
        "mean_common_prefix": 2.0,
        "tokens": 3,
    }


SPREAD_CASES = [
    ([0.5], {"mean": 0.5, "lowest": 0.5, "highest": 0.5, "stdev": 0.0}),
    ([0.25, 0.75], {"mean": 0.5, "lowest": 0.25, "highest": 0.75, "stdev": 0.5**0.5 / 2}),
]


@pytest.mark.parametrize(("values", "expected"), SPREAD_CASES)
def test_spread(values: list[float], expected: dict[str, float]) -> None:
    assert compare.spread(values) == pytest.approx(expected)
