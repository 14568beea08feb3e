"""`sync/checks.py`: what `check` finds in one verdict on the pin, for a patch of the series
and for an archived one. The whole of `check` (files, trailers, parked reasons, the lock) is
driven end to end by tests/test_sync_truth.py and tests/test_real_series.py."""

from __future__ import annotations

import dataclasses

import pytest
from vllm_patchset.series.verdict import HunkFinding, Reason, State, Verdict
from vllm_patchset.sync.checks import archive_problems, series_problems

A, U, C = State.APPLIES, State.UPSTREAM, State.CONFLICT
AT_OFFSET = HunkFinding("vllm/x.py", 1, "@@ -3 +3 @@", 5, 2, False, True, ("a",), (), None)
REFRESH = "refresh it (queue import, queue export)"
SERIES_CASES = [
    # (state, reason, hunks) -> the problems of a series patch on the pin 1.0
    (A, Reason.APPLIES, (), []),
    (C, Reason.CONFLICT, (), ["0001-x.patch: conflict on the pin 1.0"]),
    (U, Reason.UPSTREAM, (), ["0001-x.patch: upstream on the pin 1.0"]),
    (
        A,
        Reason.MOVED,
        (),
        [
            "0001-x.patch: applies to 1.0 only moved (its code there is reformatted, moved or in"
            f" several places): {REFRESH}"
        ],
    ),
    (A, Reason.APPLIES, (AT_OFFSET,), [f"0001-x.patch: applies to 1.0 only at an offset (2,): {REFRESH}"]),
]  # fmt: skip


@pytest.mark.parametrize(("state", "reason", "hunks", "problems"), SERIES_CASES)
def test_series_problems(
    state: State, reason: Reason, hunks: tuple[HunkFinding, ...], problems: list[str]
) -> None:
    verdict = Verdict("0001-x.patch", "1.0", state, reason, state, None, hunks)
    assert series_problems(verdict, "1.0") == problems


ARCHIVE_CASES = [
    # (state, the bug located) -> the problems of an archived patch on the pin
    (U, False, []),
    (A, False, ["upstreamed/0001-x.patch: archived as upstream, yet applies to the pin"]),
    (C, True, ["upstreamed/0001-x.patch: archived as upstream, yet its bug is on the pin"]),
    (C, False, []),  # its code changed, no bug in it
]


@pytest.mark.parametrize(("state", "bug", "problems"), ARCHIVE_CASES)
def test_archive_problems(state: State, bug: bool, problems: list[str]) -> None:
    key = "upstreamed/0001-x.patch"
    verdict = Verdict(key, "1.0", state, Reason(state.value), state, None, ())
    assert archive_problems(dataclasses.replace(verdict, bug_present=bug)) == problems
