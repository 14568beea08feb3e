"""The rebase's plan: each patch classified on a tree and settled there as a `Step` (taken,
archived, parked, dropped, or a stop). The same steps run on two tree objects: the plan
(`TreeApplier`, patches applied in a temporary index, nothing stops) and the real run
(`WorktreeApplier`, `git am -3` in a sparse clone that checks out each patch's files as it is
taken)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_patchset import versions
from vllm_patchset.errors import Finding, GitError
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.upstream import Mirror, Upstream, sort_versions
from vllm_patchset.series.classify import classify
from vllm_patchset.series.edits import rewrite_paths
from vllm_patchset.series.patches import Patch, Series, read_series_entries
from vllm_patchset.series.verdict import State, Verdict
from vllm_patchset.sync.checks import project_series
from vllm_patchset.sync.rebase_report import option_name, today
from vllm_patchset.sync.rebase_rules import hand_resolvable, options, ported
from vllm_patchset.sync.rebase_state import Action, Choice, Decision, RebaseState, Section, Step
from vllm_patchset.sync.verdict_reports import conflict_report


@dataclass(frozen=True)
class Context:
    mirror: Mirror
    onto: Upstream
    old_pin: str
    applied_before: frozenset[str]
    renames: Mapping[str, str]
    decisions: Mapping[str, Decision]
    parked_reasons: Mapping[str, str]
    keys: tuple[str, ...] = ()  # every patch's key: option names are unique among them


class TreeApplier:
    """The dry run: patches applied to a tree in a temporary index. Nothing stops here: a
    conflict is what the real run will stop at, a decision that does not fit is left to
    `rebase_decisions.validate`, which names it."""

    def __init__(self, repo: Repo, tree: str) -> None:
        self.repo, self._tree = repo, tree

    def tree(self) -> str:
        return self._tree

    def take(self, raw: bytes) -> bool:
        try:
            self._tree = self.repo.apply_to_tree(self._tree, raw, three_way=True)
        except GitError:
            return False
        return True

    def head(self) -> str | None:
        return None

    def decides(self, step: Step, decision: Decision) -> bool:
        return decision.choice in step.options

    def by_hand(self, step: Step, raw: bytes, ctx: Context) -> Step:
        flags = ", ".join(f"{c.flag} {option_name(step.key, ctx.keys)}" for c in step.options)
        note = (
            "the rebase will stop here for a hand resolution in .rebase/worktree"
            f" (or decide now: {flags})"
        )
        return _conflict(step, notes=(note,))

    def port(self, step: Step, raw: bytes) -> Step:
        note = "the rebase will stop here for the port by hand in .rebase/worktree"
        return _conflict(step, notes=(note,))


class WorktreeApplier:
    """The real run: patches taken as commits with `git am -3` in `.rebase/worktree`, a sparse
    clone: the files a patch touches are checked out as it is taken (a maintainer resolves a
    conflict there), not the thousands of others."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo

    def tree(self) -> str:
        return self.repo.tree_of("HEAD")

    def take(self, raw: bytes) -> bool:
        pairs = _DIFF_PATHS.findall(raw.decode("utf-8", "surrogateescape"))
        self.repo.widen(path for pair in pairs for path in pair)
        return self.repo.am_3way(raw)

    def head(self) -> str | None:
        return self.repo.head()

    def decides(self, step: Step, decision: Decision) -> bool:
        return True  # `settle_decided` refuses a decision that no longer fits

    def by_hand(self, step: Step, raw: bytes, ctx: Context) -> Step:
        if not self.take(raw):
            return _conflict(step)
        note = "git am -3 applied it although the 3-way check did not"
        return dataclasses.replace(step, action=Action.REFRESHED, commit=self.head(), notes=(note,))

    def port(self, step: Step, raw: bytes) -> Step:
        """Taken by `git am -3` (a conflict stays in progress), then a stop: the maintainer
        carries the fix to every place the verdict names and commits."""
        how = "applied as it is" if self.take(raw) else "stopped on a conflict"
        note = (
            f"--port: git am -3 {how}; carry the fix to every place named above, commit"
            " (one commit), then `rebase --continue`"
        )
        return _conflict(step, notes=(note,))


Applier = TreeApplier | WorktreeApplier
# The files of a patch, old and new: its `diff --git a/OLD b/NEW` lines.
_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def placed(patch: Patch, verdict: Verdict) -> bytes:
    """The patch's bytes as they apply to the new base: its paths moved where the code went,
    or refreshed by token match (the verdict's own), else as it is."""
    placed = verdict.placed
    if placed is not None:
        return placed
    return rewrite_paths(patch.raw, dict(verdict.moved_to)) if verdict.moved_to else patch.raw


def _conflict(step: Step, notes: tuple[str, ...] = ()) -> Step:
    report = conflict_report(step.verdict)
    return dataclasses.replace(
        step, action=Action.CONFLICT, report=report, notes=(*step.notes, *notes)
    )


def _taken(applier: Applier, step: Step, raw: bytes, action: Action) -> Step:
    """`step` taken onto the applier's tree as `action`, or a conflict (also where `git am`
    made no commit: its change is there already, a stop for the maintainer)."""
    before = applier.head()
    if not applier.take(raw):
        return _conflict(step)
    if before is not None and applier.head() == before:
        note = "git am -3 made no commit (its change is there already): decide"
        return _conflict(step, notes=(note,))
    return dataclasses.replace(step, action=action, commit=applier.head())


def settle(applier: Applier, section: Section, patch: Patch, ctx: Context) -> Step:
    """One patch classified on the applier's tree and settled there (or a stop)."""
    verdict = classify(
        applier.repo,
        applier.tree(),
        patch,
        base=ctx.onto.label,
        version=ctx.onto.version,
        was_applied=patch.key in ctx.applied_before,
        three_way=True,
        renames=ctx.renames,
    )
    step = Step(
        key=patch.key,
        name=patch.name,
        section=section,
        verdict=verdict,
        action=Action.DECISION,  # unless settled below
        options=options(section, verdict, patch),
        applied_upstream=patch.trailers.applied_upstream,
        upstream_pr=patch.trailers.upstream_pr,
    )
    if section == Section.PARKED:
        return _parked(step, ctx)
    raw = placed(patch, verdict)
    decision = ctx.decisions.get(patch.key)
    if decision is not None and applier.decides(step, decision):
        return settle_decided(applier, step, raw, decision, ctx)
    if not step.options:
        return _settled(applier, step, raw, patch, ctx)
    if hand_resolvable(step):
        return applier.by_hand(step, raw, ctx)
    return step


def _parked(step: Step, ctx: Context) -> Step:
    """A parked patch stays parked: classified for the record, never applied."""
    notes = (
        (
            f"parked, yet it applies to {ctx.onto.label}: move it back to patches/series"
            " (and out of patches/parked/series) to carry it again",
        )
        if step.verdict.state == State.APPLIES
        else ()
    )
    reason = ctx.parked_reasons.get(step.name, "")
    return dataclasses.replace(step, action=Action.PARKED, notes=notes, parked_reason=reason)


def _settled(applier: Applier, step: Step, raw: bytes, patch: Patch, ctx: Context) -> Step:
    """A patch that needs no decision: archived ones keep guarding, applied ones are taken,
    merged ones archived."""
    if step.section == Section.UPSTREAMED:
        return dataclasses.replace(step, action=Action.CARRIED)
    if step.verdict.state == State.APPLIES:
        return _taken(applier, step, raw, Action.REFRESHED)
    release, note = _merged_in(ctx, patch)
    return dataclasses.replace(
        step, action=Action.ARCHIVED, applied_upstream=release, notes=(note,)
    )


def settle_decided(
    applier: Applier, step: Step, raw: bytes, decision: Decision, ctx: Context
) -> Step:
    if decision.choice not in step.options:
        raise Finding(
            f"{decision.choice.flag} {step.key}: no longer an option on the resolved worktree"
            f" ({step.verdict.words}): `rebase --abort`, then start again"
        )
    step = dataclasses.replace(step, decision=decision.choice)
    if ported(step, decision.choice):
        return dataclasses.replace(applier.port(step, raw), decision=decision.choice)
    leaves_it = decision.choice == Choice.DROP or step.section == Section.SERIES
    if step.verdict.bug_present and leaves_it:
        places = ", ".join(step.verdict.candidates) or "its files"
        step = dataclasses.replace(
            step,
            notes=(
                *step.notes,
                f"{decision.choice.flag}: the bug stays live ({places}): nothing carries its"
                " fix now",
            ),
        )
    if decision.choice == Choice.DROP:
        return dataclasses.replace(step, action=Action.DROPPED)
    if decision.choice == Choice.RESOLVE_UPSTREAM:
        release = decision.release or ctx.onto.version or ""
        return dataclasses.replace(step, action=Action.ARCHIVED, applied_upstream=release)
    if step.section == Section.UPSTREAMED:  # --keep: carried again in the series
        return _taken(applier, step, raw, Action.UNARCHIVED)
    reason = (
        f"kept by `rebase` {ctx.old_pin} -> {ctx.onto.label} on {today()}:"
        f" {step.verdict.words} there"
    )
    return dataclasses.replace(step, action=Action.PARKED, parked_reason=reason)


def _merged_in(ctx: Context, patch: Patch) -> tuple[str, str]:
    """The release that merged the fix: the trailer, else the earliest release in the local
    mirror (searching back from the new base while the fix is there)."""
    if patch.trailers.applied_upstream:
        return patch.trailers.applied_upstream, (
            f"Applied-upstream: {patch.trailers.applied_upstream} (trailer kept)"
        )
    onto = ctx.onto
    current = versions.parse(onto.version) if onto.version else None
    if current is None:
        return "", f"merged upstream at {onto.label}, no release yet: Applied-upstream left empty"
    repo = ctx.mirror.repo
    tags = [t[1:] for t in repo.tags("v*")]
    releases = [v for v in tags if (parsed := versions.parse(v)) is not None and parsed <= current]
    first = onto.version or ""
    for release in reversed(sort_versions(releases)):
        tree = repo.tree_of(f"refs/tags/v{release}")
        verdict = classify(repo, tree, patch, base=release, version=release, follow_moves=False)
        if verdict.text_state != State.UPSTREAM:
            break
        first = release
    return first, (
        f"Applied-upstream: {first} (the earliest release in the local mirror, searching back"
        f" from {onto.version}, that has the fix)"
    )


def ordered(series: Series) -> list[tuple[Section, Patch]]:
    """The archive first (the overlay walk applies older fixes first), the series, then the
    parked patches (classified for the record, never applied)."""
    return [
        *((Section.UPSTREAMED, p) for p in series.upstreamed),
        *((Section.SERIES, p) for p in series.active),
        *((Section.PARKED, p) for p in series.parked),
    ]


def plan_steps(
    ctx: Context, repo: Repo, tree: str, series: Series, done: set[str]
) -> tuple[Step, ...]:
    """Every patch not `done`, classified and settled on `tree` as a dry run."""
    applier = TreeApplier(repo, tree)
    return tuple(
        settle(applier, section, patch, ctx)
        for section, patch in ordered(series)
        if patch.key not in done
    )


def context(project: Project, mirror: Mirror, state: RebaseState) -> Context:
    """What settling a patch needs to know of the rebase, from its journal."""
    return Context(
        mirror=mirror,
        onto=state.onto,
        old_pin=state.old_pin,
        applied_before=frozenset(state.applied_before),
        renames=dict(state.renames),
        decisions={d.patch: d for d in state.decisions},
        parked_reasons=dict(read_series_entries(project.parked_file)),
        keys=tuple(p.key for _, p in ordered(project_series(project))),
    )
