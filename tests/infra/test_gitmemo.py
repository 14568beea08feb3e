"""infra/gitmemo.py as a unit: an answer about an object id is asked once and kept (the last
`size` of them), an answer about a name every time, a None kept only when asked to, and a
repository made again at the same path is another."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.infra.gitmemo import Memo, is_object_id

SHA1, SHA256 = "a" * 40, "b" * 64


@pytest.mark.parametrize(
    ("rev", "kept"),
    [
        (SHA1, True),
        (SHA256, True),
        ("HEAD", False),
        ("v0.24.0", False),
        ("A" * 40, False),
        ("a" * 39, False),
    ],
)
def test_is_object_id(rev: str, kept: bool) -> None:
    assert is_object_id(rev) == kept


class Asker:
    def __init__(self, answer: object = "answer") -> None:
        self.asked, self.answer = 0, answer

    def __call__(self) -> object:
        self.asked += 1
        return self.answer


def test_an_object_is_asked_once_and_a_name_every_time(tmp_path: Path) -> None:
    memo, ask = Memo(8), Asker()
    for rev in (SHA1, SHA1, "HEAD", "HEAD"):
        assert memo.ask(tmp_path, rev, ("tree",), ask) == "answer"
    assert ask.asked == 3
    memo.ask(tmp_path, SHA1, ("other question",), ask)
    assert ask.asked == 4


def test_a_none_is_kept_only_when_asked_to(tmp_path: Path) -> None:
    memo, ask = Memo(8), Asker(None)
    for _ in range(2):
        memo.ask(tmp_path, SHA1, ("blob",), ask)
        memo.ask(tmp_path, SHA1, ("commit",), ask, keep_none=False)
    assert ask.asked == 3


def test_the_oldest_answer_goes_first(tmp_path: Path) -> None:
    memo, ask = Memo(2), Asker()
    for rev in ("1" * 40, "2" * 40, "1" * 40, "3" * 40, "1" * 40, "2" * 40):
        memo.ask(tmp_path, rev, (), ask)
    assert ask.asked == 4  # 1, 2, 3 and 2 again (1 was used last: 2 went)


def test_a_repository_made_again_is_another(tmp_path: Path) -> None:
    memo, ask, repo = Memo(8), Asker(), tmp_path / "repo"
    repo.mkdir()
    memo.ask(repo, SHA1, (), ask)
    repo.rename(tmp_path / "old")
    repo.mkdir()
    memo.ask(repo, SHA1, (), ask)
    memo.ask(tmp_path / "none", SHA1, (), ask)
    memo.ask(tmp_path / "none", SHA1, (), ask)  # no path: asked every time (git says why)
    assert ask.asked == 4
