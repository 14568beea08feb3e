"""`sync/rebase_rules.py`: which decisions settle a patch on the new base (`options`), which
are taken by hand in the worktree (`ported`, `hand_resolvable`), and where the rebase stops
(`stops`), as tables of cases."""

from __future__ import annotations

import dataclasses

import pytest
from support import bare_patch
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync.rebase_rules import hand_resolvable, is_local, options, ported, stops
from vllm_patchset.sync.rebase_state import Action, Choice, Section, Step

A, U, X, C = State.APPLIES, State.UPSTREAM, State.ABSENT, State.CONFLICT


def verdict(state: State, reason: Reason) -> Verdict:
    return Verdict("k", "1.1", state, reason, state, None, ())


KEEP, DROP, UP, PORT = Choice.KEEP, Choice.DROP, Choice.RESOLVE_UPSTREAM, Choice.PORT
OPTIONS = [
    # (section, state, reason, local patch, the bug located) -> options
    (Section.SERIES, A, Reason.APPLIES, False, False, ()),
    (Section.SERIES, A, Reason.MOVED, False, False, ()),
    (Section.SERIES, U, Reason.UPSTREAM, False, False, ()),  # archived with its release
    (Section.SERIES, U, Reason.UPSTREAM, True, False, (UP, KEEP, DROP)),  # never archived unasked
    (Section.SERIES, C, Reason.CONFLICT, False, False, (KEEP, DROP, UP)),  # or resolved by hand
    (Section.SERIES, C, Reason.REWRITTEN, True, False, (KEEP, DROP, UP)),
    (Section.SERIES, C, Reason.AMBIGUOUS, False, False, (KEEP, DROP, UP)),
    # The bug is there: ported by hand first (never only decisions that leave it live).
    (Section.SERIES, C, Reason.AMBIGUOUS, False, True, (PORT, KEEP, DROP)),
    (Section.SERIES, C, Reason.REWRITTEN, False, True, (PORT, KEEP, DROP)),  # partly gone
    (Section.SERIES, C, Reason.UNREADABLE, False, True, (PORT, KEEP, DROP)),  # past the bounds
    (Section.SERIES, X, Reason.NEVER_THERE, False, False, (KEEP, DROP)),
    (Section.UPSTREAMED, U, Reason.UPSTREAM, False, False, ()),
    (Section.UPSTREAMED, X, Reason.NEVER_THERE, False, False, ()),
    (
        Section.UPSTREAMED,
        A,
        Reason.APPLIES,
        False,
        False,
        (KEEP, DROP),
    ),  # upstream reverted the fix
    (Section.UPSTREAMED, C, Reason.CONFLICT, False, False, ()),  # fixed in other words
    (Section.UPSTREAMED, C, Reason.REWRITTEN, False, False, (DROP,)),  # its code is gone
    (Section.UPSTREAMED, C, Reason.CONFLICT, False, True, (KEEP, DROP)),  # the bug is back
    (Section.UPSTREAMED, C, Reason.AMBIGUOUS, False, True, (KEEP, DROP)),  # ... elsewhere
    (Section.PARKED, A, Reason.APPLIES, True, False, ()),
    (Section.PARKED, C, Reason.REWRITTEN, True, False, ()),
]


@pytest.mark.parametrize(("section", "state", "reason", "local", "bug", "expected"), OPTIONS)
def test_options(
    section: Section,
    state: State,
    reason: Reason,
    local: bool,
    bug: bool,
    expected: tuple[Choice, ...],
) -> None:
    """`--resolve-upstream` only where the text shows no bug; an archived patch whose bug is
    back is a decision (carry it again, or drop it) however it applies."""
    pr = "none (local)" if local else "https://github.com/vllm-project/vllm/pull/1"
    patch = bare_patch("x.patch", pr)
    assert is_local(patch) == local
    found = dataclasses.replace(verdict(state, reason), bug_present=bug)
    assert options(section, found, patch) == expected


@pytest.mark.parametrize(
    ("pr", "local"),
    [("none", True), ("None (local)", True), ("", True), ("https://github.com/x/y/pull/3", False)],
)
def test_is_local(pr: str, local: bool) -> None:
    assert is_local(bare_patch("x.patch", pr)) == local


def step(section: Section, state: State, reason: Reason, action: Action) -> Step:
    return Step("k", "k", section, verdict(state, reason), action)


STOPS = [
    # (action, planned) -> stops: a plan stops for decisions only, the real run at a conflict too
    (Action.DECISION, True, True),
    (Action.DECISION, False, True),
    (Action.CONFLICT, True, False),
    (Action.CONFLICT, False, True),
    (Action.REFRESHED, False, False),
    (Action.ARCHIVED, False, False),
    (Action.PARKED, True, False),
]


@pytest.mark.parametrize(("action", "planned", "expected"), STOPS)
def test_stops(action: Action, planned: bool, expected: bool) -> None:
    assert stops(step(Section.SERIES, C, Reason.CONFLICT, action), planned=planned) == expected


HAND_WORK = [
    # (section, state, reason, decision) -> (hand_resolvable, ported)
    (Section.SERIES, C, Reason.CONFLICT, KEEP, (True, False)),
    (Section.SERIES, C, Reason.MOVED, PORT, (True, True)),
    (Section.SERIES, C, Reason.REWRITTEN, PORT, (False, True)),  # the port is by hand anyway
    (Section.SERIES, C, Reason.AMBIGUOUS, DROP, (False, False)),
    (Section.SERIES, A, Reason.APPLIES, KEEP, (False, False)),
    (Section.UPSTREAMED, C, Reason.CONFLICT, KEEP, (False, True)),  # carried again, by hand
    (Section.UPSTREAMED, A, Reason.APPLIES, KEEP, (False, False)),  # carried again as it is
    (Section.UPSTREAMED, C, Reason.CONFLICT, DROP, (False, False)),
]


@pytest.mark.parametrize(("section", "state", "reason", "decision", "expected"), HAND_WORK)
def test_hand_work(
    section: Section, state: State, reason: Reason, decision: Choice, expected: tuple[bool, bool]
) -> None:
    found = step(section, state, reason, Action.DECISION)
    assert (hand_resolvable(found), ported(found, decision)) == expected
