"""Unit tables for the readers of the project's data: a patch file, the series file, release
versions, verdicts. No git, no vLLM: text in, value (or one error) out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from vllm_patchset.errors import PatchsetError
from vllm_patchset.infra import jsonfile
from vllm_patchset.series.patches import (
    FilePatch,
    Hunk,
    Trailers,
    parse_patch_bytes,
    read_series_entries,
    series_bytes,
)
from vllm_patchset.series.states import HunkFinding, Reason, State, Verdict
from vllm_patchset.versions import parse as parse_version

# -- a patch file --------------------------------------------------------------------------------
HEAD = (
    "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    "From: a <a@example.com>\nDate: Sat, 27 Jun 2026 00:00:00 +0000\n"
    "Subject: [PATCH 2/3] moe: a long\n subject, folded\n\n"
    "Why.\n\nUpstream-PR: https://x/pull/1\nIntroduced-by: y\nIntroduced-in: 0.24.0\n"
    "Applied-upstream:\nRegression-test: tests/a.py::t tests/b.py::u\n---\n x | 1 +\n\n"
)
TRAILERS = Trailers("https://x/pull/1", "y", "0.24.0", "", ("tests/a.py::t", "tests/b.py::u"))
ONE_LINE = "@@ -1,1 +1,1 @@\n-a\n+b\n"


def diff(path: str, hunk: str = ONE_LINE, index: str = "index 1111111..2222222 100644\n") -> str:
    return f"diff --git a/{path} b/{path}\n{index}--- a/{path}\n+++ b/{path}\n{hunk}"


def file_patch(
    path: str, *hunks: Hunk, old: str | None = "1111111", change: str = "modified"
) -> FilePatch:
    return FilePatch(path, old, "2222222", hunks, change)


A_TO_B = Hunk(1, 1, ("-a", "+b"))
PATCHES = [
    # (patch text, the files it holds)
    (HEAD + diff("vllm/a.py"), (file_patch("vllm/a.py", A_TO_B),)),
    (
        HEAD + diff("vllm/a.py") + diff("vllm/b.py", "@@ -3 +3,2 @@\n ctx\n+new\n"),
        (file_patch("vllm/a.py", A_TO_B), file_patch("vllm/b.py", Hunk(3, 3, (" ctx", "+new")))),
    ),
    (  # "\ No newline at end of file" belongs to no side
        HEAD
        + diff("vllm/a.py", "@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n\\ No newline"),
        (file_patch("vllm/a.py", A_TO_B),),
    ),
    (HEAD + diff("vllm/a.py") + "-- \n2.43.0\n\n", (file_patch("vllm/a.py", A_TO_B),)),
    (
        HEAD + diff("vllm/a.py", "@@ -1,2 +1,2 @@\n x\n-a\n+b\n@@ -9 +9 @@\n-c\n+d\n"),
        (file_patch("vllm/a.py", Hunk(1, 1, (" x", "-a", "+b")), Hunk(9, 9, ("-c", "+d"))),),
    ),
    (  # a new file: no old blob
        HEAD
        + diff(
            "vllm/n.py", "@@ -0,0 +1 @@\n+x\n", "new file mode 100644\nindex 0000000..2222222\n"
        ),
        (file_patch("vllm/n.py", Hunk(0, 1, ("+x",)), old=None, change="added"),),
    ),
]


@pytest.mark.parametrize(("text", "files"), PATCHES)
def test_patch_files_and_hunks(text: str, files: tuple[FilePatch, ...]) -> None:
    patch = parse_patch_bytes(text.encode(), Path("/p/0002-x.patch"), "upstreamed/0002-x.patch")
    assert (patch.name, patch.key, patch.subject) == (
        "0002-x.patch",
        "upstreamed/0002-x.patch",
        "moe: a long subject, folded",
    )
    assert (patch.trailers, patch.files, patch.raw) == (TRAILERS, files, text.encode())


def test_hunk_sides() -> None:
    hunk = Hunk(1, 1, (" x", "-a", "+b", "+c", " y"))
    assert (hunk.pre, hunk.post, hunk.removed, hunk.added) == (
        ("x", "a", "y"),
        ("x", "b", "c", "y"),
        ("a",),
        ("b", "c"),
    )


TRAILER_BLOCK = (
    "Upstream-PR: https://x/pull/1\nIntroduced-by: y\nIntroduced-in: 0.24.0\n"
    "Applied-upstream:\nRegression-test: tests/a.py::t tests/b.py::u\n"
)
TRAILER_CASES = [
    # (what replaces the trailer block, the trailers read, or the error)
    (
        "Upstream-PR: none (local)\nIntroduced-by: none\nIntroduced-in: nightly\n"
        "Applied-upstream: 0.21.0\nRegression-test: tests/a.py::t\n",
        Trailers("none (local)", "none", "nightly", "0.21.0", ("tests/a.py::t",)),
    ),
    (  # the first of two values is taken
        "Upstream-PR: u\nIntroduced-by: y\nIntroduced-in: 1.0\nApplied-upstream:\n"
        "Applied-upstream: 1.1\nRegression-test: t1\nRegression-test: t2 t3\n",
        Trailers("u", "y", "1.0", "", ("t1", "t2", "t3")),
    ),
    (
        "Upstream-PR: u\nIntroduced-by: y\nIntroduced-in: 1.0\nApplied-upstream:\nRegression-test:\n",
        "empty Regression-test trailer",
    ),
    (
        "Upstream-PR: u\n",
        "missing trailer(s) Introduced-by, Introduced-in, Applied-upstream, Regression-test",
    ),
]


@pytest.mark.parametrize(("block", "expected"), TRAILER_CASES)
def test_trailers(block: str, expected: Trailers | str) -> None:
    assert HEAD.count(TRAILER_BLOCK) == 1
    text = HEAD.replace(TRAILER_BLOCK, block) + diff("vllm/a.py")
    if isinstance(expected, Trailers):
        assert parse_patch_bytes(text.encode(), Path("x.patch")).trailers == expected
    else:
        with pytest.raises(PatchsetError) as error:
            parse_patch_bytes(text.encode(), Path("x.patch"))
        assert str(error.value) == f"malformed patch x.patch: {expected}"


# Malformed patches read by every command are in test_bad_input.py (through the CLI); these
# are the other ways a patch file can be wrong.
REFUSED = [
    (
        (HEAD + diff("vllm/a.py")).replace("\n", "\r\n").encode(),
        "CRLF line endings (git format-patch writes LF: convert it, e.g. dos2unix)",
    ),
    (
        HEAD.replace("Why.", "Caf\xe9.").encode("latin-1") + diff("vllm/a.py").encode(),
        "unreadable ('utf-8' codec can't decode byte 0xe9 in position 187: invalid"
        " continuation byte)",
    ),
    (
        (
            HEAD + "diff --git a/vllm/x.bin b/vllm/x.bin\nindex 1..2 100644\nGIT binary patch\n"
        ).encode(),
        "binary diff of vllm/x.bin",
    ),
    ((HEAD + "diff --git a/vllm/a.py\n").encode(), "bad diff header 'diff --git a/vllm/a.py'"),
    (
        (HEAD + diff("vllm/a.py", "@@ -1,2 +1,2 @@\n-a\n?b\n")).encode(),
        "vllm/a.py: bad hunk line '?b'",
    ),
    (  # a rename out of the package: both sides are checked
        (HEAD + diff("vllm/a.py").replace("b/vllm/a.py", "b/setup.py")).encode(),
        "touches 'setup.py', outside the vllm/ package",
    ),
    (
        (HEAD + diff("vllm/sub/../a.py")).encode(),
        "touches 'vllm/sub/../a.py', outside the vllm/ package",
    ),
    (
        (HEAD + diff("vllm//a.py")).encode(),
        "touches 'vllm//a.py', not a plain path inside vllm/",
    ),
]


@pytest.mark.parametrize(("raw", "reason"), REFUSED)
def test_malformed_patch_files(raw: bytes, reason: str) -> None:
    with pytest.raises(PatchsetError) as error:
        parse_patch_bytes(raw, Path("/p/x.patch"))
    assert str(error.value) == f"malformed patch /p/x.patch: {reason}"


# -- the series file -----------------------------------------------------------------------------
SERIES = [
    # (file text, entries, or the error after "<series file>")
    ("", []),
    ("0001-a.patch\n0002-b.patch\n", [("0001-a.patch", ""), ("0002-b.patch", "")]),
    (
        "# the series\n\n  0001-a.patch  \n0002-b.patch  # parked: rewritten upstream\n",
        [("0001-a.patch", ""), ("0002-b.patch", "parked: rewritten upstream")],
    ),
    ("0001-a.patch\r\n", [("0001-a.patch", "")]),
    ("0001-a.patch\n0001-a.patch\n", ": a patch is listed twice"),
    ("0001-a.patch\nsub/0002-b.patch\n", ":2: bad series entry 'sub/0002-b.patch'"),
    (".0001-a.patch\n", ":1: bad series entry '.0001-a.patch'"),
    ("0001-a.diff\n", ":1: bad series entry '0001-a.diff'"),
    ("0001-a.patch -p1\n", ":1: bad series entry '0001-a.patch -p1'"),
]


@pytest.mark.parametrize(("text", "expected"), SERIES)
def test_series_entries(tmp_path: Path, text: str, expected: list[tuple[str, str]] | str) -> None:
    series = tmp_path / "series"
    series.write_bytes(text.encode())
    if isinstance(expected, list):
        assert read_series_entries(series) == expected
    else:
        with pytest.raises(PatchsetError) as error:
            read_series_entries(series)
        assert str(error.value) == f"{series}{expected}"


def test_a_missing_series_file_is_an_empty_series(tmp_path: Path) -> None:
    assert read_series_entries(tmp_path / "series") == []


@pytest.mark.parametrize(
    ("names", "reasons", "text"),
    [
        ([], None, b""),
        (["0001-a.patch", "0002-b.patch"], None, b"0001-a.patch\n0002-b.patch\n"),
        (
            ["0001-a.patch", "0002-b.patch"],
            {"0002-b.patch": "kept: rewritten upstream", "0001-a.patch": ""},
            b"0001-a.patch\n0002-b.patch  # kept: rewritten upstream\n",
        ),
    ],
)
def test_series_bytes_read_back(
    tmp_path: Path, names: list[str], reasons: dict[str, str] | None, text: bytes
) -> None:
    assert series_bytes(names, reasons) == text
    (tmp_path / "series").write_bytes(text)
    assert read_series_entries(tmp_path / "series") == [
        (n, (reasons or {}).get(n, "")) for n in names
    ]


# -- versions ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.24.0", Version("0.24.0")),
        ("0.25.0rc1", Version("0.25.0rc1")),
        ("1!2.0", Version("1!2.0")),
        ("0.24.0+cu130", Version("0.24.0+cu130")),
        ("latest", None),
        ("", None),
        ("git:nightly", None),
        ("0.24.0-nightly", None),
    ],
)
def test_parse_version(text: str, version: Version | None) -> None:
    assert parse_version(text) == version


# -- verdicts as JSON (the rebase journal keeps them), through infra/codec.py -------------------
HUNK = HunkFinding("vllm/a.py", 1, "@@ -1,2 +1,2 @@", None, None, False, True, ("x",), ("y",), 7)
VERDICT = Verdict(
    patch="0001-x.patch",
    base="0.24.0",
    state=State.CONFLICT,
    reason=Reason.MOVED,
    text_state=State.CONFLICT,
    trailer_state=None,
    hunks=(HUNK,),
    warnings=("w",),
    three_way="conflict",
    moved_to=(("vllm/a.py", "vllm/b.py"),),
    bug_present=True,
)
VERDICT_DOC: dict[str, Any] = {
    "patch": "0001-x.patch",
    "base": "0.24.0",
    "state": "conflict",
    "reason": "moved",
    "text_state": "conflict",
    "trailer_state": None,
    "hunks": [
        {
            "file": "vllm/a.py",
            "number": 1,
            "header": "@@ -1,2 +1,2 @@",
            "applies_at": None,
            "offset": None,
            "result_present": False,
            "located": True,
            "expected": ["x"],
            "found": ["y"],
            "found_at": 7,
        }
    ],
    "warnings": ["w"],
    "cosmetic": [],
    "three_way": "conflict",
    "moved_to": [["vllm/a.py", "vllm/b.py"]],
    "candidates": [],
    "refreshed": "",
    "bug_present": True,
}
BAD_VERDICTS = [
    (
        {"state": "gone"},
        "'state' is 'gone', not one of 'applies', 'upstream', 'absent', 'conflict'",
    ),
    (
        {"hunks": [{**VERDICT_DOC["hunks"][0], "number": "1"}]},
        "hunks[0]: 'number' is a JSON string, not a JSON number",
    ),
    ({"moved_to": [["vllm/a.py"]]}, "'moved_to[0]' has 1 items, not 2"),
    ({"three_way": "maybe"}, "three_way 'maybe'"),
]


def test_a_verdict_as_json_and_back() -> None:
    assert json.dumps(VERDICT.to_doc()) == json.dumps(VERDICT_DOC)  # the keys in this order
    assert Verdict.from_doc(json.loads(json.dumps(VERDICT_DOC))) == VERDICT


@pytest.mark.parametrize(("change", "why"), BAD_VERDICTS)
def test_a_damaged_verdict_says_what_is_wrong(change: dict[str, object], why: str) -> None:
    with pytest.raises(jsonfile.BadJson) as error:
        Verdict.from_doc({**VERDICT_DOC, **change})
    assert str(error.value) == why
