"""`sync/rebase_state.py`: the rebase's journal read back as it was written, its enums spelled
by their values."""

from __future__ import annotations

import json

from vllm_patchset.overlay.upstream import Upstream
from vllm_patchset.series.verdict import HunkFinding, Reason, State, Verdict
from vllm_patchset.sync.rebase_state import (
    Action,
    Choice,
    Decision,
    Phase,
    RebaseState,
    Section,
    Step,
)


def test_state_round_trip() -> None:
    finding = HunkFinding("vllm/x.py", 1, "@@ -1 +1 @@", None, None, False, True, ("a",), ("b",), 3)
    moved = Verdict(
        "0001-x.patch",
        "git:v1.1",
        State.CONFLICT,
        Reason.MOVED,
        State.CONFLICT,
        State.APPLIES,
        (finding,),
        ("moved: a -> b",),
        ("cosmetic",),
        "conflict",
        (("a", "b"),),
        ("c", "d"),
    )
    step = Step(
        "0001-x.patch",
        "0001-x.patch",
        Section.SERIES,
        moved,
        Action.CONFLICT,
        Choice.KEEP,
        (Choice.KEEP, Choice.DROP),
        ("n",),
        "c0ffee",
    )
    state = RebaseState(
        phase=Phase.STOPPED,
        old_pin="1.0",
        onto=Upstream("git:v1.1", "1.1", "git/v1.1", "abc", "git:local:v1.1@def"),
        git="/somewhere",
        ref="v1.1",
        project_head="123",
        decisions=(Decision("0001-x.patch", Choice.RESOLVE_UPSTREAM, "1.1"),),
        applied_before=("0001-x.patch",),
        renames=(("a", "b"),),
        steps=(step,),
        stop=Action.CONFLICT,
        stopped_head="456",
        moves=("patches",),
    )
    assert RebaseState.from_json(state.to_json()) == state
    # The journal spells phase, stop and action as strings (one written before they were enums
    # reads the same).
    doc = json.loads(state.to_json())
    assert (doc["phase"], doc["stop"], doc["steps"][0]["action"]) == (
        "stopped",
        "conflict",
        "conflict",
    )
