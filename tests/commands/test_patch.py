"""`vllm-patchset patch new` (commands/patch.py): its line parsed."""

from __future__ import annotations

import pytest
from command_lines import parse_line
from vllm_patchset.commands import patch

LINES = [
    (
        ("patch", "new", "moe: no tensor truthiness"),
        {
            "func": patch.cmd_patch_new,
            "writes_checkout": True,
            "needs": ("git",),
            "patch_command": "new",
            "name": "moe: no tensor truthiness",
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(patch, *argv) == {"command": argv[0], **values}
