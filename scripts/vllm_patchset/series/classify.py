"""`classify`: the state of each patch on an upstream tree (applies, upstream, absent or
conflict, verdict.py), and the finer reason for it.

Signals, all of them used and their disagreements reported:
- git's own no-fuzz apply check on the tree (with the earlier patches of the walk applied);
- each hunk located in the target file: its pre-image exactly (with the offset), or the
  closest window of the file when the text changed (line_evidence.py), and by tokens in the
  scope it had (token_evidence.py);
- each hunk's result present in the target file (its code lines, comments and blank lines
  aside, so a backport whose comments differ from upstream's is still recognised);
- code that moved: a hunk whose pre-image is not in its file is searched for across the
  package (and git's rename detection, where the caller knows the previous base: moves.py);
- a 3-way merge (where the caller asks for it: the rebase);
- the `Introduced-in` / `Applied-upstream` trailers compared with the release's version, and
  whether the patch applied on the previous base (the rebase knows);
- every live copy of the bug across the package (copies.py, diagnosis.py).
A reverse apply is never used as the proof of `upstream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series import locate, whole_files
from vllm_patchset.series.case import Case, case_of
from vllm_patchset.series.diagnosis import diagnosed
from vllm_patchset.series.edits import rewrite_paths
from vllm_patchset.series.moves import bug_elsewhere, relocation
from vllm_patchset.series.patches import Patch, parse_patch_bytes
from vllm_patchset.series.token_evidence import refreshed_patch
from vllm_patchset.series.verdict import Reason, State, Verdict, decide


def classify(
    repo: Repo,
    tree: str,
    patch: Patch,
    *,
    base: str,
    version: str | None,
    was_applied: bool | None = None,
    three_way: bool = False,
    renames: Mapping[str, str] | None = None,
    follow_moves: bool = True,
) -> Verdict:
    """The state of `patch` on `tree` (the upstream tree `base`, earlier patches applied).

    The text decides, by tokens (locate.py): `applies` where git applies it and every hunk
    lands at the one place its pre-image has in the scope it had (else a patch refreshed by
    token match, `refreshed`); `upstream` only where every hunk's changes are there and no
    hunk's pre-image (the bug) is, anywhere in the package; code in several places, or in
    another scope, is `ambiguous` (a stop naming the places). `was_applied`: whether it
    applied on the previous base (a rebase knows); `three_way`: try a 3-way merge where the
    hunks are there, changed; `renames`: git's rename detection from the previous base (old
    path -> new path). Code that is not where the patch says is searched for across the
    package: found in one place, the patch is classified there (`moved`).

    A file the patch adds or deletes whole is judged as a file (`_with_whole_files`).

    The steps below, in order; the first that gives a verdict gives it."""
    if any(f.change != "modified" for f in patch.files):
        return _with_whole_files(
            repo,
            tree,
            patch,
            base=base,
            version=version,
            was_applied=was_applied,
            three_way=three_way,
            renames=renames,
            follow_moves=follow_moves,
        )
    unread = _unreadable(repo, tree, patch, base)
    if unread is not None:
        return unread
    case = case_of(
        repo, tree, patch, base, version, was_applied, three_way, renames or {}, follow_moves
    )
    return diagnosed(case, _verdict(case))


def _verdict(case: Case) -> Verdict:
    for step in (_placed_by_git, _placed_by_tokens, _in_several_places):
        found = step(case)
        if found is not None:
            return found
    moved, candidates = _followed(case)
    if moved is not None:
        return moved
    found = _bug_found_elsewhere(case, candidates) or _upstream(case) or _rewritten(case)
    return found or _decided(case)


def _unreadable(repo: Repo, tree: str, patch: Patch, base: str) -> Verdict | None:
    """0. A file of the patch past the readers' bounds: a stop that names it (what it holds
    is not known: the bug is taken as there)."""
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path)
        why = locate.unreadable(blob.decode("utf-8", "surrogateescape")) if blob else None
        if why is None:
            continue
        return Verdict(
            patch=patch.key,
            base=base,
            state=State.CONFLICT,
            reason=Reason.UNREADABLE,
            text_state=State.CONFLICT,
            trailer_state=None,
            hunks=(),
            warnings=(
                f"{file_patch.path} on {base} is past what the reader reads ({why}):"
                " look at it by hand, then decide",
            ),
            candidates=(file_patch.path,),
            bug_present=True,
        )
    return None


def _with_whole_files(
    repo: Repo,
    tree: str,
    patch: Patch,
    *,
    base: str,
    version: str | None,
    was_applied: bool | None,
    three_way: bool,
    renames: Mapping[str, str] | None,
    follow_moves: bool,
) -> Verdict:
    """`classify` of a patch that adds or deletes files: the files it modifies classified as a
    patch of their own, then joined with the files it adds or deletes, each judged whole
    (whole_files.py)."""
    modified = whole_files.modified_part(patch)
    inner = None
    if modified is not None:
        inner = classify(
            repo,
            tree,
            modified,
            base=base,
            version=version,
            was_applied=was_applied,
            three_way=three_way,
            renames=renames,
            follow_moves=follow_moves,
        )
    return whole_files.verdict(
        repo, tree, patch, inner, base=base, version=version, was_applied=was_applied
    )


def _placed_by_git(case: Case) -> Verdict | None:
    """1. git applies it, each hunk at the one place its code has in its scope."""
    placed = all(
        kind == "git" or (kind == "site" and look.row == h.applies_at)
        for kind, look, h in case.rows()
    )
    if not (case.applies and placed):
        return None
    note = case.trailer_note(State.APPLIES)
    return case.verdict(State.APPLIES, Reason.APPLIES, State.APPLIES, note)


def _placed_by_tokens(case: Case) -> Verdict | None:
    """2. Its code is there once in its scope, reformatted or beside a copy, or partly fixed
    upstream: placed by token match."""
    kinds = list(case.kinds)
    if not (all(k in ("site", "present") for k in kinds) and "site" in kinds):
        return None
    refreshed = refreshed_patch(case.patch, case.looks, kinds)
    if refreshed is None:
        return None
    notes = [
        f"hunk {look.number} ({look.path}): placed by token match at {look.where(look.sites[0])}"
        for kind, look, _ in case.rows()
        if kind == "site" and not (case.applies and look.row is not None)
    ]
    notes += [
        f"hunk {look.number} ({look.path}): its change is there already (partly"
        " upstream); the refreshed patch leaves it out"
        for kind, look, _ in case.rows()
        if kind == "present"
    ]
    return case.verdict(
        State.APPLIES,
        Reason.REFRESHED,
        State.APPLIES,
        (*notes, *case.trailer_note(State.APPLIES)),
        refreshed=refreshed,
    )


def _in_several_places(case: Case) -> Verdict | None:
    """3. Code in several places, or only in another scope: the maintainer says where."""
    if "ambiguous" not in case.kinds:
        return None
    places = [
        place for kind, look, _ in case.rows() if kind == "ambiguous" for place in look.places()
    ]
    return case.verdict(
        State.CONFLICT,
        Reason.AMBIGUOUS,
        State.CONFLICT,
        (
            "the code it changes is in several places, or in another class or function"
            " than on the old base: " + ", ".join(places) + "; move the patch by hand"
            " (queue import) or decide",
        ),
        candidates=tuple(places),
    )


def _followed(case: Case) -> tuple[Verdict | None, tuple[str, ...]]:
    """4. Files whose code went elsewhere, whole: followed (`moved`); else the candidates
    that the search found."""
    if not (case.follow_moves and "lost" in case.kinds):
        return None, ()
    moves, candidates = relocation(
        case.repo,
        case.tree,
        case.patch,
        case.hunks,
        case.renames,
        merged=case.expected == State.UPSTREAM,
    )
    if not moves:
        return None, candidates
    patch = case.patch
    moved = parse_patch_bytes(rewrite_paths(patch.raw, dict(moves)), patch.path, patch.key)
    there = classify(
        case.repo,
        case.tree,
        moved,
        base=case.base,
        version=case.version,
        was_applied=case.was_applied,
        three_way=case.three_way,
        follow_moves=False,
    )
    if there.state == State.CONFLICT and there.reason == Reason.AMBIGUOUS:
        return replace(there, patch=patch.key, moved_to=moves), ()
    where = ", ".join(f"{a} -> {b}" for a, b in moves)
    placed = there.refreshed or rewrite_paths(patch.raw, dict(moves)).decode()
    return replace(
        there,
        patch=patch.key,
        reason=Reason.MOVED,
        moved_to=moves,
        refreshed=placed,
        warnings=(f"moved: {where}", *there.warnings),
    ), ()


def _bug_found_elsewhere(case: Case, candidates: tuple[str, ...]) -> Verdict | None:
    """5. The bug elsewhere in the package (a helper, a mixin, another module): needed, and
    the maintainer carries it there."""
    elsewhere = bug_elsewhere(case.repo, case.tree, case.looks, case.hunks)
    if not (elsewhere or candidates):
        return None
    named = {place.split(":", 1)[0] for place in elsewhere}
    found = (*elsewhere, *(c for c in candidates if c not in named))
    return case.verdict(
        State.CONFLICT,
        Reason.AMBIGUOUS,
        State.CONFLICT,
        (
            "the code it fixes is not where the patch says; it is at "
            + ", ".join(found)
            + ": carry the fix there by hand (queue import) or decide",
        ),
        candidates=found,
        bug=bool(elsewhere),
    )


def _upstream(case: Case) -> Verdict | None:
    """6. Every change there, no bug anywhere: upstream."""
    if not all(k == "present" or (k == "git" and h.result_present) for k, _, h in case.rows()):
        return None
    merged = case.merged()
    _, _, warn = decide(State.UPSTREAM, case.expected, pending=case.pending, base=case.base)
    return case.verdict(State.UPSTREAM, Reason.UPSTREAM, State.UPSTREAM, warn, three_way=merged)


_THERE = ("site", "present", "changed", "git")  # kinds of a hunk whose code is there


def _there(case: Case) -> bool:
    """The code the patch changes is there (changed, maybe): every hunk's, but for hunks that
    only add lines to a file that is there (their place moved: where to add them is the
    maintainer's, not code that is gone), and at least one hunk's."""
    kinds = [
        kind in _THERE or (kind == "lost" and not look.hunk.removed and look.text is not None)
        for kind, look, _ in case.rows()
    ]
    return all(kinds) and any(kind in _THERE for kind in case.kinds)


def _rewritten(case: Case) -> Verdict | None:
    """7. Part of the code is gone, while the bug the others fix is still there."""
    if _there(case) or not case.bug_here:
        return None
    lost = [str(look.number) for kind, look, _ in case.rows() if kind == "lost"]
    kept = [look.where(look.sites[0]) for kind, look, _ in case.rows() if kind == "site"]
    return case.verdict(
        State.CONFLICT,
        Reason.REWRITTEN,
        State.CONFLICT,
        (
            f"hunk(s) {', '.join(lost)}: the code they change is gone from {case.base}, while"
            f" the code the others fix is still there ({', '.join(kept)}): port the patch"
            " by hand (queue import) or decide",
        ),
    )


def _decided(case: Case) -> Verdict:
    """8. The rules decide: the hunks are there, changed (`conflict`), or gone (`absent`)."""
    text = State.CONFLICT if _there(case) else State.ABSENT
    merged = case.merged()
    state, reason, warnings = decide(
        text,
        case.expected,
        was_applied=case.was_applied,
        three_way=merged,
        pending=case.pending,
        base=case.base,
    )
    return case.verdict(state, reason, text, warnings, three_way=merged)
