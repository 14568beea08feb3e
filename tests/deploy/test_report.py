"""`deploy/report.py`: the state of an installed file against its lock entry, and the unified
diff an apply would make (files added and deleted, a last line without a newline)."""

from __future__ import annotations

import pytest
from vllm_patchset.deploy.report import diff_text, state_of, unified_diff
from vllm_patchset.overlay.lock import LockEntry

P, Q, R = "a" * 64, "b" * 64, "c" * 64
MODIFIED = LockEntry("vllm/x.py", P, Q, ("0001",))
ADDED = LockEntry("vllm/new.py", None, Q, ("0001",))
DELETED = LockEntry("vllm/old.py", P, None, ("0001",))
STATES = [
    (MODIFIED, Q, "patched"),
    (MODIFIED, P, "pristine"),
    (MODIFIED, R, "modified"),
    (MODIFIED, None, "missing"),
    (ADDED, None, "pristine"),
    (ADDED, R, "modified"),
    (DELETED, None, "patched"),
    (DELETED, P, "pristine"),
]


@pytest.mark.parametrize(("entry", "sha", "state"), STATES)
def test_state_of(entry: LockEntry, sha: str | None, state: str) -> None:
    assert state_of(entry, sha) == state


DIFFS = [
    (b"a\nb\n", b"a\nc\n", "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"),
    (None, b"new\n", "--- /dev/null\n+++ b/vllm/x.py\n@@ -0,0 +1 @@\n+new\n"),
    (b"old\n", None, "--- a/vllm/x.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-old\n"),
    (b"a\n", b"a", "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+a\n\\ No newline at end of file\n"),
    (b"same\n", b"same\n", ""),
]  # fmt: skip


@pytest.mark.parametrize(("before", "after", "diff"), DIFFS)
def test_unified_diff(before: bytes | None, after: bytes | None, diff: str) -> None:
    assert unified_diff("vllm/x.py", before, after) == diff


def test_diff_text_without_colour_is_the_diffs_in_order() -> None:
    assert diff_text({"b": "--- b\n", "a": "--- a\n"}, colour=False) == "--- b\n--- a\n"


def test_state_of_a_file_added_or_deleted() -> None:
    """A lock entry with no pristine sha256 (a file the overlay adds) or no patched one (a file
    it deletes): no file is its pristine (or patched) state."""
    added = LockEntry("vllm/n.py", None, "n1", ("p1",))
    deleted = LockEntry("vllm/d.py", "d0", None, ("p1",))
    assert [state_of(added, sha) for sha in (None, "n1", "x9")] == [
        "pristine",
        "patched",
        "modified",
    ]
    assert [state_of(deleted, sha) for sha in ("d0", None, "x9")] == [
        "pristine",
        "patched",
        "modified",
    ]
