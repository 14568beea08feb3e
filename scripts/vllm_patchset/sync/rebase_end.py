"""How a rebase ends: finished (the rebased project staged and checked, swapped in, `.rebase/`
removed) or aborted (everything put back byte for byte, whatever phase it reached), and what
an interrupted rebase left, read from its journal."""

from __future__ import annotations

import dataclasses

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.upstream import Mirror
from vllm_patchset.sync.rebase_report import Outcome
from vllm_patchset.sync.rebase_state import (
    DamagedState,
    Phase,
    RebaseState,
    load,
    phase_on_disk,
    rebase_dir,
    save,
    state_path,
)
from vllm_patchset.sync.swap import (
    CHANGELOG,
    STAGE,
    rel,
    rewritten_paths,
    roll_back,
    stage_project,
    swap_in,
)


def finish(project: Project, mirror: Mirror, state: RebaseState) -> Outcome:
    """The rebased project staged and checked (once), swapped in, `.rebase/` removed."""
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
            cleanup(project)
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


def cleanup(project: Project) -> None:
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
    cleanup(project)
    return label


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
