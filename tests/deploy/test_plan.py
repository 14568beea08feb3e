"""`deploy/plan.py`, the pure planner: hashes, lock and record in; a `Plan` or a refusal out.
Each case is a row of a table with the exact plan, for a lock whose files the overlay modifies
and for one whose files it adds and deletes (an entry with no pristine sha256, or no patched
one). `Transaction` and `recover`: tests/deploy/test_transaction.py; the whole commands on a
real vLLM, killed at every write point: tests/test_deploy.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_patchset.deploy.plan import Plan, plan_apply, plan_revert
from vllm_patchset.deploy.record import ABSENT, Record, Step
from vllm_patchset.deploy.report import FileState
from vllm_patchset.deploy.target import HashMismatch
from vllm_patchset.errors import Finding, PatchsetError
from vllm_patchset.overlay.lock import Lock, LockEntry

# -- a lock whose files the overlay modifies --------------------------------------------------------
A, B = "vllm/a.py", "vllm/b.py"


# sha256s stand-ins: a0 pristine, a1 patched, a2 another overlay's, a9 neither
ENTRIES = (LockEntry(A, "a0", "a1", ("p1",)), LockEntry(B, "b0", "b1", ("p1",)))


LOCK = Lock("vllm", "0.24.0", "src", "c0", ("p1",), ENTRIES)


OTHER = Lock("vllm", "0.24.0", "src", "c0", ("p0",), (LockEntry(A, "a0", "a2", ("p0",)),))


EMPTY_OLD = Lock("vllm", "0.23.0", "src", "c0", (), ())


REC = Record(LOCK, {A: "a0", B: "b0"}, "t1")


REC_OTHER = Record(OTHER, {A: "a0"}, "t0")


REC_OLD = Record(EMPTY_OLD, {}, "t0")


BOTH_SAVED = frozenset({(A, "a0"), (B, "b0")})


@dataclass(frozen=True)
class Files:
    """The planner's view of a target, as a table: each file's sha256 and the saved originals."""

    hashes: Mapping[str, str | None]
    saved: frozenset[tuple[str, str]] = BOTH_SAVED
    root: Path = Path("/site")
    package: str = "vllm"
    version: str = "0.24.0"

    def path(self, rel: str) -> Path:
        return self.root / rel

    def file_sha(self, rel: str) -> str | None:
        return self.hashes.get(rel)

    def check_original(self, rel: str, sha: str) -> None:
        if (rel, sha) not in self.saved:
            raise Finding(f"no saved original of {rel} ({sha})")


PRISTINE = {A: "a0", B: "b0"}


PATCHED = {A: "a1", B: "b1"}


HALF = {A: "a1", B: "b0"}


PATCH_A, PATCH_B = Step(A, "a0", "a1"), Step(B, "b0", "b1")


UNDO_A, UNDO_B = Step(A, "a1", "a0"), Step(B, "b1", "b0")


FORCED = (
    "--force: overwrote vllm/a.py (sha256 a9, neither the pristine nor the patched vllm 0.24.0);"
)


# (case, hashes, record, force, the plan)
APPLY_PLANS = [
    (
        "pristine",
        PRISTINE,
        None,
        False,
        Plan(
            LOCK,
            (PATCH_A, PATCH_B),
            (FileState(A, "pristine", "a0", "patch"), FileState(B, "pristine", "b0", "patch")),
            (),
            None,
        ),
    ),
    (
        "applied and recorded: done",
        PATCHED,
        REC,
        False,
        Plan(LOCK, (), (FileState(A, "patched", "a1"), FileState(B, "patched", "b1")), (), REC),
    ),
    (
        "patched, no record: nothing to change, a record to write",
        PATCHED,
        None,
        False,
        Plan(LOCK, (), (FileState(A, "patched", "a1"), FileState(B, "patched", "b1")), (), None),
    ),
    (
        "half patched",
        HALF,
        None,
        False,
        Plan(
            LOCK,
            (PATCH_B,),
            (FileState(A, "patched", "a1"), FileState(B, "pristine", "b0", "patch")),
            (),
            None,
        ),
    ),
    (
        "modified, forced, the first original kept",
        {A: "a9", B: "b1"},
        REC,
        True,
        Plan(
            LOCK,
            (Step(A, "a9", "a1"),),
            (FileState(A, "modified", "a9", "patch"), FileState(B, "patched", "b1")),
            (
                f"{FORCED} the original saved when the overlay was first applied is kept for"
                " revert (the overwritten bytes are not)",
            ),
            REC,
        ),
    ),
    (
        "modified, forced, no record",
        {A: "a9", B: "b0"},
        None,
        True,
        Plan(
            LOCK,
            (Step(A, "a9", "a1"), PATCH_B),
            (FileState(A, "modified", "a9", "patch"), FileState(B, "pristine", "b0", "patch")),
            (f"{FORCED} its bytes are kept for revert",),
            None,
        ),
    ),
    (
        "reinstalled over the record: it is stale",
        PRISTINE,
        REC,
        False,
        Plan(
            LOCK,
            (PATCH_A, PATCH_B),
            (FileState(A, "pristine", "a0", "patch"), FileState(B, "pristine", "b0", "patch")),
            (),
            None,
            stale=REC,
        ),
    ),
    (
        "a record of no files for another version: stale",
        HALF,
        REC_OLD,
        False,
        Plan(
            LOCK,
            (PATCH_B,),
            (FileState(A, "patched", "a1"), FileState(B, "pristine", "b0", "patch")),
            (),
            None,
            stale=REC_OLD,
        ),
    ),
]


# (case, hashes, record, force, the refusal)
APPLY_REFUSALS: list[tuple[str, Mapping[str, str | None], Record | None, bool, PatchsetError]] = [
    (
        "modified",
        {A: "a9", B: "b0"},
        None,
        False,
        HashMismatch(
            "refusing to apply, nothing changed: vllm/a.py (sha256 a9: neither the pristine nor"
            " the patched vllm 0.24.0). --force overwrites such files (the hash guard only),"
            " keeping their bytes for revert"
        ),
    ),
    (
        "missing",
        {A: None, B: "b0"},
        None,
        True,
        HashMismatch("/site/vllm/a.py is missing: not a complete vllm"),
    ),
    (
        "another overlay in place",
        {A: "a2", B: "b0"},
        REC_OTHER,
        True,
        HashMismatch(
            "refusing to apply, nothing changed: /site/vllm/a.py holds another overlay (p0):"
            " run `vllm-patchset overlay revert` first"
        ),
    ),
]


REVERT_PLANS: list[tuple[str, Mapping[str, str | None], Record | None, bool, Plan]] = [
    (
        "applied",
        PATCHED,
        REC,
        False,
        Plan(
            LOCK,
            (UNDO_A, UNDO_B),
            (FileState(A, "patched", "a1", "restore"), FileState(B, "patched", "b1", "restore")),
            (),
            REC,
        ),
    ),
    (
        "half reverted",
        HALF,
        REC,
        False,
        Plan(
            LOCK,
            (UNDO_A,),
            (FileState(A, "patched", "a1", "restore"), FileState(B, "pristine", "b0")),
            (),
            REC,
        ),
    ),
    (
        "reinstalled over the record: it is stale",
        PRISTINE,
        REC,
        False,
        Plan(
            LOCK,
            (),
            (FileState(A, "pristine", "a0"), FileState(B, "pristine", "b0")),
            (),
            None,
            REC,
        ),
    ),
    (
        "no record, pristine",
        PRISTINE,
        None,
        False,
        Plan(LOCK, (), (FileState(A, "pristine", "a0"), FileState(B, "pristine", "b0")), (), None),
    ),
    (
        "modified, forced",
        {A: "a9", B: "b1"},
        REC,
        True,
        Plan(
            LOCK,
            (Step(A, "a9", "a0"), UNDO_B),
            (FileState(A, "modified", "a9", "restore"), FileState(B, "patched", "b1", "restore")),
            ("--force: restored the original over vllm/a.py (modified)",),
            REC,
        ),
    ),
    (
        "missing, forced",
        {A: None, B: "b1"},
        REC,
        True,
        Plan(
            LOCK,
            (Step(A, "", "a0"), UNDO_B),
            (FileState(A, "missing", None, "restore"), FileState(B, "patched", "b1", "restore")),
            ("--force: restored the original over vllm/a.py (missing)",),
            REC,
        ),
    ),
]


REVERT_REFUSALS = [
    (
        "modified",
        {A: "a9", B: "b1"},
        REC,
        BOTH_SAVED,
        HashMismatch(
            "refusing to revert, nothing changed: vllm/a.py (modified, sha256 a9) changed since"
            " apply. --force restores the saved originals over them (the hash guard only)"
        ),
    ),
    (
        "patched, no record",
        HALF,
        None,
        BOTH_SAVED,
        Finding(
            "no saved original for /site/vllm/a.py (this overlay was not applied by"
            " vllm-patchset): reinstall vllm==0.24.0 to undo it"
        ),
    ),
    (
        "an original lost: found before a refusal of another file",
        {A: "a9", B: "b1"},
        REC,
        frozenset({(A, "a0")}),
        Finding("no saved original of vllm/b.py (b0)"),
    ),
]


# -- a lock whose files the overlay adds and deletes ------------------------------------------------
M, N, D = "vllm/m.py", "vllm/n.py", "vllm/d.py"  # modified, added (new), deleted
# sha256 stand-ins: m0 pristine, m1 patched, n1 the added file, d0 the deleted one, x9 neither
ADD_ENTRIES = (
    LockEntry(M, "m0", "m1", ("p1",)),
    LockEntry(N, None, "n1", ("p1",)),
    LockEntry(D, "d0", None, ("p1",)),
)
ADD_LOCK = Lock("vllm", "1.0", "src", "c0", ("p1",), ADD_ENTRIES)
ADD_REC = Record(ADD_LOCK, {M: "m0", N: ABSENT, D: "d0"}, "t1")
ADD_SAVED = frozenset({(M, "m0"), (D, "d0")})


def added_files(hashes: Mapping[str, str | None]) -> Files:
    """The planner's table view of a target, at this lock's version and with the originals of
    the modified and the deleted file saved."""
    return Files(hashes, saved=ADD_SAVED, version="1.0")


ADD_PRISTINE = {M: "m0", N: None, D: "d0"}
ADD_PATCHED = {M: "m1", N: "n1", D: None}
ADD_APPLY = (Step(M, "m0", "m1"), Step(N, ABSENT, "n1"), Step(D, "d0", ABSENT))
ADD_REVERT = (Step(M, "m1", "m0"), Step(N, "n1", ABSENT), Step(D, ABSENT, "d0"))


def states(
    action: str | None, hashes: Mapping[str, str | None], names: str
) -> tuple[FileState, ...]:
    return tuple(
        FileState(rel, state, hashes[rel], action)
        for rel, state in zip((M, N, D), names.split(), strict=True)
    )


# (case, hashes, record, force, the plan)
ADD_APPLY_PLANS = [
    (
        "pristine",
        ADD_PRISTINE,
        None,
        False,
        Plan(
            ADD_LOCK,
            ADD_APPLY,
            states("patch", ADD_PRISTINE, "pristine pristine pristine"),
            (),
            None,
        ),
    ),
    (
        "applied",
        ADD_PATCHED,
        ADD_REC,
        False,
        Plan(ADD_LOCK, (), states(None, ADD_PATCHED, "patched " * 3), (), ADD_REC),
    ),
    (
        "another file where it adds one, forced: its bytes kept for revert",
        {**ADD_PRISTINE, N: "x9"},
        None,
        True,
        Plan(
            ADD_LOCK,
            (ADD_APPLY[0], Step(N, "x9", "n1"), ADD_APPLY[2]),
            states("patch", {**ADD_PRISTINE, N: "x9"}, "pristine modified pristine"),
            (
                "--force: overwrote vllm/n.py (sha256 x9, neither the pristine nor the patched"
                " vllm 1.0); its bytes are kept for revert",
            ),
            None,
        ),
    ),
]


ADD_APPLY_REFUSALS = [
    (
        "another file where it adds one",
        {**ADD_PRISTINE, N: "x9"},
        HashMismatch(
            "refusing to apply, nothing changed: vllm/n.py (sha256 x9: neither the pristine nor"
            " the patched vllm 1.0). --force overwrites such files (the hash guard only),"
            " keeping their bytes for revert"
        ),
    ),
    (
        "the file it deletes is another one",
        {**ADD_PRISTINE, D: "x9"},
        HashMismatch(
            "refusing to apply, nothing changed: vllm/d.py (sha256 x9: neither the pristine nor"
            " the patched vllm 1.0). --force overwrites such files (the hash guard only),"
            " keeping their bytes for revert"
        ),
    ),
    (
        "the file it modifies is missing",
        {**ADD_PRISTINE, M: None},
        HashMismatch("/site/vllm/m.py is missing: not a complete vllm"),
    ),
]


ADD_REVERT_PLANS = [
    (
        "applied",
        ADD_PATCHED,
        ADD_REC,
        Plan(ADD_LOCK, ADD_REVERT, states("restore", ADD_PATCHED, "patched " * 3), (), ADD_REC),
    ),
    (  # no record: the added file's original is no file all the same
        "applied with no record, the file it added only",
        {**ADD_PRISTINE, N: "n1"},
        None,
        Plan(
            ADD_LOCK,
            (ADD_REVERT[1],),
            (
                FileState(M, "pristine", "m0"),
                FileState(N, "patched", "n1", "restore"),
                FileState(D, "pristine", "d0"),
            ),
            (),
            None,
        ),
    ),
    (
        "pristine",
        ADD_PRISTINE,
        None,
        Plan(ADD_LOCK, (), states(None, ADD_PRISTINE, "pristine " * 3), (), None),
    ),
]


# Each kind of test over both locks' tables: (the target's table view, the lock, ...).
ADDED = "added/deleted: "
APPLY_ROWS = [
    *(pytest.param(Files(h), LOCK, r, f, p, id=c) for c, h, r, f, p in APPLY_PLANS),
    *(pytest.param(added_files(h), ADD_LOCK, r, f, p, id=ADDED + c) for c, h, r, f, p in ADD_APPLY_PLANS),
]  # fmt: skip
APPLY_REFUSAL_ROWS = [
    *(pytest.param(Files(h), LOCK, r, f, x, id=c) for c, h, r, f, x in APPLY_REFUSALS),
    *(pytest.param(added_files(h), ADD_LOCK, None, False, x, id=ADDED + c) for c, h, x in ADD_APPLY_REFUSALS),
]  # fmt: skip
REVERT_ROWS = [
    *(pytest.param(Files(h), LOCK, r, f, p, id=c) for c, h, r, f, p in REVERT_PLANS),
    *(pytest.param(added_files(h), ADD_LOCK, r, False, p, id=ADDED + c) for c, h, r, p in ADD_REVERT_PLANS),
]  # fmt: skip
REVERT_REFUSAL_ROWS = [
    *(pytest.param(Files(h, s), LOCK, r, x, id=c) for c, h, r, s, x in REVERT_REFUSALS),
    pytest.param(
        added_files({**ADD_PATCHED, D: "x9"}),
        ADD_LOCK,
        ADD_REC,
        HashMismatch(
            "refusing to revert, nothing changed: vllm/d.py (modified, sha256 x9) changed since"
            " apply. --force restores the saved originals over them (the hash guard only)"
        ),
        id=ADDED + "a file put where it deleted one",
    ),
]


@pytest.mark.parametrize(("files", "lock", "record", "force", "plan"), APPLY_ROWS)
def test_plan_apply(
    files: Files, lock: Lock, record: Record | None, force: bool, plan: Plan
) -> None:
    assert plan_apply(files, lock, record, force=force) == plan


@pytest.mark.parametrize(("files", "lock", "record", "force", "refusal"), APPLY_REFUSAL_ROWS)
def test_plan_apply_refuses(
    files: Files, lock: Lock, record: Record | None, force: bool, refusal: PatchsetError
) -> None:
    with pytest.raises(type(refusal)) as caught:
        plan_apply(files, lock, record, force=force)
    assert str(caught.value) == str(refusal)


@pytest.mark.parametrize(("files", "lock", "record", "force", "plan"), REVERT_ROWS)
def test_plan_revert(
    files: Files, lock: Lock, record: Record | None, force: bool, plan: Plan
) -> None:
    assert plan_revert(files, lock, record, force=force) == plan


@pytest.mark.parametrize(("files", "lock", "record", "refusal"), REVERT_REFUSAL_ROWS)
def test_plan_revert_refuses(
    files: Files, lock: Lock, record: Record | None, refusal: PatchsetError
) -> None:
    with pytest.raises(type(refusal)) as caught:
        plan_revert(files, lock, record, force=False)
    assert str(caught.value) == str(refusal)


def test_plan_apply_done_only_when_recorded() -> None:
    done = [plan_apply(Files(PATCHED), LOCK, r, force=False).done for r in (REC, None)]
    assert done == [True, False]
