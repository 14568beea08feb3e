"""series/whole_files.py: a patch that adds a file, judged as a file on each tree (the path
free, the very file there, another file there), and one that also modifies a file: cut to the
files it modifies, then joined with the file it adds."""

from __future__ import annotations

import pytest
from tiny_series import BASE, FIXED, MOE, Trees
from vllm_patchset.series.classify import classify
from vllm_patchset.series.verdict import WHOLE_HEADERS
from vllm_patchset.series.whole_files import modified_part, verdict

NEW = "vllm/new.py"
NEW_TEXT = "x = 1\n"
ADDED = [
    # (the tree's files) -> (state, reason, warnings)
    ({MOE: BASE}, ("applies", "applies", ())),
    ({MOE: BASE, NEW: NEW_TEXT}, ("upstream", "upstream", ())),
    (
        {MOE: BASE, NEW: "x = 2\n"},
        ("conflict", "conflict", (f"{NEW}: b has another file at the path it adds",)),
    ),
]


@pytest.mark.parametrize(("files", "expected"), ADDED)
def test_a_file_added(
    trees: Trees, files: dict[str, str], expected: tuple[str, str, tuple[str, ...]]
) -> None:
    patch = trees.patch({MOE: BASE}, {MOE: BASE, NEW: NEW_TEXT})
    assert modified_part(patch) is None
    found = verdict(
        trees.repo, trees.tree(files), patch, None, base="b", version="1.1", was_applied=None
    )
    assert (found.state.value, found.reason.value, found.warnings) == expected
    assert [h.header for h in found.hunks] == [WHOLE_HEADERS["added"]]


BOTH = [
    # (the tree's files) -> (state, reason, warnings)
    ({MOE: BASE}, ("applies", "applies", ())),
    ({MOE: FIXED, NEW: NEW_TEXT}, ("upstream", "upstream", ())),
    (
        {MOE: FIXED},
        (
            "conflict",
            "conflict",
            (
                "its changes to the files it modifies are upstream, the file(s) it adds or"
                f" deletes are not: {NEW}; decide",
            ),
        ),
    ),
    (  # the file there already: the patch as placed here leaves it out
        {MOE: BASE, NEW: NEW_TEXT},
        (
            "applies",
            "refreshed",
            (f"{NEW}: there already (partly upstream); the patch as placed here leaves it out",),
        ),
    ),
]


@pytest.mark.parametrize(("files", "expected"), BOTH)
def test_a_file_added_and_one_modified(
    trees: Trees, files: dict[str, str], expected: tuple[str, str, tuple[str, ...]]
) -> None:
    patch = trees.patch({MOE: BASE}, {MOE: FIXED, NEW: NEW_TEXT})
    modified = modified_part(patch)
    assert modified is not None
    assert (modified.paths, modified.key) == ((MOE,), patch.key)
    found = classify(trees.repo, trees.tree(files), patch, base="b", version="1.1")
    assert (found.state.value, found.reason.value, found.warnings) == expected
    assert [h.number for h in found.hunks] == [1, 2]
