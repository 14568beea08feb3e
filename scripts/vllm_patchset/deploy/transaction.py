"""A change of the target's files as a transaction over a durable journal, in the manner of
pip's uninstall stash (begin, mark done, commit, roll back) but crash-durable: the journal is
on disk before the first change, and the next run recovers what a killed one left.

Apply saves the originals, then replaces each file atomically (temp file in the same
directory, fsync, os.replace); writing the record is its commit point. A run killed before that
is rolled back by the next apply, revert or status (each file is whole: either its old or its
new bytes); one killed after it only leaves its journal behind. Revert always runs forward to
the end: originals are removed only after the last file is restored."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from vllm_patchset.deploy.bytecode import remove_bytecode
from vllm_patchset.deploy.record import ABSENT, Journal, Record, Step, read_journal, read_record
from vllm_patchset.deploy.target import UNDO, Target
from vllm_patchset.errors import Finding, PatchsetError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.infra.installed import JOURNAL, ORIGINALS


class Transaction:
    """One apply or revert of `steps` on `target`; the caller holds the target's lock."""

    def __init__(self, target: Target, op: str, steps: Sequence[Step]) -> None:
        self.target, self.op, self.steps = target, op, tuple(steps)
        self.id = uuid.uuid4().hex
        self.journal = target.state_path(JOURNAL)

    @classmethod
    @contextmanager
    def run(cls, target: Target, op: str, steps: Sequence[Step]) -> Iterator[Transaction]:
        """Begin; commit at the end of the block; on an error or an interrupt inside it, roll
        back (apply) or finish (revert) at once, with the next SIGINT/SIGTERM held back."""
        transaction = cls(target, op, steps)
        try:
            transaction.begin()
            yield transaction
        except BaseException as exc:
            transaction.roll_back(exc)
            raise
        transaction.commit()

    def begin(self) -> None:
        """Journal the steps before any change."""
        intent = Journal(op=self.op, id=self.id, version=self.target.version, steps=self.steps)
        fsio.atomic_write(self.journal, intent.line())

    def mark_done(self, path: str) -> None:
        try:
            with fsio.writing(self.journal, append=True) as handle:
                handle.write(Journal.done_line(path))
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise fsio.WriteFailed(self.target.state / JOURNAL, exc) from None

    def commit(self) -> None:
        fsio.remove_file(self.journal)
        fsio.fsync_dir(self.target.state)
        done = "applied" if self.op == "apply" else "reverted"
        fsio.interrupt_leaves(f"the overlay had been {done} (the run was complete)")

    def roll_back(self, exc: BaseException) -> None:
        """Undo or finish the steps after `exc`, and say what that left; when that fails too,
        leave the journal for the next run and raise `exc`."""
        with fsio.deferred_signals():
            try:
                note = self.recover(self.target)  # the same code that repairs a killed run
            except (PatchsetError, OSError) as again:
                _left(
                    exc,
                    f"the {self.op} stopped half-way and could not be undone ({again}): its"
                    f" journal {self.journal} is left for the next `vllm-patchset overlay"
                    " apply`, `revert` or `status` to finish",
                )
                raise exc from None
        _left(exc, self._outcome(note))

    def restore(self, step: Step) -> None:
        """A revert's step: the file back to its saved original."""
        _restore(self.target, step, want=step.after_sha256, other=step.before_sha256)

    @staticmethod
    def recover(target: Target) -> str | None:
        """Repair what a killed run left (the caller holds the lock); a note, or None."""
        fsio.sweep_temp([target.state])  # a run killed writing its journal leaves a temp file
        journal = read_journal(target)
        if journal is None:
            return None
        note = _settle(target, journal, read_record(target))
        fsio.remove_tree(target.state_path(UNDO))
        fsio.sweep_temp({target.path(s.path).parent for s in journal.steps})
        fsio.remove_file(target.state_path(JOURNAL))
        fsio.fsync_dir(target.state)
        return note

    def _outcome(self, note: str | None) -> str:
        if note is None:
            return "nothing was changed"
        if self.op == "revert":
            return f"{note}: the files are pristine"
        record = read_record(self.target)
        if record is not None and record.transaction == self.id:
            return f"{note}: the overlay is applied"
        return f"{note}: the target is as it was"


def _left(exc: BaseException, note: str) -> None:
    """Say what `exc` left behind, in the one line cli.main prints for it."""
    if isinstance(exc, PatchsetError):
        exc.left = note
    fsio.interrupt_leaves(note)


def _settle(target: Target, journal: Journal, record: Record | None) -> str:
    """Finish a committed apply or any revert, roll back an apply that had not committed."""
    n = len(journal.steps)
    if journal.op == "apply" and record is not None and record.transaction == journal.id:
        return "finished an interrupted apply (it had committed)"
    if journal.op == "apply":
        undone = [
            _restore(target, s, want=s.before_sha256, other=s.after_sha256) for s in journal.steps
        ]
        _drop_new_originals(target, journal, record)
        return f"rolled back an interrupted apply ({sum(undone)} of {n} files had been replaced)"
    done = [_restore(target, s, want=s.after_sha256, other=s.before_sha256) for s in journal.steps]
    target.forget()
    return f"finished an interrupted revert ({n - sum(done)} of {n} files had been restored)"


def _drop_new_originals(target: Target, journal: Journal, record: Record | None) -> None:
    """The originals a rolled-back apply saved, and only those (a record keeps its own)."""
    if record is None:
        fsio.remove_tree(target.state_path(ORIGINALS))
        return
    for step in journal.steps:
        if step.path not in record.originals:
            fsio.remove_file(target.state_path(ORIGINALS, *step.path.split("/")))


def _restore(target: Target, step: Step, *, want: str, other: str) -> bool:
    """Make the file's sha256 `want`: it is `want` already, or `other` and its original is saved.

    True when it had to restore the file."""
    path = target.path(step.path)
    data = fsio.read_regular(path)
    current = ABSENT if data is None else sha256_bytes(data)  # a file added, deleted, missing
    if current != want:
        if current != other:
            raise Finding(
                f"{path} changed during an interrupted run (sha256 {current or 'none'}):"
                f" reinstall {target.package}=={target.version} and remove {target.state}"
            )
        if want == ABSENT:  # a file the overlay adds: no file before it
            fsio.remove_file(path)
        else:
            fsio.atomic_write(path, target.saved_original(step.path, want), like=path)
    remove_bytecode(path, strict=False)
    return current != want
