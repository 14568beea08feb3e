"""`vllm-patchset rebase`: take the patch set from the pin onto a new vLLM release or git ref.

The state machine. First the whole set is classified on the new base (series.classify, with
whether each patch applied on the old pin, git's renames between the two, a 3-way merge), as
a dry run in a temporary index: every decision a maintainer must make is reported together,
before anything is written. A patch that applied on the old pin ends the rebase in one of
three ways only: still applied (refreshed), archived as upstream, or settled by a decision
named on the command line (`--keep`: parked, `--drop`, `--resolve-upstream`, `--port`: taken
with `git am -3` and ported by hand, for a patch whose bug is live where it no longer applies).

Then the series is taken, patch by patch, as commits in `.rebase/worktree` (a clone that
borrows the mirror's objects; classification there goes through the clone, which sees both
its own objects and the mirror's). A conflict whose hunks are there stops for a hand
resolution (`--continue` after it). At the end the new `patches/`, `pyproject.toml`, lock,
CHANGELOG.md and CI files are staged, the staged project must pass `check`, and only then is
it swapped in (swap.py). `.rebase/state.json` (rebase_state.py) is the journal.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset import versions
from vllm_patchset.console import emit
from vllm_patchset.errors import BadInput, Finding, GitError, InternalError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.build import walk
from vllm_patchset.overlay.upstream import (
    Mirror,
    Upstream,
    check_version,
    mirror_for,
    pin_base,
    sort_versions,
)
from vllm_patchset.registry import GIT, add_command
from vllm_patchset.series.classify import classify
from vllm_patchset.series.edits import rewrite_paths
from vllm_patchset.series.patches import Patch, Series, read_series_entries
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync.checks import project_series
from vllm_patchset.sync.rebase_report import Outcome, render_text, report_body, short_id, today
from vllm_patchset.sync.rebase_state import (
    Action,
    Choice,
    DamagedState,
    Decision,
    Phase,
    RebaseState,
    Section,
    Step,
    load,
    phase_on_disk,
    rebase_dir,
    save,
    state_path,
)
from vllm_patchset.sync.reports import conflict_report
from vllm_patchset.sync.swap import (
    CHANGELOG,
    STAGE,
    has_backup,
    rel,
    rewritten_paths,
    roll_back,
    stage_project,
    swap_in,
)

# GitPython for git, tomlkit for pyproject.toml, ruamel.yaml for the CI files.
REBASE = (*GIT, "tomlkit", "ruamel.yaml")


# -- the rules -----------------------------------------------------------------------------------
def is_local(patch: Patch) -> bool:
    """A patch written here, with no upstream pull request (`Upstream-PR: none ...`)."""
    words = patch.trailers.upstream_pr.split()
    return not words or words[0].lower() == "none"


def options(section: Section, verdict: Verdict, patch: Patch) -> tuple[Choice, ...]:
    """The decisions that settle a patch on the new base; () when it needs none.
    `--resolve-upstream` only where the text shows no bug (`Verdict.bug_present`): the code
    decides, never the trailers."""
    if section == Section.PARKED:
        return ()
    resolve = () if verdict.bug_present else (Choice.RESOLVE_UPSTREAM,)
    if section == Section.UPSTREAMED:
        if verdict.state == State.APPLIES or verdict.bug_present:  # the bug is back
            return (Choice.KEEP, Choice.DROP)
        # Changed code with no bug in it (fixed in other words, as resolved): it keeps
        # guarding; code that is gone altogether is the maintainer's to drop.
        gone = verdict.state == State.CONFLICT and verdict.reason != Reason.CONFLICT
        return (Choice.DROP,) if gone else ()
    if verdict.state == State.APPLIES:
        return ()
    if verdict.state == State.UPSTREAM:
        # Never archived as upstream without the maintainer saying so: nothing upstream
        # merged it, the same text is there by coincidence or by another change; nor where
        # its trailers name a later release than this one (the text and the trailers
        # disagree: the maintainer says which is right).
        disagree = verdict.trailer_state == State.APPLIES and bool(patch.trailers.applied_upstream)
        if is_local(patch) or disagree:
            return (Choice.RESOLVE_UPSTREAM, Choice.KEEP, Choice.DROP)
        return ()
    if verdict.state == State.CONFLICT:
        if verdict.bug_present:  # the safe one first: port it by hand
            return (Choice.PORT, Choice.KEEP, Choice.DROP)
        return (Choice.KEEP, Choice.DROP, *resolve)
    return (Choice.KEEP, Choice.DROP)  # absent: the code was never there


def ported(step: Step, decision: Choice) -> bool:
    """A decision taken by hand in the worktree: `--port`, or `--keep` of an archived fix whose
    bug is live where it no longer applies as it is (a copy, a move: a conflict)."""
    return decision == Choice.PORT or (
        decision == Choice.KEEP
        and step.section == Section.UPSTREAMED
        and step.verdict.state == State.CONFLICT
    )


def stops(step: Step, *, planned: bool) -> bool:
    """The one rule for where the rebase stops. The real run stops at its first conflict or
    decision. A plan (the dry run before anything is taken) stops for decisions only, so that
    every one of them is asked for at once and before anything is written; its conflicts are
    where the real run will stop for a hand resolution."""
    return step.action == Action.DECISION or (step.action.stops and not planned)


def _stopped(
    state: RebaseState, steps: tuple[Step, ...], at: Step, head: str | None
) -> RebaseState:
    """`state` stopped at the step `at` (the last of `steps` in a real run)."""
    return dataclasses.replace(
        state, phase=Phase.STOPPED, steps=steps, stop=at.action, stopped_head=head
    )


def hand_resolvable(step: Step) -> bool:
    """A series patch whose hunks are there, changed: resolved by hand in the worktree."""
    return (
        step.section == Section.SERIES
        and step.verdict.state == State.CONFLICT
        and step.verdict.reason in (Reason.CONFLICT, Reason.MOVED)
    )


# -- classifying and taking one patch ------------------------------------------------------------
@dataclass(frozen=True)
class Context:
    mirror: Mirror
    onto: Upstream
    old_pin: str
    applied_before: frozenset[str]
    renames: Mapping[str, str]
    decisions: Mapping[str, Decision]
    parked_reasons: Mapping[str, str]
    keys: tuple[str, ...] = ()  # every patch's key: short ids are unique among them


class _Tree:
    """The dry run: patches applied to a tree in a temporary index. Nothing stops here: a
    conflict is what the real run will stop at, a decision that does not fit is left to
    `_validate`, which names it."""

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
        flags = ", ".join(f"{c.flag} {short_id(step.key, ctx.keys)}" for c in step.options)
        note = (
            "the rebase will stop here for a hand resolution in .rebase/worktree"
            f" (or decide now: {flags})"
        )
        return _conflict(step, notes=(note,))

    def port(self, step: Step, raw: bytes) -> Step:
        note = "the rebase will stop here for the port by hand in .rebase/worktree"
        return _conflict(step, notes=(note,))


class _Worktree:
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
        return True  # `_decided` refuses a decision that no longer fits

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


_Applier = _Tree | _Worktree
# The files of a patch, old and new: its `diff --git a/OLD b/NEW` lines.
_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def _placed(patch: Patch, verdict: Verdict) -> bytes:
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


def _taken(applier: _Applier, step: Step, raw: bytes, action: Action) -> Step:
    """`step` taken onto the applier's tree as `action`, or a conflict (also where `git am`
    made no commit: its change is there already, a stop for the maintainer)."""
    before = applier.head()
    if not applier.take(raw):
        return _conflict(step)
    if before is not None and applier.head() == before:
        note = "git am -3 made no commit (its change is there already): decide"
        return _conflict(step, notes=(note,))
    return dataclasses.replace(step, action=action, commit=applier.head())


def _step(applier: _Applier, section: Section, patch: Patch, ctx: Context) -> Step:
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
    raw = _placed(patch, verdict)
    decision = ctx.decisions.get(patch.key)
    if decision is not None and applier.decides(step, decision):
        return _decided(applier, step, raw, decision, ctx)
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


def _settled(applier: _Applier, step: Step, raw: bytes, patch: Patch, ctx: Context) -> Step:
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


def _decided(applier: _Applier, step: Step, raw: bytes, decision: Decision, ctx: Context) -> Step:
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


def _ordered(series: Series) -> list[tuple[Section, Patch]]:
    """The archive first (the overlay walk applies older fixes first), the series, then the
    parked patches (classified for the record, never applied)."""
    return [
        *((Section.UPSTREAMED, p) for p in series.upstreamed),
        *((Section.SERIES, p) for p in series.active),
        *((Section.PARKED, p) for p in series.parked),
    ]


def _plan(ctx: Context, repo: Repo, tree: str, series: Series, done: set[str]) -> tuple[Step, ...]:
    """Every patch not `done`, classified and settled on `tree` as a dry run."""
    applier = _Tree(repo, tree)
    return tuple(
        _step(applier, section, patch, ctx)
        for section, patch in _ordered(series)
        if patch.key not in done
    )


# -- naming patches on the command line ----------------------------------------------------------
def resolve_names(
    series: Series, choices: Sequence[tuple[Choice, str]], release: str | None
) -> tuple[Decision, ...]:
    """`--keep 0002`, `--drop upstreamed/0001`, `--resolve-upstream 0001-x.patch`: each
    PATCH is a key (path under patches/), a file name, or a key's number prefix."""
    patches = [p for _, p in _ordered(series)]
    if release is not None:
        release = check_version(release)
        if not any(c == Choice.RESOLVE_UPSTREAM for c, _ in choices):
            raise BadInput("--release goes with --resolve-upstream PATCH")
    decisions: list[Decision] = []
    for choice, name in choices:
        key = _named(patches, choice, name)
        if any(d.patch == key for d in decisions):
            raise BadInput(f"{choice.flag} {name}: {key} has a decision already")
        decisions.append(
            Decision(key, choice, release if choice == Choice.RESOLVE_UPSTREAM else None)
        )
    return tuple(decisions)


def _named(patches: Sequence[Patch], choice: Choice, name: str) -> str:
    """The key of the one patch `name` names (its key, file name, or number prefix)."""
    found = (
        [p for p in patches if p.key == name]
        or [p for p in patches if p.name == name]
        or [p for p in patches if p.key.startswith(name + "-")]
    )
    if not found:
        raise BadInput(f"{choice.flag} {name}: no such patch in patches/")
    if len(found) > 1:
        keys = ", ".join(p.key for p in found)
        raise BadInput(f"{choice.flag} {name}: ambiguous ({keys}); name the file")
    return found[0].key


def _validate(steps: Sequence[Step], decisions: Sequence[Decision], onto: Upstream) -> None:
    by_key = {s.key: s for s in steps}
    for decision in decisions:
        step = by_key.get(decision.patch)
        if step is None:
            raise BadInput(f"{decision.choice.flag} {decision.patch}: it is settled already")
        where = f"{step.verdict.words} on {onto.label}"
        if not step.options:
            raise BadInput(
                f"{decision.choice.flag} {decision.patch}: it needs no decision ({where})"
            )
        if decision.choice not in step.options:
            allowed = ", ".join(c.flag for c in step.options)
            raise BadInput(
                f"{decision.choice.flag} {decision.patch}: not an option for a patch {where}"
                f" (its options: {allowed})"
            )
        _check_release(decision, onto)


def _check_release(decision: Decision, onto: Upstream) -> None:
    """A `--resolve-upstream` names a release that has the fix: not newer than the base, and
    one there is (the base's own, or `--release`)."""
    newer = (
        decision.release is not None
        and onto.version is not None
        and versions.older(onto.version, decision.release)
    )
    if newer:
        raise BadInput(
            f"--resolve-upstream {decision.patch}: --release {decision.release} is newer"
            f" than {onto.label}, which has the fix"
        )
    if decision.choice == Choice.RESOLVE_UPSTREAM and not (decision.release or onto.version):
        raise BadInput(
            f"--resolve-upstream {decision.patch}: {onto.label} has no release version;"
            " say which release has the fix with --release VERSION"
        )


# -- paths ---------------------------------------------------------------------------------------
def _require_clean(project: Project, head: str | None = None) -> None:
    """No tracked change anywhere, no untracked file where the rebase writes."""
    repo = Repo(project.root)
    ours = set(repo.changed_paths(*rewritten_paths(project)[:-1]))
    changed = [line for line in repo.changed_paths() if not line.startswith("??") or line in ours]
    if changed:
        raise BadInput(
            f"the checkout {project.root} has uncommitted changes ({changed[0].strip()}):"
            " commit or stash them before a rebase"
        )
    if head is not None and repo.head() != head:
        raise BadInput(
            f"{project.root} moved to another commit since the rebase started:"
            " `rebase --abort`, then start again"
        )


def _context(project: Project, mirror: Mirror, state: RebaseState) -> Context:
    return Context(
        mirror=mirror,
        onto=state.onto,
        old_pin=state.old_pin,
        applied_before=frozenset(state.applied_before),
        renames=dict(state.renames),
        decisions={d.patch: d for d in state.decisions},
        parked_reasons=dict(read_series_entries(project.parked_file)),
        keys=tuple(p.key for _, p in _ordered(project_series(project))),
    )


def _renames(mirror: Mirror, old: Upstream, onto: Upstream, series: Series) -> dict[str, str]:
    """git's renames between the two bases, for the files the patches touch that are gone."""
    paths = {path for _, p in _ordered(series) for path in p.paths}
    gone = {path for path in paths if mirror.repo.read_blob(onto.commit, path) is None}
    if not gone:
        return {}
    renamed = mirror.repo.renamed_paths(old.commit, onto.commit)
    return {a: b for a, b in renamed.items() if a in gone}


# -- start / continue / abort --------------------------------------------------------------------
def start(
    project: Project,
    *,
    version: str | None,
    git: str | None,
    ref: str | None,
    choices: Sequence[tuple[Choice, str]] = (),
    release: str | None = None,
    allow_downgrade: bool = False,
) -> Outcome:
    """Classify the whole series on the new base as a plan; stop before anything is written
    when it needs decisions, else write the journal and take the patches."""
    _may_start(project)
    series = project_series(project)  # well-formed before anything
    decisions = resolve_names(series, choices, release)
    mirror = mirror_for(project)
    old = pin_base(project, mirror)
    onto = _onto(project, mirror, old, version=version, git=git, ref=ref, allow=allow_downgrade)
    state = RebaseState(
        phase=Phase.RUNNING,
        old_pin=project.pin,
        onto=onto,
        git=git,
        ref=ref,
        project_head=Repo(project.root).head(),
        decisions=decisions,
        applied_before=tuple(p.key for p in walk(mirror, old, series.all).applied),
        renames=tuple(sorted(_renames(mirror, old, onto, series).items())),
    )
    ctx = _context(project, mirror, state)
    plan = _plan(ctx, mirror.repo, mirror.repo.tree_of(onto.commit), series, set())
    _validate(plan, decisions, onto)
    stop = next((s for s in plan if stops(s, planned=True)), None)
    if stop is not None:
        args = f"--onto {onto.version}" if not git else f"--onto-git {git} --ref {ref}"
        given = " ".join(f"{d.choice.flag} {d.patch}" for d in decisions)
        lines = (
            f"rerun: vllm-patchset rebase {args} {given + ' ' if given else ''}<an option per"
            " patch above>",
            "No rebase is in progress: nothing was written.",
        )
        stopped = _stopped(state, plan, stop, None)
        worktree = rebase_dir(project) / "worktree"
        return Outcome(stopped, Phase.STOPPED, worktree, lines, started=False)
    _begin(project, state)
    mirror.repo.clone_shared(rebase_dir(project) / "worktree", onto.commit, sparse=True)
    return _take(project, mirror, state, series)


def _may_start(project: Project) -> None:
    """No rebase in progress, a clean checkout, and the three series under one patches/."""
    if state_path(project).exists():
        raise BadInput(
            f"a rebase is in progress ({state_path(project)}): `rebase --continue` or"
            " `rebase --abort`"
        )
    _require_clean(project)
    for extra in (project.upstreamed_file, project.parked_file):
        if extra.parent.parent != project.patches_dir:
            raise BadInput("rebase needs the series, the archive and parked/ under one patches/")


def _onto(
    project: Project,
    mirror: Mirror,
    old: Upstream,
    *,
    version: str | None,
    git: str | None,
    ref: str | None,
    allow: bool,
) -> Upstream:
    """The new base: another tree than the pin's, and no older release unless `allow`."""
    onto = mirror.git_ref(git, ref) if git and ref else mirror.release(check_version(version or ""))
    if onto.commit == old.commit:
        raise BadInput(f"the pin {project.pin} is {onto.label} already: nothing to rebase")
    if onto.version and versions.older(onto.version, project.pin) and not allow:
        raise BadInput(
            f"{onto.label} is older than the pin {project.pin}: a downgrade (say so with"
            " --allow-downgrade)"
        )
    return onto


def _begin(project: Project, state: RebaseState) -> None:
    """`.rebase/` with the journal: from here on a rebase is in progress."""
    folder = rebase_dir(project)
    if has_backup(folder):  # files of the checkout are there: only --abort may touch them
        raise BadInput(
            f"{folder / 'backup'} holds files of an interrupted rebase: `rebase --abort`"
        )
    _cleanup(project)  # what a kill at the very end of a cleanup may have left
    fsio.make_dir(folder)
    fsio.write_file(folder / ".gitignore", "*\n")
    # Written whole, then linked in: never a half-written state.
    draft = folder / f"state.{os.getpid()}.json"
    fsio.write_file(draft, state.to_json())
    try:
        fsio.link(draft, state_path(project))
    except FileExistsError:
        raise BadInput(f"another rebase started in {project.root} meanwhile") from None
    finally:
        fsio.remove_file(draft)


def resume(
    project: Project, *, choices: Sequence[tuple[Choice, str]] = (), release: str | None = None
) -> Outcome:
    """`--continue`: finish a swap, or settle the stop (the conflict resolved by hand, or the
    decisions given now), plan the rest again and take it."""
    state = load(project)
    mirror = mirror_for(project)
    if state.phase in (Phase.SWAP, Phase.DONE):
        if choices:
            raise BadInput("the rebase is being finished: no decisions now (`rebase --continue`)")
        return _finish(project, mirror, state)
    if state.phase != Phase.STOPPED:
        raise BadInput(
            "the rebase was interrupted before it finished: `rebase --abort`, then start again"
        )
    _require_clean(project, state.project_head)
    series = project_series(project)
    new = resolve_names(series, choices, release)
    worktree = Repo(rebase_dir(project) / "worktree")
    _not_settled(state, new)
    state = dataclasses.replace(state, decisions=state.decisions + new)
    ctx = _context(project, mirror, state)
    settled, later = state.steps[:-1], list(new)
    if state.stop == Action.CONFLICT:
        last, later = _after_conflict(worktree, state, series, ctx, later)
        settled = (*settled, last)
    done = {s.key for s in settled}
    plan = _plan(ctx, worktree, worktree.tree_of("HEAD"), series, done)
    _validate(plan, later, state.onto)
    stop = next((s for s in plan if stops(s, planned=True)), None)
    if stop is not None:  # reported, not saved: the journal keeps its stop
        stopped = _stopped(state, (*settled, *plan), stop, state.stopped_head)
        lines = ("rerun: vllm-patchset rebase --continue <an option per patch above>",)
        return Outcome(stopped, Phase.STOPPED, worktree.path, lines)
    state = dataclasses.replace(
        state, phase=Phase.RUNNING, steps=settled, stop=None, stopped_head=None
    )
    save(project, state)
    return _take(project, mirror, state, series)


def _not_settled(state: RebaseState, new: Sequence[Decision]) -> None:
    """Decisions given to `--continue` name patches not settled yet in this rebase."""
    taken = {s.key for s in state.steps[:-1]}
    for decision in new:
        if decision.patch in taken or state.decision(decision.patch):
            raise BadInput(
                f"{decision.choice.flag} {decision.patch}: settled already in this rebase"
                " (`rebase --abort` to start again)"
            )


def _after_conflict(
    worktree: Repo, state: RebaseState, series: Series, ctx: Context, later: list[Decision]
) -> tuple[Step, list[Decision]]:
    """The patch the rebase stopped at for a conflict, settled; the decisions left for the
    rest of the series."""
    last = state.steps[-1]
    decided = ctx.decisions.get(last.key)
    if decided is not None and (last.decision == decided.choice or decided.choice == Choice.PORT):
        # (`--port` given at a hand-resolution stop: that stop is the port.)
        # `--keep` of an archived patch whose bug is back, taken with a conflict: the
        # decision is made, the conflict is resolved by hand.
        later = [d for d in later if d != decided]
        decided = None
    elif decided is not None:
        _validate([last], [decided], state.onto)
        later.remove(decided)
    patch = next(p for _, p in _ordered(series) if p.key == last.key)
    return _settle_conflict(worktree, state, last, patch, decided, ctx), later


def _settle_conflict(
    worktree: Repo,
    state: RebaseState,
    last: Step,
    patch: Patch,
    decided: Decision | None,
    ctx: Context,
) -> Step:
    """The conflicted patch after the maintainer's work: resolved (one commit), or decided."""
    flags = ", ".join(f"{c.flag} {short_id(last.key, ctx.keys)}" for c in last.options)
    if worktree.am_in_progress():
        if decided is not None:
            worktree.am_abort()
        elif (
            worktree.unmerged_paths()
            or worktree.is_dirty()
            or worktree.head() == state.stopped_head
        ):
            raise Finding(
                f"{last.name} is not resolved yet in {worktree.path}: fix the conflicts,"
                " `git add` the files, `git am --continue`; then `rebase --continue`"
                f" (or decide: `rebase --continue` with {flags})"
            )
        else:
            worktree.am_quit()  # resolved and committed with `git commit`
    if worktree.is_dirty():
        raise Finding(f"{worktree.path} has uncommitted changes: commit them first")
    assert state.stopped_head is not None
    commits = worktree.count(state.stopped_head)
    if decided is not None:
        if commits:
            raise BadInput(
                f"{decided.choice.flag} {last.key}: it is resolved in {worktree.path} (a"
                " commit): leave out the decision, or `git reset --hard` there first"
            )
        return _decided(_Worktree(worktree), last, _placed(patch, last.verdict), decided, ctx)
    if commits == 0:
        raise Finding(
            f"{last.name} was skipped in {worktree.path} (`git am --skip`) with no decision:"
            f" `rebase --continue` with one of {flags}"
        )
    if commits > 1:
        raise Finding(f"{worktree.path}: {commits} commits for {last.name}; squash them into one")
    return dataclasses.replace(last, action=Action.RESOLVED, commit=worktree.head())


def abort(project: Project) -> str | None:
    """Everything back as it was before the rebase, byte for byte, whatever phase it reached
    (and even when its state file is damaged: the swap's backup dir is its own journal).
    Returns the new base's label, when the state says it."""
    folder = rebase_dir(project)
    if not folder.is_dir():
        raise BadInput("no rebase in progress (start one with `rebase --onto VERSION`)")
    try:
        label: str | None = load(project).onto.label
    except DamagedState:
        label = None
    except BadInput:
        label = None  # no state file: killed before it was written, or at the end
    with fsio.deferred_signals():
        roll_back(folder, project.root, rewritten_paths(project))
    _cleanup(project)
    return label


def _take(project: Project, mirror: Mirror, state: RebaseState, series: Series) -> Outcome:
    worktree = Repo(rebase_dir(project) / "worktree")
    ctx = _context(project, mirror, state)
    applier = _Worktree(worktree)
    done = {s.key for s in state.steps}
    for section, patch in _ordered(series):
        if patch.key in done:
            continue
        before = worktree.head()
        step = _step(applier, section, patch, ctx)
        steps = (*state.steps, step)
        if stops(step, planned=False):
            head = before if step.decision is not None else worktree.head()
            state = _stopped(state, steps, step, head)
            save(project, state)
            lines = (
                _next_steps(project, worktree, step, ctx.keys)
                if step.action == Action.CONFLICT
                else ("rerun: vllm-patchset rebase --continue <an option above>",)
            )
            return Outcome(state, Phase.STOPPED, worktree.path, lines)
        state = dataclasses.replace(state, steps=steps)
        save(project, state)
    return _finish(project, mirror, state)


def _next_steps(
    project: Project, worktree: Repo, step: Step, keys: tuple[str, ...]
) -> tuple[str, ...]:
    files = " ".join(worktree.unmerged_paths()) or "(the files of the hunks above)"
    name = short_id(step.key, keys)
    return (
        f"1. cd {worktree.path}",
        f"2. resolve the conflict in: {files}",
        "3. git add <the files> && git am --continue (keeps the patch's message, author and date)",
        f"4. cd {project.root} && vllm-patchset rebase --continue",
        "Or decide instead: vllm-patchset rebase --continue "
        + " | ".join(f"{c.flag} {name}" for c in step.options),
        "To give up: vllm-patchset rebase --abort (everything is restored as it was).",
        "Nothing in patches/, pyproject.toml, the lock or CHANGELOG.md has changed yet.",
    )


# -- finishing: stage, check, swap ---------------------------------------------------------------
def _finish(project: Project, mirror: Mirror, state: RebaseState) -> Outcome:
    worktree = Repo(rebase_dir(project) / "worktree")
    folder = rebase_dir(project)
    if state.phase == Phase.RUNNING:
        state = stage_project(project, mirror, worktree, state)
    if state.phase in (Phase.RUNNING, Phase.SWAP):
        with fsio.deferred_signals():  # Ctrl-C and SIGTERM land after the swap, not inside it
            state = dataclasses.replace(state, phase=Phase.SWAP)
            save(project, state)
            swap_in(folder, project.root, state.moves)
            state = dataclasses.replace(state, phase=Phase.DONE)
            save(project, state)
    entry = folder / "entry.md"
    changelog = entry.read_text("utf-8") if entry.is_file() else ""
    try:
        with fsio.deferred_signals():  # the state file goes last: no signal between it and the end
            _cleanup(project)
    except KeyboardInterrupt:
        fsio.interrupt_leaves(
            "the rebase was done: the checkout is rebased and .rebase/ removed; review and"
            " commit it"
        )
        raise
    where = (
        f"pin: {project.package} {state.new_pin} (was {state.old_pin}); patches/, "
        f"{rel(project, project.lock_path)} and {CHANGELOG} rewritten, `check` passes;"
        " review and commit them",
        *(
            (f"changed: {len(state.changed)} file(s)", *(f"  {c}" for c in state.changed))
            if state.changed
            else ()
        ),
        *(
            (
                f"WARNING: the overlay is empty: no patch of the series applies on"
                f" {state.onto.label} (`overlay apply` changes nothing)",
            )
            if not any(s.action.committed for s in state.steps)
            else ()
        ),
    )
    return Outcome(state, Phase.DONE, worktree.path, where, changelog)


def _cleanup(project: Project) -> None:
    """Remove `.rebase/` (the worktree is a clone that only borrows the mirror's objects). The
    backup goes first, in one rename: from then on an `--abort` has nothing to put back, and
    never half of it. The state file goes last."""
    folder = rebase_dir(project)
    if (folder / "backup").exists():
        fsio.move(folder / "backup", folder / "discarded")
    for leftover in ("worktree", STAGE, "discarded"):
        fsio.discard_tree(folder / leftover)
    fsio.remove_file(state_path(project))
    fsio.discard_tree(folder)


# -- interruptions -------------------------------------------------------------------------------
def interrupted_message(project: Project) -> str:
    """What an interrupted rebase left, read from its journal."""
    phase = phase_on_disk(project)
    if phase is None:  # before the journal was written (after it, the end is deferred)
        return "the rebase had written nothing: nothing changed"
    if phase == "damaged":
        return "the rebase's state file is damaged: `rebase --abort` restores the checkout"
    if phase in (Phase.RUNNING, Phase.STOPPED):
        return (
            "the rebase changed nothing in patches/, pyproject.toml, the lock or CHANGELOG.md"
            " yet; `rebase --abort` removes .rebase/"
            + (" (or `rebase --continue`)" if phase == Phase.STOPPED else "")
        )
    if phase == Phase.SWAP:
        return (
            "the rebase was moving its files in: `rebase --continue` finishes it,"
            " `rebase --abort` puts everything back"
        )
    return (
        "the rebase was done: the checkout is rebased; `rebase --continue` removes .rebase/"
        " (`rebase --abort` would put everything back)"
    )


# -- command line --------------------------------------------------------------------------------
def _local_path(source: str) -> bool:
    """`--onto-git` names a local path (not a URL, nor scp's `host:path`)."""
    return "://" not in source and not re.match(r"^[\w.-]+@?[\w.-]*:", source)


def cmd_rebase(args: argparse.Namespace) -> int:
    # The `maintain` extra's modules: cli.main finds them first (registry's `needs`).
    project = Project.load(args.project, args.cache_dir)
    choices = [
        *((Choice.KEEP, name) for name in args.keep),
        *((Choice.DROP, name) for name in args.drop),
        *((Choice.RESOLVE_UPSTREAM, name) for name in args.resolve_upstream),
        *((Choice.PORT, name) for name in args.port),
    ]
    if args.onto_git and _local_path(args.onto_git):
        # A path is the caller's: relative to the directory the command runs in.
        args.onto_git = str(Path(args.onto_git).resolve())
    if bool(args.ref) != bool(args.onto_git):
        raise BadInput(
            "--onto-git needs --ref REF" if args.onto_git else "--ref goes with --onto-git"
        )
    if args.abort and (choices or args.release):
        raise BadInput("--abort takes no decisions (it puts everything back)")
    # cli.main holds the checkout lock and turns SIGTERM into an interrupt, as for Ctrl-C.
    try:
        if args.abort:
            label = abort(project)
            text = (
                f"rebase onto {label or '(unknown: damaged state)'} aborted:"
                " everything is as it was"
            )
            return emit(args, text, {"status": "aborted", "onto": label})
        if args.resume:
            outcome = resume(project, choices=choices, release=args.release)
        else:
            outcome = start(
                project,
                version=args.onto,
                git=args.onto_git,
                ref=args.ref,
                choices=choices,
                release=args.release,
                allow_downgrade=args.allow_downgrade,
            )
    except KeyboardInterrupt:
        fsio.interrupt_leaves(interrupted_message(project))
        raise
    except GitError as exc:
        if phase_on_disk(project) is None:  # refused before anything was written
            raise
        # git failing inside a rebase is what no check foresaw, not bad input.
        raise InternalError(str(exc), interrupted_message(project)) from exc
    except Exception as exc:
        if not isinstance(exc, BadInput | Finding):
            fsio.interrupt_leaves(interrupted_message(project))
        raise
    text = render_text(outcome, verbose=args.verbose)
    return emit(args, text, report_body(outcome), 1 if outcome.status == Phase.STOPPED else 0)


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "rebase",
        cmd_rebase,
        help="take the series onto a new vLLM release or git ref",
        writes_checkout=True,
        needs=REBASE,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--onto", metavar="VERSION", help="a vLLM release from the package index")
    what.add_argument("--onto-git", metavar="URL|PATH", help="a git repository holding vllm/")
    what.add_argument(
        "--continue", dest="resume", action="store_true", help="after a conflict or a decision"
    )
    what.add_argument("--abort", action="store_true", help="restore everything as it was")
    p.add_argument("--ref", metavar="REF", help="the ref of --onto-git")
    p.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="PATCH",
        help="park a patch that no longer applies in patches/parked/ (or carry an archived"
        " one that applies again); PATCH: file name or number (0002)",
    )
    p.add_argument("--drop", action="append", default=[], metavar="PATCH", help="remove a patch")
    p.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="PATCH",
        help="take a patch whose bug is live but which no longer applies with `git am -3` in"
        " .rebase/worktree and stop there to port it by hand (`--continue` carries it)",
    )
    p.add_argument(
        "--resolve-upstream",
        action="append",
        default=[],
        metavar="PATCH",
        help="archive a conflicting or rewritten patch as fixed upstream",
    )
    p.add_argument(
        "--release", metavar="VERSION", help="for --resolve-upstream: the release with the fix"
    )
    p.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="rebase onto a release older than the pin (refused without it)",
    )
