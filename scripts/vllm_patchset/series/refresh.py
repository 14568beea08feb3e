"""A file refreshed by token match: each hunk's change made at the token where its pre-image
is on the tree, the file's own layout kept (its indentation, a call joined onto one line), and
trusted only where the result's tokens are the post-images' (locate.py's tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_patchset.series.locate import Side, Token, change_runs, side, tokens, words
from vllm_patchset.series.patches import Hunk

Edit = tuple[int, int, str]  # (start offset, end offset, new text)


@dataclass(frozen=True)
class _File:
    """The text being refreshed, with its tokens, its lines and where each line starts."""

    text: str
    toks: tuple[Token, ...]
    lines: list[str]
    starts: list[int]

    def line_start(self, row: int) -> int:
        return self.starts[row - 1] if row - 1 < len(self.starts) else len(self.text)

    def offset(self, pos: tuple[int, int]) -> int:
        return self.line_start(pos[0]) + pos[1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _reindent(lines: list[str], delta: int) -> list[str]:
    if delta >= 0:
        return [" " * delta + line if line.strip() else line for line in lines]
    return [line[min(-delta, _indent(line)) :] if line.strip() else line for line in lines]


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for i, char in enumerate(text):
        if char == "\n":
            starts.append(i + 1)
    return starts


def refresh(text: str, placements: list[tuple[Hunk, int]]) -> str | None:
    """`text` with each hunk's change made at the token `at` where its pre-image is; None when
    the result's tokens are not the post-images' (the refresh is then not trusted)."""
    file = _File(text, tokens(text), text.split("\n"), _line_starts(text))
    edits: list[Edit] = []
    expected = list(words(text))
    for hunk, at in sorted(placements, key=lambda p: -p[1]):
        pre, post = side(hunk, post=False), side(hunk, post=True)
        expected[at : at + len(pre.tokens)] = list(post.words)
        for number, span in enumerate(pre.changes):
            edit = _edit(file, hunk, pre, at, number, span)
            if edit is None:
                return None  # an addition after the last token: no place to anchor it
            edits.append(edit)
    out = text
    for start, end, new in sorted(edits, key=lambda e: -e[0]):
        out = out[:start] + new + out[end:]
    if list(words(out)) != expected:
        return None
    return out


def _edit(
    file: _File, hunk: Hunk, pre: Side, at: int, number: int, span: tuple[int, int]
) -> Edit | None:
    """The edit of change `number` of the hunk placed at token `at`: the place of its removed
    tokens (`span`) rewritten, or its added lines put before the token after it; None for an
    addition after the hunk's last token."""
    a, b = span
    removed, added = change_runs(hunk)[number]
    if a < b:  # the removed tokens' place
        return _replaced(file, file.toks[at + a], file.toks[at + b - 1], removed, added)
    if a >= len(pre.tokens):
        return None
    return _inserted(file, pre, file.toks[at + a], a, added)


def _inline(added: list[str]) -> str:
    """The added lines' code joined onto one line (comments left out)."""
    return " ".join(s for line in added if (s := line.split("#", 1)[0].strip()))


def _replaced(
    file: _File, first_tok: Token, last_tok: Token, removed: list[str], added: list[str]
) -> Edit:
    """Removed tokens that fill their lines: those lines replaced by the added ones,
    reindented; else the tokens replaced inline."""
    old_first = next((line for line in removed if line.strip()), None)
    row, end_row = first_tok.start[0], last_tok.end[0]
    head = file.lines[row - 1][: first_tok.start[1]]
    tail = file.lines[end_row - 1][last_tok.end[1] :].split("#", 1)[0]
    if not head.strip() and not tail.strip() and old_first is not None:
        delta = _indent(file.lines[row - 1]) - _indent(old_first)
        new = "".join(f"{line}\n" for line in _reindent(added, delta))
        return file.line_start(row), file.line_start(end_row + 1), new
    return file.offset(first_tok.start), file.offset(last_tok.end), _inline(added)


def _inserted(file: _File, pre: Side, next_tok: Token, index: int, added: list[str]) -> Edit:
    """Added lines put before `next_tok` (token `index` of the pre-image): inline where code
    precedes it on its line, else as lines, reindented like the line they precede."""
    row = next_tok.start[0]
    if file.lines[row - 1][: next_tok.start[1]].strip():
        return file.offset(next_tok.start), file.offset(next_tok.start), _inline(added) + " "
    anchor = next((line for line in reversed(pre.lines) if line.strip()), "")
    old_next = _old_line_of(pre, index)
    delta = _indent(file.lines[row - 1]) - _indent(old_next if old_next is not None else anchor)
    # Blank lines before the next token in the hunk's pre-image stay before it.
    new = "".join(f"{line}\n" for line in _reindent(added, delta))
    return file.line_start(row), file.line_start(row), new


def _old_line_of(pre: Side, index: int) -> str | None:
    """The pre-image line that holds token `index`."""
    if index >= len(pre.tokens):
        return None
    return pre.lines[pre.tokens[index].start[0] - 1]
