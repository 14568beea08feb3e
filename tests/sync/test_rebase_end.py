"""`sync/rebase_end.py`: what an interrupted rebase left, read from its journal (each phase,
a damaged journal, none), and an abort with no rebase in progress."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import project_at
from vllm_patchset.errors import BadInput
from vllm_patchset.overlay.upstream import Upstream
from vllm_patchset.sync.rebase_end import abort, interrupted_message
from vllm_patchset.sync.rebase_state import Phase, RebaseState, rebase_dir, save, state_path

UNCHANGED = (
    "the rebase changed nothing in patches/, pyproject.toml, the lock or CHANGELOG.md yet;"
    " `rebase --abort` removes .rebase/"
)
LEFT = [
    # (the journal's phase: None for none, "damaged" for one that does not read) -> the message
    (None, "the rebase had written nothing: nothing changed"),
    ("damaged", "the rebase's state file is damaged: `rebase --abort` restores the checkout"),
    (Phase.RUNNING, UNCHANGED),
    (Phase.STOPPED, UNCHANGED + " (or `rebase --continue`)"),
    (
        Phase.SWAP,
        "the rebase was moving its files in: `rebase --continue` finishes it,"
        " `rebase --abort` puts everything back",
    ),
    (
        Phase.DONE,
        "the rebase was done: the checkout is rebased; `rebase --continue` removes .rebase/"
        " (`rebase --abort` would put everything back)",
    ),
]


@pytest.mark.parametrize(("phase", "message"), LEFT)
def test_what_an_interrupt_left(tmp_path: Path, phase: Phase | str | None, message: str) -> None:
    project = project_at(tmp_path)
    if phase == "damaged":
        rebase_dir(project).mkdir()
        state_path(project).write_text("{")
    elif isinstance(phase, Phase):
        rebase_dir(project).mkdir()
        onto = Upstream("1.1", "1.1", "v1.1", "abc", "pypi:vllm-1.1.tar.gz")
        save(project, RebaseState(phase, "1.0", onto, None, None, "123"))
    assert interrupted_message(project) == message


def test_an_abort_with_no_rebase_in_progress_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as refused:
        abort(project_at(tmp_path))
    assert str(refused.value) == "no rebase in progress (start one with `rebase --onto VERSION`)"
