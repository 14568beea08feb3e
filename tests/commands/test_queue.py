"""`vllm-patchset queue import|export` (commands/queue.py): their lines parsed."""

from __future__ import annotations

import pytest
from command_lines import parse_line
from vllm_patchset.commands import queue

LINES = [
    (
        ("queue", "import"),
        {
            "func": queue.cmd_queue_import,
            "writes_checkout": True,
            "needs": ("git",),
            "queue_command": "import",
            "force": False,
        },
    ),
    (
        ("queue", "import", "--force"),
        {
            "func": queue.cmd_queue_import,
            "writes_checkout": True,
            "needs": ("git",),
            "queue_command": "import",
            "force": True,
        },
    ),
    (
        ("queue", "export", "--drop"),
        {
            "func": queue.cmd_queue_export,
            "writes_checkout": True,
            "needs": ("git",),
            "queue_command": "export",
            "drop": True,
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(queue, *argv) == {"command": argv[0], **values}
