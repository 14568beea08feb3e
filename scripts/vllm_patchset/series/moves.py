"""Code that is not where the patch says: where a file's code went (`relocation`: git's rename,
or every lost hunk found in one other file: a move the classification follows), and where
the code a hunk removes is elsewhere in the package (`bug_elsewhere`: a helper, a mixin,
another module, the patch's code only where its scope is related or its surroundings alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series import locate
from vllm_patchset.series.line_evidence import (
    LOCATE_RATIO,
    change_groups,
    find_block,
    find_hunk,
    stripped_code,
)
from vllm_patchset.series.patches import FilePatch, Hunk, Patch
from vllm_patchset.series.token_evidence import Look, related, without_separators
from vllm_patchset.series.verdict import HunkFinding


def bug_elsewhere(
    repo: Repo, tree: str, looks: tuple[Look, ...], hunks: tuple[HunkFinding, ...]
) -> tuple[str, ...]:
    """Where the removed code of a hunk that has no site in its file is, across the package:
    in a scope related to its old one (`token_evidence.related`), or with a window of tokens
    at least LOCATE_RATIO alike to its pre-image (a copy in unrelated code is not the patch's
    code)."""
    places: list[str] = []
    for look, finding in zip(looks, hunks, strict=True):
        if look.sites or look.elsewhere or not look.pre.readable:
            continue
        own = _own_window(look, finding)
        for a, b in look.pre.changes:
            a, b = without_separators(look.pre.words, a, b)
            core = look.pre.words[a:b]
            names = [w for w in core if w.isidentifier()]
            if len(core) >= 4 and names:
                places += _places_of(repo, tree, look, own, _Core(a, core, names))
    return tuple(dict.fromkeys(places))


@dataclass(frozen=True)
class _Core:
    """A change of a hunk's pre-image searched for: where it starts there, its tokens, and
    their names."""

    start: int
    words: tuple[str, ...]
    names: list[str]


def _own_window(look: Look, finding: HunkFinding) -> range:
    """The hunk's own window, changed (a conflict there, not code elsewhere)."""
    if finding.located and finding.found_at is not None:
        return range(finding.found_at, finding.found_at + len(look.hunk.pre))
    return range(0)


def _places_of(repo: Repo, tree: str, look: Look, own: range, core: _Core) -> list[str]:
    """The places of the package's files where `core` is, as the patch's code."""
    bases: tuple[str, ...] = ()
    if look.scope and len(look.scope) > 1 and look.text is not None:
        bases = locate.class_bases(look.text, look.scope[0])
    suffix = PurePosixPath(look.path).suffix
    places: list[str] = []
    for path in repo.grep_files(tree, max(core.names, key=len), f"*{suffix}"):
        blob = repo.read_blob(tree, path) or b""
        text = blob.decode("utf-8", "surrogateescape")
        if all(name in text for name in core.names):  # cheap, before the file's tokens
            places += _places_in(look, path, text, own, core, bases)
    return places


def _places_in(
    look: Look, path: str, text: str, own: range, core: _Core, bases: tuple[str, ...]
) -> list[str]:
    """The places in the file `path` (`text`) where `core` is, alike to the hunk's pre-image or
    in a scope related to its old one; not in the hunk's own window."""
    hay = locate.words(text)
    places = []
    for at in locate.find(hay, core.words):
        start = max(0, at - core.start)
        window = hay[start : start + len(look.pre.words)]
        alike = locate.similarity(window, look.pre.words) >= LOCATE_RATIO
        first = locate.tokens(text)[at].start[0]
        last = locate.tokens(text)[at + len(core.words) - 1].end[0]
        scope = locate.scope_of(text, first, last)
        if path == look.path and first in own:
            continue
        if alike or (
            look.scope is not None and scope is not None and related(look.scope, scope, bases)
        ):
            places.append(f"{path}:{first} ({locate.dotted(scope)})")
    return places


def _cores(hunk: Hunk) -> list[list[str]]:
    """What must be found of a hunk for its code to be "there": the removed code lines of
    each of its changes (the context around them may have changed with the move), or, for a
    pure addition, the code lines of its context."""
    removed = [group for group, _ in change_groups(hunk) if group]
    context = stripped_code(hunk.pre)
    return removed or ([context] if context else [])


def _holders(repo: Repo, tree: str, hunk: Hunk, suffix: str) -> set[str]:
    """The files of `tree` that hold the hunk's code: its cores (code lines compared stripped,
    so code moved into another indentation is found too), in a place the hunk is located
    (its pre-image, or a window at least LOCATE_RATIO alike: the same line in unrelated code,
    e.g. a linear layer's copy of a MoE line, is not the patch's code)."""
    cores = _cores(hunk)
    if not cores:
        return set()
    found = set()
    for path in repo.grep_files(tree, max(cores[0], key=len), f"*{suffix}"):
        text = (repo.read_blob(tree, path) or b"").decode("utf-8", "surrogateescape")
        if len(text) > locate.MAX_CHARS:
            continue  # (a move there is classified again, by the tokens of its live code)
        lines = text.split("\n")
        code_lines = stripped_code(lines)
        if not all(find_block(code_lines, core) for core in cores):
            continue
        if find_hunk(lines, code_lines, True, path, 0, hunk).located:
            found.add(path)
    return found


def _reversed(hunk: Hunk) -> Hunk:
    """The hunk undone: its post-image as the pre-image (to find where its fix is)."""
    swap = {"+": "-", "-": "+", " ": " "}
    return Hunk(
        hunk.new_start, hunk.old_start, tuple(swap[line[0]] + line[1:] for line in hunk.lines)
    )


def relocation(
    repo: Repo,
    tree: str,
    patch: Patch,
    hunks: tuple[HunkFinding, ...],
    renames: Mapping[str, str],
    *,
    merged: bool = False,
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Where the code of each file whose hunks are lost went: (moves, candidates). A file
    moves when git saw it renamed, or when every lost hunk's pre-image is in one other file
    and no hunk of it is left in place; otherwise the places found are candidates (an
    ambiguous or partial move: the maintainer decides). A fix `merged` upstream (its trailers
    say so) whose file is gone is also looked for by its fix."""
    moves: list[tuple[str, str]] = []
    candidates: set[str] = set()
    findings = iter(hunks)
    for file_patch in patch.files:
        mine = [next(findings) for _ in file_patch.hunks]
        went, places = _went(repo, tree, file_patch, mine, renames, merged=merged)
        if went is not None:
            moves.append((file_patch.path, went))
        candidates.update(places)
    if candidates:
        return (), tuple(sorted(candidates))
    return tuple(moves), ()


def _went(
    repo: Repo,
    tree: str,
    file_patch: FilePatch,
    mine: list[HunkFinding],
    renames: Mapping[str, str],
    *,
    merged: bool,
) -> tuple[str | None, set[str]]:
    """Where one file's code went: (the path it moved to, None: no move; the candidates)."""
    lost = [
        hunk
        for hunk, finding in zip(file_patch.hunks, mine, strict=True)
        if not (finding.located or finding.result_present)
    ]
    if not lost:
        return None, set()
    renamed = renames.get(file_patch.path)
    if renamed and repo.read_blob(tree, renamed) is not None:
        return renamed, set()
    suffix = PurePosixPath(file_patch.path).suffix
    places = [_holders(repo, tree, hunk, suffix) - {file_patch.path} for hunk in lost]
    if merged and not any(places) and repo.read_blob(tree, file_patch.path) is None:
        # The file is gone and its bug nowhere: where its fix is (a fix that upstream
        # merged, then moved the file: a module made a package) is where it went.
        places = [_holders(repo, tree, _reversed(hunk), suffix) for hunk in lost]
    common = set.intersection(*places)
    if len(lost) == len(mine) and len(common) == 1:
        return common.pop(), set()
    return None, set[str]().union(*places)
