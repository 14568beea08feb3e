"""What the commands show a person and a script: progress bars and colours (rich decides
whether the stream is a terminal, and honours NO_COLOR, FORCE_COLOR and TERM=dumb), and the
one JSON shape of every `--json` document.

Progress goes to stderr and only on a terminal: piped or captured, a command's output is
exactly its text (or its one JSON document). The start-up guard never imports this module.

rich is optional (the `maintain` extra has it; a serving image's wheel, installed with
packaging alone, has not): without it the text is the same, plain (no colours, no progress
bars), its width $COLUMNS, else the terminal's, else 80, and tables are columns two apart.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


def has_rich() -> bool:
    """Whether rich can be imported here (found, not imported)."""
    return importlib.util.find_spec("rich") is not None


# -- the JSON documents ----------------------------------------------------------------------
def document(command: str, exit_code: int, body: Mapping[str, Any]) -> dict[str, Any]:
    """Every document has `ok` (exit code 0), `command` (as typed: "overlay apply") and
    `exit_code` first; an error adds `error` (the stderr line without its prefix), a report
    its own keys."""
    head = {"ok": exit_code == 0, "command": command, "exit_code": exit_code}
    return {**head, **{k: v for k, v in body.items() if k not in head}}


def print_json(command: str, exit_code: int, body: Mapping[str, Any]) -> None:
    print(json.dumps(document(command, exit_code, body), indent=2))


def emit(
    args: argparse.Namespace,
    text: str,
    body: Mapping[str, Any],
    exit_code: int = 0,
    *,
    verbatim: bool = False,
) -> int:
    """A command's one output on stdout: `text` fitted to the terminal (`fit`; `verbatim`
    text, a diff, as it is), or with --json `body` as a document. Returns the exit code, for
    `return emit(...)`."""
    if args.json:
        print_json(args.command_name, exit_code, body)
    elif text:
        print(text if verbatim else fit(text))
    return exit_code


# -- the terminal's width --------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colour codes `paint` adds


def width() -> int:
    """The columns of stdout: $COLUMNS, else the terminal's, else 80 (piped or captured)."""
    if has_rich():
        return _console(stderr=False).width
    columns = os.environ.get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((80, 24)).columns
    return 80


def fit(text: str, columns: int | None = None) -> str:
    """Each line of `text` in at most `columns` (default: `width()`), broken between words
    only (a path or a word longer than a line stays whole, and so does a command quoted in
    backticks), the rest of a line indented two more than its start. Quoted code (a line
    whose text starts with `| `) is left as it is."""
    columns = columns or width()
    out: list[str] = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        if len(_ANSI.sub("", line)) <= columns or body.startswith("| "):
            out.append(line)
            continue
        indent = " " * (len(line) - len(body))
        # A command in backticks (`vllm-patchset overlay build --update-lock`) is one word.
        kept = _QUOTED.sub(lambda m: m.group(0).replace(" ", _KEEP), body)
        wrapped = textwrap.wrap(
            kept,
            columns,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        out += [part.replace(_KEEP, " ") for part in wrapped] or [line]
    return "\n".join(out)


_QUOTED = re.compile(r"`[^`\n]+`")
_KEEP = "\x00"  # a space inside a quoted command while the line is broken


def table(
    heading: Sequence[str] | None,
    rows: Sequence[Sequence[tuple[str, str]]],
    *,
    colour: bool = False,
    right: Sequence[int] = (),
) -> str:
    """A table of (text, style) cells under `heading` (None: no heading) in the terminal's
    width: rich's `Table`, columns two apart, no borders, the columns `right` right-aligned;
    a cell too wide is wrapped between words inside its column, never inside a word (a path
    longer than the terminal makes the table wider). Styles as ANSI codes when `colour`; no
    trailing blanks."""
    columns = len(rows[0]) if rows else len(heading or ())
    cells = [*([heading] if heading else []), *([text for text, _ in row] for row in rows)]
    longest = [
        max((len(w) for r in cells for w in r[i].split()), default=0) for i in range(columns)
    ]
    if not has_rich():
        return _plain_table(cells, columns, right)
    return _rich_table(heading, rows, longest, colour=colour, right=right)


def _rich_table(
    heading: Sequence[str] | None,
    rows: Sequence[Sequence[tuple[str, str]]],
    longest: Sequence[int],
    *,
    colour: bool,
    right: Sequence[int],
) -> str:
    """The table through rich, each column at least as wide as its `longest` word."""
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Span, Text

    grid = Table(box=None, padding=(0, 2, 0, 0), show_edge=False, show_header=heading is not None)
    grid.header_style = ""
    columns = len(longest)
    for i in range(columns):
        name = heading[i] if heading else ""
        grid.add_column(name, min_width=longest[i], justify="right" if i in right else "left")
    for row in rows:
        # The style on the text only (a span), not on the blanks that pad its cell.
        grid.add_row(
            *(
                Text(text, spans=[Span(0, len(text), style)] if colour and style else [])
                for text, style in row
            )
        )
    console = Console(
        file=io.StringIO(),
        width=max(width(), sum(longest) + 2 * (columns - 1)),
        color_system="standard" if colour else None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    console.print(grid)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n"))


def _plain_table(cells: Sequence[Sequence[str]], columns: int, right: Sequence[int]) -> str:
    """The table without rich: each column as wide as its widest cell, two apart, no
    colours, nothing wrapped."""
    widths = [max((len(r[i]) for r in cells), default=0) for i in range(columns)]
    lines = []
    for r in cells:
        parts = [
            r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(columns)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


# -- colours ---------------------------------------------------------------------------------
def _console(stderr: bool) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False, emoji=False, soft_wrap=True)


def colours(stream: str = "stdout") -> bool:
    """Whether `stream` takes colours: a terminal, NO_COLOR unset (or FORCE_COLOR set);
    never without rich."""
    if not has_rich():
        return False
    console = _console(stream == "stderr")
    return console.color_system is not None and not console.no_color


def paint(text: str, style: str, *, on: bool) -> str:
    """`text` in `style` (a rich style: "red", "bold green") as ANSI codes when `on`. The
    text itself is never changed (no wrapping, no tab expansion): only codes are added."""
    if not on or not style or not text or not has_rich():
        return text
    from rich.color import ColorSystem
    from rich.style import Style

    return Style.parse(style).render(text, color_system=ColorSystem.STANDARD)


def diff_line_style(line: str) -> str:
    """The colour of a line of a unified diff, as git shows it."""
    if line.startswith(("+++ ", "--- ")):
        return "bold"
    if line.startswith("@@"):
        return "cyan"
    if line.startswith("+"):
        return "green"
    if line.startswith("-"):
        return "red"
    return ""


# -- progress --------------------------------------------------------------------------------
def _amount_column() -> Any:
    """A rich column: bytes for a download, `n/total` for steps, nothing while the total is
    unknown (a class made here, so that this module imports without rich)."""
    from rich.progress import (
        DownloadColumn,
        MofNCompleteColumn,
        ProgressColumn,
        Task,
        TransferSpeedColumn,
    )
    from rich.text import Text

    class _Amount(ProgressColumn):
        def __init__(self) -> None:
            super().__init__()
            self._bytes = DownloadColumn()
            self._speed = TransferSpeedColumn()
            self._steps = MofNCompleteColumn()

        def render(self, task: Task) -> Text:
            if task.fields.get("unit") == "bytes":
                return Text.assemble(self._bytes.render(task), " ", self._speed.render(task))
            return self._steps.render(task) if task.total is not None else Text("")

    return _Amount()


class Step:
    """One line of the progress display: `advance` it, or change its `describe`-tion."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def describe(self, description: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=description)


_live: Progress | None = None  # one display at a time: nested steps add lines to it


@contextmanager
def progress(description: str, total: float | None = None, *, unit: str = "") -> Iterator[Step]:
    """A progress line on stderr while the block runs (`unit="bytes"` for a download), gone
    when it ends; nothing at all when stderr is not a terminal, or without rich."""
    global _live
    if _live is None and not (has_rich() and _on_terminal()):
        yield Step(None, None)
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    outer = _live is None
    if _live is None:
        _live = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            _amount_column(),
            TimeElapsedColumn(),
            console=_console(stderr=True),
            transient=True,
        )
        _live.start()
    live = _live
    task = live.add_task(description, total=total, unit=unit)
    try:
        yield Step(live, task)
    finally:
        live.remove_task(task)
        if outer:
            live.stop()
            _live = None


def _on_terminal() -> bool:
    console = _console(stderr=True)
    return console.is_terminal and not console.is_dumb_terminal


__all__ = [
    "colours",
    "diff_line_style",
    "document",
    "emit",
    "fit",
    "has_rich",
    "paint",
    "print_json",
    "progress",
    "table",
    "width",
]
