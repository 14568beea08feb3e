"""What `classify` knows of one patch on one tree (`Case`): its arguments, what git, the hunks
(by lines and by tokens) and the trailers say, and the verdict it makes of a state, with the
cosmetic notes of an upstreamed patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from vllm_patchset.errors import GitError
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series.line_evidence import find_block, find_hunks
from vllm_patchset.series.patches import Patch
from vllm_patchset.series.token_evidence import Look, kind, looks
from vllm_patchset.series.verdict import HunkFinding, Reason, State, Verdict, decide, trailer_state


@dataclass(frozen=True)
class Case:
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
    looks: tuple[Look, ...]
    hunks: tuple[HunkFinding, ...]
    kinds: tuple[str, ...]
    bug_here: bool
    expected: State | None
    pending: bool

    def rows(self) -> zip[tuple[str, Look, HunkFinding]]:
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
            cosmetic = upstream_drift(self.repo, self.tree, self.patch, self.hunks)
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
        return three_way_merge(self.repo, self.tree, self.patch) if self.three_way else None


def case_of(
    repo: Repo,
    tree: str,
    patch: Patch,
    base: str,
    version: str | None,
    was_applied: bool | None,
    three_way: bool,
    renames: Mapping[str, str],
    follow_moves: bool,
) -> Case:
    """`classify`'s arguments, and what git, the hunks and the trailers say."""
    applies, _ = repo.check_apply(tree, patch.raw)
    lines = find_hunks(repo, tree, patch)
    seen = looks(repo, tree, patch)
    hunks = tuple(
        replace(h, result_present=h.result_present or look.present)
        for h, look in zip(lines, seen, strict=True)
    )
    return Case(
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
        looks=seen,
        hunks=hunks,
        kinds=tuple(kind(look, h) for look, h in zip(seen, hunks, strict=True)),
        bug_here=any(
            (look.sites or look.elsewhere) and not (not look.hunk.removed and h.result_present)
            for look, h in zip(seen, hunks, strict=True)
        ),
        expected=trailer_state(patch, version),
        pending=not patch.trailers.applied_upstream,
    )


def three_way_merge(repo: Repo, tree: str, patch: Patch) -> str:
    """git's 3-way merge of the patch onto the tree: "clean", "no change" or "conflict"."""
    try:
        merged = repo.apply_to_tree(tree, patch.raw, three_way=True)
    except GitError:
        return "conflict"
    return "no change" if merged == tree else "clean"


def upstream_drift(
    repo: Repo, tree: str, patch: Patch, hunks: tuple[HunkFinding, ...]
) -> list[str]:
    """Cosmetic notes on an upstreamed patch: the code is there, its surroundings or its
    comments are not the patch's."""
    return _surroundings_differ(patch, hunks) + _comments_differ(repo, tree, patch)


def _surroundings_differ(patch: Patch, hunks: tuple[HunkFinding, ...]) -> list[str]:
    """The pure additions whose code is there, not at their place."""
    pure_additions = {
        number
        for number, hunk in enumerate((h for f in patch.files for h in f.hunks), 1)
        if not hunk.removed
    }
    return [
        f"hunk {h.number} ({h.file}): code present, surrounding text differs"
        for h in hunks
        if h.number in pure_additions and h.applies_at is None and not h.located
    ]


def _comments_differ(repo: Repo, tree: str, patch: Patch) -> list[str]:
    """The hunks whose added comment lines are not on the tree."""
    notes = []
    number = 0
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path) or b""
        text_lines = [line.strip() for line in blob.decode("utf-8", "replace").split("\n")]
        for hunk in file_patch.hunks:
            number += 1
            comments = [line.strip() for line in hunk.added if line.strip().startswith("#")]
            if comments and not find_block(text_lines, comments):
                notes.append(
                    f"hunk {number} ({file_patch.path}): code matches upstream,"
                    " comment lines differ"
                )
    return notes
