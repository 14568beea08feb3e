"""Answers about git objects, kept once per process and repository: an object id names the
same bytes forever, so what git said about it once (a file of a tree, whether a patch applies to
a tree, the tree it makes) is kept (`Memo`); a revision that is a name (a tag, HEAD) is asked
every time. Standard library only: the git boundary (`gitrepo.py`) asks git, this keeps.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_T = TypeVar("_T")


class Memo:
    """The last `size` answers about git objects, keyed by the repository (its path and the
    inode there: a repository made again at the same path is another) and the question."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.answers: OrderedDict[tuple[object, ...], object] = OrderedDict()

    def ask(
        self,
        repo: Path,
        rev: str,
        question: tuple[object, ...],
        ask: Callable[[], _T],
        *,
        keep_none: bool = True,
    ) -> _T:
        """`ask()`, kept where `rev` is an object id (`is_object_id`): a name (a tag, HEAD)
        is asked every time. `keep_none=False`: a None answer is not kept (an object
        missing now may be fetched later)."""
        if not is_object_id(rev):
            return ask()
        try:
            key = (str(repo), os.stat(repo).st_ino, rev, *question)
        except OSError:
            return ask()  # git says what is wrong with the path
        if key in self.answers:
            self.answers.move_to_end(key)
            return self.answers[key]  # type: ignore[return-value]  # asked with this `ask`
        answer = ask()
        if answer is not None or keep_none:
            self.answers[key] = answer
            if len(self.answers) > self.size:
                self.answers.popitem(last=False)
        return answer


def is_object_id(rev: str) -> bool:
    """A full object id (SHA-1 or SHA-256), whose object never changes."""
    return _OBJECT_ID.fullmatch(rev) is not None
