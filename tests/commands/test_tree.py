"""`vllm-patchset tree` (commands/tree.py): its line parsed (the base options of options.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from command_lines import parse_line
from vllm_patchset.commands import tree

LINES = [
    (
        ("tree", "out"),
        {
            "func": tree.cmd_tree,
            "writes_checkout": False,
            "needs": ("git",),
            "dest": Path("out"),
            "pristine": False,
            "base": None,
            "git": None,
            "ref": None,
        },
    ),
    (
        ("tree", "out", "--pristine", "--git", "/src/vllm", "--ref", "v0.25.0"),
        {
            "func": tree.cmd_tree,
            "writes_checkout": False,
            "needs": ("git",),
            "dest": Path("out"),
            "pristine": True,
            "base": None,
            "git": "/src/vllm",
            "ref": "v0.25.0",
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(tree, *argv) == {"command": argv[0], **values}
