"""series/locate.py on tiny sources: only live code is code (comments, string statements and
dead branches are not), and the readers are bounded (a text past the bounds is `unreadable`,
never a RecursionError)."""

from __future__ import annotations

import pytest
from vllm_patchset.series import locate

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
