"""console.py: lines broken at the terminal's width with a quoted command kept whole, and the
plain table used where rich is not installed (a serving image's wheel)."""

from __future__ import annotations

import pytest
from vllm_patchset import console

FIT = [
    # (text, columns, lines)
    ("short line", 80, ["short line"]),
    (
        "lock: stale: rebuild it with `vllm-patchset overlay build --update-lock`",
        40,
        ["lock: stale: rebuild it with", "  `vllm-patchset overlay build --update-lock`"],
    ),
    (
        "in the serving image: `pip install vllm_patchset-0.1.0+vllm0.24.0.abcd1234-py3-none-any.whl && vllm-patchset overlay apply`",
        60,
        [
            "in the serving image:",
            "  `pip install vllm_patchset-0.1.0+vllm0.24.0.abcd1234-py3-none-any.whl && vllm-patchset overlay apply`",
        ],
    ),
    (
        "  | quoted code is left as it is, however long it is",
        20,
        ["  | quoted code is left as it is, however long it is"],
    ),
    (
        "words then /a/path/longer/than/the/line",
        12,
        ["words then", "  /a/path/longer/than/the/line"],
    ),
]


@pytest.mark.parametrize(("text", "columns", "lines"), FIT)
def test_fit(text: str, columns: int, lines: list[str]) -> None:
    assert console.fit(text, columns).split("\n") == lines


def test_the_plain_table_lines_up_columns_two_apart() -> None:
    cells = [
        ["version", "0001", "0002"],
        ["0.24.0", "applies", "applies"],
        ["0.33.0", "upstream", "conflict"],
    ]
    assert console._plain_table(cells, 3, right=()) == (
        "version  0001      0002\n0.24.0   applies   applies\n0.33.0   upstream  conflict"
    )
    assert console._plain_table([["a", "1"], ["bb", "22"]], 2, right=(1,)) == "a    1\nbb  22"
