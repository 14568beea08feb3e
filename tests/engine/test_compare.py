"""Two engines' outputs compared position by position."""

from __future__ import annotations

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
