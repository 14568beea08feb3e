"""series/copies.py: the cues of a hunk's lines (its tokens, trimmed of what the other side
shares), and every live place of the package where the bug of the fix of tests/tiny_series.py
is, with whether the patch changes it there."""

from __future__ import annotations

import pytest
from tiny_series import MOE, Trees
from vllm_patchset.series.case import case_of
from vllm_patchset.series.copies import bug_cues, bug_places, line_cues
from vllm_patchset.series.patches import Patch
from vllm_patchset.series.token_evidence import looks


def test_line_cues(trees: Trees, fix: Patch) -> None:
    (look,) = looks(trees.repo, trees.on("pin"), fix)
    removed = [(c.text, c.words) for c in line_cues(look, post=False)]
    added = [(c.text, c.words, c.line) for c in line_cues(look, post=True)]
    assert removed == [("or self.a1_gscale", ("or", "self", ".", "a1_gscale"))]
    # A fix that only takes away: its line and the tokens after it.
    assert added == [
        (
            "scale = self.a1_scale",
            ("scale", "=", "self", ".", "a1_scale", "return", "x"),
            ("scale", "=", "self", ".", "a1_scale"),
        )
    ]


HERE = f"{MOE}:3 (Experts.apply)"
PLACES = [
    # (the tree) -> every live place of the bug: (place, the patch changes it there)
    ("pin", [(HERE, True)]),
    ("fixed", []),
    ("commented", []),  # a comment is no live code
    ("copied", [(HERE, True), ("vllm/other.py:6 (Emulated.apply)", False)]),
    ("twice", [(HERE, True), (f"{MOE}:12 (Experts2.apply)", False)]),
    ("helper", [("vllm/other.py:6 (Emulated.apply)", False)]),
]


@pytest.mark.parametrize(("on", "places"), PLACES)
def test_bug_places(trees: Trees, fix: Patch, on: str, places: list[tuple[str, bool]]) -> None:
    case = case_of(trees.repo, trees.on(on), fix, on, "1.1", None, False, {}, True)
    assert [c.text for c in bug_cues(case)] == ["or self.a1_gscale"]
    assert bug_places(case, True) == (places, [])
    assert bug_places(case, False) == ([(place, False) for place, _ in places], [])
