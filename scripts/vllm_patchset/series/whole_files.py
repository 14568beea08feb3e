"""Files a patch adds or deletes whole, judged as files: an added file applies where the path
is free, is `upstream` where the tree has the very file and a conflict where it has another
one; a deleted file the other way round. The files the patch modifies are classified as a
patch of their own (`modified_part`, by `classify`), and `verdict` joins the two: a conflict of
either is the patch's, and a file already there (partly upstream) is left out of the patch as
placed on this tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series.patches import FilePatch, Patch, parse_patch_bytes
from vllm_patchset.series.verdict import (
    WHOLE_HEADERS,
    HunkFinding,
    Reason,
    State,
    Verdict,
    decide,
    trailer_state,
)


@dataclass(frozen=True)
class _Whole:
    """A file the patch adds or deletes: its `diff --git` section, its state on the tree, and
    the note that says why where it is a conflict."""

    file: FilePatch
    section: str
    state: State
    note: str


def _whole_state(repo: Repo, tree: str, file_patch: FilePatch, base: str) -> tuple[State, str]:
    """A file the patch adds: applies where the path is free, upstream where the tree has the
    very file, a conflict where it has another one. A file it deletes: applies where the tree
    has the very file, upstream where it is gone, a conflict where the file differs."""
    there = repo.read_blob(tree, file_patch.path)
    if there == file_patch.whole:
        state = State.UPSTREAM if file_patch.change == "added" else State.APPLIES
        return state, ""
    if there is None:
        state = State.APPLIES if file_patch.change == "added" else State.UPSTREAM
        return state, ""
    if file_patch.change == "added":
        return State.CONFLICT, f"{file_patch.path}: {base} has another file at the path it adds"
    return State.CONFLICT, f"{file_patch.path}: the file it deletes differs on {base}"


def _whole_findings(file_patch: FilePatch, state: State, number: int) -> tuple[HunkFinding, ...]:
    """The findings of a whole file's hunk (none for an empty file)."""
    header = WHOLE_HEADERS[file_patch.change]
    applies = state == State.APPLIES
    return tuple(
        HunkFinding(
            file=file_patch.path,
            number=number + i,
            header=header,
            applies_at=hunk.old_start if applies else None,
            offset=0 if applies else None,
            result_present=state == State.UPSTREAM,
            located=state != State.UPSTREAM,
            expected=hunk.pre,
            found=(),
            found_at=1 if state == State.CONFLICT else None,
        )
        for i, hunk in enumerate(file_patch.hunks)
    )


def _sections(patch: Patch) -> tuple[str, list[str]]:
    """The patch's head (the message), and each file's `diff --git` section, in order."""
    head, _, diff = patch.raw.decode("utf-8", "surrogateescape").partition("\ndiff --git ")
    diff = re.sub(r"\n-- \n\d+(\.\d+)+\n*\Z", "\n", diff)  # git's signature, if any
    return head, ["diff --git " + chunk for chunk in diff.split("\ndiff --git ")]


def _joined(head: str, sections: list[str]) -> bytes:
    body = "\n".join(section.removesuffix("\n") for section in sections)
    return f"{head}\n{body}\n".encode("utf-8", "surrogateescape")


def modified_part(patch: Patch) -> Patch | None:
    """The patch cut to the files it modifies (None: it modifies none)."""
    head, sections = _sections(patch)
    modified = [s for s, f in zip(sections, patch.files, strict=True) if f.change == "modified"]
    if not modified:
        return None
    return parse_patch_bytes(_joined(head, modified), patch.path, patch.key)


def verdict(
    repo: Repo,
    tree: str,
    patch: Patch,
    inner: Verdict | None,
    *,
    base: str,
    version: str | None,
    was_applied: bool | None,
) -> Verdict:
    """The verdict of a patch that adds or deletes files: each such file judged whole
    (`_whole_state`), joined with `inner`, the verdict on the files it modifies (None: it
    modifies none)."""
    head, sections = _sections(patch)
    whole = [
        _Whole(f, section, *_whole_state(repo, tree, f, base))
        for f, section in zip(patch.files, sections, strict=True)
        if f.change != "modified"
    ]
    hunks = _merged_findings(patch, whole, inner)
    fields: dict[str, Any] = {"patch": patch.key, "base": base, "hunks": hunks}
    fields["trailer_state"] = trailer_state(patch, version)
    wholes = {w.state for w in whole}
    if State.CONFLICT in wholes or (inner is not None and inner.state == State.CONFLICT):
        return _conflict(whole, inner, fields)
    if inner is None:
        pending = not patch.trailers.applied_upstream
        return _whole_only(head, whole, fields, was_applied=was_applied, pending=pending)
    if inner.state == State.UPSTREAM and State.APPLIES in wholes:
        return _half_upstream(whole, inner, fields)
    if inner.state != State.APPLIES:  # upstream (with every whole file), or absent
        return replace(inner, patch=patch.key, hunks=hunks)
    modified = [s for s, f in zip(sections, patch.files, strict=True) if f.change == "modified"]
    return _applies(head, modified, whole, inner, fields)


def _there(whole: list[_Whole]) -> list[str]:
    """The notes of the files already there (partly upstream)."""
    return [
        f"{w.file.path}: there already (partly upstream); the patch as placed here leaves it out"
        for w in whole
        if w.state == State.UPSTREAM
    ]


def _kept(whole: list[_Whole]) -> list[str]:
    """The sections of the whole files the patch as placed here keeps (those that apply)."""
    return [w.section for w in whole if w.state == State.APPLIES]


def _conflict(whole: list[_Whole], inner: Verdict | None, fields: dict[str, Any]) -> Verdict:
    """A whole file in conflict, or the files it modifies: the patch's conflict."""
    reason = Reason.CONFLICT
    if inner is not None and inner.state == State.CONFLICT:
        reason = inner.reason
    notes = tuple(w.note for w in whole if w.note)
    warnings = (*notes, *(inner.warnings if inner else ()))
    return Verdict(
        state=State.CONFLICT,
        reason=reason,
        text_state=State.CONFLICT,
        warnings=warnings,
        **fields,
        **_inner_extra(inner),
    )


def _whole_only(
    head: str,
    whole: list[_Whole],
    fields: dict[str, Any],
    *,
    was_applied: bool | None,
    pending: bool,
) -> Verdict:
    """A patch of whole files only: upstream where every one is, else the rules decide."""
    text = State.UPSTREAM if {w.state for w in whole} == {State.UPSTREAM} else State.APPLIES
    state, reason, warnings = decide(
        text, fields["trailer_state"], was_applied=was_applied, pending=pending, base=fields["base"]
    )
    there = _there(whole)
    refreshed = _joined(head, _kept(whole)).decode("utf-8", "surrogateescape") if there else ""
    if refreshed and state == State.APPLIES:
        reason = Reason.REFRESHED
    return Verdict(
        state=state,
        reason=reason,
        text_state=text,
        warnings=(*there, *warnings) if state == State.APPLIES else warnings,
        refreshed=refreshed if state == State.APPLIES else "",
        **fields,
    )


def _half_upstream(whole: list[_Whole], inner: Verdict, fields: dict[str, Any]) -> Verdict:
    """The changes to the files it modifies upstream, a whole file not: a decision."""
    missing = [w.file.path for w in whole if w.state == State.APPLIES]
    return Verdict(
        state=State.CONFLICT,
        reason=Reason.CONFLICT,
        text_state=State.CONFLICT,
        warnings=(
            "its changes to the files it modifies are upstream, the file(s) it adds or"
            f" deletes are not: {', '.join(missing)}; decide",
            *inner.warnings,
        ),
        **fields,
        **_inner_extra(inner),
    )


def _applies(
    head: str,
    modified: list[str],
    whole: list[_Whole],
    inner: Verdict,
    fields: dict[str, Any],
) -> Verdict:
    """The files it modifies apply: the patch applies, as placed on this tree (refreshed, or
    without the whole files already there)."""
    there = _there(whole)
    refreshed = inner.refreshed
    if refreshed or there:
        placed = refreshed or _joined(head, modified).decode("utf-8", "surrogateescape")
        own = placed.removesuffix("\n-- \n").partition("\ndiff --git ")
        refreshed = _joined(own[0], ["diff --git " + own[2], *_kept(whole)]).decode(
            "utf-8", "surrogateescape"
        )
    return replace(
        inner,
        patch=fields["patch"],
        hunks=fields["hunks"],
        reason=Reason.REFRESHED if there and inner.reason == Reason.APPLIES else inner.reason,
        refreshed=refreshed,
        warnings=(*there, *inner.warnings),
    )


def _inner_extra(inner: Verdict | None) -> dict[str, Any]:
    """What a conflict keeps of the verdict on the files the patch modifies."""
    if inner is None:
        return {}
    return {
        "cosmetic": inner.cosmetic,
        "three_way": inner.three_way,
        "moved_to": inner.moved_to,
        "candidates": inner.candidates,
        "bug_present": inner.bug_present,
    }


def _merged_findings(
    patch: Patch,
    whole: list[_Whole],
    inner: Verdict | None,
) -> tuple[HunkFinding, ...]:
    """Every hunk's finding in the patch's order, numbered in it."""
    states = {w.file.path: w.state for w in whole}
    inner_hunks = iter(inner.hunks if inner else ())
    out: list[HunkFinding] = []
    for file_patch in patch.files:
        number = len(out) + 1
        if file_patch.change != "modified":
            out += _whole_findings(file_patch, states[file_patch.path], number)
            continue
        for i, _ in enumerate(file_patch.hunks):
            found = next(inner_hunks, None)
            if found is not None:
                out.append(replace(found, number=number + i))
    return tuple(out)
