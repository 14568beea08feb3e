"""series/verdict.py: the verdict contract and the state rules. What the trailers say on a
version, what the text, the trailers, the previous base and a 3-way merge make of a patch
(`decide`), the text's state from the line findings, and a verdict as JSON and back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vllm_patchset.infra import jsonfile
from vllm_patchset.series.patches import Patch, Trailers
from vllm_patchset.series.verdict import (
    HunkFinding,
    Reason,
    State,
    Verdict,
    decide,
    text_state,
    trailer_state,
)

# -- the trailers' state -------------------------------------------------------------------------
TRAILER_STATES = [
    # (Introduced-in, Applied-upstream, version, state)
    ("0.24.0", "0.25.0", "0.23.0", State.ABSENT),
    ("0.24.0", "0.25.0", "0.24.0", State.APPLIES),
    ("0.24.0", "0.25.0", "0.25.0rc1", State.APPLIES),  # a pre-release of 0.25.0 is before it
    ("0.24.0", "0.25.0", "0.25.0", State.UPSTREAM),
    ("0.24.0", "0.25.0", "0.25.0.post1", State.UPSTREAM),
    ("0.24.0", "", "0.33.0", State.APPLIES),
    ("0.20.0", "", "0.22.1", State.APPLIES),
    ("0.22.1", "", "0.22.0", State.ABSENT),
    ("nightly", "0.21.0", "0.20.2", State.ABSENT),
    ("nightly", "0.21.0", "0.21.0", State.UPSTREAM),
    ("nightly", "", "0.21.0", None),
    ("0.24.0", "0.25.0", None, None),  # a git ref with no version: the trailers cannot say
]


@pytest.mark.parametrize(("introduced", "merged", "version", "state"), TRAILER_STATES)
def test_trailer_state(
    introduced: str, merged: str, version: str | None, state: State | None
) -> None:
    trailers = Trailers("https://x/pull/1", "y", introduced, merged, ("tests/t.py::t",))
    patch = Patch("x.patch", "x.patch", Path("x.patch"), "x", trailers, (), b"")
    assert trailer_state(patch, version) == state


# -- the state rules -----------------------------------------------------------------------------
A, U, X, C = State.APPLIES, State.UPSTREAM, State.ABSENT, State.CONFLICT
GONE_APPLIED = "it applied on the old pin; the code it changes is gone from 1.1 (rewritten or removed upstream)"
RULES = [
    # (text, trailers, was applied on the old pin, 3-way, ambiguous, pending) -> (state, reason, warnings)
    ((A, A, None, None, False, True), (A, Reason.APPLIES, ())),
    (
        (A, U, True, None, False, False),
        (
            A,
            Reason.APPLIES,
            (
                "text says applies, trailers say upstream: the bug is back (a revert?); the text"
                " decides",
            ),
        ),
    ),
    ((U, A, True, None, False, True), (U, Reason.UPSTREAM, ())),  # merged upstream, trailer pending
    (
        (U, A, True, None, False, False),
        (U, Reason.UPSTREAM, ("text says upstream, trailers say applies",)),
    ),
    (
        (U, X, None, None, False, True),
        (U, Reason.UPSTREAM, ("text says upstream, trailers say absent",)),
    ),
    ((C, A, True, "clean", False, True), (A, Reason.THREE_WAY, ())),
    ((C, A, True, "conflict", False, True), (C, Reason.CONFLICT, ())),
    (
        (C, X, None, "conflict", False, True),
        (C, Reason.CONFLICT, ("text says conflict, trailers say absent",)),
    ),
    (
        (C, U, None, "conflict", False, False),
        # The trailers never make a patch upstream: the code it changes is there.
        (
            C,
            Reason.CONFLICT,
            (
                "text says conflict, trailers say upstream: the code it changes is still there,"
                " changed; not upstream",
            ),
        ),
    ),
    ((X, X, True, None, False, True), (X, Reason.NEVER_THERE, ())),
    ((X, None, None, None, False, True), (X, Reason.NOT_FOUND, ())),
    ((X, None, False, None, False, True), (X, Reason.NOT_FOUND, ())),
    ((X, None, True, None, False, True), (C, Reason.REWRITTEN, (GONE_APPLIED,))),
    ((X, A, True, None, False, True), (C, Reason.REWRITTEN, (GONE_APPLIED,))),
    (
        (X, A, None, None, False, True),
        (
            C,
            Reason.REWRITTEN,
            (
                "text says absent, trailers say applies: the code it changes is gone (rewritten or removed upstream)",
            ),
        ),
    ),
    (
        (X, A, True, "clean", False, True),
        (
            C,
            Reason.REWRITTEN,
            (GONE_APPLIED, "3-way merge: clean, although the code it changes was not found"),
        ),
    ),
    ((X, A, True, None, True, True), (C, Reason.AMBIGUOUS, ())),
    (
        (X, U, True, None, False, False),
        # Neither the fix nor the bug: a decision, never `upstream` on the trailers' word.
        (
            C,
            Reason.REWRITTEN,
            (
                "text says absent, trailers say upstream: neither its fix nor the code it"
                " changes is there (rewritten upstream?); not taken as upstream",
            ),
        ),
    ),
]


@pytest.mark.parametrize(("signals", "expected"), RULES)
def test_state_rules(
    signals: tuple[State, State | None, bool | None, str | None, bool, bool],
    expected: tuple[State, Reason, tuple[str, ...]],
) -> None:
    text, trailers, was_applied, three_way, ambiguous, pending = signals
    got = decide(
        text,
        trailers,
        was_applied=was_applied,
        three_way=three_way,
        ambiguous=ambiguous,
        pending=pending,
        base="1.1",
    )
    assert got == expected


def finding(result_present: bool, located: bool) -> HunkFinding:
    return HunkFinding(
        "vllm/x.py", 1, "@@ -1 +1 @@", None, None, result_present, located, (), (), 0
    )


UPSTREAM, LOCATED, GONE = finding(True, True), finding(False, True), finding(False, False)
TEXT_STATES = [
    # (the hunks found, the patch applies as it is) -> the text's state
    ((GONE,), True, A),  # applying is the proof, whatever a hunk search says
    ((UPSTREAM, UPSTREAM), False, U),  # every hunk's result is there
    ((UPSTREAM, LOCATED), False, C),  # some is there, the rest is located but differs
    ((LOCATED,), False, C),
    ((UPSTREAM, GONE), False, X),  # part of it is nowhere: not upstream, not a conflict
    ((GONE,), False, X),
]


@pytest.mark.parametrize(("hunks", "applies", "state"), TEXT_STATES)
def test_text_state(hunks: tuple[HunkFinding, ...], applies: bool, state: State) -> None:
    assert text_state(hunks, applies) == state


# -- verdicts as JSON (the rebase journal keeps them), through infra/codec.py -------------------
HUNK = HunkFinding("vllm/a.py", 1, "@@ -1,2 +1,2 @@", None, None, False, True, ("x",), ("y",), 7)
VERDICT = Verdict(
    patch="0001-x.patch",
    base="0.24.0",
    state=State.CONFLICT,
    reason=Reason.MOVED,
    text_state=State.CONFLICT,
    trailer_state=None,
    hunks=(HUNK,),
    warnings=("w",),
    three_way="conflict",
    moved_to=(("vllm/a.py", "vllm/b.py"),),
    bug_present=True,
)
VERDICT_DOC: dict[str, Any] = {
    "patch": "0001-x.patch",
    "base": "0.24.0",
    "state": "conflict",
    "reason": "moved",
    "text_state": "conflict",
    "trailer_state": None,
    "hunks": [
        {
            "file": "vllm/a.py",
            "number": 1,
            "header": "@@ -1,2 +1,2 @@",
            "applies_at": None,
            "offset": None,
            "result_present": False,
            "located": True,
            "expected": ["x"],
            "found": ["y"],
            "found_at": 7,
        }
    ],
    "warnings": ["w"],
    "cosmetic": [],
    "three_way": "conflict",
    "moved_to": [["vllm/a.py", "vllm/b.py"]],
    "candidates": [],
    "refreshed": "",
    "bug_present": True,
}
BAD_VERDICTS = [
    (
        {"state": "gone"},
        "'state' is 'gone', not one of 'applies', 'upstream', 'absent', 'conflict'",
    ),
    (
        {"hunks": [{**VERDICT_DOC["hunks"][0], "number": "1"}]},
        "hunks[0]: 'number' is a JSON string, not a JSON number",
    ),
    ({"moved_to": [["vllm/a.py"]]}, "'moved_to[0]' has 1 items, not 2"),
    ({"three_way": "maybe"}, "three_way 'maybe'"),
]


def test_a_verdict_as_json_and_back() -> None:
    assert json.dumps(VERDICT.to_doc()) == json.dumps(VERDICT_DOC)  # the keys in this order
    assert Verdict.from_doc(json.loads(json.dumps(VERDICT_DOC))) == VERDICT


@pytest.mark.parametrize(("change", "why"), BAD_VERDICTS)
def test_a_damaged_verdict_says_what_is_wrong(change: dict[str, object], why: str) -> None:
    with pytest.raises(jsonfile.BadJson) as error:
        Verdict.from_doc({**VERDICT_DOC, **change})
    assert str(error.value) == why
