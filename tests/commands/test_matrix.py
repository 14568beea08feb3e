"""`vllm-patchset matrix` (commands/matrix.py): its line parsed (--ref repeated, --git shared with the other commands)."""

from __future__ import annotations

import pytest
from command_lines import parse_line
from vllm_patchset.commands import matrix

LINES = [
    (
        ("matrix",),
        {
            "func": matrix.cmd_matrix,
            "writes_checkout": False,
            "needs": ("git",),
            "versions": [],
            "git": None,
            "ref": None,
        },
    ),
    (
        ("matrix", "0.25.0", "0.26.0", "--git", "/src/vllm", "--ref", "main", "--ref", "v1"),
        {
            "func": matrix.cmd_matrix,
            "writes_checkout": False,
            "needs": ("git",),
            "versions": ["0.25.0", "0.26.0"],
            "git": "/src/vllm",
            "ref": ["main", "v1"],
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(matrix, *argv) == {"command": argv[0], **values}
