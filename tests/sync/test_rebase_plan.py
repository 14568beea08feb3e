"""`sync/rebase_plan.py`: the order the plan takes the patches in, and a patch's bytes as they
apply to the new base (its paths moved where the code went). The steps themselves, on both
tree objects, are driven end to end by tests/test_rebase_synthetic.py."""

from __future__ import annotations

import dataclasses

import pytest
from series.test_edits import RAW
from support import bare_patch
from vllm_patchset.series.patches import Series
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync.rebase_plan import ordered, placed
from vllm_patchset.sync.rebase_state import Section


def test_the_archive_first_then_the_series_then_the_parked_patches() -> None:
    series = Series(
        active=(bare_patch("0002-x.patch"), bare_patch("0001-y.patch")),
        upstreamed=(bare_patch("upstreamed/0001-a.patch"),),
        parked=(bare_patch("parked/0003-b.patch"),),
    )
    assert [(section, p.key) for section, p in ordered(series)] == [
        (Section.UPSTREAMED, "upstreamed/0001-a.patch"),
        (Section.SERIES, "0002-x.patch"),
        (Section.SERIES, "0001-y.patch"),
        (Section.PARKED, "parked/0003-b.patch"),
    ]


MOVED = RAW.replace(b"a/vllm/a.py", b"a/vllm/b/a.py").replace(b"b/vllm/a.py", b"b/vllm/b/a.py")
PLACED = [
    # (the verdict's moves, its refreshed text) -> the bytes taken
    ((), "", RAW),
    ((("vllm/a.py", "vllm/b/a.py"),), "", MOVED),
    ((("vllm/a.py", "vllm/b/a.py"),), "refreshed\n", b"refreshed\n"),  # the verdict's own
]


@pytest.mark.parametrize(("moved_to", "refreshed", "expected"), PLACED)
def test_placed(moved_to: tuple[tuple[str, str], ...], refreshed: str, expected: bytes) -> None:
    patch = dataclasses.replace(bare_patch("0001-x.patch"), raw=RAW)
    verdict = Verdict("0001-x.patch", "1.1", State.APPLIES, Reason.MOVED, State.APPLIES, None, ())
    found = dataclasses.replace(verdict, moved_to=moved_to, refreshed=refreshed)
    assert placed(patch, found) == expected
