"""series/moves.py: where the code of the fix of tests/tiny_series.py went when it is not in
its file (a module moved whole: followed; in two places: candidates), and where the code it
removes is elsewhere in the package (a subclass's method: the patch's code)."""

from __future__ import annotations

import pytest
from tiny_series import BASE, MOE, Trees
from vllm_patchset.series.case import case_of
from vllm_patchset.series.moves import bug_elsewhere, relocation
from vllm_patchset.series.patches import Patch

LAYERS = "vllm/layers/moe.py"
RELOCATIONS = [
    # (the tree's files, git's renames) -> (moves, candidates)
    ({MOE: BASE}, {}, ((), ())),  # in place: nothing lost
    ({LAYERS: BASE}, {}, (((MOE, LAYERS),), ())),  # every lost hunk in one other file
    ({LAYERS: BASE, "vllm/b.py": BASE}, {}, ((), ("vllm/b.py", LAYERS))),  # in two
    ({LAYERS: BASE, "vllm/b.py": BASE}, {MOE: LAYERS}, (((MOE, LAYERS),), ())),  # git saw it
    ({"vllm/b.py": "x = 1\n"}, {}, ((), ())),  # nowhere
]


@pytest.mark.parametrize(("files", "renames", "expected"), RELOCATIONS)
def test_relocation(
    trees: Trees,
    fix: Patch,
    files: dict[str, str],
    renames: dict[str, str],
    expected: tuple[tuple[tuple[str, str], ...], tuple[str, ...]],
) -> None:
    tree = trees.tree(files)
    case = case_of(trees.repo, tree, fix, "b", "1.1", None, False, {}, True)
    assert relocation(trees.repo, tree, fix, case.hunks, renames) == expected


@pytest.mark.parametrize(
    ("on", "places"),
    [
        ("helper", ("vllm/other.py:6 (Emulated.apply)",)),  # a subclass's method
        ("moved", (f"{LAYERS}:3 (Experts.apply)",)),
        ("gone", ()),
        ("pin", ()),  # a site in its own file: not elsewhere
    ],
)
def test_bug_elsewhere(trees: Trees, fix: Patch, on: str, places: tuple[str, ...]) -> None:
    tree = trees.on(on)
    case = case_of(trees.repo, tree, fix, on, "1.1", None, False, {}, True)
    assert bug_elsewhere(trees.repo, tree, case.looks, case.hunks) == places
