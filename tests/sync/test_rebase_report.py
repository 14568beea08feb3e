"""`sync/rebase_report.py`: the range-diff verdict of a refreshed patch, and the names the
command line takes for a patch."""

from __future__ import annotations

import pytest
from series.test_edits import RAW
from vllm_patchset.series.edits import rewrite_paths
from vllm_patchset.sync.rebase_report import option_name, range_diff

RANGE_DIFFS = [
    (RAW, RAW, None, ("unchanged", "")),
    (
        RAW,
        RAW.replace(b"@@ -1 +1 @@", b"@@ -7 +7 @@").replace(b"index 1..2", b"index 3..4"),
        None,
        ("context-only churn", ""),
    ),
    (
        RAW,
        rewrite_paths(RAW, {"vllm/a.py": "vllm/b.py"}),
        {"vllm/a.py": "vllm/b.py"},
        ("unchanged", ""),
    ),
    (
        RAW,
        RAW.replace(b"+b\n", b"+c\n"),
        None,
        (
            "content changed",
            "--- old patch\n+++ new patch\n@@ -4,4 +4,4 @@\n @@ \n -Applied-upstream: a\n-+b\n++c\n \n",
        ),
    ),
    (RAW, RAW.replace(b"Why.", b"Why, in other words."), None, ("context-only churn", "")),
    (
        RAW,
        rewrite_paths(RAW, {"vllm/a.py": "vllm/b.py"}).replace(b"+b\n", b"+c\n"),
        {"vllm/a.py": "vllm/b.py"},
        (
            "content changed",
            "--- old patch\n+++ new patch\n@@ -4,4 +4,4 @@\n @@ \n -Applied-upstream: a\n-+b\n++c\n \n",
        ),
    ),
]


@pytest.mark.parametrize(("old", "new", "moves", "expected"), RANGE_DIFFS)
def test_range_diff(
    old: bytes, new: bytes, moves: dict[str, str] | None, expected: tuple[str, str]
) -> None:
    assert range_diff(old, new, moves) == expected


@pytest.mark.parametrize(
    ("key", "keys", "short"),
    [
        ("0002-x.patch", ("0001-a.patch", "0002-x.patch"), "0002"),
        ("upstreamed/0001-a.patch", ("upstreamed/0001-a.patch", "0001-b.patch"), "upstreamed/0001"),
        ("0001-b.patch", ("0001-b.patch", "0001-c.patch"), "0001-b.patch"),  # two 0001s
        ("fix.patch", ("fix.patch",), "fix.patch"),
    ],
)
def test_option_names(key: str, keys: tuple[str, ...], short: str) -> None:
    assert option_name(key, keys) == short
