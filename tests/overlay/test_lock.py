"""`overlay/lock.py`: schema 2, where a file's pristine sha256 is null (a file the patches add)
or its patched one (a file they delete), and schema 1 (no nulls), still read: a deploy record
written by an earlier version keeps its copy of the lock."""

from __future__ import annotations

import json

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.overlay.lock import Lock, LockEntry

ADDED = LockEntry("vllm/n.py", None, "2" * 64, ("0001-x.patch",))
DELETED = LockEntry("vllm/d.py", "1" * 64, None, ("0001-x.patch",))
MODIFIED = LockEntry("vllm/m.py", "3" * 64, "4" * 64, ("0001-x.patch",))
LOCK = Lock("vllm", "1.0", "src", "c" * 40, ("0001-x.patch",), (ADDED, DELETED, MODIFIED))


def test_absent_sides_are_null_in_schema_2() -> None:
    doc = json.loads(LOCK.to_json())
    assert doc["schema"] == 2
    assert doc["files"] == {
        "vllm/d.py": {
            "pristine_sha256": "1" * 64,
            "patched_sha256": None,
            "patches": ["0001-x.patch"],
        },
        "vllm/m.py": {
            "pristine_sha256": "3" * 64,
            "patched_sha256": "4" * 64,
            "patches": ["0001-x.patch"],
        },
        "vllm/n.py": {
            "pristine_sha256": None,
            "patched_sha256": "2" * 64,
            "patches": ["0001-x.patch"],
        },
    }
    assert Lock.from_json(LOCK.to_json(), "x").entries == (DELETED, MODIFIED, ADDED)
    assert [e.change for e in (ADDED, DELETED, MODIFIED)] == ["added", "deleted", "modified"]


def test_a_schema_1_lock_still_reads() -> None:
    old = Lock("vllm", "1.0", "src", "c" * 40, ("0001-x.patch",), (MODIFIED,))
    text = old.to_json().replace('"schema": 2', '"schema": 1')
    assert Lock.from_json(text, "x") == old


# (the lock's text, the message after "x: ")
BAD = [
    (
        LOCK.to_json().replace('"schema": 2', '"schema": 1'),
        "not a valid overlay lock (files['vllm/d.py']: a null sha256 in a schema 1 lock)",
    ),
    (
        Lock("vllm", "1.0", "src", "c", (), (LockEntry("vllm/z.py", None, None, ()),)).to_json(),
        "not a valid overlay lock (files['vllm/z.py']: absent on both sides)",
    ),
]


@pytest.mark.parametrize(("text", "why"), BAD)
def test_bad_absent_sides_refused(text: str, why: str) -> None:
    with pytest.raises(BadInput) as error:
        Lock.from_json(text, "x")
    assert str(error.value).startswith(f"x: {why}")
