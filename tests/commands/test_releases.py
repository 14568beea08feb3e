"""`vllm-patchset releases` (commands/releases.py): its line parsed (no git: it asks the index only)."""

from __future__ import annotations

import pytest
from command_lines import parse_line
from vllm_patchset.commands import releases

LINES = [
    (
        ("releases",),
        {
            "func": releases.cmd_releases,
            "writes_checkout": False,
            "needs": (),
            "newer_than_pin": False,
            "pre": False,
        },
    ),
    (
        ("releases", "--newer-than-pin", "--pre"),
        {
            "func": releases.cmd_releases,
            "writes_checkout": False,
            "needs": (),
            "newer_than_pin": True,
            "pre": True,
        },
    ),
]


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(releases, *argv) == {"command": argv[0], **values}
