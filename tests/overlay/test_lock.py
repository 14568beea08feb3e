"""`overlay/lock.py`: schema 2, where a file's pristine sha256 is null (a file the patches add)
or its patched one (a file they delete), and schema 1 (no nulls), still read: a deploy record
written by an earlier version keeps its copy of the lock; the lock as JSON and back, a damaged
one refused naming what is wrong, and the first difference between two locks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.overlay.lock import Lock, LockEntry, compare_locks

ADDED = LockEntry("vllm/n.py", None, "2" * 64, ("0001-x.patch",))
DELETED = LockEntry("vllm/d.py", "1" * 64, None, ("0001-x.patch",))
MODIFIED = LockEntry("vllm/m.py", "3" * 64, "4" * 64, ("0001-x.patch",))
SIDES = Lock("vllm", "1.0", "src", "c" * 40, ("0001-x.patch",), (ADDED, DELETED, MODIFIED))


def test_absent_sides_are_null_in_schema_2() -> None:
    doc = json.loads(SIDES.to_json())
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
    assert Lock.from_json(SIDES.to_json(), "x").entries == (DELETED, MODIFIED, ADDED)
    assert [e.change for e in (ADDED, DELETED, MODIFIED)] == ["added", "deleted", "modified"]


def test_a_schema_1_lock_still_reads() -> None:
    old = Lock("vllm", "1.0", "src", "c" * 40, ("0001-x.patch",), (MODIFIED,))
    text = old.to_json().replace('"schema": 2', '"schema": 1')
    assert Lock.from_json(text, "x") == old


# (the lock's text, the message after "x: ")
BAD = [
    (
        SIDES.to_json().replace('"schema": 2', '"schema": 1'),
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


# -- the overlay lock ----------------------------------------------------------------------------
ENTRY_A = LockEntry("vllm/a.py", "1" * 64, "2" * 64, ("0001-x.patch",))
ENTRY_B = LockEntry("vllm/b/c.py", "3" * 64, "4" * 64, ("0001-x.patch", "0002-y.patch"))
LOCK = Lock(
    package="vllm",
    version="0.24.0",
    source="pypi:vllm-0.24.0.tar.gz sha256:ab https://x/vllm-0.24.0.tar.gz",
    upstream_commit="c" * 40,
    patches=("0001-x.patch", "0002-y.patch"),
    entries=(ENTRY_A, ENTRY_B),
)
LOCK_JSON = """\
{
  "schema": 2,
  "package": "vllm",
  "version": "0.24.0",
  "source": "pypi:vllm-0.24.0.tar.gz sha256:ab https://x/vllm-0.24.0.tar.gz",
  "upstream_commit": "cccccccccccccccccccccccccccccccccccccccc",
  "patches": [
    "0001-x.patch",
    "0002-y.patch"
  ],
  "files": {
    "vllm/a.py": {
      "pristine_sha256": "1111111111111111111111111111111111111111111111111111111111111111",
      "patched_sha256": "2222222222222222222222222222222222222222222222222222222222222222",
      "patches": [
        "0001-x.patch"
      ]
    },
    "vllm/b/c.py": {
      "pristine_sha256": "3333333333333333333333333333333333333333333333333333333333333333",
      "patched_sha256": "4444444444444444444444444444444444444444444444444444444444444444",
      "patches": [
        "0001-x.patch",
        "0002-y.patch"
      ]
    }
  }
}
"""


def test_lock_json_round_trip() -> None:
    assert LOCK.to_json() == LOCK_JSON
    assert Lock.from_json(LOCK_JSON, "x") == LOCK
    # Entries are written sorted by path, whatever order they come in.
    unsorted = dataclasses.replace(LOCK, entries=(ENTRY_B, ENTRY_A))
    assert unsorted.to_json() == LOCK_JSON
    assert (LOCK.entry("vllm/b/c.py"), LOCK.entry("vllm/x.py")) == (ENTRY_B, None)


BAD_LOCKS = [
    ("{", "not JSON"),
    ("[]", "a JSON array, not a JSON object"),
    ('{"schema": 1}', "no 'files'"),
    (LOCK_JSON.replace('"files": {', '"files": ["'), "not JSON"),
    (LOCK_JSON.replace('"schema": 2', '"schema": 3'), None),
    # Every value is checked against the lock's fields (infra/codec.py).
    (
        LOCK_JSON.replace('"version": "0.24.0"', '"version": 24'),
        "'version' is a JSON number, not a JSON string)",
    ),
    (
        LOCK_JSON.replace('"4444', '["4444').replace('4444",', '4444"],'),
        "files['vllm/b/c.py']: 'patched_sha256' is a JSON array, not a JSON string)",
    ),
    (
        LOCK_JSON.replace('"0002-y.patch"\n  ]', "2\n  ]"),
        "'patches[1]' is a JSON number, not a JSON string)",
    ),
]


@pytest.mark.parametrize(("text", "why"), BAD_LOCKS)
def test_bad_locks(text: str, why: str | None) -> None:
    with pytest.raises(BadInput) as error:
        Lock.from_json(text, "overlay/overlay.lock.json")
    if why is None:
        assert str(error.value) == "overlay/overlay.lock.json: lock schema 3 is not one of 1, 2"
    else:
        assert str(error.value).startswith(
            f"overlay/overlay.lock.json: not a valid overlay lock ({why}"
        )


def test_a_missing_lock_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as error:
        Lock.load(tmp_path / "overlay.lock.json")
    assert str(error.value) == (
        f"no overlay lock at {tmp_path / 'overlay.lock.json'}: run `vllm-patchset overlay build"
        " --update-lock`"
    )


def built(**changes: object) -> Lock:
    return dataclasses.replace(LOCK, **changes)  # type: ignore[arg-type]


COMPARE = [
    # (the lock a build gives, the first difference from the committed LOCK)
    (LOCK, None),
    (built(entries=(ENTRY_B, ENTRY_A)), None),  # order is not a difference
    (built(source="git:local:v0.24.0@abc"), None),  # where it came from is not either
    (built(version="0.25.0"), f"lock is for 0.24.0 ({'c' * 12}), build is for 0.25.0 ({'c' * 12})"),
    (
        built(upstream_commit="d" * 40),
        f"lock is for 0.24.0 ({'c' * 12}), build is for 0.24.0 ({'d' * 12})",
    ),
    (built(entries=(ENTRY_A,)), "vllm/b/c.py: not built"),
    (
        built(entries=(*LOCK.entries, LockEntry("vllm/d.py", "5" * 64, "6" * 64, ()))),
        "vllm/d.py: missing from the lock",
    ),
    (
        built(entries=(dataclasses.replace(ENTRY_A, patched_sha256="0" * 64), ENTRY_B)),
        "vllm/a.py: patched sha256 differs",
    ),
    (
        built(entries=(dataclasses.replace(ENTRY_A, pristine_sha256="0" * 64), ENTRY_B)),
        "vllm/a.py: pristine sha256 differs",
    ),
    (
        built(entries=(dataclasses.replace(ENTRY_A, patches=()), ENTRY_B)),
        "vllm/a.py: patch list differs",
    ),
    (
        built(patches=("0002-y.patch", "0001-x.patch")),
        "applied patches ['0002-y.patch', '0001-x.patch'] differ from ['0001-x.patch', '0002-y.patch']",
    ),
]


@pytest.mark.parametrize(("lock", "difference"), COMPARE)
def test_compare_locks(lock: Lock, difference: str | None) -> None:
    assert compare_locks(lock, LOCK) == difference
