"""series/case.py: what `classify` knows of the fix of tests/tiny_series.py on each tree
(git's apply check, each hunk's kind, whether the bug is there, the trailers), git's 3-way
merge, and the cosmetic notes of an upstreamed patch."""

from __future__ import annotations

import pytest
from tiny_series import BASE, FIXED, MOE, Trees
from vllm_patchset.series.case import case_of, three_way_merge, upstream_drift
from vllm_patchset.series.patches import Patch
from vllm_patchset.series.verdict import State

CASES = [
    # (the tree) -> (git applies it, each hunk's kind, the bug is there)
    ("pin", (True, ("site",), True)),
    ("fixed", (False, ("present",), False)),
    ("joined", (False, ("site",), True)),
    ("changed", (False, ("changed",), False)),
    ("gone", (False, ("lost",), False)),
    ("moved", (False, ("lost",), False)),
]


@pytest.mark.parametrize(("on", "expected"), CASES)
def test_case_of(
    trees: Trees, fix: Patch, on: str, expected: tuple[bool, tuple[str, ...], bool]
) -> None:
    case = case_of(trees.repo, trees.on(on), fix, on, "1.1", None, False, {}, True)
    assert (case.applies, case.kinds, case.bug_here) == expected
    assert (case.expected, case.pending) == (State.APPLIES, True)  # Applied-upstream: empty


@pytest.mark.parametrize(
    ("on", "merged"), [("pin", "clean"), ("fixed", "no change"), ("changed", "conflict")]
)
def test_three_way_merge(trees: Trees, fix: Patch, on: str, merged: str) -> None:
    assert three_way_merge(trees.repo, trees.on(on), fix) == merged


def test_upstream_drift_names_the_comment_lines_upstream_has_not(trees: Trees) -> None:
    commented = FIXED.replace("        scale =", "        # the input's own scale\n        scale =")
    patch = trees.patch({MOE: BASE}, {MOE: commented})
    tree = trees.on("fixed")
    case = case_of(trees.repo, tree, patch, "fixed", "1.1", None, False, {}, True)
    assert upstream_drift(trees.repo, tree, patch, case.hunks) == [
        f"hunk 1 ({MOE}): code matches upstream, comment lines differ"
    ]
    assert upstream_drift(trees.repo, trees.tree({MOE: commented}), patch, case.hunks) == []
