"""`series/patches.py`: a patch file (its files and hunks, its trailers, the ways it can be
malformed), the series file, and files a patch adds or deletes whole: what it reads of them
(the change, the whole file), and the diffs it refuses, each with its message."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.errors import MalformedPatch, PatchsetError
from vllm_patchset.series.patches import (
    FilePatch,
    Hunk,
    Trailers,
    parse_patch_bytes,
    read_series_entries,
    series_bytes,
)

HEAD = (
    "From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001\n"
    "From: a <a@b.c>\n"
    "Subject: [PATCH] x\n\n"
    "Why.\n\n"
    "Upstream-PR: none (local)\n"
    "Introduced-by: x\n"
    "Introduced-in: 1.0\n"
    "Applied-upstream: \n"
    "Regression-test: tests/gpu/test_x.py\n"
    "---\n"
)
NEW = "new file mode 100644\nindex 0000000..2222222\n--- /dev/null\n+++ b/vllm/n.py\n"
GONE = "deleted file mode 100644\nindex 1111111..0000000\n--- a/vllm/n.py\n+++ /dev/null\n"
ADDED_TWO = Hunk(0, 1, ("+x = 1", "+y = 2"))
SIGNATURE = "-- \n2.43.0\n\n"


def diff(header: str, body: str = "", path: str = "vllm/n.py", old: str = "") -> str:
    return f"diff --git a/{old or path} b/{path}\n{header}{body}"


# (the patch's diffs, the files it holds: path, change, hunks, the whole file)
READ = [
    (
        diff(NEW, "@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n") + SIGNATURE,
        [FilePatch("vllm/n.py", None, "2222222", (ADDED_TWO,), "added")],
        [b"x = 1\ny = 2\n"],
    ),
    (
        diff(GONE, "@@ -1,2 +0,0 @@\n-x = 1\n-y = 2\n") + SIGNATURE,
        [FilePatch("vllm/n.py", "1111111", None, (Hunk(1, 0, ("-x = 1", "-y = 2")),), "deleted")],
        [b"x = 1\ny = 2\n"],
    ),
    (  # an executable file, one line
        diff(NEW.replace("100644", "100755"), "@@ -0,0 +1 @@\n+x\n"),
        [FilePatch("vllm/n.py", None, "2222222", (Hunk(0, 1, ("+x",)),), "added")],
        [b"x\n"],
    ),
    (  # an empty file added (no hunk), then a file modified
        diff("new file mode 100644\nindex 0000000..e69de29\n", path="vllm/__init__.py")
        + "\n"
        + diff(
            "index 1111111..2222222 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py\n",
            "@@ -1 +1 @@\n-a\n+b\n",
            path="vllm/a.py",
        )
        + SIGNATURE,
        [
            FilePatch("vllm/__init__.py", None, "e69de29", (), "added"),
            FilePatch("vllm/a.py", "1111111", "2222222", (Hunk(1, 1, ("-a", "+b")),)),
        ],
        [b"", None],
    ),
    (  # an empty file deleted, last
        diff("deleted file mode 100644\nindex e69de29..0000000\n") + SIGNATURE,
        [FilePatch("vllm/n.py", "e69de29", None, (), "deleted")],
        [b""],
    ),
]


@pytest.mark.parametrize(("diffs", "files", "whole"), READ)
def test_added_and_deleted_files_read(
    diffs: str, files: list[FilePatch], whole: list[bytes | None]
) -> None:
    patch = parse_patch_bytes((HEAD + diffs).encode(), Path("/p/0001-x.patch"))
    assert list(patch.files) == files
    assert [f.whole for f in patch.files] == whole


# (the patch's diffs, the message after "<patch>: ")
REFUSED = [
    (
        diff(NEW, "@@ -0,0 +1 @@\n+x\n\\ No newline at end of file\n"),
        "vllm/n.py: added with no newline at its end (end the file with one)",
    ),
    (
        diff(GONE, "@@ -1 +0,0 @@\n-x\n\\ No newline at end of file\n"),
        "vllm/n.py: deleted with no newline at its end (end the file with one)",
    ),
    (
        diff(NEW, "@@ -0,0 +1 @@\n+x\n@@ -0,0 +3 @@\n+y\n"),
        "vllm/n.py: a file added whole takes one hunk of its lines",
    ),
    (
        diff(GONE, "@@ -1,2 +1 @@\n x\n-y\n"),
        "vllm/n.py: a file deleted whole takes one hunk of its lines",
    ),
    (  # /dev/null on the side that has the file
        diff(
            NEW.replace("--- /dev/null\n+++ b/vllm/n.py", "--- a/vllm/n.py\n+++ /dev/null"),
            "@@ -0,0 +1 @@\n+x\n",
        ),
        "vllm/n.py: '+++ /dev/null' names another file than its 'diff --git' line",
    ),
    (  # a file modified, said to be from /dev/null
        diff(
            "index 1111111..2222222 100644\n--- /dev/null\n+++ b/vllm/n.py\n",
            "@@ -1 +1 @@\n-a\n+b\n",
        ),
        "vllm/n.py: '--- /dev/null' names another file than its 'diff --git' line",
    ),
    (
        diff(NEW, "@@ -0,0 +1 @@\n+x\n", old="vllm/m.py"),
        "vllm/n.py: added under another name than vllm/m.py",
    ),
    (  # a link: still refused
        diff(NEW.replace("100644", "120000"), "@@ -0,0 +1 @@\n+/etc\n"),
        "vllm/n.py: new file mode 120000: a link or a submodule, refused",
    ),
    (
        diff(NEW, "@@ -0,0 +1 @@\n+x\n", path="setup.py"),
        "touches 'setup.py', outside the vllm/ package",
    ),
]


@pytest.mark.parametrize(("diffs", "why"), REFUSED)
def test_bad_added_or_deleted_files_refused(diffs: str, why: str) -> None:
    with pytest.raises(MalformedPatch) as error:
        parse_patch_bytes((HEAD + diffs).encode(), Path("/p/0001-x.patch"))
    assert str(error.value) == f"malformed patch /p/0001-x.patch: {why}"


# -- a patch file that modifies files --------------------------------------------------------------------------------
MESSAGE = (
    "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    "From: a <a@example.com>\nDate: Sat, 27 Jun 2026 00:00:00 +0000\n"
    "Subject: [PATCH 2/3] moe: a long\n subject, folded\n\n"
    "Why.\n\nUpstream-PR: https://x/pull/1\nIntroduced-by: y\nIntroduced-in: 0.24.0\n"
    "Applied-upstream:\nRegression-test: tests/a.py::t tests/b.py::u\n---\n x | 1 +\n\n"
)
TRAILERS = Trailers("https://x/pull/1", "y", "0.24.0", "", ("tests/a.py::t", "tests/b.py::u"))
ONE_LINE = "@@ -1,1 +1,1 @@\n-a\n+b\n"


def modified(
    path: str, hunk: str = ONE_LINE, index: str = "index 1111111..2222222 100644\n"
) -> str:
    return f"diff --git a/{path} b/{path}\n{index}--- a/{path}\n+++ b/{path}\n{hunk}"


def file_patch(
    path: str, *hunks: Hunk, old: str | None = "1111111", change: str = "modified"
) -> FilePatch:
    return FilePatch(path, old, "2222222", hunks, change)


A_TO_B = Hunk(1, 1, ("-a", "+b"))
PATCHES = [
    # (patch text, the files it holds)
    (MESSAGE + modified("vllm/a.py"), (file_patch("vllm/a.py", A_TO_B),)),
    (
        MESSAGE + modified("vllm/a.py") + modified("vllm/b.py", "@@ -3 +3,2 @@\n ctx\n+new\n"),
        (file_patch("vllm/a.py", A_TO_B), file_patch("vllm/b.py", Hunk(3, 3, (" ctx", "+new")))),
    ),
    (  # "\ No newline at end of file" belongs to no side
        MESSAGE
        + modified("vllm/a.py", "@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n\\ No newline"),
        (file_patch("vllm/a.py", A_TO_B),),
    ),
    (MESSAGE + modified("vllm/a.py") + "-- \n2.43.0\n\n", (file_patch("vllm/a.py", A_TO_B),)),
    (
        MESSAGE + modified("vllm/a.py", "@@ -1,2 +1,2 @@\n x\n-a\n+b\n@@ -9 +9 @@\n-c\n+d\n"),
        (file_patch("vllm/a.py", Hunk(1, 1, (" x", "-a", "+b")), Hunk(9, 9, ("-c", "+d"))),),
    ),
    (  # a new file: no old blob
        MESSAGE
        + modified(
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
    assert MESSAGE.count(TRAILER_BLOCK) == 1
    text = MESSAGE.replace(TRAILER_BLOCK, block) + modified("vllm/a.py")
    if isinstance(expected, Trailers):
        assert parse_patch_bytes(text.encode(), Path("x.patch")).trailers == expected
    else:
        with pytest.raises(PatchsetError) as error:
            parse_patch_bytes(text.encode(), Path("x.patch"))
        assert str(error.value) == f"malformed patch x.patch: {expected}"


# Malformed patches read by every command are in test_bad_input.py (through the CLI); these
# are the other ways a patch file can be wrong.
MALFORMED = [
    (
        (MESSAGE + modified("vllm/a.py")).replace("\n", "\r\n").encode(),
        "CRLF line endings (git format-patch writes LF: convert it, e.g. dos2unix)",
    ),
    (
        MESSAGE.replace("Why.", "Caf\xe9.").encode("latin-1") + modified("vllm/a.py").encode(),
        "unreadable ('utf-8' codec can't decode byte 0xe9 in position 187: invalid"
        " continuation byte)",
    ),
    (
        (
            MESSAGE + "diff --git a/vllm/x.bin b/vllm/x.bin\nindex 1..2 100644\nGIT binary patch\n"
        ).encode(),
        "binary diff of vllm/x.bin",
    ),
    ((MESSAGE + "diff --git a/vllm/a.py\n").encode(), "bad diff header 'diff --git a/vllm/a.py'"),
    (
        (MESSAGE + modified("vllm/a.py", "@@ -1,2 +1,2 @@\n-a\n?b\n")).encode(),
        "vllm/a.py: bad hunk line '?b'",
    ),
    (  # a rename out of the package: both sides are checked
        (MESSAGE + modified("vllm/a.py").replace("b/vllm/a.py", "b/setup.py")).encode(),
        "touches 'setup.py', outside the vllm/ package",
    ),
    (
        (MESSAGE + modified("vllm/sub/../a.py")).encode(),
        "touches 'vllm/sub/../a.py', outside the vllm/ package",
    ),
    (
        (MESSAGE + modified("vllm//a.py")).encode(),
        "touches 'vllm//a.py', not a plain path inside vllm/",
    ),
]


@pytest.mark.parametrize(("raw", "reason"), MALFORMED)
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
