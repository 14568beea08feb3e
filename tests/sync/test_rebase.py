"""`sync/rebase.py`, the state machine: what `start` and `resume` refuse before they read
anything else. Its runs (plan, stops, `--continue`, the swap, kills at every write) are driven
end to end by tests/test_rebase_synthetic.py and tests/test_sync_families.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import project_at
from vllm_patchset.errors import BadInput
from vllm_patchset.sync.rebase import resume, start
from vllm_patchset.sync.rebase_state import rebase_dir, state_path


def test_a_second_rebase_is_refused_while_one_is_in_progress(tmp_path: Path) -> None:
    project = project_at(tmp_path)
    rebase_dir(project).mkdir()
    state_path(project).write_text("{}")
    with pytest.raises(BadInput) as refused:
        start(project, version="1.1", git=None, ref=None)
    assert str(refused.value) == (
        f"a rebase is in progress ({state_path(project)}): `rebase --continue` or `rebase --abort`"
    )


def test_continue_with_no_rebase_in_progress_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as refused:
        resume(project_at(tmp_path))
    assert str(refused.value) == "no rebase in progress (start one with `rebase --onto VERSION`)"
