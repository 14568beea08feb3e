"""series/refresh.py: a hunk made at the token where its pre-image is, the file's own layout
kept (a call joined onto one line, another indentation, a line split in two), or None where
the refresh cannot be trusted."""

from __future__ import annotations

import pytest
from vllm_patchset.series import locate
from vllm_patchset.series.patches import Hunk
from vllm_patchset.series.refresh import refresh

RETURN_10 = Hunk(7, 7, ("     def f(self):", "-        return 1", "+        return 10", " "))
Y_BEFORE_Z = Hunk(2, 2, (" x = 1", "+y = 2", " z = 3"))
REFRESHES = [
    # (the file on the tree, the hunk, the file refreshed; None: not trusted)
    (  # joined onto one line: the change made inline
        "class A:\n    def f(self): return 1\n",
        RETURN_10,
        "class A:\n    def f(self): return 10\n",
    ),
    (  # nested one level deeper: the added line takes the file's indentation
        "class A:\n    class B:\n        def f(self):\n            return 1\n",
        RETURN_10,
        "class A:\n    class B:\n        def f(self):\n            return 10\n",
    ),
    (  # an added line goes before the token after it, indented like its line
        "def f():\n    x = 1\n    z = 3\n",
        Y_BEFORE_Z,
        "def f():\n    x = 1\n    y = 2\n    z = 3\n",
    ),
    (  # removed code split over two lines: both lines replaced
        "def f():\n    x = (1 +\n         2)\n    z = 3\n",
        Hunk(2, 2, ("-x = (1 + 2)", "+x = 3", " z = 3")),
        "def f():\n    x = 3\n    z = 3\n",
    ),
    (  # an addition after the hunk's last token has no place to anchor it
        "def f():\n    x = 1\n    z = 3\n",
        Hunk(2, 2, (" x = 1", "+y = 2")),
        None,
    ),
]


@pytest.mark.parametrize(("source", "hunk", "expected"), REFRESHES)
def test_refresh(source: str, hunk: Hunk, expected: str | None) -> None:
    pre = locate.side(hunk, post=False)
    (at,) = locate.find(locate.words(source), pre.words)
    assert refresh(source, [(hunk, at)]) == expected


def test_two_hunks_in_one_file() -> None:
    """Placed from the last to the first, each at its own token."""
    source = "def f():\n    x = 1\n    z = 3\n\n\ndef g(self):\n    return 1\n"
    hunks = [Y_BEFORE_Z, Hunk(6, 6, (" def g(self):", "-    return 1", "+    return 10"))]
    placements = [
        (h, locate.find(locate.words(source), locate.side(h, post=False).words)[0]) for h in hunks
    ]
    assert refresh(source, placements) == (
        "def f():\n    x = 1\n    y = 2\n    z = 3\n\n\ndef g(self):\n    return 10\n"
    )
