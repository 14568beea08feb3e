"""series/token_evidence.py: the fix of tests/tiny_series.py on each tree by tokens (its sites
in its scope, elsewhere, its changes there), what the tree holds of it, the patch placed by
token match, and the scope rules, on tables."""

from __future__ import annotations

import pytest
from tiny_series import MOE, Trees
from vllm_patchset.series.line_evidence import find_hunks
from vllm_patchset.series.patches import Patch
from vllm_patchset.series.token_evidence import (
    kind,
    looks,
    refreshed_patch,
    related,
    without_separators,
)

LOOKS = [
    # (the tree) -> (its sites in its scope, elsewhere, its changes there, exact line places,
    # what the tree holds of it)
    ("pin", ((0,), (), False, 1, "site")),
    ("joined", ((0,), (), False, 0, "site")),  # the same tokens on other lines
    ("fixed", ((), (), True, 0, "present")),
    ("changed", ((), (), False, 0, "changed")),
    ("gone", ((), (), False, 0, "lost")),
    ("moved", ((), (), False, 0, "lost")),  # not in its own file
]


@pytest.mark.parametrize(("on", "expected"), LOOKS)
def test_looks_and_kinds(trees: Trees, fix: Patch, on: str, expected: tuple[object, ...]) -> None:
    tree = trees.on(on)
    (look,) = looks(trees.repo, tree, fix)
    (finding,) = find_hunks(trees.repo, tree, fix)
    assert look.scope == ("Experts", "apply")  # where the patch was written
    got = (look.sites, look.elsewhere, look.present, look.line_sites, kind(look, finding))
    assert got == expected


def test_where_a_site_is(trees: Trees, fix: Patch) -> None:
    """Its row (the pre-image's first line), and its place with the scope of its change."""
    (look,) = looks(trees.repo, trees.on("joined"), fix)
    assert (look.row, look.places()) == (1, [f"{MOE}:1 (Experts.apply)"])


def test_refreshed_patch_on_a_joined_line(trees: Trees, fix: Patch) -> None:
    tree = trees.on("joined")
    found = looks(trees.repo, tree, fix)
    placed = refreshed_patch(fix, found, ["site"])
    assert placed is not None
    assert placed.partition("\ndiff --git ")[2] == (
        f"a/{MOE} b/{MOE}\n--- a/{MOE}\n+++ b/{MOE}\n@@ -1,7 +1,6 @@\n class Experts:\n"
        "     def apply(self, x):\n-        scale = self.a1_scale \\\n"
        "-            or self.a1_gscale\n+        scale = self.a1_scale\n"
        "         return x * scale\n \n     def name(self):\n-- \n"
    )


RELATED = [
    # (the scope on the old base, the scope found, the old class's bases) -> the same code
    (("A", "f"), ("A", "f"), (), True),
    (("A", "f"), ("A", "g"), (), True),  # another method of the same class
    (("A", "f"), ("B", "f"), (), False),
    (("A", "f"), ("B", "f"), ("B",), True),  # a method of a class A derives from
    (("f",), ("g",), (), False),
    ((), (), (), False),  # the module: no scope to go by
    (("f",), ("f",), (), True),
]


@pytest.mark.parametrize(("old", "new", "bases", "same"), RELATED)
def test_related(
    old: tuple[str, ...], new: tuple[str, ...], bases: tuple[str, ...], same: bool
) -> None:
    assert related(old, new, bases) == same


@pytest.mark.parametrize(
    ("words", "span"),
    [((",", "a", ",", "b", ","), (1, 4)), (("a", "b"), (0, 2)), ((",", ","), (2, 2))],
)
def test_without_separators(words: tuple[str, ...], span: tuple[int, int]) -> None:
    assert without_separators(words, 0, len(words)) == span
