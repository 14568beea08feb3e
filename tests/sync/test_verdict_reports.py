"""`sync/verdict_reports.py`: the reports of verdicts as data (status, matrix, a conflict's
hunks), and the matrix's column ids, unique among the patches."""

from __future__ import annotations

import pytest
from vllm_patchset.series.verdict import HunkFinding, Reason, State, Verdict
from vllm_patchset.sync.verdict_reports import (
    UPDATE_LOCK,
    column_id,
    conflict_report,
    lock_next_step,
    state_cell,
    unique_ids,
)

COLUMN_IDS = [
    # (key, column heading)
    ("0002-x.patch", "0002"),
    ("upstreamed/0001-a.patch", "U0001"),
    ("parked/0003-b.patch", "P0003"),
    ("fix.patch", "fix.patch"),  # no number: the name
]


@pytest.mark.parametrize(("key", "heading"), COLUMN_IDS)
def test_column_id(key: str, heading: str) -> None:
    assert column_id(key) == heading


IDS = [
    # The real chain's archive after 0.25.0: two fixes numbered 0001 (were two `U0001`).
    (
        ["upstreamed/0001-nvfp4-oracle.patch", "upstreamed/0001-triton_moe-no.patch"],
        ["U0001-nvfp4", "U0001-triton_moe"],
    ),
    (
        ["upstreamed/0001-a.patch", "0001-b.patch", "parked/0001-c.patch"],
        ["U0001", "0001", "P0001"],
    ),
    (["0001-x-a.patch", "0001-x-b.patch"], ["0001-x-a.patch", "0001-x-b.patch"]),
]


@pytest.mark.parametrize(("keys", "ids"), IDS)
def test_short_ids_are_unique(keys: list[str], ids: list[str]) -> None:
    assert list(unique_ids(keys).values()) == ids


def hunk(offset: int | None, *, applies: bool = True, found_at: int | None = None) -> HunkFinding:
    at = 3 + (offset or 0) if applies else None
    return HunkFinding(
        "vllm/x.py", 1, "@@ -3 +3 @@", at, offset, False, True, ("a",), ("b",), found_at
    )


STATE_CELLS = [
    # (state, reason, hunks, warnings) -> cell
    (State.APPLIES, Reason.APPLIES, (hunk(None),), (), "applies"),
    (State.APPLIES, Reason.APPLIES, (hunk(2), hunk(-1)), (), "applies (offset +2,-1)"),
    (State.APPLIES, Reason.MOVED, (hunk(None),), ("w",), "applies (moved) *"),
    (State.CONFLICT, Reason.REWRITTEN, (hunk(4, applies=False),), (), "conflict (rewritten)"),
]


@pytest.mark.parametrize(("state", "reason", "hunks", "warnings", "cell"), STATE_CELLS)
def test_state_cell(
    state: State,
    reason: Reason,
    hunks: tuple[HunkFinding, ...],
    warnings: tuple[str, ...],
    cell: str,
) -> None:
    verdict = Verdict("0001-x.patch", "1.1", state, reason, state, None, hunks, warnings)
    assert state_cell(verdict) == cell


@pytest.mark.parametrize(
    ("freshness", "step"), [("fresh", ""), ("missing", UPDATE_LOCK), ("stale (x)", UPDATE_LOCK)]
)
def test_lock_next_step(freshness: str, step: str) -> None:
    assert lock_next_step(freshness) == step


def test_conflict_report_shows_what_each_hunk_expected_and_found() -> None:
    hunks = (hunk(None, applies=False, found_at=7), hunk(None, applies=False), hunk(None))
    verdict = Verdict(
        "0001-x.patch", "1.1", State.CONFLICT, Reason.CONFLICT, State.CONFLICT, None, hunks
    )
    assert conflict_report(verdict) == (
        "0001-x.patch on 1.1: conflict\n"
        "  hunk 1 vllm/x.py @@ -3 +3 @@: expected\n"
        "    | a\n"
        "  1.1 has at line 7:\n"
        "    | b\n"
        "  hunk 1 vllm/x.py @@ -3 +3 @@: expected\n"
        "    | a\n"
        "  1.1 has no such file"
    )
