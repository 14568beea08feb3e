"""`vllm-patchset fetch` (commands/fetch.py): what a user reads when the source is not what it
should be (a missing repository, an interpreter that is not Python)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from command_lines import parse_line
from support import cli
from vllm_patchset.commands import fetch
from vllm_patchset.infra.config import Project


def test_fetch_from_a_missing_repository_keeps_git_s_fatal_line(
    tiny: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "MISSING"
    argv = ("fetch", "--git", missing, "--ref", "v1.0")
    assert cli(capsys, tiny.root, *argv) == (
        2,
        "",
        f"vllm-patchset: git fetch failed: fatal: '{missing}' does not appear to be a git"
        " repository\n",
    )


def test_fetch_from_something_that_is_not_python_prints_no_script(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    # echo prints its arguments: the probe's script among them, which must not be shown.
    echo = shutil.which("echo")
    assert echo is not None
    assert cli(capsys, tiny.root, "fetch", "--python", echo) == (
        2,
        "",
        f"vllm-patchset: cannot run --python {echo}: no answer (is it a Python interpreter?)\n",
    )


FETCH = {"command": "fetch", "func": fetch.cmd_fetch, "writes_checkout": False, "needs": ("git",)}
NONE = {
    "version": None,
    "git": None,
    "ref": None,
    "installed": False,
    "python": None,
    "target": None,
}
LINES = [
    ((), NONE),
    (("0.25.0",), {**NONE, "version": "0.25.0"}),
    (("--git", "/src/vllm", "--ref", "v1"), {**NONE, "git": "/src/vllm", "ref": "v1"}),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(fetch, "fetch", *argv) == {**FETCH, **values}
