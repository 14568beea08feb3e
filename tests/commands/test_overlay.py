"""The group `overlay` (commands/overlay.py): `build` and `pack` parsed, the deploy commands
joined to the group, and how a file's patched sha256 is shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from command_lines import parse_line
from vllm_patchset.commands import deploy, overlay

BUILD = {"func": overlay.cmd_overlay_build, "writes_checkout": True, "needs": ("git",)}
LINES = [
    (
        ("overlay", "build"),
        {**BUILD, "update_lock": False, "out": None, "skip": [], "base": None, "git": None, "ref": None},
    ),
    (
        ("overlay", "build", "--update-lock", "--skip", "a", "--skip", "b", "--pin", "0.25.0"),
        {**BUILD, "update_lock": True, "out": None, "skip": ["a", "b"], "base": "0.25.0", "git": None, "ref": None},
    ),
    (
        ("overlay", "pack", "--out", "dist2"),
        {"func": overlay.cmd_pack, "writes_checkout": True, "needs": (), "out": Path("dist2")},
    ),
    (
        ("overlay", "verify", "--python", "/venv/bin/python"),
        {"func": deploy.cmd_deploy, "writes_checkout": False, "needs": (), "min_python": (3, 10), "target": None, "python": "/venv/bin/python"},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(overlay, *argv) == {
        "command": "overlay",
        "overlay_command": argv[1],
        **values,
    }


SHA = "0123456789abcdef" * 4
SHA_WORDS: list[tuple[str | None, str, str]] = [
    (SHA, "modified", "0123456789ab"),
    (SHA, "added", "0123456789ab (added)"),
]
SHA_WORDS += [(None, "deleted", "(deleted)")]


@pytest.mark.parametrize(("sha", "change", "words"), SHA_WORDS)
def test_a_file_s_sha256_in_words(sha: str | None, change: str, words: str) -> None:
    assert overlay._sha_words(sha, change) == words
