"""The state of each patch on an upstream tree: applies, upstream, absent or conflict, and
the finer reason for it.

Signals, all of them used and their disagreements reported:
- git's own no-fuzz apply check on the tree (with the earlier patches of the walk applied);
- each hunk located in the target file: its pre-image exactly (with the offset), or the
  closest window of the file when the text changed;
- each hunk's result present in the target file (its code lines, comments and blank lines
  aside, so a backport whose comments differ from upstream's is still recognised);
- code that moved: a hunk whose pre-image is not in its file is searched for across the
  package (and git's rename detection, where the caller knows the previous base);
- a 3-way merge (where the caller asks for it: the rebase);
- the `Introduced-in` / `Applied-upstream` trailers compared with the release's version, and
  whether the patch applied on the previous base (the rebase knows).
A reverse apply is never used as the proof of `upstream`. The base states keep their four
names (scripts read them); `Reason` says why, and "absent" is only said of code that was
never there: code that was there and is gone is a conflict (`rewritten`), a stop for a
maintainer's decision.
"""

from __future__ import annotations

import difflib
import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from vllm_patchset import versions
from vllm_patchset.errors import GitError
from vllm_patchset.infra import codec, jsonfile
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series import locate
from vllm_patchset.series.edits import rewrite_paths
from vllm_patchset.series.patches import FilePatch, Hunk, Patch, parse_patch_bytes

LOCATE_RATIO = 0.8  # a pre-image window this similar is "the same code, changed"


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
    return [(_code(removed), _code(added)) for removed, added in locate.change_runs(hunk)]


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
        text = blob.decode("utf-8", "surrogateescape") if blob is not None else ""
        lines = text.split("\n") if blob is not None else []
        code_lines = _code(locate.live_lines(text)) if blob is not None else []
        for hunk in file_patch.hunks:
            number += 1
            findings.append(
                _find_hunk(lines, code_lines, blob is not None, file_patch.path, number, hunk)
            )
    return tuple(findings)


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
    warn: tuple[str, ...]
    if text == State.APPLIES:
        warn = (
            (f"{against}: the bug is back (a revert?); the text decides",)
            if trailers == State.UPSTREAM
            else (against,)
            if trailers == State.ABSENT
            else ()
        )
        return State.APPLIES, Reason.APPLIES, warn
    if text == State.UPSTREAM:
        warn = (
            (against,)
            if trailers == State.ABSENT or (trailers == State.APPLIES and not pending)
            else ()
        )
        return State.UPSTREAM, Reason.UPSTREAM, warn
    if text == State.CONFLICT:
        warn = ()
        if trailers == State.UPSTREAM:
            warn = (f"{against}: the code it changes is still there, changed; not upstream",)
        elif trailers == State.ABSENT:
            warn = (against,)
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
    if trailers == State.UPSTREAM:
        return (
            State.CONFLICT,
            Reason.REWRITTEN,
            (
                f"{against}: neither its fix nor the code it changes is there (rewritten"
                " upstream?); not taken as upstream",
                *clean,
            ),
        )
    if was_applied:
        return (
            State.CONFLICT,
            Reason.REWRITTEN,
            (
                f"it applied on the old pin; the code it changes is gone from {base}"
                " (rewritten or removed upstream)",
                *clean,
            ),
        )
    if trailers == State.APPLIES:
        return (
            State.CONFLICT,
            Reason.REWRITTEN,
            (
                f"{against}: the code it changes is gone (rewritten or removed upstream)",
                *clean,
            ),
        )
    return State.ABSENT, Reason.NOT_FOUND, clean


def text_state(hunks: tuple[HunkFinding, ...], applies: bool) -> State:
    """The text's state from the line findings alone (the token findings refine it)."""
    if applies:
        return State.APPLIES
    if all(h.result_present for h in hunks):
        return State.UPSTREAM
    if all(h.result_present or h.located for h in hunks):
        return State.CONFLICT
    return State.ABSENT


# -- the code on the tree, by tokens -------------------------------------------------------------
@dataclass(frozen=True)
class _Look:
    """One hunk on the tree, by tokens (locate.py)."""

    number: int
    path: str
    hunk: Hunk
    pre: locate.Side
    post: locate.Side
    scope: locate.Scope | None  # its place on the old base (None: unknown)
    sites: tuple[int, ...]  # token indices of its pre-image in the file, in that scope
    elsewhere: tuple[int, ...]  # ... in another scope
    present: bool  # its changes are there (the post-image's added code, no removed code)
    text: str | None  # the file on the tree
    line_sites: int  # places where its pre-image's lines are, exactly

    @property
    def row(self) -> int | None:
        """The row where its one site's pre-image starts (its first line, blank or not)."""
        if len(self.sites) != 1 or self.text is None or not self.pre.tokens:
            return None
        lead = self.pre.tokens[0].start[0] - 1
        return locate.tokens(self.text)[self.sites[0]].start[0] - lead

    def places(self) -> list[str]:
        """Where its pre-image is: by tokens, else (a hunk tokenize cannot read) by lines."""
        if self.sites or self.elsewhere:
            return [self.where(at) for at in (*self.sites, *self.elsewhere)]
        lines = (self.text or "").split("\n")
        return [f"{self.path}:{i + 1}" for i in _find_block(lines, self.hunk.pre)]

    def where(self, at: int) -> str:
        assert self.text is not None
        row = locate.tokens(self.text)[at].start[0]
        return f"{self.path}:{row} ({locate.dotted(locate.site_scope(self.text, at, self.pre))})"


_BLOBS: dict[tuple[str, str], str | None] = {}


def _blob_text(repo: Repo, sha: str) -> str | None:
    """A blob by its id (from a patch's `index` line: hex only, never an option), if the
    repository has it."""
    key = (str(repo.path), sha)
    if key not in _BLOBS:
        try:
            data: bytes | None = repo.run_bytes("cat-file", "blob", sha)
        except GitError:
            data = None
        _BLOBS[key] = data.decode("utf-8", "surrogateescape") if data is not None else None
    return _BLOBS[key]


def _old_scope(repo: Repo, file_patch: FilePatch, hunk: Hunk) -> locate.Scope | None:
    """The scope the hunk's change had where the patch was written: its pre-image in the
    patch's old blob, else its post-image in the new one (None when neither is at hand)."""
    for sha, post, start in (
        (file_patch.old_blob, False, hunk.old_start),
        (file_patch.new_blob, True, hunk.new_start),
    ):
        text = _blob_text(repo, sha) if sha else None
        if text is None:
            continue
        hunk_side = locate.side(hunk, post=post)
        hits = locate.find(locate.words(text), hunk_side.words)
        if not hits:
            continue
        toks = locate.tokens(text)
        lead = hunk_side.tokens[0].start[0] - 1
        best = min(hits, key=lambda i: abs(toks[i].start[0] - lead - start))
        return locate.site_scope(text, best, hunk_side)
    return None


def _token_present(hay: tuple[str, ...], pre: locate.Side, post: locate.Side) -> bool:
    """Every change of the hunk is there: its added code found, its removed code gone (but
    where it is part of the added code); a pure removal: its context, without it."""
    changes = list(zip(pre.changes, post.changes, strict=True))
    if not any(a < b or c < d for (a, b), (c, d) in changes):
        return False  # comments only: the line findings tell
    if locate.find(hay, post.words):
        return True
    if all(c == d for _, (c, d) in changes):
        return False  # a pure removal whose context is not there as the patch leaves it
    for (a, b), (c, d) in changes:
        removed, added = pre.words[a:b], post.words[c:d]
        spans = [(i, i + len(added)) for i in locate.find(hay, added)] if added else []
        if added and not spans:
            return False
        for j in locate.find(hay, removed) if removed else []:
            if not any(s <= j and j + len(removed) <= e for s, e in spans):
                return False
    return True


def _looks(repo: Repo, tree: str, patch: Patch) -> tuple[_Look, ...]:
    out: list[_Look] = []
    number = 0
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path)
        text = blob.decode("utf-8", "surrogateescape") if blob is not None else None
        hay = locate.words(text) if text is not None else ()
        for hunk in file_patch.hunks:
            number += 1
            pre, post = locate.side(hunk, post=False), locate.side(hunk, post=True)
            if not post.readable:
                pre = replace(pre, readable=False)
            scope = _old_scope(repo, file_patch, hunk)
            hits = locate.find(hay, pre.words) if text is not None and pre.readable else []
            scoped = tuple(
                i for i in hits if scope is None or locate.site_scope(text or "", i, pre) == scope
            )
            out.append(
                _Look(
                    number=number,
                    path=file_patch.path,
                    hunk=hunk,
                    pre=pre,
                    post=post,
                    scope=scope,
                    sites=scoped,
                    elsewhere=tuple(i for i in hits if i not in scoped),
                    present=text is not None and pre.readable and _token_present(hay, pre, post),
                    text=text,
                    line_sites=len(_find_block(text.split("\n"), hunk.pre)) if text else 0,
                )
            )
    return tuple(out)


def _kind(look: _Look, finding: HunkFinding) -> str:
    """What the tree holds of one hunk: "git" (no code to compare: git's placement), "site"
    (its pre-image, once, in its scope), "ambiguous" (several sites, or only in another
    scope), "present" (its changes), "changed" (a window alike), "lost" (none of these)."""
    if not look.pre.words or not look.pre.readable:  # its exact lines only
        if look.line_sites == 1:
            return "git"
        if look.line_sites > 1:
            return "ambiguous"
        return "present" if finding.result_present else "changed" if finding.located else "lost"
    if len(look.sites) == 1:
        return "site"
    if len(look.sites) > 1:
        return "ambiguous"
    if finding.result_present:
        return "present"
    if look.elsewhere:
        return "ambiguous"
    return "changed" if finding.located else "lost"


def _refreshed_patch(patch: Patch, looks: tuple[_Look, ...], kinds: list[str]) -> str | None:
    """The patch placed by token match: each file's hunks made at their one site, the hunks
    already there left out; None when a file's result is not the post-images' tokens."""
    diffs: list[str] = []
    for file_patch in patch.files:
        mine = [(look, kind) for look, kind in zip(looks, kinds, strict=True)]
        mine = [(look, kind) for look, kind in mine if look.path == file_patch.path]
        placements = [(look.hunk, look.sites[0]) for look, kind in mine if kind == "site"]
        if not placements:
            continue
        text = mine[0][0].text
        assert text is not None
        new = locate.refresh(text, placements)
        if new is None or not text.endswith("\n") or not new.endswith("\n"):
            return None  # (a file with no final newline: left to git and the maintainer)
        path = file_patch.path
        body = difflib.unified_diff(
            text.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
        lines = "".join(line if line.endswith("\n") else line + "\n" for line in body)
        diffs.append(f"diff --git a/{path} b/{path}\n{lines}")
    head = patch.raw.decode("utf-8").partition("\ndiff --git ")[0]
    return head + "\n" + "".join(diffs) + "-- \n"


def _related(old: locate.Scope, new: locate.Scope, bases: tuple[str, ...]) -> bool:
    """Whether code found in scope `new` is the code that was in scope `old`: the same scope,
    another method of the same class, or a method of a class the old one derives from."""
    if not old or not new:
        return old == new and bool(old)
    if new == old or (len(old) > 1 and new[: len(old) - 1] == old[:-1]):
        return True
    return len(old) > 1 and new[0] in bases


def _bug_elsewhere(
    repo: Repo, tree: str, looks: tuple[_Look, ...], hunks: tuple[HunkFinding, ...]
) -> tuple[str, ...]:
    """Where the removed code of a hunk that has no site in its file is, across the package:
    in a scope related to its old one (locate `_related`), or with a window of tokens at least
    LOCATE_RATIO alike to its pre-image (a copy in unrelated code is not the patch's code)."""
    places: list[str] = []
    for look, finding in zip(looks, hunks, strict=True):
        if look.sites or look.elsewhere or not look.pre.readable:
            continue
        own = _own_window(look, finding)
        for a, b in look.pre.changes:
            a, b = _without_separators(look.pre.words, a, b)
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


def _own_window(look: _Look, finding: HunkFinding) -> range:
    """The hunk's own window, changed (a conflict there, not code elsewhere)."""
    if finding.located and finding.found_at is not None:
        return range(finding.found_at, finding.found_at + len(look.hunk.pre))
    return range(0)


def _without_separators(words: tuple[str, ...], a: int, b: int) -> tuple[int, int]:
    """An argument's separator is not the bug: the expression may stand alone there."""
    while a < b and words[a] == ",":
        a += 1
    while b > a and words[b - 1] == ",":
        b -= 1
    return a, b


def _places_of(repo: Repo, tree: str, look: _Look, own: range, core: _Core) -> list[str]:
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
    look: _Look, path: str, text: str, own: range, core: _Core, bases: tuple[str, ...]
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
            look.scope is not None and scope is not None and _related(look.scope, scope, bases)
        ):
            places.append(f"{path}:{first} ({locate.dotted(scope)})")
    return places


@dataclass(frozen=True)
class _Case:
    """What `classify` knows of one patch on one tree: its arguments, then what the text and
    the trailers say, hunk by hunk."""

    repo: Repo
    tree: str
    patch: Patch
    base: str
    version: str | None
    was_applied: bool | None
    three_way: bool
    renames: Mapping[str, str]
    follow_moves: bool
    applies: bool
    looks: tuple[_Look, ...]
    hunks: tuple[HunkFinding, ...]
    kinds: tuple[str, ...]
    bug_here: bool
    expected: State | None
    pending: bool

    def rows(self) -> zip[tuple[str, _Look, HunkFinding]]:
        return zip(self.kinds, self.looks, self.hunks, strict=True)

    def verdict(
        self,
        state: State,
        reason: Reason,
        text: State,
        warnings: tuple[str, ...] = (),
        **extra: Any,
    ) -> Verdict:
        bug = bool(extra.pop("bug", False)) or self.bug_here
        cosmetic = []
        if state == State.UPSTREAM:
            cosmetic = _upstream_drift(self.repo, self.tree, self.patch, self.hunks)
            if extra.get("three_way") == "conflict":
                cosmetic.append(
                    "3-way merge: conflict (the release's code differs from the patch's)"
                )
        return Verdict(
            patch=self.patch.key,
            base=self.base,
            state=state,
            reason=reason,
            text_state=text,
            trailer_state=self.expected,
            hunks=self.hunks,
            warnings=warnings,
            cosmetic=tuple(cosmetic),
            bug_present=bug,
            **extra,
        )

    def trailer_note(self, state: State) -> tuple[str, ...]:
        return decide(state, self.expected, pending=self.pending, base=self.base)[2]

    def merged(self) -> str | None:
        return _three_way(self.repo, self.tree, self.patch) if self.three_way else None


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
    case = _case(
        repo, tree, patch, base, version, was_applied, three_way, renames or {}, follow_moves
    )
    return _diagnosed(case, _verdict(case))


def _verdict(case: _Case) -> Verdict:
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


def _case(
    repo: Repo,
    tree: str,
    patch: Patch,
    base: str,
    version: str | None,
    was_applied: bool | None,
    three_way: bool,
    renames: Mapping[str, str],
    follow_moves: bool,
) -> _Case:
    """`classify`'s arguments, and what git, the hunks and the trailers say."""
    applies, _ = repo.check_apply(tree, patch.raw)
    lines = find_hunks(repo, tree, patch)
    looks = _looks(repo, tree, patch)
    hunks = tuple(
        replace(h, result_present=h.result_present or look.present)
        for h, look in zip(lines, looks, strict=True)
    )
    return _Case(
        repo,
        tree,
        patch,
        base,
        version,
        was_applied,
        three_way,
        renames,
        follow_moves,
        applies=applies,
        looks=looks,
        hunks=hunks,
        kinds=tuple(_kind(look, h) for look, h in zip(looks, hunks, strict=True)),
        bug_here=any(
            (look.sites or look.elsewhere) and not (not look.hunk.removed and h.result_present)
            for look, h in zip(looks, hunks, strict=True)
        ),
        expected=trailer_state(patch, version),
        pending=not patch.trailers.applied_upstream,
    )


def _placed_by_git(case: _Case) -> Verdict | None:
    """1. git applies it, each hunk at the one place its code has in its scope."""
    placed = all(
        kind == "git" or (kind == "site" and look.row == h.applies_at)
        for kind, look, h in case.rows()
    )
    if not (case.applies and placed):
        return None
    note = case.trailer_note(State.APPLIES)
    return case.verdict(State.APPLIES, Reason.APPLIES, State.APPLIES, note)


def _placed_by_tokens(case: _Case) -> Verdict | None:
    """2. Its code is there once in its scope, reformatted or beside a copy, or partly fixed
    upstream: placed by token match."""
    kinds = list(case.kinds)
    if not (all(k in ("site", "present") for k in kinds) and "site" in kinds):
        return None
    refreshed = _refreshed_patch(case.patch, case.looks, kinds)
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


def _in_several_places(case: _Case) -> Verdict | None:
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


def _followed(case: _Case) -> tuple[Verdict | None, tuple[str, ...]]:
    """4. Files whose code went elsewhere, whole: followed (`moved`); else the candidates
    that the search found."""
    if not (case.follow_moves and "lost" in case.kinds):
        return None, ()
    moves, candidates = _relocation(
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


def _bug_found_elsewhere(case: _Case, candidates: tuple[str, ...]) -> Verdict | None:
    """5. The bug elsewhere in the package (a helper, a mixin, another module): needed, and
    the maintainer carries it there."""
    elsewhere = _bug_elsewhere(case.repo, case.tree, case.looks, case.hunks)
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


def _upstream(case: _Case) -> Verdict | None:
    """6. Every change there, no bug anywhere: upstream."""
    if not all(k == "present" or (k == "git" and h.result_present) for k, _, h in case.rows()):
        return None
    merged = case.merged()
    _, _, warn = decide(State.UPSTREAM, case.expected, pending=case.pending, base=case.base)
    return case.verdict(State.UPSTREAM, Reason.UPSTREAM, State.UPSTREAM, warn, three_way=merged)


_THERE = ("site", "present", "changed", "git")  # kinds of a hunk whose code is there


def _there(case: _Case) -> bool:
    """The code the patch changes is there (changed, maybe): every hunk's, but for hunks that
    only add lines to a file that is there (their place moved: where to add them is the
    maintainer's, not code that is gone), and at least one hunk's."""
    kinds = [
        kind in _THERE or (kind == "lost" and not look.hunk.removed and look.text is not None)
        for kind, look, _ in case.rows()
    ]
    return all(kinds) and any(kind in _THERE for kind in case.kinds)


def _rewritten(case: _Case) -> Verdict | None:
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


def _decided(case: _Case) -> Verdict:
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


def _three_way(repo: Repo, tree: str, patch: Patch) -> str:
    try:
        merged = repo.apply_to_tree(tree, patch.raw, three_way=True)
    except GitError:
        return "conflict"
    return "no change" if merged == tree else "clean"


def _upstream_drift(
    repo: Repo, tree: str, patch: Patch, hunks: tuple[HunkFinding, ...]
) -> list[str]:
    """Cosmetic notes on an upstreamed patch: the code is there, its surroundings or its
    comments are not the patch's."""
    notes = []
    pure_additions = {
        number
        for number, hunk in enumerate((h for f in patch.files for h in f.hunks), 1)
        if not hunk.removed
    }
    for h in hunks:
        if h.number in pure_additions and h.applies_at is None and not h.located:
            notes.append(f"hunk {h.number} ({h.file}): code present, surrounding text differs")
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
    return notes


def _cores(hunk: Hunk) -> list[list[str]]:
    """What must be found of a hunk for its code to be "there": the removed code lines of
    each of its changes (the context around them may have changed with the move), or, for a
    pure addition, the code lines of its context."""
    removed = [group for group, _ in _change_groups(hunk) if group]
    context = _code(hunk.pre)
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
        code_lines = _code(lines)
        if not all(_find_block(code_lines, core) for core in cores):
            continue
        if _find_hunk(lines, code_lines, True, path, 0, hunk).located:
            found.add(path)
    return found


def _reversed(hunk: Hunk) -> Hunk:
    """The hunk undone: its post-image as the pre-image (to find where its fix is)."""
    swap = {"+": "-", "-": "+", " ": " "}
    return Hunk(
        hunk.new_start, hunk.old_start, tuple(swap[line[0]] + line[1:] for line in hunk.lines)
    )


def _relocation(
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
        lost = [
            hunk
            for hunk, finding in zip(file_patch.hunks, mine, strict=True)
            if not (finding.located or finding.result_present)
        ]
        if not lost:
            continue
        renamed = renames.get(file_patch.path)
        if renamed and repo.read_blob(tree, renamed) is not None:
            moves.append((file_patch.path, renamed))
            continue
        suffix = PurePosixPath(file_patch.path).suffix
        places = [_holders(repo, tree, hunk, suffix) - {file_patch.path} for hunk in lost]
        if merged and not any(places) and repo.read_blob(tree, file_patch.path) is None:
            # The file is gone and its bug nowhere: where its fix is (a fix that upstream
            # merged, then moved the file: a module made a package) is where it went.
            places = [_holders(repo, tree, _reversed(hunk), suffix) for hunk in lost]
        common = set.intersection(*places)
        if len(lost) == len(mine) and len(common) == 1:
            moves.append((file_patch.path, common.pop()))
        else:
            candidates.update(*places)
    if candidates:
        return (), tuple(sorted(candidates))
    return tuple(moves), ()


# -- files a patch adds or deletes whole ---------------------------------------------------------
WHOLE_HEADERS = {"added": "new file", "deleted": "deleted file"}  # a whole file's hunk header


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
    """`classify` of a patch that adds or deletes files: each such file judged whole
    (`_whole_state`), the files it modifies classified as a patch of their own; a conflict of
    either is the patch's; a file already there (partly upstream) is left out of the patch as
    placed on this tree."""
    head, sections = _sections(patch)
    states = [
        _whole_state(repo, tree, f, base) if f.change != "modified" else (State.APPLIES, "")
        for f in patch.files
    ]
    modified = [s for s, f in zip(sections, patch.files, strict=True) if f.change == "modified"]
    inner = None
    if modified:
        sub = parse_patch_bytes(_joined(head, modified), patch.path, patch.key)
        inner = classify(
            repo,
            tree,
            sub,
            base=base,
            version=version,
            was_applied=was_applied,
            three_way=three_way,
            renames=renames,
            follow_moves=follow_moves,
        )
    whole = [
        (f, section, state, note)
        for f, section, (state, note) in zip(patch.files, sections, states, strict=True)
        if f.change != "modified"
    ]
    hunks = _merged_findings(patch, whole, inner)
    notes = tuple(note for _, _, _, note in whole if note)
    kept = [section for f, section, state, _ in whole if state == State.APPLIES]
    there = [
        f"{f.path}: there already (partly upstream); the patch as placed here leaves it out"
        for f, _, state, _ in whole
        if state == State.UPSTREAM
    ]
    wholes = {state for _, _, state, _ in whole}
    expected = trailer_state(patch, version)
    pending = not patch.trailers.applied_upstream
    fields: dict[str, Any] = {"patch": patch.key, "base": base, "hunks": hunks}
    fields["trailer_state"] = expected
    if State.CONFLICT in wholes or (inner is not None and inner.state == State.CONFLICT):
        state, reason, text = State.CONFLICT, Reason.CONFLICT, State.CONFLICT
        if inner is not None and inner.state == State.CONFLICT:
            reason = inner.reason
        warnings = (*notes, *(inner.warnings if inner else ()))
        extra = _inner_extra(inner)
        return Verdict(
            state=state, reason=reason, text_state=text, warnings=warnings, **fields, **extra
        )
    if inner is None:
        text = State.UPSTREAM if wholes == {State.UPSTREAM} else State.APPLIES
        state, reason, warnings = decide(
            text, expected, was_applied=was_applied, pending=pending, base=base
        )
        refreshed = _joined(head, kept).decode("utf-8", "surrogateescape") if there else ""
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
    if inner.state == State.UPSTREAM and State.APPLIES in wholes:
        missing = [f.path for f, _, state, _ in whole if state == State.APPLIES]
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
    if inner.state != State.APPLIES:  # upstream (with every whole file), or absent
        return replace(inner, patch=patch.key, hunks=hunks)
    refreshed = inner.refreshed
    if refreshed or there:
        placed = refreshed or _joined(head, modified).decode("utf-8", "surrogateescape")
        own = placed.removesuffix("\n-- \n").partition("\ndiff --git ")
        refreshed = _joined(own[0], ["diff --git " + own[2], *kept]).decode(
            "utf-8", "surrogateescape"
        )
    return replace(
        inner,
        patch=patch.key,
        hunks=hunks,
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
    whole: list[tuple[FilePatch, str, State, str]],
    inner: Verdict | None,
) -> tuple[HunkFinding, ...]:
    """Every hunk's finding in the patch's order, numbered in it."""
    states = {f.path: state for f, _, state, _ in whole}
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


# -- the diagnosis: where the bug and its fix are, across the package -------------------------
@dataclass(frozen=True)
class _Cue:
    """One line of a hunk's change as it is searched for: its tokens on one side of the hunk,
    trimmed of what the other side shares, where they start in that side's tokens, and its
    text as the hunk writes it."""

    look: _Look
    start: int
    words: tuple[str, ...]
    text: str
    line: tuple[str, ...] = ()  # its words on its own line (a comment holds one line)


def _cues(look: _Look, *, post: bool) -> list[_Cue]:
    """The lines of each change of the hunk (the removed ones: the bug; `post`: the added
    ones, the fix), each trimmed of the tokens the other side shares (`layer.weight.device`
    against `w13.device`: `layer . weight . device`), at least four tokens long."""
    mine, other = (look.post, look.pre) if post else (look.pre, look.post)
    # (A hunk that starts or ends inside a call is no `readable` side; the tokens of its
    # changed lines are the same words.)
    cues: list[_Cue] = []
    for (a, b), (c, d) in zip(mine.changes, other.changes, strict=True):
        theirs = other.words[c:d]
        for row in sorted({mine.tokens[i].start[0] for i in range(a, b)}):
            index = [i for i in range(a, b) if mine.tokens[i].start[0] == row]
            cue = _cue(look, mine, theirs, index[0], index[-1] + 1, post=post)
            if cue is not None:
                cues.append(cue)
    return cues


def _cue(
    look: _Look, mine: locate.Side, theirs: tuple[str, ...], first: int, end: int, *, post: bool
) -> _Cue | None:
    words = mine.words
    i, j = _without_separators(words, first, end)
    if post and _shared(words[i:j], theirs):
        # A fix that only takes away (`a or b` -> `a`): the line and the token after it.
        end = min(len(words), end + 2)
        first, j = i, end
        theirs = ()
    k = 0
    while i + k < j and k < len(theirs) and words[i + k] == theirs[k]:
        k += 1
    m = 0
    while j - m > i + k and m < len(theirs) - k and words[j - 1 - m] == theirs[-1 - m]:
        m += 1
    i, j = i + k, j - m
    if i >= j:
        return None  # the whole line is on the other side too
    while j - i < 4 and j < end:
        j += 1
    if j < end and words[j - 1] == ".":
        j += 1
    while j - i < 4 and i > first:
        i -= 1
    names = [w for w in words[i:j] if w.isidentifier() and not keyword.iskeyword(w)]
    start, stop = mine.tokens[i], mine.tokens[j - 1]
    if j - i < 3 or not names or (start.start[0] != stop.end[0] and not post):
        return None
    line = mine.lines[start.start[0] - 1]
    text = line[start.start[1] : stop.end[1]] if start.start[0] == stop.end[0] else line.strip()
    own = tuple(words[k] for k in range(i, j) if mine.tokens[k].start[0] == start.start[0])
    return _Cue(look, i, words[i:j], text, own)


def _shared(words: tuple[str, ...], theirs: tuple[str, ...]) -> bool:
    """Every token of `words` is at the start or the end of `theirs`."""
    k = 0
    while k < len(words) and k < len(theirs) and words[k] == theirs[k]:
        k += 1
    rest = words[k:]
    return not rest or theirs[len(theirs) - len(rest) :] == rest


def _reached(look: _Look, finding: HunkFinding) -> range:
    """The rows of the look's file the patch changes (its one site, or git's place)."""
    size = len(look.hunk.pre)
    if len(look.sites) == 1 and look.row is not None:
        return range(look.row, look.row + size)
    at = finding.applies_at or (finding.found_at if finding.located else None)
    return range(at, at + size) if at else range(0)


_ANCESTORS: dict[tuple[str, str, str], tuple[str, ...]] = {}


def _ancestors(repo: Repo, tree: str, text: str, name: str) -> tuple[str, ...]:
    """The classes `name` derives from, through the package (a few levels: the base of a
    base in another module, e.g. modular_kernel.py's)."""
    key = (str(repo.path), tree, name)
    if key not in _ANCESTORS:
        if len(_ANCESTORS) > 4096:
            _ANCESTORS.clear()
        seen: list[str] = []
        frontier = list(locate.class_bases(text, name))
        while frontier and len(seen) < 12:
            base = frontier.pop(0)
            if base in seen or base == name:
                continue
            seen.append(base)
            for path in repo.grep_files(tree, f"class {base}", "*.py")[:4]:
                source = (repo.read_blob(tree, path) or b"").decode("utf-8", "surrogateescape")
                frontier += locate.class_bases(source, base)
        _ANCESTORS[key] = tuple(seen)
    return _ANCESTORS[key]


def _calls_helper(text: str, old: locate.Scope, new: locate.Scope) -> bool:
    """A module function `new` of the file that the function `old` names (a helper)."""
    if len(new) != 1 or not old:
        return False
    for start, end, path in locate.definitions(text):
        if path == old:
            rows = range(start, end + 1)
            return any(t.text == new[0] for t in locate.tokens(text) if t.start[0] in rows)
    return False


def _bug_places(case: _Case, applied: bool) -> tuple[list[tuple[str, bool]], list[str]]:
    """Every live place of the package where a removed line of the patch (the bug) is, in
    code related to the patch's (its scope, another method of its class or of a class it
    derives from, a helper it calls, or surroundings at least LOCATE_RATIO alike): (place,
    whether the patch, `applied`, changes it there), and the files skipped (past the readers'
    bounds)."""
    cues = _bug_cues(case)
    if not cues:
        return [], []
    texts = sorted({cue.text for cue in cues})
    places: dict[str, bool] = {}
    skipped: list[str] = []
    findings = {h.number: h for h in case.hunks}
    for path in _grep(case.repo, case.tree, tuple(texts)):
        text = (case.repo.read_blob(case.tree, path) or b"").decode("utf-8", "surrogateescape")
        if not any(cue.text in text for cue in cues):
            continue  # (another patch's cue: one search serves them all)
        if locate.unreadable(text):
            skipped.append(path)
            continue
        for cue in cues:
            if cue.text not in text or not _may_relate(cue.look, path, text):
                continue
            reached = _reached(cue.look, findings[cue.look.number]) if applied else range(0)
            for row, scope in _related_hits(case, path, text, cue):
                place = f"{path}:{row} ({locate.dotted(scope)})"
                mine = path == cue.look.path and row in reached
                places[place] = places.get(place, False) or mine
    return sorted(places.items(), key=lambda p: _place_key(p[0])), skipped


_KNOWN: set[str] = set()  # every cue text asked for in this process
_GREPS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}  # tree -> (texts, files)
_LAST: dict[str, str] = {}  # repository -> the last tree searched
_FEW = 400  # changed files searched by name; more: the whole tree again


def _grep(repo: Repo, tree: str, texts: tuple[str, ...]) -> tuple[str, ...]:
    """The Python files of `tree` holding one of `texts` (or of the texts asked before: one
    search serves every patch of a series). A tree id names its content: searched once per
    process; and a file whose blob did not change since the last tree searched (the tree
    with one more patch applied, the rebase's worktree, the next release) is not read
    again: only the files that changed are."""
    tree = repo.tree_of(tree)
    asked = frozenset(texts)
    known = _GREPS.get(tree)
    if known is not None and asked <= known[0]:
        return known[1]
    if len(_GREPS) > 256:
        _GREPS.clear()
        _LAST.clear()
    _KNOWN.update(asked)
    union = frozenset(_KNOWN)
    patterns = sorted(union)
    last = _LAST.get(str(repo.path))
    found: tuple[str, ...] | None = None
    if last is not None and last in _GREPS and _GREPS[last][0] == union:
        out = repo.run("diff", "--name-only", "--no-renames", "-z", last, tree, "--", "*.py")
        changed = {p for p in out.split("\0") if p}
        if len(changed) <= _FEW:
            kept = {p for p in _GREPS[last][1] if p not in changed}
            fresh = (
                repo.grep_files(tree, patterns[0], "*.py", *patterns[1:], paths=sorted(changed))
                if changed
                else []
            )
            found = tuple(sorted({*kept, *fresh}))
    if found is None:
        found = tuple(repo.grep_files(tree, patterns[0], "*.py", *patterns[1:]))
    _GREPS[tree] = (union, found)
    _LAST[str(repo.path)] = tree
    return found


def _may_relate(look: _Look, path: str, text: str) -> bool:
    """A cheap test before a file's tokens: code related to a module function's can only be
    in a file that names it, or that holds most of its context lines (alike surroundings;
    vLLM's linear layers share fix 1's line, not its function). A method's: any file (a
    base class, or a base of one, may be anywhere)."""
    if path == look.path or (look.scope is not None and len(look.scope) > 1):
        return True
    if any(name in text for name in look.scope or ()):
        return True
    context = [line.strip() for line in look.hunk.pre if len(line.strip()) > 8]
    return bool(context) and 2 * sum(line in text for line in context) >= len(context)


def _bug_cues(case: _Case) -> list[_Cue]:
    """The removed lines that tell the bug: live code where the patch was written (not a
    docstring's line, which a hunk starting inside it cannot tell), and not written again by
    the patch itself (`self.w1_scale_val` that the patch moves is no bug of the old code)."""
    posts = [look.post.words for look in case.looks]
    olds = {fp.path: fp.old_blob for fp in case.patch.files}
    cues = []
    for look in case.looks:
        blob = olds.get(look.path)
        old = _blob_text(case.repo, blob) if blob else None
        for cue in _cues(look, post=False):
            if any(locate.find(words, cue.words) for words in posts):
                continue
            if (old is None and not look.pre.readable) or (
                old is not None and not locate.find(locate.words(old), cue.words)
            ):
                continue
            cues.append(cue)
    return cues


def _place_key(place: str) -> tuple[str, int]:
    path, _, rest = place.partition(":")
    return path, int(rest.split(" ", 1)[0])


def _related_hits(
    case: _Case, path: str, text: str, cue: _Cue
) -> list[tuple[int, locate.Scope | None]]:
    look = cue.look
    hay = locate.words(text)
    toks = locate.tokens(text)
    hits = []
    for at in locate.find(hay, cue.words):
        row = toks[at].start[0]
        scope = locate.scope_of(text, row, toks[at + len(cue.words) - 1].end[0])
        start = max(0, at - cue.start)
        alike = (
            locate.similarity(hay[start : start + len(look.pre.words)], look.pre.words)
            >= LOCATE_RATIO
        )
        if alike or _related_scope(case, look, path, text, scope):
            hits.append((row, scope))
    return hits


def _related_scope(
    case: _Case, look: _Look, path: str, text: str, scope: locate.Scope | None
) -> bool:
    old = look.scope
    if old is None or scope is None:
        return False
    if _related(old, scope, ()):
        return True
    if path == look.path and _calls_helper(text, old, scope):
        return True
    if len(old) > 1 and scope and look.text is not None:
        return scope[0] in _ancestors(case.repo, case.tree, look.text, old[0])
    return False


def _fix_places(case: _Case) -> str:
    """Where the patch's added lines (the fix) are in its files: live, or only in comments,
    strings or dead branches (which never count as the fix); hunk by hunk where it has
    several."""
    said = [(look.number, _fix_of(look)) for look in case.looks if _cues(look, post=True)]
    if len(said) == 1:
        return f"its fix is {said[0][1]}"
    if not said:
        return "its fix has no code of its own"
    return "its fix: " + "; ".join(f"hunk {number} {where}" for number, where in said)


def _fix_of(look: _Look) -> str:
    if look.text is None:
        return f"nowhere ({look.path} is not there)"
    live: list[str] = []
    shadowed: list[str] = []
    hay = locate.words(look.text)
    for cue in _cues(look, post=True):
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


def _diagnosed(case: _Case, verdict: Verdict) -> Verdict:
    """The verdict checked against where the bug is live across the package: a copy the patch
    does not reach, or a bug the verdict did not see, is a stop naming every place (with
    where the fix is); files past the readers' bounds are named in a warning."""
    if verdict.reason == Reason.MOVED:  # classified where it went (diagnosed there)
        return verdict
    bugs, skipped = _bug_places(case, verdict.state == State.APPLIES)
    skips = tuple(
        f"{path}: skipped in the search for copies of the bug (past what the reader reads)"
        for path in skipped
    )
    places = [place for place, _ in bugs]
    copies = [place for place, mine in bugs if not mine]
    settled = verdict.state in (State.APPLIES, State.UPSTREAM)
    if (settled and not copies) or not places:
        return replace(verdict, warnings=(*verdict.warnings, *skips)) if skips else verdict
    cues = dict.fromkeys(cue.text for cue in _bug_cues(case))
    line = (
        f"the bug ({', '.join(f'`{c}`' for c in cues)}) is live at {', '.join(places)}"
        + (" (the patch does not reach every place)" if verdict.state == State.APPLIES else "")
        + f"; {_fix_places(case)}"
    )
    warnings = (line, *verdict.warnings)
    state: State
    reason: Reason
    if verdict.bug_present and verdict.state == State.CONFLICT:  # seen already: a line more
        state, reason, warnings = verdict.state, verdict.reason, (*verdict.warnings, line)
    elif settled or verdict.state == State.ABSENT or verdict.reason == Reason.REWRITTEN:
        state, reason = State.CONFLICT, Reason.AMBIGUOUS
        warnings = (line, *(w for w in verdict.warnings if "neither its fix" not in w))
    else:
        state, reason = verdict.state, verdict.reason
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
