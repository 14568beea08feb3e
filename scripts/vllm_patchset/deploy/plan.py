"""The planner of apply and revert: the installed files' hashes, the lock and the record in, a
`Plan` out (the steps, the files' states, the notes, a stale record to drop), or the refusal.
It reads nothing itself: the hashes and the saved originals come through `Installed` (a
`Target`, or a table in the tests), so the commands plan once, under the lock."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from vllm_patchset.deploy.record import ABSENT, Record, Step, step_sha
from vllm_patchset.deploy.report import FileState, state_of
from vllm_patchset.deploy.target import HashMismatch
from vllm_patchset.errors import Finding
from vllm_patchset.overlay.lock import Lock, LockEntry


class Installed(Protocol):
    """What the planner reads of the target."""

    @property
    def root(self) -> Path: ...
    @property
    def package(self) -> str: ...
    @property
    def version(self) -> str: ...
    def path(self, rel: str) -> Path: ...
    def file_sha(self, rel: str) -> str | None: ...
    def check_original(self, rel: str, sha: str) -> None:
        """Raise Finding unless the original of `rel` with this sha256 is saved."""


@dataclass(frozen=True)
class Plan:
    lock: Lock  # the overlay planned for (a revert: the recorded one, else the one given)
    steps: tuple[Step, ...]  # each file to change, before and after
    files: tuple[FileState, ...]  # each file of `lock` (with the action planned for it)
    notes: tuple[str, ...]
    record: Record | None  # the record kept (None: none, or a stale one to drop)
    stale: Record | None = None  # a record whose overlay is gone from the files: dropped first

    @property
    def done(self) -> bool:
        """An apply with nothing to do: the overlay is in place and recorded."""
        return not self.steps and self.record is not None and self.record.lock == self.lock


@dataclass
class _Draft:
    steps: list[Step] = field(default_factory=list)
    files: list[FileState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def plan(self, lock: Lock, record: Record | None, stale: Record | None = None) -> Plan:
        steps, files, notes = tuple(self.steps), tuple(self.files), tuple(self.notes)
        return Plan(lock, steps, files, notes, record, stale)


def overlay_gone(installed: Installed, record: Record | None) -> bool:
    """Is nothing of the recorded overlay left in the files vLLM ships? (vllm reinstalled or
    upgraded over it: `pip install --force-reinstall` or `-U` replaces its files, not the record,
    and leaves a file the overlay added)"""
    if record is None:
        return False
    if not record.lock.entries:
        return record.lock.version != installed.version
    shipped = [e for e in record.lock.entries if e.pristine_sha256 is not None]
    return all(
        installed.file_sha(e.path) != e.patched_sha256 for e in shipped or record.lock.entries
    )


def gone_note(installed: Installed, record: Record) -> str:
    package, version = installed.package, installed.version
    how = (
        f"{package} {version} was installed over it"
        if record.lock.version != version
        else f"{package} was reinstalled over it"
    )
    return (
        f"the overlay applied to {package} {record.lock.version}"
        f" ({', '.join(record.lock.patches) or 'no patches'}) is gone from the files ({how})"
    )


def current(installed: Installed, lock: Lock) -> tuple[FileState, ...]:
    return tuple(
        FileState(e.path, state_of(e, sha), sha)
        for e in lock.entries
        for sha in [installed.file_sha(e.path)]
    )


# -- apply -------------------------------------------------------------------------------------
def plan_apply(installed: Installed, lock: Lock, record: Record | None, *, force: bool) -> Plan:
    """Patch every file that is pristine (or, with `force`, modified); refuse a missing file,
    a modified one without `force`, and another overlay's files that are not reverted."""
    stale = record if overlay_gone(installed, record) else None
    kept = None if stale else record
    draft = _Draft()
    others = _other_overlay_reverted(installed, lock, kept)
    for entry in lock.entries:
        _plan_patch(draft, installed, lock, entry, others, force=force)
    if draft.refused:
        raise HashMismatch(
            f"refusing to apply, nothing changed: {'; '.join(draft.refused)}."
            " --force overwrites such files (the hash guard only), keeping their bytes for revert"
        )
    return draft.plan(lock, kept, stale)


def _other_overlay_reverted(
    installed: Installed, lock: Lock, record: Record | None
) -> Record | None:
    """`record`, unless it is of another overlay, whose files must all be back to their
    originals (then it is stale: None)."""
    if record is None or record.lock == lock:
        return record
    for entry in record.lock.entries:
        saved = record.originals.get(entry.path, step_sha(entry.pristine_sha256))
        if step_sha(installed.file_sha(entry.path)) != saved:
            raise HashMismatch(
                f"refusing to apply, nothing changed: {installed.root / entry.path} holds"
                f" another overlay ({', '.join(record.lock.patches)}): run `vllm-patchset"
                " overlay revert` first"
            )
    return None


def _plan_patch(
    draft: _Draft,
    installed: Installed,
    lock: Lock,
    entry: LockEntry,
    record: Record | None,
    *,
    force: bool,
) -> None:
    sha = installed.file_sha(entry.path)
    state = state_of(entry, sha)
    if state == "missing":
        raise HashMismatch(
            f"{installed.path(entry.path)} is missing: not a complete {installed.package}"
        )
    if state == "patched":
        draft.files.append(FileState(entry.path, state, sha))
        return
    if state == "modified":
        assert sha is not None
        why = f"neither the pristine nor the patched {installed.package} {lock.version}"
        if not force:
            draft.refused.append(f"{entry.path} (sha256 {sha[:12]}: {why})")
            return
        kept = record is not None and entry.path in record.originals
        draft.notes.append(
            f"--force: overwrote {entry.path} (sha256 {sha[:12]}, {why});"
            + (
                " the original saved when the overlay was first applied is kept for revert"
                " (the overwritten bytes are not)"
                if kept
                else " its bytes are kept for revert"
            )
        )
    draft.steps.append(Step(entry.path, step_sha(sha), step_sha(entry.patched_sha256)))
    draft.files.append(FileState(entry.path, state, sha, "patch"))


# -- revert ------------------------------------------------------------------------------------
def plan_revert(installed: Installed, lock: Lock, record: Record | None, *, force: bool) -> Plan:
    """Restore the saved original of every file the record's overlay (else `lock`) patched;
    refuse one that changed since, unless `force`. A record whose overlay is gone is stale."""
    applied = record.lock if record else lock
    if record is not None and overlay_gone(installed, record):
        return Plan(applied, (), current(installed, applied), (), None, stale=record)
    draft = _Draft()
    for entry in applied.entries:
        _plan_restore(draft, installed, entry, record, force=force)
    if draft.refused:
        raise HashMismatch(
            f"refusing to revert, nothing changed: {'; '.join(draft.refused)} changed since"
            " apply. --force restores the saved originals over them (the hash guard only)"
        )
    return draft.plan(applied, record)


def _plan_restore(
    draft: _Draft, installed: Installed, entry: LockEntry, record: Record | None, *, force: bool
) -> None:
    sha = installed.file_sha(entry.path)
    original = record.originals.get(entry.path) if record else None
    if original is None and entry.pristine_sha256 is None:
        original = ABSENT  # a file the overlay adds: its original is no file
    if step_sha(sha) == (original if original is not None else step_sha(entry.pristine_sha256)):
        draft.files.append(FileState(entry.path, "pristine", sha))
        return
    state = state_of(entry, sha)
    if state != "patched" and not force:
        draft.refused.append(f"{entry.path} ({state}, sha256 {(sha or '-')[:12]})")
        return
    if original is None:
        raise Finding(
            f"no saved original for {installed.path(entry.path)} (this overlay was not applied"
            f" by vllm-patchset): reinstall {installed.package}=={installed.version} to undo it"
        )
    if original != ABSENT:  # (an added file's original is no file)
        installed.check_original(entry.path, original)  # checked before anything is changed
    if state != "patched":
        draft.notes.append(f"--force: restored the original over {entry.path} ({state})")
    draft.steps.append(Step(entry.path, step_sha(sha), original))
    draft.files.append(FileState(entry.path, state, sha, "restore"))
