"""The state of each patch on an upstream tree: applies, upstream, absent or conflict.

Signals, all of them used and their disagreements reported:
- git's own no-fuzz apply check on the tree (with the earlier patches of the walk applied);
- each hunk located in the target file: its pre-image exactly (with the offset), or the
  closest window of the file when the text changed;
- each hunk's result present in the target file (its code lines, comments and blank lines
  aside, so a backport whose comments differ from upstream's is still recognised);
- the `Introduced-in` / `Applied-upstream` trailers compared with the release's version.
A reverse apply is never used as the proof of `upstream`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from enum import Enum

from vllm_patchset.gitrepo import Repo
from vllm_patchset.series import Hunk, Patch
from vllm_patchset.upstream import version_key

LOCATE_RATIO = 0.8  # a pre-image window this similar is "the same code, changed"


class State(str, Enum):
    APPLIES = "applies"
    UPSTREAM = "upstream"
    ABSENT = "absent"
    CONFLICT = "conflict"


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
    patch: str
    base: str
    state: State
    text_state: State
    trailer_state: State | None
    disagreements: tuple[str, ...]
    hunks: tuple[HunkFinding, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(h.offset for h in self.hunks if h.offset)


def _code(lines: tuple[str, ...] | list[str]) -> list[str]:
    stripped = (line.strip() for line in lines)
    return [line for line in stripped if line and not line.startswith("#")]


def _find_block(haystack: list[str], needle: list[str] | tuple[str, ...]) -> list[int]:
    if not needle:
        return []
    first = needle[0]
    size = len(needle)
    return [
        i
        for i, line in enumerate(haystack)
        if line == first and tuple(haystack[i : i + size]) == tuple(needle)
    ]


def _closest_window(lines: list[str], pre: tuple[str, ...]) -> tuple[float, int]:
    if not pre or not lines:
        return 0.0, 0
    target = [line.strip() for line in pre]
    stripped = [line.strip() for line in lines]
    best_ratio, best_at = 0.0, 0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(target)
    for start in range(max(1, len(stripped) - len(target) + 1)):
        matcher.set_seq1(stripped[start : start + len(target)])
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best_ratio, best_at = ratio, start
    return best_ratio, best_at


def _change_groups(hunk: Hunk) -> list[tuple[list[str], list[str]]]:
    """(removed, added) code lines of each run of changed lines in the hunk."""
    groups: list[tuple[list[str], list[str]]] = []
    in_run = False
    for line in hunk.lines:
        if line[0] == " ":
            in_run = False
            continue
        if not in_run:
            groups.append(([], []))
            in_run = True
        (groups[-1][0] if line[0] == "-" else groups[-1][1]).append(line[1:])
    return [(_code(removed), _code(added)) for removed, added in groups]


def _result_present(code_lines: list[str], hunk: Hunk) -> bool:
    """Every change of the hunk is there: its added code found, its removed code gone."""
    for removed, added in _change_groups(hunk):
        if removed and _find_block(code_lines, removed):
            return False
        if added and not _find_block(code_lines, added):
            return False
    if any(added for _, added in _change_groups(hunk)):
        return True
    # A pure removal: its context must still be there to tell "removed" from "absent".
    context = _code(tuple(line[1:] for line in hunk.lines if line[0] == " "))
    return bool(_find_block(code_lines, context))


def _find_hunk(
    lines: list[str], code_lines: list[str], exists: bool, path: str, number: int, hunk: Hunk
) -> HunkFinding:
    """Where the hunk's pre-image is in the file: exactly, or the closest window."""
    header = f"@@ -{hunk.old_start} +{hunk.new_start} @@"
    if not exists:
        return HunkFinding(path, number, header, None, None, False, False, hunk.pre, (), None)
    present = _result_present(code_lines, hunk)
    exact = _find_block(lines, hunk.pre)
    if exact:
        at = min(exact, key=lambda i: abs(i + 1 - hunk.old_start)) + 1
        return HunkFinding(
            path, number, header, at, at - hunk.old_start, present, True, hunk.pre, (), None
        )
    ratio, start = _closest_window(lines, hunk.pre)
    window = tuple(lines[start : start + len(hunk.pre)])
    return HunkFinding(
        path,
        number,
        header,
        None,
        None,
        present,
        ratio >= LOCATE_RATIO,
        hunk.pre,
        window,
        start + 1,
    )


def find_hunks(repo: Repo, tree: str, patch: Patch) -> tuple[HunkFinding, ...]:
    findings: list[HunkFinding] = []
    number = 0
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path)
        lines = blob.decode("utf-8", "surrogateescape").split("\n") if blob is not None else []
        code_lines = _code(lines)
        for hunk in file_patch.hunks:
            number += 1
            findings.append(
                _find_hunk(lines, code_lines, blob is not None, file_patch.path, number, hunk)
            )
    return tuple(findings)


def trailer_state(patch: Patch, version: str | None) -> State | None:
    """What the provenance trailers say the state on `version` should be."""
    if version is None:
        return None
    key = version_key(version)
    merged_in = patch.trailers.applied_upstream
    introduced = patch.trailers.introduced_in
    if merged_in and key >= version_key(merged_in):
        return State.UPSTREAM
    if introduced == "nightly":
        # A bug that lived on main only: releases before the fix never had it.
        return State.ABSENT if merged_in else None
    if introduced and key < version_key(introduced):
        return State.ABSENT
    return State.APPLIES


def classify(repo: Repo, tree: str, patch: Patch, *, base: str, version: str | None) -> Verdict:
    """The state of `patch` on `tree` (the upstream tree `base`, earlier patches applied)."""
    applies, _ = repo.check_apply(tree, patch.raw)
    hunks = find_hunks(repo, tree, patch)
    if applies:
        text = State.APPLIES
    elif all(h.result_present for h in hunks):
        text = State.UPSTREAM
    elif all(h.result_present or h.located for h in hunks):
        text = State.CONFLICT
    else:
        text = State.ABSENT
    expected = trailer_state(patch, version)
    notes: list[str] = []
    state = text
    if text == State.ABSENT and expected == State.UPSTREAM:
        state = State.UPSTREAM
        notes.append(
            f"the code it changes is gone from {base}; trailers say merged upstream in "
            f"{patch.trailers.applied_upstream}"
        )
    elif (
        expected is not None
        and expected != text
        and not (expected == State.APPLIES and text == State.CONFLICT)
    ):
        notes.append(f"text says {text.value}, trailers say {expected.value}")
    if state == State.UPSTREAM:
        pure_additions = {
            number
            for number, hunk in enumerate((h for f in patch.files for h in f.hunks), 1)
            if not hunk.removed
        }
        for h in hunks:
            if h.number in pure_additions and h.applies_at is None and not h.located:
                notes.append(f"hunk {h.number} ({h.file}): code present, surrounding text differs")
        _note_comment_drift(repo, tree, patch, notes)
    return Verdict(
        patch=patch.key,
        base=base,
        state=state,
        text_state=text,
        trailer_state=expected,
        disagreements=tuple(notes),
        hunks=hunks,
    )


def _note_comment_drift(repo: Repo, tree: str, patch: Patch, notes: list[str]) -> None:
    """Name the hunks whose added comments differ from what upstream has."""
    number = 0
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path) or b""
        text_lines = [line.strip() for line in blob.decode("utf-8", "replace").split("\n")]
        for hunk in file_patch.hunks:
            number += 1
            comments = [line.strip() for line in hunk.added if line.strip().startswith("#")]
            if comments and not _find_block(text_lines, comments):
                notes.append(
                    f"hunk {number} ({file_patch.path}): code matches upstream,"
                    " comment lines differ"
                )
