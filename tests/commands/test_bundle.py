"""`vllm-patchset bundle` (commands/bundle.py): its line parsed, the GPU host's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from command_lines import parse_line
from vllm_patchset.commands import bundle

LINES = [
    (
        ("bundle",),
        {
            "func": bundle.cmd_bundle,
            "writes_checkout": False,
            "needs": ("git",),
            "out": None,
            "wheels": True,
            "python_version": "3.12",
            "level": 9,
            "kit": None,
        },
    ),
    (
        (
            "bundle",
            "--out",
            "b.tar.xz",
            "--no-wheels",
            "--python-version",
            "3.13",
            "--level",
            "0",
            "--kit",
            "k",
        ),
        {
            "func": bundle.cmd_bundle,
            "writes_checkout": False,
            "needs": ("git",),
            "out": Path("b.tar.xz"),
            "wheels": False,
            "python_version": "3.13",
            "level": 0,
            "kit": Path("k"),
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(bundle, *argv) == {"command": argv[0], **values}
