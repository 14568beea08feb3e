"""`deploy/transaction.py` on a small package in a temp dir: a run stopped where a kill would
stop it, then the next run's recovery (rolled back before the commit point, finished after
it); an error inside a run rolled back, the message saying what it left. The whole commands on
a real vLLM, killed at every write point, are in test_deploy.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from test_deploy_plan import A, B
from vllm_patchset.deploy.record import Step, read_record, write_record
from vllm_patchset.deploy.target import Target
from vllm_patchset.deploy.transaction import Transaction
from vllm_patchset.errors import Finding
from vllm_patchset.infra import fsio
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.overlay.lock import Lock, LockEntry

# -- the transaction over the journal, on real files ---------------------------------------------
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


def _target(root: Path, files: Mapping[str, bytes]) -> Target:
    for rel, data in {"vllm/__init__.py": b"", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    target = Target(root, "vllm", "0.24.0")
    for rel, data in OLD.items():  # the originals an apply saves first
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
