"""The rebase's state machine: take the patch set from the pin onto a new vLLM release or git
ref (`start`), and on after a stop (`resume`, `--continue`). Its command line is
commands/rebase.py; how a rebase ends (finished, aborted) is rebase_end.py.

First the whole set is classified on the new base (series.classify, with whether each patch
applied on the old pin, git's renames between the two, a 3-way merge), as a dry run in a
temporary index (rebase_plan.py): every decision a maintainer must make is reported
together, before anything is written (rebase_decisions.py checks those named on the line).
A patch that applied on the old pin ends the rebase in one of three ways only: still applied
(refreshed), archived as upstream, or settled by a decision named on the command line
(`--keep`: parked, `--drop`, `--resolve-upstream`, `--port`: taken with `git am -3` and
ported by hand, for a patch whose bug is live where it no longer applies).

Then the series is taken, patch by patch, as commits in `.rebase/worktree` (a clone that
borrows the mirror's objects; classification there goes through the clone, which sees both
its own objects and the mirror's). A conflict whose hunks are there stops for a hand
resolution (`--continue` after it). At the end the new `patches/`, `pyproject.toml`, lock,
CHANGELOG.md and CI files are staged, the staged project must pass `check`, and only then is
it swapped in (rebase_end.py, swap.py). `.rebase/state.json` (rebase_state.py) is the
journal.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from vllm_patchset import versions
from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.build import walk
from vllm_patchset.overlay.upstream import Mirror, Upstream, check_version, mirror_for, pin_base
from vllm_patchset.series.patches import Patch, Series
from vllm_patchset.sync.checks import project_series
from vllm_patchset.sync.rebase_decisions import not_settled, resolve_names, validate
from vllm_patchset.sync.rebase_end import cleanup, finish
from vllm_patchset.sync.rebase_plan import (
    Context,
    WorktreeApplier,
    context,
    ordered,
    placed,
    plan_steps,
    settle,
    settle_decided,
)
from vllm_patchset.sync.rebase_report import Outcome, option_name
from vllm_patchset.sync.rebase_rules import stops
from vllm_patchset.sync.rebase_state import (
    Action,
    Choice,
    Decision,
    Phase,
    RebaseState,
    Step,
    load,
    rebase_dir,
    save,
    state_path,
)
from vllm_patchset.sync.swap import has_backup, rewritten_paths


def _stopped(
    state: RebaseState, steps: tuple[Step, ...], at: Step, head: str | None
) -> RebaseState:
    """`state` stopped at the step `at` (the last of `steps` in a real run)."""
    return dataclasses.replace(
        state, phase=Phase.STOPPED, steps=steps, stop=at.action, stopped_head=head
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


def _renames(mirror: Mirror, old: Upstream, onto: Upstream, series: Series) -> dict[str, str]:
    """git's renames between the two bases, for the files the patches touch that are gone."""
    paths = {path for _, p in ordered(series) for path in p.paths}
    gone = {path for path in paths if mirror.repo.read_blob(onto.commit, path) is None}
    if not gone:
        return {}
    renamed = mirror.repo.renamed_paths(old.commit, onto.commit)
    return {a: b for a, b in renamed.items() if a in gone}


# -- start / continue ----------------------------------------------------------------------------
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
    ctx = context(project, mirror, state)
    plan = plan_steps(ctx, mirror.repo, mirror.repo.tree_of(onto.commit), series, set())
    validate(plan, decisions, onto)
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
    cleanup(project)  # what a kill at the very end of a cleanup may have left
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
        return finish(project, mirror, state)
    if state.phase != Phase.STOPPED:
        raise BadInput(
            "the rebase was interrupted before it finished: `rebase --abort`, then start again"
        )
    _require_clean(project, state.project_head)
    series = project_series(project)
    new = resolve_names(series, choices, release)
    worktree = Repo(rebase_dir(project) / "worktree")
    not_settled(state, new)
    state = dataclasses.replace(state, decisions=state.decisions + new)
    ctx = context(project, mirror, state)
    settled, later = state.steps[:-1], list(new)
    if state.stop == Action.CONFLICT:
        last, later = _after_conflict(worktree, state, series, ctx, later)
        settled = (*settled, last)
    done = {s.key for s in settled}
    plan = plan_steps(ctx, worktree, worktree.tree_of("HEAD"), series, done)
    validate(plan, later, state.onto)
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
        validate([last], [decided], state.onto)
        later.remove(decided)
    patch = next(p for _, p in ordered(series) if p.key == last.key)
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
    flags = ", ".join(f"{c.flag} {option_name(last.key, ctx.keys)}" for c in last.options)
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
        return settle_decided(
            WorktreeApplier(worktree), last, placed(patch, last.verdict), decided, ctx
        )
    if commits == 0:
        raise Finding(
            f"{last.name} was skipped in {worktree.path} (`git am --skip`) with no decision:"
            f" `rebase --continue` with one of {flags}"
        )
    if commits > 1:
        raise Finding(f"{worktree.path}: {commits} commits for {last.name}; squash them into one")
    return dataclasses.replace(last, action=Action.RESOLVED, commit=worktree.head())


def _take(project: Project, mirror: Mirror, state: RebaseState, series: Series) -> Outcome:
    worktree = Repo(rebase_dir(project) / "worktree")
    ctx = context(project, mirror, state)
    applier = WorktreeApplier(worktree)
    done = {s.key for s in state.steps}
    for section, patch in ordered(series):
        if patch.key in done:
            continue
        before = worktree.head()
        step = settle(applier, section, patch, ctx)
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
    return finish(project, mirror, state)


def _next_steps(
    project: Project, worktree: Repo, step: Step, keys: tuple[str, ...]
) -> tuple[str, ...]:
    files = " ".join(worktree.unmerged_paths()) or "(the files of the hunks above)"
    name = option_name(step.key, keys)
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
