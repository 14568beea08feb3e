"""series/diagnosis.py: a verdict checked against where the bug of the fix of
tests/tiny_series.py is live: a copy the patch does not reach makes a settled verdict a stop
naming every place and where the fix is; no copy, or a move, leaves it as it is."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_series import MOE, Trees
from vllm_patchset.series.case import case_of
from vllm_patchset.series.diagnosis import diagnosed
from vllm_patchset.series.patches import Patch
from vllm_patchset.series.verdict import Reason, State, Verdict

COPIES = (
    f"{MOE}:3 (Experts.apply)",
    "vllm/other.py:6 (Emulated.apply)",
)
LINE = (
    f"the bug (`or self.a1_gscale`) is live at {', '.join(COPIES)}{{}}; its fix is nowhere in {MOE}"
)
DIAGNOSED = [
    # (the tree, the verdict's state and reason) -> (state, reason, warnings, candidates)
    ("pin", State.APPLIES, Reason.APPLIES, (State.APPLIES, Reason.APPLIES, ("w",), ())),
    (
        "copied",
        State.APPLIES,
        Reason.APPLIES,
        (
            State.CONFLICT,
            Reason.AMBIGUOUS,
            (LINE.format(" (the patch does not reach every place)"), "w"),
            COPIES,
        ),
    ),
    (  # a conflict that saw the bug: a line more
        "copied",
        State.CONFLICT,
        Reason.CONFLICT,
        (State.CONFLICT, Reason.CONFLICT, ("w", LINE.format("")), COPIES),
    ),
    ("copied", State.APPLIES, Reason.MOVED, (State.APPLIES, Reason.MOVED, ("w",), ())),
]


@pytest.mark.parametrize(("on", "state", "reason", "expected"), DIAGNOSED)
def test_diagnosed(
    trees: Trees,
    fix: Patch,
    on: str,
    state: State,
    reason: Reason,
    expected: tuple[State, Reason, tuple[str, ...], tuple[str, ...]],
) -> None:
    case = case_of(trees.repo, trees.on(on), fix, on, "1.1", None, False, {}, True)
    verdict = Verdict(fix.key, on, state, reason, state, None, case.hunks, ("w",))
    verdict = dataclasses.replace(verdict, bug_present=state == State.CONFLICT)
    got = diagnosed(case, verdict)
    assert (got.state, got.reason, got.warnings, got.candidates) == expected
