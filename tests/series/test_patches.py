"""`series/patches.py` on files a patch adds or deletes whole: what it reads of them (the
change, the whole file), and the diffs it refuses, each with its message."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.errors import MalformedPatch
from vllm_patchset.series.patches import FilePatch, Hunk, parse_patch_bytes

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
