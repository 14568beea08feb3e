"""series/line_evidence.py on lines: code lines stripped (comments and blank lines aside),
blocks of lines found, a hunk's changes grouped, and a hunk found in a file: exactly (its
offset), in a window alike, or not at all."""

from __future__ import annotations

import pytest
from tiny_series import BASE, FIXED, MOE, Trees
from vllm_patchset.series.line_evidence import (
    change_groups,
    find_block,
    find_hunk,
    find_hunks,
    stripped_code,
)
from vllm_patchset.series.patches import Hunk, Patch
from vllm_patchset.series.verdict import HunkFinding


def test_stripped_code() -> None:
    assert stripped_code(["  a = 1  ", "", "   # a comment", "b"]) == ["a = 1", "b"]


@pytest.mark.parametrize(
    ("needle", "at"),
    [(["a", "b"], [0, 3]), (["b", "c"], [1]), (["c", "a", "b"], [2]), (["x"], []), ([], [])],
)
def test_find_block(needle: list[str], at: list[int]) -> None:
    assert find_block(["a", "b", "c", "a", "b"], needle) == at


def test_change_groups() -> None:
    hunk = Hunk(1, 1, (" x = 1", "-y = 2", "+y = 3", "+# why", " z = 4", "+w = 5"))
    assert change_groups(hunk) == [(["y = 2"], ["y = 3"]), ([], ["w = 5"])]


HUNK = Hunk(2, 2, (" b = 2", "-c = 3", "+c = 30", " d = 4"))
PRE = ("b = 2", "c = 3", "d = 4")
FOUND = [
    # (the file's lines) -> (applies at, offset, result there, located, the window, its row)
    (["a = 1", "b = 2", "c = 3", "d = 4"], (2, 0, False, True, (), None)),
    (["", "", "a = 1", "b = 2", "c = 3", "d = 4"], (4, 2, False, True, (), None)),
    # The fix there: its window has 2 of 3 lines alike, under LOCATE_RATIO (not located).
    (
        ["a = 1", "b = 2", "c = 30", "d = 4"],
        (None, None, True, False, ("b = 2", "c = 30", "d = 4"), 2),
    ),
    (["x = 0", "y = 0", "z = 0"], (None, None, False, False, ("x = 0", "y = 0", "z = 0"), 1)),
]


@pytest.mark.parametrize(("lines", "expected"), FOUND)
def test_find_hunk(lines: list[str], expected: tuple[object, ...]) -> None:
    found = find_hunk(lines, stripped_code(lines), True, "a.py", 1, HUNK)
    assert (found.file, found.number, found.header, found.expected) == (
        "a.py",
        1,
        "@@ -2 +2 @@",
        PRE,
    )
    assert (
        found.applies_at,
        found.offset,
        found.result_present,
        found.located,
        found.found,
        found.found_at,
    ) == expected


def test_a_hunk_of_a_file_that_is_not_there() -> None:
    assert find_hunk([], [], False, "a.py", 3, HUNK) == HunkFinding(
        "a.py", 3, "@@ -2 +2 @@", None, None, False, False, PRE, (), None
    )


def test_find_hunks_on_trees(trees: Trees, fix: Patch) -> None:
    """The fix on the pin (its pre-image at line 1), and on the release that has it."""
    (on_pin,) = find_hunks(trees.repo, trees.tree({MOE: BASE}), fix)
    (on_fixed,) = find_hunks(trees.repo, trees.tree({MOE: FIXED}), fix)
    assert (on_pin.applies_at, on_pin.result_present) == (1, False)
    assert (on_fixed.applies_at, on_fixed.result_present, on_fixed.found_at) == (None, True, 1)


def test_a_window_alike_is_located() -> None:
    """Four of five lines alike (0.8, LOCATE_RATIO): the same code, changed."""
    hunk = Hunk(1, 1, (" a = 1", " b = 2", "-c = 3", "+c = 30", " d = 4", " e = 5"))
    lines = ["a = 1", "b = 2", "c = 300", "d = 4", "e = 5"]
    found = find_hunk(lines, stripped_code(lines), True, "a.py", 1, hunk)
    assert (found.applies_at, found.result_present, found.located, found.found_at) == (
        None,
        False,
        True,
        1,
    )
