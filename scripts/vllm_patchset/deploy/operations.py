"""`overlay apply | verify | revert | status | diff` on a `Target`: each plans once (under the
target's lock where it writes), then carries the plan out in a `Transaction`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path

from vllm_patchset.deploy.bytecode import (
    check_bytecode_removable,
    left_bytecode,
    remove_bytecode,
    stale_notes,
)
from vllm_patchset.deploy.guard import stale_bytecode
from vllm_patchset.deploy.plan import (
    Plan,
    current,
    gone_note,
    overlay_gone,
    plan_apply,
    plan_revert,
)
from vllm_patchset.deploy.record import ABSENT, Record, Step, read_record, write_record
from vllm_patchset.deploy.report import (
    FileState,
    Report,
    files_after,
    make_report,
    patch_states,
    state_of,
    unified_diff,
)
from vllm_patchset.deploy.source import no_overlay, overlay_files
from vllm_patchset.deploy.target import UNDO, ReadOnlyTarget, Target, check_writable
from vllm_patchset.deploy.transaction import Transaction
from vllm_patchset.errors import Finding
from vllm_patchset.infra import fsio
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.infra.installed import JOURNAL, ORIGINALS, STATE_DIR
from vllm_patchset.overlay.lock import Lock, LockEntry


# -- apply -------------------------------------------------------------------------------------
def apply(
    target: Target, lock: Lock, overlay_dir: Path, *, dry_run: bool = False, force: bool = False
) -> Report:
    """Install the overlay of `lock` (files from `overlay_dir`): every file or none."""
    target.refuse_symlinked_state()
    target.check_version(lock)
    target.refuse_linked(lock)
    paths = {e.path: target.path(e.path) for e in lock.entries}
    overlay = overlay_files(lock, overlay_dir)
    pending = target.pending()
    if dry_run and pending:
        return _would_repair("apply", target, lock)
    if dry_run:
        plan = plan_apply(target, lock, read_record(target), force=force)
        outcome = "would apply" if plan.steps else "already applied"
        return make_report("apply", outcome, target, lock, plan.files, plan.notes)
    try:
        check_bytecode_removable(paths.values())
        target.check_writable(paths.values())
    except ReadOnlyTarget:
        if not pending:  # a no-op works on a read-only target too, and a refusal comes first
            plan = plan_apply(target, lock, read_record(target), force=force)
            if plan.done:
                return make_report("apply", "already applied", target, lock, plan.files, plan.notes)
        raise
    with target.locked():
        repaired = Transaction.recover(target)
        plan = plan_apply(target, lock, read_record(target), force=force)
        if plan.done:  # the stale bytecode of the files in place goes all the same
            notes = [repaired, *plan.notes, *_remove_stale(target, lock)]
            return make_report("apply", "already applied", target, lock, plan.files, notes)
        notes = [repaired, *_apply_plan(target, plan, paths, overlay)]
    outcome = "applied" if plan.steps or not lock.entries else "already applied"
    files = files_after(plan.files, lock, plan.steps)
    return make_report("apply", outcome, target, lock, files, notes)


def _apply_plan(
    target: Target, plan: Plan, paths: Mapping[str, Path], overlay: Mapping[str, bytes]
) -> list[str]:
    """Carry out `plan` (the lock held): drop a stale record, save the originals, replace the
    files, write the record (the commit point)."""
    notes = list(plan.notes)
    if plan.stale is not None:
        notes.insert(0, f"{gone_note(target, plan.stale)}: removed its stale record")
        notes[1:1] = remove_added(target, plan.stale.lock, keep=plan.lock)
        target.forget()
    if not plan.steps and plan.lock.entries:
        notes.append("recorded the overlay found in place (no originals: revert cannot undo it)")
    current_bytes = {s.path: fsio.read_regular(paths[s.path]) or b"" for s in plan.steps}
    kept = plan.record.originals if plan.record is not None else {}
    with Transaction.run(target, "apply", plan.steps) as transaction:
        originals = {path: sha for path, sha in kept.items() if path in paths}
        originals.update(_save_originals(target, plan.steps, kept, current_bytes))
        for step in plan.steps:
            if step.after_sha256 == ABSENT:  # a file the overlay deletes
                fsio.remove_file(paths[step.path])
            else:
                fsio.atomic_write(paths[step.path], overlay[step.path], like=paths[step.path])
            remove_bytecode(paths[step.path])
            transaction.mark_done(step.path)
        for path in paths.values():  # also pycs left beside files that were patched already
            remove_bytecode(path)
        sizes = {path: len(data) for path, data in overlay.items()}
        write_record(target, plan.lock, originals, transaction.id, sizes)
        fsio.remove_tree(target.state_path(UNDO))
    return notes


def _save_originals(
    target: Target, steps: tuple[Step, ...], kept: Mapping[str, str], data: Mapping[str, bytes]
) -> dict[str, str]:
    """Save the bytes each step replaces: in originals/ for revert, unless an original is kept
    there from the first apply (then in undo/, for a rollback only); the new originals."""
    originals = {}
    for step in steps:
        if step.before_sha256 == ABSENT:  # no file there before: nothing to save
            if kept.get(step.path, ABSENT) == ABSENT:
                originals[step.path] = ABSENT
            continue
        if kept.get(step.path, step.before_sha256) == step.before_sha256:
            where = ORIGINALS  # saved for revert (or there already)
            originals[step.path] = step.before_sha256
        else:
            where = UNDO  # the original saved at the first apply stays for revert
        saved = target.state_path(where, *step.path.split("/"))
        data_saved = fsio.read_regular(saved)
        if data_saved is None or sha256_bytes(data_saved) != step.before_sha256:
            fsio.atomic_write(saved, data[step.path])
    return originals


def remove_added(target: Target, lock: Lock, keep: Lock | None = None) -> list[str]:
    """The files `lock`'s overlay added, where they still hold its bytes, removed with their
    bytecode and the folders that leaves empty (`keep`'s files stay): vLLM reinstalled,
    upgraded or uninstalled under an applied overlay leaves them, pip knows nothing of them.
    Each removal is whole and the record goes after them: a run stopped half-way leaves the
    rest to the next one. The notes: one a file removed."""
    removed = []
    for entry in lock.entries:
        if entry.pristine_sha256 is not None or (keep is not None and keep.entry(entry.path)):
            continue
        if target.file_sha(entry.path) != entry.patched_sha256:
            continue  # not the overlay's bytes: not the tool's to remove
        path = target.path(entry.path)
        fsio.remove_file(path)
        remove_bytecode(path, strict=False)
        _remove_empty_folders(target.root, path.parent)
        removed.append(entry.path)
    # One note a file: patches may add many (patch 0002 adds 21), each path on its own line.
    return [f"removed what the overlay had added: {path}" for path in removed]


def _remove_empty_folders(root: Path, folder: Path) -> None:
    """`folder` and those above it, up to `root`, while nothing is left in them (an empty
    `__pycache__` aside)."""
    while folder != root and folder.is_dir() and not folder.is_symlink():
        names = os.listdir(folder)
        cache = folder / "__pycache__"
        if names == ["__pycache__"] and cache.is_dir() and not os.listdir(cache):
            fsio.remove_dir(cache)
            names = []
        if names:
            return
        fsio.remove_dir(folder)
        folder = folder.parent


def _remove_stale(target: Target, lock: Lock) -> list[str]:
    notes = []
    for entry in lock.entries:
        path = target.path(entry.path)
        for pyc in stale_bytecode(path):
            remove_bytecode(path)
            notes.append(f"removed the stale unchecked-hash bytecode {pyc}")
    return notes


def _would_repair(command: str, target: Target, lock: Lock) -> Report:
    outcome = f"would repair an interrupted run, then {command}"
    return make_report(command, outcome, target, lock, current(target, lock))


# -- revert ------------------------------------------------------------------------------------
def revert(target: Target, lock: Lock, *, dry_run: bool = False, force: bool = False) -> Report:
    """Restore the saved originals of what `apply` changed (its record's lock, else `lock`).

    With a record, the version is not checked: each file is restored only when it holds the
    recorded patched bytes (an upgrade of vllm that left the files patched is undone, one that
    replaced them leaves only a stale record to remove). --force needs the recorded version."""
    target.refuse_symlinked_state()
    record = read_record(target)
    applied = record.lock if record else lock
    if record is None or force:
        target.check_version(applied)
    pending = target.pending()
    if dry_run and pending:
        return _would_repair("revert", target, applied)
    if dry_run or not target.state.exists():  # no state: no record, nothing to lock or remove
        return _revert_unlocked(target, lock, record, dry_run=dry_run, force=force)
    paths = [target.path(e.path, linked=True) for e in applied.entries]
    try:
        target.check_writable(paths)
    except ReadOnlyTarget:
        if not pending:  # a refusal comes first
            plan_revert(target, lock, record, force=force)
        raise
    with target.locked():
        repaired = Transaction.recover(target)
        plan = plan_revert(target, lock, read_record(target), force=force)
        outcome, notes = _revert_plan(target, plan)
        notes.append(target.remove_state_dir())
        notes += left_bytecode(paths) if plan.steps else []
    files = files_after(plan.files, plan.lock, plan.steps)
    return make_report("revert", outcome, target, plan.lock, files, [repaired, *notes])


def _revert_unlocked(
    target: Target, lock: Lock, record: Record | None, *, dry_run: bool, force: bool
) -> Report:
    """A dry run, or a target with no state: the plan is the answer."""
    plan = plan_revert(target, lock, record, force=force)
    outcome = "already pristine"
    if dry_run and plan.stale is not None:
        outcome = "would remove a stale record"
    elif dry_run and plan.steps:
        outcome = "would revert"
    return make_report("revert", outcome, target, plan.lock, plan.files, plan.notes)


def _revert_plan(target: Target, plan: Plan) -> tuple[str, list[str | None]]:
    """Carry out `plan` (the lock held): restore the originals, then drop the record (the
    commit point), or drop a stale record."""
    if plan.stale is not None:
        removed = remove_added(target, plan.stale.lock)
        target.forget()
        return "stale record removed", [
            f"{gone_note(target, plan.stale)}: removed its stale record",
            *removed,
        ]
    notes: list[str | None] = list(plan.notes)
    if plan.steps:
        with Transaction.run(target, "revert", plan.steps) as transaction:
            for step in plan.steps:
                transaction.restore(step)
                transaction.mark_done(step.path)
            target.forget()
        return "reverted", notes
    if plan.record is not None:
        target.forget()
        notes.append("the files were pristine already: removed the stale record")
    return "already pristine", notes


# -- verify, status --------------------------------------------------------------------------
def verify(target: Target, lock: Lock) -> Report:
    """ok only when the target holds exactly the overlay of `lock`, recorded by apply."""
    target.refuse_symlinked_state()
    problems: list[str | None] = []
    if target.version != lock.version:
        problems.append(
            f"{target.package} {target.version} is installed, the lock is for {lock.version}"
        )
    with target.locked(shared=True) if target.state.is_dir() else nullcontext():
        if target.state_path(JOURNAL).exists():
            problems.append("an interrupted run is pending (`overlay status` repairs it)")
        problems.append(_record_problem(target, lock, read_record(target)))
        files = []
        for entry in lock.entries:
            path = target.path(entry.path, linked=True)
            data = fsio.read_regular(path, follow=True)
            sha = None if data is None else sha256_bytes(data)
            files.append(FileState(entry.path, state_of(entry, sha), sha))
            if files[-1].state != "patched":
                problems.append(f"{entry.path} is {files[-1].state}")
            elif data is not None:
                problems += stale_notes(path, data)
    ok = not any(problems)
    outcome = "verified" if ok else "NOT verified"
    return make_report("verify", outcome, target, lock, files, problems, ok=ok)


def _record_problem(target: Target, lock: Lock, record: Record | None) -> str | None:
    if record is None:
        return (
            f"no record of an apply in {target.state}: the start-up guard cannot confirm"
            " the overlay (`vllm-patchset overlay apply` records it)"
        )
    if record.lock != lock:
        return (
            f"the overlay recorded there is another one"
            f" ({', '.join(record.lock.patches) or 'no patches'} on {record.lock.version})"
        )
    return None


def status(target: Target, lock: Lock) -> Report:
    """What the target holds, after repairing an interrupted run (when it can write)."""
    target.refuse_symlinked_state()
    notes: list[str | None] = []
    ok = True
    if target.pending():
        note, ok = _repair(target, lock)
        notes.append(note)
    record = read_record(target)
    files = current(target, lock)
    outcome, fine = _status_outcome(target, lock, record, {f.state for f in files})
    stale = [n for e in lock.entries for n in stale_notes(target.path(e.path, linked=True))]
    if outcome == "applied" and stale:
        outcome, fine = "stale bytecode", False
        notes += stale
    ok = ok and fine
    if outcome == "gone":
        assert record is not None
        notes.append(
            f"{gone_note(target, record)}: `vllm-patchset overlay apply` applies this lock's"
            " overlay again, `vllm-patchset overlay revert` removes the stale record"
        )
    elif record is not None and record.lock != lock:
        applied = ", ".join(record.lock.patches) or "no patches"
        notes.append(
            f"the overlay applied there ({applied} on {record.lock.version}) is not this one:"
            " `vllm-patchset overlay revert` removes it, then `overlay apply` applies this one"
        )
    elif record is None and outcome == "applied":
        notes.append("no record of this apply: `overlay revert` cannot restore the originals")
    report = make_report("status", outcome, target, lock, files, notes, ok=ok)
    return dataclasses.replace(report, by_patch=patch_states(lock, files))


def _repair(target: Target, lock: Lock) -> tuple[str | None, bool]:
    """Recover an interrupted run, where the target can be written: (the note, ok)."""
    try:
        target.check_writable([target.path(e.path, linked=True) for e in lock.entries])
        with target.locked():
            note = Transaction.recover(target)
        fsio.interrupt_leaves(f"{note}; nothing else was changed")
    except ReadOnlyTarget as exc:
        return f"an interrupted run is pending and cannot be repaired: {exc}", False
    return note, True


def _status_outcome(
    target: Target, lock: Lock, record: Record | None, states: set[str]
) -> tuple[str, bool]:
    if record is not None and overlay_gone(target, record):
        return "gone", False
    if target.version != lock.version:
        return f"other version (the lock is for {lock.version})", False
    if states <= {"patched"} and (lock.entries or record is not None):
        return "applied", True
    if states <= {"pristine"}:
        return "not applied", True
    return ("partial" if states <= {"pristine", "patched"} else "modified"), False


# -- diff, orphaned state --------------------------------------------------------------------
DIFF_SHOWS = {  # which diff `overlay diff` shows (`--pristine`: True), and what it means
    False: ("installed -> overlay", "what `overlay apply` would change"),
    True: ("pristine -> overlay", "what the overlay changes in {package} {version}"),
}


def diff(
    target: Target, lock: Lock, overlay_dir: Path, *, pristine: bool = False
) -> tuple[Report, dict[str, str]]:
    """What apply would change: each overlaid file as installed against the overlay's; with
    `pristine`, the pristine file (installed, else the original saved by apply) against it."""
    target.refuse_symlinked_state()
    target.check_version(lock)
    overlay = overlay_files(lock, overlay_dir)
    files, diffs = [], {}
    for entry in lock.entries:
        data = target.read(entry.path)
        sha = None if data is None else sha256_bytes(data)
        state = state_of(entry, sha)
        files.append(FileState(entry.path, state, sha, None if state == "patched" else "patch"))
        if pristine:
            data = data if state == "pristine" else _saved_pristine(target, entry, state)
        same = (None if data is None else sha256_bytes(data)) == entry.patched_sha256
        after = overlay.get(entry.path)  # None: a file the overlay deletes
        diffs[entry.path] = "" if same else unified_diff(entry.path, data, after)
    outcome = "differs" if any(diffs.values()) else "no difference"
    notes = []
    if not pristine and outcome == "no difference" and lock.entries:
        notes.append(
            "the overlay is applied: `vllm-patchset overlay diff --pristine` shows what it"
            f" changes in {target.package} {target.version}"
        )
    return make_report("diff", outcome, target, lock, files, notes), diffs


def _saved_pristine(target: Target, entry: LockEntry, state: str) -> bytes | None:
    """The pristine bytes of a file that is not pristine, as apply saved them (None: no file,
    one the overlay adds)."""
    if entry.pristine_sha256 is None:
        return None
    record = read_record(target)
    if record is not None and record.originals.get(entry.path) == entry.pristine_sha256:
        return target.saved_original(entry.path, entry.pristine_sha256)
    raise Finding(
        f"no pristine {entry.path} at {target.root}: the installed file is {state} and no"
        f" original of the pristine one is saved there; reinstall"
        f" {target.package}=={target.version} to see the overlay's changes"
    )


def orphaned(root: Path, package: str, lock: Lock | None, command: str, why: str) -> Report:
    """status or revert where the package is gone but the state of an overlay is left
    (`pip uninstall vllm` removes the package's files, not `.vllm-patchset/`). `lock`: the
    overlay given (None: the one recorded there)."""
    state = root / STATE_DIR
    target = Target(root, package, "")
    target.refuse_symlinked_state()
    record = read_record(target)
    lock = lock or (record.lock if record is not None else no_overlay(package, ""))
    what = (
        f"an overlay applied to {package} {record.lock.version}"
        if record is not None
        else "an overlay"
    )
    found = f"{why}, but {state} is left from {what} ({package} uninstalled?)"
    notes: list[str | None] = []
    if command == "status":
        outcome, ok = "orphaned state", False
        notes.append(f"{found}: `vllm-patchset overlay revert --target {root}` removes it")
    else:
        check_writable([state, root])
        with target.locked():
            fsio.sweep_temp([state])
            fsio.remove_file(target.state_path(JOURNAL))
            removed = remove_added(target, record.lock) if record is not None else []
            target.forget()
            notes += [f"{found}: removed it", *removed, target.remove_state_dir()]
        outcome, ok = "orphaned state removed", True
    kept = tuple(n for n in notes if n)
    return Report(
        command, outcome, ok, str(root / package), None, lock.version, lock.patches, (), kept
    )
