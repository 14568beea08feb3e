"""Unit tables for the readers of the project's and an install's data: the overlay lock (and
comparing two), an installed wheel's RECORD and names, paths from data, release versions and
git sources (a patch file and the series file: tests/series/test_patches.py). No git, no vLLM:
text in, value (or one error) out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.fsio import plain_parts
from vllm_patchset.infra.installed import canonical_name, parse_record
from vllm_patchset.overlay.build import compare_locks
from vllm_patchset.overlay.lock import Lock, LockEntry
from vllm_patchset.overlay.upstream import is_remote_url

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


# -- an installed wheel --------------------------------------------------------------------------
RECORDS = [
    ("", {}),
    (
        "vllm/__init__.py,sha256=abc,12\nvllm-0.24.0.dist-info/RECORD,,\n",
        {"vllm/__init__.py": "sha256=abc", "vllm-0.24.0.dist-info/RECORD": ""},
    ),
    ('"vllm/a,b.py",sha256=x,1\r\n\n', {"vllm/a,b.py": "sha256=x"}),  # CSV quoting, blank rows
    ("a-row-with-no-hash-field\nvllm/x.py,sha256=y\n", {"vllm/x.py": "sha256=y"}),
]


@pytest.mark.parametrize(("text", "rows"), RECORDS)
def test_parse_record(text: str, rows: dict[str, str]) -> None:
    assert parse_record(text) == rows


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("vllm", "vllm"), ("VLLM", "vllm"), ("Foo.Bar_baz", "foo-bar-baz"), ("a_-_b", "a-b")],
)
def test_canonical_name(name: str, canonical: str) -> None:
    assert canonical_name(name) == canonical


PATHS = [
    # (path from data, the top folder it must be under, its parts or None)
    ("vllm/a.py", "vllm", ("vllm", "a.py")),
    ("vllm/sub/a.py", None, ("vllm", "sub", "a.py")),
    ("a", None, ("a",)),
    ("vllm", "vllm", None),  # the package itself is no path in it
    ("torch/a.py", "vllm", None),
    ("", None, None),
    ("/vllm/a.py", None, None),
    ("vllm/", "vllm", None),
    ("vllm//a.py", None, None),
    ("vllm/./a.py", None, None),
    ("vllm/../a.py", None, None),
    ("vllm\\a.py", None, None),
    ("vllm/a\x00.py", None, None),
]


@pytest.mark.parametrize(("rel", "top", "parts"), PATHS)
def test_plain_parts(rel: str, top: str | None, parts: tuple[str, ...] | None) -> None:
    assert plain_parts(rel, top) == parts


@pytest.mark.parametrize(
    ("source", "remote"),
    [
        ("https://github.com/vllm-project/vllm", True),
        ("git@github.com:vllm-project/vllm.git", True),
        ("ssh://git@example.com/vllm.git", True),
        ("git://example.com/vllm", True),
        ("file:///srv/vllm", False),  # this machine's
        ("/home/me/vllm", False),
        ("../vllm", False),
        ("host:path", False),
    ],
)
def test_remote_git_sources(source: str, remote: bool) -> None:
    assert is_remote_url(source) == remote
