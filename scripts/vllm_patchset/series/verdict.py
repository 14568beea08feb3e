"""The verdict contract: what every report reads of a patch on one tree (`Verdict`: its
`State`, the `Reason` for it, the hunk findings, the warnings), and the state rules (`decide`:
what the text, the trailers, the previous base and a 3-way merge make of it).

The base states keep their four names (scripts read them); `Reason` says why, and "absent" is
only said of code that was never there: code that was there and is gone is a conflict
(`rewritten`), a stop for a maintainer's decision. The trailers never make a patch `upstream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from vllm_patchset import versions
from vllm_patchset.infra import codec, jsonfile
from vllm_patchset.series.patches import Patch


class State(StrEnum):
    APPLIES = "applies"
    UPSTREAM = "upstream"
    ABSENT = "absent"
    CONFLICT = "conflict"


class Reason(StrEnum):
    """Why a patch has its state (the `verdict` key of the JSON reports)."""

    APPLIES = "applies"  # git applies it as it is (offsets aside)            -> applies
    THREE_WAY = "3-way"  # its context changed; a 3-way merge applies it      -> applies
    MOVED = "moved"  # the code is at another path (`moved_to`)               -> its state there
    UPSTREAM = "upstream"  # every change of every hunk is there              -> upstream
    NEVER_THERE = "never-there"  # the version predates the bug (trailers)   -> absent
    NOT_FOUND = "not-found"  # not there, and no version to tell why          -> absent
    CONFLICT = "conflict"  # the hunks are there, changed                     -> conflict
    REWRITTEN = "rewritten"  # the code was there (or should be) and is gone  -> conflict
    AMBIGUOUS = "ambiguous"  # the code is in several places, or in another scope -> conflict
    REFRESHED = "refreshed"  # its code is there, reformatted or beside a copy: a patch
    # refreshed by token match applies (the same tokens as its post-image)   -> applies
    UNREADABLE = "unreadable"  # a file of the patch is past the readers' bounds -> conflict


# A verdict's `three_way`: the outcome of git's 3-way merge, None where it was not tried.
THREE_WAY = (None, "clean", "no change", "conflict")


@dataclass(frozen=True)
class HunkFinding:
    file: str
    number: int  # 1-based, within the patch
    header: str
    applies_at: int | None  # 1-based line where the exact pre-image starts, if found
    offset: int | None  # applies_at - the hunk's old start
    result_present: bool
    located: bool  # exact pre-image, or a window at least LOCATE_RATIO alike
    expected: tuple[str, ...]  # the pre-image
    found: tuple[str, ...]  # the closest window of the target (when not exact)
    found_at: int | None


@dataclass(frozen=True)
class Verdict:
    """A patch on one tree: the one typed value every report (status, matrix, rebase) reads."""

    patch: str  # its key: the path under patches/
    base: str
    state: State
    reason: Reason
    text_state: State
    trailer_state: State | None
    hunks: tuple[HunkFinding, ...]
    # Disagreements that change a decision (trailers against the text, a fix that stops
    # applying, moved or rewritten code), and cosmetic ones (comments or surrounding text
    # differ on an upstreamed patch).
    warnings: tuple[str, ...] = ()
    cosmetic: tuple[str, ...] = ()
    three_way: str | None = None  # "clean", "no change", "conflict"; None: not tried
    moved_to: tuple[tuple[str, str], ...] = ()  # (path in the patch, path on this tree)
    candidates: tuple[str, ...] = ()  # where the code may have gone (ambiguous)
    refreshed: str = ""  # the patch placed by token match on this tree (REFRESHED), as text
    bug_present: bool = False  # a hunk's pre-image (the bug) is located on this tree

    @property
    def placed(self) -> bytes | None:
        """The patch as it applies to this tree, when it is not the patch's own bytes: its
        paths moved (`moved_to`) or refreshed by token match."""
        return self.refreshed.encode("utf-8") if self.refreshed else None

    @property
    def words(self) -> str:
        """ "conflict (rewritten)": the state, and the reason where it says more."""
        same = self.reason.value == self.state.value
        return self.state.value if same else f"{self.state.value} ({self.reason.value})"

    @property
    def disagreements(self) -> tuple[str, ...]:
        return self.warnings + self.cosmetic

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(h.offset for h in self.hunks if h.offset)

    def to_doc(self) -> dict[str, Any]:
        """Every field, as JSON values (the rebase journal keeps verdicts)."""
        doc: dict[str, Any] = codec.to_doc(self)
        return doc

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> Verdict:
        """The inverse of `to_doc`; jsonfile.BadJson (a ValueError) on a damaged document."""
        verdict = codec.from_doc(Verdict, doc)
        if verdict.three_way not in THREE_WAY:
            raise jsonfile.BadJson(f"three_way {verdict.three_way!r}")
        return verdict


# The header of a whole file's finding (a file the patch adds or deletes: whole_files.py).
WHOLE_HEADERS = {"added": "new file", "deleted": "deleted file"}


def trailer_state(patch: Patch, version: str | None) -> State | None:
    """What the provenance trailers say the state on `version` should be (None: they cannot
    tell, e.g. a git ref with no release version)."""
    current = versions.parse(version) if version else None
    if current is None:
        return None
    merged_in = patch.trailers.applied_upstream
    introduced = patch.trailers.introduced_in
    merged = versions.parse(merged_in) if merged_in else None
    if merged is not None and current >= merged:
        return State.UPSTREAM
    if introduced == "nightly":
        # A bug that lived on main only: releases before the fix never had it.
        return State.ABSENT if merged_in else None
    first = versions.parse(introduced) if introduced else None
    if first is not None and current < first:
        return State.ABSENT
    return State.APPLIES


def decide(
    text: State,
    trailers: State | None,
    *,
    was_applied: bool | None = None,
    three_way: str | None = None,
    ambiguous: bool = False,
    pending: bool = True,
    base: str = "this base",
) -> tuple[State, Reason, tuple[str, ...]]:
    """The state rules. The text decides (its state: `applies`, `upstream`, `conflict`: the
    hunks are there, changed, `absent`: the code the patch changes is not there); the trailers
    (None: unknown), whether the patch applied on the previous base (None: no previous base),
    the 3-way merge's outcome and whether `Applied-upstream` is still empty only tell the
    reasons apart and name the disagreements: they never make a patch `upstream`.
    Returns the state, its reason and the warnings (disagreements that change a decision)."""
    said = trailers.value if trailers else None
    against = f"text says {text.value}, trailers say {said}"
    if text == State.APPLIES:
        return State.APPLIES, Reason.APPLIES, _applies_warnings(trailers, against)
    if text == State.UPSTREAM:
        late = trailers == State.ABSENT or (trailers == State.APPLIES and not pending)
        return State.UPSTREAM, Reason.UPSTREAM, (against,) if late else ()
    if text == State.CONFLICT:
        warn = _conflict_warnings(trailers, against)
        if three_way == "clean":
            return State.APPLIES, Reason.THREE_WAY, warn
        return State.CONFLICT, Reason.CONFLICT, warn
    # text == ABSENT: neither the code the patch changes nor its fix is where the patch says.
    if ambiguous:
        return State.CONFLICT, Reason.AMBIGUOUS, ()
    clean = (
        ("3-way merge: clean, although the code it changes was not found",)
        if (three_way == "clean")
        else ()
    )
    if trailers == State.ABSENT:
        return State.ABSENT, Reason.NEVER_THERE, clean
    gone = _gone_warning(trailers, against, was_applied=was_applied, base=base)
    if gone is None:
        return State.ABSENT, Reason.NOT_FOUND, clean
    return State.CONFLICT, Reason.REWRITTEN, (gone, *clean)


def _applies_warnings(trailers: State | None, against: str) -> tuple[str, ...]:
    """What the trailers' disagreement with a text that applies says."""
    if trailers == State.UPSTREAM:
        return (f"{against}: the bug is back (a revert?); the text decides",)
    return (against,) if trailers == State.ABSENT else ()


def _conflict_warnings(trailers: State | None, against: str) -> tuple[str, ...]:
    """What the trailers' disagreement with a text in conflict says."""
    if trailers == State.UPSTREAM:
        return (f"{against}: the code it changes is still there, changed; not upstream",)
    return (against,) if trailers == State.ABSENT else ()


def _gone_warning(
    trailers: State | None, against: str, *, was_applied: bool | None, base: str
) -> str | None:
    """Why code that is not there was there (the trailers, or the old pin, say so): it was
    rewritten, a conflict; None where nothing says it was there (absent)."""
    if trailers == State.UPSTREAM:
        return (
            f"{against}: neither its fix nor the code it changes is there (rewritten"
            " upstream?); not taken as upstream"
        )
    if was_applied:
        return (
            f"it applied on the old pin; the code it changes is gone from {base}"
            " (rewritten or removed upstream)"
        )
    if trailers == State.APPLIES:
        return f"{against}: the code it changes is gone (rewritten or removed upstream)"
    return None


def text_state(hunks: tuple[HunkFinding, ...], applies: bool) -> State:
    """The text's state from the line findings alone (the token findings refine it)."""
    if applies:
        return State.APPLIES
    if all(h.result_present for h in hunks):
        return State.UPSTREAM
    if all(h.result_present or h.located for h in hunks):
        return State.CONFLICT
    return State.ABSENT
