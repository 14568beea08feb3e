"""Where a hunk is on a tree, by tokens (locate.py): the sites of its pre-image in the scope it
had where the patch was written (`Look`), whether its changes are there, what the tree holds
of it (`kind`), and the patch placed by token match (`refreshed_patch`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from vllm_patchset.errors import GitError
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series import locate
from vllm_patchset.series.line_evidence import find_block
from vllm_patchset.series.patches import FilePatch, Hunk, Patch
from vllm_patchset.series.refresh import refresh
from vllm_patchset.series.verdict import HunkFinding


@dataclass(frozen=True)
class Look:
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
        return [f"{self.path}:{i + 1}" for i in find_block(lines, self.hunk.pre)]

    def where(self, at: int) -> str:
        assert self.text is not None
        row = locate.tokens(self.text)[at].start[0]
        return f"{self.path}:{row} ({locate.dotted(locate.site_scope(self.text, at, self.pre))})"


_BLOBS: dict[tuple[str, str], str | None] = {}


def blob_text(repo: Repo, sha: str) -> str | None:
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
        text = blob_text(repo, sha) if sha else None
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
    return all(_change_present(hay, pre.words[a:b], post.words[c:d]) for (a, b), (c, d) in changes)


def _change_present(hay: tuple[str, ...], removed: tuple[str, ...], added: tuple[str, ...]) -> bool:
    """One change is there: its added tokens found, its removed ones nowhere but inside them."""
    spans = [(i, i + len(added)) for i in locate.find(hay, added)] if added else []
    if added and not spans:
        return False
    return all(
        any(s <= j and j + len(removed) <= e for s, e in spans)
        for j in (locate.find(hay, removed) if removed else [])
    )


def looks(repo: Repo, tree: str, patch: Patch) -> tuple[Look, ...]:
    """Each hunk of the patch on the tree, by tokens, numbered in the patch."""
    out: list[Look] = []
    number = 0
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path)
        text = blob.decode("utf-8", "surrogateescape") if blob is not None else None
        hay = locate.words(text) if text is not None else ()
        for hunk in file_patch.hunks:
            number += 1
            out.append(_look(repo, file_patch, hunk, number, text, hay))
    return tuple(out)


def _look(
    repo: Repo,
    file_patch: FilePatch,
    hunk: Hunk,
    number: int,
    text: str | None,
    hay: tuple[str, ...],
) -> Look:
    """One hunk on the file `text` (None: not on the tree), whose tokens are `hay`."""
    pre, post = locate.side(hunk, post=False), locate.side(hunk, post=True)
    if not post.readable:
        pre = replace(pre, readable=False)
    scope = _old_scope(repo, file_patch, hunk)
    hits = locate.find(hay, pre.words) if text is not None and pre.readable else []
    scoped = tuple(
        i for i in hits if scope is None or locate.site_scope(text or "", i, pre) == scope
    )
    return Look(
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
        line_sites=len(find_block(text.split("\n"), hunk.pre)) if text else 0,
    )


def kind(look: Look, finding: HunkFinding) -> str:
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


def refreshed_patch(patch: Patch, looks: tuple[Look, ...], kinds: list[str]) -> str | None:
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
        new = refresh(text, placements)
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


def related(old: locate.Scope, new: locate.Scope, bases: tuple[str, ...]) -> bool:
    """Whether code found in scope `new` is the code that was in scope `old`: the same scope,
    another method of the same class, or a method of a class the old one derives from."""
    if not old or not new:
        return old == new and bool(old)
    if new == old or (len(old) > 1 and new[: len(old) - 1] == old[:-1]):
        return True
    return len(old) > 1 and new[0] in bases


def without_separators(words: tuple[str, ...], a: int, b: int) -> tuple[int, int]:
    """An argument's separator is not the bug: the expression may stand alone there."""
    while a < b and words[a] == ",":
        a += 1
    while b > a and words[b - 1] == ",":
        b -= 1
    return a, b
