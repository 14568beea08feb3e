"""The rebase's rules, pure functions of a step: which decisions settle a patch on the new base
(`options`), which decisions are taken by hand in the worktree (`ported`, `hand_resolvable`),
and the one rule for where the rebase stops (`stops`)."""

from __future__ import annotations

from vllm_patchset.series.patches import Patch
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync.rebase_state import Action, Choice, Section, Step


def is_local(patch: Patch) -> bool:
    """A patch written here, with no upstream pull request (`Upstream-PR: none ...`)."""
    words = patch.trailers.upstream_pr.split()
    return not words or words[0].lower() == "none"


def options(section: Section, verdict: Verdict, patch: Patch) -> tuple[Choice, ...]:
    """The decisions that settle a patch on the new base; () when it needs none.
    `--resolve-upstream` only where the text shows no bug (`Verdict.bug_present`): the code
    decides, never the trailers."""
    if section == Section.PARKED:
        return ()
    resolve = () if verdict.bug_present else (Choice.RESOLVE_UPSTREAM,)
    if section == Section.UPSTREAMED:
        if verdict.state == State.APPLIES or verdict.bug_present:  # the bug is back
            return (Choice.KEEP, Choice.DROP)
        # Changed code with no bug in it (fixed in other words, as resolved): it keeps
        # guarding; code that is gone altogether is the maintainer's to drop.
        gone = verdict.state == State.CONFLICT and verdict.reason != Reason.CONFLICT
        return (Choice.DROP,) if gone else ()
    if verdict.state == State.APPLIES:
        return ()
    if verdict.state == State.UPSTREAM:
        # Never archived as upstream without the maintainer saying so: nothing upstream
        # merged it, the same text is there by coincidence or by another change; nor where
        # its trailers name a later release than this one (the text and the trailers
        # disagree: the maintainer says which is right).
        disagree = verdict.trailer_state == State.APPLIES and bool(patch.trailers.applied_upstream)
        if is_local(patch) or disagree:
            return (Choice.RESOLVE_UPSTREAM, Choice.KEEP, Choice.DROP)
        return ()
    if verdict.state == State.CONFLICT:
        if verdict.bug_present:  # the safe one first: port it by hand
            return (Choice.PORT, Choice.KEEP, Choice.DROP)
        return (Choice.KEEP, Choice.DROP, *resolve)
    return (Choice.KEEP, Choice.DROP)  # absent: the code was never there


def ported(step: Step, decision: Choice) -> bool:
    """A decision taken by hand in the worktree: `--port`, or `--keep` of an archived fix whose
    bug is live where it no longer applies as it is (a copy, a move: a conflict)."""
    return decision == Choice.PORT or (
        decision == Choice.KEEP
        and step.section == Section.UPSTREAMED
        and step.verdict.state == State.CONFLICT
    )


def stops(step: Step, *, planned: bool) -> bool:
    """The one rule for where the rebase stops. The real run stops at its first conflict or
    decision. A plan (the dry run before anything is taken) stops for decisions only, so that
    every one of them is asked for at once and before anything is written; its conflicts are
    where the real run will stop for a hand resolution."""
    return step.action == Action.DECISION or (step.action.stops and not planned)


def hand_resolvable(step: Step) -> bool:
    """A series patch whose hunks are there, changed: resolved by hand in the worktree."""
    return (
        step.section == Section.SERIES
        and step.verdict.state == State.CONFLICT
        and step.verdict.reason in (Reason.CONFLICT, Reason.MOVED)
    )
