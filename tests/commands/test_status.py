"""`vllm-patchset status` (commands/status.py): its line parsed."""

from __future__ import annotations

import pytest
from command_lines import parse_line
from vllm_patchset.commands import status

LINES = [
    (("status",), {"func": status.cmd_status, "writes_checkout": False, "needs": ("git",)}),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(status, *argv) == {"command": argv[0], **values}
