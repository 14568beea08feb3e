"""`series/edits.py`: a patch's `Applied-upstream:` trailer and its paths edited, the rest of
its bytes kept."""

from __future__ import annotations

import pytest
from vllm_patchset.series.edits import rewrite_paths, with_trailer

RAW = b"From 0\nSubject: [PATCH] x\n\nWhy.\n\nApplied-upstream:\nRegression-test: t\n---\n x | 1 +\n\ndiff --git a/vllm/a.py b/vllm/a.py\nindex 1..2 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1 +1 @@\n-Applied-upstream: a\n+b\n"


@pytest.mark.parametrize(
    ("release", "line"), [("0.25.0", b"Applied-upstream: 0.25.0"), ("", b"Applied-upstream:")]
)
def test_with_trailer_changes_the_message_only(release: str, line: bytes) -> None:
    out = with_trailer(RAW, release)
    assert out == RAW.replace(b"\nApplied-upstream:\n", b"\n" + line + b"\n", 1)
    assert out.endswith(b"-Applied-upstream: a\n+b\n")  # the diff is not touched
    # And back; a message with no such trailer is left as it is.
    assert with_trailer(out, "") == RAW
    no_trailer = RAW.replace(b"Applied-upstream:\nRegression", b"Regression", 1)
    assert with_trailer(no_trailer, release) == no_trailer


HEADERS = b"diff --git a/vllm/a.py b/vllm/a.py\nindex 1..2 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py"
TWO_FILES = RAW + RAW[RAW.index(b"diff --git") :].replace(b"vllm/a.py", b"vllm/c.py")
REWRITES = [
    # (patch, moves, the patch expected)
    (
        RAW,
        {"vllm/a.py": "vllm/b/a.py"},
        RAW.replace(HEADERS, HEADERS.replace(b"vllm/a.py", b"vllm/b/a.py")),
    ),
    (RAW, {"vllm/other.py": "vllm/x.py"}, RAW),
    (RAW, {"vllm/a": "vllm/b"}, RAW),  # whole paths only, never a prefix
    (
        TWO_FILES,
        {"vllm/c.py": "vllm/d.py", "vllm/a.py": "vllm/e.py"},
        TWO_FILES.replace(HEADERS, HEADERS.replace(b"vllm/a.py", b"vllm/e.py")).replace(
            HEADERS.replace(b"vllm/a.py", b"vllm/c.py"), HEADERS.replace(b"vllm/a.py", b"vllm/d.py")
        ),
    ),
    (
        RAW[: RAW.index(b"\ndiff --git")],
        {"vllm/a.py": "vllm/b.py"},
        RAW[: RAW.index(b"\ndiff --git")],
    ),
]


@pytest.mark.parametrize(("raw", "moves", "expected"), REWRITES)
def test_rewrite_paths_moves_the_diff_headers_only(
    raw: bytes, moves: dict[str, str], expected: bytes
) -> None:
    """The message (which quotes `-Applied-upstream: a` here) and the hunks are kept."""
    assert rewrite_paths(raw, moves) == expected
