"""series/locate.py on tiny sources: only live code is code (comments, string statements and
dead branches are not), the readers are bounded (a text past the bounds is `unreadable`,
never a RecursionError), a hunk's pre-image is found by its tokens, in its scope."""

from __future__ import annotations

import pytest
from vllm_patchset.series import locate
from vllm_patchset.series.patches import Hunk

LIVE = [
    # (source, the live code's tokens)
    ("x = 1\nif False:\n    x = 2\nz = 3\n", ("x", "=", "1", "if", "False", ":", "z", "=", "3")),
    ("if TYPE_CHECKING:\n    import a\nb = 1\n", ("if", "TYPE_CHECKING", ":", "b", "=", "1")),
    (
        "if typing.TYPE_CHECKING:\n    import a\nelse:\n    a = None\n",
        ("if", "typing", ".", "TYPE_CHECKING", ":", "else", ":", "a", "=", "None"),
    ),
    ("if 0:\n    f(a or b)\n", ("if", "0", ":")),
    (
        'def f():\n    """Doc: a or b."""\n    return a\n',
        ("def", "f", "(", ")", ":", "return", "a"),
    ),
    ('"""Module.\n\nx = a or b\n"""\ny = 1\n', ("y", "=", "1")),
    ("x = 'a or b'\n", ("x", "=", "'a or b'")),  # a string that is a value: code
    ("x = 1  # x = a or b\n", ("x", "=", "1")),
]


@pytest.mark.parametrize(("source", "expected"), LIVE)
def test_only_live_code_has_tokens(source: str, expected: tuple[str, ...]) -> None:
    assert locate.words(source) == expected


SHADOWED = """\
def f(layer, w13):
    # was: t.to(w13.device)
    \"\"\"t.to(w13.device)\"\"\"
    if False:
        t.to(w13.device)
    return t.to(layer.weight.device)
"""


def test_what_is_not_live_code_and_where() -> None:
    found = [
        (row, kind)
        for row, kind, words in locate.shadows(SHADOWED)
        if locate.find(words, ("w13", ".", "device"))
    ]
    assert sorted(found) == [(2, "a comment"), (3, "a string"), (5, "dead code")]
    assert locate.live_lines(SHADOWED)[2:5] == ["", "    if False:", ""]


DEEP = "x = " + " + ".join(["1"] * 1200) + "\n"
BOUNDS = [
    # (source, why it is past the bounds)
    (DEEP, "nested deeper than the 200 levels read"),
    (
        "x = 1\n" + "#" * locate.MAX_CHARS + "\n",
        f"{locate.MAX_CHARS + 7:,} characters, more than the {locate.MAX_CHARS:,} read",
    ),
    ("x = " + " + ".join(["1"] * 150) + "\n", None),  # deep, within the bounds
    ("def f(:\n", None),  # not Python: no scopes, not past a bound
]


@pytest.mark.parametrize(("source", "why"), BOUNDS, ids=["deep", "large", "within", "broken"])
def test_readers_are_bounded(source: str, why: str | None) -> None:
    assert locate.unreadable(source) == why
    if why is not None:
        assert locate.tokens(source) == ()
        assert locate.scope_of(source, 1, 1) is None
        assert locate.class_bases(source, "A") == ()
        assert locate.dead_rows(source) == frozenset()


TOKENS = [
    # (source, the tokens: comments and layout dropped, strings by value, trailing commas)
    ("x = f(a,\n      b)  # c\n", ("x", "=", "f", "(", "a", ",", "b", ")")),
    ("x = f(\n    a,\n    b,\n)\n", ("x", "=", "f", "(", "a", ",", "b", ")")),
    ("x = 'q'\n", ("x", "=", "'q'")),
    ('x = "q"\n', ("x", "=", "'q'")),
    ("a = 1; b = 2\n", ("a", "=", "1", "b", "=", "2")),
    ("y = a \\\n    or b\n", ("y", "=", "a", "or", "b")),
    # A fragment that ends inside a bracket or starts in the middle of a call still reads.
    ("    self.x,\n)\n", ("self", ".", "x", ")")),
]


@pytest.mark.parametrize(("source", "expected"), TOKENS)
def test_tokens(source: str, expected: tuple[str, ...]) -> None:
    assert locate.words(source) == expected


SCOPES = """\
import os


class A:
    x = 1

    def f(self):
        return 1

    @property
    def g(self):
        return 2


def h():
    return 3
"""
SCOPE_CASES = [
    # (first row, last row) -> scope
    ((1, 1), ()),
    ((5, 5), ("A",)),
    ((8, 8), ("A", "f")),
    ((8, 9), ("A",)),  # the end of f and the blank line after it: the class
    ((10, 10), ("A", "g")),  # a decorator belongs to its function
    ((16, 16), ("h",)),
]


@pytest.mark.parametrize(("rows", "scope"), SCOPE_CASES)
def test_scope_of(rows: tuple[int, int], scope: tuple[str, ...]) -> None:
    assert locate.scope_of(SCOPES, *rows) == scope


HUNK = Hunk(
    7,
    7,
    (
        "     def f(self):",
        "-        return 1",
        "+        return 10",
        " ",
    ),
)
TWICE = SCOPES.replace("def h():\n    return 3\n", "class B:\n    def f(self):\n        return 1\n")
LOCATIONS = [
    # (source, the rows where the hunk's pre-image is, their scopes)
    (SCOPES, [7], [("A", "f")]),
    # Parentheses upstream added: other tokens, not the same code.
    (SCOPES.replace("        return 1\n", "        return (\n            1\n        )\n"), [], []),
    # Joined onto one line: the same tokens.
    (
        SCOPES.replace("    def f(self):\n        return 1", "    def f(self): return 1"),
        [7],
        [("A", "f")],
    ),
    # Two sites: the scope tells them apart.
    (TWICE, [7, 16], [("A", "f"), ("B", "f")]),
]


@pytest.mark.parametrize(("source", "rows", "scopes"), LOCATIONS)
def test_locate_pre_image(source: str, rows: list[int], scopes: list[tuple[str, ...]]) -> None:
    pre = locate.side(HUNK, post=False)
    found = locate.find(locate.words(source), pre.words)
    assert [locate.tokens(source)[at].start[0] for at in found] == rows
    assert [locate.site_scope(source, at, pre) for at in found] == scopes
