"""`sync/rebase_decisions.py`: each PATCH of the command line resolved to one patch's key, and
each decision checked against the plan's options and the new base, with the exact refusal."""

from __future__ import annotations

import pytest
from support import bare_patch
from vllm_patchset.errors import BadInput
from vllm_patchset.overlay.upstream import Upstream
from vllm_patchset.series.patches import Series
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync.rebase_decisions import not_settled, resolve_names, validate
from vllm_patchset.sync.rebase_state import (
    Action,
    Choice,
    Decision,
    Phase,
    RebaseState,
    Section,
    Step,
)

KEEP, DROP, UP = Choice.KEEP, Choice.DROP, Choice.RESOLVE_UPSTREAM
SERIES = Series(
    active=(bare_patch("0002-x.patch"), bare_patch("0003-y.patch"), bare_patch("0003-z.patch")),
    upstreamed=(bare_patch("upstreamed/0001-a.patch"),),
    parked=(bare_patch("parked/0004-b.patch"),),
)
NAMES = [
    # (choices, --release) -> the decisions, or the refusal
    ([(KEEP, "0002")], None, (Decision("0002-x.patch", KEEP),)),
    ([(DROP, "0001-a.patch")], None, (Decision("upstreamed/0001-a.patch", DROP),)),
    ([(UP, "0003-y.patch")], "1.1", (Decision("0003-y.patch", UP, "1.1"),)),
    ([(KEEP, "parked/0004-b.patch")], None, (Decision("parked/0004-b.patch", KEEP),)),
    ([(KEEP, "0009")], None, "--keep 0009: no such patch in patches/"),
    (
        [(KEEP, "0003")],
        None,
        "--keep 0003: ambiguous (0003-y.patch, 0003-z.patch); name the file",
    ),
    (
        [(KEEP, "0002"), (DROP, "0002-x.patch")],
        None,
        "--drop 0002-x.patch: 0002-x.patch has a decision already",
    ),
    ([(KEEP, "0002")], "1.1", "--release goes with --resolve-upstream PATCH"),
]


@pytest.mark.parametrize(("choices", "release", "expected"), NAMES)
def test_resolve_names(
    choices: list[tuple[Choice, str]],
    release: str | None,
    expected: tuple[Decision, ...] | str,
) -> None:
    if isinstance(expected, str):
        with pytest.raises(BadInput) as refused:
            resolve_names(SERIES, choices, release)
        assert str(refused.value) == expected
    else:
        assert resolve_names(SERIES, choices, release) == expected


RELEASE = Upstream("1.1", "1.1", "v1.1", "abc", "pypi:vllm-1.1.tar.gz")
GIT_REF = Upstream("git:main", None, "git/main", "abc", "git:local:main@abc")


def step(key: str, options: tuple[Choice, ...]) -> Step:
    verdict = Verdict(key, "1.1", State.CONFLICT, Reason.CONFLICT, State.CONFLICT, None, ())
    return Step(key, key, Section.SERIES, verdict, Action.DECISION, options=options)


PLAN = (step("0002-x.patch", (KEEP, DROP, UP)), step("0003-y.patch", ()))
CHECKS = [
    # (decision, new base) -> the refusal, or "" for none
    (Decision("0002-x.patch", DROP), RELEASE, ""),
    (Decision("0002-x.patch", UP, "1.0"), RELEASE, ""),
    (Decision("0002-x.patch", UP, "1.2"), RELEASE, "--resolve-upstream 0002-x.patch:"
     " --release 1.2 is newer than 1.1, which has the fix"),
    (Decision("0002-x.patch", UP), GIT_REF, "--resolve-upstream 0002-x.patch: git:main has no"
     " release version; say which release has the fix with --release VERSION"),
    (Decision("0002-x.patch", Choice.PORT), RELEASE, "--port 0002-x.patch: not an option for a"
     " patch conflict on 1.1 (its options: --keep, --drop, --resolve-upstream)"),
    (Decision("0003-y.patch", KEEP), RELEASE, "--keep 0003-y.patch: it needs no decision"
     " (conflict on 1.1)"),
    (Decision("0001-a.patch", KEEP), RELEASE, "--keep 0001-a.patch: it is settled already"),
]  # fmt: skip


@pytest.mark.parametrize(("decision", "onto", "refusal"), CHECKS)
def test_validate(decision: Decision, onto: Upstream, refusal: str) -> None:
    if not refusal:
        validate(PLAN, [decision], onto)
        return
    with pytest.raises(BadInput) as refused:
        validate(PLAN, [decision], onto)
    assert str(refused.value) == refusal


@pytest.mark.parametrize(
    ("decision", "refused"),
    [
        (Decision("0002-x.patch", DROP), True),  # taken before the stop
        (Decision("0003-y.patch", KEEP), True),  # decided already at the start
        (Decision("0004-z.patch", DROP), False),  # the stop itself
        (Decision("0005-w.patch", DROP), False),  # not reached yet
    ],
)
def test_not_settled(decision: Decision, refused: bool) -> None:
    state = RebaseState(
        Phase.STOPPED,
        "1.0",
        RELEASE,
        None,
        None,
        "123",
        decisions=(Decision("0003-y.patch", KEEP),),
        steps=(step("0002-x.patch", ()), step("0004-z.patch", (DROP,))),
    )
    if not refused:
        not_settled(state, [decision])
        return
    with pytest.raises(BadInput) as error:
        not_settled(state, [decision])
    assert str(error.value) == (
        f"{decision.choice.flag} {decision.patch}: settled already in this rebase"
        " (`rebase --abort` to start again)"
    )
