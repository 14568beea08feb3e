"""`vllm-patchset backport` (commands/backport.py): its line parsed."""

from __future__ import annotations

import pytest
from command_lines import parse_line
from vllm_patchset.commands import backport

LINES = [
    (
        ("backport", "41630", "--from", "/src/vllm"),
        {
            "func": backport.cmd_backport,
            "writes_checkout": True,
            "needs": ("git",),
            "ref": "41630",
            "source": "/src/vllm",
            "branch": "HEAD",
        },
    ),
    (
        ("backport", "abc123", "--from", "/src/vllm", "--branch", "main"),
        {
            "func": backport.cmd_backport,
            "writes_checkout": True,
            "needs": ("git",),
            "ref": "abc123",
            "source": "/src/vllm",
            "branch": "main",
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(backport, *argv) == {"command": argv[0], **values}
