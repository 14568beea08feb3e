"""`deploy/transaction.py` on a small package in a temp dir: a run stopped where a kill would
stop it, then the next run's recovery (rolled back before the commit point, finished after
it; files the overlay adds and deletes too, killed after each file); an error inside a run rolled back, the message saying what it left. The whole commands on
a real vLLM, killed at every write point, are in test_deploy.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from vllm_patchset.deploy.record import ABSENT, Step, read_record, write_record
from vllm_patchset.deploy.target import Target
from vllm_patchset.deploy.transaction import Transaction
from vllm_patchset.errors import Finding
from vllm_patchset.infra import fsio
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.overlay.lock import Lock, LockEntry

# -- the transaction over the journal, on real files ---------------------------------------------
A, B = "vllm/a.py", "vllm/b.py"
OLD = {A: b"a = 0\n", B: b"b = 0\n"}


NEW = {A: b"a = 1\n", B: b"b = 1\n"}


REAL = Lock(
    "vllm",
    "0.24.0",
    "src",
    "c0",
    ("p1",),
    tuple(LockEntry(p, sha256_bytes(OLD[p]), sha256_bytes(NEW[p]), ("p1",)) for p in (A, B)),
)


APPLY_STEPS = tuple(Step(p, sha256_bytes(OLD[p]), sha256_bytes(NEW[p])) for p in (A, B))


REVERT_STEPS = tuple(
    Step(p, s.after_sha256, s.before_sha256) for p, s in zip((A, B), APPLY_STEPS, strict=True)
)


def _target(root: Path, files: Mapping[str, bytes], originals: Mapping[str, bytes] = OLD) -> Target:
    """A small vllm package in ``root`` holding ``files``, with ``originals`` saved (what an
    apply saves first)."""
    for rel, data in {"vllm/__init__.py": b"", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    target = Target(root, "vllm", "0.24.0")
    for rel, data in originals.items():
        fsio.atomic_write(target.state_path("originals", *rel.split("/")), data)
    return target


def _files(target: Target) -> dict[str, bytes]:
    return {rel: (target.root / rel).read_bytes() for rel in (A, B)}


def _state(target: Target) -> list[str]:
    return sorted(str(p.relative_to(target.state)) for p in target.state.rglob("*"))


def test_recover_rolls_back_an_apply_stopped_half_way(tmp_path: Path) -> None:
    target = _target(tmp_path, OLD)
    transaction = Transaction(target, "apply", APPLY_STEPS)
    transaction.begin()
    fsio.atomic_write(target.root / A, NEW[A])
    transaction.mark_done(A)  # killed here: no record
    note = Transaction.recover(target)
    assert (note, _files(target), _state(target)) == (
        "rolled back an interrupted apply (1 of 2 files had been replaced)",
        OLD,
        [],
    )


def test_recover_finishes_an_apply_that_had_committed(tmp_path: Path) -> None:
    target = _target(tmp_path, NEW)
    transaction = Transaction(target, "apply", APPLY_STEPS)
    transaction.begin()
    write_record(
        target,
        REAL,
        {p: s.before_sha256 for p, s in zip((A, B), APPLY_STEPS, strict=True)},
        transaction.id,
        {},
    )
    note = Transaction.recover(target)  # killed after the record, before the journal went
    record = read_record(target)
    assert (note, _files(target), record and record.transaction) == (
        "finished an interrupted apply (it had committed)",
        NEW,
        transaction.id,
    )
    assert _state(target) == [
        "applied.json",
        "originals",
        "originals/vllm",
        "originals/vllm/a.py",
        "originals/vllm/b.py",
    ]


def test_recover_finishes_a_revert(tmp_path: Path) -> None:
    target = _target(tmp_path, {A: OLD[A], B: NEW[B]})
    write_record(target, REAL, {p: sha256_bytes(OLD[p]) for p in (A, B)}, "t0", {})
    transaction = Transaction(target, "revert", REVERT_STEPS)
    transaction.begin()
    transaction.mark_done(A)  # killed here: A restored, B not
    note = Transaction.recover(target)
    assert (note, _files(target), _state(target)) == (
        "finished an interrupted revert (1 of 2 files had been restored)",
        OLD,
        [],
    )


def test_run_rolls_back_at_an_error_and_says_what_it_left(tmp_path: Path) -> None:
    target = _target(tmp_path, OLD)
    with pytest.raises(Finding) as caught, Transaction.run(target, "apply", APPLY_STEPS) as tx:
        fsio.atomic_write(target.root / A, NEW[A])
        tx.mark_done(A)
        raise Finding("disk full")
    assert (caught.value.left, _files(target), _state(target)) == (
        "rolled back an interrupted apply (1 of 2 files had been replaced): the target is as it was",
        OLD,
        [],
    )


# -- a killed run over files the overlay adds (N) and deletes (D), after each file -----------------
M, N, D = "vllm/m.py", "vllm/n.py", "vllm/d.py"  # modified, added (new), deleted
ADD_OLD = {M: b"m = 0\n", D: b"d = 0\n"}
ADD_NEW = {M: b"m = 1\n", N: b"n = 1\n"}
ADD_STEPS = (
    Step(M, sha256_bytes(ADD_OLD[M]), sha256_bytes(ADD_NEW[M])),
    Step(N, ABSENT, sha256_bytes(ADD_NEW[N])),
    Step(D, sha256_bytes(ADD_OLD[D]), ABSENT),
)


def _present(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in (M, N, D) if (root / rel).exists()}


@pytest.mark.parametrize("done", range(4))
def test_recover_rolls_back_an_apply_killed_after_each_file(tmp_path: Path, done: int) -> None:
    target = _target(tmp_path, ADD_OLD, ADD_OLD)
    transaction = Transaction(target, "apply", ADD_STEPS)
    transaction.begin()
    for step in ADD_STEPS[:done]:
        if step.after_sha256 == ABSENT:
            fsio.remove_file(tmp_path / step.path)
        else:
            fsio.atomic_write(tmp_path / step.path, ADD_NEW[step.path])
        transaction.mark_done(step.path)  # killed after the last of these: no record
    note = Transaction.recover(target)
    assert note == f"rolled back an interrupted apply ({done} of 3 files had been replaced)"
    assert _present(tmp_path) == ADD_OLD
    assert sorted(p.name for p in target.state.rglob("*")) == []


@pytest.mark.parametrize("done", range(4))
def test_recover_finishes_a_revert_killed_after_each_file(tmp_path: Path, done: int) -> None:
    target = _target(tmp_path, ADD_OLD, ADD_OLD)
    for rel, data in ADD_NEW.items():
        (tmp_path / rel).write_bytes(data)
    (tmp_path / D).unlink()
    undo = tuple(Step(s.path, s.after_sha256, s.before_sha256) for s in ADD_STEPS)
    transaction = Transaction(target, "revert", undo)
    transaction.begin()
    for step in undo[:done]:
        transaction.restore(step)
        transaction.mark_done(step.path)
    note = Transaction.recover(target)
    assert note == f"finished an interrupted revert ({done} of 3 files had been restored)"
    assert _present(tmp_path) == ADD_OLD
