"""The deploy planner on its own: `plan_apply` and `plan_revert` are pure (hashes, lock,
record in; a `Plan` or a refusal out), so each case is a row of a table with the exact plan
(`Transaction` and `recover`: tests/deploy/test_transaction.py). The whole commands on a real
vLLM, killed at every write point, are in test_deploy.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_patchset.deploy.plan import Plan, plan_apply, plan_revert
from vllm_patchset.deploy.record import Record, Step
from vllm_patchset.deploy.report import FileState
from vllm_patchset.deploy.target import HashMismatch
from vllm_patchset.errors import Finding, PatchsetError
from vllm_patchset.overlay.lock import Lock, LockEntry

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
APPLY_REFUSALS = [
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


REVERT_PLANS = [
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


@pytest.mark.parametrize(
    ("hashes", "record", "force", "plan"),
    [row[1:] for row in APPLY_PLANS],
    ids=[row[0] for row in APPLY_PLANS],
)
def test_plan_apply(
    hashes: dict[str, str | None], record: Record | None, force: bool, plan: Plan
) -> None:
    assert plan_apply(Files(hashes), LOCK, record, force=force) == plan


@pytest.mark.parametrize(
    ("hashes", "record", "force", "refusal"),
    [row[1:] for row in APPLY_REFUSALS],
    ids=[row[0] for row in APPLY_REFUSALS],
)
def test_plan_apply_refuses(
    hashes: dict[str, str | None], record: Record | None, force: bool, refusal: PatchsetError
) -> None:
    with pytest.raises(type(refusal)) as caught:
        plan_apply(Files(hashes), LOCK, record, force=force)
    assert str(caught.value) == str(refusal)


@pytest.mark.parametrize(
    ("hashes", "record", "force", "plan"),
    [row[1:] for row in REVERT_PLANS],
    ids=[row[0] for row in REVERT_PLANS],
)
def test_plan_revert(
    hashes: dict[str, str | None], record: Record | None, force: bool, plan: Plan
) -> None:
    assert plan_revert(Files(hashes), LOCK, record, force=force) == plan


@pytest.mark.parametrize(
    ("hashes", "record", "saved", "refusal"),
    [row[1:] for row in REVERT_REFUSALS],
    ids=[row[0] for row in REVERT_REFUSALS],
)
def test_plan_revert_refuses(
    hashes: dict[str, str | None],
    record: Record | None,
    saved: frozenset[tuple[str, str]],
    refusal: PatchsetError,
) -> None:
    with pytest.raises(type(refusal)) as caught:
        plan_revert(Files(hashes, saved), LOCK, record, force=False)
    assert str(caught.value) == str(refusal)


def test_plan_apply_done_only_when_recorded() -> None:
    done = [plan_apply(Files(PATCHED), LOCK, r, force=False).done for r in (REC, None)]
    assert done == [True, False]
