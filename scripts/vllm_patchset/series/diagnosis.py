"""The diagnosis: a verdict checked against where the bug is live across the package
(copies.py): a copy the patch does not reach, or a bug the verdict did not see, is a stop that
names every place and where the fix is (live, or only in a comment, a string or a dead branch,
which never count as the fix).
"""

from __future__ import annotations

from dataclasses import replace

from vllm_patchset.series import locate
from vllm_patchset.series.case import Case
from vllm_patchset.series.copies import bug_cues, bug_places, line_cues
from vllm_patchset.series.token_evidence import Look
from vllm_patchset.series.verdict import Reason, State, Verdict


def _fix_places(case: Case) -> str:
    """Where the patch's added lines (the fix) are in its files: live, or only in comments,
    strings or dead branches (which never count as the fix); hunk by hunk where it has
    several."""
    said = [(look.number, _fix_of(look)) for look in case.looks if line_cues(look, post=True)]
    if len(said) == 1:
        return f"its fix is {said[0][1]}"
    if not said:
        return "its fix has no code of its own"
    return "its fix: " + "; ".join(f"hunk {number} {where}" for number, where in said)


def _fix_of(look: Look) -> str:
    """Where one hunk's fix is in its file: live, only where no code is live, or nowhere."""
    if look.text is None:
        return f"nowhere ({look.path} is not there)"
    live: list[str] = []
    shadowed: list[str] = []
    hay = locate.words(look.text)
    for cue in line_cues(look, post=True):
        for at in locate.find(hay, cue.words):
            row = locate.tokens(look.text)[at].start[0]
            scope = locate.scope_of(look.text, row, row)
            live.append(f"{look.path}:{row} ({locate.dotted(scope)})")
        for row, kind, words in locate.shadows(look.text):
            if locate.find(words, cue.line or cue.words):
                scope = locate.scope_of(look.text, row, row)
                shadowed.append(f"{kind} at {look.path}:{row} ({locate.dotted(scope)})")
    if live:
        return "live at " + ", ".join(dict.fromkeys(live))
    if shadowed:
        return "only in " + ", ".join(dict.fromkeys(shadowed)) + " (not live code)"
    return f"nowhere in {look.path}"


def diagnosed(case: Case, verdict: Verdict) -> Verdict:
    """The verdict checked against where the bug is live across the package: a copy the patch
    does not reach, or a bug the verdict did not see, is a stop naming every place (with
    where the fix is); files past the readers' bounds are named in a warning."""
    if verdict.reason == Reason.MOVED:  # classified where it went (diagnosed there)
        return verdict
    bugs, skipped = bug_places(case, verdict.state == State.APPLIES)
    skips = tuple(
        f"{path}: skipped in the search for copies of the bug (past what the reader reads)"
        for path in skipped
    )
    places = [place for place, _ in bugs]
    copies = [place for place, mine in bugs if not mine]
    settled = verdict.state in (State.APPLIES, State.UPSTREAM)
    if (settled and not copies) or not places:
        return replace(verdict, warnings=(*verdict.warnings, *skips)) if skips else verdict
    state, reason, warnings = _stop(verdict, _bug_line(case, verdict, places), settled=settled)
    candidates = tuple(dict.fromkeys((*places, *verdict.candidates)))
    return replace(
        verdict,
        state=state,
        reason=reason,
        warnings=(*warnings, *skips),
        candidates=candidates,
        bug_present=True,
        refreshed="" if settled else verdict.refreshed,
    )


def _bug_line(case: Case, verdict: Verdict, places: list[str]) -> str:
    """The warning that says where the bug is live, and where its fix is."""
    cues = dict.fromkeys(cue.text for cue in bug_cues(case))
    return (
        f"the bug ({', '.join(f'`{c}`' for c in cues)}) is live at {', '.join(places)}"
        + (" (the patch does not reach every place)" if verdict.state == State.APPLIES else "")
        + f"; {_fix_places(case)}"
    )


def _stop(verdict: Verdict, line: str, *, settled: bool) -> tuple[State, Reason, tuple[str, ...]]:
    """What a live bug makes of the verdict: a line more on a conflict that saw it; a stop
    (`ambiguous`) for a settled state, code not found or rewritten; else its state, the line
    first."""
    if verdict.bug_present and verdict.state == State.CONFLICT:  # seen already: a line more
        return verdict.state, verdict.reason, (*verdict.warnings, line)
    if settled or verdict.state == State.ABSENT or verdict.reason == Reason.REWRITTEN:
        kept = (w for w in verdict.warnings if "neither its fix" not in w)
        return State.CONFLICT, Reason.AMBIGUOUS, (line, *kept)
    return verdict.state, verdict.reason, (line, *verdict.warnings)
