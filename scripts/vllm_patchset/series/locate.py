"""Where a hunk's code is on a tree, layout and comments aside.

Code is compared as Python token streams (`tokenize`, with comments, line breaks and
indentation tokens dropped, string literals compared by value and a trailing comma before a
closing bracket ignored), so a file that upstream reformatted (another line length, a call
joined onto one line, other quotes) still shows the same code. A place in a file has an
enclosing scope (`ast`: the classes and functions around it, innermost last), so a hunk is
only placed where its code was: the same class and function it had on the old base.

Only live code counts: comments, string statements (docstrings, a string left on a line of its
own) and the bodies of dead branches (`if False:`, `if 0:`, `if TYPE_CHECKING:`) are no
tokens here, so a fix left in a comment, a string or a dead branch is no fix present, and a
dead branch between a bug's lines does not hide it.

The readers are bounded: a text past `MAX_CHARS`, or whose syntax tree is deeper than
`MAX_DEPTH` (a generated 1,200-term expression), is `unreadable` (a reason, never a
RecursionError): its tokens are none, its scopes unknown, and the caller says so.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache

from vllm_patchset.series.patches import Hunk

_LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}
_WORD = re.compile(r"\w+|[^\w\s]")
_CLOSERS = frozenset(")]}")
Scope = tuple[str, ...]  # ("Experts", "apply"): class Experts, method apply; () the module
MAX_CHARS = 4_000_000  # a source text read at all (vLLM's largest module: some 200 kB)
MAX_DEPTH = 200  # the deepest syntax tree read (vLLM's code: some 40 levels)


@dataclass(frozen=True)
class Token:
    text: str  # the token (a string literal: its value's repr)
    start: tuple[int, int]  # (row, 1-based; column, 0-based)
    end: tuple[int, int]


def _string(text: str) -> str:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return repr(value)


@lru_cache(maxsize=256)
def _parsed(text: str) -> tuple[ast.Module | None, str | None, frozenset[int]]:
    """The syntax tree of `text`, None, and the rows of no live code (see `dead_rows`); or
    None and why it is past the readers' bounds (None and None: not Python that `ast`
    reads, e.g. a fragment)."""
    if len(text) > MAX_CHARS:
        return None, f"{len(text):,} characters, more than the {MAX_CHARS:,} read", frozenset()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None, None, frozenset()
    except (RecursionError, MemoryError):
        return None, f"nested deeper than the {MAX_DEPTH} levels read", frozenset()
    dead = _dead_rows_of(tree)
    if dead is None:
        return None, f"nested deeper than the {MAX_DEPTH} levels read", frozenset()
    return tree, None, dead


def _dead_rows_of(tree: ast.Module) -> frozenset[int] | None:
    """The rows of `tree` that hold no live code (see `dead_rows`); None where the tree is
    nested deeper than MAX_DEPTH (walked without recursion: the depth is what is checked)."""
    dead: set[int] = set()
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return None
        dead.update(_unlive(node))
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return frozenset(dead)


def _unlive(node: ast.AST) -> range:
    """The rows of a string statement, or of a dead branch's body; none for other nodes."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant | ast.JoinedStr):
        if isinstance(node.value, ast.JoinedStr) or isinstance(node.value.value, str):
            return range(node.lineno, (node.end_lineno or node.lineno) + 1)
    elif isinstance(node, ast.If) and _dead_test(node.test) and node.body:
        last = node.body[-1].end_lineno or node.body[-1].lineno
        return range(node.body[0].lineno, last + 1)
    return range(0)


def parse(text: str) -> ast.Module | None:
    """`ast.parse(text)` within the bounds, else None."""
    return _parsed(text)[0]


def unreadable(text: str) -> str | None:
    """Why `text` is past the readers' bounds (None: it is not)."""
    return _parsed(text)[1]


def _dead_test(test: ast.expr) -> bool:
    if isinstance(test, ast.Constant):
        return not test.value
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name == "TYPE_CHECKING"


def dead_rows(text: str) -> frozenset[int]:
    """The rows of `text` that hold no live code: string statements (docstrings) and the
    bodies of dead branches (an `else` of one stays live); of a fragment `ast` does not
    read, its string statements as far as `tokenize` reads."""
    tree, _, dead = _parsed(text)
    return dead if tree is not None else _fragment_strings(text)


@lru_cache(maxsize=1024)
def _fragment_strings(text: str) -> frozenset[int]:
    return frozenset(_string_statements(text))


def _string_statements(text: str) -> set[int]:
    """Rows of the strings that are a statement of their own (read as far as `tokenize`
    reads: a fragment's strings up to where it fails)."""
    rows: set[int] = set()
    run: list[tokenize.TokenInfo] = []
    at_start = True
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
                continue
            if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER) or tok.string == ";":
                for s in run:
                    rows.update(range(s.start[0], s.end[0] + 1))
                run, at_start = [], True
                continue
            if at_start and tok.type == tokenize.STRING:
                run.append(tok)
                continue
            run, at_start = [], False
    except (tokenize.TokenError, SyntaxError):
        pass
    return rows


def shadows(text: str) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """What `text` holds that is no live code, row by row: (row, "a comment" | "a string" |
    "dead code", its words), to tell where a fix is when it is not live."""
    strings = _string_statements(text)
    dead = dead_rows(text) - strings
    out: list[tuple[int, str, tuple[str, ...]]] = []
    lines = text.split("\n")
    for row in sorted(strings | dead):
        if row <= len(lines):
            kind = "a string" if row in strings else "dead code"
            out.append((row, kind, _words_of(lines[row - 1].strip().strip("\"'"))))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], "a comment", _words_of(tok.string.lstrip("#"))))
    except (tokenize.TokenError, SyntaxError):
        pass
    return tuple(out)


def _words_of(fragment: str) -> tuple[str, ...]:
    return tuple(t.text for t in _raw_tokens([fragment.strip() + "\n"]))


def live_lines(text: str) -> list[str]:
    """The lines of `text` (split on newlines), those with no live code blanked."""
    dead = dead_rows(text)
    return ["" if row in dead else line for row, line in enumerate(text.split("\n"), 1)]


def readable(text: str) -> bool:
    """Whether `tokenize` reads `text` through (a fragment that starts or ends inside a string
    is not: its tokens are not the file's, and only its exact lines can be located)."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except (tokenize.TokenError, SyntaxError):
        return False
    return True


def _raw_tokens(lines: list[str]) -> list[Token]:
    """Tokens of `lines`; a fragment that `tokenize` cannot read through (a hunk that starts
    inside a string, an unmatched bracket) is read on from the next line, the line it failed
    on split into words."""
    out: list[Token] = []
    row = 0  # lines already read
    while row < len(lines):
        first = row + 1  # the 1-based row of the chunk's first line
        reader = io.StringIO("".join(lines[row:])).readline
        try:
            for tok in tokenize.generate_tokens(reader):
                if tok.type in _LAYOUT or tok.string == ";":  # `;` ends a statement, as a line
                    continue
                text = _string(tok.string) if tok.type == tokenize.STRING else tok.string
                out.append(
                    Token(
                        text,
                        (tok.start[0] + first - 1, tok.start[1]),
                        (tok.end[0] + first - 1, tok.end[1]),
                    )
                )
            return out
        except (tokenize.TokenError, SyntaxError) as exc:
            failed = _error_row(exc)
            after = out[-1].end[0] + 1 if out else first
            at = max(first, failed + first - 1 if failed else after)
            out = [t for t in out if t.start[0] < at]
            if at <= len(lines):
                line = lines[at - 1].split("#", 1)[0]
                out += [
                    Token(m.group(), (at, m.start()), (at, m.end())) for m in _WORD.finditer(line)
                ]
            row = at
    return out


def _error_row(exc: Exception) -> int:
    if isinstance(exc, SyntaxError):
        return exc.lineno or 0
    position = exc.args[1] if len(exc.args) > 1 else None
    return position[0] if isinstance(position, tuple) and position else 0


@lru_cache(maxsize=1024)
def tokens(text: str) -> tuple[Token, ...]:
    """The live code of `text` as tokens (see the module's docstring); none for a text past
    the readers' bounds."""
    if len(text) > MAX_CHARS or unreadable(text):
        return ()
    dead = dead_rows(text)
    try:
        raw = [t for t in _raw_tokens(text.splitlines(keepends=True)) if t.start[0] not in dead]
    except (RecursionError, MemoryError):  # pragma: no cover - the bounds come first
        return ()
    return tuple(
        t
        for i, t in enumerate(raw)
        if not (t.text == "," and i + 1 < len(raw) and raw[i + 1].text in _CLOSERS)
    )


def words(text: str) -> tuple[str, ...]:
    return tuple(t.text for t in tokens(text))


def find(hay: tuple[str, ...], needle: tuple[str, ...]) -> list[int]:
    """Every index where `needle` starts in `hay`."""
    if not needle:
        return []
    first, size = needle[0], len(needle)
    return [
        i
        for i, word in enumerate(hay)
        if word == first and hay[i : i + size] == needle and i + size <= len(hay)
    ]


def similarity(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


# -- a hunk's two sides ------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One side of a hunk (the pre-image or the post-image) as tokens, with the token range of
    each change on it (the removed tokens on the pre-image, the added ones on the post-image;
    an empty range where the change has none on this side: where it goes)."""

    tokens: tuple[Token, ...]
    changes: tuple[tuple[int, int], ...]
    lines: tuple[str, ...]
    readable: bool  # tokenize read it through (else only its exact lines are located)

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(t.text for t in self.tokens)


def side(hunk: Hunk, *, post: bool) -> Side:
    """The pre-image (or, `post`, the post-image) of `hunk` as tokens, with its changes."""
    lines, groups = _side_lines(hunk, post=post)
    joined = "".join(f"{line}\n" for line in lines)
    found = tokens(joined)
    changes = tuple(_change_span(found, start, count) for start, count in groups)
    return Side(found, changes, tuple(lines), _splittable(found, groups) and readable(joined))


def _side_lines(hunk: Hunk, *, post: bool) -> tuple[list[str], list[tuple[int, int]]]:
    """The lines of one side of `hunk`, and each change on it: (its first line on this side,
    its lines there)."""
    mine, other = ("+", "-") if post else ("-", "+")
    lines: list[str] = []
    groups: list[tuple[int, int]] = []
    in_run = False
    for line in hunk.lines:
        tag = line[0]
        if tag == " ":
            in_run = False
            lines.append(line[1:])
            continue
        if not in_run:
            groups.append((len(lines), 0))
            in_run = True
        if tag == mine:
            start, count = groups[-1]
            groups[-1] = (start, count + 1)
            lines.append(line[1:])
        elif tag != other:  # pragma: no cover - the parser allows nothing else
            raise ValueError(line)
    return lines, groups


def _change_span(found: tuple[Token, ...], start: int, count: int) -> tuple[int, int]:
    """The token range of a change of `count` lines after line `start` (empty where it has no
    lines on this side: where it goes)."""
    inside = [i for i, t in enumerate(found) if start < t.start[0] <= start + count]
    before = sum(1 for t in found if t.start[0] <= start)
    return (inside[0], inside[-1] + 1) if inside else (before, before)


def _splittable(found: tuple[Token, ...], groups: list[tuple[int, int]]) -> bool:
    """No token runs across a change's edge (a string the change edits inside cannot be
    split)."""
    changed = {start + k for start, count in groups for k in range(1, count + 1)}
    return all(
        len({row in changed for row in range(t.start[0], t.end[0] + 1)}) == 1
        for t in found
        if t.end[0] > t.start[0]
    )


def change_runs(hunk: Hunk) -> list[tuple[list[str], list[str]]]:
    """(removed lines, added lines) of each run of changed lines in the hunk."""
    runs: list[tuple[list[str], list[str]]] = []
    in_run = False
    for line in hunk.lines:
        if line[0] == " ":
            in_run = False
            continue
        if not in_run:
            runs.append(([], []))
            in_run = True
        (runs[-1][0] if line[0] == "-" else runs[-1][1]).append(line[1:])
    return runs


# -- scopes ------------------------------------------------------------------------------------
def definitions(text: str) -> tuple[tuple[int, int, Scope], ...]:
    """(first row, last row, scope) of each class and function of `text` (none where `ast`
    does not read it)."""
    return _definitions(text) or ()


@lru_cache(maxsize=256)
def _definitions(text: str) -> tuple[tuple[int, int, Scope], ...] | None:
    tree = parse(text)
    if tree is None:
        return None
    out: list[tuple[int, int, Scope]] = []
    stack: list[tuple[ast.AST, Scope]] = [(tree, ())]
    while stack:
        node, path = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                here = (*path, child.name)
                out.append((start, child.end_lineno or child.lineno, here))
                stack.append((child, here))
            else:
                stack.append((child, path))
    return tuple(sorted(out))


def scope_of(text: str, first: int, last: int) -> Scope | None:
    """The innermost class or function of `text` holding rows `first`..`last` (None: `text`
    is not Python that `ast` reads)."""
    definitions = _definitions(text)
    if definitions is None:
        return None
    best: Scope = ()
    for start, end, path in definitions:
        if start <= first and last <= end and len(path) > len(best):
            best = path
    return best


def class_bases(text: str, name: str) -> tuple[str, ...]:
    """The base classes (their last dotted names) of the classes called `name` in `text`."""
    tree = parse(text)
    if tree is None:
        return ()
    bases: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            for base in node.bases:
                dotted = ast.unparse(base)
                bases.append(dotted.rsplit(".", 1)[-1].split("[", 1)[0])
    return tuple(bases)


def _rows(toks: tuple[Token, ...], at: int, span: tuple[int, int], size: int) -> tuple[int, int]:
    """The rows of a change (`span`, within a side of `size` tokens placed at token `at` of
    `toks`): its own tokens' rows, or for an empty change the rows of its neighbours."""
    a, b = span
    if a < b:
        return toks[at + a].start[0], toks[at + b - 1].end[0]
    before = toks[at + a - 1].end[0] if a > 0 else None
    after = toks[at + a].start[0] if a < size else None
    first = before if before is not None else after
    last = after if after is not None else before
    assert first is not None and last is not None
    return first, last


def site_scope(text: str, at: int, hunk_side: Side) -> Scope | None:
    """The scope of the changes of `hunk_side` placed at token `at` of `text`: the innermost
    scope that holds every one of them."""
    toks = tokens(text)
    size = len(hunk_side.tokens)
    if not size:
        return None
    found: list[Scope] = []
    for span in hunk_side.changes:
        first, last = _rows(toks, at, span, size)
        scope = scope_of(text, first, last)
        if scope is None:
            return None
        found.append(scope)
    common: Scope = found[0] if found else ()
    for scope in found[1:]:
        n = 0
        while n < min(len(common), len(scope)) and common[n] == scope[n]:
            n += 1
        common = common[:n]
    return common


def dotted(scope: Scope | None) -> str:
    if scope is None:
        return "?"
    return ".".join(scope) or "<module>"
