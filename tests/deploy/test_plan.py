"""`deploy/plan.py` and the transaction's recovery with files the overlay adds and deletes: a
lock entry with no pristine sha256 (added) or no patched one (deleted). The planner is pure:
each case a row of a table with the exact plan; the recovery on real files in a temp dir."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from test_deploy_plan import Files
from vllm_patchset.deploy.plan import Plan, plan_apply, plan_revert
from vllm_patchset.deploy.record import ABSENT, Record, Step
from vllm_patchset.deploy.report import FileState, state_of
from vllm_patchset.deploy.target import HashMismatch, Target
from vllm_patchset.deploy.transaction import Transaction
from vllm_patchset.errors import PatchsetError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.overlay.lock import Lock, LockEntry

M, N, D = "vllm/m.py", "vllm/n.py", "vllm/d.py"  # modified, added (new), deleted
# sha256 stand-ins: m0 pristine, m1 patched, n1 the added file, d0 the deleted one, x9 neither
ENTRIES = (
    LockEntry(M, "m0", "m1", ("p1",)),
    LockEntry(N, None, "n1", ("p1",)),
    LockEntry(D, "d0", None, ("p1",)),
)
LOCK = Lock("vllm", "1.0", "src", "c0", ("p1",), ENTRIES)
REC = Record(LOCK, {M: "m0", N: ABSENT, D: "d0"}, "t1")
SAVED = frozenset({(M, "m0"), (D, "d0")})


def files(hashes: Mapping[str, str | None]) -> Files:
    """The planner's table view of a target (tests/test_deploy_plan.py), at this lock's version
    and with the originals of the modified and the deleted file saved."""
    return Files(hashes, saved=SAVED, version="1.0")


PRISTINE = {M: "m0", N: None, D: "d0"}
PATCHED = {M: "m1", N: "n1", D: None}
APPLY = (Step(M, "m0", "m1"), Step(N, ABSENT, "n1"), Step(D, "d0", ABSENT))
REVERT = (Step(M, "m1", "m0"), Step(N, "n1", ABSENT), Step(D, ABSENT, "d0"))


def states(
    action: str | None, hashes: Mapping[str, str | None], names: str
) -> tuple[FileState, ...]:
    return tuple(
        FileState(rel, state, hashes[rel], action)
        for rel, state in zip((M, N, D), names.split(), strict=True)
    )


def test_state_of_a_file_added_or_deleted() -> None:
    added, deleted = ENTRIES[1], ENTRIES[2]
    assert [state_of(added, sha) for sha in (None, "n1", "x9")] == [
        "pristine",
        "patched",
        "modified",
    ]
    assert [state_of(deleted, sha) for sha in ("d0", None, "x9")] == [
        "pristine",
        "patched",
        "modified",
    ]


# (case, hashes, record, force, the plan)
APPLY_PLANS = [
    (
        "pristine",
        PRISTINE,
        None,
        False,
        Plan(LOCK, APPLY, states("patch", PRISTINE, "pristine pristine pristine"), (), None),
    ),
    (
        "applied",
        PATCHED,
        REC,
        False,
        Plan(LOCK, (), states(None, PATCHED, "patched " * 3), (), REC),
    ),
    (
        "another file where it adds one, forced: its bytes kept for revert",
        {**PRISTINE, N: "x9"},
        None,
        True,
        Plan(
            LOCK,
            (APPLY[0], Step(N, "x9", "n1"), APPLY[2]),
            states("patch", {**PRISTINE, N: "x9"}, "pristine modified pristine"),
            (
                "--force: overwrote vllm/n.py (sha256 x9, neither the pristine nor the patched"
                " vllm 1.0); its bytes are kept for revert",
            ),
            None,
        ),
    ),
]


@pytest.mark.parametrize(
    ("hashes", "record", "force", "plan"),
    [row[1:] for row in APPLY_PLANS],
    ids=[row[0] for row in APPLY_PLANS],
)
def test_plan_apply(
    hashes: dict[str, str | None], record: Record | None, force: bool, plan: Plan
) -> None:
    assert plan_apply(files(hashes), LOCK, record, force=force) == plan


APPLY_REFUSALS = [
    (
        "another file where it adds one",
        {**PRISTINE, N: "x9"},
        HashMismatch(
            "refusing to apply, nothing changed: vllm/n.py (sha256 x9: neither the pristine nor"
            " the patched vllm 1.0). --force overwrites such files (the hash guard only),"
            " keeping their bytes for revert"
        ),
    ),
    (
        "the file it deletes is another one",
        {**PRISTINE, D: "x9"},
        HashMismatch(
            "refusing to apply, nothing changed: vllm/d.py (sha256 x9: neither the pristine nor"
            " the patched vllm 1.0). --force overwrites such files (the hash guard only),"
            " keeping their bytes for revert"
        ),
    ),
    (
        "the file it modifies is missing",
        {**PRISTINE, M: None},
        HashMismatch("/site/vllm/m.py is missing: not a complete vllm"),
    ),
]


@pytest.mark.parametrize(
    ("hashes", "refusal"),
    [row[1:] for row in APPLY_REFUSALS],
    ids=[row[0] for row in APPLY_REFUSALS],
)
def test_plan_apply_refuses(hashes: dict[str, str | None], refusal: PatchsetError) -> None:
    with pytest.raises(type(refusal)) as caught:
        plan_apply(files(hashes), LOCK, None, force=False)
    assert str(caught.value) == str(refusal)


REVERT_PLANS = [
    (
        "applied",
        PATCHED,
        REC,
        Plan(LOCK, REVERT, states("restore", PATCHED, "patched " * 3), (), REC),
    ),
    (  # no record: the added file's original is no file all the same
        "applied with no record, the file it added only",
        {**PRISTINE, N: "n1"},
        None,
        Plan(
            LOCK,
            (REVERT[1],),
            (
                FileState(M, "pristine", "m0"),
                FileState(N, "patched", "n1", "restore"),
                FileState(D, "pristine", "d0"),
            ),
            (),
            None,
        ),
    ),
    ("pristine", PRISTINE, None, Plan(LOCK, (), states(None, PRISTINE, "pristine " * 3), (), None)),
]


@pytest.mark.parametrize(
    ("hashes", "record", "plan"),
    [row[1:] for row in REVERT_PLANS],
    ids=[row[0] for row in REVERT_PLANS],
)
def test_plan_revert(hashes: dict[str, str | None], record: Record | None, plan: Plan) -> None:
    assert plan_revert(files(hashes), LOCK, record, force=False) == plan


def test_plan_revert_refuses_a_file_put_where_it_deleted_one() -> None:
    with pytest.raises(HashMismatch) as caught:
        plan_revert(files({**PATCHED, D: "x9"}), LOCK, REC, force=False)
    assert str(caught.value) == (
        "refusing to revert, nothing changed: vllm/d.py (modified, sha256 x9) changed since"
        " apply. --force restores the saved originals over them (the hash guard only)"
    )


# -- the recovery of a killed apply, on real files ---------------------------------------------
OLD = {M: b"m = 0\n", D: b"d = 0\n"}
NEW = {M: b"m = 1\n", N: b"n = 1\n"}
REAL_STEPS = (
    Step(M, sha256_bytes(OLD[M]), sha256_bytes(NEW[M])),
    Step(N, ABSENT, sha256_bytes(NEW[N])),
    Step(D, sha256_bytes(OLD[D]), ABSENT),
)


def _target(root: Path) -> Target:
    for rel, data in {"vllm/__init__.py": b"", **OLD}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    target = Target(root, "vllm", "1.0")
    for rel, data in OLD.items():  # the originals an apply saves first
        fsio.atomic_write(target.state_path("originals", *rel.split("/")), data)
    return target


def _files(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in (M, N, D) if (root / rel).exists()}


@pytest.mark.parametrize("done", range(4))
def test_recover_rolls_back_an_apply_killed_after_each_file(tmp_path: Path, done: int) -> None:
    target = _target(tmp_path)
    transaction = Transaction(target, "apply", REAL_STEPS)
    transaction.begin()
    for step in REAL_STEPS[:done]:
        if step.after_sha256 == ABSENT:
            fsio.remove_file(tmp_path / step.path)
        else:
            fsio.atomic_write(tmp_path / step.path, NEW[step.path])
        transaction.mark_done(step.path)  # killed after the last of these: no record
    note = Transaction.recover(target)
    assert note == f"rolled back an interrupted apply ({done} of 3 files had been replaced)"
    assert _files(tmp_path) == OLD
    assert sorted(p.name for p in target.state.rglob("*")) == []


@pytest.mark.parametrize("done", range(4))
def test_recover_finishes_a_revert_killed_after_each_file(tmp_path: Path, done: int) -> None:
    target = _target(tmp_path)
    for rel, data in NEW.items():
        (tmp_path / rel).write_bytes(data)
    (tmp_path / D).unlink()
    undo = tuple(Step(s.path, s.after_sha256, s.before_sha256) for s in REAL_STEPS)
    transaction = Transaction(target, "revert", undo)
    transaction.begin()
    for step in undo[:done]:
        transaction.restore(step)
        transaction.mark_done(step.path)
    note = Transaction.recover(target)
    assert note == f"finished an interrupted revert ({done} of 3 files had been restored)"
    assert _files(tmp_path) == OLD
